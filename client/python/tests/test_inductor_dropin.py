# Owns the tests of the PyTorch Inductor drop-in (tunecache.integrations.inductor) against
# Inductor's own code: real torch 2.15.0 on the CPU, where torch.compile(mode="max-autotune")
# benchmarks Inductor's C++ GEMM template against ATen through PersistentCache.lookup (the GPU is
# the only thing not real), rank processes (inductor_rank.py) started at once on one real daemon,
# or on two daemons sharing one real Redis; a stand-in Triton kernel for AutotuneCache (no GPU to
# autotune on); the CLI's import and export read back by their unpatched classes.
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLI_BIN_ENV, cli_binary, require_binary, running_daemon

RANK_SCRIPT = Path(__file__).with_name("inductor_rank.py")
RANK_TIMEOUT_S = 600
# Three small Linears: their C++ kernels build once per test module (the warm directory, whose
# copy every rank starts from), so a test pays for benchmarks and compiles, not for g++ on every
# rank, nor for the headers and kernels any first compile builds (a cold directory costs a new
# shape about 20 s of CPU, a warm one about 7).
SHAPES = [[64, 32, 8], [96, 48, 8], [128, 64, 8]]
NAMESPACE = "inductor"


@pytest.fixture(scope="module")
def torch_installed():
    if importlib.util.find_spec("torch") is None:
        message = "torch (2.15.0) is not installed in this environment (client/python/run_tests.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def warm_cache_dir(torch_installed, tmp_path_factory):
    """An Inductor cache directory holding the C++ kernels of SHAPES, built by one stock rank,
    without its GEMM timings (cache/): a test copies it, so its ranks find the kernels built and
    every benchmark still to run."""
    directory = tmp_path_factory.mktemp("inductor-warm")
    finish(start_rank(None, {"shapes": SHAPES, "dropin": "none"}, directory))
    shutil.rmtree(directory / "cache")
    return directory


def cache_dir_from(warm: Path, into: Path) -> Path:
    shutil.copytree(warm, into)
    return into


def start_rank(socket, spec, cache_dir, **env):
    environment = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    for name in ("TUNECACHE_AUTOSTART", "TUNECACHE_INDUCTOR", "TUNECACHE_MODE", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"):
        environment.pop(name, None)
    if socket is not None:
        environment["TUNECACHE_SOCKET"] = str(socket)
    environment.update({name: str(value) for name, value in env.items()})
    return subprocess.Popen([sys.executable, str(RANK_SCRIPT), json.dumps(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)


def finish(process):
    out, err = process.communicate(timeout=RANK_TIMEOUT_S)
    assert process.returncode == 0, f"rank failed:\n{out[-4000:]}\n{err[-8000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    result["log"] = err
    return result


def run_at_once(starts):
    """Starts every rank, waits until each has imported torch, then lets them all go at once."""
    processes = [start() for start in starts]
    for process in processes:
        line = process.stdout.readline()
        assert line.strip() == "ready", f"rank did not get ready: {line!r} {process.stderr.read()[-4000:]}"
    for process in processes:
        process.stdin.close()
    results = []
    for process in processes:
        out, err = process.stdout.read(), process.stderr.read()
        process.wait(timeout=RANK_TIMEOUT_S)
        assert process.returncode == 0, f"rank failed:\n{out[-4000:]}\n{err[-8000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        result["log"] = err
        results.append(result)
    return results


def bests(result):
    """{inputs: winning choice} of one rank's lookups."""
    return {lookup["inputs"]: lookup["best"] for lookup in result["lookups"]}


def daemon_entries(daemon, namespace=NAMESPACE):
    with daemon.client() as client:
        return [entry for chunk in client.scan(namespace) for entry in chunk]


def test_ranks_compiling_the_same_shapes_benchmark_each_once_and_agree(daemon, warm_cache_dir, tmp_path):
    cache_dir = cache_dir_from(warm_cache_dir, tmp_path / "inductor")
    spec = {"shapes": SHAPES, "barrier": True}
    # TUNECACHE_INDUCTOR=1 is the start-up hook's switch: no line of the rank names the drop-in.
    ranks = run_at_once([lambda: start_rank(daemon.socket_path, spec, cache_dir, TUNECACHE_INDUCTOR=1)] * 4)
    assert all(rank["dropin"] for rank in ranks), [rank["log"][-2000:] for rank in ranks]
    assert sum(rank["rounds"] for rank in ranks) == len(SHAPES), [rank["rounds"] for rank in ranks]
    answers = [bests(rank) for rank in ranks]
    assert len(answers[0]) == len(SHAPES) and all(answer == answers[0] for answer in answers), answers
    timings = [[lookup["timings"] for lookup in rank["lookups"]] for rank in ranks]
    assert all(timing == timings[0] for timing in timings)
    # Nothing went to their file: the daemon holds the timings.
    assert not (cache_dir / "cache").exists()
    entries = daemon_entries(daemon)
    assert len(entries) == len(SHAPES)
    assert {entry.key.op for entry in entries} == {"packed_linear"}

    fresh = finish(start_rank(daemon.socket_path, {"shapes": SHAPES, "dropin": "install"}, cache_dir_from(warm_cache_dir, tmp_path / "fresh")))
    assert fresh["rounds"] == 0
    assert bests(fresh) == answers[0]

    # Exported, their file answers stock Inductor (no drop-in, no daemon) the same timings.
    cli = require_binary(cli_binary(), "tunecache CLI", CLI_BIN_ENV, "-p tunecache-cli")
    exported = cache_dir_from(warm_cache_dir, tmp_path / "exported")
    subprocess.run([str(cli), "--socket", str(daemon.socket_path), "export", "inductor", str(exported)],
                   check=True, capture_output=True, text=True)
    stock = finish(start_rank(None, {"shapes": SHAPES, "dropin": "none"}, exported))
    assert stock["rounds"] == 0
    assert [lookup["timings"] for lookup in stock["lookups"]] == timings[0]


def test_ranks_compiling_distinct_shapes_at_once_keep_every_timing(daemon, warm_cache_dir, tmp_path):
    # Stock Inductor keeps these in one JSON file per system, read whole and written back whole
    # with no lock: ranks benchmarking at once drop each other's timings (2 of 8 kept, measured).
    cache_dir = cache_dir_from(warm_cache_dir, tmp_path / "inductor")
    specs = [{"shapes": [[40 + 8 * rank, 24, 4], [40 + 8 * rank, 16, 4]], "barrier": True, "dropin": "install"}
             for rank in range(4)]
    ranks = run_at_once([lambda spec=spec: start_rank(daemon.socket_path, spec, cache_dir) for spec in specs])
    assert [rank["rounds"] for rank in ranks] == [2, 2, 2, 2]
    entries = daemon_entries(daemon)
    assert len(entries) == 8
    kept = {(entry.key.op, entry.key.problem) for entry in entries}
    asked = {lookup["inputs"] for rank in ranks for lookup in rank["lookups"]}
    assert len(asked) == 8 and all(any(problem.startswith(inputs + "|") for _op, problem in kept) for inputs in asked)
    for entry in entries:
        assert len(json.loads(entry.result.config)) == 2, entry.result.config


def test_a_shape_benchmarked_on_one_node_is_not_benchmarked_on_another(two_cluster_nodes, warm_cache_dir, tmp_path):
    node_a, node_b = two_cluster_nodes
    shape = {"shapes": SHAPES[:1], "dropin": "install"}
    on_a = finish(start_rank(node_a.socket_path, shape, cache_dir_from(warm_cache_dir, tmp_path / "a")))
    assert on_a["rounds"] == 1
    deadline = time.monotonic() + 20
    while not daemon_entries(node_b):
        assert time.monotonic() < deadline, "node b never learned node a's timings"
        time.sleep(0.05)
    on_b = finish(start_rank(node_b.socket_path, shape, cache_dir_from(warm_cache_dir, tmp_path / "b")))
    assert on_b["rounds"] == 0
    assert bests(on_b) == bests(on_a)


def test_a_compiled_graph_is_served_to_another_process_through_the_remote_cache(daemon, warm_cache_dir, tmp_path):
    spec = {"shapes": SHAPES[:1], "dropin": "install", "remote_fx": True, "counters": True}
    first = finish(start_rank(daemon.socket_path, spec, cache_dir_from(warm_cache_dir, tmp_path / "first")))
    assert first["counters"]["inductor"].get("fxgraph_cache_miss", 0) >= 1
    stored = daemon_entries(daemon, "inductor.remote")
    # The compiled graph is over the inline bound: an artifact, served only if its digest matches.
    assert [entry.key.op for entry in stored if entry.result.artifacts] == ["RemoteFxGraphCache"], stored
    # Another process, with a cache directory of its own: the graph comes from the daemon.
    second = finish(start_rank(daemon.socket_path, spec, cache_dir_from(warm_cache_dir, tmp_path / "second")))
    inductor = second["counters"]["inductor"]
    assert inductor.get("fxgraph_cache_hit", 0) >= 1 and inductor.get("fxgraph_cache_miss", 0) == 0, inductor


def test_a_kernel_autotunes_once_per_node_and_their_class_reads_an_export(daemon, torch_installed, tmp_path):
    cli = require_binary(cli_binary(), "tunecache CLI", CLI_BIN_ENV, "-p tunecache-cli")
    cache_dir = tmp_path / "inductor"
    kernel = {"filename": str(cache_dir / "ab" / "cabkernel.py"), "configs_hash": "c0nf1gs", "autotune_ms": 300}
    spec = {"kernel": kernel, "dropin": "install", "barrier": True}
    ranks = run_at_once([lambda: start_rank(daemon.socket_path, spec, cache_dir)] * 3)
    assert sorted(rank["autotuned"] for rank in ranks) == [False, False, True], ranks
    assert all(rank["best"] == {"XBLOCK": 128, "num_warps": 8} for rank in ranks)
    assert not list(cache_dir.rglob("*.best_config")), "the drop-in wrote their files"

    exported = tmp_path / "exported"
    subprocess.run([str(cli), "--socket", str(daemon.socket_path), "export", "inductor", str(exported)],
                   check=True, capture_output=True, text=True)
    stock = finish(start_rank(None, {"kernel": dict(kernel, filename=str(exported / "ab" / "cabkernel.py")), "dropin": "none"}, exported))
    assert stock == dict(stock, autotuned=False, best={"XBLOCK": 128, "num_warps": 8})


def test_without_a_daemon_inductor_is_stock_and_its_file_imports(socket_dir, warm_cache_dir, tmp_path):
    cli = require_binary(cli_binary(), "tunecache CLI", CLI_BIN_ENV, "-p tunecache-cli")
    cache_dir = cache_dir_from(warm_cache_dir, tmp_path / "inductor")
    dead = socket_dir / "nobody-here.sock"
    shapes = {"shapes": SHAPES[:2], "dropin": "install"}
    alone = finish(start_rank(dead, shapes, cache_dir))
    assert alone["rounds"] == 2
    assert alone["log"].count("Inductor uses its own caches instead") == 1, alone["log"][-3000:]
    files = list((cache_dir / "cache").iterdir())
    assert len(files) == 1
    held = json.loads(files[0].read_text())["cache"]["packed_linear"]
    assert {inputs for inputs in held} == set(bests(alone))

    # Their file, imported, answers a daemon rank: no benchmark.
    with running_daemon(socket_dir / "daemon") as daemon:
        subprocess.run([str(cli), "--socket", str(daemon.socket_path), "import", "inductor", str(cache_dir)],
                       check=True, capture_output=True, text=True)
        assert len(daemon_entries(daemon)) == 2
        served = finish(start_rank(daemon.socket_path, shapes, cache_dir_from(warm_cache_dir, tmp_path / "fresh")))
        assert served["rounds"] == 0
        assert bests(served) == bests(alone)

        # Replay: a hit is served, a miss is stock's (benchmarked here, into their file), and
        # nothing waits, leases or Records.
        replay = {"shapes": SHAPES[1:], "dropin": "install"}
        replayed = finish(start_rank(daemon.socket_path, replay, cache_dir, TUNECACHE_MODE="replay"))
        assert replayed["rounds"] == 1
        assert len(daemon_entries(daemon)) == 2
        assert len(json.loads(files[0].read_text())["cache"]["packed_linear"]) == 3
