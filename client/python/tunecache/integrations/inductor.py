# Owns the PyTorch Inductor drop-in (torch 2.15.0, `torch.compile(mode="max-autotune")`): its GEMM
# choice timings (PersistentCache.lookup) and its kernels' best configs (AutotuneCache) kept in
# tunecached and tuned once per node or cluster, its remote caches (_inductor_remote.py) served by
# the daemon, replay without waits or leases, and stock Inductor, its files unchanged, when the
# daemon cannot be used. Keys and result configs are the Rust mapping's (client/inductor, through
# tunecache._native), shared with the CLI's `import inductor` / `export inductor`. The
# TUNECACHE_INDUCTOR=1 start-up switch that calls install() is _inductor_hook.py's.
"""PyTorch Inductor drop-in: ``import tunecache.integrations.inductor as ti; ti.install()``.

Or set ``TUNECACHE_INDUCTOR=1``: the package's start-up hook installs it when Inductor's cache
modules are imported. ``install()`` imports nothing of torch: each patch applies when
``torch._inductor.codecache``, ``torch._inductor.runtime.autotune_cache`` or
``torch._inductor.remote_cache`` is first imported, or at once if it already is.

While the daemon (``$TUNECACHE_SOCKET`` or the default socket) answers:

* **GEMM choice timings.** ``PersistentCache.lookup(choices, op, inputs, benchmark,
  hint_override)`` asks the daemon instead of their ``<cache_dir>/cache/<system hash>`` file,
  which it neither reads nor writes. Key: namespace ``inductor``; device
  ``<device name>|system <CacheBase.get_system() hash>``; op ``op``; problem the inputs key
  (with ``hint_override``), the float32 matmul precision key and a digest of the choices'
  ``hash_key()``s, so a rank with another backend list never takes another's timings. The
  result's config is ``{choice_hash: timing}`` of one benchmark run, as their file holds it.
  One rank per node (per cluster with the Redis tier) benchmarks; the others wait for its
  Record, up to ``TUNECACHE_INDUCTOR_WAIT_MS`` (default 600000), and get the same timings, so
  every rank picks the same choice. A wait that runs out benchmarks here, as stock does.
  ``benchmark=None`` is a Lookup: a miss answers ``{}`` at once. ``autotune_local_cache`` off
  changes nothing here: their file is not read either way, and the daemon serves and records.
* **Kernel best configs.** ``AutotuneCache`` (one per Triton kernel) reads and saves through the
  daemon, keyed by their own ``<dir>/<key>.best_config`` name (``_prepare_key`` with
  ``torch_key()``) and ``configs_hash``, in namespace ``inductor.best_config``. The read takes
  the kernel's lease: one process autotunes it, and the others wait for its ``save``.
* **Remote caches.** ``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache``,
  ``RemoteFxGraphCache`` and ``RemoteAOTAutogradCache`` keep their values in the daemon (see
  ``tunecache.integrations._inductor_remote``), so no site Redis is needed; ``install()`` turns
  ``fx_graph_remote_cache`` and ``autotune_remote_cache`` on where they are unset.

With ``TUNECACHE_MODE=replay`` no call waits or takes a lease: a hit is served, a miss runs stock
Inductor. When the daemon cannot be used (socket missing or dead, not trusted), each call is stock
Inductor's, on its own files, and one warning per process is logged.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from tunecache import _native
from tunecache.client import Entry, Result
from tunecache.integrations._base import Daemon, env_ms, tuned_by
from tunecache.integrations._import_hook import InstallOnImport

logger = logging.getLogger("tunecache.inductor")

CODECACHE = "torch._inductor.codecache"
AUTOTUNE_CACHE = "torch._inductor.runtime.autotune_cache"
REMOTE_CACHE = "torch._inductor.remote_cache"
CONFIG = "torch._inductor.config"
MODULES = (CODECACHE, AUTOTUNE_CACHE, REMOTE_CACHE)
WAIT_ENV = "TUNECACHE_INDUCTOR_WAIT_MS"
LEASE_ENV = "TUNECACHE_INDUCTOR_LEASE_MS"
# A round of GEMM choices takes minutes on a GPU (tens of Triton templates per shape); the holder's
# lease outlasts the longest wait. A dead holder's lease ends with it.
DEFAULT_WAIT_MS = 600_000
DEFAULT_LEASE_MS = 1_800_000
TUNER = "inductor"
# The config switches install() turns on where the user left them unset (None): the remote
# caches the daemon serves.
REMOTE_SWITCHES = ("fx_graph_remote_cache", "autotune_remote_cache")


def _system_device(codecache: Any) -> tuple:
    """(system hash, device name or None) of ``CacheBase.get_system()``."""
    system = codecache.CacheBase.get_system()
    device = system.get("device") or {}
    name = device.get("name") if isinstance(device, dict) else None
    return system["hash"], (str(name) if name else None)


# --- GEMM choice timings ----------------------------------------------------------------------


class _Unusable(Exception):
    """A daemon result that does not answer every choice: benchmark as stock does."""


def _gemm_lookup(daemon: Daemon, stock: Callable, codecache: Any, cache: Any, choices: List[Any], op: str,
                 inputs: str, benchmark: Optional[Callable], hint_override: Optional[int]) -> Dict[Any, float]:
    def run_stock() -> Dict[Any, float]:
        return stock(cache, choices, op, inputs, benchmark, hint_override)

    try:
        system_hash, device_name = _system_device(codecache)
        cache_key = f"{inputs}_{hint_override}" if hint_override is not None else inputs
        by_hash = {choice.hash_key(): choice for choice in choices}
        key = _native.inductor_gemm_key(system_hash, device_name, op, cache_key, codecache.fp32_matmul_precision_key(),
                                        list(by_hash))
    except Exception as err:  # noqa: BLE001 - a choice we cannot key is stock Inductor's to handle
        daemon.warn_once(f"could not key the GEMM choices of {op}", err)
        return run_stock()

    def timings_of(result: Any) -> Dict[Any, float]:
        timings = dict(_native.inductor_timings(result.config))
        if not all(choice_hash in timings for choice_hash in by_hash):
            raise _Unusable(f"the cached timings of {op} miss a choice")
        return {choice: timings[choice_hash] for choice_hash, choice in by_hash.items()}

    if benchmark is None:
        found: List[Any] = []
        if not daemon.through_daemon(f"looking up the GEMM timings of {op}",
                                     lambda: found.extend(daemon.client().lookup([key]))):
            return run_stock()
        try:
            return timings_of(found[0].result) if found else {}
        except (_Unusable, ValueError):
            return {}

    def hit(result: Any) -> Dict[Any, float]:
        try:
            return timings_of(result)
        except (_Unusable, ValueError) as err:
            logger.warning("tunecache: %s; benchmarking here", err)
            return run_stock()

    def tune() -> tuple:
        timings = benchmark(choices)
        missing = [choice for choice in choices if choice not in timings]
        if missing:  # stock's own check, before anything is kept
            raise AssertionError(f"Benchmark results missing for choices: {missing}")
        pairs = [(choice.hash_key(), float(timing)) for choice, timing in timings.items()]
        result = Result(
            config=_native.inductor_timings_config(pairs),
            time_us=_native.inductor_time_us(pairs),
            tuned_by=tuned_by(TUNER),
            tuned_at_unix_ms=int(time.time() * 1000),
        )
        return timings, result

    return daemon.tune_once(
        key,
        wait_ms=env_ms(WAIT_ENV, DEFAULT_WAIT_MS),
        lease_ms=env_ms(LEASE_ENV, DEFAULT_LEASE_MS),
        what=f"the GEMM timings of {op}",
        hit=hit,
        tune=tune,
        fall_back=lambda _reason: run_stock(),
    )


def _patch_codecache(daemon: Daemon, codecache: Any) -> None:
    cls = codecache.PersistentCache
    stock = cls.lookup
    if getattr(stock, "_tunecache", False):
        return

    def lookup(self: Any, choices: List[Any], op: str, inputs: str, benchmark: Optional[Callable],
               hint_override: Optional[int] = None) -> Dict[Any, float]:
        return _gemm_lookup(daemon, stock, codecache, self, choices, op, inputs, benchmark, hint_override)

    lookup._tunecache = True  # type: ignore[attr-defined]
    lookup.__wrapped__ = stock  # type: ignore[attr-defined]
    lookup.__doc__ = stock.__doc__
    cls.lookup = lookup
    _installed["undo"].append(lambda: setattr(cls, "lookup", stock))
    config = importlib.import_module(CONFIG)
    for name in REMOTE_SWITCHES:
        if getattr(config, name, False) is None:
            setattr(config, name, True)
            _installed["undo"].append(lambda name=name: setattr(config, name, None))


# --- kernel best configs ----------------------------------------------------------------------

# The leases this process holds on kernels whose autotune runs here, by key problem: the read
# takes it, the save Records under it. Kept here, not on the AutotuneCache, which Inductor
# pickles between its compile workers and the parent.
_kernel_leases: Dict[str, Any] = {}
_kernel_lock = threading.Lock()
BEST_CONFIG_PARTS = "_tunecache_best_config"


def _best_config_key(cache: Any) -> Optional[Any]:
    parts = getattr(cache, BEST_CONFIG_PARTS, None)
    return None if parts is None else _native.inductor_best_config_key(*parts)


def _patch_autotune_cache(daemon: Daemon, module: Any) -> None:
    cls = module.AutotuneCache
    if getattr(cls, "_tunecache", False):
        return
    stock_create, stock_read, stock_save = cls.__dict__["create"], cls._read, cls.save

    def create(inductor_meta: Any, filename: str, configs_hash: str) -> Any:
        cache = stock_create.__func__(inductor_meta, filename, configs_hash)
        if cache is None:  # neither of their caches is on: the daemon still serves
            cache = cls(configs_hash)
        local_key = cls._make_local_cache_key(os.path.dirname(filename), cls._prepare_key(filename))
        setattr(cache, BEST_CONFIG_PARTS, (cls._artifact_key_from_local_cache_key(local_key), configs_hash))
        return cache

    def _read(self: Any) -> Any:
        key = _best_config_key(self)
        if key is None:
            return stock_read(self)
        start = daemon.begin(key, wait_ms=env_ms(WAIT_ENV, DEFAULT_WAIT_MS), lease_ms=env_ms(LEASE_ENV, DEFAULT_LEASE_MS),
                             what="the best config of a kernel")
        if start is None:  # the daemon cannot be asked (warned): their caches answer
            return stock_read(self)
        if start.kind == "tune":  # this process autotunes the kernel; save() Records it
            with _kernel_lock:
                _kernel_leases[key.problem] = start.lease
            return None
        if start.kind == "miss":  # a replayed miss, or the wait ran out: as stock
            return stock_read(self)
        try:
            best = json.loads(start.result.config)
        except ValueError:
            best = None
        return best if isinstance(best, dict) and best else stock_read(self)

    def save(self: Any, config: Any, time_taken_ns: int, found_by_coordesc: bool = False,
             triton_cache_hash: Optional[str] = None) -> None:
        key = _best_config_key(self)
        if key is None:
            return stock_save(self, config, time_taken_ns, found_by_coordesc, triton_cache_hash)
        with _kernel_lock:
            lease = _kernel_leases.pop(key.problem, None)
        data = _saved_data(self, stock_save, config, time_taken_ns, found_by_coordesc, triton_cache_hash)
        if data is not None and _record_best_config(daemon, key, lease, data):
            return
        if lease is not None:
            daemon.give_up(lease)
        stock_save(self, config, time_taken_ns, found_by_coordesc, triton_cache_hash)

    cls.create = staticmethod(create)
    cls._read = _read
    cls.save = save
    cls._tunecache = True

    def undo() -> None:
        cls.create, cls._read, cls.save = stock_create, stock_read, stock_save
        del cls._tunecache

    _installed["undo"].append(undo)


def _saved_data(cache: Any, stock_save: Callable, *args: Any) -> Optional[dict]:
    """What their ``save`` would write for ``args``, computed by their own code with both of
    their caches detached (its first step hands the data to ``_record_artifact``)."""
    captured: List[dict] = []
    record_artifact = cache._record_artifact
    local, remote = cache.local_cache, cache.remote_cache
    cache.local_cache = cache.remote_cache = None
    cache._record_artifact = lambda data: (captured.append(data), record_artifact(data))
    try:
        stock_save(cache, *args)
    finally:
        del cache._record_artifact
        cache.local_cache, cache.remote_cache = local, remote
    return captured[0] if captured else None


def _record_best_config(daemon: Daemon, key: Any, lease: Any, data: dict) -> bool:
    try:
        config = json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        logger.warning("tunecache: the best config of %s is not JSON (%s); kept in Inductor's caches", key.problem, err)
        return False
    taken = data.get("time_taken_ms")
    result = Result(
        config=config,
        time_us=float(taken) * 1000.0 if isinstance(taken, (int, float)) and taken >= 0 else 0.0,
        tuned_by=tuned_by(TUNER),
        tuned_at_unix_ms=int(time.time() * 1000),
    )
    if lease is not None:
        return daemon.finish(lease, result, what="the best config of a kernel")
    entry = Entry(key=key, result=result)
    return daemon.through_daemon("storing the best config of a kernel", lambda: daemon.client().record([entry]))


# --- installing -------------------------------------------------------------------------------

_installed: Dict[str, Any] = {}
_install_lock = threading.Lock()


def installed() -> bool:
    return bool(_installed)


def daemon() -> Optional[Daemon]:
    """This process's daemon of the drop-in, once installed."""
    return _installed.get("daemon")


def install(socket: Optional[str] = None, timeout: float = 5.0) -> None:
    """Sends Inductor's caches through the daemon (see the module doc): each patch at once if its
    module is imported, else when it is. Idempotent: called again, it patches the modules that
    have finished importing since. ``socket``: the daemon's socket (default:
    ``$TUNECACHE_SOCKET``, then the default path)."""
    with _install_lock:
        first = not _installed
        if first:
            _installed["daemon"] = Daemon(
                logger,
                "daemon at %(socket)s unreachable (%(what)s: %(problem)s); Inductor uses its own caches "
                "instead. Further fallbacks in this process are logged at DEBUG.",
                "%(what)s fell back to Inductor's own caches: %(problem)s",
                socket,
                timeout,
            )
            _installed["undo"] = []
            _installed["patched"] = set()
    for name in MODULES:
        if first:
            InstallOnImport("", name, lambda name=name: _patch(name), "Inductor", logger).watch()
        elif name in sys.modules:
            _patch(name)


def _patch(name: str) -> None:
    """Patches module ``name`` once it defines what its patch replaces. Inductor's modules import
    each other (codecache imports the other two before it defines PersistentCache): a module
    still being imported is patched by the next install() or import hook that finds it whole."""
    from tunecache.integrations import _inductor_remote

    patchers = {
        CODECACHE: (_patch_codecache, "PersistentCache"),
        AUTOTUNE_CACHE: (_patch_autotune_cache, "AutotuneCache"),
        REMOTE_CACHE: (_inductor_remote.patch, "RemoteAOTAutogradCache"),
    }
    patcher, defined_last = patchers[name]
    with _install_lock:
        if "daemon" not in _installed or name in _installed["patched"]:
            return
        module = sys.modules.get(name) or importlib.import_module(name)
        if not hasattr(module, defined_last):
            return
        _installed["patched"].add(name)
        patcher(_installed["daemon"], module)


def uninstall() -> None:
    """Undoes ``install()`` (for tests and for switching sockets)."""
    with _install_lock:
        for undo in reversed(_installed.get("undo", [])):
            undo()
        _installed.clear()
