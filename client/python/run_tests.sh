#!/usr/bin/env bash
# Owns running the Python client's tests the way CI does: a virtual environment (reused between
# runs), the dependencies, stubs freshly generated from proto/, then pytest. Arguments are passed
# to pytest. The daemon tests run when target/debug/tunecached (or $TUNECACHE_DAEMON_BIN) exists
# and are skipped, with the reason printed, when it does not.
#
# Environment:
#   PYTHON              interpreter that creates the venv (default: python3; needs >= 3.10)
#   TUNECACHE_PY_VENV   venv directory (default: client/python/.venv); "current" installs into
#                       the running interpreter instead (e.g. inside a CI-provided venv)
#   TUNECACHE_TRITON    the triton requirement the Triton cache-manager tests run against
#                       (default: the version they were written for); "none" installs none and
#                       those tests skip (outside CI)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TUNECACHE_PY_VENV:-$here/.venv}"

if [[ "$venv" == "current" ]]; then
    python="${PYTHON:-python3}"
else
    if [[ ! -x "$venv/bin/python" ]]; then
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    python="$venv/bin/python"
fi

# grpcio-tools pulls in the grpcio and protobuf it generates code for, so the three match.
"$python" -m pip install --quiet --disable-pip-version-check grpcio protobuf grpcio-tools pytest \
    googleapis-common-protos
# The real triton package for tests/test_triton_cache_manager.py (about 1 GB installed, once:
# pip finds it satisfied in a reused venv). It has no dependencies of its own to pull in.
triton_requirement="${TUNECACHE_TRITON:-triton==3.9.0}"
if [[ "$triton_requirement" != "none" ]]; then
    "$python" -m pip install --quiet --disable-pip-version-check "$triton_requirement"
fi
"$python" "$here/gen_stubs.py"

cd "$here"
# -rs prints why daemon tests were skipped.
exec env PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -rs "$@"
