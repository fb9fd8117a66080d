# Owns the Python parse floor of the cold-start matrix: the least CPU a Python rank spends on what
# it loads, measured in one uncontended process. For a tunecache rank: its client's parse of the
# very Scan response bytes that rank receives (taken raw off the wire through grpcio; see
# flavor.py: the binding's Rust decode and objects, or protobuf's parse for the grpcio package),
# and that parse plus building the rank's in-memory cache from the entries (what
# tunecache_rank.py does after the bytes arrive). For a file-lock rank: json.loads of the whole
# cache file's bytes.
#
# Run by the harness as: python -c <rank_view.py, flavor.py, then this file> --socket S
#   --namespace NS --device DEV --rank N --cache FILE --runs K; prints one JSON object (medians
#   in ms).
import argparse
import json
import statistics
import time



def timed(runs: int, work) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(prog="parse_floor.py")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()

    chunks, channel = raw_scan_chunks(args.socket, args.namespace, args.device, args.rank)
    channel.close()

    def parse():
        return decode_scan(chunks)

    def view():
        shared, own = build_view(parse(), args.rank)
        return len(shared) + len(own)

    with open(args.cache, "rb") as file:
        file_bytes = file.read()
    print(
        json.dumps(
            {
                "client": client_flavor(),
                "scan_entries": len(parse()),
                "scan_bytes": sum(len(chunk) for chunk in chunks),
                "view_entries": view(),
                "scan_parse_ms": timed(args.runs, parse),
                "scan_view_ms": timed(args.runs, view),
                "file_bytes": len(file_bytes),
                "file_entries": sum(len(v) for k, v in json.loads(file_bytes).items() if k != "metadata"),
                "file_parse_ms": timed(args.runs, lambda: json.loads(file_bytes)),
            }
        )
    )


main()
