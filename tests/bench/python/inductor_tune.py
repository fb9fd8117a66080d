# Owns the PyTorch Inductor max-autotune benchmark (issue 58): RANKS rank processes, released
# together by a barrier, each compile the same SHAPES frozen torch.nn.Linears with
# torch.compile(mode="max-autotune") on the CPU (Inductor benchmarks its C++ GEMM template against
# ATen's through PersistentCache.lookup), side by side in one run:
#   alone              stock, one rank, no daemon: the floor of compiling alone;
#   stock              stock, every rank on one shared TORCHINDUCTOR_CACHE_DIR (the default
#                      per-user directory of a node); afterwards, how many of the shapes' timing
#                      groups its cache/<system hash> file kept;
#   stock-distributed  stock with TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM=1 in a
#                      torch.distributed process group on the CPU (gloo, a FileStore rendezvous;
#                      the ranks are inductor_distributed_rank.py, which counts the GEMMs Inductor
#                      offered to the group); recorded as not run, with what Inductor did, when
#                      it fails or hands no GEMM to another rank;
#   dropin-cold        the drop-in (install()) on a fresh tunecached;
#   dropin-warm        the same daemon, fresh ranks on a fresh copy of the directory.
# Every mode starts from its own copy of one Inductor cache directory whose C++ kernels for the
# shapes one stock rank built beforehand, its cache/ (the GEMM timings) removed: a mode measures
# benchmarks and compiles, not g++ building the kernels. The ranks are client/python/tests/
# inductor_rank.py, the drop-in tests' rank. Per mode and run: the wall time from the barrier
# until the last rank's compiles ended, the benchmark rounds run over all ranks, and per shape
# whether every rank got the same winner. Prints one JSON object on stdout and a Markdown table
# on stderr; `tunecache-bench inductor` runs it and keeps that object, with the machine and the
# goals, in inductor.json.
#
# Run (with the Python of client/python/run_tests.sh's venv, torch 2.15.0 installed):
#   client/python/.venv/bin/python tests/bench/python/inductor_tune.py [--ranks 8]
#       [--shapes '[[64,32,8],...]'] [--runs 1] [--numpy-dir DIR] [--bin-dir DIR]
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "client" / "python" / "tests"))
from dropin_bench import start_daemon, take_down  # noqa: E402

RANK_SCRIPT = REPO_ROOT / "client" / "python" / "tests" / "inductor_rank.py"
DISTRIBUTED_RANK = Path(__file__).with_name("inductor_distributed_rank.py")
DEFAULT_SHAPES = [[64, 32, 8], [96, 48, 8], [128, 64, 8], [160, 80, 8], [192, 96, 8], [224, 112, 8]]
MODES = ("alone", "stock", "stock-distributed", "dropin-cold", "dropin-warm")
RANK_TIMEOUT_S = 1800


def reports_of(out: str) -> dict:
    """The rank's JSON lines of stdout merged (inductor_rank.py's report, and the distributed
    wrapper's counts after it)."""
    merged: dict = {}
    for line in out.strip().splitlines()[-2:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            merged.update(value)
    return merged


def error_of(log: str) -> str:
    """The last `...Error: ...` line of a rank's stderr, without torch.distributed's rank prefix."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line).strip() for line in log.splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return errors[-1] if errors else (lines[-1] if lines else "no output")


def release(mode: str, commands: list, environment: dict, logs: Path) -> dict:
    """Starts a rank per command, holds them at the barrier (each says `ready` once torch is
    imported), releases them at once and waits for all. Answers the release time, each rank's
    report (merged JSON lines) and the failures (rank index, exit status, error line)."""
    logs.mkdir(parents=True, exist_ok=True)
    processes = []
    for index, command in enumerate(commands):
        with open(logs / f"{mode}-{index}.log", "w") as log:
            processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                              text=True, env=environment))
    failures = []
    for index, process in enumerate(processes):
        line = process.stdout.readline()
        if line.strip() != "ready":
            failures.append(index)
    if failures:  # a rank that never got ready: the rest would wait at a rendezvous forever
        for process in processes:
            process.kill()
    released = time.time()
    for process in processes:
        try:
            process.stdin.close()
        except OSError:  # a rank killed above
            pass
        process.stdin = None  # communicate() below must not flush it
    reports, failed = [], []
    for index, process in enumerate(processes):
        out, _ = process.communicate(timeout=RANK_TIMEOUT_S)
        report = reports_of(out)
        report["exited"] = time.time()
        if process.returncode != 0 or "rounds" not in report or index in failures:
            log = (logs / f"{mode}-{index}.log").read_text(errors="replace")
            failed.append({"rank": index, "status": process.returncode, "error": error_of(log)})
        reports.append(report)
    return {"released": released, "reports": reports, "failed": failed}


def kept_groups(cache_dir: Path) -> int:
    """Timing groups (op, inputs) held by the cache/<system hash> files of `cache_dir`."""
    groups = 0
    directory = cache_dir / "cache"
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        try:
            cache = json.loads(path.read_text())["cache"]
        except (OSError, ValueError, KeyError):
            continue
        groups += sum(len(by_inputs) for by_inputs in cache.values())
    return groups


def summary(mode: str, run: int, ranks: int, shapes: int, ran: dict, cache_dir: Path) -> dict:
    reports = [report for report in ran["reports"] if "rounds" in report]
    winners: dict = {}
    for report in reports:
        for lookup in report["lookups"]:
            if lookup["best"] is not None:
                winners.setdefault(f"{lookup['op']} {lookup['inputs']}", set()).add(lookup["best"])
    result = {
        "mode": mode,
        "run": run,
        "ranks": ranks,
        "shapes": shapes,
        "ranks_done": ranks - len(ran["failed"]),
        "rounds": sum(report["rounds"] for report in reports),
        "shapes_tuned": len(winners),
        "shapes_agreeing": sum(1 for found in winners.values() if len(found) == 1),
        "kept_groups": kept_groups(cache_dir),
        "failed": ran["failed"],
        "ran": not ran["failed"],
    }
    if reports and not ran["failed"]:
        result["wall_s"] = max(report["ended"] for report in reports) - ran["released"]
        result["rank_s_median"] = statistics.median(report["seconds"] for report in reports)
        result["ranks_agreeing"] = len(winners) == shapes and result["shapes_agreeing"] == shapes
        result["dropin"] = all(report["dropin"] for report in reports)
    else:
        result["wall_s"] = max(report["exited"] for report in ran["reports"]) - ran["released"]
    return result


def distributed_verdict(result: dict, ran: dict) -> None:
    """Whether Inductor's distributed autotune did what the mode is for (handed GEMMs to other
    ranks), from what the ranks counted; if not, the mode is recorded as not run, with why."""
    counts = [report["distributed"] for report in ran["reports"] if "distributed" in report]
    calls = sum(count["calls"] for count in counts)
    remote = sum(count["remote"] for count in counts)
    result["distributed"] = {"calls": calls, "remote": remote, "ranks_counted": len(counts),
                             "backend": counts[0]["backend"] if counts else None}
    if ran["failed"]:
        errors = sorted({failure["error"] for failure in ran["failed"]})
        result["ran"] = False
        result["reason"] = (f"Inductor failed on {len(ran['failed'])} of {result['ranks']} ranks: "
                            f"`{'`; `'.join(errors)}`; maybe_autotune_remote (where Inductor hands a GEMM to "
                            f"the group) had been called {calls} times, {remote} GEMMs handed to another rank")
    elif remote == 0:
        result["ran"] = False
        result["reason"] = (f"it ran ({counts[0]['backend'] if counts else '?'}, {result['ranks']} ranks, "
                            f"{result['wall_s']:.1f} s) but distributed nothing: Inductor called "
                            f"maybe_autotune_remote {calls} times over {result['ranks']} ranks x {result['shapes']} "
                            f"shapes and handed no GEMM to another rank; the ranks ran {result['rounds']} "
                            f"benchmark rounds themselves, as stock does")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--shapes", default=json.dumps(DEFAULT_SHAPES),
                        help="JSON: [[in_features, out_features, batch], ...]")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES), help="a comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--numpy-dir", help="a directory holding numpy, put on PYTHONPATH for stock-distributed "
                                            "(torch.distributed's all_gather_object needs it)")
    parser.add_argument("--bin-dir", help="where tunecached is [default: target/release, then debug]")
    args = parser.parse_args()
    shapes = json.loads(args.shapes)
    modes = [mode for mode in MODES if mode in args.modes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="inductor-bench-", dir="/tmp"))
    daemon: Optional[subprocess.Popen] = None
    try:
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
        environment["TUNECACHE_VIEW"] = ""
        spec = {"shapes": shapes, "barrier": True, "dropin": "none"}
        rank = [sys.executable, str(RANK_SCRIPT)]

        # The C++ kernels of the shapes, built once by one stock rank; its GEMM timings dropped.
        warm = work / "warm"
        started = time.monotonic()
        built = subprocess.run(rank + [json.dumps(dict(spec, barrier=False))], capture_output=True, text=True,
                               env=dict(environment, TORCHINDUCTOR_CACHE_DIR=str(warm)), timeout=RANK_TIMEOUT_S)
        if built.returncode != 0:
            raise SystemExit(f"the warm-up rank failed: {built.stderr[-4000:]}")
        warm_s = time.monotonic() - started
        shutil.rmtree(warm / "cache", ignore_errors=True)

        results = []
        for run in range(args.runs):
            socket = str(work / f"run-{run}.sock")
            for mode in modes:
                cache_dir = work / f"run-{run}" / mode
                shutil.copytree(warm, cache_dir)
                env = dict(environment, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
                ranks = 1 if mode == "alone" else args.ranks
                commands = [rank + [json.dumps(spec)]] * ranks
                if mode == "stock-distributed":
                    env["TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM"] = "1"
                    if args.numpy_dir:
                        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.numpy_dir, env.get("PYTHONPATH")]))
                    store = work / f"run-{run}" / "store"
                    commands = [[sys.executable, str(DISTRIBUTED_RANK), str(index), str(ranks), str(store),
                                 json.dumps(spec)] for index in range(ranks)]
                elif mode.startswith("dropin"):
                    if mode == "dropin-cold":  # a fresh daemon each run: cold for every shape
                        take_down(None, work, daemon)
                        daemon = None
                        daemon_dir = work / f"daemon-{run}"
                        daemon_dir.mkdir()
                        daemon = start_daemon(args.bin_dir, daemon_dir, socket)
                    env["TUNECACHE_SOCKET"] = socket
                    commands = [rank + [json.dumps(dict(spec, dropin="install"))]] * ranks
                ran = release(mode, commands, env, work / f"run-{run}" / "logs")
                result = summary(mode, run, ranks, len(shapes), ran, cache_dir)
                if mode == "stock-distributed":
                    distributed_verdict(result, ran)
                elif not result["ran"]:
                    raise SystemExit(f"{mode}: ranks failed: {result['failed']}")
                results.append(result)
                shutil.rmtree(cache_dir, ignore_errors=True)
                print(f"{mode}: {result['wall_s']:.2f} s, {result['rounds']} rounds, "
                      f"{result['shapes_agreeing']}/{len(shapes)} shapes agreed, kept {result['kept_groups']} groups"
                      + ("" if result["ran"] else f"; not run: {result['reason']}"), file=sys.stderr)
            take_down(None, work, daemon)
            daemon = None
        report = {"ranks": args.ranks, "shapes": shapes, "warm_up_s": warm_s, "results": results}
        print(json.dumps(report, indent=2))
        print("| mode | runs | wall: median (range) | rank, median | rounds | shapes agreeing | groups kept |",
              file=sys.stderr)
        print("|---|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
        for mode in modes:
            runs = [result for result in results if result["mode"] == mode]
            walls = [result["wall_s"] for result in runs]
            print(f"| {mode} | {len(runs)} | {statistics.median(walls):.2f} s ({min(walls):.2f} to {max(walls):.2f}) | "
                  f"{statistics.median(result.get('rank_s_median', float('nan')) for result in runs):.2f} s | "
                  f"{statistics.median(result['rounds'] for result in runs):.0f} | "
                  f"{min(result['shapes_agreeing'] for result in runs)}/{len(shapes)} | "
                  f"{statistics.median(result['kept_groups'] for result in runs):.0f} |", file=sys.stderr)
    finally:
        take_down(None, work, daemon)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
