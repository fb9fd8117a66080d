#!/usr/bin/env bash
# Runs the whole test suite: every Rust test (unit, and integration tests that start the real
# tunecached binary), then the Python client's tests against the real daemon.
# GPU tests are #[ignore]d here; gpu-tuner/scripts/gpu-check.sh runs them on a GPU machine.
#
# Environment: TUNECACHE_TEST_THREADS, the tests one Rust test binary runs at once (default 4:
# most tests wait on a daemon, a Redis or a Slurm of their own, not on a core).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Integration tests start the binaries, so build them first; then the test binaries.
cargo build --workspace --bins
# The Python package's one wheel: the one .ci/run built ($TUNECACHE_PY_WHEEL), else built here;
# run_tests.sh installs it into its venv.
if [[ -z "${TUNECACHE_PY_WHEEL:-}" ]]; then
    TUNECACHE_PY_WHEEL="$(client/python/build_wheel.sh)"
    export TUNECACHE_PY_WHEEL
fi
cargo test --workspace --no-run

# The Python client's tests against the real daemon, after the Rust tests (beside them, under a
# 2-core CI's full load, its Ctrl-C test once waited past its 10 s bound). The venv is made
# ready first: the benchmarks' quick suite runs Python ranks from it too.
client/python/run_tests.sh --prepare

export TUNECACHE_DAEMON_BIN="$PWD/target/debug/tunecached" TUNECACHE_CLI_BIN="$PWD/target/debug/tunecache"

# The Inductor drop-in's tests compile with real torch on the CPU (about two and a half minutes of
# g++ and Inductor), while cargo test runs one test binary at a time and its tests mostly wait on
# daemons: they run beside the Rust tests, their output kept until those end.
inductor_log="$PWD/target/inductor-tests.log"
client/python/run_tests.sh --prepared test_inductor_dropin.py >"$inductor_log" 2>&1 &
inductor_tests=$!

# TUNECACHE_BIN_DIR: the binaries just built, so no test builds them again.
rust_status=0
TUNECACHE_BIN_DIR="$PWD/target/debug" cargo test --workspace --no-fail-fast -- \
    --test-threads "${TUNECACHE_TEST_THREADS:-4}" || rust_status=$?
inductor_status=0
wait "$inductor_tests" || inductor_status=$?
echo "=== Python client tests of the Inductor drop-in (run beside cargo test):"
cat "$inductor_log"
python_status=0
client/python/run_tests.sh --prepared --ignore=test_inductor_dropin.py || python_status=$?
echo "=== cargo test --workspace: exit $rust_status; Python client tests: exit $python_status;" \
    "of them the Inductor drop-in's: exit $inductor_status"
((rust_status == 0 && python_status == 0 && inductor_status == 0))
