# Owns the tests that the TensorRT-LLM entry mapping is one (issue 35): the drop-in
# (tunecache.integrations.trtllm, through the binding), `tunecache import` and `tunecache export`
# (the CLI, client/cli) are the same Rust rule (tunecache_trtllm::entry), so what one writes the
# other reads, and a table of edge-case entries is accepted and refused alike by all three. The
# framework's writer and loader are the stand-in of TensorRT-LLM's autotuner (trtllm_standin.py,
# written from TensorRT-LLM's source); the daemon and the CLI are the real binaries.
from __future__ import annotations

import enum
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI_BIN_ENV, cli_binary, require_binary
from trtllm_rank import canonical, dump
from trtllm_standin import write_standin

RANK_SCRIPT = Path(__file__).resolve().parent / "trtllm_rank.py"
RANK_TIMEOUT_S = 120
CLI_TIMEOUT_S = 60


@pytest.fixture
def cli():
    return require_binary(cli_binary(), "tunecache", CLI_BIN_ENV, "-p tunecache-cli")


def run_cli(cli, socket, *args):
    """The CLI's --json answer (its last stdout line) for ``args`` against the daemon at socket."""
    process = subprocess.run(
        [str(cli), "--socket", str(socket), "--json", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert process.returncode == 0, f"tunecache {' '.join(args)} failed:\n{process.stdout}\n{process.stderr}"
    return json.loads(process.stdout.strip().splitlines()[-1])


def run_rank(standin, socket, spec, rank=0):
    environment = dict(os.environ, PYTHONPATH=str(standin), STANDIN_RANK=str(rank), TUNECACHE_SOCKET=str(socket))
    process = subprocess.run(
        [sys.executable, str(RANK_SCRIPT), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=RANK_TIMEOUT_S,
    )
    assert process.returncode == 0, f"rank {rank} failed:\n{process.stdout}\n{process.stderr}"
    return json.loads(process.stdout.strip().splitlines()[-1])


def without_infinite_min_time(result):
    """A rank's canonical cache without the SlowRunner entry (min_time inf), which the framework's
    file keeps and the mapping refuses: TensorRT-LLM itself never stores such a time."""
    return [item for item in result["cache"] if item[1][1][2] != ["float", "inf"]]


SPEC = {"count": 10, "enums": True, "rejects": True}
RANKS = (0, 1)


def test_saved_through_the_dropin_and_exported_by_the_cli_the_frameworks_loader_reads_it(daemon, cli, tmp_path):
    """(a) Ranks save through the drop-in (no file); `tunecache export` writes the file; the
    framework's own loader reads from it what it reads from a file the ranks wrote themselves."""
    standin = write_standin(tmp_path / "standin")
    own_file = tmp_path / "own" / "cache.json"
    for rank in RANKS:
        run_rank(standin, daemon.socket_path, {**SPEC, "mode": "save", "path": str(own_file)}, rank=rank)
    from_own_file = [run_rank(standin, daemon.socket_path, {"mode": "load", "path": str(own_file)}, rank=rank)
                     for rank in RANKS]

    no_file = tmp_path / "dropin" / "cache.json"
    for rank in RANKS:
        run_rank(standin, daemon.socket_path, {**SPEC, "mode": "save", "path": str(no_file), "install": True}, rank=rank)
    assert not no_file.parent.exists()
    exported_file = tmp_path / "exported" / "cache.json"
    exported_file.parent.mkdir()
    summary = run_cli(cli, daemon.socket_path, "export", "--format", "trtllm", "--world-size", "2", str(exported_file))
    # Everything the drop-in stored, export writes: one rule both ways.
    assert summary["skipped"] == [] and summary["exported"] > 0, summary
    from_export = [run_rank(standin, daemon.socket_path, {"mode": "load", "path": str(exported_file)}, rank=rank)
                   for rank in RANKS]
    for rank in RANKS:
        expected, got = from_own_file[rank], from_export[rank]
        assert len(expected["cache"]) == (10 + 2) + (10 + 1), rank
        # Type for type, float bit for bit (enums as their values, 5e-324, 2**70 tactics, ...).
        assert got["cache"] == without_infinite_min_time(expected), f"rank {rank}"
        assert got["independent_op"] == expected["independent_op"] == ["trtllm::allreduce"], f"rank {rank}"
        got_metadata = {name[1]: value for name, value in got["metadata"][1]}
        assert got_metadata["device_name"] == ["str", "NVIDIA H200"]
        assert got_metadata["device_capability"] == ["list", [["int", "9"], ["int", "0"]]]


def test_imported_by_the_cli_the_dropin_loads_what_the_file_gives(daemon, cli, tmp_path):
    """(b) Ranks save to a file with the framework's own writer; `tunecache import` stores it;
    ranks load through the drop-in (no file) what the framework's loader reads from the file."""
    standin = write_standin(tmp_path / "standin")
    file_path = tmp_path / "file" / "cache.json"
    for rank in RANKS:
        run_rank(standin, daemon.socket_path, {**SPEC, "mode": "save", "path": str(file_path)}, rank=rank)
    from_file = [run_rank(standin, daemon.socket_path, {"mode": "load", "path": str(file_path)}, rank=rank)
                 for rank in RANKS]
    summary = run_cli(cli, daemon.socket_path, "import", "--format", "trtllm", str(file_path))
    # Per rank a tactic and a key no literal_eval reads, and a nan tactic; the shared entry
    # whose min_time is Infinity: the same entries the drop-in refuses.
    assert len(summary["skipped"]) == 2 * 3 + 1, summary
    assert sum("min_time Infinity" in item["reason"] for item in summary["skipped"]) == 1, summary
    no_file = tmp_path / "never" / "cache.json"
    for rank in RANKS:
        got = run_rank(standin, daemon.socket_path, {"mode": "load", "path": str(no_file), "install": True}, rank=rank)
        expected = from_file[rank]
        assert got["cache"] == without_infinite_min_time(expected), f"rank {rank}"
        assert got["independent_op"] == expected["independent_op"], f"rank {rank}"
        # The metadata of the file, as its loader sets it (creation time included).
        assert got["metadata"] == expected["metadata"], f"rank {rank}"
    assert not no_file.parent.exists()


# --- one table, three paths ------------------------------------------------------------------------


class Tile(enum.Enum):
    SMALL = "small"


class Opaque:
    """A tactic whose repr is no Python literal."""

    def __repr__(self):
        return "Opaque(tile=64)"


# (what, cache key, (runner_id, tactic, min_time), accepted): cache items as a rank's
# AutoTunerProfilingCache could hold them. Accepted: what TensorRT-LLM itself could have written
# (tunecache_trtllm::entry says why, field by field).
CASES = [
    ("measured", ("op::a", "R", "1", ((1, 2),)), (0, 5, 0.1), True),
    ("int min_time", ("op::a", "R", "1", ((1, 3),)), (2, -1, 7), True),
    ("zero min_time", ("op::a", "R", "1", ((1, 4),)), (1, None, 0.0), True),
    ("subnormal min_time", ("op::a", "R", "1", ((1, 5),)), (0, (128, "x"), 5e-324), True),
    ("enum tactic", ("op::a", "R", "1", ((1, 6),)), (0, Tile.SMALL, 0.5), True),
    ("dict tactic", ("op::a", "R", "1", ((1, 7),)), (0, {"tile": (64, 128)}, 1e-3), True),
    ("infinite min_time", ("op::b", 1), (0, 4, math.inf), False),
    ("-infinite min_time", ("op::b", 2), (0, 4, -math.inf), False),
    ("nan min_time", ("op::b", 3), (0, 4, math.nan), False),
    ("negative min_time", ("op::b", 4), (0, 4, -0.5), False),
    ("min_time as text", ("op::b", 5), (0, 4, "0.5"), False),
    ("None min_time", ("op::b", 6), (0, 4, None), False),
    ("float runner_id", ("op::c", 1), (0.5, 4, 1.0), False),
    ("integral float runner_id", ("op::c", 2), (1.0, 4, 1.0), False),
    ("bool runner_id", ("op::c", 3), (True, 4, 1.0), False),
    ("text runner_id", ("op::c", 4), ("0", 4, 1.0), False),
    ("negative runner_id", ("op::c", 5), (-1, 4, 1.0), False),
    ("huge runner_id", ("op::c", 6), (2**70, 4, 1.0), False),
    ("non-string op", (42, "op::d"), (0, 4, 1.0), False),
    ("empty op", ("", 1), (0, 4, 1.0), False),
    ("key with inf", ("op::d", math.inf), (0, 4, 1.0), False),
    ("tactic not a literal", ("op::e", 1), (0, Opaque(), 1.0), False),
    ("nan tactic", ("op::e", 2), (0, math.nan, 1.0), False),
]
ACCEPTED = {str(key) for _what, key, _value, accepted in CASES if accepted}
CAPABILITY = (9, 0)
VERSION = "1.1.0"


@pytest.fixture
def trtllm(tmp_path_factory):
    """The stand-in's autotuner module, imported in this process, and the drop-in module with
    its patches undone at the end."""
    root = write_standin(tmp_path_factory.mktemp("standin"))
    sys.path.insert(0, str(root))
    try:
        for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
            del sys.modules[name]
        autotuner = importlib.import_module("tensorrt_llm._torch.autotuner")
        import tunecache.integrations.trtllm as dropin

        yield autotuner, dropin
    finally:
        import tunecache.integrations.trtllm as dropin

        dropin.uninstall()
        sys.path.remove(str(root))


def profiling_cache(autotuner, device_name, items):
    cache = autotuner.AutoTunerProfilingCache()
    cache.device_name = device_name
    cache.device_capability = CAPABILITY
    cache.lib_version = VERSION
    cache.cache.update(items)
    return cache


def problems(daemon, device_name):
    with daemon.client() as client:
        device = f"{device_name}|sm_90|trtllm {VERSION}"
        return {entry.key.problem for chunk in client.scan(namespace="trtllm", device=device) for entry in chunk}


def test_edge_cases_are_accepted_and_refused_alike_by_the_dropin_import_and_export(daemon, cli, trtllm, tmp_path):
    autotuner, dropin = trtllm
    items = {key: value for _what, key, value, _accepted in CASES}
    original_save = autotuner.AutoTunerProfilingCache.save_cache
    original_load = autotuner.AutoTunerProfilingCache.load_cache
    # The framework's writer, then the CLI's import of its file.
    file_path = tmp_path / "written" / "cache.json"
    original_save(profiling_cache(autotuner, "import-gpu", items), file_path, 0)
    run_cli(cli, daemon.socket_path, "import", "--format", "trtllm", str(file_path))
    # The drop-in's save.
    dropin.install(socket=daemon.socket_path)
    profiling_cache(autotuner, "dropin-gpu", items).save_cache(tmp_path / "never.json", 0)
    assert not (tmp_path / "never.json").exists()

    imported, saved = problems(daemon, "import-gpu"), problems(daemon, "dropin-gpu")
    for what, key, _value, accepted in CASES:
        assert (str(key) in imported) == accepted, f"import: {what}"
        assert (str(key) in saved) == accepted, f"drop-in: {what}"
    assert imported == saved == ACCEPTED

    # Back out: the CLI's export read by the framework's loader, and the drop-in's load, give
    # every accepted entry with its exact value.
    expected = {str(key): canonical(value) for _what, key, value, accepted in CASES if accepted}
    expected[str(CASES[4][1])] = canonical((0, "small", 0.5))  # an enum is saved as its value
    exported_file = tmp_path / "exported" / "cache.json"
    exported_file.parent.mkdir()
    summary = run_cli(cli, daemon.socket_path, "export", "--format", "trtllm", "--device",
                      f"import-gpu|sm_90|trtllm {VERSION}", str(exported_file))
    assert summary["skipped"] == [], summary
    from_export = profiling_cache(autotuner, "import-gpu", {})
    original_load(from_export, exported_file, 0)
    loaded = profiling_cache(autotuner, "dropin-gpu", {})
    loaded.load_cache(tmp_path / "never.json", 0)
    for cache in (from_export, loaded):
        assert {str(key): canonical(value) for key, value in cache.cache.items()} == expected


# Configs already in a daemon (recorded by other clients or older releases), and whether a file
# may be written from them: the CLI's export and the drop-in's load must agree.
STORED = [
    ("imported", '{"runner_id": 0, "tactic": "5", "min_time": 0.1, "min_time_text": "0.1"}', 100.0, True),
    ("recorded natively, no min_time", '{"runner_id": 1, "tactic": "(64, 2)"}', 250.0, True),
    ("older drop-in, runner_id_text", '{"runner_id": 3, "runner_id_text": "3", "tactic": "7", "min_time": 0.5, "min_time_text": "0.5"}', 500.0, True),
    ("older drop-in, infinite min_time", '{"runner_id": 0, "tactic": "4", "min_time": null, "min_time_text": "Infinity"}', 1.7976931348623157e308, False),
    ("older drop-in, float runner_id", '{"runner_id": 0.5, "runner_id_text": "0.5", "tactic": "4", "min_time": 1.0}', 1000.0, False),
    ("tactic not text", '{"runner_id": 0, "tactic": 4, "min_time": 1.0}', 1000.0, False),
    ("tactic not a literal", '{"runner_id": 0, "tactic": "Tactic(3)", "min_time": 1.0}', 1000.0, False),
    ("negative min_time", '{"runner_id": 0, "tactic": "4", "min_time": -1}', 1000.0, False),
    ("not a TensorRT-LLM config", '{"block": 128}', 1000.0, False),
]


def test_stored_configs_are_written_and_loaded_alike_by_export_and_the_dropin(daemon, cli, trtllm, tmp_path):
    autotuner, dropin = trtllm
    device = f"stored-gpu|sm_90|trtllm {VERSION}"
    metadata = json.dumps({"lib_version": VERSION, "creation_timestamp": 1718000000.5,
                           "device_name": "stored-gpu", "device_capability": [9, 0]})
    entries = []
    for index, (_what, config, time_us, _accepted) in enumerate(STORED):
        stored = json.loads(config)
        stored["trtllm_metadata_json"] = metadata
        entries.append({
            "key": {"namespace": "trtllm", "op": "op::s", "device": device, "problem": f"('op::s', {index})", "rank": 0},
            "result": {"config": json.dumps(stored), "time_us": time_us},
        })
    with daemon.client() as client:
        assert client.record(entries).stored == len(STORED)
    expected = {f"('op::s', {index})" for index, case in enumerate(STORED) if case[3]}

    exported_file = tmp_path / "exported" / "cache.json"
    exported_file.parent.mkdir()
    summary = run_cli(cli, daemon.socket_path, "export", "--format", "trtllm", "--device", device, str(exported_file))
    assert {item["key"] for item in summary["skipped"]} == {f"('op::s', {index})" for index in range(len(STORED))} - expected
    from_export = profiling_cache(autotuner, "stored-gpu", {})
    autotuner.AutoTunerProfilingCache.load_cache(from_export, exported_file, 0)

    dropin.install(socket=daemon.socket_path)
    loaded = profiling_cache(autotuner, "stored-gpu", {})
    loaded.load_cache(tmp_path / "never.json", 0)
    for name, cache in (("export", from_export), ("drop-in", loaded)):
        assert {str(key) for key in cache.cache} == expected, name
    assert dump(from_export.cache) == dump(loaded.cache)
    # The natively recorded one: min_time from time_us, in milliseconds.
    assert loaded.cache[("op::s", 1)] == (1, (64, 2), 0.25)
    # The metadata the entries carry, as the loader sets a file's.
    assert (loaded.device_name, loaded.creation_timestamp) == ("stored-gpu", 1718000000.5)
