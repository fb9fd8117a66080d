# Owns one simulated rank for test_with_daemon.py: waits for the start signal, calls get_or_tune
# on the shared key with a tune function that leaves a trace in a counter file and returns once
# the other ranks wait on its lease (the daemon's Stats say so), and prints what it got as one
# JSON line.
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tunecache

START_SIGNAL_TIMEOUT_S = 60.0
WAITERS_TIMEOUT_S = 60.0


def main(socket_path: str, key_json: str, counter_path: str, ready_path: str, go_path: str, waiters: str) -> int:
    key = tunecache.Key(**json.loads(key_json))

    def tune():
        # O_APPEND writes of one short line are atomic, so concurrent tuners would show as lines.
        with open(counter_path, "a") as counter:
            counter.write(f"{os.getpid()}\n")
        # The result comes once every other rank waits on the lease: each is then woken by it,
        # none arrives late to a plain hit. More waiters than ranks would be a second lease.
        deadline = time.monotonic() + WAITERS_TIMEOUT_S
        while (waiting := client.stats().waiters) != int(waiters):
            assert waiting < int(waiters), f"{waiting} waiters, expected {waiters}"
            assert time.monotonic() < deadline, f"{waiting} of {waiters} ranks wait on the lease"
            time.sleep(0.01)
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
