# Owns the tests of get_or_tune's flows against the real tunecached (fixture `daemon`): told to
# tune, tune_fn runs once and its result is Recorded with the lease; a failed tuning, a failed
# Record and an interrupted tuning give the lease up at once (seen in the daemon's Stats); a
# miss; the plain calls; and the view every read carries (seen in the daemon's ListViews and in
# what a view pins). These used to run against a fake server without leases, waits or
# validation; the daemon's own answers are what the package must handle.
from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest

import tunecache
from conftest import running_daemon, unique_key

FALLBACK = {"runner_id": 0, "tactic": -1}
DAEMON_WARNING = "unavailable or failing"
TUNED = ({"runner_id": 2, "tactic": [128, 64]}, 42.5)


def daemon_warnings(caplog) -> list:
    return [r for r in caplog.records if r.name == "tunecache" and r.levelno == logging.WARNING and DAEMON_WARNING in r.getMessage()]


class CountingTuner:
    def __init__(self, output=TUNED, error=None, during=None):
        self.calls = 0
        self.output = output
        self.error = error
        self.during = during

    def __call__(self):
        self.calls += 1
        if self.during is not None:
            self.during()
        if self.error is not None:
            raise self.error
        return self.output


def test_told_to_tune_runs_tune_fn_once_and_records_with_the_lease(daemon):
    with daemon.client() as client:
        key = unique_key(rank=3)
        tuner = CountingTuner()
        assert client.get_or_tune(key, tuner, FALLBACK) == {"runner_id": 2, "tactic": [128, 64]}
        assert tuner.calls == 1
        stats = client.stats()
        assert (stats.leases_granted, stats.leases_given_up, stats.leases_active) == (1, 0, 0)
        (entry,) = client.lookup([key])
        assert entry.key == key
        assert json.loads(entry.result.config) == {"runner_id": 2, "tactic": [128, 64]}
        assert entry.result.time_us == 42.5
        assert f"pid {os.getpid()} rank 3" in entry.result.tuned_by and entry.result.tuned_at_unix_ms > 0
        # The second call is a hit: the same value, no tuning.
        assert client.get_or_tune(key, tuner, FALLBACK) == {"runner_id": 2, "tactic": [128, 64]}
        assert tuner.calls == 1
        assert client.stats().leases_granted == 1


def test_config_text_is_recorded_verbatim(daemon):
    with daemon.client() as client:
        key = unique_key()
        assert client.get_or_tune(key, lambda: ('{"b": 1, "a": [1.5]}', 7), FALLBACK) == {"b": 1, "a": [1.5]}
        assert client.lookup([key])[0].result.config == '{"b": 1, "a": [1.5]}'


@pytest.mark.parametrize(
    "tuner",
    [
        CountingTuner(error=RuntimeError("kernel launch failed")),
        CountingTuner(output=({"tactic": 1}, float("nan"))),
        CountingTuner(output=({"tactic": 1}, -1.0)),
        CountingTuner(output=("not json {", 1.0)),
        CountingTuner(output=({"tactic": object()}, 1.0)),
        CountingTuner(output="not a pair"),
    ],
    ids=["raises", "nan-time", "negative-time", "bad-json", "unserializable", "not-a-pair"],
)
def test_failed_tuning_gives_the_lease_up_and_the_fallback(daemon, tuner):
    with daemon.client() as client:
        key = unique_key()
        assert client.get_or_tune(key, tuner, FALLBACK, lease_ms=120_000) == FALLBACK
        assert tuner.calls == 1
        stats = client.stats()
        assert (stats.leases_given_up, stats.leases_active, stats.records) == (1, 0, 1)
        assert client.lookup([key]) == []
        # The lease is free again: the next caller is told to tune at once.
        good = CountingTuner()
        assert client.get_or_tune(key, good, FALLBACK, wait_ms=0) == {"runner_id": 2, "tactic": [128, 64]}
        assert good.calls == 1


def test_a_record_over_the_message_limit_gives_the_lease_up_and_keeps_the_tuned_config(socket_dir, caplog):
    # RESOURCE_EXHAUSTED from the daemon's request limit: the result is fine, only storing it
    # failed, so the rank keeps what it tuned, and the lease is handed back.
    caplog.set_level(logging.WARNING, logger="tunecache")
    with running_daemon(socket_dir, ["--max-message-bytes", "4096"]) as daemon:
        with daemon.client() as client:
            key = unique_key()
            big = {"tactic": "x" * 8192}
            assert client.get_or_tune(key, CountingTuner(output=(big, 1.0)), FALLBACK, lease_ms=120_000) == big
            stats = client.stats()
            assert stats.requests_refused_too_large == 1
            assert (stats.leases_given_up, stats.leases_active) == (1, 0)
            assert client.lookup([key]) == []
    assert len(daemon_warnings(caplog)) == 1, caplog.text
    assert "RESOURCE_EXHAUSTED" in caplog.text or "over the daemon's limit" in caplog.text


def test_a_daemon_gone_while_tuning_keeps_the_tuned_config_with_one_warning(daemon, caplog):
    # UNAVAILABLE: the daemon dies while this rank tunes; its Record and the give-up both fail.
    caplog.set_level(logging.WARNING, logger="tunecache")
    with daemon.client(timeout=2.0) as client:
        def kill_the_daemon():
            daemon.process.kill()
            daemon.process.wait()

        tuner = CountingTuner(during=kill_the_daemon)
        started = time.monotonic()
        assert client.get_or_tune(unique_key(), tuner, FALLBACK) == {"runner_id": 2, "tactic": [128, 64]}
        assert time.monotonic() - started < 6.0
    assert tuner.calls == 1
    assert len(daemon_warnings(caplog)) == 1, caplog.text


def test_a_record_past_its_deadline_does_not_wait_another_timeout_to_give_the_lease_up(daemon, caplog):
    # DEADLINE_EXCEEDED: the daemon is stopped while the rank tunes, so the Record times out. The
    # rank keeps its config and does not make a second call to give the lease up (that would
    # block for another timeout on a hung daemon; get_or_tune is bounded by wait_ms + timeout +
    # tuning): the lease ends when it expires or the holder exits, as the daemon guarantees.
    caplog.set_level(logging.WARNING, logger="tunecache")
    timeout_s = 0.5
    with daemon.client(timeout=timeout_s) as client:
        tuner = CountingTuner(during=lambda: os.kill(daemon.process.pid, signal.SIGSTOP))
        started = time.monotonic()
        try:
            answer = client.get_or_tune(unique_key(), tuner, FALLBACK, lease_ms=120_000)
            took = time.monotonic() - started
        finally:
            os.kill(daemon.process.pid, signal.SIGCONT)
    assert answer == {"runner_id": 2, "tactic": [128, 64]}
    assert took < 3 * timeout_s, took
    assert len(daemon_warnings(caplog)) == 1, caplog.text
    assert "Deadline" in caplog.text, caplog.text
    with daemon.client() as client:
        assert client.stats().leases_given_up == 0


def test_interrupted_tuning_gives_the_lease_up_and_propagates(daemon):
    with daemon.client() as client:
        with pytest.raises(KeyboardInterrupt):
            client.get_or_tune(unique_key(), CountingTuner(error=KeyboardInterrupt()), FALLBACK, lease_ms=120_000)
        stats = client.stats()
        assert (stats.leases_granted, stats.leases_given_up, stats.leases_active) == (1, 1, 0)


def test_miss_gives_the_fallback_without_tuning(daemon, caplog):
    caplog.set_level(logging.WARNING, logger="tunecache")
    with daemon.client() as client:
        tuner = CountingTuner()
        started = time.monotonic()
        assert client.get_or_tune(unique_key(), tuner, FALLBACK, can_tune=False, wait_ms=10) == FALLBACK
        assert time.monotonic() - started < 3.0
        assert tuner.calls == 0
        assert client.stats().leases_granted == 0
    assert not daemon_warnings(caplog)


def test_client_calls_reach_the_daemon(daemon):
    with daemon.client() as client:
        key = unique_key()
        entry = {"key": key, "result": {"config": '{"x": 1}', "time_us": 3.0}}
        assert client.record([entry]).stored == 1
        response = client.resolve(key, wait_ms=0, can_tune=False)
        assert response.WhichOneof("outcome") == "hit"
        assert response.hit.config == '{"x": 1}'
        assert response.tune_here.lease_id == ""  # not the outcome: an empty message
        fresh = client.resolve(unique_key(), wait_ms=0)
        assert fresh.WhichOneof("outcome") == "tune_here" and fresh.tune_here.lease_id
        assert all(device.fingerprint for device in client.devices())


# --- the view every read carries ------------------------------------------------------------------


def test_lookup_scan_resolve_and_get_or_tune_read_in_the_view(daemon, monkeypatch):
    monkeypatch.setenv("TUNECACHE_VIEW", "job-1")
    first = ('{"tile": 64}', 5.0)
    with daemon.client() as client:
        assert client.view == "job-1"
        looked_up, scanned, resolved, tuned = (unique_key(namespace="pytest-view") for _ in range(4))
        client.record([{"key": k, "result": {"config": first[0], "time_us": first[1]}} for k in (looked_up, scanned, resolved)])
        assert client.lookup([looked_up])[0].result.config == first[0]
        assert {e.key.problem for chunk in client.scan(namespace="pytest-view") for e in chunk} >= {scanned.problem}
        assert client.resolve(resolved, wait_ms=0, can_tune=False).hit.config == first[0]
        assert client.get_or_tune(tuned, CountingTuner(), FALLBACK, wait_ms=0) == {"runner_id": 2, "tactic": [128, 64]}
        # The lease holder's result is pinned by the view's own task, just after its Record.
        deadline = time.monotonic() + 10
        while True:
            (view,) = [v for v in client.list_views() if v.name == "job-1"]
            if view.pins >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert view.pins >= 4
        # Record has no view: a better result is merged for everyone, but job-1 keeps its pins.
        client.record([{"key": k, "result": {"config": '{"tile": 32}', "time_us": 1.0}} for k in (looked_up, scanned, resolved)])
        assert client.lookup([looked_up])[0].result.config == first[0]
        in_view = {e.key.problem: e.result.config for chunk in client.scan(namespace="pytest-view") for e in chunk}
        assert in_view[scanned.problem] == first[0]
        assert client.resolve(resolved, wait_ms=0, can_tune=False).hit.config == first[0]
    monkeypatch.setenv("TUNECACHE_VIEW", "")
    with daemon.client() as client:
        assert client.view == ""
        assert client.lookup([looked_up])[0].result.config == '{"tile": 32}'
        assert client.end_view("job-1").ended


def test_the_module_helper_and_autotune_read_in_the_environment_view(daemon, monkeypatch):
    monkeypatch.setenv("TUNECACHE_SOCKET", daemon.socket_path)
    monkeypatch.delenv("TUNECACHE_VIEW")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-42")
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tunecache.client, "_default_client", None)
    assert tunecache.get_or_tune(unique_key(), CountingTuner(), FALLBACK, wait_ms=0) != FALLBACK
    tuner = tunecache.autotune(
        "pytest", "views", key_fn=lambda n: {"n": n}, configs=[{"block": 1}, {"block": 2}],
        bench=lambda config, n: float(config["block"]), device="cpu|pytest", warmup=0, repeats=1,
    )
    assert tuner.best(3) == {"block": 1}
    with daemon.client() as client:
        (view,) = [v for v in client.list_views() if v.name == "torchelastic-run-42"]
        assert view.pins == 2
