# Owns the BitBLAS drop-in: patching bitblas.cache.OperatorCache.save_into_database and
# load_from_database, and bitblas.ops.operator.Operator.hardware_aware_finetune (and, to learn
# the target string an operator was made with, Operator.__init__), so that ranks keep BitBLAS's
# operator database in tunecached (one entry per operator, its files as artifacts) and tune each
# operator once per node (per cluster with the Redis tier) under a Resolve lease; and falling
# back to BitBLAS's own code, with one warning, when the daemon cannot be reached. The
# TUNECACHE_BITBLAS=1 import hook that calls install() is _bitblas_hook.py's.
"""BitBLAS drop-in: ``import tunecache.integrations.bitblas as tb; tb.install()``.

Call ``install()`` before BitBLAS builds operators (or set ``TUNECACHE_BITBLAS=1`` in the
environment: the package's import hook then installs it when ``bitblas`` is imported). While the
daemon (``$TUNECACHE_SOCKET`` or the default socket) answers (docs/bitblas.md has the details):

* ``OperatorCache.save_into_database(path, target)`` (what ``bitblas.Linear`` calls after tuning)
  Records every operator of the cache as one entry: namespace ``bitblas``, op the config's type
  (``MatmulConfig``), device ``<arch>|bitblas <version>|cuda <version>`` where ``<arch>`` is
  BitBLAS's own directory name for the target (a string target as it is, ``nvidia/nvidia-h100``;
  a ``Target`` object as ``"-".join(keys + [arch])``, ``cuda-gpu-sm_90a``), problem the config's
  JSON (their ``<Config>.json``, keys sorted). Its files are the ones BitBLAS's own
  ``_save_operator_config_and_artifact`` writes, into a private temporary directory, uploaded as
  artifacts; ``Result.config`` holds ``mapping.json``, the config JSON and the directory name.
  Nothing is written under ``path``. The daemon's merge rule picks the winner, so ranks never
  overwrite each other's entry. An operator loaded from the daemon, or already sent by this
  process, is not sent (again).
* ``load_from_database(path, target)`` (and so ``load_global_ops_cache``) lays every entry the
  daemon holds for that target, read in the job's view, out in a directory of this process's own
  (``<dir>/<arch>/<hash>/<files>``: each file the client's verified artifact fetch, on the
  daemon's node a copy of the daemon's own file handed over as a descriptor), exactly as
  BitBLAS's database is, and runs BitBLAS's own loader on it: the operators are BitBLAS's, built
  from the same bytes on every rank. ``path`` is not read.
* ``Operator.hardware_aware_finetune`` runs in one rank per node (per cluster with the Redis
  tier) for a config: a Resolve lease around BitBLAS's tuning call. The holder tunes and Records
  the operator's files with the lease; every other rank waits, then builds its operator from
  those files with BitBLAS's loader and takes that operator's state (its ``__dict__``), so the
  ``Matmul`` object the caller holds is the loaded one. A holder that dies passes the lease on;
  a rank whose wait ends without a result tunes itself, as stock BitBLAS does.
* Replay (``TUNECACHE_MODE=replay``): a cached operator is loaded as above; on a miss
  ``hardware_aware_finetune`` returns at once without tuning (no wait, no lease), and the operator
  keeps the default schedule BitBLAS built it with (what it runs with tuning off);
  ``save_into_database`` then sends and writes nothing, so a default schedule never becomes the
  key's result.

When the daemon cannot be reached (or the default socket is not trusted), BitBLAS's own methods
run, database directory included, and one warning per process is logged.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from hashlib import sha256
from typing import Any, Dict, List, Optional, Tuple

from tunecache.client import Entry, Key, Result
from tunecache.errors import ArtifactError, RpcError, StatusCode
from tunecache.integrations._base import Daemon, DaemonUnreachable, env_ms, tuned_by

logger = logging.getLogger("tunecache.bitblas")

CACHE_MODULE = "bitblas.cache.operator"
OPERATOR_MODULE = "bitblas.ops.operator"
NAMESPACE = "bitblas"
# BitBLAS's tuning returns nothing and keeps no latency on the operator (Operator.apply_fast_tuning
# drops the `best` that fast_tune measured; the dynamic-range path returns only a module), so every
# result is recorded with this time: the first result recorded for a key stands against later equal
# ones unless the merge rule's tie-break (config, then tuned_by, then the earlier tuned_at) says
# otherwise. See docs/bitblas.md.
FIXED_TIME_US = 1.0
WAIT_ENV = "TUNECACHE_BITBLAS_WAIT_MS"
LEASE_ENV = "TUNECACHE_BITBLAS_LEASE_MS"
DIR_ENV = "TUNECACHE_BITBLAS_DIR"
# BitBLAS tunes for minutes (topk candidates compiled and measured): a waiter waits as long as the
# daemon lets it (10 minutes), and the holder asks for a lease that outlasts a slow tuning (the
# daemon's default is 2 minutes; it caps leases at an hour). A dead holder's lease ends with it.
DEFAULT_WAIT_MS = 600_000
DEFAULT_LEASE_MS = 1_800_000
# Attributes the drop-in sets on an Operator: where it came from, and the key it was sent under.
LOADED_ATTR = "_tunecache_loaded"
SENT_ATTR = "_tunecache_sent"
TARGET_ATTR = "_tunecache_target"
# Their save names each operator's directory sha256(repr(config)); a laid-out entry must name one.
_HASH_DIR = re.compile(r"^[0-9a-f]{64}$")


# --- keys ------------------------------------------------------------------------------------------


def problem_text(config: Any) -> Optional[str]:
    """``Key.problem`` of a config: the JSON their save writes to ``<Config>.json``
    (``json.dump(asdict(config))``), keys sorted and compact; None for a config that JSON cannot
    hold (their save could not write it either)."""
    try:
        return json.dumps(json.loads(json.dumps(asdict(config))), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


_cuda_version_cache: List[str] = []


def cuda_version() -> str:
    """The CUDA toolkit BitBLAS compiles with, as TVM's ``nvcc.get_cuda_version()`` reads it
    (``12.4``); else the CUDA torch was built for; else ``unknown``. Read once per process."""
    if _cuda_version_cache:
        return _cuda_version_cache[0]
    version = "unknown"
    try:
        nvcc = importlib.import_module("tvm.contrib.nvcc")
        found = nvcc.get_cuda_version()
        version = ".".join(str(part) for part in tuple(found)[:2]) if isinstance(found, (tuple, list)) else str(found)
    except Exception:
        torch = sys.modules.get("torch")
        found = getattr(getattr(torch, "version", None), "cuda", None)
        if found:
            version = str(found)
    _cuda_version_cache.append(version)
    return version


def bitblas_version() -> str:
    bitblas = sys.modules.get("bitblas")
    return str(getattr(bitblas, "__version__", "unknown"))


def device_key(arch: str) -> str:
    """``Key.device`` for BitBLAS's arch string ``arch``: ``<arch>|bitblas <version>|cuda
    <version>``, so another release's or toolkit's operators never load."""
    return f"{arch}|bitblas {bitblas_version()}|cuda {cuda_version()}"


def _key(config: Any, arch: str) -> Optional[Key]:
    problem = problem_text(config)
    if problem is None:
        return None
    return Key(namespace=NAMESPACE, op=type(config).__name__, device=device_key(arch), problem=problem)


def loadable(config: Any, op_inst: Any) -> bool:
    """Whether BitBLAS's loader can build this operator again: it finds the config and operator
    classes by name on the ``bitblas`` package (``getattr(bitblas, mapping["config_type"])``).
    Others (``LadderPermutate``, which a tuning Matmul may tune too) would make every later load
    raise, so they are neither Recorded nor coordinated: they tune as stock."""
    bitblas = sys.modules.get("bitblas")
    return (getattr(bitblas, type(config).__name__, None) is type(config)
            and getattr(bitblas, type(op_inst).__name__, None) is type(op_inst))


def _key_id(key: Key) -> Tuple[str, str, str, str]:
    return key.namespace, key.op, key.device, key.problem


# A result's provenance names this drop-in.
TUNER = "bitblas drop-in"


# --- this process's directories --------------------------------------------------------------------


class _ProcessDirs:
    """Directories of this process under ``$TUNECACHE_BITBLAS_DIR`` (default
    ``<tmp>/tunecache-bitblas-<uid>``), into which the client fetches an entry's files: TVM's
    ``load_module`` unpacks a ``.tar`` next to it and links a ``.tar.so`` there, so no two
    processes may load from one directory. Removed at exit; those of processes that are gone
    (killed) are removed when a process makes its first one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: Optional[str] = None
        self._pid: Optional[int] = None
        self._count = 0

    def new(self, what: str) -> str:
        with self._lock:
            if self._root is None or self._pid != os.getpid():
                self._root = self._make_root()
                self._pid = os.getpid()
            self._count += 1
            path = os.path.join(self._root, f"{what}-{self._count}")
        os.mkdir(path, 0o700)
        return path

    def _make_root(self) -> str:
        base = _base_dir()
        _sweep_dead(base)
        root = tempfile.mkdtemp(prefix=f"p{os.getpid()}-", dir=base)
        atexit.register(shutil.rmtree, root, True)
        return root


def _base_dir() -> str:
    """The base directory, made private if new. One that a library is later dlopened from must be
    this user's alone: a symlink, another owner or a group/other-writable mode (a directory
    planted in /tmp) is refused, and BitBLAS runs as stock."""
    base = os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), f"tunecache-bitblas-{os.getuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise DaemonUnreachable(f"{base} is not a directory of this user's alone (mode {info.st_mode:o}, "
                                f"uid {info.st_uid}); set {DIR_ENV}")
    return base


def _sweep_dead(base: str) -> None:
    for name in os.listdir(base):
        match = re.match(r"^p(\d+)-", name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except OSError:
            pass  # alive (another user's, say): not ours to touch


# --- the bridge ------------------------------------------------------------------------------------


class _Bridge(Daemon):
    """The daemon side of the patched methods: one client, one warning, one set of directories
    per process."""

    def __init__(self, cache_module: Any, socket: Optional[str], timeout: float):
        super().__init__(
            logger,
            "daemon at %(socket)s unreachable (%(what)s: %(problem)s); BitBLAS uses its own database "
            "directory and tunes in every process. Further fallbacks in this process are logged at DEBUG.",
            "%(what)s fell back to BitBLAS's own code: %(problem)s",
            socket,
            timeout,
        )
        self.cache_module = cache_module
        self.dirs = _ProcessDirs()

    # --- files: what their save writes for one operator --------------------------------------------

    def built_entry(self, cache: Any, config: Any, op_inst: Any, arch: str, key: Key, scratch: str) -> Entry:
        """The entry of one operator: their ``_save_operator_config_and_artifact`` writes its
        files into ``scratch/<arch>/<hash>``; each file is uploaded and named in the result."""
        hash_str = sha256(repr(config).encode()).hexdigest()  # as their save names the directory
        config_path = os.path.join(scratch, arch, hash_str)
        os.makedirs(config_path)
        cache._save_operator_config_and_artifact(config, op_inst, config_path)
        names = sorted(os.listdir(config_path))
        files = [(name, os.path.join(config_path, name)) for name in names
                 if os.path.isfile(os.path.join(config_path, name))]
        with open(os.path.join(config_path, "mapping.json")) as f:
            mapping = json.load(f)
        with open(os.path.join(config_path, f"{mapping['config_type']}.json")) as f:
            config_json = json.load(f)
        document = {"mapping": mapping, "config": config_json, "dir": hash_str}
        artifacts = self.client().put_artifacts(files)
        result = Result(
            config=json.dumps(document, sort_keys=True, separators=(",", ":")),
            time_us=FIXED_TIME_US,
            tuned_by=tuned_by(TUNER),
            tuned_at_unix_ms=int(time.time() * 1000),
            artifacts=artifacts,
        )
        return Entry(key=key, result=result)

    def lay_out(self, result: Any, arch: str, root: str) -> Optional[str]:
        """Writes the files of ``result`` into ``root/<arch>/<hash>/`` with the client's artifact
        fetch (each verified; on the daemon's node copied from the daemon's own file); answers
        that directory, or None (removed again, with a line saying why) for an entry that cannot
        be laid out. Raises RpcError when the daemon fails."""
        try:
            document = json.loads(result.config)
            hash_dir = document["dir"]
        except (ValueError, KeyError, TypeError):
            logger.debug("tunecache: skipping a BitBLAS entry without its directory name: %s", result.config[:200])
            return None
        if not isinstance(hash_dir, str) or not _HASH_DIR.match(hash_dir):
            logger.debug("tunecache: skipping a BitBLAS entry whose directory name is %r", hash_dir)
            return None
        config_path = os.path.join(root, arch, hash_dir)
        os.makedirs(config_path)
        try:
            self.client().fetch_artifacts(result, config_path)
        except RpcError as err:
            shutil.rmtree(config_path, ignore_errors=True)
            if err.code() == StatusCode.NOT_FOUND:
                logger.warning("tunecache: a file of BitBLAS entry %s is gone (%s); not loaded", hash_dir, err.details())
                return None
            raise
        except (ArtifactError, OSError) as err:
            shutil.rmtree(config_path, ignore_errors=True)
            logger.warning("tunecache: the files of BitBLAS entry %s could not be laid out (%s); not loaded", hash_dir, err)
            return None
        return config_path

    # --- save --------------------------------------------------------------------------------------

    def save(self, cache: Any, target: Any) -> None:
        client = self.client()
        if self.replaying():
            # Replay serves only what is cached: an operator built here (its default schedule, on
            # a miss) must never become the key's result. Nor is BitBLAS's database written:
            # without tuning it saves nothing.
            logger.debug("tunecache: replay: BitBLAS's save_into_database sends nothing")
            return
        pending: List[Tuple[Entry, Any]] = []
        scratch = tempfile.mkdtemp(prefix="tunecache-bitblas-save-")
        failure: Optional[BaseException] = None
        try:
            for config, op_inst in list(cache.cache.items()):
                if getattr(op_inst, LOADED_ATTR, False):
                    continue  # never sent back as a new result: its source.cu is not the one loaded
                if not loadable(config, op_inst):
                    logger.debug("tunecache: not recording %r: BitBLAS's loader cannot build a %s",
                                 config, type(op_inst).__name__)
                    continue
                arch = cache._determine_arch_str(op_inst, target)
                if not isinstance(arch, str):  # a Target given: theirs would fail to make its directory
                    arch = cache._determine_target_arch_str(arch)
                key = _key(config, arch)
                if key is None:
                    logger.debug("tunecache: not recording %r: its config is no JSON", config)
                    continue
                if getattr(op_inst, SENT_ATTR, None) == _key_id(key):
                    continue
                try:
                    entry = self.built_entry(cache, config, op_inst, arch, key, scratch)
                except (RpcError, DaemonUnreachable):
                    raise
                except Exception as err:  # their save raised: as stock, the caller sees it
                    failure = err
                    break
                pending.append((entry, op_inst))
            if pending:
                kept = client.record_keeping_valid([entry for entry, _ in pending])
                refused = {index for index, _entry, _error in kept.refused}
                for index, _entry, error in kept.refused:
                    logger.warning("tunecache: the daemon refused BitBLAS operator %s (%s); it is not saved",
                                   pending[index][0].key.problem[:200], error.details())
                for index, (entry, op_inst) in enumerate(pending):
                    if index not in refused:
                        setattr(op_inst, SENT_ATTR, _key_id(entry.key))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if failure is not None:
            raise failure

    # --- load --------------------------------------------------------------------------------------

    def load(self, cache: Any, target: Any, original_load: Any) -> int:
        """Lays the daemon's entries for ``target`` out and runs their loader on them; answers
        how many operators it added."""
        arch = cache._determine_target_arch_str(target)
        device = device_key(arch)
        client = self.client()
        entries = [entry for chunk in client.scan(namespace=NAMESPACE, device=device) for entry in chunk]
        root = self.dirs.new("load")
        for entry in entries:
            self.lay_out(entry.result, arch, root)
        before = {id(op) for op in cache.cache.values()}
        original_load(cache, root, target)
        added = 0
        for op_inst in cache.cache.values():
            if id(op_inst) not in before:
                setattr(op_inst, LOADED_ATTR, True)
                added += 1
        logger.info("tunecache: loaded %d of %d BitBLAS operators for %s from the daemon", added, len(entries), device)
        return added

    # --- tune --------------------------------------------------------------------------------------

    def tune(self, op_inst: Any, original: Any, args: tuple, kwargs: dict) -> Any:
        """``hardware_aware_finetune`` tuned once per node (per cluster with the Redis tier)."""
        arch = _operator_arch(self.cache_module, op_inst)
        key = _key(op_inst.config, arch) if arch is not None and loadable(op_inst.config, op_inst) else None
        if key is None:
            return original(op_inst, *args, **kwargs)
        described = key.problem[:200]

        def hit(result: Any) -> Any:
            try:
                if self.adopt(op_inst, result, arch):
                    return None
            except RpcError as err:
                self.warn_once("hardware_aware_finetune", err)
            except Exception as err:  # their loader raised on these files: tuning is still possible
                logger.debug("tunecache: loading the tuned BitBLAS operator raised", exc_info=err)
            if self.replaying():
                logger.warning("tunecache: the tuned BitBLAS operator for %s could not be loaded; replay keeps "
                               "its default schedule", described)
                return None
            logger.warning("tunecache: the tuned BitBLAS operator for %s could not be loaded; tuning here", described)
            return original(op_inst, *args, **kwargs)

        def tune_here() -> Tuple[Any, Optional[Any]]:
            answer = original(op_inst, *args, **kwargs)
            scratch = tempfile.mkdtemp(prefix="tunecache-bitblas-tune-")
            try:
                entry = self.built_entry(self.cache_module.OperatorCache(), op_inst.config, op_inst, arch, key, scratch)
            except Exception as err:
                logger.warning("tunecache: the tuned BitBLAS operator for %s could not be stored (%s); "
                               "gave the lease up", described, err)
                return answer, None
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return answer, entry.result

        def fall_back(reason: Optional[str]) -> Any:
            if reason is not None and self.replaying():
                # Not cached (logged once per key by the client): the operator keeps the default
                # schedule it was built with, as BitBLAS does when it does not tune.
                return None
            if reason is not None:
                logger.warning("tunecache: no tuned BitBLAS operator for %s within the wait (%s); tuning here",
                               described, reason)
            return original(op_inst, *args, **kwargs)

        return self.tune_once(
            key,
            wait_ms=env_ms(WAIT_ENV, DEFAULT_WAIT_MS),
            lease_ms=env_ms(LEASE_ENV, DEFAULT_LEASE_MS),
            what="hardware_aware_finetune",
            hit=hit,
            tune=tune_here,
            fall_back=fall_back,
            refused=lambda error: logger.warning("tunecache: the daemon refused BitBLAS operator %s (%s)",
                                                 described, error.details()),
            recorded=lambda: setattr(op_inst, SENT_ATTR, _key_id(key)),
        )

    def adopt(self, op_inst: Any, result: Any, arch: str) -> bool:
        """Makes ``op_inst`` the operator BitBLAS's loader builds from ``result``'s files: they
        are laid out in a directory of this process, their ``_load_operator`` builds a new
        operator there, and ``op_inst`` takes its state. False when that built nothing."""
        root = self.dirs.new("tuned")
        config_path = self.lay_out(result, arch, root)
        if config_path is None:
            return False
        scratch = self.cache_module.OperatorCache()
        scratch._load_operator(config_path, _loader_target(op_inst))
        loaded = [op for op in scratch.cache.values()]
        if len(loaded) != 1:
            return False
        vars(op_inst).update(vars(loaded[0]))
        setattr(op_inst, LOADED_ATTR, True)
        return True


def _loader_target(op_inst: Any) -> Any:
    """The target the operator was made with (the string, when it was one), for their loader."""
    target = getattr(op_inst, TARGET_ATTR, None)
    return target if target is not None else op_inst.target


def _operator_arch(cache_module: Any, op_inst: Any) -> Optional[str]:
    """BitBLAS's arch string of the target ``op_inst`` was made with: the string itself (as
    ``bitblas.Linear`` passes ``auto_detect_nvidia_target()``), else their rule for a ``Target``
    (``cuda-gpu-sm_90a``). None when it has no target."""
    target = _loader_target(op_inst)
    if target is None:
        return None
    try:
        return cache_module.OperatorCache._determine_target_arch_str(None, target)
    except Exception:
        return None


# --- installing the patches ------------------------------------------------------------------------

_installed: Dict[str, Any] = {}
_install_lock = threading.Lock()


def installed() -> bool:
    return bool(_installed)


def install(socket: Optional[str] = None, timeout: float = 5.0) -> None:
    """Patches BitBLAS's operator cache and tuning to use tunecached (see the module doc).
    Idempotent; call it once per process before BitBLAS builds operators. ``socket``: the
    daemon's socket (default: ``$TUNECACHE_SOCKET``, then the default path)."""
    with _install_lock:
        if _installed:
            return
        cache_module = importlib.import_module(CACHE_MODULE)
        operator_module = importlib.import_module(OPERATOR_MODULE)
        bridge = _Bridge(cache_module, socket, timeout)
        cache_class = cache_module.OperatorCache
        operator_class = operator_module.Operator
        original_save = cache_class.save_into_database
        original_load = cache_class.load_from_database
        original_tune = operator_class.hardware_aware_finetune
        original_init = operator_class.__init__

        @functools.wraps(original_save)
        def save_into_database(self: Any, database_path: Any = None, target: Any = None) -> None:
            with self.cache_locker:
                if not bridge.through_daemon("save_into_database", lambda: bridge.save(self, target)):
                    return original_save(self, database_path, target)
                return None

        @functools.wraps(original_load)
        def load_from_database(self: Any, database_path: Any, target: Any = None) -> None:
            if target is None:  # their loader cannot name an arch either: as stock
                return original_load(self, database_path, target)
            with self.cache_locker:
                if not bridge.through_daemon("load_from_database", lambda: bridge.load(self, target, original_load)):
                    return original_load(self, database_path, target)
                return None

        @functools.wraps(original_tune)
        def hardware_aware_finetune(self: Any, *args: Any, **kwargs: Any) -> Any:
            return bridge.tune(self, original_tune, args, kwargs)

        @functools.wraps(original_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            target = kwargs["target"] if "target" in kwargs else (args[2] if len(args) > 2 else None)
            original_init(self, *args, **kwargs)
            # Their Operator turns a string target into a Target, which forgets the tag: keep
            # the string, the name their save and load give the database directory.
            if isinstance(target, str):
                setattr(self, TARGET_ATTR, target)

        cache_class.save_into_database = save_into_database
        cache_class.load_from_database = load_from_database
        operator_class.hardware_aware_finetune = hardware_aware_finetune
        operator_class.__init__ = __init__
        _installed.update(
            bridge=bridge,
            cache_class=cache_class,
            operator_class=operator_class,
            originals=(original_save, original_load, original_tune, original_init),
        )


def uninstall() -> None:
    """Undoes ``install()`` (for tests and for switching sockets)."""
    with _install_lock:
        if not _installed:
            return
        original_save, original_load, original_tune, original_init = _installed["originals"]
        _installed["cache_class"].save_into_database = original_save
        _installed["cache_class"].load_from_database = original_load
        _installed["operator_class"].hardware_aware_finetune = original_tune
        _installed["operator_class"].__init__ = original_init
        _installed.clear()
