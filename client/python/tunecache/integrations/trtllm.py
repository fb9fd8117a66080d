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
  and ``min_time`` with the types and float bits a JSON file would give back.
* ``autotune(cache_path=...)`` loads from the daemon even when no file exists at ``cache_path``,
  so a node without a cache file starts warm. The hook sits inside the context manager itself,
  so modules that did ``from tensorrt_llm._torch.autotuner import autotune`` before
  ``install()`` get it too.

Which entries are saved, and how an entry maps to the daemon's and back, is one rule in Rust, the
``tunecache-trtllm`` crate's (``client/trtllm/src/entry.rs``), called through the binding: this
module hands it what TensorRT-LLM's writer would put in a file (``str(key)`` and the value's
``json.dumps``) and gets entries to Record; for a load it gets, per entry, the value text
TensorRT-LLM's loader would read from a file. So the drop-in, ``tunecache import --format
trtllm`` and ``tunecache export --format trtllm`` accept and refuse the same entries: an entry is
saved only when TensorRT-LLM could have written it (its ``min_time`` finite and non-negative,
``runner_id`` a non-negative integer, ``key[0]`` a non-empty str, the tactic a literal); any other
is skipped with a debug line, as TensorRT-LLM's loader skips what it cannot read.

Replay (``TUNECACHE_MODE=replay``): ``load_cache`` and ``autotune(cache_path=...)`` load the
daemon's entries as above; a shape with no entry is a miss of TensorRT-LLM's own in-memory cache,
answered at once with its default (fallback) tactic when it is not tuning, with no wait and no
lease; ``save_cache`` sends and writes nothing.

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
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

from tunecache import _native
from tunecache.errors import RpcError
from tunecache.integrations._base import Daemon, DaemonUnreachable, tuned_by

logger = logging.getLogger("tunecache.trtllm")

AUTOTUNER_MODULE = "tensorrt_llm._torch.autotuner"
NAMESPACE = "trtllm"
# Strategies whose results every rank of a tuning group shares (DistributedTuningStrategy values).
INDEPENDENT_STRATEGY = "independent"


def device_key(metadata: Dict[str, Any]) -> str:
    """``Key.device`` of a cache with this metadata (TensorRT-LLM's ``_serialize_metadata``):
    ``<device_name>|sm_<major><minor>|trtllm <lib_version>``, by the rule the CLI's import uses.
    Raises ValueError for metadata that names no device."""
    return _native.trtllm_device(_metadata_text(metadata))


def _metadata_text(metadata: Dict[str, Any]) -> str:
    """The metadata as TensorRT-LLM's writer puts it in the file (``json.dump(default=str)``)."""
    return json.dumps(metadata, separators=(",", ":"), default=str)


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


class _Bridge(Daemon):
    """The daemon side of the patched methods: one client per process, one warning per process."""

    def __init__(self, module: Any, socket: Optional[str], timeout: float):
        super().__init__(
            logger,
            "daemon at %(socket)s unreachable (%(what)s: %(problem)s); TensorRT-LLM's autotuner cache "
            "uses its file instead. Further fallbacks in this process are logged at DEBUG.",
            "%(what)s fell back to the file: %(problem)s",
            socket,
            timeout,
        )
        self.module = module

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
        if self.replaying():
            # Replay serves only what is cached; its misses ran TensorRT-LLM's default tactic.
            logger.debug("tunecache: replay: save_cache sends nothing")
            return
        metadata_json = _metadata_text(_metadata_of(profiling_cache))
        shared_ops = self.shared_ops(profiling_cache)
        excluded_ops = set(getattr(profiling_cache, "excluded_op", None) or ())
        items = []
        for key, value in list(profiling_cache.cache.items()):
            item = _file_item(key, value, rank, shared_ops, excluded_ops)
            if item is not None:
                items.append(item)
        provenance = tuned_by("tensorrt_llm drop-in", rank)
        try:
            entries, refused = _native.trtllm_entries(metadata_json, items, provenance, int(time.time() * 1000))
        except ValueError as err:  # metadata without a device: the file is the place for it
            raise DaemonUnreachable(str(err)) from err
        for key_text, reason in refused:
            logger.debug("tunecache: not recording %s: %s", key_text[:200], reason)
        # Every valid entry is stored: the Rust client sets aside what the daemon refuses and
        # splits a batch over its message size.
        kept = self.client().record_keeping_valid(entries)
        for _index, entry, error in kept.refused:
            logger.warning(
                "tunecache: the daemon refused the cache entry %s (%s); it is not saved",
                entry.key.problem[:200],
                error.details(),
            )

    # --- load ------------------------------------------------------------------------------------

    def load(self, profiling_cache: Any, rank: int, keep_when_empty: bool = False) -> int:
        """Replaces the cache with the daemon's shared entries and rank's own, as TensorRT-LLM's
        ``load_cache`` does with its file; returns how many. With ``keep_when_empty``, a daemon
        without entries for this device leaves the cache as it is (no file: nothing loaded)."""
        try:
            device = device_key(_metadata_of(profiling_cache))
        except ValueError as err:
            raise DaemonUnreachable(str(err)) from err
        client = self.client()
        scanned = [entry for chunk in client.scan(namespace=NAMESPACE, device=device, rank=int(rank)) for entry in chunk]
        # What a file exported from these entries would hold, by the CLI's export rule.
        values, refused, metadata_json = _native.trtllm_file_values(scanned)
        for problem, reason in refused:
            logger.debug("tunecache: skipping cache entry %s: %s", problem[:200], reason)
        shared: Dict[Any, Tuple] = {}
        own: Dict[Any, Tuple] = {}
        for problem, entry_rank, value_json in values:
            loaded = _loaded(problem, value_json, entry_rank is None)
            if loaded is not None:
                key, value = loaded
                (shared if entry_rank is None else own)[key] = value
        if keep_when_empty and not shared and not own:
            return 0
        if metadata_json is not None:
            _apply_metadata(profiling_cache, json.loads(metadata_json))
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


def _file_item(
    key: Any, value: Any, rank: int, shared_ops: Optional[set], excluded_ops: set
) -> Optional[Tuple[str, str, Optional[int]]]:
    """``(str(key), value JSON, rank or None for shared)``: the file entry TensorRT-LLM's writer
    would make of one cache item, for the Rust mapping to accept or refuse; None (with a debug
    line) for one it does not save or could not write at all."""
    try:
        op = key[0]  # their _partition_cache_by_strategy takes the op so
        if op in excluded_ops:
            return None
        shared = shared_ops is not None and op in shared_ops
    except Exception:  # no op to partition by: the mapping refuses such a key
        shared = False
    try:
        runner_id, tactic, min_time = value
        # As their json.dump(..., default=str) writes the entry's value.
        value_json = json.dumps({"runner_id": runner_id, "tactic": _tactic_text(tactic), "min_time": min_time}, default=str)
        key_text = str(key)
    except Exception as err:
        logger.debug("tunecache: not recording %r: TensorRT-LLM could not save it (%s)", key, err)
        return None
    return key_text, value_json, None if shared else int(rank)


def _loaded(problem: str, value_json: str, shared: bool) -> Optional[Tuple[Any, Tuple]]:
    """``(key, (runner_id, tactic, min_time))`` as TensorRT-LLM's ``_deserialize_cache_data``
    builds them from a file holding ``value_json`` for key ``problem``, or None (with a debug
    line) for an entry that loader skips. Where their loader would raise instead (a literal too
    deep to parse), the entry is skipped too: a rank never fails here."""
    try:
        key = ast.literal_eval(problem)
        value = json.loads(value_json)
        tactic = ast.literal_eval(value["tactic"])
        hash(key)  # a dict key, as in their cache
        if shared:
            key[0]  # their loader takes key[0] of every shared key (independent_op)
    except (ValueError, SyntaxError, TypeError, KeyError, IndexError, MemoryError, RecursionError) as err:
        logger.debug("tunecache: skipping cache entry %s: %s", problem[:200], err)
        return None
    return key, (value["runner_id"], tactic, value["min_time"])


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
            # Any daemon failure: the file is the safe place for this save.
            if not bridge.through_daemon("save_cache", lambda: bridge.save(self, rank)):
                return original_save(self, file_path, rank)
            return None

        @functools.wraps(original_load)
        def load_cache(self: Any, file_path: Any, rank: int) -> None:
            if not bridge.through_daemon("load_cache", lambda: bridge.load(self, rank)):
                return original_load(self, file_path, rank)
            return None

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
    except (DaemonUnreachable, RpcError) as err:
        # No file either: TensorRT-LLM tunes as it would without a cache.
        bridge.warn_once("autotune", err)
