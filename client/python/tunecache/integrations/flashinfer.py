# Owns the FlashInfer drop-in: replacing flashinfer.autotune_cache.ManagedAutotuneCache (the
# managed store of autotune_v2(), flashinfer-python 0.7.2.post1) with a subclass of the same
# constructor and interface that keeps the store in tunecached: one lease per op unit (custom op,
# nearest profile, extras; not per runner key), the process group's rank 0 asking for the group,
# replay without waits or leases, the job's view, preload as one Scan; and falling back to their
# file store, with one warning, when the daemon cannot be used. The TUNECACHE_FLASHINFER=1 import
# hook that calls install() is _flashinfer_hook.py's; keys, hashes and entry JSON are the Rust
# mapping's (client/flashinfer, through tunecache._native), shared with the CLI's import/export.
"""FlashInfer drop-in: ``import tunecache.integrations.flashinfer as tf; tf.install()``.

Or set ``TUNECACHE_FLASHINFER=1``: the package's import hook installs it when
``flashinfer.autotune_cache`` is imported. ``install()`` imports nothing of FlashInfer: the class
is replaced when ``flashinfer.autotune_cache`` is first imported, or at once if it already is.

``flashinfer.autotune_cache.ManagedAutotuneCache`` (the name ``_resolve_managed_store``
constructs) becomes ``DaemonManagedAutotuneCache``, a subclass: the constructor (``manifest``,
``root``), ``root``, ``env_hash``, ``env_dir`` and ``entries_dir`` are theirs. While the daemon
(``$TUNECACHE_SOCKET`` or the default socket) answers:

* Keys: namespace ``flashinfer``, device ``<manifest gpu>|env <env_hash>``, problem their
  ``file_key``, op its ``custom_op`` (``flashinfer`` when it does not parse). The result's config
  holds ``runner``, ``tactic``, ``key_fields`` and ``profiling_policy`` as their entry file does.
* ``lookup(file_key)`` asks for the key's op unit, ``(custom_op, nearest_profile, extras)`` in
  namespace ``flashinfer.op``, whose result names the op's winning runner key: their
  ``choose_one`` looks every runner's key up and publishes only the winner's, so the unit is what
  one rank profiles. The winner's key answers its entry, the other runners' keys ``None``.
  Runners whose extras differ put their keys in units of their own: a publish Records every unit
  its search leased, and a search begun again without a publish gives its leases up.

  - Tuning (``is_tuning_mode``), no process group: a Resolve lease on the unit. One rank per
    node (per cluster with the Redis tier) gets ``None`` for every runner and profiles; the
    others wait, up to ``TUNECACHE_FLASHINFER_WAIT_MS``, for its winner. A wait that runs out
    profiles here, as stock FlashInfer does.
  - With ``set_autotune_process_group``: the group's rank 0 asks (as above) and broadcasts the
    answer (``torch.distributed.broadcast_object_list``), so every rank gets the same answer for
    each lookup and their all-reduces stay matched; rank 0 Records the group's winner, once.
    ``preload`` is rank 0's Scan, broadcast, for the same reason.
  - Replay (not tuning: ``autotune_v2(mode="replay")`` or serving outside a context): a Lookup
    of the unit, never a wait or a lease. ``TUNECACHE_MODE=replay`` (the client's replay) is
    their replay whatever their mode says, each unit asked with a replayed Resolve (a hit or a
    miss at once, the miss counted by the daemon under the view): a miss answers ``None`` for
    every runner, and their ``choose_one`` uses its fallback tactic, as their replay does.

  Answers are read in the job's view when there is one (``TUNECACHE_VIEW``, Slurm's job, torchrun's
  run id): every rank of a job serves the same tactic without ``autotune_v2_reload()``. They are
  kept per process as their memos are, and ``clear_memo()`` forgets them.
* ``publish(...)`` Records the entry and its unit together, under the lease its lookup took.
* ``preload()`` is one Scan of (namespace, device), answered as ``(entries, total, skipped)``
  exactly as their ``preload`` would answer for the same entry files.

When the daemon cannot be used (socket missing or dead, not trusted), each call is their own
method on their file store at ``root``, and one warning per process is logged.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from tunecache import _native
from tunecache.client import Entry, Key
from tunecache.integrations._base import Daemon, env_ms, tuned_by
from tunecache.integrations._import_hook import InstallOnImport

logger = logging.getLogger("tunecache.flashinfer")

MODULE = "flashinfer.autotune_cache"
AUTOTUNER_MODULE = "flashinfer.autotuner.autotuner"
NAMESPACE = "flashinfer"
OP_NAMESPACE = "flashinfer.op"
WAIT_ENV = "TUNECACHE_FLASHINFER_WAIT_MS"
LEASE_ENV = "TUNECACHE_FLASHINFER_LEASE_MS"
# A waiter waits for the whole profile of one op (all its runners and tactics: seconds, minutes
# for large MoE sweeps), as long as the daemon lets it; the holder's lease outlasts that. A dead
# holder's lease ends with it.
DEFAULT_WAIT_MS = 600_000
DEFAULT_LEASE_MS = 1_800_000

# What a process knows of one op unit (kept per store object, forgotten by clear_memo):
WINNER = "winner"  # (WINNER, winner file_key, entry JSON): the winner's key answers its entry
HELD = "held"  # this process (the group's rank 0) holds the unit's lease and profiles it
GROUP_TUNES = "group"  # another rank of the group holds it; this rank profiles with it
ALONE = "alone"  # a wait ran out: this process profiles without a lease, as stock does
MISSING = "missing"  # replay found nothing; asked again when tuning
FILES = "files"  # the daemon could not be used: their file store answers


def _tuner_state() -> Tuple[bool, Any]:
    """(tuning, process group) from ``flashinfer.autotuner``, only if it is imported already."""
    module = sys.modules.get(AUTOTUNER_MODULE)
    if module is None:
        return False, None
    tuner = getattr(getattr(module, "AutoTuner", None), "_instance", None)
    tuning = bool(getattr(tuner, "is_tuning_mode", False))
    return tuning, getattr(module, "_tune_process_group", None)


def _group_rank(group: Any) -> int:
    import torch.distributed as dist  # a process group is set: torch is imported

    return dist.get_rank(group)


def _broadcast(group: Any, value: Any) -> Any:
    """``value`` as the group's rank 0 has it, on every rank of ``group``."""
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
    return holder[0]


class _Unreachable(Exception):
    """The daemon could not be used for this call (warned once): their file store answers."""


def make_store_class(module: Any, daemon: Daemon) -> type:
    """The subclass of ``module.ManagedAutotuneCache`` that keeps its entries in the daemon."""
    base = module.ManagedAutotuneCache
    entry_class = module.ManagedCacheEntry

    class DaemonManagedAutotuneCache(base):
        """Their ManagedAutotuneCache, its entries kept in the daemon (see the module doc)."""

        def __init__(self, manifest: Dict[str, str], root: Any = None):
            super().__init__(manifest, root)
            self._units: Dict[str, tuple] = {}
            # The op units this process holds the lease of, {unit: (op, lease)}: those of the one
            # search their choose_one is in (several when runners' extras differ), ended together.
            self._leases: Dict[str, Tuple[str, Any]] = {}
            # The runners looked up since the last publish: a runner asked for again starts a
            # new search, and leases still held from the one before (its profile found no
            # tactic, so nothing was published) are given up for a waiter to profile.
            self._searched: set = set()
            self._units_lock = threading.Lock()
            self._manifest_json = json.dumps(self.manifest, sort_keys=True, separators=(",", ":"))
            self.device: Optional[str] = None
            try:
                env_hash, device = _native.flashinfer_env(self._manifest_json)
            except ValueError as err:
                env_hash, device = str(err), None
            if env_hash == self.env_hash:
                self.device = device
            else:  # the shared rule and theirs disagree: their file store keeps this environment
                logger.warning("tunecache: environment %s: %s; FlashInfer's file store is used", self.env_hash, env_hash)

        # --- the daemon's answers ------------------------------------------------------------

        def _through(self, what: str, work: Any) -> Any:
            if self.device is None:
                raise _Unreachable()
            answer: List[Any] = []
            if not daemon.through_daemon(what, lambda: answer.append(work())):
                raise _Unreachable()
            return answer[0]

        def _unit_key(self, op: str, unit: str) -> Key:
            return Key(namespace=OP_NAMESPACE, op=op, device=self.device, problem=unit)

        def _winner(self, result: Any) -> tuple:
            winner_key, entry_json, _file_name = _native.flashinfer_file_entry(None, result.config)
            return (WINNER, winner_key, entry_json)

        def _ask(self, op: str, unit: str, tuning: bool) -> tuple:
            """What the daemon says of the unit: a winner, a lease (HELD), or nothing. Their
            replay is a Lookup; the client's (TUNECACHE_MODE=replay) a replayed Resolve, a hit or
            a miss at once that the daemon counts under the view (ListMisses)."""
            key = self._unit_key(op, unit)
            if not tuning and not daemon.replaying():
                hits = self._through("lookup", lambda: daemon.client().lookup([key]))
                return self._winner(hits[0].result) if hits else (MISSING,)
            start = daemon.begin(
                key,
                wait_ms=env_ms(WAIT_ENV, DEFAULT_WAIT_MS),
                lease_ms=env_ms(LEASE_ENV, DEFAULT_LEASE_MS),
                what=f"lookup of {unit[:200]}",
            )
            if start is None:  # reported by the base
                raise _Unreachable()
            if start.kind == "hit":
                return self._winner(start.result)
            if not tuning:  # replayed: not cached (logged once per key by the client)
                return (MISSING,)
            if start.kind == "tune":
                self._leases[unit] = (op, start.lease)
                return (HELD,)
            logger.info("tunecache: %s: %s; profiling here", unit[:200], start.reason)
            return (ALONE,)

        def _state(self, file_key: str, op: str, unit: str) -> tuple:
            tuning, group = _tuner_state()
            # The client's replay serves as theirs does: no profiling, whatever their mode says.
            tuning = tuning and not daemon.replaying()
            with self._units_lock:
                known = self._units.get(unit)
            if known is not None and not (tuning and known[0] == MISSING):
                return known
            if group is None:
                try:
                    state = self._ask(op, unit, tuning)
                except _Unreachable:
                    state = (FILES,)
            else:
                state = None
                if _group_rank(group) == 0:
                    try:
                        state = self._ask(op, unit, tuning)
                    except _Unreachable:
                        # Rank 0 reads the files, and every rank serves what it read.
                        entry = base.lookup(self, file_key)
                        state = (FILES, None if entry is None else entry._asdict())
                state = _broadcast(group, state)
                if state[0] == HELD and _group_rank(group) != 0:
                    state = (GROUP_TUNES,)
            # The files answer per key, not per unit: asked again (the group, again together).
            if state[0] != FILES:
                with self._units_lock:
                    self._units[unit] = state
            return state

        # --- their interface -------------------------------------------------------------------

        def _new_search(self, runner: str) -> None:
            if runner in self._searched:
                self._searched.clear()
                stale, self._leases = self._leases, {}
                for unit, (_op, lease) in stale.items():
                    with self._units_lock:
                        self._units.pop(unit, None)
                    daemon.give_up(lease, unit)
            self._searched.add(runner)

        def lookup(self, file_key: str) -> Optional[Any]:
            op, runner, unit = _native.flashinfer_key(file_key)
            self._new_search(runner or file_key)
            state = self._state(file_key, op, unit)
            if state[0] == WINNER:
                if state[1] != file_key:
                    return None
                return entry_class.from_json(json.loads(state[2]))
            if state[0] == FILES:
                if len(state) > 1:  # the group's rank 0 read it
                    return None if state[1] is None else entry_class(**state[1])
                return base.lookup(self, file_key)
            return None

        def publish(self, file_key: str, runner_name: str, json_tactic: Any,
                    key_fields: Any = None, profiling_policy: Optional[tuple] = None) -> None:
            op, _runner, unit = _native.flashinfer_key(file_key)
            with self._units_lock:
                state = self._units.get(unit, (ALONE,))
            if state[0] == FILES or self.device is None:
                return base.publish(self, file_key, runner_name, json_tactic, key_fields, profiling_policy)
            _tuning, group = _tuner_state()
            # In a process group every rank publishes the same winner; rank 0 Records it.
            records_here = group is None or _group_rank(group) == 0
            # The entry their publish writes, as their json.dump spells it.
            entry: Dict[str, Any] = {"key": file_key, "runner": runner_name, "tactic": json_tactic}
            if profiling_policy is not None:
                entry["profiling_policy"] = list(profiling_policy)
            if key_fields is not None:
                encoded = module._encode_key_fields(key_fields)
                if encoded is not None:
                    entry["key_fields"] = encoded
            held, self._leases = self._leases, {}
            self._searched.clear()
            try:
                entry_json = json.dumps(entry, sort_keys=True, separators=(",", ":"))
                recorded, unit_entry = _native.flashinfer_entries(
                    self._manifest_json, entry_json, tuned_by("flashinfer drop-in"), int(time.time() * 1000))
            except (TypeError, ValueError) as err:  # their publish is best-effort too
                logger.warning("tunecache: not recording %s: %s", file_key[:200], err)
                for _op, lease in held.values():
                    daemon.give_up(lease, file_key)
                return None
            # Every op unit of this search names the winner: the winner's own, and those of
            # runners whose extras put their keys in another unit (their keys answer None).
            units = {unit: unit_entry}
            for other, (other_op, _lease) in held.items():
                units.setdefault(other, Entry(key=self._unit_key(other_op, other), result=unit_entry.result))
            with self._units_lock:
                for each in units:
                    self._units[each] = (WINNER, file_key, entry_json)
            if not records_here:
                return None
            if held:  # one Record under one lease; the others complete as their units get the result
                finishing = unit if unit in held else next(iter(held))
                also = [recorded] + [each for other, each in units.items() if other != finishing]
                daemon.finish(held[finishing][1], unit_entry.result, what=f"publish of {file_key[:200]}", also=also)
            elif not daemon.through_daemon("publish", lambda: daemon.client().record([recorded, unit_entry])):
                base.publish(self, file_key, runner_name, json_tactic, key_fields, profiling_policy)
            return None

        def preload(self) -> Tuple[list, int, int]:
            _tuning, group = _tuner_state()
            if group is None:
                texts = self._scan()
            else:
                texts = _broadcast(group, self._scan() if _group_rank(group) == 0 else None)
            if texts is None:
                return base.preload(self)
            return _preloaded(module, entry_class, texts)

        def _scan(self) -> Optional[List[Tuple[str, str, str]]]:
            """``(file_key, entry JSON)`` of every entry of this environment; None when the
            daemon cannot be used."""
            try:
                chunks = self._through(
                    "preload", lambda: list(daemon.client().scan(namespace=NAMESPACE, device=self.device)))
            except _Unreachable:
                return None
            texts = []
            for chunk in chunks:
                for stored in chunk:
                    try:
                        texts.append(_native.flashinfer_file_entry(stored.key.problem, stored.result.config))
                    except ValueError as err:
                        logger.debug("tunecache: skipping %s: %s", stored.key.problem[:200], err)
            return texts

        def clear_memo(self) -> None:
            super().clear_memo()
            with self._units_lock:
                self._units.clear()

        def __repr__(self) -> str:
            return f"DaemonManagedAutotuneCache(env_dir={str(self.env_dir)!r}, device={self.device!r})"

    DaemonManagedAutotuneCache.__name__ = base.__name__
    DaemonManagedAutotuneCache.__qualname__ = base.__qualname__
    DaemonManagedAutotuneCache.__module__ = base.__module__
    return DaemonManagedAutotuneCache


def _preloaded(module: Any, entry_class: Any, texts: List[Tuple[str, str, str]]) -> Tuple[list, int, int]:
    """What their ``preload`` answers for entry files holding these entries: in their order
    (the files' names), each taken by their rules (``key_fields`` decoded, agreeing with the
    key) or counted skipped."""
    ordered = sorted(texts, key=lambda text: text[2])
    entries: list = []
    skipped = 0
    for _file_key, entry_json, _file_name in ordered:
        try:
            entry = json.loads(entry_json)
            raw = entry.get("key_fields")
            fields = None if raw is None else module._decode_key_fields(raw)
            if fields is None or not isinstance(fields, tuple) or str(fields) != entry.get("key"):
                skipped += 1
                continue
            entries.append((fields, entry_class.from_json(entry)))
        except Exception:  # as theirs: an entry that cannot be read is skipped, never an error
            skipped += 1
    return entries, len(ordered), skipped


# --- installing --------------------------------------------------------------------------------------

_installed: Dict[str, Any] = {}
_install_lock = threading.Lock()


def installed() -> bool:
    return bool(_installed)


def install(socket: Optional[str] = None, timeout: float = 5.0) -> None:
    """Replaces FlashInfer's managed store with the daemon's (see the module doc): at once if
    ``flashinfer.autotune_cache`` is imported, else when it is. Idempotent.
    ``socket``: the daemon's socket (default: ``$TUNECACHE_SOCKET``, then the default path)."""
    with _install_lock:
        if _installed:
            return
        _installed["daemon"] = Daemon(
            logger,
            "daemon at %(socket)s unreachable (%(what)s: %(problem)s); FlashInfer's managed autotune "
            "cache uses its file store instead. Further fallbacks in this process are logged at DEBUG.",
            "%(what)s fell back to the file store: %(problem)s",
            socket,
            timeout,
        )
    # Nothing of FlashInfer is imported here: the class is replaced once their module has run.
    InstallOnImport("", MODULE, lambda: _patch(importlib.import_module(MODULE)), "FlashInfer", logger).watch()


def _patch(module: Any) -> None:
    with _install_lock:
        if "module" in _installed or "daemon" not in _installed:
            return
        original = module.ManagedAutotuneCache
        module.ManagedAutotuneCache = make_store_class(module, _installed["daemon"])
        _installed.update(module=module, original=original)


def uninstall() -> None:
    """Undoes ``install()`` (for tests and for switching sockets). Stores made already stay."""
    with _install_lock:
        module = _installed.get("module")
        if module is not None:
            module.ManagedAutotuneCache = _installed["original"]
        _installed.clear()
