# Owns the tests of replay (issue 52, TUNECACHE_MODE=replay / Client(mode="replay")) for the
# client and the drop-ins' shared base, against the real daemon: how the mode is resolved, and
# that a replayed Resolve (begin_tune, get_or_tune, Daemon.tune_once) is a hit, or a miss at
# once, logged once per key, never a wait nor a lease, even while another process holds the
# key's lease (where a tuning caller would wait). Each drop-in's own replay test is in its file.
from __future__ import annotations

import logging
import time

import pytest

import tunecache
from tunecache.integrations._base import Daemon

# Far above the "under 1 ms" (tests/bench numbers are measured, not asserted here), far
# below any wait: a replayed miss that waited would take the whole wait_ms.
MISS_BOUND_S = 0.05
WAIT_MS = 20_000


def key(problem: str) -> tunecache.Key:
    return tunecache.Key(namespace="replay-test", op="gemm", device="cpu", problem=problem)


def test_the_environment_wins_and_an_unknown_mode_is_refused(daemon, monkeypatch):
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    assert tunecache.Client(daemon.socket_path).mode == "tune"
    assert tunecache.Client(daemon.socket_path, mode="replay").mode == "replay"
    monkeypatch.setenv("TUNECACHE_MODE", "Replay")
    assert tunecache.Client(daemon.socket_path, mode="tune").mode == "replay"
    monkeypatch.setenv("TUNECACHE_MODE", "")
    assert tunecache.Client(daemon.socket_path, mode="replay").mode == "replay"
    monkeypatch.setenv("TUNECACHE_MODE", "replya")
    with pytest.raises(ValueError, match="TUNECACHE_MODE"):
        tunecache.Client(daemon.socket_path)
    monkeypatch.delenv("TUNECACHE_MODE")
    with pytest.raises(ValueError, match="mode"):
        tunecache.Client(daemon.socket_path, mode="serve")


def test_a_replayed_miss_is_at_once_never_a_lease_and_logged_once_per_key(daemon, caplog, monkeypatch):
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    caplog.set_level(logging.WARNING, logger="tunecache")
    with daemon.client() as tuner, tunecache.Client(daemon.socket_path, mode="replay") as replayer:
        held = tuner.begin_tune(key("held"), wait_ms=0, lease_ms=60_000)
        assert held.kind == "tune"
        granted = tuner.stats().leases_granted
        times = []
        for _ in range(20):
            started = time.perf_counter()
            start = replayer.begin_tune(key("held"), wait_ms=WAIT_MS, can_tune=True, lease_ms=60_000)
            times.append(time.perf_counter() - started)
            assert start.kind == "miss"
        # A key nobody holds: a tuning caller would get its lease; replay never tunes.
        tuned = []
        assert replayer.get_or_tune(key("free"), lambda: tuned.append(1) or ("{}", 1.0), "fallback",
                                    wait_ms=WAIT_MS) == "fallback"
        assert tuned == []
        stats = tuner.stats()
        assert (stats.leases_granted, stats.waiters) == (granted, 0)
        assert max(times) < MISS_BOUND_S, times
        missed = [record for record in caplog.records if record.name == "tunecache.replay"]
        assert [("replay-test/gemm" in record.getMessage(), record.levelno) for record in missed] == \
            [(True, logging.WARNING)] * 2, [record.getMessage() for record in missed]
        # A hit is served.
        assert tuner.finish_tune(held.lease, tunecache.Result(config='{"tile": 64}', time_us=3.0)).error is None
        hit = replayer.begin_tune(key("held"), wait_ms=WAIT_MS)
        assert (hit.kind, hit.result.config) == ("hit", '{"tile": 64}')


def test_the_base_falls_back_at_the_first_replayed_miss(daemon, monkeypatch):
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    with daemon.client() as tuner:  # made before the variable is: it tunes
        monkeypatch.setenv("TUNECACHE_MODE", "replay")
        base = Daemon(logging.getLogger("tunecache.test"), "%(what)s", "%(what)s", socket=daemon.socket_path)
        assert base.replaying()
        held = tuner.begin_tune(key("base"), wait_ms=0, lease_ms=60_000)
        before = tuner.stats()
        started = time.perf_counter()
        answer = base.tune_once(key("base"), wait_ms=WAIT_MS, lease_ms=0, what="test", hit=lambda r: "hit",
                                tune=lambda: ("tuned", None), fall_back=lambda reason: ("own", reason), rounds=5)
        elapsed = time.perf_counter() - started
        after = tuner.stats()
        tuner.abandon(held.lease)
    assert answer[0] == "own" and answer[1], answer
    assert elapsed < MISS_BOUND_S, elapsed
    # One Resolve, not one per round; no lease.
    assert (after.resolves - before.resolves, after.leases_granted) == (1, before.leases_granted)
