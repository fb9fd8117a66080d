# Owns the switch TUNECACHE_FLASHINFER=1: the package's tunecache-flashinfer.pth (installed beside
# it in site-packages, so every interpreter of that environment reads it at start) calls
# activate(), which, when the variable is set, installs the FlashInfer drop-in (flashinfer.py) as
# soon as `flashinfer.autotune_cache` has been imported, through the drop-ins' shared import hook
# (_import_hook.py). Without the variable it does nothing and imports nothing of FlashInfer.
"""``TUNECACHE_FLASHINFER=1``: install ``tunecache.integrations.flashinfer`` when FlashInfer's
managed autotune store is imported."""

from __future__ import annotations

import logging
from typing import Any

from tunecache.integrations._import_hook import InstallOnImport

ENV = "TUNECACHE_FLASHINFER"
MODULE = "flashinfer.autotune_cache"


def _install() -> None:
    from tunecache.integrations import flashinfer as drop_in

    drop_in.install()


_hook = InstallOnImport(ENV, MODULE, _install, "FlashInfer", logging.getLogger("tunecache.flashinfer"))


def enabled(environ: Any = None) -> bool:
    return _hook.enabled(environ)


def activate() -> None:
    _hook.activate()
