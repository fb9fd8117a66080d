# Owns the switch TUNECACHE_BITBLAS=1: the package's tunecache-bitblas.pth (installed beside it in
# site-packages, so every interpreter of that environment reads it at start) calls activate(),
# which, when the variable is set, installs the BitBLAS drop-in (bitblas.py) as soon as `bitblas`
# has been imported, so that a launcher turns it on without code changes. Without the variable it
# does nothing and imports nothing of BitBLAS.
"""``TUNECACHE_BITBLAS=1``: install ``tunecache.integrations.bitblas`` when BitBLAS is imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from typing import Any, Optional

ENV = "TUNECACHE_BITBLAS"
PACKAGE = "bitblas"

logger = logging.getLogger("tunecache.bitblas")
_lock = threading.Lock()
_finder: Optional["_Finder"] = None


def enabled(environ: Any = None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def activate() -> None:
    """Installs the drop-in now if BitBLAS is imported already, else right after its import.
    Never raises: a problem here must not stop the interpreter (it is logged)."""
    global _finder
    try:
        if not enabled():
            return
        with _lock:
            if PACKAGE in sys.modules:
                _install()
            elif _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
    except Exception as err:  # noqa: BLE001 - see the docstring
        logger.warning("tunecache: %s=1 but the BitBLAS drop-in could not be set up: %s", ENV, err)


def _install() -> None:
    from tunecache.integrations import bitblas as drop_in

    drop_in.install()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``bitblas`` with the other finders and wraps its loader, so that install() runs once
    its ``__init__`` has run (BitBLAS imports its cache and operator modules there). One-shot:
    it leaves sys.meta_path at the first import of ``bitblas``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != PACKAGE:
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _InstallingLoader(spec.loader)
        return spec


class _InstallingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any):
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            _install()
        except Exception as err:  # noqa: BLE001 - BitBLAS itself works; it runs as stock
            logger.warning("tunecache: %s=1 but the BitBLAS drop-in could not be installed: %s", ENV, err)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
