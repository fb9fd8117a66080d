# Owns one Python rank of the file-lock cache as TensorRT-LLM's autotuner kept it before PR 22173
# (the "before" peer, in Python): an exclusive lock on <cache>.lock around the load (json.load of
# the whole file; the in-memory cache is replaced by the shared and rank_<N> sections) and around
# the save (json.load again, merge the rank's sections in, json.dump with indent=2 to a temp file,
# fsync, rename over the file). Same file layout and steps as the Rust "before" peer
# (tests/bench/src/filelock.rs), with Python's json and interpreter costs.
#
# The lock is a blocking fcntl.flock on the lock file, which is what filelock.FileLock takes on
# Linux; filelock itself polls a held lock every 50 ms instead of blocking, which could only make
# this peer slower, so the blocking form is the peer's best case.
#
# Run by the harness as: python -c <this file> --cache FILE --rank N --entries FILE; rank protocol:
# print "ready", wait for EOF on stdin, work, print one RankReport JSON line.
import argparse
import fcntl
import json
import os
import sys
import time


def rank_section(rank: int) -> str:
    return f"rank_{rank}"


class Locked:
    """An exclusive flock on `path`, held for the `with` block."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> "Locked":
        self.file = open(self.path, "a+")
        fcntl.flock(self.file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info) -> None:
        fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
        self.file.close()


def metadata() -> dict:
    return {
        "lib_version": "tunecache-bench-python",
        "creation_timestamp": time.time(),
        "device_name": "NVIDIA H100 80GB HBM3",
        "device_capability": [9, 0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="filelock-rank.py")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--entries", required=True, help='{"shared": {...}, "own": {...}} this rank tuned')
    args = parser.parse_args()
    lock_path = args.cache + ".lock"
    own_section = rank_section(args.rank)
    with open(args.entries, encoding="utf-8") as file:
        tuned = json.load(file)

    print("ready", flush=True)
    sys.stdin.read()

    load_started = time.perf_counter()
    with Locked(lock_path):
        with open(args.cache, encoding="utf-8") as file:
            document = json.load(file)
        shared = dict(document.get("shared", {}))
        own = dict(document.get(own_section, {}))
    load_took = time.perf_counter() - load_started
    entries_loaded = len(shared) + len(own)

    # The autotuner's profiling results land in memory.
    shared.update(tuned["shared"])
    own.update(tuned["own"])

    save_started = time.perf_counter()
    with Locked(lock_path):
        try:
            with open(args.cache, encoding="utf-8") as file:
                document = json.load(file)
        except FileNotFoundError:
            document = {}
        document["metadata"] = metadata()
        document.setdefault("shared", {}).update(shared)
        document.setdefault(own_section, {}).update(own)
        temp_path = f"{args.cache}.tmp.{os.getpid()}"
        with open(temp_path, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=2)
            file.flush()
            os.fsync(file.fileno())
            bytes_written = file.tell()
        os.replace(temp_path, args.cache)
    save_took = time.perf_counter() - save_started

    print(
        json.dumps(
            {
                "rank": args.rank,
                "system": "filelock-py-before",
                "load_ms": load_took * 1e3,
                "save_ms": save_took * 1e3,
                "cache_ms": (load_took + save_took) * 1e3,
                "bytes_written": bytes_written,
                "entries_loaded": entries_loaded,
                "save_outcome": "written",
                "warnings": 0,
            }
        ),
        flush=True,
    )
    # Start-up is done: a real rank goes on to run the model, so the interpreter's teardown (for
    # grpcio: its threads and channel, ~150 ms) is no part of the cold start the harness times
    # until the process exits. Skip it, as the Rust ranks have none.
    os._exit(0)


main()
