# Owns the BitBLAS load benchmark (issue 37): RANKS rank processes loading a BitBLAS operator
# database of OPS operators (each padded to FILE_MIB MiB of files: wrapper_compiled.so carries the
# padding, which dlopen ignores) at once, side by side in one run:
#   dropin        through tunecache.integrations.bitblas on a node that holds none of the files:
#                 each rank Scans the daemon, the ranks fetch the files (verified) into the node's
#                 store between them, each rank links them into a directory of its own, and
#                 BitBLAS's loader runs there;
#   dropin-warm   the same again, the node's store holding the files the run before fetched;
#   local         stock BitBLAS, every rank loading the one database directory on the local disk
#                 (ranks meet each other's TVM unpacking there, and some runtime modules fail to
#                 load: see with_rt_mod);
#   local-copies  stock BitBLAS, each rank loading its own copy of it (hard links made before the
#                 barrier): stock's cost of a load in which every runtime module loads;
#   slowfs-Nms    stock BitBLAS loading it from a slowfs mount adding N ms per operation (a slow
#                 shared filesystem; needs /dev/fuse and target/*/slowfs; skipped without them).
# BitBLAS is the stand-in of client/python/tests/bitblas_standin.py (their own cache code, real
# builds; see docs/bitblas.md): the database is built with their own save, then Recorded into the
# daemon as the drop-in Records it. Each mode: the barrier (every rank imported and ready, then
# released at once), per-rank load seconds, the wall time until the last rank is done, and how
# many operators each rank got with their runtime module and library, and the bytes the daemon
# served (Stats). Prints one JSON object (and a table on stderr); `tunecache-bench bitblas` runs
# it and keeps that object, with the machine, in bitblas.json.
#
# Run (with a Python where the tunecache wheel is installed, e.g. client/python/run_tests.sh's venv):
#   VENV/bin/python tests/bench/python/bitblas_load.py [--ops 100] [--file-mib 2] [--ranks 8]
#       [--slowfs-ms 5] [--runs 1]
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "client" / "python" / "tests"))
from bitblas_standin import write_standin  # noqa: E402
from dropin_bench import mount_slowfs, release_ranks, start_daemon, take_down  # noqa: E402

RANK_SCRIPT = Path(__file__).resolve().parent / "bitblas_load_rank.py"
TARGET = "nvidia/nvidia-h100"


BUILD_DATABASE = r"""
import os, sys
import bitblas
from bitblas.cache import global_operator_cache
database, count, pad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for index in range(count):
    config = bitblas.MatmulConfig(M=1, N=16 * (index + 1), K=1024, A_dtype="float16", out_dtype="float16",
                                  accum_dtype="float16", layout="nt")
    global_operator_cache.add(config, bitblas.Matmul(config, target=sys.argv[4], enable_tuning=False))
global_operator_cache.save_into_database(database, sys.argv[4])
for root, _, files in os.walk(database):
    for name in files:
        if name == "wrapper_compiled.so":
            path = os.path.join(root, name)
            missing = pad - sum(os.path.getsize(os.path.join(root, f)) for f in files)
            if missing > 0:
                with open(path, "ab") as f:
                    f.write(os.urandom(missing))
"""

# Records every operator directory of the database as the drop-in's save Records it (the key,
# Result.config and artifacts of tunecache.integrations.bitblas), without building anything again.
SEED_DAEMON = r"""
import json, os, sys, time
import bitblas
import tunecache
import tunecache.integrations.bitblas as tb
database, target, socket = sys.argv[1], sys.argv[2], sys.argv[3]
arch_path = os.path.join(database, target)
client = tunecache.Client(socket, timeout=120)
entries = []
for hash_dir in sorted(os.listdir(arch_path)):
    path = os.path.join(arch_path, hash_dir)
    mapping = json.load(open(os.path.join(path, "mapping.json")))
    config_json = json.load(open(os.path.join(path, mapping["config_type"] + ".json")))
    config = getattr(bitblas, mapping["config_type"])(**config_json)
    files = [(name, os.path.join(path, name)) for name in sorted(os.listdir(path))
             if os.path.isfile(os.path.join(path, name)) and not name.endswith(".tar.so")]
    key = tb._key(config, target)
    document = {"mapping": mapping, "config": config_json, "dir": hash_dir}
    result = tunecache.Result(config=json.dumps(document, sort_keys=True, separators=(",", ":")),
                              time_us=tb.FIXED_TIME_US, tuned_by="bitblas_load.py",
                              tuned_at_unix_ms=int(time.time() * 1000), artifacts=client.put_artifacts(files))
    entries.append(tunecache.Entry(key=key, result=result))
print(client.record(entries).stored)
"""


def served_bytes(python: str, socket: str) -> int:
    """The daemon's artifact_bytes_served (Stats): what the drop-in's ranks fetched."""
    probe = "import sys, tunecache; print(tunecache.Client(sys.argv[1], timeout=10).stats().artifact_bytes_served)"
    return int(subprocess.run([python, "-c", probe, socket], capture_output=True, text=True, check=True).stdout)


def run_mode(python: str, environment: dict, mode: str, paths: list) -> dict:
    ranks = len(paths)
    released, reports = release_ranks(mode, [[python, str(RANK_SCRIPT), mode, path, TARGET] for path in paths],
                                      environment, timeout_s=600)
    loads = [report["load_s"] for report in reports]
    return {
        "mode": mode,
        "ranks": ranks,
        "wall_s": max(report["ended"] for report in reports) - released,
        "load_s_median": statistics.median(loads),
        "load_s_max": max(loads),
        "ops_min": min(report["ops"] for report in reports),
        "with_rt_mod_min": min(report["with_rt_mod"] for report in reports),
        "with_rt_mod_total": sum(report["with_rt_mod"] for report in reports),
        "with_lib_min": min(report["with_lib"] for report in reports),
        "ranks_failed": sum(1 for report in reports if report["error"]),
        "errors": sorted({report["error"] for report in reports if report["error"]}),
    }


def clean_stock_leftovers(database: Path) -> None:
    """TVM's load_module leaves tvm_rt_mod.tar.so (and, after a collision, tvm_rt_mod/) next to
    the tar: removed between runs, so each stock run starts from what their save wrote."""
    for root, dirs, files in os.walk(database):
        for name in files:
            if name.endswith(".tar.so"):
                os.unlink(os.path.join(root, name))
        for name in list(dirs):
            if name == "tvm_rt_mod":
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                dirs.remove(name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--file-mib", type=float, default=2.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--slowfs-ms", type=int, default=5, help="0: no slowfs run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--bin-dir", help="where tunecached and slowfs are [default: target/release, then debug]")
    args = parser.parse_args()
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="bb-load-", dir="/tmp"))
    daemon = None
    slowfs_pid = None
    mountpoint = work / "slow" / "mnt"
    try:
        standin = write_standin(work / "standin")
        environment = {k: v for k, v in os.environ.items() if k not in ("TUNECACHE_BITBLAS",)}
        environment.update(PYTHONPATH=str(standin), PYTHONDONTWRITEBYTECODE="1", HOME=str(work / "home"),
                           TMPDIR=str(work / "tmp"), TUNECACHE_VIEW="", TUNECACHE_BITBLAS_DIR=str(work / "dropin"))
        (work / "tmp").mkdir()
        socket = str(work / "s.sock")
        environment["TUNECACHE_SOCKET"] = socket
        database = work / "db"
        started = time.monotonic()
        subprocess.run([python, "-c", BUILD_DATABASE, str(database), str(args.ops),
                        str(int(args.file_mib * 1024 * 1024)), TARGET], check=True, env=environment)
        print(f"database: {args.ops} operators built in {time.monotonic() - started:.1f} s", file=sys.stderr)
        clean_stock_leftovers(database)

        daemon = start_daemon(args.bin_dir, work, socket)
        seeded = subprocess.run([python, "-c", SEED_DAEMON, str(database), TARGET, socket], check=True,
                                env=environment, stdout=subprocess.PIPE, text=True)
        print(f"daemon: {seeded.stdout.strip()} entries recorded", file=sys.stderr)  # stdout is the report's

        paths = {"dropin": "unused", "dropin-warm": "unused", "local": str(database),
                 "local-copies": str(work / "copies")}
        if args.slowfs_ms:
            backing = work / "slow" / "backing"
            shutil.copytree(database, backing)
            slowfs_pid = mount_slowfs(args.bin_dir, work, backing, mountpoint, args.slowfs_ms)
            if slowfs_pid is not None:
                paths[f"slowfs-{args.slowfs_ms}ms"] = str(mountpoint)

        results = []
        for run in range(args.runs):
            for mode, path in paths.items():
                if mode == "local-copies":
                    # Each rank its own copy (hard links, made before the barrier): no rank meets
                    # another's unpacking, so every runtime module loads; stock's cost of a
                    # correct load.
                    shutil.rmtree(path, ignore_errors=True)
                    rank_paths = [os.path.join(path, str(rank)) for rank in range(args.ranks)]
                    for rank_path in rank_paths:
                        shutil.copytree(database, rank_path, copy_function=os.link)
                else:
                    if mode == "dropin":  # a node that holds none of the files yet
                        shutil.rmtree(environment["TUNECACHE_BITBLAS_DIR"], ignore_errors=True)
                    elif mode != "dropin-warm":  # dropin-warm: the files the run before put in the node's store
                        clean_stock_leftovers(Path(path))
                    rank_paths = [path] * args.ranks
                rank_mode = "dropin" if mode.startswith("dropin") else "stock"
                served_before = served_bytes(python, socket)
                result = run_mode(python, environment, rank_mode, rank_paths)
                result["daemon_bytes_served"] = served_bytes(python, socket) - served_before
                result.update(mode=mode, run=run)
                results.append(result)
        report = {"ops": args.ops, "file_mib": args.file_mib, "ranks": args.ranks, "results": results}
        print(json.dumps(report, indent=2))
        print(f"{'mode':<14}{'wall s':>9}{'load s med':>12}{'load s max':>12}{'rt_mod ok (min/rank)':>22}{'ranks failed':>14}",
              file=sys.stderr)
        for result in results:
            print(f"{result['mode']:<14}{result['wall_s']:>9.2f}{result['load_s_median']:>12.2f}"
                  f"{result['load_s_max']:>12.2f}{result['with_rt_mod_min']:>18}/{args.ops}"
                  f"{result['ranks_failed']:>14}", file=sys.stderr)
    finally:
        take_down(slowfs_pid, mountpoint, daemon)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
