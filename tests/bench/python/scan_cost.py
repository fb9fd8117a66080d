# Owns the Scan measurement of a Python client against its floor (issue 28): a Scan of every
# entry of one namespace and device through `tunecache.Client.scan`, `runs` times after warm-ups,
# and the floor's parts: building the objects that Scan returns from its very bytes, taken raw off
# the wire (flavor.py's decode_scan: the binding's Rust decode and objects, or protobuf's parse for
# the grpcio package), and one round trip (an empty Lookup through the same client, and a bare
# health Check through a grpcio channel of the benchmark's own). Medians in ms.
#
# Run by the harness as: python -c <flavor.py, then this file> SOCKET NAMESPACE DEVICE RUNS;
#   prints one JSON object.
import json
import statistics
import sys
import time


def timed(runs, work):
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1e3)
    return times


socket, namespace, device, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = tunecache.Client(socket, timeout=60)


def scan():
    return [entry for chunk in client.scan(namespace, device) for entry in chunk]


count = len(scan())
for _ in range(3):
    assert len(scan()) == count
scans = timed(runs, scan)
chunks, channel = raw_scan_chunks(socket, namespace, device)
assert len(decode_scan(chunks)) == count
build = timed(runs, lambda: decode_scan(chunks))
empty_lookup = timed(max(runs, 201), lambda: client.lookup([]))
health = channel.unary_unary("/grpc.health.v1.Health/Check")
for _ in range(50):
    health(b"")
health_echo = timed(max(runs, 201), lambda: health(b""))
median = statistics.median
print(json.dumps({
    "client": client_flavor(),
    "entries": count,
    "wire_bytes": sum(len(chunk) for chunk in chunks),
    "runs": runs,
    "scan_ms": median(scans),
    "scan_min_ms": min(scans),
    "scan_max_ms": max(scans),
    "build_ms": median(build),
    "echo_ms": median(empty_lookup),
    "health_echo_ms": median(health_echo),
}))
