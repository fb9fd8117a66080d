# Owns the tests of tunecache.autotune, the generic helper, with the real daemon: eight processes
# tuning the same twenty problems time each exactly once node-wide, a lease holder killed with
# SIGKILL does not stop the others, a holder whose result the daemon refuses hands its lease back
# at once, the in-process memo, and tuning without a daemon.
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
from conftest import PYTHON_PACKAGE_ROOT, start_python_worker

WORKER = Path(__file__).resolve().parent / "autotune_worker.py"
WORKER_TIMEOUT_S = 240
CONFIGS = 4


def start_worker(socket, spec):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = str(PYTHON_PACKAGE_ROOT)
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
