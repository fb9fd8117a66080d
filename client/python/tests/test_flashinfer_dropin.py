# Owns the tests of the FlashInfer drop-in (tunecache.integrations.flashinfer) against FlashInfer's
# own autotune_v2 store and autotuner (flashinfer-python 0.7.2.post1, unchanged, with tunecache's
# stand-ins of torch and the rest: flashinfer_standin.py) and the real daemon (two, on one Redis,
# for the cluster): rank processes (flashinfer_rank.py) tune, replay and preload; the CLI imports
# a store their code wrote and exports one their unpatched class reads.
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tunecache
from tunecache import _native

from conftest import cli_binary, require_binary, CLI_BIN_ENV
from flashinfer_standin import SOURCE_ENV, their_source, write_standin

RANK_SCRIPT = Path(__file__).resolve().parent / "flashinfer_rank.py"
RANK_TIMEOUT_S = 120
PROPAGATION_TIMEOUT_S = 20.0
GEMM = {"name": "gemm", "runners": ["Gemm"]}
# Three runners whose winner is the last one (flashinfer_rank.COSTS).
MOE = [{"name": f"moe{n}", "runners": ["SlowA", "SlowB", "Fast"]} for n in (0, 1)]
# ... and whose winner's cache-key extras differ from the losers': two op units per profile.
MOE_EXTRAS = {"name": "moe_x", "runners": ["SlowA", "SlowB", "FastX"]}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    source = their_source()
    if source is None:
        message = f"FlashInfer's code is not extracted (${SOURCE_ENV}; client/python/run_tests.sh does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return write_standin(tmp_path_factory.mktemp("flashinfer") / "tree", source)


def start_rank(standin, socket, spec, **env):
    environment = dict(os.environ, PYTHONPATH=str(standin), TUNECACHE_SOCKET=str(socket))
    environment.pop("TUNECACHE_AUTOSTART", None)
    environment.update({name: str(value) for name, value in env.items()})
    return subprocess.Popen([sys.executable, str(RANK_SCRIPT), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment)


def finish(process):
    out, err = process.communicate(timeout=RANK_TIMEOUT_S)
    assert process.returncode == 0, f"rank failed:\n{out}\n{err}"
    result = json.loads(out.strip().splitlines()[-1])
    result["log"] = err
    return result


def run_ranks(standin, socket, specs, **env):
    return [finish(process) for process in [start_rank(standin, socket, spec, **env) for spec in specs]]


def tune_spec(root, ops, shapes, profile_ms=30, **more):
    return dict(root=str(root), ops=ops, shapes=shapes, profile_ms=profile_ms, dropin="install", **more)


def profiled_units(results):
    """How many times each (op, runner, shape) was profiled, over all ranks."""
    return collections.Counter((op, runner, str(shape)) for result in results for op, runner, shape in result["profiles"])


def one_answer(results):
    answers = [result["chosen"] for result in results]
    assert all(answer == answers[0] for answer in answers), answers
    return answers[0]


def test_eight_ranks_profile_each_key_once_on_the_node(daemon, standin, tmp_path):
    # TUNECACHE_FLASHINFER=1: the package's start-up hook installs the drop-in on import.
    spec = dict(tune_spec(tmp_path / "store", [GEMM], [8, 16, 32, 64]), dropin="env")
    first = run_ranks(standin, daemon.socket_path, [spec] * 8, TUNECACHE_FLASHINFER=1)
    assert all(result["daemon_store"] for result in first)
    profiled = profiled_units(first)
    assert sorted(profiled.values()) == [1, 1, 1, 1], profiled
    tactics = one_answer(first)
    fresh = run_ranks(standin, daemon.socket_path, [spec] * 8, TUNECACHE_FLASHINFER=1)
    assert [result["profiles"] for result in fresh] == [[]] * 8
    assert one_answer(fresh) == tactics
    assert not (tmp_path / "store" / "v2").exists(), "the drop-in wrote their files"


def test_three_runner_ops_lease_the_op_not_the_runner(daemon, standin, tmp_path):
    with daemon.client() as client:
        before = client.stats()
    wait_ms = 20_000
    spec = tune_spec(tmp_path / "store", MOE + [MOE_EXTRAS], [8, 16], profile_ms=300)
    results = run_ranks(standin, daemon.socket_path, [spec] * 4, TUNECACHE_FLASHINFER_WAIT_MS=wait_ms)
    profiled = profiled_units(results)
    # Each op at each shape profiled once on the node (its three runners, once each).
    assert sorted(profiled.values()) == [1] * 18, profiled
    assert all(runner.startswith("Fast") for runner, _tactic in one_answer(results).values())
    # Waiters were released by the winner's publish, not by the end of a wait on a loser's key.
    slowest = max(seconds for result in results for seconds in result["op_seconds"])
    assert slowest < 5.0, slowest
    with daemon.client() as client:
        after = client.stats()
    # One per op unit, none per runner: 2 shapes x (1 unit for each moe op, 2 for moe_x).
    assert after.leases_granted - before.leases_granted == 8
    assert after.leases_active == 0


def test_a_process_group_of_four_asks_and_records_once(daemon, standin, tmp_path):
    with daemon.client() as client:
        before = client.stats()
    specs = [dict(tune_spec(tmp_path / "store", [GEMM], [8, 16]),
                  group={"dir": str(tmp_path / "group"), "rank": rank, "world_size": 4}) for rank in range(4)]
    results = run_ranks(standin, daemon.socket_path, specs)
    one_answer(results)
    collectives = [result["collectives"] for result in results]
    assert all(calls == collectives[0] for calls in collectives)
    assert "broadcast" in collectives[0]
    with daemon.client() as client:
        after = client.stats()
    assert after.records - before.records == 2  # one Record per key, the group's rank 0's
    assert after.leases_granted - before.leases_granted == 2


def test_a_process_group_without_a_daemon_uses_their_files_together(standin, tmp_path):
    # Rank 0 reads the files and broadcasts what it read, so the group still makes the same
    # collectives (their all-reduces) and serves one tactic.
    dead = tmp_path / "no-daemon" / "tunecache.sock"
    specs = [dict(tune_spec(tmp_path / "store", [GEMM], [8, 16]),
                  group={"dir": str(tmp_path / "group"), "rank": rank, "world_size": 4}) for rank in range(4)]
    results = run_ranks(standin, dead, specs)
    one_answer(results)
    assert len(store_files(tmp_path / "store")) == 1 + 2


def stored_device(client):
    """``Key.device`` of the entries stored (one environment)."""
    devices = {entry.key.device for chunk in client.scan(namespace="flashinfer") for entry in chunk}
    assert len(devices) == 1, devices
    return devices.pop()


def test_replay_serves_hits_and_never_waits(daemon, standin, tmp_path):
    root = tmp_path / "store"
    (tuned,) = run_ranks(standin, daemon.socket_path, [tune_spec(root, [GEMM], [8])])
    with daemon.client() as client:
        device = stored_device(client)
        # Another process profiles m=16 and holds its op unit's lease: replay must not wait on it.
        unit = _native.flashinfer_key("('gemm', 'Gemm', ((16, 64), (64, 64)), ())")[2]
        key = tunecache.Key(namespace="flashinfer.op", op="gemm", device=device, problem=unit)
        held = client.begin_tune(key, wait_ms=0, lease_ms=60_000)
        assert held.kind == "tune"
        (replayed,) = run_ranks(standin, daemon.socket_path, [dict(tune_spec(root, [GEMM], [8, 16]), mode="replay")],
                                TUNECACHE_FLASHINFER_WAIT_MS=20_000)
        before = client.stats()
        (forced,) = run_ranks(standin, daemon.socket_path, [tune_spec(root, [GEMM], [32])],
                              TUNECACHE_MODE="replay", TUNECACHE_FLASHINFER_WAIT_MS=20_000)
        after = client.stats()
        assert after.leases_granted == before.leases_granted  # TUNECACHE_MODE=replay takes no lease
        # Its miss was a replayed Resolve (the daemon counts it under the view), not a Lookup.
        assert after.resolves > before.resolves
        client.abandon(held.lease)
    assert replayed["profiles"] == []
    assert replayed["chosen"]["gemm m=8"] == tuned["chosen"]["gemm m=8"]
    assert replayed["chosen"]["gemm m=16"] == ["Gemm", -1]  # their fallback: a miss
    assert max(replayed["op_seconds"]) < 5.0
    assert len(forced["profiles"]) == 1  # a tuning context still profiles its miss, unleased


def test_two_nodes_on_one_redis(two_cluster_nodes, standin, tmp_path):
    node_a, node_b = two_cluster_nodes
    spec = tune_spec(tmp_path / "store", [GEMM], [8, 16])
    (on_a,) = run_ranks(standin, node_a.socket_path, [spec])
    assert len(on_a["profiles"]) == 2
    # Node A's Records reach Redis after they are answered: B is asked once it holds both op units.
    deadline = time.monotonic() + PROPAGATION_TIMEOUT_S
    with node_b.client() as client:
        while len([entry for chunk in client.scan(namespace="flashinfer.op") for entry in chunk]) < 2:
            assert time.monotonic() < deadline, "node A's results never reached node B"
            time.sleep(0.02)
    (on_b,) = run_ranks(standin, node_b.socket_path, [spec])
    assert on_b["profiles"] == []
    assert on_b["chosen"] == on_a["chosen"]


def cli(socket, *args):
    binary = require_binary(cli_binary(), "tunecache", CLI_BIN_ENV, "-p tunecache-cli --bin tunecache")
    process = subprocess.run([str(binary), "--socket", str(socket), *map(str, args)], capture_output=True, text=True,
                             timeout=60)
    assert process.returncode == 0, process.stderr
    return process.stdout


def store_files(root):
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_their_store_imports_and_an_export_is_their_store(daemon, standin, tmp_path):
    theirs = tmp_path / "theirs"
    (stock,) = run_ranks(standin, daemon.socket_path, [dict(tune_spec(theirs, [GEMM] + MOE, [8, 16]), dropin="none")])
    # A second environment (another GPU) in the same store: import reads every one.
    run_ranks(standin, daemon.socket_path, [dict(tune_spec(theirs, [GEMM], [8]), dropin="none")], STANDIN_GPU="Other GPU")
    assert len(store_files(theirs)) == (1 + 6) + (1 + 1)
    cli(daemon.socket_path, "import", "flashinfer", theirs)
    replay = dict(tune_spec(tmp_path / "empty", [GEMM] + MOE, [8, 16]), mode="replay")
    (served,) = run_ranks(standin, daemon.socket_path, [replay])
    assert served["profiles"] == [] and served["chosen"] == stock["chosen"]
    exported = tmp_path / "exported"
    cli(daemon.socket_path, "export", "flashinfer", exported)
    assert store_files(exported) == store_files(theirs)  # byte for byte, manifest included
    other = next(env.name for env in (theirs / "v2").iterdir() if len(list((env / "entries").iterdir())) == 1)
    one_env = tmp_path / "one-env"
    cli(daemon.socket_path, "export", "flashinfer", one_env, "--env", other)
    assert store_files(one_env) == {name: text for name, text in store_files(theirs).items() if other in name}
    # Their unpatched class reads the export as it reads their store, and the drop-in's preload
    # answers what theirs does.
    preload = dict(root=str(exported), preload_only=True, dropin="none")
    (their_read,) = run_ranks(standin, daemon.socket_path, [preload])
    (original,) = run_ranks(standin, daemon.socket_path, [dict(preload, root=str(theirs))])
    (through_daemon,) = run_ranks(standin, daemon.socket_path, [dict(preload, root=str(tmp_path / "x"), dropin="install")])
    assert their_read["total"] == 6 and their_read["preload"]  # the default GPU's environment
    for read in (original, through_daemon):
        assert {k: read[k] for k in ("preload", "total", "skipped")} == {k: their_read[k] for k in ("preload", "total", "skipped")}


def test_a_dead_socket_is_stock_flashinfer(standin, tmp_path):
    dead = tmp_path / "no-daemon" / "tunecache.sock"
    spec = tune_spec(tmp_path / "store", [GEMM] + MOE[:1], [8, 16])
    (with_dropin,) = run_ranks(standin, dead, [spec])
    (stock,) = run_ranks(standin, dead, [dict(spec, root=str(tmp_path / "stock"), dropin="none")])
    assert len(with_dropin["profiles"]) == len(stock["profiles"]) == 2 + 6
    ours, theirs = store_files(tmp_path / "store"), store_files(tmp_path / "stock")
    assert sorted(ours) == sorted(theirs)  # the same files, manifest byte for byte
    manifest = next(name for name in ours if name.endswith("manifest.json"))
    assert ours[manifest] == theirs[manifest]
    assert with_dropin["log"].count("unreachable") == 1, with_dropin["log"]
