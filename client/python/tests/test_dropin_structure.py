# Owns the check that every drop-in (tunecache/integrations/*.py, and tunecache.autotune, which
# tunes as they do) is built on the one base, tunecache/integrations/_base.py (issue 49): none
# makes its own daemon client or once-per-process warning, runs its own lease (Resolve, Record
# under the lease, giving it up), parses its own millisecond settings or spells a result's
# provenance itself. It reads the package's source files (the ones committed), not the installed
# copy, and needs no daemon.
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import PYTHON_PACKAGE_ROOT

PACKAGE = PYTHON_PACKAGE_ROOT / "tunecache"
BASE = PACKAGE / "integrations" / "_base.py"
# The modules that must use the base: every drop-in, present and future, and the helper.
USERS = sorted(path for path in (PACKAGE / "integrations").glob("*.py") if path != BASE) + [PACKAGE / "autotuning.py"]

# Defined only by the base: the client wrapper, its warning, the lease's steps, the settings'
# parsing and the provenance text.
BASE_DEFINITIONS = {
    "client", "warn_once", "first_warning", "env_ms", "_env_ms", "abandon", "_abandon", "give_up",
    "begin", "finish", "_finish_tune", "tune_once", "tuned_by", "_tuned_by",
}
# The client calls of the split lease and the rank flow: the base's to make.
LEASE_CALLS = {"begin_tune", "finish_tune", "abandon", "resolve", "resolve_tune_record", "record_with_lease"}
# Making a client (tunecache.Client, the native one, the old per-process wrapper) is the base's.
CLIENT_CLASSES = {"Client", "ProcessClient", "NativeClient"}


def problems_of(path: Path) -> list:
    """Each place in ``path`` that does what only the base may do, as ``"line N: why"``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in BASE_DEFINITIONS:
            found.append(f"line {node.lineno}: defines {node.name}(), the base's")
        elif isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if isinstance(function, ast.Attribute) and name in LEASE_CALLS:
                found.append(f"line {node.lineno}: calls .{name}(), a step of the lease the base runs")
            elif name in CLIENT_CLASSES:
                found.append(f"line {node.lineno}: makes a {name} (the base's Daemon makes the client)")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                named = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                if named in CLIENT_CLASSES:
                    found.append(f"line {node.lineno}: class {node.name} wraps {named} (use the base's Daemon)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) == ("platform", "node"):
                found.append(f"line {node.lineno}: spells a result's provenance (use the base's tuned_by)")
    return found


def test_the_drop_ins_are_found():
    names = {path.name for path in USERS}
    assert {"trtllm.py", "triton.py", "bitblas.py", "flashinfer.py", "autotuning.py"} <= names, names


@pytest.mark.parametrize("path", USERS, ids=[path.name for path in USERS])
def test_no_drop_in_defines_its_own_daemon_wrapper_or_lease_loop(path):
    problems = problems_of(path)
    assert not problems, f"{path.relative_to(PYTHON_PACKAGE_ROOT)} does what tunecache.integrations._base does:\n" + "\n".join(problems)


def test_the_base_is_what_they_use():
    # The check above is not vacuous: the base itself trips it.
    assert problems_of(BASE)
