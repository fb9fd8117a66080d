# Owns one kernel-launcher process for the tunecache.autotune tests: it tunes `problems` problems
# with a bench that appends one line per call to a shared count file (O_APPEND, so lines from
# processes never interleave), then prints {problem: chosen block} as JSON. The bench does real
# work (a short sleep) and reports a time that grows with the distance of the config from the
# problem's best block, so the winner does not depend on the load of the machine. With a doom
# marker, the first process to time the doomed problem SIGKILLs itself while holding the lease.
from __future__ import annotations

import json
import os
import signal
import sys
import time

import tunecache

CONFIGS = [{"block": block} for block in (16, 32, 64, 128)]


def best_block(problem: int) -> int:
    return CONFIGS[problem % len(CONFIGS)]["block"]


def main() -> int:
    spec = json.loads(sys.argv[1])
    count_fd = os.open(spec["count_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    doom_marker = spec.get("doom_marker")

    def bench(config, problem):
        os.write(count_fd, f"{problem} {config['block']} {os.getpid()}\n".encode())
        if doom_marker and problem == spec["doomed_problem"]:
            try:
                os.close(os.open(doom_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                os.kill(os.getpid(), signal.SIGKILL)
            except FileExistsError:
                pass
        time.sleep(0.0002)
        return 10.0 + abs(config["block"] - best_block(problem))  # microseconds

    tuner = tunecache.autotune(
        "pytest-autotune",
        "matmul",
        key_fn=lambda problem: {"m": problem, "n": 4096, "run": spec["run"]},
        configs=CONFIGS,
        bench=bench,
        device="cpu|pytest",
        warmup=spec["warmup"],
        repeats=spec["repeats"],
        wait_ms=spec.get("wait_ms", 60_000),
    )

    @tuner
    def matmul(problem, *, config):
        return config["block"]

    chosen = {}
    order = list(range(spec["problems"]))
    if os.getpid() % 2:
        order.reverse()  # meet other processes from both ends
    for problem in order:
        chosen[problem] = matmul(problem)
        assert matmul(problem) == chosen[problem]  # the in-process memo
    print(json.dumps(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
