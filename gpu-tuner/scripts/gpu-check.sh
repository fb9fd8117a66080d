#!/usr/bin/env bash
# Runs the GPU-only (#[ignore]d) tests of tunecache-gpu-tuner and prints a summary.
# Needs an NVIDIA GPU and driver; a CUDA toolkit is not needed to build (cudarc loads
# libcuda, libcublasLt and libnvrtc at run time), but libcublasLt and libnvrtc must be
# loadable (LD_LIBRARY_PATH) for the gemm and nvrtc tests.
set -uo pipefail
cd "$(dirname "$0")/../.."

echo "==== device ===="
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
    echo "nvidia-smi not found"
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test -p tunecache-gpu-tuner --no-fail-fast -- --ignored --test-threads=1 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

echo
echo "==== gpu-check summary ===="
grep -E '^test .+ \.\.\. (ok|FAILED)$' "$log" || echo "(no tests ran)"
passed=$(grep -cE '^test .+ \.\.\. ok$' "$log")
failed=$(grep -cE '^test .+ \.\.\. FAILED$' "$log")
echo "passed: $passed, failed: $failed, cargo exit status: $status"
exit "$status"
