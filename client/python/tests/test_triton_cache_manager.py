# Owns the tests of the Triton drop-in's autotune results (TRITON_CACHE_MANAGER=tunecache.
# integrations.triton:CacheManager; its compiled kernels: test_triton_compiled_kernels.py)
# against the real daemon and the real triton package: processes (triton_worker.py)
# run a real @triton.autotune kernel with Triton's own Autotuner, compiler and cache code; only
# the active driver is a stand-in (triton_standin.py), as the machine has no GPU. A forwarding
# proxy (conftest.holding_records) holds a Record past its deadline to see the lease kept.
from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import holding_records, start_python_worker

try:
    import triton  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise  # CI installs it (run_tests.sh): a missing triton is a failure there
    pytest.skip("the Triton tests need the triton package (run_tests.sh installs it)", allow_module_level=True)

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "triton_worker.py"
MANAGER = "tunecache.integrations.triton:CacheManager"
WORKER_TIMEOUT_S = 240
PROCESSES = 8
FASTEST = {"BLOCK": 32}


def worker_env(tmp_path, name, socket, manager=True):
    """The environment of one worker: its own empty TRITON_CACHE_DIR (returned too)."""
    cache_dir = tmp_path / name / "triton-cache"
    cache_dir.mkdir(parents=True)
    environment = dict(os.environ)
    environment.update(
        PYTHONPATH=str(TESTS),
        TRITON_CACHE_DIR=str(cache_dir),
        TRITON_HOME=str(tmp_path / name),
        TRITON_CACHE_AUTOTUNING="1",
        TRITON_DEFAULT_FP_FUSION="1",
        TUNECACHE_SOCKET=str(socket),
        TUNECACHE_TRITON_WAIT_MS="120000",
    )
    environment.pop("TRITON_CACHE_MANAGER", None)
    if manager:
        environment["TRITON_CACHE_MANAGER"] = MANAGER
    return environment, cache_dir


def start(environment, spec):
    return start_python_worker(WORKER, spec, environment)


def finish(process):
    try:
        out, err = process.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"worker timed out:\n{out}\n{err}")
    return process.returncode, out, err


def run_round(tmp_path, round_name, socket, spec, manager=True, expect_killed=0):
    """Starts PROCESSES workers at once, each with an empty cache directory; returns the
    results of those that exited 0 and their logs."""
    processes = []
    for index in range(PROCESSES):
        environment, cache_dir = worker_env(tmp_path, f"{round_name}-{index}", socket, manager)
        assert not any(cache_dir.iterdir())
        processes.append(start(environment, spec))
    with ThreadPoolExecutor(max_workers=PROCESSES) as pool:
        outcomes = list(pool.map(finish, processes))
    results, logs, killed = [], [], 0
    for code, out, err in outcomes:
        if code == -9 and expect_killed:
            killed += 1
            continue
        assert code == 0, f"worker failed ({code}):\n{out}\n{err}"
        results.append(json.loads(out.strip().splitlines()[-1]))
        logs.append(err)
    assert killed == expect_killed
    return results, logs


def benchmark_pids(bench_log):
    if not bench_log.exists():
        return []
    return [line.split()[0] for line in bench_log.read_text().splitlines()]


def tunecache_warnings(log):
    return [line for line in log.splitlines() if line.startswith("WARNING:tunecache")]


def test_eight_processes_benchmark_once_and_a_second_round_not_at_all(daemon, tmp_path):
    bench_log = tmp_path / "bench.log"
    results, logs = run_round(tmp_path, "first", daemon.socket_path, {"bench_log": str(bench_log)})
    pids = benchmark_pids(bench_log)
    # One process benchmarked the three configs; nobody else benchmarked anything.
    assert len(set(pids)) == 1 and len(pids) == 3, pids
    assert [result["best"] for result in results] == [FASTEST] * PROCESSES
    assert sorted(result["benchmarked"] for result in results) == [0] * (PROCESSES - 1) + [3]
    assert all(result["launches"] >= 1 for result in results)  # each ran the kernel
    for log in logs:
        assert not tunecache_warnings(log), log

    with daemon.client() as client:
        entries = [entry for chunk in client.scan(namespace="triton") for entry in chunk]
    # The three configs' compiled kernels are entries of their own (test_triton_compiled_kernels.py).
    assert sum(entry.key.op == "compiled-kernel" for entry in entries) == 3
    entries = [entry for entry in entries if entry.key.op != "compiled-kernel"]
    assert len(entries) == 1
    entry = entries[0]
    assert entry.key.op == "scale_kernel" and entry.key.device == "cuda|90|warp32"
    assert len(entry.key.problem) == 52  # the base32 sha256 key Triton gives its manager
    assert entry.result.time_us == pytest.approx(10.0)  # 0.010 ms
    stored = json.loads(json.loads(entry.result.config)["autotune_json"])
    assert [config["kwargs"] for config, _timing in stored["configs_timings"]] == [{"BLOCK": b} for b in (16, 32, 64)]

    second_log = tmp_path / "bench-second.log"
    results, logs = run_round(tmp_path, "second", daemon.socket_path, {"bench_log": str(second_log)})
    assert benchmark_pids(second_log) == []
    assert [result["best"] for result in results] == [FASTEST] * PROCESSES


def tree(directory):
    """{relative path: bytes} of a cache directory; group files name their members by absolute
    path, which is spelled <dir> here."""
    return {
        str(path.relative_to(directory)): path.read_bytes().replace(str(directory).encode(), b"<dir>")
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_compiled_kernel_files_land_in_the_cache_dir_as_with_the_default_manager(daemon, tmp_path):
    spec = {"bench_log": str(tmp_path / "bench.log")}
    environment, ours = worker_env(tmp_path, "ours", daemon.socket_path, manager=True)
    code, out, err = finish(start(environment, spec))
    assert code == 0, err
    environment, stock = worker_env(tmp_path, "stock", daemon.socket_path, manager=False)
    code, out, err = finish(start(environment, spec))
    assert code == 0, err
    ours_files, stock_files = tree(ours), tree(stock)
    # Three compiled configs (their .cubin, .ptx, .json, __grp__ files ...) and the autotune file.
    assert sum(name.endswith(".cubin") for name in stock_files) == 3
    assert sum(name.endswith(".autotune.json") for name in stock_files) == 1
    assert sorted(ours_files) == sorted(stock_files)
    assert ours_files == stock_files


def test_dead_socket_behaves_like_stock_triton_with_one_warning(tmp_path):
    bench_log = tmp_path / "bench.log"
    dead = tmp_path / "no-daemon.sock"
    results, logs = run_round(tmp_path, "dead", dead, {"bench_log": str(bench_log)})
    pids = benchmark_pids(bench_log)
    assert len(set(pids)) == PROCESSES and len(pids) == 3 * PROCESSES
    assert [result["best"] for result in results] == [FASTEST] * PROCESSES
    for log in logs:
        warnings = tunecache_warnings(log)
        assert len(warnings) == 1 and "unreachable" in warnings[0], log
    # And each cache directory holds what stock Triton writes: its autotune file included.
    for index in range(PROCESSES):
        cache_dir = tmp_path / f"dead-{index}" / "triton-cache"
        assert len(list(cache_dir.rglob("scale_kernel.autotune.json"))) == 1


def test_holder_killed_mid_benchmark_hands_over(daemon, tmp_path):
    bench_log = tmp_path / "bench.log"
    spec = {"bench_log": str(bench_log), "doom_marker": str(tmp_path / "doom")}
    results, logs = run_round(tmp_path, "kill", daemon.socket_path, spec, expect_killed=1)
    pids = benchmark_pids(bench_log)
    # The doomed holder logged its first benchmark and died; exactly one other process tuned.
    assert len(set(pids)) == 2, pids
    assert len(results) == PROCESSES - 1
    assert sorted(result["benchmarked"] for result in results) == [0] * (PROCESSES - 2) + [3]
    assert [result["best"] for result in results] == [FASTEST] * (PROCESSES - 1)
    with daemon.client() as client:
        stats = client.stats()
    assert stats.leases_released_dead == 1


def test_a_record_past_its_deadline_keeps_the_lease_as_every_client_does(daemon, tmp_path):
    """Issue 35: the drop-in ends its lease through the Rust client's finish_tune, so a Record
    that runs past its deadline (the daemon holds it) keeps the lease, as the Rust client and
    get_or_tune do: no second call goes to a daemon that did not answer in time. Before, the
    drop-in gave the lease up after any failed Record."""
    with holding_records(daemon, tmp_path) as proxy:
        environment, _cache_dir = worker_env(tmp_path, "late", proxy.socket_path)
        # Compiled kernels stay local, so that the one Record under a lease is the autotune one.
        environment["TRITON_ALWAYS_COMPILE"] = "1"
        spec = {"bench_log": str(tmp_path / "bench.log"), "client_timeout_s": 0.5}
        code, out, err = finish(start(environment, spec))
        assert code == 0, err
        # The put's Record reached the daemon's side and was held past the deadline ...
        assert proxy.held.is_set(), err
        # ... and no Record giving the lease up followed it.
        assert proxy.give_ups == [], err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["best"] == FASTEST and result["benchmarked"] == 3
    warnings = tunecache_warnings(err)
    assert len(warnings) == 1 and "could not store an autotune result" in warnings[0], err



def test_replay_serves_a_hit_and_benchmarks_a_miss_itself_without_a_lease(daemon, tmp_path):
    """TUNECACHE_MODE=replay: a cached result is served; a miss runs Triton's own benchmark and
    compile at once, takes no lease and sends nothing."""
    tuned_log = tmp_path / "bench-tuned.log"
    environment, _ = worker_env(tmp_path, "tuner", daemon.socket_path)
    code, out, err = finish(start(environment, {"bench_log": str(tuned_log), "n": 4096}))
    assert code == 0, err
    with daemon.client() as client:
        before = client.stats()
    replayed = {}
    for n in (4096, 1000):  # the tuned key, then one nobody tuned (Triton keys on n)
        bench_log = tmp_path / f"bench-replay-{n}.log"
        environment, _ = worker_env(tmp_path, f"replay-{n}", daemon.socket_path)
        environment["TUNECACHE_MODE"] = "replay"
        code, out, err = finish(start(environment, {"bench_log": str(bench_log), "n": n}))
        assert code == 0, err
        replayed[n] = (json.loads(out.strip().splitlines()[-1]), benchmark_pids(bench_log), err)
    hit, hit_pids, hit_log = replayed[4096]
    assert (hit["best"], hit["benchmarked"], hit_pids) == (FASTEST, 0, [])
    assert not tunecache_warnings(hit_log), hit_log
    miss, miss_pids, miss_log = replayed[1000]
    # Triton's own benchmark ran here, as without a cache, and chose as it does.
    assert (miss["best"], miss["benchmarked"], len(miss_pids)) == (FASTEST, 3, 3)
    assert [line for line in tunecache_warnings(miss_log) if "tunecache.replay" not in line] == [], miss_log
    assert sum("tunecache.replay" in line and "triton/scale_kernel" in line for line in miss_log.splitlines()) == 1
    with daemon.client() as client:
        after = client.stats()
    assert (after.leases_granted, after.records) == (before.leases_granted, before.records)


def test_a_replayed_miss_answers_at_once_while_another_process_holds_the_lease(daemon, tmp_path, monkeypatch):
    from tunecache.integrations import triton as manager

    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    holder = daemon.client()  # made before the variable is: it tunes
    monkeypatch.setenv("TUNECACHE_SOCKET", daemon.socket_path)
    monkeypatch.setenv("TUNECACHE_MODE", "replay")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(manager, "_daemon", manager._make_daemon())
    monkeypatch.setattr(manager, "_device", lambda: "cuda|90|warp32")
    cache = manager.CacheManager("k" * 52)
    with holder:
        held = holder.begin_tune(cache._key("scale_kernel.autotune.json"), wait_ms=0, lease_ms=60_000)
        group = holder.begin_tune(cache._group_key(), wait_ms=0, lease_ms=60_000)
        assert (held.kind, group.kind) == ("tune", "tune")
        granted = holder.stats().leases_granted
        started = time.perf_counter()
        assert cache.get_file("scale_kernel.autotune.json") is None
        assert cache.get_group("scale_kernel.json") is None
        elapsed = time.perf_counter() - started
        assert holder.stats().leases_granted == granted
    assert elapsed < 2 * 0.05, elapsed  # two misses, each well under 50 ms
