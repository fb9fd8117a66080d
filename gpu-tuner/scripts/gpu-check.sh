#!/usr/bin/env bash
# The GPU check of the tuner worker: one table of checks, each PASS or FAIL, in under 5 min.
#
#   gpu-check.sh build [DIR]   on a build machine (cargo, no GPU needed): builds the GPU test
#                              binary (cargo test --release --no-run) and the worker, strips
#                              them and puts them with this script in DIR
#                              (default target/gpu-check).
#   gpu-check.sh run [DIR]     on the GPU node, with no cargo: runs the prebuilt tests in DIR
#                              (default: this script's directory if it holds them, else
#                              target/gpu-check) and prints the table. Exit status 0 only if
#                              every line is PASS.
#   gpu-check.sh table         formats check lines (GPU-CHECK<TAB>check<TAB>figure<TAB>
#                              expected<TAB>verdict) from stdin as the table.
#
# Environment for run: TUNECACHE_GPU_CHECK_DEVICE (CUDA ordinal, default 0);
# GPU_CHECK_TIMEOUT (seconds, default 290). libcublasLt.so.12 and libnvrtc.so.12 must be
# loadable (e.g. LD_LIBRARY_PATH); docs/launchers.md, "GPU check", explains each line.
set -uo pipefail

TESTS=gpu-check-tests
WORKER=tunecache-tuner
here="$(cd "$(dirname "$0")" && pwd)"

# Prints check lines from stdin as an aligned table; exit status 1 if a line is not PASS
# or there is no line at all.
table() {
    awk -F '\t' '
        $1 == "GPU-CHECK" { n++; check[n] = $2; figure[n] = $3; expected[n] = $4; verdict[n] = $5
            if (length($2) > w1) w1 = length($2)
            if (length($3) > w2) w2 = length($3)
            if (length($4) > w3) w3 = length($4)
            if ($5 != "PASS") failed++ }
        END {
            if (w1 < 5) w1 = 5; if (w2 < 6) w2 = 6; if (w3 < 14) w3 = 14
            printf "%-*s  %-*s  %-*s  %s\n", w1, "check", w2, "figure", w3, "expected range", "result"
            for (i = 0; i < w1 + w2 + w3 + 12; i++) printf "-"; printf "\n"
            for (i = 1; i <= n; i++)
                printf "%-*s  %-*s  %-*s  %s\n", w1, check[i], w2, figure[i], w3, expected[i], verdict[i]
            if (n == 0) { print "(no checks ran)"; exit 1 }
            printf "%d checks, %d failed\n", n, failed
            exit (failed > 0 ? 1 : 0) }'
}

# A check line, for what the script itself checks.
line() { printf 'GPU-CHECK\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4"; }

build() {
    local repo out json tests
    repo="$(cd "$here/../.." && pwd)"
    out="${1:-$repo/target/gpu-check}"
    mkdir -p "$out" || return 1
    cd "$repo" || return 1
    json="$(cargo test --release -p tunecache-gpu-tuner --test gpu --no-run --message-format=json)" || return 1
    tests="$(printf '%s\n' "$json" | grep '"name":"gpu"' | grep -o '"executable":"[^"]*"' | head -n1 | cut -d'"' -f4)"
    if [ -z "$tests" ]; then
        echo "gpu-check: cargo built no test binary named gpu" >&2
        return 1
    fi
    cargo build --release -p tunecache-gpu-tuner --bin "$WORKER" || return 1
    cp "$tests" "$out/$TESTS" && cp "target/release/$WORKER" "$out/$WORKER" && cp "$0" "$out/gpu-check.sh" || return 1
    if command -v strip >/dev/null 2>&1; then
        strip "$out/$TESTS" "$out/$WORKER"
    fi
    ls -l "$out"
    echo "copy $out to the GPU node and run: $out/gpu-check.sh run $out"
}

run() {
    local dir log status
    if [ -n "${1:-}" ]; then
        dir="$1"
    elif [ -x "$here/$TESTS" ]; then
        dir="$here"
    else
        dir="$here/../../target/gpu-check"
    fi
    log="$(mktemp)"
    trap 'rm -f "$log"' RETURN
    {
        if ! command -v nvidia-smi >/dev/null 2>&1; then
            line "GPU present" "nvidia-smi not found" "an NVIDIA driver and GPU" FAIL
        elif ! gpus="$(nvidia-smi -L 2>&1)" || [ -z "$gpus" ]; then
            line "GPU present" "nvidia-smi -L: ${gpus:-no output}" "at least one GPU" FAIL
        elif [ ! -x "$dir/$TESTS" ] || [ ! -x "$dir/$WORKER" ]; then
            line "prebuilt binaries" "missing in $dir" "$TESTS and $WORKER (gpu-check.sh build)" FAIL
        else
            line "GPU present" "$(printf '%s' "$gpus" | head -n1 | cut -c1-60)" "at least one GPU" PASS
            TUNECACHE_GPU_CHECK_WORKER="$dir/$WORKER" timeout "${GPU_CHECK_TIMEOUT:-290}" \
                "$dir/$TESTS" --ignored --nocapture --test-threads=1 >"$log" 2>&1
            status=$?
            grep -a '^GPU-CHECK' "$log"
            # Each test ends with its own "test NAME" line; one without it panicked before
            # its checks or was cut off by the time limit.
            "$dir/$TESTS" --ignored --list 2>/dev/null | sed -n 's/: test$//p' | while read -r name; do
                if ! grep -aq "^GPU-CHECK	test $name	" "$log"; then
                    line "test $name" "did not finish (panic or time limit; output above)" "all checks pass" FAIL
                fi
            done
            case $status in
                0) ;;
                124) line "whole check" "killed after ${GPU_CHECK_TIMEOUT:-290} s" "finishes in time" FAIL ;;
                *) line "test binary" "exit status $status" 0 FAIL ;;
            esac
        fi
    } >"$log.lines"
    if [ -s "$log" ] && grep -aq 'FAILED\|panicked' "$log"; then
        echo "==== test output (failures) ===="
        grep -aE -A12 'panicked|^---- ' "$log" | head -n 80
        echo
    fi
    table <"$log.lines"
    status=$?
    rm -f "$log.lines"
    return $status
}

case "${1:-run}" in
    build) shift; build "$@" ;;
    run) shift; run "$@" ;;
    table) table ;;
    *) echo "usage: $0 build [DIR] | run [DIR] | table" >&2; exit 2 ;;
esac
