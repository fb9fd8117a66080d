# Owns the tests of tunecache.autotune, the generic helper, with the real daemon: eight processes
# tuning the same twenty problems time each exactly once node-wide, a lease holder killed with
# SIGKILL does not stop the others, a holder whose result the daemon refuses hands its lease back
# at once, one whose Record the daemon holds past its deadline keeps it, the in-process memo,
# tuning without a daemon, and a cached config the kernel raises for forgotten (only_if), tuned
# again and retried, while a config tuned or run here never is.
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tunecache
from tunecache.autotuning import measure
from conftest import holding_records, start_python_worker, without_forget

WORKER = Path(__file__).resolve().parent / "autotune_worker.py"
WORKER_TIMEOUT_S = 240
CONFIGS = 4


def start_worker(socket, spec):
    environment = dict(os.environ)
    # The installed package (never the source tree, which has no native module).
    environment.pop("PYTHONPATH", None)
    environment["TUNECACHE_SOCKET"] = str(socket)
    return start_python_worker(WORKER, spec, environment)


def bench_calls(count_file):
    """problem -> pid -> number of bench calls."""
    calls = defaultdict(lambda: defaultdict(int))
    for line in Path(count_file).read_text().splitlines():
        problem, _block, pid = line.split()
        calls[int(problem)][int(pid)] += 1
    return calls


def run_workers(socket, processes, spec):
    workers = [start_worker(socket, spec) for _ in range(processes)]
    with ThreadPoolExecutor(max_workers=processes) as pool:
        outputs = list(pool.map(lambda w: w.communicate(timeout=WORKER_TIMEOUT_S), workers))
    return [(worker.pid, worker.returncode, out, err) for worker, (out, err) in zip(workers, outputs)]


def test_eight_processes_time_each_problem_exactly_once(daemon, tmp_path):
    problems, warmup, repeats = 20, 1, 3
    count_file = tmp_path / "bench_calls"
    spec = {"count_file": str(count_file), "problems": problems, "warmup": warmup,
            "repeats": repeats, "run": str(uuid.uuid4())}
    results = run_workers(daemon.socket_path, 8, spec)
    chosen = []
    for pid, code, out, err in results:
        assert code == 0, f"worker {pid} exited {code}:\n{out}\n{err}"
        chosen.append(json.loads(out.strip().splitlines()[-1]))
    calls = bench_calls(count_file)
    assert sorted(calls) == list(range(problems))
    for problem, by_pid in calls.items():
        # One process timed every config: warm-up plus repeats each, nobody else called bench.
        assert len(by_pid) == 1, f"problem {problem} timed by {dict(by_pid)}"
        assert list(by_pid.values()) == [CONFIGS * (warmup + repeats)]
    # Every process got the same, measured best config.
    for problem in range(problems):
        expected = (16, 32, 64, 128)[problem % CONFIGS]
        assert {result[str(problem)] for result in chosen} == {expected}, problem
    with daemon.client() as client:
        entries = [e for chunk in client.scan(namespace="pytest-autotune") for e in chunk]
    assert len(entries) == problems
    stored = json.loads(entries[0].result.config)
    assert stored["stats"]["repeats"] == repeats and stored["stats"]["warmup"] == warmup
    # The bench reports 10 us + the distance from the best block, so the winner's every
    # repeat took exactly 10 us: the stored figures are what the bench measured.
    stats = stored["stats"]
    assert (stats["min_us"], stats["median_us"], stats["max_us"]) == (10.0, 10.0, 10.0), stats
    assert entries[0].result.time_us == 10.0


def test_a_lease_holder_killed_mid_tuning_does_not_stop_the_others(daemon, tmp_path):
    problems, warmup, repeats, doomed = 6, 1, 2, 3
    count_file = tmp_path / "bench_calls"
    spec = {"count_file": str(count_file), "problems": problems, "warmup": warmup,
            "repeats": repeats, "run": str(uuid.uuid4()), "doom_marker": str(tmp_path / "doom"),
            "doomed_problem": doomed}
    results = run_workers(daemon.socket_path, 4, spec)
    killed = [r for r in results if r[1] == -9]
    survivors = [r for r in results if r[1] == 0]
    assert len(killed) == 1, [(pid, code, err[-2000:]) for pid, code, _, err in results]
    assert len(survivors) == 3, [(pid, code, err[-2000:]) for pid, code, _, err in results]
    for _, _, out, _ in survivors:
        assert json.loads(out.strip().splitlines()[-1])[str(doomed)] == (16, 32, 64, 128)[doomed % CONFIGS]
    by_pid = bench_calls(count_file)[doomed]
    killed_pid = killed[0][0]
    assert by_pid.pop(killed_pid) == 1  # died in its first bench call
    # Exactly one survivor took the lease over and timed it in full.
    assert list(by_pid.values()) == [CONFIGS * (warmup + repeats)], dict(by_pid)


def test_measure_times_the_call_when_bench_reports_nothing():
    samples = measure(lambda config: time.sleep(config), 0.002, (), {}, warmup=1, repeats=3)
    assert len(samples) == 3
    assert all(sample >= 2000.0 for sample in samples), samples  # microseconds, at least the sleep
    calls = []
    reported = measure(lambda config: calls.append(config) or 7.5, "c", (), {}, 2, 4)
    assert reported == [7.5] * 4 and calls == ["c"] * 6


def test_memo_and_plain_call_and_no_daemon(daemon, tmp_path):
    calls = []

    def bench(config, n):
        calls.append(config)
        return float(abs(config - n))  # a reported time, in microseconds

    with daemon.client() as client:
        tuner = tunecache.autotune("pytest-autotune", "plain", key_fn=lambda n: f"n={n}",
                                   configs=[1, 5, 9], bench=bench, device="cpu|pytest", warmup=2, repeats=3,
                                   client=client)
        assert tuner.best(4) == 5
        assert len(calls) == 3 * (2 + 3)
        resolves = client.stats().resolves
        assert tuner.best(4) == 5
        assert client.stats().resolves == resolves, "the memo did not answer"
        stored = client.lookup([{"namespace": "pytest-autotune", "op": "plain", "device": "cpu|pytest",
                                 "problem": "n=4"}])
        assert json.loads(stored[0].result.config)["config"] == 5
        assert stored[0].result.time_us == 1.0

    # No daemon: the process tunes for itself.
    calls.clear()
    lonely = tunecache.autotune("pytest-autotune", "plain", key_fn=lambda n: f"n={n}", configs=[1, 5, 9],
                                bench=bench, device="cpu|pytest", warmup=0, repeats=1,
                                client=tunecache.Client(tmp_path / "absent.sock", timeout=1.0))
    assert lonely.best(8) == 9
    assert len(calls) == 3


def test_a_record_past_its_deadline_keeps_the_lease(daemon, socket_dir):
    """Issue 35: the helper ends its lease through the Rust client's finish_tune, so a Record the
    daemon holds past the deadline keeps the lease (no second call to a daemon that did not
    answer in time), as the Triton drop-in and get_or_tune do; the process uses its own config."""
    with holding_records(daemon, socket_dir) as proxy:
        client = tunecache.Client(proxy.socket_path, timeout=0.5)
        tuner = tunecache.autotune("pytest-autotune", "late", key_fn=lambda: f"late-{uuid.uuid4()}",
                                   configs=[1, 2], bench=lambda config: float(config), device="cpu|pytest",
                                   warmup=0, repeats=1, lease_ms=60_000, client=client)
        assert tuner.best() == 1
        assert proxy.held.is_set()
        assert proxy.give_ups == []
        client.close()


def test_a_refused_record_gives_the_lease_up_so_a_waiter_times_at_once(daemon, caplog):
    # The holder's only config holds a NaN, which the daemon refuses as not JSON; the waiter's is
    # fine. Unless the holder hands its lease back, the waiter sits out its whole wait.
    caplog.set_level(logging.DEBUG, logger="tunecache")
    problem = f"refused-{uuid.uuid4()}"
    wait_ms = 30_000
    waiter_done = {}

    def make(configs, bench, client):
        return tunecache.autotune("pytest-autotune", "refused", key_fn=lambda: problem, configs=configs,
                                  bench=bench, device="cpu|pytest", warmup=0, repeats=1, wait_ms=wait_ms,
                                  lease_ms=60_000, client=client)

    with daemon.client() as holder_client, daemon.client() as waiter_client:
        waiter_tuner = make([{"block": 64}], lambda config: 3.0, waiter_client)

        def run_waiter():
            waiter_done["config"] = waiter_tuner.best()
            waiter_done["at"] = time.monotonic()

        waiter = threading.Thread(target=run_waiter, daemon=True)

        def holder_bench(config):
            if waiter.ident is None:  # the first bench call: let the waiter in
                waiter.start()
                deadline = time.monotonic() + 10.0
                while holder_client.stats().waiters < 1:
                    assert time.monotonic() < deadline, "the waiter never waited on the lease"
                    time.sleep(0.01)
            return 1.0

        holder_config = make([{"x": float("nan")}], holder_bench, holder_client).best()
        holder_done = time.monotonic()
        waiter.join(timeout=120.0)
        assert not waiter.is_alive()
        blocked_s = waiter_done["at"] - holder_done
        assert blocked_s < 5.0, f"the waiter blocked {blocked_s:.1f}s after the refused Record"
        assert waiter_done["config"] == {"block": 64}
        assert math.isnan(holder_config["x"])  # the holder's own config still runs its kernel
        (stored,) = waiter_client.lookup([{"namespace": "pytest-autotune", "op": "refused",
                                           "device": "cpu|pytest", "problem": problem}])
        assert json.loads(stored.result.config)["config"] == {"block": 64}
        assert holder_client.stats().leases_given_up == 1

    warnings = [r for r in caplog.records if r.name.startswith("tunecache") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "not valid JSON" in warnings[0].getMessage() and problem in warnings[0].getMessage()
    assert tunecache.client._warned_pid is None


# --- a broken cached config -------------------------------------------------------------------

BLOCKS = (16, 32, 64, 256)
BEST_BLOCK = 32


def broken_key(problem):
    return {"namespace": "pytest-autotune", "op": "broken", "device": "cpu|pytest", "problem": problem}


def too_big(problem, block):
    return block == 256


def block_tuner(client, kernel_calls, kernel_raises_for=too_big):
    """An autotuned kernel over BLOCKS whose bench raises for block 256 (too big for this
    device), so the best of the others is BEST_BLOCK, and whose kernel raises where
    ``kernel_raises_for`` says (by default where bench does). Each kernel call is appended to
    ``kernel_calls`` as (problem, block)."""

    def bench(config, problem):
        if too_big(problem, config["block"]):
            raise RuntimeError(f"block {config['block']} needs more shared memory than this device has")
        return 10.0 + abs(config["block"] - BEST_BLOCK)

    tuner = tunecache.autotune("pytest-autotune", "broken", key_fn=lambda problem: problem,
                               configs=[{"block": block} for block in BLOCKS], bench=bench,
                               device="cpu|pytest", warmup=0, repeats=1, client=client)

    @tuner
    def kernel(problem, *, config):
        kernel_calls.append((problem, config["block"]))
        if kernel_raises_for(problem, config["block"]):
            raise RuntimeError(f"the kernel failed with block {config['block']}")
        return config["block"]

    return kernel


def record_as_the_helper(client, problem, block, time_us, tuned_by="an older build"):
    """The result another node (with more shared memory) tuned, in the helper's format."""
    config = json.dumps({"config": {"block": block}, "index": BLOCKS.index(block), "stats": {}})
    result = {"config": config, "time_us": time_us, "tuned_by": tuned_by}
    assert client.record([{"key": broken_key(problem), "result": result}]).stored == 1
    return config


def stored_block(client, problem):
    (hit,) = client.lookup([broken_key(problem)])
    return json.loads(hit.result.config)["config"]["block"], hit.result.time_us


def test_a_broken_cached_config_is_forgotten_retuned_and_retried(daemon, caplog):
    caplog.set_level(logging.DEBUG, logger="tunecache")
    problems = [f"broken-{uuid.uuid4()}" for _ in range(2)]
    calls = []
    with daemon.client() as client:
        for problem in problems:
            record_as_the_helper(client, problem, 256, 1.0)
        kernel = block_tuner(client, calls)
        for problem in problems:
            assert kernel(problem) == BEST_BLOCK
        # Each problem: the cached block raised, then the retuned one ran.
        assert calls == [(problems[0], 256), (problems[0], BEST_BLOCK), (problems[1], 256), (problems[1], BEST_BLOCK)]
        assert kernel(problems[0]) == BEST_BLOCK  # the memo holds the new config
        for problem in problems:
            # The daemon's entry is the config tuned here now, though the broken one was faster.
            assert stored_block(client, problem) == (BEST_BLOCK, 10.0)
        stats = client.stats()
        assert stats.forget_entries_dropped == 2
        assert stats.forgets_refused == 0

    warnings = [r for r in caplog.records if r.name.startswith("tunecache") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert problems[0] in message and "'block': 256" in message and "the kernel failed with block 256" in message
    later = [r for r in caplog.records if r.name.startswith("tunecache") and problems[1] in r.getMessage()
             and "raised" in r.getMessage()]
    assert [r.levelno for r in later] == [logging.DEBUG]
    assert tunecache.client._warned_pid is None  # the daemon did nothing wrong


def test_the_forget_spares_a_better_result_recorded_since(daemon):
    # The helper was handed block 256; before it reports it broken, another process records
    # block 32 at a better time. The Forget (only_if the 256 result) drops nothing, and the
    # helper retries with the new winner without tuning.
    problem = f"broken-{uuid.uuid4()}"
    calls = []
    with daemon.client() as client:
        record_as_the_helper(client, problem, 256, 5.0)
        kernel = block_tuner(client, calls)
        assert kernel.autotuner.best(problem) == {"block": 256}  # cached, not yet run
        record_as_the_helper(client, problem, BEST_BLOCK, 2.0, tuned_by="a process on this node")
        assert kernel(problem) == BEST_BLOCK
        assert calls == [(problem, 256), (problem, BEST_BLOCK)]
        assert stored_block(client, problem) == (BEST_BLOCK, 2.0)
        assert client.stats().forget_entries_dropped == 0


def test_a_retry_that_raises_too_propagates(daemon):
    problem = f"broken-{uuid.uuid4()}"
    calls = []
    with daemon.client() as client:
        record_as_the_helper(client, problem, 256, 1.0)
        # The kernel raises with every block, though bench runs them: this input is bad.
        kernel = block_tuner(client, calls, kernel_raises_for=lambda p, block: True)
        with pytest.raises(RuntimeError, match=f"the kernel failed with block {BEST_BLOCK}"):
            kernel(problem)
        assert calls == [(problem, 256), (problem, BEST_BLOCK)]  # one retry, no more
        assert stored_block(client, problem) == (BEST_BLOCK, 10.0)  # tuned here: not forgotten again
        assert client.stats().forget_entries_dropped == 1


def test_a_config_tuned_or_run_here_is_never_forgotten(daemon):
    tuned_here, cached = f"tuned-{uuid.uuid4()}", f"cached-{uuid.uuid4()}"
    calls = []
    failing = set()
    with daemon.client() as client:
        record_as_the_helper(client, cached, 64, 1.0)
        kernel = block_tuner(client, calls, kernel_raises_for=lambda p, block: too_big(p, block) or p in failing)
        assert kernel(tuned_here) == BEST_BLOCK  # a miss: tuned by this process
        assert kernel(cached) == 64  # a hit, and it ran
        failing.update((tuned_here, cached))  # now the kernel raises for these inputs
        for problem in (tuned_here, cached):
            calls.clear()
            with pytest.raises(RuntimeError, match="the kernel failed"):
                kernel(problem)
            assert len(calls) == 1, calls  # no forget, no retune, no retry
        assert stored_block(client, tuned_here) == (BEST_BLOCK, 10.0)
        assert stored_block(client, cached) == (64, 1.0)
        assert client.stats().forget_entries_dropped == 0


def test_with_a_daemon_without_forget_the_helper_tunes_for_itself(daemon, socket_dir, caplog):
    # The daemon as an older tunecached answers it: Forget is UNIMPLEMENTED, so the broken result
    # stays and Resolve keeps answering it. The helper tunes for itself, Records without a lease
    # (the faster one wins: here the broken one stays, at 1 us) and retries with its own config.
    caplog.set_level(logging.DEBUG, logger="tunecache")
    problem = f"broken-{uuid.uuid4()}"
    calls = []
    with daemon.client() as direct:
        record_as_the_helper(direct, problem, 256, 1.0)
        before = direct.stats()
    with without_forget(daemon, socket_dir) as older, tunecache.Client(older) as client:
        kernel = block_tuner(client, calls)
        assert kernel(problem) == BEST_BLOCK
        assert kernel(problem) == BEST_BLOCK
    assert calls == [(problem, 256), (problem, BEST_BLOCK), (problem, BEST_BLOCK)]
    with daemon.client() as direct:
        after = direct.stats()
        assert stored_block(direct, problem) == (256, 1.0)
    assert after.resolves - before.resolves == 2  # the first call and the retune; then the memo
    assert after.leases_granted == before.leases_granted  # both Resolves were hits
    assert (after.records - before.records, after.entries_unchanged - before.entries_unchanged) == (1, 1)
    assert after.forgets_received == before.forgets_received
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("tunecache") and r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "the kernel failed with block 256" in warnings[0]
    assert "Forget" in warnings[1] and "unavailable or failing" in warnings[1]
