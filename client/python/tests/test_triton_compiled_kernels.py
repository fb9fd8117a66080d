# Owns the tests of compiled-kernel groups through the Triton drop-in (issue 37, part 2) against
# the real daemon (and a real redis-server for the cluster tier) and the real triton package:
# processes (triton_compile_worker.py) launch a real @triton.jit kernel, so Triton's compile()
# runs as shipped down to ptxas; only the active driver is a stand-in (triton_standin.py). Each
# process's compile() calls are counted by Triton's own compilation listener, which says whether
# the pipeline ran: 8 processes compile once per node, a second node on the same Redis not at
# all, a dead socket leaves each to compile as stock Triton does, overrides and dumps stay
# Triton's own, a holder whose compilation raises hands the lease on at once, and an entry
# whose files are gone is compiled again.
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import start_python_worker
from test_triton_cache_manager import finish, tree, tunecache_warnings, worker_env

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "triton_compile_worker.py"
PROCESSES = 8
KERNEL = "shift_kernel"
# What compile() puts for one kernel on the CUDA backend, in its order, and the group naming them.
STAGES = [f"{KERNEL}.{ext}" for ext in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json")]
GROUP_FILE = f"__grp__{KERNEL}.json"
PROPAGATION_TIMEOUT_S = 20.0


def run_round(tmp_path, round_name, socket, processes=PROCESSES, manager=True, extra_env=None, blocks=(64,),
              doom_marker=None):
    """Starts ``processes`` workers at once, each with an empty cache directory; answers
    ({pid: cache dir}, {pid: compile() outcomes from its last stdout line}, {pid: stderr}) and
    the compile log's lines, [(pid, "compiled" | "cached")]."""
    compile_log = tmp_path / f"{round_name}.compile.log"
    started = []
    for index in range(processes):
        environment, cache_dir = worker_env(tmp_path, f"{round_name}-{index}", socket, manager)
        environment.update(extra_env or {})
        assert not any(cache_dir.iterdir())
        spec = {"compile_log": str(compile_log), "blocks": list(blocks), "doom_marker": doom_marker}
        started.append((start_python_worker(WORKER, spec, environment), cache_dir))
    with ThreadPoolExecutor(max_workers=processes) as pool:
        outcomes = list(pool.map(finish, [process for process, _dir in started]))
    dirs, hits, logs = {}, {}, {}
    for (code, out, err), (_process, cache_dir) in zip(outcomes, started):
        assert code == 0, f"worker failed ({code}):\n{out}\n{err}"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["launches"] == (0 if result["failed"] else len(blocks)), result
        dirs[result["pid"]] = cache_dir
        hits[result["pid"]] = "failed" if result["failed"] else result["cache_hits"]
        logs[result["pid"]] = err
    lines = [(int(pid), what) for pid, what in (line.split() for line in compile_log.read_text().splitlines())]
    return dirs, hits, logs, lines


def compiled_pids(lines):
    return [pid for pid, what in lines if what == "compiled"]


def group_files(cache_dir):
    """The one kernel group of a cache directory: {file name: bytes}, the __grp__ file's paths
    spelled <dir> (see tree)."""
    files = tree(cache_dir)
    (key_dir,) = {name.split("/")[0] for name in files}
    return key_dir, {name.split("/", 1)[1]: data for name, data in files.items()}


def stock_group(tmp_path, socket, name="stock", extra_env=None):
    """The files one process with Triton's own FileCacheManager writes."""
    dirs, _hits, _logs, lines = run_round(tmp_path, name, socket, processes=1, manager=False, extra_env=extra_env)
    assert [what for _pid, what in lines] == ["compiled"]
    (cache_dir,) = dirs.values()
    return group_files(cache_dir)


def compiled_entries(client):
    return [
        entry
        for chunk in client.scan(namespace="triton")
        for entry in chunk
        if entry.key.op == "compiled-kernel"
    ]


def test_eight_processes_compile_a_kernel_once_and_the_others_get_its_files(daemon, tmp_path):
    began = time.monotonic()
    dirs, hits, logs, lines = run_round(tmp_path, "first", daemon.socket_path)
    elapsed = time.monotonic() - began
    # One compile() ran Triton's pipeline; the seven others found the kernel in their cache.
    (compiler,) = compiled_pids(lines)
    assert len(lines) == PROCESSES and len({pid for pid, _what in lines}) == PROCESSES, lines
    assert sorted(hits.values()) == [[False]] + [[True]] * (PROCESSES - 1)
    for log in logs.values():
        assert not tunecache_warnings(log), log

    # Every other process holds the compiler's group in its own TRITON_CACHE_DIR, byte for byte,
    # its __grp__ file naming its own paths, and nothing else (no temporary directory left).
    key_dir, compiled = group_files(dirs[compiler])
    assert sorted(compiled) == sorted(STAGES + [GROUP_FILE])
    assert json.loads(compiled[GROUP_FILE]) == {"child_paths": {s: f"<dir>/{key_dir}/{s}" for s in STAGES}}
    for pid, cache_dir in dirs.items():
        assert group_files(cache_dir) == (key_dir, compiled), pid
    # ... which is what Triton's own manager writes.
    assert stock_group(tmp_path, daemon.socket_path) == (key_dir, compiled)

    with daemon.client() as client:
        (entry,) = compiled_entries(client)
        stats = client.stats()
    assert entry.key.device == "cuda|90|warp32" and entry.key.problem == key_dir
    assert sorted(artifact.name for artifact in entry.result.artifacts) == sorted(STAGES)
    assert stats.leases_granted == 1
    print(f"8 processes, 1 compile, {elapsed:.1f}s for the round")


def test_a_second_node_on_the_same_redis_compiles_nothing(two_cluster_nodes, tmp_path):
    node_a, node_b = two_cluster_nodes
    _dirs, _hits, _logs, lines = run_round(tmp_path, "a", node_a.socket_path, processes=1)
    assert [what for _pid, what in lines] == ["compiled"]
    (a_dir,) = _dirs.values()
    key_dir, compiled = group_files(a_dir)
    with node_a.client() as client:
        (entry,) = compiled_entries(client)
    # The entry reaches node b through Redis (its blobs stay there until b asks).
    deadline = time.monotonic() + PROPAGATION_TIMEOUT_S
    with node_b.client() as client:
        while not client.lookup([entry.key]):
            assert time.monotonic() < deadline, f"node b never saw the entry; log:\n{node_b.log_tail()}"
            time.sleep(0.05)
        before = client.stats()

    began = time.monotonic()
    dirs, hits, logs, lines = run_round(tmp_path, "b", node_b.socket_path)
    elapsed = time.monotonic() - began
    assert compiled_pids(lines) == [] and len(lines) == PROCESSES, lines
    assert list(hits.values()) == [[True]] * PROCESSES
    for pid, cache_dir in dirs.items():
        assert group_files(cache_dir) == (key_dir, compiled), pid
    for log in logs.values():
        assert not tunecache_warnings(log), log
    with node_b.client() as client:
        after = client.stats()
    # Each file came from Redis into node b's store once, however many processes asked.
    digests = {artifact.sha256 for artifact in entry.result.artifacts}
    assert after.artifact_fetches_cluster - before.artifact_fetches_cluster == len(digests)
    assert after.leases_granted == before.leases_granted
    print(f"node b: 8 processes, 0 compiles, {elapsed:.1f}s for the round")


def test_dead_socket_each_process_compiles_as_stock_triton(tmp_path):
    dead = tmp_path / "no-daemon.sock"
    blocks = (64, 128)  # two kernels per process: still one warning
    dirs, hits, logs, lines = run_round(tmp_path, "dead", dead, blocks=blocks)
    assert sorted(compiled_pids(lines)) == sorted(list(dirs) * len(blocks)) and len(lines) == len(blocks) * PROCESSES
    stock_dirs, _hits, _logs, _lines = run_round(tmp_path, "stock", dead, processes=1, manager=False, blocks=blocks)
    (stock,) = [tree(cache_dir) for cache_dir in stock_dirs.values()]
    assert sum(name.endswith(GROUP_FILE) for name in stock) == len(blocks)
    for pid, cache_dir in dirs.items():
        assert tree(cache_dir) == stock, pid
        warnings = tunecache_warnings(logs[pid])
        assert len(warnings) == 1 and "unreachable" in warnings[0], logs[pid]


def test_override_and_dump_stay_tritons_own(daemon, tmp_path):
    # The daemon holds the kernel: a plain process compiled it.
    _dirs, _hits, _logs, lines = run_round(tmp_path, "plain", daemon.socket_path, processes=1)
    assert [what for _pid, what in lines] == ["compiled"]
    (plain_dir,) = _dirs.values()
    key_dir, plain = group_files(plain_dir)
    with daemon.client() as client:
        (entry,) = compiled_entries(client)
        records = client.stats().records

    # TRITON_KERNEL_DUMP: the process compiles (stock Triton dumps only what it compiles) and
    # the dump manager writes exactly what Triton's writes, the cache too (a dumping compile's
    # files are not a plain one's: line info differs).
    dumps, caches = {}, {}
    for manager in (True, False):
        dump_dir = tmp_path / f"dump-{manager}"
        environment = {"TRITON_KERNEL_DUMP": "1", "TRITON_DUMP_DIR": str(dump_dir)}
        dirs, _hits, _logs, lines = run_round(tmp_path, f"dump-{manager}", daemon.socket_path, processes=1,
                                              manager=manager, extra_env=environment)
        assert [what for _pid, what in lines] == ["compiled"], manager
        (cache_dir,) = dirs.values()
        caches[manager] = group_files(cache_dir)
        dumps[manager] = tree(dump_dir)
    assert dumps[True] == dumps[False]
    assert caches[True] == caches[False] and caches[True][0] == key_dir
    (source_key,) = {name.split("/")[0] for name in dumps[False]}
    assert f"{source_key}/{KERNEL}.ptx" in dumps[False] and f"{source_key}/{KERNEL}.sass" in dumps[False]

    # TRITON_KERNEL_OVERRIDE: the override manager's file is used, as by Triton's own manager,
    # and the overridden kernel reaches neither the daemon nor the next process.
    override_dir = tmp_path / "override"
    (override_dir / source_key).mkdir(parents=True)
    overridden_ptx = plain[f"{KERNEL}.ptx"] + b"// overridden by the tunecache test\n"
    (override_dir / source_key / f"{KERNEL}.ptx").write_bytes(overridden_ptx)
    environment = {"TRITON_KERNEL_OVERRIDE": "1", "TRITON_OVERRIDE_DIR": str(override_dir)}
    groups = {}
    for manager in (True, False):
        dirs, _hits, _logs, lines = run_round(tmp_path, f"override-{manager}", daemon.socket_path, processes=1,
                                              manager=manager, extra_env=environment)
        assert [what for _pid, what in lines] == ["compiled"], manager
        (cache_dir,) = dirs.values()
        groups[manager] = group_files(cache_dir)
    assert groups[True] == groups[False]
    assert groups[True][1][f"{KERNEL}.ptx"] == overridden_ptx
    with daemon.client() as client:
        assert compiled_entries(client) == [entry]
        assert client.stats().records == records
    dirs, _hits, _logs, lines = run_round(tmp_path, "after", daemon.socket_path, processes=1)
    assert [what for _pid, what in lines] == ["cached"]
    assert group_files(next(iter(dirs.values()))) == (key_dir, plain)


def test_an_entry_whose_files_are_gone_is_compiled_again(daemon, tmp_path):
    _dirs, _hits, _logs, lines = run_round(tmp_path, "first", daemon.socket_path, processes=1)
    assert [what for _pid, what in lines] == ["compiled"]
    (first_dir,) = _dirs.values()
    expected = group_files(first_dir)
    with daemon.client() as client:
        (entry,) = compiled_entries(client)
        cubin = next(a for a in entry.result.artifacts if a.name == f"{KERNEL}.cubin")
        # The node loses one blob (a disk cleaned behind the daemon's back).
        (daemon.state_dir / "artifacts" / "blobs" / cubin.sha256).unlink()
    dirs, _hits, logs, lines = run_round(tmp_path, "again", daemon.socket_path, processes=1)
    assert [what for _pid, what in lines] == ["compiled"]
    (cache_dir,) = dirs.values()
    assert group_files(cache_dir) == expected
    assert not list(cache_dir.rglob("tmp.pid_*"))
    (log,) = logs.values()
    warnings = tunecache_warnings(log)
    assert len(warnings) == 1 and "could not fetch the compiled kernel" in warnings[0], log


def test_a_compile_that_fails_hands_the_lease_on_at_once(daemon, tmp_path):
    # The first process to compile fails (its .cubin put raises) and stays alive: only giving
    # the lease up, when Triton drops the manager, lets another process compile before it exits.
    doom = tmp_path / "doom"
    dirs, hits, logs, lines = run_round(tmp_path, "doom", daemon.socket_path, doom_marker=str(doom))
    assert doom.exists()
    (failed,) = [pid for pid, outcome in hits.items() if outcome == "failed"]
    (compiler,) = compiled_pids(lines)
    assert compiler != failed
    assert sorted(map(str, hits.values())) == sorted(["failed", "[False]"] + ["[True]"] * (PROCESSES - 2))
    with daemon.client() as client:
        stats = client.stats()
        (entry,) = compiled_entries(client)
    assert (stats.leases_given_up, stats.leases_released_dead, stats.leases_granted) == (1, 0, 2)
    key_dir, compiled = group_files(dirs[compiler])
    for pid, cache_dir in dirs.items():
        if pid != failed:
            assert group_files(cache_dir) == (key_dir, compiled), pid
