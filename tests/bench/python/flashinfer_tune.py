# Owns the FlashInfer autotune_v2 benchmark (issue 57): RANKS rank processes, released together by
# a barrier, each run FlashInfer's autotune_v2() over the same KEYS keys (one op, one runner, KEYS
# shapes), where the stand-in profile of a key takes PROFILE_MS, side by side in one run:
#   one-rank      stock, a single rank on a local directory: the floor of profiling alone;
#   stock-local   stock, every rank on one local directory (each rank profiles every key);
#   stock-warm    stock again on that directory, now full: stock's warm start on a local disk;
#   slowfs-Nms    stock on a slowfs mount adding N ms per operation (a slow shared filesystem;
#                 needs /dev/fuse and target/*/slowfs; skipped without them);
#   dropin-cold   TUNECACHE_FLASHINFER=1 on an empty daemon (each key profiled once on the node);
#   dropin-warm   the same ranks again, the daemon holding every key.
# FlashInfer is its own code (autotune_cache.py, autotuner/ from the 0.7.2.post1 wheel, extracted
# by client/python/run_tests.sh) with tunecache's stand-ins (client/python/tests/
# flashinfer_standin.py); the ranks are client/python/tests/flashinfer_rank.py. Per mode: the wall
# time from the barrier until the last rank is done, and the profiles run over all ranks. Prints
# one JSON object on stdout and a Markdown table on stderr; `tunecache-bench flashinfer` runs it and
# keeps that object, with the machine and the goals, in flashinfer.json.
#
# Run (with the Python of client/python/run_tests.sh's venv, after run_tests.sh --prepare):
#   client/python/.venv/bin/python tests/bench/python/flashinfer_tune.py [--ranks 8] [--keys 200]
#       [--profile-ms 50] [--slowfs-ms 5] [--runs 1] [--bin-dir DIR]
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
from flashinfer_standin import their_source, write_standin  # noqa: E402
from dropin_bench import mount_slowfs, release_ranks, start_daemon, take_down  # noqa: E402

RANK_SCRIPT = REPO_ROOT / "client" / "python" / "tests" / "flashinfer_rank.py"
DEFAULT_SOURCE = REPO_ROOT / "target" / "flashinfer-0.7.2.post1"


def run_mode(environment: dict, mode: str, ranks: int, spec: dict) -> dict:
    released, reports = release_ranks(mode, [[sys.executable, str(RANK_SCRIPT), json.dumps(spec)]] * ranks,
                                      environment, timeout_s=1800)
    tactics = {json.dumps(report["chosen"], sort_keys=True) for report in reports}
    return {
        "mode": mode,
        "ranks": ranks,
        "wall_s": max(report["ended"] for report in reports) - released,
        "rank_s_median": statistics.median(report["wall_s"] for report in reports),
        "profiles": sum(len(report["profiles"]) for report in reports),
        "ranks_agreeing": len(tactics) == 1,
        "daemon_store": all(report["daemon_store"] for report in reports),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--profile-ms", type=float, default=50.0)
    parser.add_argument("--slowfs-ms", type=int, default=5, help="0: no slowfs run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--bin-dir", help="where tunecached and slowfs are [default: target/release, then debug]")
    args = parser.parse_args()
    source = their_source() or (DEFAULT_SOURCE if (DEFAULT_SOURCE / "flashinfer").is_dir() else None)
    if source is None:
        raise SystemExit("FlashInfer's code is not extracted: run client/python/run_tests.sh --prepare")
    work = Path(tempfile.mkdtemp(prefix="fi-bench-", dir="/tmp"))
    daemon = None
    slowfs_pid = None
    mountpoint = work / "slow" / "mnt"
    try:
        standin = write_standin(work / "standin", source)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
        socket = str(work / "s.sock")
        environment.update(PYTHONPATH=str(standin), TUNECACHE_VIEW="", TUNECACHE_SOCKET=socket,
                           TUNECACHE_FLASHINFER_WAIT_MS="600000")
        spec = dict(ops=[{"name": "gemm", "runners": ["Gemm"]}], shapes=list(range(1, args.keys + 1)),
                    profile_ms=args.profile_ms, barrier=True, dropin="none")
        daemon = start_daemon(args.bin_dir, work, socket)
        roots = {"one-rank": None, "stock-local": None, "stock-warm": None}
        if args.slowfs_ms:
            backing = work / "slow" / "backing"
            backing.mkdir(parents=True)
            slowfs_pid = mount_slowfs(args.bin_dir, work, backing, mountpoint, args.slowfs_ms)
            if slowfs_pid is not None:
                roots[f"slowfs-{args.slowfs_ms}ms"] = None
        roots.update({"dropin-cold": None, "dropin-warm": None})

        results = []
        for run in range(args.runs):
            for mode in roots:
                local = work / f"local-{run}"
                if mode == "one-rank":
                    result = run_mode(environment, mode, 1, dict(spec, root=str(work / f"alone-{run}")))
                elif mode in ("stock-local", "stock-warm"):  # stock-warm: the directory stock-local filled
                    result = run_mode(environment, mode, args.ranks, dict(spec, root=str(local)))
                elif mode.startswith("slowfs"):
                    result = run_mode(environment, mode, args.ranks, dict(spec, root=str(mountpoint / str(run))))
                else:
                    # Each run its own environment (GPU name, so env hash): cold for the daemon.
                    dropin_env = dict(environment, TUNECACHE_FLASHINFER="1", STANDIN_GPU=f"bench GPU {run}")
                    result = run_mode(dropin_env, mode, args.ranks, dict(spec, root=str(work / "dropin-root")))
                result["run"] = run
                results.append(result)
                print(f"{mode}: {result['wall_s']:.2f} s, {result['profiles']} profiles", file=sys.stderr)
        report = {"ranks": args.ranks, "keys": args.keys, "profile_ms": args.profile_ms, "results": results}
        print(json.dumps(report, indent=2))
        print("| mode | runs | wall: median (range) | rank, median | profiles run | ranks agree |", file=sys.stderr)
        print("|---|---:|---:|---:|---:|---|", file=sys.stderr)
        for mode in roots:
            runs = [result for result in results if result["mode"] == mode]
            walls = [result["wall_s"] for result in runs]
            print(f"| {mode} | {len(runs)} | {statistics.median(walls):.2f} s ({min(walls):.2f} to {max(walls):.2f}) | "
                  f"{statistics.median(result['rank_s_median'] for result in runs):.2f} s | "
                  f"{statistics.median(result['profiles'] for result in runs):.0f} | "
                  f"{'yes' if all(result['ranks_agreeing'] for result in runs) else 'no'} |", file=sys.stderr)
    finally:
        take_down(slowfs_pid, mountpoint, daemon)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
