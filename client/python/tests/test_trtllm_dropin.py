# Owns the tests of the TensorRT-LLM drop-in (tunecache.integrations.trtllm) against the real
# daemon (two, on one Redis, for the views of issue 27) and a stand-in of TensorRT-LLM's
# autotuner cache (trtllm_standin.py): every test runs rank processes (trtllm_rank.py) and
# compares their caches type for type, float bit for bit.
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tunecache

from trtllm_rank import FASTER_SHARED_VALUE, SHARED_OP, TACTICS, canonical
from trtllm_standin import write_standin

RANK_SCRIPT = Path(__file__).resolve().parent / "trtllm_rank.py"
RANK_TIMEOUT_S = 120


@pytest.fixture
def standin(tmp_path):
    return write_standin(tmp_path / "standin")


def run_rank(standin, socket, spec, rank=0, **env_overrides):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = str(standin)
    environment["STANDIN_RANK"] = str(rank)
    environment["TUNECACHE_SOCKET"] = str(socket)
    environment.update({name: str(value) for name, value in env_overrides.items()})
    process = subprocess.run(
        [sys.executable, str(RANK_SCRIPT), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=RANK_TIMEOUT_S,
    )
    assert process.returncode == 0, f"rank {rank} failed:\n{process.stdout}\n{process.stderr}"
    return json.loads(process.stdout.strip().splitlines()[-1]), process.stderr


def run_rank_cache(standin, socket, spec, rank=0, **env_overrides):
    """run_rank's cache only (canonical entries), with the log."""
    result, log = run_rank(standin, socket, spec, rank=rank, **env_overrides)
    return result["cache"], log


def test_daemon_round_trip_equals_the_file_round_trip(daemon, standin, tmp_path):
    file_path = tmp_path / "file" / "autotuner_cache.json"
    for rank in (0, 1):
        run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": str(file_path)}, rank=rank)
    from_file, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "load", "path": str(file_path)}, rank=0)

    no_file = tmp_path / "daemon" / "autotuner_cache.json"
    for rank in (0, 1):
        run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": str(no_file), "install": True}, rank=rank)
    from_daemon, _ = run_rank_cache(
        standin, daemon.socket_path, {"mode": "load", "path": str(no_file), "install": True}, rank=0
    )
    # Same keys and values, exact types and float bits (5e-324, 0.1 + 0.2, 2**70, int min_time...).
    assert len(from_file) == 20
    assert from_daemon == from_file
    # The file was neither written nor locked.
    assert not no_file.parent.exists() or not any(no_file.parent.iterdir())

    with daemon.client() as client:
        entries = [entry for chunk in client.scan(namespace="trtllm") for entry in chunk]
    devices = {entry.key.device for entry in entries}
    assert devices == {"NVIDIA H200|sm_90|trtllm 1.1.0"}
    shared = [entry for entry in entries if not entry.key.HasField("rank")]
    assert {entry.key.op for entry in shared} == {"trtllm::allreduce"}
    assert {entry.key.rank for entry in entries if entry.key.HasField("rank")} == {0, 1}


def test_autotune_loads_from_the_daemon_without_a_file_both_import_styles(daemon, standin, tmp_path):
    cache_path = tmp_path / "never" / "cache.json"
    saved, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": str(cache_path), "install": True})
    # Without the drop-in, no file means a cold start (and a file written at the end).
    cold_path = tmp_path / "cold" / "cache.json"
    cold, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "autotune", "path": str(cold_path)})
    assert cold == [] and cold_path.exists()
    assert not cache_path.exists()
    warm, _ = run_rank_cache(
        standin, daemon.socket_path, {"mode": "autotune", "path": str(cache_path), "install": True}
    )
    assert warm == saved
    bound, _ = run_rank_cache(
        standin,
        daemon.socket_path,
        {"mode": "autotune_bound", "path": str(cache_path), "install": True, "bind_before_install": True},
    )
    assert bound == saved
    assert not cache_path.exists()
    assert not Path(str(cache_path) + ".lock").exists()


def test_unreachable_daemon_falls_back_to_the_file_with_one_warning(standin, tmp_path):
    missing_socket = tmp_path / "no-daemon.sock"
    cache_path = tmp_path / "cache.json"
    saved, save_log = run_rank_cache(standin, missing_socket, {"mode": "save", "path": str(cache_path), "install": True})
    assert cache_path.is_file(), "the original save_cache did not run"
    loaded, load_log = run_rank_cache(
        standin, missing_socket, {"mode": "autotune", "path": str(cache_path), "install": True}
    )
    assert loaded == saved
    for log in (save_log, load_log):
        warnings = [line for line in log.splitlines() if line.startswith("WARNING:")]
        assert len(warnings) == 1 and "uses its file instead" in warnings[0], log


def test_another_release_or_gpu_never_wins(daemon, standin, tmp_path):
    path = str(tmp_path / "cache.json")
    new, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": path, "install": True, "count": 3})
    # The older release measured other tactics; they are not loaded by the newer one.
    run_rank_cache(
        standin,
        daemon.socket_path,
        {"mode": "save", "path": path, "install": True, "count": 3, "cycle": 5},
        STANDIN_TRTLLM_VERSION="1.0.0",
    )
    loaded, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "load", "path": path, "install": True})
    assert loaded == new
    other_gpu, _ = run_rank_cache(
        standin,
        daemon.socket_path,
        {"mode": "load", "path": path, "install": True},
        STANDIN_DEVICE_NAME="NVIDIA A100-SXM4-80GB",
        STANDIN_DEVICE_CAPABILITY="8.0",
    )
    assert other_gpu == []


def test_many_ranks_save_and_load_at_once(daemon, standin, tmp_path):
    ranks, cycles, count = 8, 6, 8
    path = str(tmp_path / "cache.json")
    with ThreadPoolExecutor(max_workers=ranks) as pool:
        results = list(
            pool.map(
                lambda rank: run_rank_cache(
                    standin,
                    daemon.socket_path,
                    {"mode": "cycles", "path": path, "install": True, "cycles": cycles, "count": count},
                    rank=rank,
                )[0],
                range(ranks),
            )
        )
    assert not os.path.exists(path)
    for rank in range(ranks):
        final, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "load", "path": path, "install": True}, rank=rank)
        # Everything the rank saved, own and shared, is there after all ranks saved at once.
        assert final == results[rank], f"rank {rank}"
        assert len(final) == 2 * cycles * count


def test_four_ranks_get_what_their_file_loader_returns_enums_independent_op_and_rejects(
    daemon, standin, tmp_path
):
    """Issue 26: four ranks save and load through the drop-in, and every rank gets what the
    unpatched class gives from a real file: enum tactics as their values, independent_op filled
    with the shared entries' op names, the metadata, and the same entries skipped (and, issue 35,
    the entry with an infinite min_time, which the file keeps, is not saved)."""
    ranks = range(4)
    spec = {"count": 10, "enums": True, "rejects": True}
    file_path = tmp_path / "file" / "autotuner_cache.json"
    for rank in ranks:
        run_rank(standin, daemon.socket_path, {**spec, "mode": "save", "path": str(file_path)}, rank=rank)
    from_file = [
        run_rank(standin, daemon.socket_path, {"mode": "load", "path": str(file_path)}, rank=rank)[0]
        for rank in ranks
    ]
    no_file = tmp_path / "daemon" / "autotuner_cache.json"
    daemon_saves = [
        run_rank(
            standin, daemon.socket_path, {**spec, "mode": "save", "path": str(no_file), "install": True}, rank=rank
        )[0]
        for rank in ranks
    ]
    from_daemon = [
        run_rank(
            standin, daemon.socket_path, {"mode": "load", "path": str(no_file), "install": True}, rank=rank
        )[0]
        for rank in ranks
    ]
    assert not no_file.parent.exists()

    for rank in ranks:
        expected, got = from_file[rank], from_daemon[rank]
        # What their loader does, spelled out, so that a stand-in gone wrong fails here too.
        assert expected["independent_op"] == ["trtllm::allreduce"], rank
        tactics = {json.dumps(key): value[1][1] for key, value in expected["cache"]}
        runners = {key[1][1][1]: value[1][1] for key, value in expected["cache"]}
        assert runners["Fp4QuantRunner"] == ["int", "-1"], rank  # Fp4QuantTactic.TRTLLM, saved as -1
        assert runners["TileRunner"] == ["str", "small"], rank  # TileCfg.SMALL, saved as "small"
        assert runners["SlowRunner"] == ["int", "4"] and "OpaqueRunner" not in runners, rank
        assert "NanRunner" not in runners and "InfKeyRunner" not in runners, rank
        slow = next(value for key, value in expected["cache"] if key[1][1][1] == "SlowRunner")
        assert slow[1][2] == ["float", "inf"], rank
        assert len(tactics) == (10 + 2) + (10 + 1), rank  # shared ones, then the rank's own
        # The drop-in gives the same, type for type and bit for bit, except SlowRunner's entry:
        # its min_time is inf, which TensorRT-LLM's autotuner never stores (only a time that beat
        # inf enters its cache) and its merge cannot order, so the drop-in, like the CLI's
        # import and export, does not save it (tunecache_trtllm::entry).
        assert got["cache"] == [item for item in expected["cache"] if item != slow_item(expected)], f"rank {rank}"
        assert got["independent_op"] == expected["independent_op"], f"rank {rank}"
        # The metadata is the first saver's, read back from JSON (device_capability a list), in
        # each run; only the creation time differs between the two runs.
        got_metadata, expected_metadata = metadata_of(got), metadata_of(expected)
        assert got_metadata.pop("creation_timestamp") == metadata_of(daemon_saves[0])["creation_timestamp"]
        expected_metadata.pop("creation_timestamp")
        assert got_metadata == expected_metadata, f"rank {rank}"
        assert got_metadata["device_capability"] == ["list", [["int", "9"], ["int", "0"]]], f"rank {rank}"


def slow_item(result):
    """The canonical cache item of the SlowRunner entry (min_time inf) in a rank's result."""
    return next(item for item in result["cache"] if item[0][1][1][1] == "SlowRunner")


def metadata_of(result):
    """The canonical metadata of a rank's result as {name: canonical value}."""
    return {name[1]: value for name, value in result["metadata"][1]}


def test_ranks_load_in_the_view_their_launcher_names_with_no_code_change(daemon, standin, tmp_path, monkeypatch):
    """Issue 27: the drop-in's Scan reads in the view the rank's environment names (here Slurm's
    job and step), with nothing in the rank's code or the install() call about views: the
    daemon pins what the ranks loaded in that view."""
    monkeypatch.delenv("TUNECACHE_VIEW")
    path = str(tmp_path / "cache.json")
    saved, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": path, "install": True}, rank=0)
    assert saved
    for rank in (0, 1):
        loaded, log = run_rank(
            standin, daemon.socket_path, {"mode": "load", "path": path, "install": True}, rank=rank,
            SLURM_JOB_ID="777", SLURM_STEP_ID="2",
        )
        assert "uses its file instead" not in log, log
        assert loaded["cache"], log
    with tunecache.Client(daemon.socket_path) as client:
        views = {view.name: view.pins for view in client.list_views()}
    assert views.get("slurm-777.2", 0) >= len(saved), views


VIEW_TEST_COUNT = 3  # shared entries n = 0..2, each beaten by a faster_shared save
PROPAGATION_TIMEOUT_S = 10.0


def shared_tactics(cache):
    """The shared op's tactics in a rank's canonical cache, as {key: canonical tactic}."""
    return {json.dumps(key): value[1][1] for key, value in cache if key[1][0] == ["str", SHARED_OP]}


def wait_for_shared_tactics(node, tactics):
    """Waits until ``node`` answers, without a view, the shared trtllm entries with exactly
    ``tactics`` (their texts as the drop-in stores them, the repr): what crossed Redis."""
    deadline = time.monotonic() + PROPAGATION_TIMEOUT_S
    with node.client() as client:
        while True:
            entries = [entry for chunk in client.scan(namespace="trtllm") for entry in chunk]
            shared = [entry for entry in entries if not entry.key.HasField("rank")]
            held = sorted(json.loads(entry.result.config)["tactic"] for entry in shared)
            if held == sorted(tactics):
                return
            assert time.monotonic() < deadline, f"{node.socket_path} holds shared tactics {held}, not {tactics}"
            time.sleep(0.02)


def test_four_ranks_on_two_nodes_load_one_views_tactics_while_a_better_entry_arrives(
    two_cluster_nodes, standin, tmp_path
):
    """Issue 27: four TensorRT-LLM rank processes of one job (view job-1, from TUNECACHE_VIEW),
    two per node, load while another job saves better shared entries through the other node in
    between; all four load the same tactics, the ones the first rank read. A rank without the
    view loads the better ones, on both nodes."""
    node_a, node_b = two_cluster_nodes
    path = str(tmp_path / "cache.json")
    save = {"mode": "save", "path": path, "install": True, "count": VIEW_TEST_COUNT}
    load = {"mode": "load", "path": path, "install": True}
    # An earlier job's rank saved the cache this job starts from; both nodes hold it.
    run_rank_cache(standin, node_a.socket_path, save, rank=0)
    first = [TACTICS[n] for n in range(VIEW_TEST_COUNT)]
    wait_for_shared_tactics(node_b, [repr(tactic) for tactic in first])

    loads = {}
    loads[0], _ = run_rank_cache(standin, node_a.socket_path, load, rank=0, TUNECACHE_VIEW="job-1")
    # Another job (no view) saves a faster tactic for every shared entry through node b; it
    # reaches node a through Redis before this job's next rank there loads.
    run_rank_cache(standin, node_b.socket_path, {**save, "faster_shared": True}, rank=5)
    faster = FASTER_SHARED_VALUE[1]
    wait_for_shared_tactics(node_a, [repr(faster)] * VIEW_TEST_COUNT)
    for rank, node in ((2, node_b), (1, node_a), (3, node_b)):
        loads[rank], _ = run_rank_cache(standin, node.socket_path, load, rank=rank, TUNECACHE_VIEW="job-1")

    pinned = shared_tactics(loads[0])
    assert sorted(pinned.values(), key=json.dumps) == sorted((canonical(t) for t in first), key=json.dumps)
    for rank in (1, 2, 3):
        assert shared_tactics(loads[rank]) == pinned, f"rank {rank}"
    # Without the view, a rank on either node loads the faster tactics.
    for node in (node_a, node_b):
        unpinned, _ = run_rank_cache(standin, node.socket_path, load, rank=1)
        assert list(shared_tactics(unpinned).values()) == [canonical(faster)] * VIEW_TEST_COUNT, node.socket_path


def test_replay_loads_the_cached_entries_and_sends_nothing_back(daemon, standin, tmp_path):
    """TUNECACHE_MODE=replay: load_cache serves the daemon's entries (a shape without one is a
    miss of TensorRT-LLM's own cache: its default tactic), and save_cache sends and writes
    nothing, so no lease or Record is ever taken."""
    path = tmp_path / "autotuner_cache.json"
    saved, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "save", "path": str(path), "install": True})
    with daemon.client() as client:
        before = client.stats()
    loaded, _ = run_rank_cache(standin, daemon.socket_path, {"mode": "load", "path": str(path), "install": True},
                               TUNECACHE_MODE="replay")
    assert loaded == saved
    again, log = run_rank_cache(standin, daemon.socket_path,
                                {"mode": "save", "path": str(path), "install": True, "cycle": 1},
                                TUNECACHE_MODE="replay")
    assert again != saved  # new entries this rank would have saved
    with daemon.client() as client:
        after = client.stats()
    assert (after.records, after.leases_granted, after.entries_stored) == \
        (before.records, before.leases_granted, before.entries_stored)
    assert not path.exists()
    assert "WARNING:tunecache" not in log
