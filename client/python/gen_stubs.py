#!/usr/bin/env python3
# Owns generating the Python gRPC stubs of the public contract (proto/tunecache/v1/tunecache.proto)
# into tunecache/v1/ with grpcio-tools: the `[grpc]` extra's stubs, for code that wants raw gRPC
# (the package itself never imports them). The output is committed; after a change to the proto,
# run this and commit it (tests/test_stubs.py fails on stale stubs, and checks the extra's pins).
"""Generate tunecache/v1/tunecache_pb2*.py from the repository's proto/ directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
# client/python/ -> repository root -> proto/
DEFAULT_PROTO_ROOT = PACKAGE_ROOT.parent.parent / "proto"
# Only the public contract: tunecache/tuner/v1 is the daemon's private worker protocol.
CONTRACT_PROTO = "tunecache/v1/tunecache.proto"
GENERATED_FILES = (
    "tunecache/v1/tunecache_pb2.py",
    "tunecache/v1/tunecache_pb2.pyi",
    "tunecache/v1/tunecache_pb2_grpc.py",
)


def stubs_present(out_root: Path = PACKAGE_ROOT) -> bool:
    return all((out_root / name).is_file() for name in GENERATED_FILES)


def generate(proto_root: Path = DEFAULT_PROTO_ROOT, out_root: Path = PACKAGE_ROOT) -> None:
    """Runs protoc from grpcio-tools; the output lands at out_root/tunecache/v1/ because the
    proto's path below proto_root is tunecache/v1/, which is also its Python import path."""
    try:
        from grpc_tools import protoc
    except ImportError as err:
        raise SystemExit(
            "gen_stubs.py needs grpcio-tools: pip install grpcio-tools"
        ) from err
    proto_file = proto_root / CONTRACT_PROTO
    if not proto_file.is_file():
        raise SystemExit(f"gen_stubs.py: {proto_file} not found; pass --proto-root")
    # grpcio-tools ships the well-known .proto files (google/protobuf/*) next to itself.
    well_known_root = Path(protoc.__file__).resolve().parent / "_proto"
    (out_root / "tunecache" / "v1").mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={proto_root}",
            f"--proto_path={well_known_root}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            CONTRACT_PROTO,
        ]
    )
    if status != 0:
        raise SystemExit(f"gen_stubs.py: protoc failed with status {status}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto-root", type=Path, default=DEFAULT_PROTO_ROOT)
    parser.add_argument("--out-root", type=Path, default=PACKAGE_ROOT)
    args = parser.parse_args(argv)
    generate(args.proto_root, args.out_root)
    print(f"generated tunecache stubs under {args.out_root / 'tunecache' / 'v1'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
