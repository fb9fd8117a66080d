# Owns the client tests against the real tunecached (fixture `daemon` in conftest.py, skipped when
# the binary is absent): Record/Lookup round trip and the merge rule, Scan completeness, and
# several rank processes resolving one fresh key with exactly one tuner, a lease handed back at
# once when tuning fails or the daemon refuses the tuned result, Forget in both its forms, and
# views (issue 27): the first answer pinned per view until the view ends.
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

import tunecache

from conftest import PYTHON_PACKAGE_ROOT, unique_key


RANK_PROCESSES = 4


def entry(key: tunecache.Key, config: str, time_us: float) -> tunecache.Entry:
    return tunecache.Entry(
        key=key,
        result=tunecache.Result(config=config, time_us=time_us, tuned_by="pytest", tuned_at_unix_ms=int(time.time() * 1000)),
    )


def test_record_then_lookup_round_trip(daemon):
    with daemon.client() as client:
        key = unique_key(rank=3)
        shared_key = unique_key(problem=key.problem)  # same key without a rank: a different key
        assert client.record([entry(key, '{"tile": [64, 128], "stages": 3}', 12.5)]).stored == 1

        (hit,) = client.lookup([shared_key, key, unique_key()])
        assert hit.key == key
        assert json.loads(hit.result.config) == {"tile": [64, 128], "stages": 3}
        assert hit.result.time_us == 12.5

        # Merge rule: a slower result leaves the entry alone, a faster one replaces it.
        assert client.record([entry(key, '{"tile": [32, 32]}', 20.0)]).unchanged == 1
        assert json.loads(client.lookup([key])[0].result.config) == {"tile": [64, 128], "stages": 3}
        assert client.record([entry(key, '{"tile": [256, 64]}', 8.0)]).stored == 1
        (hit,) = client.lookup([key])
        assert (json.loads(hit.result.config), hit.result.time_us) == ({"tile": [256, 64]}, 8.0)
        assert client.stats().entries >= 1


def test_scan_returns_every_recorded_entry(daemon):
    # More than one 1,024-entry chunk, in two namespaces and two devices.
    recorded = {}
    for index in range(2_500):
        namespace = "pytest-a" if index % 2 else "pytest-b"
        device = "cpu|scan-0" if index % 3 else "cpu|scan-1"
        key = unique_key(namespace=namespace, device=device, problem=f'{{"i":{index}}}')
        recorded[(namespace, device, key.problem)] = entry(key, f'{{"i": {index}}}', float(index))
    with daemon.client() as client:
        batch = list(recorded.values())
        for start in range(0, len(batch), 500):
            assert client.record(batch[start : start + 500]).stored == len(batch[start : start + 500])

        def scanned(namespace="", device=""):
            found = {}
            for chunk in client.scan(namespace=namespace, device=device):
                assert len(chunk) <= 1024
                for item in chunk:
                    found[(item.key.namespace, item.key.device, item.key.problem)] = item
            return found

        everything = scanned()
        assert set(recorded) <= set(everything)
        for identity, item in recorded.items():
            assert everything[identity].result.time_us == item.result.time_us
            assert json.loads(everything[identity].result.config) == json.loads(item.result.config)
        assert set(scanned(namespace="pytest-a")) == {k for k in recorded if k[0] == "pytest-a"}
        assert set(scanned(device="cpu|scan-1")) == {k for k in recorded if k[1] == "cpu|scan-1"}
        assert set(scanned(namespace="pytest-b", device="cpu|scan-0")) == {
            k for k in recorded if k[0] == "pytest-b" and k[1] == "cpu|scan-0"
        }


def test_ranks_tune_a_fresh_key_exactly_once(daemon, socket_dir):
    key = unique_key(op="trtllm::fused_moe::gemm1")
    key_json = json.dumps({name: getattr(key, name) for name in ("namespace", "op", "device", "problem")})
    counter_path = socket_dir / "tune-count"
    go_path = socket_dir / "go"
    environment = dict(os.environ)
    ranks = []
    for rank in range(RANK_PROCESSES):
        ready_path = socket_dir / f"ready-{rank}"
        command = [
            sys.executable,
            str(PYTHON_PACKAGE_ROOT / "tests" / "rank_worker.py"),
            daemon.socket_path,
            key_json,
            str(counter_path),
            str(ready_path),
            str(go_path),
            str(RANK_PROCESSES - 1),  # the tuner returns once the others wait on its lease
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
        ranks.append((process, ready_path))
    try:
        # Release the ranks together, once all have imported grpc and made their client.
        deadline = time.monotonic() + 60
        while not all(ready.exists() for _, ready in ranks):
            assert time.monotonic() < deadline, "rank processes did not start"
            assert all(p.poll() is None for p, _ in ranks), [p.communicate() for p, _ in ranks if p.poll() is not None]
            time.sleep(0.02)
        go_path.touch()
        outputs = []
        for process, _ in ranks:
            stdout, stderr = process.communicate(timeout=90)
            assert process.returncode == 0, stderr
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for process, _ in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()

    tuner_pids = counter_path.read_text().split()
    assert len(tuner_pids) == 1, f"tune_fn ran {len(tuner_pids)} times: {tuner_pids}; log:\n{daemon.log_tail()}"
    results = [output["result"] for output in outputs]
    assert results[0] != "FALLBACK", outputs
    assert all(result == results[0] for result in results), outputs
    assert results[0] == {"runner_id": 1, "tactic": [128, 64], "tuned_by_pid": int(tuner_pids[0])}

    with daemon.client() as client:
        (hit,) = client.lookup([key])
        assert json.loads(hit.result.config) == results[0]
        assert hit.result.time_us == 42.5


def test_giving_the_lease_up_frees_the_key_at_once(daemon):
    key = unique_key()
    calls = []

    def failing_tune():
        calls.append("failing")
        raise RuntimeError("no kernel fits")

    def good_tune():
        calls.append("good")
        return {"tactic": 5}, 3.0

    with daemon.client() as client:
        assert client.get_or_tune(key, failing_tune, "FALLBACK", wait_ms=2_000, lease_ms=120_000) == "FALLBACK"
        started = time.monotonic()
        # Had the lease not been given up, this caller would wait the full wait_ms and miss.
        assert client.get_or_tune(key, good_tune, "FALLBACK", wait_ms=8_000) == {"tactic": 5}
        assert time.monotonic() - started < 6.0
        assert calls == ["failing", "good"]
        # Now cached: a caller that cannot tune gets the hit.
        assert client.get_or_tune(key, good_tune, "FALLBACK", can_tune=False, wait_ms=0) == {"tactic": 5}
        assert calls == ["failing", "good"]


def test_rank_scan_returns_shared_and_own_entries(daemon):
    # What a rank loads at start: the shared entries and its own, not the other ranks'.
    namespace = f"pytest-ranks-{uuid.uuid4()}"
    with daemon.client() as client:
        batch = []
        for index in range(20):
            for rank in (None, 0, 1, 2):
                key = unique_key(namespace=namespace, problem=f'{{"i":{index}}}')
                if rank is not None:
                    key.rank = rank
                batch.append(entry(key, "{}", 1.0))
        assert client.record(batch).stored == len(batch)
        loaded = [item for chunk in client.scan(namespace=namespace, rank=1) for item in chunk]
        assert len(loaded) == 40
        assert {item.key.rank if item.key.HasField("rank") else None for item in loaded} == {None, 1}


def test_a_lazy_scan_is_a_mapping_that_decodes_what_is_read(daemon):
    # Over several chunks (the daemon streams 1,024 entries a chunk), with a rank's own entries.
    namespace = f"pytest-lazy-{uuid.uuid4()}"
    with daemon.client() as client:
        batch = []
        for index in range(2_500):
            key = unique_key(namespace=namespace, problem=f'{{"i":{index}}}')
            if index % 5 == 0:
                key.rank = index % 3
            batch.append(entry(key, json.dumps({"tile": index}), 1.0 + index))
        assert client.record(batch).stored == len(batch)
        eager = [item for chunk in client.scan(namespace=namespace, rank=1) for item in chunk]
        view = client.scan(namespace=namespace, rank=1, lazy=True)
        assert isinstance(view, tunecache.ScanView)
        assert len(view) == len(eager) > 2_048
        assert view.decoded == 0
        # Found by a Key, a tuple or a dict; the entry is the one the eager Scan returns.
        wanted = eager[1_500]
        key = wanted.key
        fields = (key.namespace, key.op, key.device, key.problem, key.rank if key.HasField("rank") else None)
        assert key in view and fields in view
        assert view[key].result.config == wanted.result.config
        assert view[key] is view[fields], "an entry read twice is the same object"
        assert view.decoded == 1
        # What the Scan does not hold: another rank's own entry, an unknown key.
        other_rank = next(item.key for item in batch if item.key.HasField("rank") and item.key.rank == 2)
        assert other_rank not in view
        assert view.get(other_rank) is None and view.get(other_rank, 7) == 7
        with pytest.raises(KeyError):
            view[unique_key(namespace=namespace)]
        assert view.decoded == 1
        # Iterating gives every key once; values() decodes all, as the eager Scan has them.
        assert sorted(describe(k) for k in view) == sorted(describe(item.key) for item in eager)
        assert [v.result.config for v in view.values()] == [item.result.config for item in eager]
        assert view.decoded == len(eager)
        assert dict((describe(k), v.result.time_us) for k, v in view.items()) == {
            describe(item.key): item.result.time_us for item in eager
        }


def describe(key: tunecache.Key) -> tuple:
    return (key.namespace, key.op, key.device, key.problem, key.rank if key.HasField("rank") else None)


# Results the daemon refuses (validate.rs): a config that is not JSON to it (Python's json writes
# NaN, which strict JSON has no word for) and a config over its 64 KiB limit.
REFUSED_RESULTS = {
    "nan-config": ({"x": float("nan")}, "not valid JSON"),
    "config-over-64-KiB": ({"blob": "x" * (64 * 1024)}, "at most 65536"),
}
# The waiter's wait, far below the holder's lease: only a given-up lease can reach it in time.
REFUSED_WAITER_WAIT_MS = 30_000
REFUSED_HOLDER_LEASE_MS = 120_000
# How soon the waiter must have the lease once the holder's get_or_tune returned.
REFUSED_HANDOVER_LIMIT_S = 5.0


@pytest.mark.parametrize("case", sorted(REFUSED_RESULTS))
def test_a_refused_record_gives_the_lease_up_so_the_waiter_tunes_at_once(daemon, caplog, case):
    bad_config, daemon_reason = REFUSED_RESULTS[case]
    key = unique_key()
    caplog.set_level(logging.DEBUG, logger="tunecache")
    waiter_outcome = {}
    waiter_calls = []

    def waiter_tune():
        waiter_calls.append(time.monotonic())
        return {"tactic": 7}, 2.0

    def run_waiter():
        with daemon.client() as waiter_client:
            result = waiter_client.get_or_tune(key, waiter_tune, "WAITER-FALLBACK", wait_ms=REFUSED_WAITER_WAIT_MS)
        waiter_outcome["result"] = result
        waiter_outcome["done"] = time.monotonic()

    waiter = threading.Thread(target=run_waiter, daemon=True)

    with daemon.client() as holder_client:

        def holder_tune():
            # Hold the lease until the other rank is waiting on it, then return what the daemon
            # will refuse.
            waiter.start()
            deadline = time.monotonic() + 10.0
            while holder_client.stats().waiters < 1:
                assert time.monotonic() < deadline, "the waiter never waited on the lease"
                time.sleep(0.01)
            return bad_config, 1.0

        holder_result = holder_client.get_or_tune(
            key, holder_tune, "HOLDER-FALLBACK", wait_ms=0, lease_ms=REFUSED_HOLDER_LEASE_MS
        )
        holder_done = time.monotonic()
        waiter.join(timeout=REFUSED_WAITER_WAIT_MS / 1000.0 + 15.0)
        assert not waiter.is_alive(), "the waiter's get_or_tune did not return"
        blocked_s = waiter_outcome["done"] - holder_done
        # The lease was handed back at once: the waiter tuned it itself, well within its wait.
        assert waiter_outcome["result"] == {"tactic": 7}, (
            f"the waiter blocked {blocked_s:.1f}s after the refused Record and got {waiter_outcome['result']!r}"
        )
        assert blocked_s < REFUSED_HANDOVER_LIMIT_S, f"the waiter blocked {blocked_s:.1f}s after the refused Record"
        assert len(waiter_calls) == 1
        stats = holder_client.stats()
        (hit,) = holder_client.lookup([key])

    # The daemon did not store the refused result, so the tuning rank falls back like its peers would.
    assert holder_result == "HOLDER-FALLBACK"
    assert stats.leases_given_up == 1 and stats.leases_expired == 0
    assert json.loads(hit.result.config) == {"tactic": 7}

    # One warning, with the daemon's reason, that does not blame the daemon.
    warnings = [r for r in caplog.records if r.name.startswith("tunecache") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert daemon_reason in message and key.problem in message, message
    assert "unavailable" not in message, message
    # The once-per-process "daemon failing" warning is still unspent for a real outage.
    assert tunecache.client._warned_pid is None


def test_a_refused_entry_is_named_by_the_structured_error_detail(daemon):
    """The daemon's INVALID_ARGUMENT carries a google.rpc.BadRequest detail whose field path
    names the refused entry; refused_entry_index reads it (no parsing of the message)."""
    import grpc

    good = [
        tunecache.Entry(key=unique_key(), result=tunecache.Result(config="{}", time_us=1.0, tuned_by="t"))
        for _ in range(4)
    ]
    good[2].result.config = "{not json"
    with daemon.client() as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.record(good)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("entries[2].result.config")
        assert tunecache.refused_entry_index(refused.value) == 2
        # Nothing of the batch was stored, and a later error that names no entry gives None.
        assert client.lookup([entry.key for entry in good]) == []
        with pytest.raises(grpc.RpcError) as other:
            client.resolve(tunecache.Key(), wait_ms=0)
        assert tunecache.refused_entry_index(other.value) is None


def test_forget_only_if_then_a_scope(daemon):
    shared = unique_key(namespace="pytest-forget")
    own = unique_key(namespace="pytest-forget", problem=shared.problem, rank=1)
    other = unique_key(namespace="pytest-forget", op="softmax")
    with daemon.client() as client:
        assert client.record([entry(key, '{"tile": 64}', 5.0) for key in (shared, own, other)]).stored == 3
        (hit,) = client.lookup([shared])
        # only_if names one exact key (no rank: the shared entry), and only its current winner.
        assert client.forget(shared.namespace, shared.op, shared.device, shared.problem,
                             only_if={"config": '{"tile": 64}', "time_us": 4.0}) == 0
        assert client.forget(shared.namespace, shared.op, shared.device, shared.problem, only_if=hit.result) == 1
        assert [e.key for e in client.lookup([shared, own, other])] == [own, other]
        # A scope (the daemon's own uid is an administrator): no rank matches every rank's entry.
        assert client.forget("pytest-forget", op=shared.op) == 1
        assert [e.key for e in client.lookup([shared, own, other])] == [other]
        assert client.forget("pytest-forget") == 1
        assert client.lookup([other]) == []
        # What is recorded after the Forget counts again.
        assert client.record([entry(shared, '{"tile": 32}', 9.0)]).stored == 1
        assert client.lookup([shared])[0].result.time_us == 9.0


# --- views (issue 27) ------------------------------------------------------------------------------


def client_in_view(daemon, monkeypatch, view: str) -> tunecache.Client:
    """A client of ``daemon`` whose environment names ``view`` (empty: none), as a rank's would."""
    monkeypatch.setenv("TUNECACHE_VIEW", view)
    client = daemon.client()
    assert client.view == view
    return client


def configs_read(client: tunecache.Client, key: tunecache.Key) -> list:
    """key's config as Lookup, Scan and Resolve each answer it in the client's view."""
    (hit,) = client.lookup([key])
    scanned = [entry for chunk in client.scan(namespace=key.namespace) for entry in chunk if entry.key == key]
    resolved = client.resolve(key, wait_ms=0, can_tune=False)
    assert resolved.WhichOneof("outcome") == "hit", resolved
    return [json.loads(result.config) for result in (hit.result, scanned[0].result, resolved.hit)]


def test_a_view_pins_the_first_answer_until_it_ends(daemon, monkeypatch):
    key = unique_key()
    writer = client_in_view(daemon, monkeypatch, "")
    job_1 = client_in_view(daemon, monkeypatch, "job-1")
    job_2 = client_in_view(daemon, monkeypatch, "job-2")
    with writer, job_1, job_2:
        assert writer.record([entry(key, '{"r": 1}', 30.0)]).stored == 1
        assert configs_read(job_1, key) == [{"r": 1}] * 3

        # A better result is stored and served to everyone but job-1.
        assert writer.record([entry(key, '{"r": 2}', 20.0)]).stored == 1
        assert configs_read(job_1, key) == [{"r": 1}] * 3
        assert configs_read(job_2, key) == [{"r": 2}] * 3
        assert configs_read(writer, key) == [{"r": 2}] * 3

        views = {view.name: view for view in writer.list_views()}
        assert set(views) == {"job-1", "job-2"}
        assert views["job-1"].pins == 1 and views["job-2"].pins == 1
        assert views["job-1"].idle_ms < 60_000
        # A view is its reader's uid's: this process's.
        assert views["job-1"].uid == os.geteuid()

        ended = writer.end_view("job-1")
        assert (ended.ended, ended.pins_dropped) == (True, 1)
        assert [view.name for view in writer.list_views()] == ["job-2"]
        assert not writer.end_view("job-1").ended
        # The next read in job-1 pins afresh: the winner now, kept past a still better one.
        assert configs_read(job_1, key) == [{"r": 2}] * 3
        assert writer.record([entry(key, '{"r": 3}', 10.0)]).stored == 1
        assert configs_read(job_1, key) == [{"r": 2}] * 3
        assert configs_read(writer, key) == [{"r": 3}] * 3
        stats = writer.stats()
        assert stats.views_ended == 1 and stats.view_pins == 2


def must_not_tune():
    raise AssertionError("a hit must not tune")


def test_get_or_tune_in_a_view_keeps_the_result_its_tuning_rank_recorded(daemon, monkeypatch):
    """A miss in a view: the rank that tunes records its result, which the view pins; a better
    result recorded afterwards changes nothing for that view."""
    key = unique_key()
    tuned = client_in_view(daemon, monkeypatch, "job-1")
    writer = client_in_view(daemon, monkeypatch, "")
    with tuned, writer:
        assert tuned.get_or_tune(key, lambda: ({"tile": 64}, 50.0), "FALLBACK", wait_ms=1_000) == {"tile": 64}
        assert writer.record([entry(key, '{"tile": 128}', 5.0)]).stored == 1
        assert tuned.get_or_tune(key, must_not_tune, "FALLBACK", wait_ms=1_000) == {"tile": 64}
        assert writer.get_or_tune(key, must_not_tune, "FALLBACK", wait_ms=1_000) == {"tile": 128}
