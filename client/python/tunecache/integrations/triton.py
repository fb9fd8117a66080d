# Owns the Triton drop-in: a TRITON_CACHE_MANAGER whose `<kernel>.autotune.json` files come from
# tunecached, so that one process on the node benchmarks each @triton.autotune kernel and key
# while the others wait for its result; every other file (compiled kernels, groups, overrides,
# dumps) goes to Triton's own FileCacheManager unchanged. Without a daemon, or past the wait
# bound, it is Triton's default manager, with one warning per process.
"""Triton drop-in: ``TRITON_CACHE_MANAGER=tunecache.integrations.triton:CacheManager``.

With autotune caching on (``TRITON_CACHE_AUTOTUNING=1``, or ``cache_results=True`` in
``@triton.autotune``), Triton's ``Autotuner.check_disk_cache`` asks its cache manager for
``<kernel>.autotune.json`` before it benchmarks, and puts that file after. This manager:

* ``get_file("<kernel>.autotune.json")`` returns the file from ``TRITON_CACHE_DIR`` when it is
  there (as the default manager does); else it Resolves the key ``namespace="triton"``,
  ``op=<kernel>``, ``device=<backend>|<arch>|warp<warp_size>`` (Triton's current target),
  ``problem=<the key Triton gave the manager>``. On a hit it writes the result into the cache
  directory and returns that path; when told to tune it returns None, so Triton benchmarks, and
  the ``put`` that follows Records the file's text under the lease, ``time_us`` the best config's
  time (Triton's milliseconds times 1000). Every other process waits in Resolve for that result.
  The lease is the Rust client's split lease (``begin_tune``, ``finish_tune``, ``abandon``): a
  Record that fails gives it up at once, except one past its deadline, which may still land.
* Everything else (``put``/``get_file`` of compiled kernels, ``get_group``/``put_group``, the
  override and dump managers) is Triton's ``FileCacheManager``: same directory, same files.
* When the daemon cannot be reached, or nobody has a result within the wait bound
  (``$TUNECACHE_TRITON_WAIT_MS``, default 120000), it behaves as the default manager with one
  warning per process. A holder that dies (even SIGKILL) hands the lease on: the daemon watches
  its pid, and one of the waiting processes tunes instead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import sys
import time
from typing import Any, Dict, Optional

from triton.runtime.cache import CacheManager as _TritonCacheManager
from triton.runtime.cache import FileCacheManager

from tunecache.client import Key, ProcessClient, Result, UntrustedSocketError, describe_problem
from tunecache.errors import RpcError

logger = logging.getLogger("tunecache.triton")

NAMESPACE = "triton"
AUTOTUNE_SUFFIX = ".autotune.json"
WAIT_ENV = "TUNECACHE_TRITON_WAIT_MS"
LEASE_ENV = "TUNECACHE_TRITON_LEASE_MS"
DEFAULT_WAIT_MS = 120_000
# Result.time_us when no config has a finite time (all failed): any measured result wins.
UNORDERED_TIME_US = sys.float_info.max
# Result.config = {"format": CONFIG_FORMAT, "autotune_json": <the file's exact text>}.
CONFIG_FORMAT = "triton-autotune-json-1"


class _Daemon(ProcessClient):
    """The default socket's client in this process, and its one warning."""

    def warn_once(self, what: str, problem: Any) -> None:
        problem = describe_problem(problem)
        if self.first_warning():
            logger.warning(
                "tunecache: %s (%s); Triton's autotune cache uses its own files in this process "
                "as it would without tunecache. Further fallbacks are logged at DEBUG.",
                what,
                problem,
            )
        else:
            logger.debug("tunecache: %s (%s)", what, problem)


_daemon = _Daemon()


def _env_ms(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


def _device() -> str:
    """Triton's current target as a Key.device, e.g. ``cuda|90|warp32`` or ``hip|gfx942|warp64``."""
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    return f"{target.backend}|{target.arch}|warp{target.warp_size}"


def _best_time_us(text: str) -> float:
    """The best config's time in microseconds, chosen as Triton chooses it (the least timing,
    timings compared as lists), from the file's ``configs_timings``."""
    document = json.loads(text)
    timings = [timing for _config, timing in document["configs_timings"]]
    best = min(timings)
    best_ms = best[0] if isinstance(best, (list, tuple)) else best
    time_us = float(best_ms) * 1000.0
    if not math.isfinite(time_us) or time_us < 0:
        return UNORDERED_TIME_US
    return time_us


class CacheManager(_TritonCacheManager):
    """Triton's ``CacheManager`` with ``*.autotune.json`` shared through tunecached; see the
    module doc. Constructed by Triton as ``CacheManager(key, override=False, dump=False)``."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._files = FileCacheManager(key, override=override, dump=dump)
        # The override and dump managers are Triton's files only.
        self._shares_autotune = not override and not dump
        # filename -> the TuneLease this process holds for it, until its put.
        self._leases: Dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        # cache_dir, lock_path, has_file, ... as the default manager has them.
        if name.startswith("__") or name == "_files":
            raise AttributeError(name)
        return getattr(self._files, name)

    # --- the CacheManager interface ---------------------------------------------------------------

    def get_file(self, filename: str) -> Optional[str]:
        local = self._files.get_file(filename)
        if local is not None or not self._is_autotune(filename):
            return local
        try:
            return self._resolve(filename)
        except Exception as err:  # never worse than Triton: its own behaviour instead
            _daemon.warn_once("tunecached could not be used", err)
            return None

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = self._files.put(data, filename, binary=binary)
        if self._is_autotune(filename):
            self._record(filename, data)
        return path

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        return self._files.get_group(filename)

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        return self._files.put_group(filename, group)

    # --- autotune files ---------------------------------------------------------------------------

    def _is_autotune(self, filename: str) -> bool:
        return self._shares_autotune and filename.endswith(AUTOTUNE_SUFFIX) and len(filename) > len(AUTOTUNE_SUFFIX)

    def _key(self, filename: str) -> Any:
        return Key(
            namespace=NAMESPACE,
            op=filename[: -len(AUTOTUNE_SUFFIX)],
            device=_device(),
            problem=self.key,
        )

    def _resolve(self, filename: str) -> Optional[str]:
        key = self._key(filename)
        try:
            client = _daemon.client()
            start = client.begin_tune(
                key, wait_ms=_env_ms(WAIT_ENV, DEFAULT_WAIT_MS), can_tune=True, lease_ms=_env_ms(LEASE_ENV, 0)
            )
        except (UntrustedSocketError, OSError, ValueError, RpcError) as err:
            _daemon.warn_once("tunecached unreachable", err)
            return None
        if start.kind == "tune":
            # Triton benchmarks now; the put that follows Records under this lease.
            self._leases[filename] = start.lease
            return None
        if start.kind == "hit":
            text = _autotune_text(start.result.config)
            if text is None:
                logger.debug("tunecache: %s holds no Triton autotune file; tuning here", key.problem)
                return None
            # Like a remote cache manager: the result becomes a file of this cache directory.
            return self._files.put(text, filename, binary=False)
        _daemon.warn_once(f"no tuned result for {filename} within the wait bound", start.reason)
        return None

    def _record(self, filename: str, data: Any) -> None:
        lease = self._leases.pop(filename, None)
        if lease is None:
            return  # tuned without a lease (daemon away, wait bound passed): files only
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else str(data)
            result = Result(
                config=json.dumps({"format": CONFIG_FORMAT, "autotune_json": text}),
                time_us=_best_time_us(text),
                tuned_by=f"{platform.node()} pid {os.getpid()} (triton cache manager)",
                tuned_at_unix_ms=int(time.time() * 1000),
            )
        except (ValueError, TypeError, KeyError, IndexError) as err:
            logger.warning("tunecache: %s is not a Triton autotune file (%s); not shared", filename, err)
            self._abandon(lease)
            return
        # The Rust client's finish_tune: a failed Record gives the lease up, except past its
        # deadline (that Record may still land), the same for every caller.
        try:
            finished = _daemon.client().finish_tune(lease, result)
        except Exception as err:  # could not even reach the daemon; the lease ends with us
            _daemon.warn_once("tunecached could not store an autotune result", err)
            return
        if finished.error is None:
            return
        if finished.refused:
            logger.warning("tunecache: the daemon refused %s (%s); it stays local", filename, finished.error.details())
        else:
            _daemon.warn_once("tunecached could not store an autotune result", finished.error)

    def _abandon(self, lease: Any) -> None:
        try:
            _daemon.client().abandon(lease)
        except Exception as err:
            logger.debug("tunecache: could not give the lease up (%s); it expires", err)

    def __del__(self) -> None:
        # Triton never got to put (its benchmark raised): let a waiting process tune now.
        leases = self.__dict__.get("_leases") or {}
        for lease in list(leases.values()):
            self._abandon(lease)
        leases.clear()


def _autotune_text(config: str) -> Optional[str]:
    try:
        document = json.loads(config)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("format") != CONFIG_FORMAT:
        return None
    text = document.get("autotune_json")
    return text if isinstance(text, str) else None
