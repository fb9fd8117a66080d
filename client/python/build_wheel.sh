#!/usr/bin/env bash
# Owns building the package's one wheel (maturin, the workspace's `wheel` profile, the stable ABI: it installs on every
# CPython >= 3.10) into client/python/dist and printing its path. Usage: build_wheel.sh [PYTHON];
# PYTHON (default python3) runs maturin, installed into it when missing. Cargo builds into
# $CARGO_TARGET_DIR, else the workspace's target/. For a manylinux wheel to install on nodes
# without Rust, see docs/integrations.md ("Wheels").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-python3}"
if ! "$python" -m maturin --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --disable-pip-version-check 'maturin>=1.9.4,<2' >&2
fi
rm -rf "$here/dist"
# $MATURIN_PEP517_ARGS: the extra maturin arguments pip's builds of the package take (maturin's
# own variable), so this wheel is built as those are (.ci/run sets `--profile dev`).
# shellcheck disable=SC2086 # the arguments are split as maturin splits them
"$python" -m maturin build --manifest-path "$here/Cargo.toml" --out "$here/dist" ${MATURIN_PEP517_ARGS:-} >&2
ls "$here"/dist/tunecache-*.whl
