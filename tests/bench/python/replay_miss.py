#!/usr/bin/env python3
# Owns the measure of issue 52's "a replayed miss is answered in under 1 ms": one Python process,
# the package's client in replay against a real daemon (dropin_bench.start_daemon), timing each
# call of a replayed begin_tune (the drop-ins' base path) on keys the daemon does not hold, one
# key held under another client's lease (where a tuning caller would wait), and hits. Prints the
# percentiles as JSON; nothing is asserted (the tests bound a miss at 50 ms).
"""Usage: replay_miss.py [--calls N] [--bin-dir DIR]"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import tunecache

from dropin_bench import start_daemon, take_down


def percentiles(seconds: list) -> dict:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6  # noqa: E731
    return {"calls": len(ordered), "median_us": round(statistics.median(ordered) * 1e6, 1),
            "p90_us": round(pick(0.9), 1), "p99_us": round(pick(0.99), 1), "max_us": round(ordered[-1] * 1e6, 1)}


def timed(call, count: int) -> list:
    times = []
    for index in range(count):
        started = time.perf_counter()
        call(index)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--bin-dir")
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tc-replay-", dir="/tmp"))
    socket = str(work / "tc.sock")
    daemon = start_daemon(arguments.bin_dir, work, socket)
    try:
        key = lambda problem: tunecache.Key(namespace="bench", op="replay", device="cpu", problem=problem)  # noqa: E731
        tuner = tunecache.Client(socket, mode="tune")
        replayer = tunecache.Client(socket, mode="replay")
        held = tuner.begin_tune(key("held"), wait_ms=0, lease_ms=600_000)
        tuner.record([{"key": key("hit"), "result": {"config": "{}", "time_us": 1.0}}])
        replayer.stats()  # connected before timing
        ask = lambda problem: replayer.begin_tune(key(problem), wait_ms=60_000, can_tune=True)  # noqa: E731
        report = {
            "miss_new_keys": percentiles(timed(lambda i: ask(f"miss-{i}"), arguments.calls)),
            "miss_same_key": percentiles(timed(lambda i: ask("miss-0"), arguments.calls)),
            "miss_held_by_another": percentiles(timed(lambda i: ask("held"), arguments.calls)),
            "hit": percentiles(timed(lambda i: ask("hit"), arguments.calls)),
            "leases_granted": tuner.stats().leases_granted,
        }
        tuner.abandon(held.lease)
        print(json.dumps(report, indent=1))
    finally:
        take_down(None, work, daemon)


if __name__ == "__main__":
    main()
