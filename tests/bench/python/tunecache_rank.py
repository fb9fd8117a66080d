# Owns one Python rank of the cold-start matrix using tunecached through a `tunecache` package
# (client/python, the binding of the Rust client; or the grpcio package before it, issue 28): what a TensorRT-LLM rank does at start-up with the daemon instead of the
# JSON file. Before the barrier it imports the package and builds the entries it "tuned" (given by
# the harness in --entries, the same entries the Rust tunecache-rank records); after the release it
# connects, Scans the namespace filtered to the shared and its own entries, builds its in-memory
# cache from them (key text -> (runner_id, tactic, min_time), as the file peer's sections), Records
# its new entries, and prints one RankReport JSON line (the shape tests/bench/src/scenario.rs reads).
#
# Run by the harness as: python -c <rank_view.py, then this file> --socket S --rank N --entries FILE --namespace NS
#   --device DEV --system NAME; rank protocol: print "ready", wait for EOF on stdin, work, print the report.
import argparse
import json
import os
import sys
import time

from tunecache import Client, Entry, Key, Result

# Far above any healthy answer, so a slow daemon shows in the timings instead of failing the rank.
CALL_DEADLINE_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="tunecache-rank.py")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--entries", required=True, help="JSON list of the entries this rank records")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--system", default="tunecache-py")
    args = parser.parse_args()

    with open(args.entries, encoding="utf-8") as file:
        tuned = [
            Entry(key=Key(**entry["key"]), result=Result(**entry["result"]))
            for entry in json.load(file)
        ]

    # The barrier: announce readiness, then wait until the harness closes stdin.
    print("ready", flush=True)
    sys.stdin.read()

    # The connection is part of the load: a real rank opens it when its cache starts.
    load_started = time.perf_counter()
    client = Client(args.socket, timeout=CALL_DEADLINE_S)
    chunks = client.scan(args.namespace, args.device, timeout=CALL_DEADLINE_S, rank=args.rank)
    shared, own = build_view((entry for chunk in chunks for entry in chunk), args.rank)
    load_took = time.perf_counter() - load_started

    save_started = time.perf_counter()
    client.record(tuned)
    save_took = time.perf_counter() - save_started
    client.close()

    print(
        json.dumps(
            {
                "rank": args.rank,
                "system": args.system,
                "load_ms": load_took * 1e3,
                "save_ms": save_took * 1e3,
                "cache_ms": (load_took + save_took) * 1e3,
                # The rank writes nothing to the shared filesystem; the daemon's bytes are counted
                # once per scenario by the harness.
                "bytes_written": 0,
                "entries_loaded": len(shared) + len(own),
                "save_outcome": "recorded",
                "warnings": 0,
            }
        ),
        flush=True,
    )
    # Start-up is done: a real rank goes on to run the model, so the interpreter's teardown (for
    # grpcio: its threads and channel, ~150 ms) is no part of the cold start the harness times
    # until the process exits. Skip it, as the Rust ranks have none (the binding's is cheap).
    os._exit(0)


main()
