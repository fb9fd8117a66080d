#!/usr/bin/env bash
# Owns making issue 28's "before" Python client for `tunecache-bench python-client`: the grpcio
# package as it was before the binding of the Rust client (client/python at REV, default the last
# commit that had it), exported into DIR with its gRPC stubs generated and a venv of its own
# (grpcio, protobuf, grpcio-tools at the versions pip picks). Prints the package directory to
# pass as --grpcio-dir. Usage: grpcio_before.sh DIR [REV]
set -euo pipefail

dir="${1:?usage: grpcio_before.sh DIR [REV]}"
rev="${2:-b6cc4763a1e76969834b1089b9140664c1639952}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
rm -rf "$dir"
mkdir -p "$dir"
git -C "$repo" archive "$rev" client/python proto | tar -x -C "$dir"
package="$dir/client/python"
"${PYTHON:-python3}" -m venv "$package/.venv"
"$package/.venv/bin/python" -m pip install --quiet --disable-pip-version-check grpcio protobuf \
    grpcio-tools googleapis-common-protos >&2
"$package/.venv/bin/python" "$package/gen_stubs.py" >&2
# Byte-compiled once, as pip does for an installed package: no rank pays for compiling it.
"$package/.venv/bin/python" -m compileall -q "$package/tunecache" >&2
echo "$package"
