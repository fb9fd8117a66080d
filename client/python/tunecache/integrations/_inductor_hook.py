# Owns the switch TUNECACHE_INDUCTOR=1: the package's tunecache-inductor.pth (installed beside it in
# site-packages, so every interpreter of that environment reads it at start) calls activate(),
# which, when the variable is set, installs the Inductor drop-in (inductor.py) as soon as the first
# of Inductor's cache modules has been imported, through the drop-ins' shared import hook
# (_import_hook.py); the drop-in's install() then patches each of them as it is imported. Without
# the variable it does nothing and imports nothing of torch.
"""``TUNECACHE_INDUCTOR=1``: install ``tunecache.integrations.inductor`` when Inductor's cache
modules are imported."""

from __future__ import annotations

import logging
from typing import Any

from tunecache.integrations._import_hook import InstallOnImport

ENV = "TUNECACHE_INDUCTOR"
# Any of them may be imported first (torch._inductor.codecache imports the other two).
MODULES = ("torch._inductor.runtime.autotune_cache", "torch._inductor.remote_cache", "torch._inductor.codecache")


def _install() -> None:
    from tunecache.integrations import inductor as drop_in

    drop_in.install()


_hooks = [InstallOnImport(ENV, module, _install, "Inductor", logging.getLogger("tunecache.inductor")) for module in MODULES]


def enabled(environ: Any = None) -> bool:
    return _hooks[0].enabled(environ)


def activate() -> None:
    for hook in _hooks:
        hook.activate()
