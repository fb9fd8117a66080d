# Owns one measurement of what the `tunecache` package costs a fresh rank process: CPU time
# (every thread's, time.process_time) of `import tunecache`, then of making a Client and its
# first call (a one-key Lookup), the process's threads after it, and the resident memory that
# import and call added (VmRSS). With "preloaded", what a framework rank has loaded long before
# is loaded first (torch imports all of these modules, and loads libstdc++ and with it
# libgcc_s, the unwinder a Rust extension links), so only the package's own cost is counted.
# Works for both clients (flavor.py is not needed: no floor here).
#
# Run by the harness as: python -c <this file> SOCKET bare|preloaded; prints one JSON object.
import os
import sys
import time


def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tasks():
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


socket, mode = sys.argv[1], sys.argv[2]
if mode == "preloaded":
    import __future__, json, logging, typing, threading, re, enum, platform, math, statistics  # noqa: E401,F401
    import functools, ast, inspect, importlib, struct, socket as socketlib, stat, collections  # noqa: E401,F401
    import dataclasses, ctypes  # noqa: E401,F401

    ctypes.CDLL("libgcc_s.so.1")
rss_before = rss_kib()
started = time.process_time()
import tunecache  # noqa: E402

imported = time.process_time()
client = tunecache.Client(socket, timeout=30)
client.lookup([tunecache.Key(namespace="bench", op="first-call", device="cpu", problem="p")])
called = time.process_time()
import json  # noqa: E402

print(json.dumps({
    "import_cpu_ms": (imported - started) * 1e3,
    "first_call_cpu_ms": (called - imported) * 1e3,
    "cpu_ms": (called - started) * 1e3,
    "threads": tasks(),
    "rss_added_kib": rss_kib() - rss_before,
}), flush=True)
# A rank goes on to run its model; the interpreter's teardown is no part of this.
os._exit(0)
