# Owns the start-up switch every environment-variable drop-in shares (TUNECACHE_BITBLAS=1,
# TUNECACHE_FLASHINFER=1): a .pth file of the package, which site runs at every interpreter
# start, calls activate() of the drop-in's hook; when the variable is set, the drop-in's
# install() runs as soon as the framework's module has been imported (at once if it already
# is), so that a launcher turns it on without code changes. Without the variable it does nothing
# and imports nothing of the framework.
"""An import hook that installs a drop-in when its framework module is first imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from typing import Any, Callable, Optional


def switched_on(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


class InstallOnImport:
    """``install()`` once ``module`` is imported, when ``env`` is set (see the module doc)."""

    def __init__(self, env: str, module: str, install: Callable[[], None], what: str, logger: logging.Logger):
        self.env = env
        self.module = module
        self._install = install
        self.what = what
        self.logger = logger
        self._lock = threading.Lock()
        self._finder: Optional[_Finder] = None

    def enabled(self, environ: Any = None) -> bool:
        return switched_on((os.environ if environ is None else environ).get(self.env, ""))

    def activate(self) -> None:
        """Installs the drop-in now if the module is imported already, else right after its
        import. Never raises: a problem here must not stop the interpreter (it is logged)."""
        try:
            if self.enabled():
                self.watch()
        except Exception as err:  # noqa: BLE001 - see the docstring
            self.logger.warning("tunecache: %s=1 but the %s drop-in could not be set up: %s", self.env, self.what, err)

    def watch(self) -> None:
        """Installs the drop-in now if the module is imported already, else right after its
        import, whatever the variable says (a drop-in's own install() before the import)."""
        with self._lock:
            if self.module in sys.modules:
                install_now = True
            else:
                install_now = False
                if self._finder is None:
                    self._finder = _Finder(self)
                    sys.meta_path.insert(0, self._finder)
        if install_now:
            self._install()

    def installed_after_import(self) -> None:
        try:
            self._install()
        except Exception as err:  # noqa: BLE001 - the framework itself works; it runs as stock
            self.logger.warning("tunecache: %s=1 but the %s drop-in could not be installed: %s", self.env, self.what, err)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the module with the other finders and wraps its loader, so that install() runs once
    the module has run. One-shot: it leaves sys.meta_path at the module's first import."""

    def __init__(self, hook: InstallOnImport):
        self.hook = hook

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != self.hook.module:
            return None
        with self.hook._lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _InstallingLoader(spec.loader, self.hook)
        return spec


class _InstallingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: InstallOnImport):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any):
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._hook.installed_after_import()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
