#!/usr/bin/env bash
# Runs the whole test suite: every Rust test (unit, and integration tests that start the real
# tunecached binary), then the Python client's tests against the real daemon.
# GPU tests are #[ignore]d here; gpu-tuner/scripts/gpu-check.sh runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Integration tests start the binaries, so build them first.
cargo build --workspace --bins
cargo test --workspace
# The Python package's one wheel: the one .ci/run built ($TUNECACHE_PY_WHEEL), else built here;
# run_tests.sh installs it into its venv.
if [[ -z "${TUNECACHE_PY_WHEEL:-}" ]]; then
    TUNECACHE_PY_WHEEL="$(client/python/build_wheel.sh)"
    export TUNECACHE_PY_WHEEL
fi
TUNECACHE_DAEMON_BIN="$PWD/target/debug/tunecached" TUNECACHE_CLI_BIN="$PWD/target/debug/tunecache" \
    client/python/run_tests.sh
