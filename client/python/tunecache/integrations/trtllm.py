# Owns the TensorRT-LLM drop-in: patching AutoTunerProfilingCache.save_cache/load_cache and the
# cache check of autotune(cache_path=...) in tensorrt_llm._torch.autotuner so that ranks keep
# their autotuner cache in tunecached instead of a locked JSON file, and falling back to the
# original file code, with one warning, when the daemon cannot be reached.
"""TensorRT-LLM drop-in: ``import tunecache.integrations.trtllm as tt; tt.install()``.

After ``install()``, while the daemon (``$TUNECACHE_SOCKET`` or the default socket) answers:

* ``AutoTunerProfilingCache.save_cache(file_path, rank)`` Records the rank's entries: ops whose
  distributed tuning strategy is shared (BROADCAST, MERGE, PARALLEL) with no rank, the others
  under ``rank``. The file at ``file_path`` is neither read, written nor locked.
* ``load_cache(file_path, rank)`` merges into the cache the shared entries plus that rank's own,
  as TensorRT-LLM's file loader would: keys from ``ast.literal_eval(str(key))``, tactics from
  ``ast.literal_eval(repr(tactic))``, ``runner_id`` and ``min_time`` (ms) with their exact types
  and float bits. Its own entries win over shared ones on the same key.
* ``autotune(cache_path=...)`` loads from the daemon even when no file exists at ``cache_path``,
  so a node without a cache file starts warm. The hook sits inside the context manager itself,
  so modules that did ``from tensorrt_llm._torch.autotuner import autotune`` before
  ``install()`` get it too.

Entries are keyed by ``Key.device = "<device_name>|sm_<major><minor>|trtllm <lib_version>"``,
the key ``tunecache import --format trtllm`` also uses, so another GPU's or another release's
tactics never win. When the daemon cannot be reached (or the default socket is not trusted),
the original methods run and one warning per process is logged.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import logging
import math
import os
import platform
import re
import threading
import time
from typing import Any, Dict, Optional, Tuple

import grpc

from tunecache.client import Client, UntrustedSocketError, pb

logger = logging.getLogger("tunecache.trtllm")

AUTOTUNER_MODULE = "tensorrt_llm._torch.autotuner"
NAMESPACE = "trtllm"
# Entries per Record call: well under the daemon's batch limit.
RECORD_BATCH = 1000
# Strategies whose results every rank of a tuning group shares (DistributedTuningStrategy values).
INDEPENDENT_STRATEGY = "independent"


class _DaemonUnreachable(Exception):
    """The daemon cannot be used for this call; the original method runs instead."""


def device_key(metadata: Dict[str, Any]) -> str:
    """``Key.device`` of a cache with this metadata (TensorRT-LLM's ``_serialize_metadata``):
    ``<device_name>|sm_<major><minor>|trtllm <lib_version>``."""
    major, minor = metadata["device_capability"]
    device = f"{metadata['device_name']}|sm_{int(major)}{int(minor)}"
    lib_version = metadata.get("lib_version")
    if isinstance(lib_version, str) and lib_version:
        device += f"|trtllm {lib_version}"
    return device


def _metadata_of(profiling_cache: Any) -> Dict[str, Any]:
    serialize = getattr(profiling_cache, "_serialize_metadata", None)
    if callable(serialize):
        return serialize()
    return {
        "lib_version": profiling_cache.lib_version,
        "creation_timestamp": profiling_cache.creation_timestamp,
        "device_name": profiling_cache.device_name,
        "device_capability": profiling_cache.device_capability,
    }


class _Bridge:
    """The daemon side of the patched methods: one client per process, one warning per process."""

    def __init__(self, module: Any, socket: Optional[str], timeout: float):
        self.module = module
        self.socket = socket
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._client_pid: Optional[int] = None
        self._warned_pid: Optional[int] = None

    def client(self) -> Client:
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                try:
                    self._client = Client(self.socket, timeout=self.timeout)
                except (UntrustedSocketError, OSError, ValueError) as err:
                    raise _DaemonUnreachable(str(err)) from err
                self._client_pid = os.getpid()
            return self._client

    def warn_once(self, call: str, problem: Any) -> None:
        with self._lock:
            first = self._warned_pid != os.getpid()
            self._warned_pid = os.getpid()
        socket = self._client.socket_path if self._client is not None else (self.socket or "default socket")
        if isinstance(problem, grpc.RpcError):
            problem = f"{problem.code()}: {problem.details()}"
        if first:
            logger.warning(
                "tunecache: daemon at %s unreachable (%s: %s); TensorRT-LLM's autotuner cache uses "
                "its file instead. Further fallbacks in this process are logged at DEBUG.",
                socket,
                call,
                problem,
            )
        else:
            logger.debug("tunecache: %s fell back to the file: %s", call, problem)

    # --- strategy: which ops go to the shared section ------------------------------------------

    def is_shared_op(self, op: str) -> bool:
        tuner_class = getattr(self.module, "AutoTuner", None)
        if tuner_class is None:
            return False
        strategies = getattr(tuner_class.get(), "_map_op_to_distributed_strategy", None) or {}
        strategy = strategies.get(op)
        if strategy is None:
            return False
        return getattr(strategy, "value", strategy) != INDEPENDENT_STRATEGY

    # --- save ------------------------------------------------------------------------------------

    def save(self, profiling_cache: Any, rank: int) -> None:
        metadata = _metadata_of(profiling_cache)
        device = device_key(metadata)
        metadata_json = json.dumps(metadata, separators=(",", ":"), default=str)
        tuned_by = f"{platform.node()} pid {os.getpid()} rank {rank} (tensorrt_llm drop-in)"
        now_ms = int(time.time() * 1000)
        entries = []
        for key, value in list(profiling_cache.cache.items()):
            runner_id, tactic, min_time = value
            if not isinstance(min_time, (int, float)) or not math.isfinite(min_time) or min_time < 0:
                logger.debug("tunecache: not recording %s: min_time %r is not a finite time", key, min_time)
                continue
            op = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else ""
            if not op:
                logger.debug("tunecache: not recording %r: the key is not a (custom_op, ...) tuple", key)
                continue
            config = {
                "runner_id": runner_id,
                "tactic": repr(tactic),
                "min_time": min_time,
                # The exact text, which a re-serializing store cannot re-format.
                "min_time_text": json.dumps(min_time),
                "trtllm_metadata_json": metadata_json,
            }
            entries.append(
                pb.Entry(
                    key=pb.Key(
                        namespace=NAMESPACE,
                        op=op,
                        device=device,
                        problem=str(key),
                        rank=None if self.is_shared_op(op) else int(rank),
                    ),
                    result=pb.Result(
                        config=json.dumps(config),
                        time_us=float(min_time) * 1000.0,
                        tuned_by=tuned_by,
                        tuned_at_unix_ms=now_ms,
                    ),
                )
            )
        client = self.client()
        for start in range(0, len(entries), RECORD_BATCH):
            self._record_keeping_the_valid(client, entries[start : start + RECORD_BATCH])

    def _record_keeping_the_valid(self, client: Client, batch: list) -> None:
        """An entry the daemon refuses (INVALID_ARGUMENT names its index) is dropped with a
        warning and the rest sent again."""
        while batch:
            try:
                client.record(batch)
                return
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                match = re.match(r"entries\[(\d+)\]", err.details() or "")
                index = int(match.group(1)) if match else -1
                if not 0 <= index < len(batch):
                    raise
                refused = batch.pop(index)
                logger.warning(
                    "tunecache: the daemon refused the cache entry %s (%s); it is not saved",
                    refused.key.problem[:200],
                    err.details(),
                )

    # --- load ------------------------------------------------------------------------------------

    def load(self, profiling_cache: Any, rank: int) -> int:
        """Merges the daemon's shared entries and rank's own into the cache; returns how many."""
        device = device_key(_metadata_of(profiling_cache))
        client = self.client()
        shared: Dict[Tuple, Tuple] = {}
        own: Dict[Tuple, Tuple] = {}
        for chunk in client.scan(namespace=NAMESPACE, device=device, rank=int(rank)):
            for entry in chunk:
                decoded = _decoded(entry)
                if decoded is None:
                    continue
                key, value = decoded
                (shared if not entry.key.HasField("rank") else own)[key] = value
        profiling_cache.cache.update(shared)
        profiling_cache.cache.update(own)
        return len(shared) + len(own)


def _decoded(entry: Any) -> Optional[Tuple[Tuple, Tuple]]:
    """(key, (runner_id, tactic, min_time)) as TensorRT-LLM's loader builds them, or None (with
    a debug line) for an entry its loader could not read either."""
    problem = entry.key.problem
    try:
        key = ast.literal_eval(problem)
        config = json.loads(entry.result.config)
        runner_id = config["runner_id"]
        tactic_text = config["tactic"]
        if not isinstance(tactic_text, str):
            raise ValueError(f"tactic {tactic_text!r} is not the repr text the loader reads")
        tactic = ast.literal_eval(tactic_text)
        min_time_text = config.get("min_time_text")
        # The text first: json.loads gives back the int or the float bits that were written.
        min_time = json.loads(min_time_text) if isinstance(min_time_text, str) else config.get("min_time")
        if min_time is None:
            min_time = entry.result.time_us / 1000.0
    except (ValueError, SyntaxError, TypeError, KeyError, MemoryError, RecursionError) as err:
        logger.debug("tunecache: skipping cache entry %s: %s", problem[:200], err)
        return None
    return key, (runner_id, tactic, min_time)


# --- installing the patches ------------------------------------------------------------------------

_installed: Dict[str, Any] = {}
_install_lock = threading.Lock()


def install(socket: Optional[str] = None, timeout: float = 5.0) -> None:
    """Patches TensorRT-LLM's autotuner cache to use tunecached (see the module doc). Idempotent;
    call it once per process, before or after TensorRT-LLM's own modules are imported.
    ``socket``: the daemon's socket (default: ``$TUNECACHE_SOCKET``, then the default path)."""
    with _install_lock:
        if _installed:
            return
        module = importlib.import_module(AUTOTUNER_MODULE)
        bridge = _Bridge(module, socket, timeout)
        cache_class = module.AutoTunerProfilingCache
        original_save = cache_class.save_cache
        original_load = cache_class.load_cache

        @functools.wraps(original_save)
        def save_cache(self: Any, file_path: Any, rank: int) -> None:
            try:
                bridge.save(self, rank)
                return None
            except (_DaemonUnreachable, grpc.RpcError) as err:
                # Any daemon failure: the file is the safe place for this save.
                bridge.warn_once("save_cache", err)
            return original_save(self, file_path, rank)

        @functools.wraps(original_load)
        def load_cache(self: Any, file_path: Any, rank: int) -> None:
            try:
                bridge.load(self, rank)
                return None
            except (_DaemonUnreachable, grpc.RpcError) as err:
                bridge.warn_once("load_cache", err)
            return original_load(self, file_path, rank)

        cache_class.save_cache = save_cache
        cache_class.load_cache = load_cache
        _installed.update(
            module=module,
            bridge=bridge,
            cache_class=cache_class,
            originals=(original_save, original_load),
        )
        _hook_autotune(module, bridge)


def uninstall() -> None:
    """Undoes ``install()`` (for tests and for switching sockets)."""
    with _install_lock:
        if not _installed:
            return
        original_save, original_load = _installed["originals"]
        _installed["cache_class"].save_cache = original_save
        _installed["cache_class"].load_cache = original_load
        unhook = _installed.get("unhook")
        if unhook is not None:
            unhook()
        _installed.clear()


def _hook_autotune(module: Any, bridge: _Bridge) -> None:
    """Makes ``autotune(cache_path=...)`` load from the daemon when no file exists there.

    ``autotune`` is a ``contextlib.contextmanager``: every binding of it, ``from ... import
    autotune`` included, is the same helper whose closure holds the generator function. Swapping
    that closure cell reaches every binding, where replacing the module attribute would not."""
    helper = getattr(module, "autotune", None)
    generator_function = getattr(helper, "__wrapped__", None)
    cells = getattr(helper, "__closure__", None) or ()
    cell = next((c for c in cells if c.cell_contents is generator_function), None)
    if generator_function is None or cell is None:
        logger.warning(
            "tunecache: %s.autotune is not the contextmanager this drop-in knows; a node without "
            "a cache file at cache_path will start cold",
            AUTOTUNER_MODULE,
        )
        return
    signature = inspect.signature(generator_function)

    @functools.wraps(generator_function)
    def autotune_with_daemon(*args: Any, **kwargs: Any):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        cache_path = bound.arguments.get("cache_path")
        if cache_path is not None and not os.path.exists(cache_path):
            _load_without_file(module, bridge, bound.arguments)
        return (yield from generator_function(*args, **kwargs))

    cell.cell_contents = autotune_with_daemon

    def unhook() -> None:
        cell.cell_contents = generator_function

    _installed["unhook"] = unhook


def _load_without_file(module: Any, bridge: _Bridge, arguments: Dict[str, Any]) -> None:
    tuner = module.AutoTuner.get()
    rank = arguments["rank"] if "rank" in arguments else tuner.mapping.rank
    try:
        loaded = bridge.load(tuner.profiling_cache, rank)
        logger.info("tunecache: loaded %d autotuner cache entries for rank %s from the daemon", loaded, rank)
    except (_DaemonUnreachable, grpc.RpcError) as err:
        # No file either: TensorRT-LLM tunes as it would without a cache.
        bridge.warn_once("autotune", err)
