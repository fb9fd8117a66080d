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

# The Python client's tests against the real daemon. The venv is made ready first: the
# benchmarks' quick suite runs Python ranks from it too.
client/python/run_tests.sh --prepare

export TUNECACHE_DAEMON_BIN="$PWD/target/debug/tunecached" TUNECACHE_CLI_BIN="$PWD/target/debug/tunecache"

# The Python tests run beside the Rust tests, which run one test binary at a time and mostly
# wait on daemons: first the Inductor drop-in's (real torch compiling on the CPU, about three
# minutes of g++ and Inductor), then the rest; their output is kept until the Rust tests end.
inductor_log="$PWD/target/inductor-tests.log"
python_log="$PWD/target/python-tests.log"
rm -f "$PWD/target/python-tests.status"
(
    inductor_status=0
    client/python/run_tests.sh --prepared test_inductor_dropin.py >"$inductor_log" 2>&1 ||
        inductor_status=$?
    python_status=0
    client/python/run_tests.sh --prepared --ignore=test_inductor_dropin.py >"$python_log" 2>&1 ||
        python_status=$?
    echo "$inductor_status $python_status" >"$PWD/target/python-tests.status"
) &
python_tests=$!

# TUNECACHE_BIN_DIR: the binaries just built, so no test builds them again.
rust_status=0
TUNECACHE_BIN_DIR="$PWD/target/debug" cargo test --workspace --no-fail-fast -- \
    --test-threads "${TUNECACHE_TEST_THREADS:-4}" || rust_status=$?
wait "$python_tests" || true
read -r inductor_status python_status <"$PWD/target/python-tests.status" ||
    { inductor_status=1 python_status=1; }
echo "=== Python client tests of the Inductor drop-in (run beside cargo test):"
cat "$inductor_log"
echo "=== the other Python client tests (run beside cargo test, after the Inductor drop-in's):"
cat "$python_log"
echo "=== cargo test --workspace: exit $rust_status; Python client tests: exit $python_status;" \
    "of them the Inductor drop-in's: exit $inductor_status"
((rust_status == 0 && python_status == 0 && inductor_status == 0))
