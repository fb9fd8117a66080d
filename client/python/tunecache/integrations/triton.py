# Owns the Triton drop-in: a TRITON_CACHE_MANAGER that shares two kinds of Triton cache files
# through tunecached. `<kernel>.autotune.json`: one process on the node benchmarks each
# @triton.autotune kernel and key while the others wait for its result. Compiled-kernel groups
# (`__grp__<name>.json` and the files it names): one process compiles each kernel key while the
# others wait, then fetch its files (artifacts, verified) into their own TRITON_CACHE_DIR, laid out
# as Triton's FileCacheManager lays them out. The override and dump managers are Triton's own
# FileCacheManager unchanged. Without a daemon, or past the wait bound, it is Triton's default
# manager, with one warning per process.
"""Triton drop-in: ``TRITON_CACHE_MANAGER=tunecache.integrations.triton:CacheManager``.

Triton builds one manager per cache key (``get_cache_manager(hash)``) and calls it from two
places; this manager serves both through the daemon, keyed ``namespace="triton"``,
``device=<backend>|<arch>|warp<warp_size>`` (Triton's current target), ``problem=<the key Triton
gave the manager>``:

* **Autotune results** (``TRITON_CACHE_AUTOTUNING=1``, or ``cache_results=True``):
  ``Autotuner.check_disk_cache`` asks for ``<kernel>.autotune.json`` before it benchmarks, and
  puts that file after. ``get_file`` returns the file from ``TRITON_CACHE_DIR`` when it is there;
  else it Resolves ``op=<kernel>``. On a hit it writes the result into the cache directory and
  returns that path; when told to tune it returns None, so Triton benchmarks, and the ``put`` that
  follows Records the file's text under the lease, ``time_us`` the best config's time (Triton's
  milliseconds times 1000).
* **Compiled kernels**: ``compiler.compile`` asks ``get_group("<name>.json")`` first; on a miss
  it compiles, ``put``s each stage's file (``.source``, ``.ttir`` ... ``.cubin``, then the
  metadata ``.json``) and ends with ``put_group("<name>.json", {file: path})``, which writes
  ``__grp__<name>.json``. ``get_group`` returns the local group when every file is there; else it
  Resolves ``op="compiled-kernel"`` (no kernel name can be spelled so). When told to compile it
  returns None, so Triton compiles, and the final ``put_group`` uploads every file of the group
  as an artifact and Records them under the lease (``config`` names the group and its files in
  order). Every other process waits in Resolve, then fetches the files into a temporary
  directory of its cache directory, verified, renames each to its name there and writes its own
  ``__grp__`` file last, byte for byte what ``FileCacheManager.put_group`` writes. An entry whose
  files cannot be fetched is compiled here, as on a miss. A process with ``TRITON_KERNEL_OVERRIDE``,
  ``TRITON_KERNEL_DUMP`` or ``TRITON_ALWAYS_COMPILE`` on compiles with its own files only: its
  kernels reach no other process, and its dumps are written as stock Triton writes them.
* The lease is the Rust client's split lease (``begin_tune``, ``finish_tune``, ``abandon``): a
  Record that fails gives it up at once, except one past its deadline, which may still land. A
  holder that dies (even SIGKILL) hands the lease on (the daemon watches its pid); one whose
  benchmark or compilation raises gives it up when Triton drops the manager.
* The override and dump managers (``override=True``/``dump=True``) are Triton's
  ``FileCacheManager``: same directory, same files, nothing sent to the daemon. With
  ``TRITON_KERNEL_OVERRIDE`` on, autotune results stay local too.
* When the daemon cannot be reached, or nobody has a result within the wait bound
  (``$TUNECACHE_TRITON_WAIT_MS``, default 120000), it behaves as the default manager with one
  warning per process.
* Replay (``TUNECACHE_MODE=replay``): a cached autotune result or compiled kernel is served; on
  a miss ``get_file``/``get_group`` answer None at once (no wait, no lease), so Triton runs its
  own benchmark or compile, and its ``put``/``put_group`` keep the files local, as the default
  manager does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from triton import knobs
from triton.runtime.cache import CacheManager as _TritonCacheManager
from triton.runtime.cache import FileCacheManager

from tunecache.client import DEFAULT_TIMEOUT_S, Key, Result
from tunecache.errors import ArtifactError, RpcError
from tunecache.integrations._base import Daemon, DaemonUnreachable, env_ms, tuned_by

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
# The op of compiled-kernel groups: autotune entries use the kernel's name, a Python identifier,
# which can never contain "-", so the two never share a key.
GROUP_OP = "compiled-kernel"
# Triton's FileCacheManager names a group's file "__grp__" + the name compile() gives it.
GROUP_PREFIX = "__grp__"
# Result.config = {"format": GROUP_FORMAT, "group": "<name>.json", "child_paths": [[file, artifact
# name], ...]}: the group JSON in Triton's shape with artifact names for the paths, as a list so
# that the order of the files (which is the order of the __grp__ file's keys) survives any
# re-spelling of the JSON.
GROUP_FORMAT = "triton-compiled-group-1"
# Every compile of one key gives the same files, so no result is better than another: equal
# times make the merge rule order them by config, the same on every node.
GROUP_TIME_US = 0.0
# A result's provenance names this drop-in.
TUNER = "triton cache manager"


def _make_daemon(timeout: float = DEFAULT_TIMEOUT_S) -> Daemon:
    """The default socket's client in this process, and its one warning."""
    return Daemon(
        logger,
        "%(what)s (%(problem)s); Triton's cache (autotune results, compiled kernels) uses its own "
        "files in this process as it would without tunecache. Further fallbacks are logged at DEBUG.",
        "%(what)s (%(problem)s)",
        timeout=timeout,
    )


_daemon = _make_daemon()


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
    """Triton's ``CacheManager`` with ``*.autotune.json`` files and compiled-kernel groups
    shared through tunecached; see the module doc. Constructed by Triton as
    ``CacheManager(key, override=False, dump=False)``."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._files = FileCacheManager(key, override=override, dump=dump)
        # The override and dump managers are Triton's files only.
        self._shares = not override and not dump
        # ("autotune", filename) or ("group", filename) -> the TuneLease this process holds for
        # it, until its put (autotune) or put_group (group).
        self._leases: Dict[Tuple[str, str], Any] = {}

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
        local = self._files.get_group(filename)
        if local is not None or not self._shares_groups():
            return local
        try:
            return self._resolve_group(filename)
        except Exception as err:  # never worse than Triton: it compiles
            _daemon.warn_once("tunecached could not be used", err)
            return None

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        path = self._files.put_group(filename, group)
        lease = self._leases.pop(("group", filename), None)
        if lease is not None:
            self._share_group(filename, group, lease)
        return path

    # --- autotune files ---------------------------------------------------------------------------

    def _is_autotune(self, filename: str) -> bool:
        # Timings of overridden kernels (TRITON_KERNEL_OVERRIDE) are not the key's either.
        return (
            self._shares
            and not getattr(knobs.compilation, "override", False)
            and filename.endswith(AUTOTUNE_SUFFIX)
            and len(filename) > len(AUTOTUNE_SUFFIX)
        )

    def _key(self, filename: str) -> Any:
        return Key(
            namespace=NAMESPACE,
            op=filename[: -len(AUTOTUNE_SUFFIX)],
            device=_device(),
            problem=self.key,
        )

    def _begin(self, kind: str, key: Any, filename: str, missing: str) -> Any:
        """Resolves ``key`` for ``filename``: the result of a hit, else None and Triton does the
        work itself. When this process holds the lease, Triton benchmarks or compiles now and its
        ``put`` (autotune) or ``put_group`` (group) that follows Records under the lease kept here;
        when nobody has a result within the wait bound (``missing``), or the daemon cannot be
        asked, it is warned."""
        start = _daemon.begin(key, wait_ms=env_ms(WAIT_ENV, DEFAULT_WAIT_MS), lease_ms=env_ms(LEASE_ENV, 0),
                              what="tunecached unreachable")
        if start is None:
            return None
        if start.kind == "tune":
            self._leases[(kind, filename)] = start.lease
            return None
        if start.kind == "miss":
            # In replay a miss is answered at once and logged once per key by the client:
            # Triton benchmarks or compiles as it would without tunecache.
            if not _daemon.replaying():
                _daemon.warn_once(f"no {missing} for {filename} within the wait bound", start.reason)
            return None
        return start.result

    def _resolve(self, filename: str) -> Optional[str]:
        key = self._key(filename)
        result = self._begin("autotune", key, filename, "tuned result")
        if result is None:
            return None
        text = _autotune_text(result.config)
        if text is None:
            logger.debug("tunecache: %s holds no Triton autotune file; tuning here", key.problem)
            return None
        # Like a remote cache manager: the result becomes a file of this cache directory.
        return self._files.put(text, filename, binary=False)

    def _record(self, filename: str, data: Any) -> None:
        lease = self._leases.pop(("autotune", filename), None)
        if lease is None:
            return  # tuned without a lease (daemon away, wait bound passed): files only
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else str(data)
            result = Result(
                config=json.dumps({"format": CONFIG_FORMAT, "autotune_json": text}),
                time_us=_best_time_us(text),
                tuned_by=tuned_by(TUNER),
                tuned_at_unix_ms=int(time.time() * 1000),
            )
        except (ValueError, TypeError, KeyError, IndexError) as err:
            logger.warning("tunecache: %s is not a Triton autotune file (%s); not shared", filename, err)
            _daemon.give_up(lease)
            return
        _finish(lease, result, filename, "an autotune result")

    # --- compiled-kernel groups -------------------------------------------------------------------

    def _shares_groups(self) -> bool:
        """Whether this compile goes through the daemon. Not in a process that overrides kernels
        (TRITON_KERNEL_OVERRIDE: its kernels are not the key's, and must reach no other process)
        or dumps them (TRITON_KERNEL_DUMP: compile() dumps only what it compiles, so a fetched
        group would leave no dump where stock Triton writes one), nor with TRITON_ALWAYS_COMPILE
        (compile() ignores the cache: nothing to wait for). Overrides and dumps are not in
        Triton's cache key, so the daemon cannot tell these compiles apart."""
        compilation = knobs.compilation
        return self._shares and not (
            getattr(compilation, "override", False)
            or getattr(compilation, "dump_ir", False)
            or getattr(compilation, "always_compile", False)
        )

    def _group_key(self) -> Any:
        return Key(namespace=NAMESPACE, op=GROUP_OP, device=_device(), problem=self.key)

    def _resolve_group(self, filename: str) -> Optional[Dict[str, str]]:
        result = self._begin("group", self._group_key(), filename, "compiled kernel")
        if result is None:
            return None
        # A process sharing this cache directory may have written the group while we waited.
        local = self._files.get_group(filename)
        if local is not None:
            return local
        try:
            return self._materialize_group(filename, result)
        except (ArtifactError, RpcError, OSError, ValueError) as err:
            # The entry is there but its files are not to be had (collected, a tier down):
            # compile here, as on a miss.
            _daemon.warn_once(f"could not fetch the compiled kernel {filename}; compiling it here", err)
            return None

    def _materialize_group(self, filename: str, result: Any) -> Optional[Dict[str, str]]:
        """Writes the group ``result`` names into this cache directory as FileCacheManager would
        have: each file renamed into place from a temporary directory of the cache directory
        (Triton's own ``tmp.pid_<pid>_<uuid>`` spelling), then the ``__grp__`` file last, so
        that a reader never finds a group whose files are missing. None when the result is not
        such a group (then Triton compiles)."""
        children = _group_children(result.config, filename)
        if children is None or sorted(name for _child, name in children) != sorted(a.name for a in result.artifacts):
            logger.debug("tunecache: %s holds no Triton group for %s; compiling here", self.key, filename)
            return None
        temp_dir = os.path.join(self._files.cache_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
        os.makedirs(temp_dir)
        try:
            _daemon.client().fetch_artifacts(result, temp_dir)
            group = {}
            for child, name in children:
                path = self._files._make_path(child)
                os.replace(os.path.join(temp_dir, name), path)
                group[child] = path
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
        self._files.put_group(filename, group)
        return self._files.get_group(filename)

    def _share_group(self, filename: str, group: Dict[str, str], lease: Any) -> None:
        """Uploads every file of the group compile() just put and Records them under ``lease``;
        on any failure the lease is given up (a waiter compiles), the files stay local."""
        children = list(group.items())
        if not children or any(not _plain_file_name(child) for child, _path in children):
            logger.warning("tunecache: the group %s names files outside its directory; not shared", filename)
            _daemon.give_up(lease)
            return
        try:
            client = _daemon.client()
            try:
                artifacts = client.put_artifacts([(child, path) for child, path in children])
                names = [child for child, _path in children]
            except ArtifactError:
                # A file name the artifact rules refuse (over 128 bytes, a byte outside
                # [A-Za-z0-9._-]): numbered names instead; the config keeps the file names.
                names = [str(index) for index in range(len(children))]
                artifacts = client.put_artifacts([(name, path) for name, (_child, path) in zip(names, children)])
        except (ArtifactError, RpcError, OSError, ValueError, DaemonUnreachable) as err:
            _daemon.warn_once(f"could not upload the compiled kernel {filename}", err)
            _daemon.give_up(lease)
            return
        config = json.dumps(
            {
                "format": GROUP_FORMAT,
                "group": filename,
                "child_paths": [[child, name] for (child, _path), name in zip(children, names)],
            }
        )
        result = Result(
            config=config,
            time_us=GROUP_TIME_US,
            tuned_by=tuned_by(TUNER),
            tuned_at_unix_ms=int(time.time() * 1000),
            artifacts=artifacts,
        )
        _finish(lease, result, filename, "a compiled kernel")

    def __del__(self) -> None:
        # Triton never got to put or put_group (its benchmark or compilation raised, and the
        # exception dropped this manager): let a waiting process tune or compile now.
        leases = self.__dict__.get("_leases") or {}
        for lease in list(leases.values()):
            _daemon.give_up(lease)
        leases.clear()


def _finish(lease: Any, result: Any, filename: str, what: str) -> None:
    """Records ``result`` under ``lease`` with the base's finish (the Rust client's finish_tune:
    a failed Record gives the lease up, except past its deadline, when it may still land)."""
    _daemon.finish(
        lease,
        result,
        what=f"tunecached could not store {what}",
        refused=lambda error: logger.warning(
            "tunecache: the daemon refused %s (%s); it stays local", filename, error.details()
        ),
    )


def _plain_file_name(name: Any) -> bool:
    """A name FileCacheManager keeps inside its directory (compile() names files
    ``<kernel>.<ext>``): a waiter writes it there, so nothing else is accepted."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and not name.startswith(GROUP_PREFIX)
    )


def _group_children(config: str, filename: str) -> Optional[List[Tuple[str, str]]]:
    """The (file name, artifact name) pairs of a group Result.config for ``filename``, in the
    order compile() put them; None when the config is not one."""
    try:
        document = json.loads(config)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("format") != GROUP_FORMAT or document.get("group") != filename:
        return None
    pairs = document.get("child_paths")
    if not isinstance(pairs, list) or not pairs:
        return None
    children = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and _plain_file_name(pair[0]) and isinstance(pair[1], str)):
            return None
        children.append((pair[0], pair[1]))
    if len({child for child, _name in children}) != len(children):
        return None
    return children


def _autotune_text(config: str) -> Optional[str]:
    try:
        document = json.loads(config)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("format") != CONFIG_FORMAT:
        return None
    text = document.get("autotune_json")
    return text if isinstance(text, str) else None
