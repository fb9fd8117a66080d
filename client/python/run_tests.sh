#!/usr/bin/env bash
# Owns running the Python client's tests the way CI does: a virtual environment (reused between
# runs), the package installed from ONE wheel (built here with maturin, or the one CI built, given
# in $TUNECACHE_PY_WHEEL), the test dependencies (grpcio for the tests' independent wire-contract
# client, triton), then pytest. The tests import the installed package, never the source tree.
# Arguments are passed to pytest, except a first `--prepare` (make the venv ready, run no test) or
# `--prepared` (run the tests in the venv as `--prepare` left it, installing nothing: a process
# beside it may be using that venv), or `--prepare-torch` (make the venv and install only torch,
# which .ci/run does beside the cargo build: its download and unpacking are not CPU work). The daemon tests run when target/debug/tunecached (or
# $TUNECACHE_DAEMON_BIN) exists and are skipped, with the reason printed, when it does not; the
# TensorRT-LLM mapping tests also need the CLI, target/debug/tunecache (or $TUNECACHE_CLI_BIN).
# Under CI ($CI set) a missing binary fails those tests instead of skipping them.
#
# Environment:
#   PYTHON              interpreter that creates the venv (default: python3; needs >= 3.10)
#   TUNECACHE_PY_VENV   venv directory (default: client/python/.venv); "current" installs into
#                       the running interpreter instead (e.g. inside a CI-provided venv)
#   TUNECACHE_PY_WHEEL  the wheel to install (default: build one into client/python/dist with
#                       build_wheel.sh)
#   TUNECACHE_TRITON    the triton requirement the Triton cache-manager tests run against
#                       (default: the version they were written for); "none" installs none and
#                       those tests skip (outside CI)
#   TUNECACHE_TORCH     "none" installs no torch and the Inductor drop-in tests skip (outside CI);
#                       else torch 2.15.0 (with its CUDA libraries, which it needs to import even
#                       on a CPU) from the package index, its wheel checked against its sha256
#   TUNECACHE_FLASHINFER_WHEEL  FlashInfer's wheel (flashinfer-python 0.7.2.post1) to take the
#                       FlashInfer drop-in tests' code from, instead of downloading it (pip
#                       download --no-deps); either way checked against its sha256
#
# The FlashInfer drop-in tests run FlashInfer's own autotune_cache.py and autotuner/ from that
# wheel: they are extracted once into target/flashinfer-0.7.2.post1 (a rerun finds them there and
# downloads nothing) and the tests get that directory in $TUNECACHE_FLASHINFER_SOURCE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TUNECACHE_PY_VENV:-$here/.venv}"
stage=all
if [[ "${1:-}" == "--prepare" || "${1:-}" == "--prepared" || "${1:-}" == "--prepare-torch" ]]; then
    stage="${1#--}"
    shift
fi

if [[ "$venv" == "current" ]]; then
    python="${PYTHON:-python3}"
else
    if [[ ! -x "$venv/bin/python" ]]; then
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    python="$venv/bin/python"
fi

# torch for tests/test_inductor_dropin.py, whose tests run Inductor's own code: pinned by version and
# by the digest of its wheel (CPython 3.11 on x86_64, CI's), downloaded, checked, then installed
# with its dependencies (about 5 GB installed, once: a reused venv that has it skips all this).
torch_version=2.15.0
torch_wheel_sha256=48c2d861134c0b5697c7602cb5ffa68f62a2989fdcd1717e593356f67996ca1e
install_torch() {
    [[ "${TUNECACHE_TORCH:-}" == "none" ]] && return 0
    if [[ "$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" == "$torch_version" ]]; then
        return 0
    fi
    local fetch
    fetch="$(mktemp -d)"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps "torch==$torch_version" --dest "$fetch"
    local wheel_file=("$fetch"/torch-*.whl)
    if ! echo "$torch_wheel_sha256  ${wheel_file[0]}" | sha256sum --check --quiet; then
        echo "run_tests.sh: ${wheel_file[0]##*/} is not the pinned torch wheel (cp311 x86_64, sha256 $torch_wheel_sha256);" \
            "set TUNECACHE_TORCH=none to run without the Inductor tests" >&2
        rm -rf "$fetch"
        return 1
    fi
    "$python" -m pip install --quiet --disable-pip-version-check "${wheel_file[0]}"
    rm -rf "$fetch"
}
if [[ "$stage" == "prepare-torch" ]]; then
    install_torch
    exit 0
fi

if [[ "$stage" != "prepared" ]]; then
    install_torch
    pip=("$python" -m pip install --quiet --disable-pip-version-check)
    wheel="${TUNECACHE_PY_WHEEL:-}"
    if [[ -z "$wheel" ]]; then
        wheel="$("$here/build_wheel.sh" "$python")"
    fi
    # The same wheel every time: --force-reinstall replaces an editable or older install. Byte-compiled
    # at install, as a site's pip install does (PYTHONDONTWRITEBYTECODE would skip that).
    env -u PYTHONDONTWRITEBYTECODE "${pip[@]}" --force-reinstall --no-deps "$wheel"
    # Test dependencies: grpcio-tools pulls in the grpcio and protobuf it generates code for (the
    # tests' own gRPC client and the stub check), as the `[grpc]` extra pins them. Pinned to the
    # version that generated the committed stubs: a newer grpcio-tools writes other bytes, and
    # tests/test_stubs.py would fail on a release of grpcio-tools, not on a change of ours.
    "${pip[@]}" grpcio protobuf grpcio-tools==1.85.1 pytest googleapis-common-protos
    # The real triton package for tests/test_triton_cache_manager.py (about 1 GB installed, once:
    # pip finds it satisfied in a reused venv). It has no dependencies of its own to pull in.
    triton_requirement="${TUNECACHE_TRITON:-triton==3.9.0}"
    if [[ "$triton_requirement" != "none" ]]; then
        "${pip[@]}" "$triton_requirement"
    fi
fi

# FlashInfer's code for tests/test_flashinfer_dropin.py, pinned by the wheel's sha256.
flashinfer_wheel_sha256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
flashinfer_source="$(cd "$here/../.." && pwd)/target/flashinfer-0.7.2.post1"
if [[ "$stage" != "prepared" && ! -f "$flashinfer_source/.extracted" ]]; then
    fetch="$(mktemp -d)"
    wheel_file="${TUNECACHE_FLASHINFER_WHEEL:-}"
    if [[ -z "$wheel_file" ]]; then
        "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
            flashinfer-python==0.7.2.post1 --dest "$fetch"
        wheel_file="$fetch/flashinfer_python-0.7.2.post1-py3-none-any.whl"
    fi
    echo "$flashinfer_wheel_sha256  $wheel_file" | sha256sum --check --quiet
    rm -rf "$flashinfer_source"
    mkdir -p "$flashinfer_source"
    "$python" - "$wheel_file" "$flashinfer_source" <<'EXTRACT'
import sys, zipfile
names = ["autotune_cache.py", "autotuner/__init__.py", "autotuner/autotuner.py", "autotuner/initializers.py"]
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in names:
        wheel.extract("flashinfer/" + name, sys.argv[2])
EXTRACT
    touch "$flashinfer_source/.extracted"
    rm -rf "$fetch"
fi
export TUNECACHE_FLASHINFER_SOURCE="$flashinfer_source"

if [[ "$stage" == "prepare" ]]; then
    exit 0
fi

cd "$here/tests"
# -rs prints why daemon tests were skipped; -p no:cacheprovider keeps the tree clean.
exec env -u PYTHONPATH "$python" -m pytest -rs -p no:cacheprovider -c "$here/pyproject.toml" --rootdir "$here" "$@"
