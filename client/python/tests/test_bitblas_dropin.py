# Owns the tests of the BitBLAS drop-in (tunecache.integrations.bitblas, and its TUNECACHE_BITBLAS=1
# switch) against the real daemon (two, on one Redis, for the cluster) and BitBLAS's own
# OperatorCache and Linear._get_or_create_bitblas_operator in the stand-in of bitblas_standin.py:
# every test runs rank processes (bitblas_rank.py) and compares the bytes their operators were
# built from. Waits are on facts (files a tuner leaves, the daemons' waiter counts), never sleeps.
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bitblas_standin import write_standin
from conftest import running_daemon, wait_cluster_connected

RANK_SCRIPT = Path(__file__).resolve().parent / "bitblas_rank.py"
RANK_TIMEOUT_S = 120
FACT_TIMEOUT_S = 60
TARGET_ARCH = "nvidia/nvidia-h100"
DEVICE = "nvidia/nvidia-h100|bitblas 0.1.0.post1|cuda 12.4"
# The files BitBLAS's _save_operator_config_and_artifact writes for one operator.
SAVED_FILES = {"MatmulConfig.json", "mapping.json", "optimized.py", "source.cu", "tvm_rt_mod.tar",
               "wrapper_compiled.so", "wrapper_source.cu"}


class Ranks:
    """Starts rank processes with the stand-in on PYTHONPATH, HOME (so BitBLAS's own database,
    ~/.cache/bitblas, is ``home/.cache/bitblas``), TMPDIR and the drop-in's directory under
    ``tmp_path``, and the tuners' marks in ``marks``."""

    def __init__(self, tmp_path: Path):
        self.standin = write_standin(tmp_path / "standin")
        self.home = tmp_path / "home"
        self.marks = tmp_path / "marks"
        self.tmp = tmp_path / "tmp"
        for directory in (self.home, self.marks, self.tmp):
            directory.mkdir()
        self.database = self.home / ".cache" / "bitblas"
        self.dropin_dir = tmp_path / "dropin"
        self.processes: list = []

    def environment(self, socket, **overrides) -> dict:
        environment = dict(os.environ)
        environment.update(
            PYTHONPATH=str(self.standin),
            PYTHONDONTWRITEBYTECODE="1",
            HOME=str(self.home),
            TMPDIR=str(self.tmp),
            TUNECACHE_SOCKET=str(socket),
            TUNECACHE_BITBLAS_DIR=str(self.dropin_dir),
            STANDIN_BITBLAS_MARKS=str(self.marks),
        )
        environment.pop("TUNECACHE_BITBLAS", None)
        environment.update({name: str(value) for name, value in overrides.items()})
        return environment

    def start(self, socket, spec, **overrides) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT), json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=self.environment(socket, **overrides),
        )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        """Ends the ranks a failed test left running (a held or hung tuner waits forever)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.communicate()

    @staticmethod
    def finish(process: subprocess.Popen):
        stdout, stderr = process.communicate(timeout=RANK_TIMEOUT_S)
        assert process.returncode == 0, f"rank failed ({process.returncode}):\n{stdout}\n{stderr}"
        return json.loads(stdout.strip().splitlines()[-1]), stderr

    def run(self, socket, spec, **overrides):
        return self.finish(self.start(socket, spec, **overrides))

    def tune_marks(self) -> list:
        return sorted(name for name in os.listdir(self.marks) if name.startswith("tune-"))


@pytest.fixture
def ranks(tmp_path):
    started = Ranks(tmp_path)
    yield started
    started.stop_all()


def wait_for(fact, what: str, processes=()):
    deadline = time.monotonic() + FACT_TIMEOUT_S
    while not fact():
        for process in processes:
            if process.poll() is not None and process.returncode != 0:
                out, err = process.communicate()
                pytest.fail(f"a rank exited with {process.returncode} while waiting for {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def waiters(*daemons) -> int:
    total = 0
    for daemon in daemons:
        with daemon.client() as client:
            total += client.stats().waiters
    return total


def scanned(daemon) -> list:
    with daemon.client() as client:
        return [entry for chunk in client.scan(namespace="bitblas") for entry in chunk]


def warnings_of(log: str) -> list:
    return [line for line in log.splitlines() if line.startswith("WARNING:tunecache")]


def test_seed_scenario_four_writers_then_a_fresh_process_loads_one_of_them(daemon, ranks):
    """The seed report's test, as processes: each adds the same config with its own build,
    saves, clears and loads again; a fresh process then loads one operator, byte for byte one
    writer's, whose libraries dlopen."""
    shared_db = ranks.home / "shared-db"
    writers = [ranks.start(daemon.socket_path, {"mode": "seed", "path": str(shared_db)}) for _ in range(4)]
    results = [ranks.finish(process)[0] for process in writers]
    saved = [result["ops"]["saved"] for result in results]
    assert len({op["build_id"] for op in saved}) == 4, "the writers must build different files"
    for result in results:  # the seed's own check: its reload is not empty
        assert len(result["cache"]) == 1 and result["cache"][0]["loaded_by_dropin"]
    assert not shared_db.exists(), "the database directory was written"

    entries = scanned(daemon)
    assert len(entries) == 1
    (entry,) = entries
    assert (entry.key.op, entry.key.device) == ("MatmulConfig", DEVICE)
    assert {artifact.name for artifact in entry.result.artifacts} == SAVED_FILES
    document = json.loads(entry.result.config)
    assert document["mapping"] == {"config_type": "MatmulConfig", "operator_type": "Matmul"}
    assert json.loads(entry.key.problem) == document["config"]

    fresh, _ = ranks.run(daemon.socket_path, {"mode": "load", "path": str(shared_db), "global": True})
    (loaded,) = fresh["cache"]
    assert loaded["loaded_by_dropin"] and loaded["lib_initialized"] == 1
    winners = [op for op in saved
               if (op["build_id"], op["lib_sha"], op["src_sha"], op["kernel"])
               == (loaded["build_id"], loaded["lib_sha"], loaded["src_sha"], loaded["kernel"])]
    assert len(winners) == 1, "the loaded operator is not exactly one writer's"
    # Laid out as BitBLAS's database: <dir>/<arch>/<hash>/ with their files (and the .tar.so TVM's
    # load_module linked next to the tar), every file the digest the daemon holds.
    layout = Path(loaded["libpath"]).parent
    assert layout.parent.parent.name == "nvidia" and layout.parent.name == "nvidia-h100"
    assert layout.name == document["dir"]
    assert set(loaded["dir_files"]) == SAVED_FILES | {"tvm_rt_mod.tar.so"}
    for artifact in entry.result.artifacts:
        assert loaded["dir_files"][artifact.name] == artifact.sha256
    # Every writer's reload got that same winner or an earlier one; the fresh load is final.
    assert not shared_db.exists()


def test_a_rank_that_only_loaded_sends_nothing_back_and_versions_never_mix(daemon, ranks):
    ranks.run(daemon.socket_path, {"mode": "seed", "path": "unused"})
    with daemon.client() as client:
        before = client.stats()
    again, _ = ranks.run(daemon.socket_path, {"mode": "load", "path": "unused", "save_after": True})
    assert len(again["cache"]) == 1 and again["cache"][0]["loaded_by_dropin"]
    with daemon.client() as client:
        after = client.stats()
    # The loaded operator's source.cu would be regenerated from its module: never sent back.
    assert (after.records, after.entries_stored) == (before.records, before.entries_stored)
    assert not ranks.database.exists()

    for overrides in ({"STANDIN_BITBLAS_VERSION": "0.1.1"}, {"STANDIN_CUDA_VERSION": "12.8.0"}):
        other, _ = ranks.run(daemon.socket_path, {"mode": "load", "path": "unused"}, **overrides)
        assert other["cache"] == [], overrides
    other_gpu, _ = ranks.run(daemon.socket_path, {"mode": "load", "path": "unused", "target": "nvidia/nvidia-a100"})
    assert other_gpu["cache"] == []
    # A Target object's arch string is BitBLAS's "-".join(keys + [arch]); a string is itself.
    ranks.run(daemon.socket_path, {"mode": "seed", "path": "unused", "target": "nvidia/nvidia-a100",
                                   "target_object": True})
    ranks.run(daemon.socket_path, {"mode": "seed", "path": "unused", "target": "cuda -arch=sm_80"})
    devices = sorted(entry.key.device for entry in scanned(daemon))
    assert devices == ["cuda -arch=sm_80|bitblas 0.1.0.post1|cuda 12.4",
                       "cuda-gpu-sm_80|bitblas 0.1.0.post1|cuda 12.4", DEVICE]


def run_linear_ranks(ranks, daemons_and_counts):
    """Starts the ranks (``(daemon, count)`` pairs; every other one switched on by
    TUNECACHE_BITBLAS=1 instead of install()), holds the one tuner until every other rank waits
    in Resolve, then lets it finish; answers the ranks' results."""
    (ranks.marks / "hold").touch()
    processes = []
    for daemon, count in daemons_and_counts:
        for index in range(count):
            if index % 2:
                processes.append(ranks.start(daemon.socket_path, {"mode": "linear", "install": False},
                                             TUNECACHE_BITBLAS=1))
            else:
                processes.append(ranks.start(daemon.socket_path, {"mode": "linear"}))
    daemons = [daemon for daemon, _ in daemons_and_counts]
    wait_for(lambda: len(ranks.tune_marks()) >= 1, "a rank to start tuning", processes)
    wait_for(lambda: waiters(*daemons) == len(processes) - 1, "every other rank to wait", processes)
    (ranks.marks / "release").touch()
    return [ranks.finish(process)[0] for process in processes]


def check_one_tuning(ranks, results):
    assert len(ranks.tune_marks()) == 1, ranks.tune_marks()
    assert sum(result["tunings"] for result in results) == 1
    assert all(result["installed"] for result in results)
    ops = [result["ops"]["linear"] for result in results]
    built_from = {(op["build_id"], op["lib_sha"], op["src_sha"], op["kernel"]) for op in ops}
    assert len(built_from) == 1, built_from
    assert "tuned" in ops[0]["build_id"]
    assert sorted(op["loaded_by_dropin"] for op in ops) == [False] + [True] * (len(ops) - 1)
    assert all(op["lib_initialized"] == 1 for op in ops)
    # Each process loaded from its own copy (TVM's load_module unpacks next to the tar), fetched
    # from the daemon (verified), the same files in every process.
    assert len({op["libpath"] for op in ops}) == len(ops)
    waiters = [op for op in ops if op["loaded_by_dropin"]]
    digests = [{name: digest for name, digest in op["dir_files"].items() if name in SAVED_FILES} for op in waiters]
    assert all(sorted(files) == sorted(SAVED_FILES) and files == digests[0] for files in digests)
    # The drop-in keeps no copy of its own on the node (the daemon's store is the one): once the
    # ranks have exited, nothing of it is left.
    assert os.listdir(ranks.dropin_dir) == []
    assert not ranks.database.exists(), "BitBLAS's database directory was written"


def test_eight_ranks_tune_once_and_hold_the_same_bytes(daemon, ranks):
    results = run_linear_ranks(ranks, [(daemon, 8)])
    check_one_tuning(ranks, results)
    (entry,) = scanned(daemon)
    tuner = next(result for result in results if result["tunings"])
    assert f"pid {tuner['pid']} " in entry.result.tuned_by
    with daemon.client() as client:
        stats = client.stats()
    # Only the tuner's Record, under its lease: the waiters' saves sent nothing.
    assert (stats.records, stats.entries_stored) == (1, 1)


def test_two_nodes_on_one_redis_tune_once_in_the_cluster(socket_dir, redis_url, ranks):
    import contextlib

    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(running_daemon(socket_dir / name, ["--node-name", name, "--tuner", "off",
                                                                  "--cluster-url", redis_url]))
            for name in ("a", "b")
        ]
        for node in nodes:
            wait_cluster_connected(node)
        results = run_linear_ranks(ranks, [(nodes[0], 4), (nodes[1], 4)])
        check_one_tuning(ranks, results)


def test_a_tuner_killed_mid_tune_passes_the_lease_to_exactly_one_other_rank(daemon, ranks):
    (ranks.marks / "hang-once").touch()
    processes = [ranks.start(daemon.socket_path, {"mode": "linear"}) for _ in range(4)]
    hung = lambda: [name for name in os.listdir(ranks.marks) if name.startswith("hung-")]  # noqa: E731
    wait_for(lambda: len(hung()) == 1, "a tuner to hang", processes)
    wait_for(lambda: waiters(daemon) == 3, "the other ranks to wait", processes)
    victim_pid = int(hung()[0].split("-")[1])
    victim = next(process for process in processes if process.pid == victim_pid)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=RANK_TIMEOUT_S)
    survivors = [ranks.finish(process)[0] for process in processes if process is not victim]
    marks = ranks.tune_marks()
    assert len(marks) == 2 and sum(1 for name in marks if name.startswith(f"tune-{victim_pid}-")) == 1, marks
    assert sum(result["tunings"] for result in survivors) == 1
    ops = [result["ops"]["linear"] for result in survivors]
    assert len({(op["build_id"], op["lib_sha"], op["kernel"]) for op in ops}) == 1
    with daemon.client() as client:
        assert client.stats().leases_released_dead == 1


def test_a_rank_whose_wait_ends_tunes_itself_and_saves_its_operator(daemon, ranks):
    (ranks.marks / "hold").touch()
    holder = ranks.start(daemon.socket_path, {"mode": "linear"})
    wait_for(lambda: len(ranks.tune_marks()) == 1, "the lease holder to tune", [holder])
    impatient = ranks.start(daemon.socket_path, {"mode": "linear"}, TUNECACHE_BITBLAS_WAIT_MS=50)
    wait_for(lambda: len(ranks.tune_marks()) == 2, "the impatient rank to tune itself", [holder, impatient])
    (ranks.marks / "release").touch()
    (held, _), (own, log) = ranks.finish(holder), ranks.finish(impatient)
    assert held["tunings"] == own["tunings"] == 1
    assert not own["ops"]["linear"]["loaded_by_dropin"]
    assert any("within the wait" in line for line in warnings_of(log)), log
    with daemon.client() as client:
        stats = client.stats()
    # Both results were Recorded (its save sent the operator it tuned); the merge rule keeps one.
    assert stats.records == 2 and len(scanned(daemon)) == 1
    assert not ranks.database.exists()


def test_replay_keeps_the_default_schedule_on_a_miss_and_loads_a_hit(daemon, ranks):
    """TUNECACHE_MODE=replay: while another rank holds the lease (a tuning rank would wait), a
    miss neither waits nor tunes: the operator keeps BitBLAS's default schedule, and nothing is
    sent back. Once the result is recorded, replay loads it."""
    (ranks.marks / "hold").touch()
    holder = ranks.start(daemon.socket_path, {"mode": "linear"})
    wait_for(lambda: len(ranks.tune_marks()) == 1, "the lease holder to tune", [holder])
    with daemon.client() as client:
        before = client.stats()
    missed, log = ranks.run(daemon.socket_path, {"mode": "linear"}, TUNECACHE_MODE="replay",
                            TUNECACHE_BITBLAS_WAIT_MS=600_000)
    assert holder.poll() is None  # still tuning, held: the replayed rank never waited for it
    op = missed["ops"]["linear"]
    assert (missed["tunings"], op["loaded_by_dropin"]) == (0, False)
    assert op["build_id"].startswith("default "), op["build_id"]
    assert len(ranks.tune_marks()) == 1
    assert sum("tunecache replay: no cached result for bitblas/MatmulConfig" in line for line in log.splitlines()) == 1
    assert [line for line in warnings_of(log) if "tunecache replay" not in line] == [], log
    with daemon.client() as client:
        after = client.stats()
    assert (after.leases_granted, after.records) == (before.leases_granted, before.records)
    assert not ranks.database.exists()

    (ranks.marks / "release").touch()
    ranks.finish(holder)
    hit, _ = ranks.run(daemon.socket_path, {"mode": "linear"}, TUNECACHE_MODE="replay")
    op = hit["ops"]["linear"]
    assert (hit["tunings"], op["loaded_by_dropin"]) == (0, True)
    assert "tuned" in op["build_id"]


def test_a_directory_another_user_could_write_is_refused_and_bitblas_runs_as_stock(daemon, ranks, tmp_path):
    ranks.run(daemon.socket_path, {"mode": "seed", "path": "unused"})
    planted = tmp_path / "planted"
    planted.mkdir()
    planted.chmod(0o777)
    loaded, log = ranks.run(daemon.socket_path, {"mode": "load", "path": str(ranks.database)},
                            TUNECACHE_BITBLAS_DIR=planted)
    assert loaded["cache"] == []  # stock: nothing in their (empty) database directory
    (warning,) = warnings_of(log)
    assert "of this user's alone" in warning
    assert os.listdir(planted) == []


def test_an_operator_their_loader_cannot_build_is_neither_coordinated_nor_recorded(daemon, ranks):
    # Recorded, it would make every later load_from_database raise (getattr(bitblas, ...)).
    for _ in range(2):
        result, _ = ranks.run(daemon.socket_path, {"mode": "ladder", "path": "unused"})
        assert result["tunings"] == 1
    assert len(ranks.tune_marks()) == 2
    assert scanned(daemon) == []
    with daemon.client() as client:
        assert client.stats().resolves == 0
    loaded, _ = ranks.run(daemon.socket_path, {"mode": "load", "path": "unused"})
    assert loaded["cache"] == []


def test_without_a_daemon_bitblas_runs_as_stock_with_one_warning(ranks, tmp_path):
    missing = tmp_path / "no-daemon.sock"
    first, log = ranks.run(missing, {"mode": "linear"})
    assert first["installed"] and first["tunings"] == 1
    (warning,) = warnings_of(log)
    assert "BitBLAS uses its own database directory" in warning
    # Their save wrote their database: <~/.cache/bitblas>/<arch>/<hash>/ with their files.
    (saved,) = list((ranks.database / "nvidia" / "nvidia-h100").iterdir())
    assert {path.name for path in saved.iterdir()} == SAVED_FILES
    # The next process loads it from there, as stock, and tunes nothing.
    second, log = ranks.run(missing, {"mode": "linear"}, TUNECACHE_BITBLAS=1)
    assert second["installed"] and second["tunings"] == 0
    assert second["ops"]["linear"]["build_id"] == first["ops"]["linear"]["build_id"]
    assert len(warnings_of(log)) == 1
    # Without the variable nor install() nothing is patched.
    plain, _ = ranks.run(missing, {"mode": "load", "path": str(ranks.database), "install": False})
    assert not plain["installed"] and len(plain["cache"]) == 1
