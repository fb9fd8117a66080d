# Owns the TensorRT-LLM drop-in: patching AutoTunerProfilingCache.save_cache/load_cache and the
# cache check of autotune(cache_path=...) in tensorrt_llm._torch.autotuner so that ranks keep
# their autotuner cache in tunecached instead of a locked JSON file, and falling back to the
# original file code, with one warning, when the daemon cannot be reached.
"""TensorRT-LLM drop-in: ``import tunecache.integrations.trtllm as tt; tt.install()``.

After ``install()``, while the daemon (``$TUNECACHE_SOCKET`` or the default socket) answers,
the patched methods do what TensorRT-LLM's own file code does (the newest public copy, with
``shared`` plus ``rank_N`` sections; see docs/integrations.md), with the daemon as the file:

* ``AutoTunerProfilingCache.save_cache(file_path, rank)`` Records the rank's entries: those of
  the ops in ``independent_op`` (which, whatever its name, holds the ops whose distributed
  strategy is not INDEPENDENT) with no rank, the others under ``rank``; ops in ``excluded_op``
  are not saved. An ``enum.Enum`` tactic is saved as its value. The file at ``file_path`` is
  neither read, written nor locked.
* ``load_cache(file_path, rank)`` replaces the cache with the shared entries plus that rank's
  own (its own win on the same key), sets ``independent_op`` to the op names (``key[0]``) of the
  shared entries, and the metadata to the oldest saved one, as TensorRT-LLM's loader does:
  keys from ``ast.literal_eval(str(key))``, tactics from ``ast.literal_eval(repr(tactic))``
  (entries whose key or tactic that cannot read are skipped, as it skips them), ``runner_id``
  and ``min_time`` (ms, ``inf`` and ``nan`` included) with the types and float bits a JSON file
  would give back.
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
import enum
import functools
import importlib
import inspect
import json
import logging
import math
import os
import platform
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

from tunecache.client import (
    Client,
    Entry,
    Key,
    ProcessClient,
    Result,
    UntrustedSocketError,
    describe_problem,
    refused_entry_index,
)
from tunecache.errors import RpcError, StatusCode

logger = logging.getLogger("tunecache.trtllm")

AUTOTUNER_MODULE = "tensorrt_llm._torch.autotuner"
NAMESPACE = "trtllm"
# Entries per Record call: well under the daemon's batch limit.
RECORD_BATCH = 1000
# Strategies whose results every rank of a tuning group shares (DistributedTuningStrategy values).
INDEPENDENT_STRATEGY = "independent"
# Result.time_us of an entry whose min_time the daemon cannot order (inf, nan, negative, not a
# number): the largest finite time, so that any measured entry wins over it. Its exact value
# travels in the config's text fields.
UNORDERED_TIME_US = sys.float_info.max


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


class _Bridge(ProcessClient):
    """The daemon side of the patched methods: one client per process, one warning per process."""

    def __init__(self, module: Any, socket: Optional[str], timeout: float):
        super().__init__(socket, timeout)
        self.module = module

    def client(self) -> Client:
        try:
            return super().client()
        except (UntrustedSocketError, OSError, ValueError) as err:
            raise _DaemonUnreachable(str(err)) from err

    def warn_once(self, call: str, problem: Any) -> None:
        problem = describe_problem(problem)
        if self.first_warning():
            logger.warning(
                "tunecache: daemon at %s unreachable (%s: %s); TensorRT-LLM's autotuner cache uses "
                "its file instead. Further fallbacks in this process are logged at DEBUG.",
                self.socket_path,
                call,
                problem,
            )
        else:
            logger.debug("tunecache: %s fell back to the file: %s", call, problem)

    # --- strategy: which ops go to the shared section ------------------------------------------

    def shared_ops(self, profiling_cache: Any) -> Optional[set]:
        """The ops whose entries go to the shared section, as TensorRT-LLM's
        ``_partition_cache_by_strategy`` picks them: those in ``independent_op`` (the ops with a
        non-INDEPENDENT strategy, despite the name). None for releases before that section,
        which save every entry under the rank."""
        independent_op = getattr(profiling_cache, "independent_op", None)
        if independent_op is None:
            return None
        return set(independent_op)

    # --- save ------------------------------------------------------------------------------------

    def save(self, profiling_cache: Any, rank: int) -> None:
        metadata = _metadata_of(profiling_cache)
        device = device_key(metadata)
        metadata_json = json.dumps(metadata, separators=(",", ":"), default=str)
        tuned_by = f"{platform.node()} pid {os.getpid()} rank {rank} (tensorrt_llm drop-in)"
        now_ms = int(time.time() * 1000)
        shared_ops = self.shared_ops(profiling_cache)
        excluded_ops = set(getattr(profiling_cache, "excluded_op", None) or ())
        entries = []
        for key, value in list(profiling_cache.cache.items()):
            entry = _entry_of(key, value, rank, shared_ops, excluded_ops, metadata_json)
            if entry is None:
                continue
            entry.key.device = device
            entry.result.tuned_by = tuned_by
            entry.result.tuned_at_unix_ms = now_ms
            entries.append(entry)
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
            except RpcError as err:
                if err.code() != StatusCode.INVALID_ARGUMENT:
                    raise
                index = refused_entry_index(err)
                if index is None or not 0 <= index < len(batch):
                    raise
                refused = batch.pop(index)
                logger.warning(
                    "tunecache: the daemon refused the cache entry %s (%s); it is not saved",
                    refused.key.problem[:200],
                    err.details(),
                )

    # --- load ------------------------------------------------------------------------------------

    def load(self, profiling_cache: Any, rank: int, keep_when_empty: bool = False) -> int:
        """Replaces the cache with the daemon's shared entries and rank's own, as TensorRT-LLM's
        ``load_cache`` does with its file; returns how many. With ``keep_when_empty``, a daemon
        without entries for this device leaves the cache as it is (no file: nothing loaded)."""
        device = device_key(_metadata_of(profiling_cache))
        client = self.client()
        shared: Dict[Any, Tuple] = {}
        own: Dict[Any, Tuple] = {}
        oldest_metadata: Optional[Dict[str, Any]] = None
        for chunk in client.scan(namespace=NAMESPACE, device=device, rank=int(rank)):
            for entry in chunk:
                decoded = _decoded(entry)
                if decoded is None:
                    continue
                key, value, metadata = decoded
                (shared if not entry.key.HasField("rank") else own)[key] = value
                if metadata is not None and (
                    oldest_metadata is None
                    or _timestamp(metadata) < _timestamp(oldest_metadata)
                ):
                    oldest_metadata = metadata
        if keep_when_empty and not shared and not own:
            return 0
        if oldest_metadata is not None:
            _apply_metadata(profiling_cache, oldest_metadata)
        cache: Dict[Any, Tuple] = {}
        cache.update(shared)
        cache.update(own)
        # Their loader rebinds the dict (self.cache = {}), and so does this.
        profiling_cache.cache = cache
        if hasattr(profiling_cache, "independent_op"):
            profiling_cache.independent_op = {key[0] for key in shared}
        return len(cache)


def _tactic_text(tactic: Any) -> str:
    """The tactic as TensorRT-LLM's ``_serialize_cache_data`` writes it: ``repr``, of the value
    for an enum member (whose own repr is no literal)."""
    return repr(tactic.value if isinstance(tactic, enum.Enum) else tactic)


def _json_text(value: Any) -> str:
    """``value`` as ``json.dump(..., default=str)`` writes it into TensorRT-LLM's file."""
    return json.dumps(value, default=str)


def _entry_of(
    key: Any, value: Any, rank: int, shared_ops: Optional[set], excluded_ops: set, metadata_json: str
) -> Optional[Any]:
    """The daemon entry of one cache item (key.device, tuned_by and tuned_at left to the caller),
    or None, with a debug line, for one TensorRT-LLM would not save or could not read back."""
    try:
        op = key[0]  # their _partition_cache_by_strategy takes the op so
        if op in excluded_ops:
            return None
        runner_id, tactic, min_time = value
        problem = str(key)
        tactic_text = _tactic_text(tactic)
        # Their loader skips what it cannot literal_eval; such an entry is not worth a Record.
        ast.literal_eval(problem)
        ast.literal_eval(tactic_text)
        runner_id_text = _json_text(runner_id)
        min_time_text = _json_text(min_time)
        shared = shared_ops is not None and op in shared_ops
    except (ValueError, SyntaxError, TypeError, IndexError, KeyError, MemoryError, RecursionError) as err:
        logger.debug("tunecache: not recording %r: TensorRT-LLM could not save or load it (%s)", key, err)
        return None
    orderable = (
        isinstance(min_time, (int, float))
        and not isinstance(min_time, bool)
        and math.isfinite(min_time)
        and 0 <= min_time
    )
    time_us = float(min_time) * 1000.0 if orderable else UNORDERED_TIME_US
    if not math.isfinite(time_us):
        time_us = UNORDERED_TIME_US
    config = {
        # What the file holds (the JSON round trip), for readers of the cache such as
        # `tunecache export`; the loader reads the exact texts, which a re-serializing store
        # cannot re-format.
        "runner_id": json.loads(runner_id_text),
        "tactic": tactic_text,
        "min_time": min_time if orderable else None,
        "runner_id_text": runner_id_text,
        "min_time_text": min_time_text,
        "trtllm_metadata_json": metadata_json,
    }
    try:
        config_text = json.dumps(config, allow_nan=False)
    except ValueError:  # a runner_id holding inf or nan: only its text can carry it
        config["runner_id"] = None
        config_text = json.dumps(config, allow_nan=False)
    return Entry(
        key=Key(
            namespace=NAMESPACE,
            op=op if isinstance(op, str) else repr(op),
            problem=problem,
            rank=None if shared else int(rank),
        ),
        result=Result(config=config_text, time_us=time_us),
    )


def _timestamp(metadata: Dict[str, Any]) -> float:
    stamp = metadata.get("creation_timestamp")
    return float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else math.inf


def _apply_metadata(profiling_cache: Any, metadata: Dict[str, Any]) -> None:
    """Sets the metadata as their loader does from the file (``_deserialize_metadata``)."""
    try:
        deserialize = getattr(profiling_cache, "_deserialize_metadata", None)
        if callable(deserialize):
            deserialize(metadata)
        else:
            for name in ("lib_version", "creation_timestamp", "device_name", "device_capability"):
                setattr(profiling_cache, name, metadata[name])
    except Exception as err:  # the metadata is informative; the entries matter
        logger.debug("tunecache: metadata %r not applied: %s", metadata, err)


def _decoded(entry: Any) -> Optional[Tuple[Any, Tuple, Optional[Dict[str, Any]]]]:
    """(key, (runner_id, tactic, min_time), metadata) as TensorRT-LLM's loader builds them from
    its file, or None (with a debug line) for an entry its loader skips: a key or a tactic that
    ``ast.literal_eval`` cannot read. Where their loader would raise instead (a config without
    the fields, a literal too deep to parse), the entry is skipped too: a rank never fails here."""
    problem = entry.key.problem
    try:
        key = ast.literal_eval(problem)
        config = json.loads(entry.result.config)
        tactic_text = config["tactic"]
        if not isinstance(tactic_text, str):
            raise ValueError(f"tactic {tactic_text!r} is not the repr text the loader reads")
        tactic = ast.literal_eval(tactic_text)
        # The texts first: json.loads gives back what the file would (int or float bits, inf).
        runner_id_text = config.get("runner_id_text")
        runner_id = json.loads(runner_id_text) if isinstance(runner_id_text, str) else config["runner_id"]
        min_time_text = config.get("min_time_text")
        min_time = json.loads(min_time_text) if isinstance(min_time_text, str) else config.get("min_time")
        if min_time is None and not isinstance(min_time_text, str):
            min_time = entry.result.time_us / 1000.0
        hash(key)  # a dict key, as in their cache
        if not entry.key.HasField("rank"):
            key[0]  # their loader takes key[0] of every shared key (independent_op)
    except (ValueError, SyntaxError, TypeError, KeyError, IndexError, MemoryError, RecursionError) as err:
        logger.debug("tunecache: skipping cache entry %s: %s", problem[:200], err)
        return None
    metadata = None
    metadata_json = config.get("trtllm_metadata_json")
    if isinstance(metadata_json, str):
        try:
            parsed = json.loads(metadata_json)
            metadata = parsed if isinstance(parsed, dict) else None
        except ValueError:
            metadata = None
    return key, (runner_id, tactic, min_time), metadata


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
            except (_DaemonUnreachable, RpcError) as err:
                # Any daemon failure: the file is the safe place for this save.
                bridge.warn_once("save_cache", err)
            return original_save(self, file_path, rank)

        @functools.wraps(original_load)
        def load_cache(self: Any, file_path: Any, rank: int) -> None:
            try:
                bridge.load(self, rank)
                return None
            except (_DaemonUnreachable, RpcError) as err:
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
        # Without a file their autotune() loads nothing: a daemon without entries changes
        # nothing either.
        loaded = bridge.load(tuner.profiling_cache, rank, keep_when_empty=True)
        logger.info("tunecache: loaded %d autotuner cache entries for rank %s from the daemon", loaded, rank)
    except (_DaemonUnreachable, RpcError) as err:
        # No file either: TensorRT-LLM tunes as it would without a cache.
        bridge.warn_once("autotune", err)
