# Owns the check that the committed tunecache.v1 stubs (the `[grpc]` extra's, for raw gRPC) are
# what gen_stubs.py makes from proto/ now, and that the extra's pins admit the grpcio and
# protobuf they were generated for.
from __future__ import annotations

import importlib.util
import re
import tomllib

import pytest

from conftest import PYTHON_PACKAGE_ROOT

# Loaded from its file: putting client/python on sys.path would let the source tree (which has no
# native module) shadow the installed package.
_spec = importlib.util.spec_from_file_location("gen_stubs", PYTHON_PACKAGE_ROOT / "gen_stubs.py")
gen_stubs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_stubs)


def test_committed_stubs_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    gen_stubs.generate(out_root=tmp_path)
    for name in gen_stubs.GENERATED_FILES:
        fresh = (tmp_path / name).read_text()
        committed = (PYTHON_PACKAGE_ROOT / name).read_text()
        assert fresh == committed, f"{name} is stale: run `python client/python/gen_stubs.py` and commit it"


def test_the_grpc_extra_admits_the_generating_versions():
    extra = tomllib.loads((PYTHON_PACKAGE_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["grpc"]
    pins = dict(re.match(r"([a-z-]+)>=([0-9.]+)", pin).groups() for pin in extra)
    grpc_stub = (PYTHON_PACKAGE_ROOT / "tunecache/v1/tunecache_pb2_grpc.py").read_text()
    generated_grpc = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", grpc_stub).group(1)
    assert pins["grpcio"] == generated_grpc
    message_stub = (PYTHON_PACKAGE_ROOT / "tunecache/v1/tunecache_pb2.py").read_text()
    major, minor, patch = re.search(r"Domain.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", message_stub).groups()
    assert pins["protobuf"] == f"{major}.{minor}.{patch}"
