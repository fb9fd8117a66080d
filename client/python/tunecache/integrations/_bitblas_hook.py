# Owns the switch TUNECACHE_BITBLAS=1: the package's tunecache-bitblas.pth (installed beside it in
# site-packages, so every interpreter of that environment reads it at start) calls activate(),
# which, when the variable is set, installs the BitBLAS drop-in (bitblas.py) as soon as `bitblas`
# has been imported (BitBLAS imports its cache and operator modules in its __init__), through the
# drop-ins' shared import hook (_import_hook.py). Without the variable it does nothing and
# imports nothing of BitBLAS.
"""``TUNECACHE_BITBLAS=1``: install ``tunecache.integrations.bitblas`` when BitBLAS is imported."""

from __future__ import annotations

import logging
from typing import Any

from tunecache.integrations._import_hook import InstallOnImport

ENV = "TUNECACHE_BITBLAS"
PACKAGE = "bitblas"


def _install() -> None:
    from tunecache.integrations import bitblas as drop_in

    drop_in.install()


_hook = InstallOnImport(ENV, PACKAGE, _install, "BitBLAS", logging.getLogger("tunecache.bitblas"))


def enabled(environ: Any = None) -> bool:
    return _hook.enabled(environ)


def activate() -> None:
    _hook.activate()
