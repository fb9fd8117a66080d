# Owns one simulated rank for test_with_daemon.py: waits for the start signal, calls get_or_tune
# on the shared key with a tune function that leaves a trace in a counter file, and prints what
# it got as one JSON line.
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tunecache

START_SIGNAL_TIMEOUT_S = 60.0


def main(socket_path: str, key_json: str, counter_path: str, ready_path: str, go_path: str, tune_s: str) -> int:
    key = tunecache.Key(**json.loads(key_json))

    def tune():
        # O_APPEND writes of one short line are atomic, so concurrent tuners would show as lines.
        with open(counter_path, "a") as counter:
            counter.write(f"{os.getpid()}\n")
        time.sleep(float(tune_s))  # long enough that the other ranks wait on the lease
        return {"runner_id": 1, "tactic": [128, 64], "tuned_by_pid": os.getpid()}, 42.5

    client = tunecache.Client(socket_path, timeout=5.0)
    Path(ready_path).touch()
    deadline = time.monotonic() + START_SIGNAL_TIMEOUT_S
    while not os.path.exists(go_path):
        if time.monotonic() > deadline:
            print("no start signal", file=sys.stderr)
            return 3
        time.sleep(0.005)
    result = client.get_or_tune(key, tune, fallback="FALLBACK", wait_ms=30_000)
    print(json.dumps({"pid": os.getpid(), "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
