# Owns the generic autotuning helper for Python kernel launchers (BitBLAS, Triton-style kernels,
# hand-written CUDA): timing of every config by the one process that holds the node-wide lease
# (the drop-ins' tune-once dispatch, integrations/_base.py), Record of the best with its
# statistics (and the files beside it, uploaded as artifacts), an in-process memo, and the Forget
# of a cached config the kernel raises for.
"""``tunecache.autotune``: tune a problem once per node, reuse it everywhere.

As a decorator, the wrapped function receives the chosen config as ``config=``::

    @tunecache.autotune("bitblas", "matmul", key_fn=lambda a, b: {"m": a.shape[0], ...},
                        configs=[{"block": 64}, {"block": 128}], bench=run_matmul)
    def matmul(a, b, *, config): ...

As a plain call: ``tunecache.autotune(...).best(a, b)`` returns the config.

On the first call for a problem (``key_fn(*args, **kwargs)``), the helper Resolves it with the
daemon. A hit is used at once. The process granted the lease calls ``bench(config, *args,
**kwargs)`` for every config, ``warmup`` times untimed, then ``repeats`` times timed, and takes
the median, as ``triton.testing.do_bench`` does; it Records the best with its statistics. The
other processes wait for that result. If the daemon refuses it (a config that is not strict JSON,
such as one holding NaN, or a record over 64 KiB), the holder gives its lease up at once, logs the
daemon's reason, and uses its own config; a waiter then times for itself. Later calls in the
process hit an in-process memo. If the lease holder dies, the daemon frees its lease and a waiter
tunes instead. Without a daemon, every process tunes for itself (one warning).

``bench`` runs the kernel once with the config. If it returns a number, that number is the
measured time in microseconds (e.g. from CUDA events); if it returns anything else, the helper
measures the call's wall time with ``time.perf_counter_ns`` (synchronize inside ``bench``). A
config for which ``bench`` raises is skipped.

A cached config can be broken here even though it was tuned somewhere: a config tuned by an
older build of the kernel, or one that no longer is among ``configs``. When the decorated
function raises (an ``Exception``) with a config that came from the cache, the helper sends the
daemon a Forget of that key ``only_if`` its winner is still that result (so a better result
recorded since stays; the Forget reaches every node), tunes the problem again as on a miss
(Resolve, and the lease holder times every config; ``bench`` raising for the broken one skips it)
and calls the function once more with the new config. The first such case in a process is logged
at WARNING, later ones at DEBUG. If the second call raises too, its exception propagates, and so
does a failure to tune again. If the Forget does not take (an older daemon without Forget, or one
gone since), the helper tunes for itself and Records its result, so that the faster one wins.

Which configs are forgotten: only one that came from the cache and has not completed a call in
this process yet. A config this process tuned has just run ``bench`` for this very problem, and
one that completed a call has run the kernel for it; an exception with either is taken to be
about the arguments or the device (bad inputs, out of memory), not the config, and propagates as
it is: forgetting it would send every process on every node to tune the problem again for
nothing. A call retries at most once, so the config of its retry is not forgotten in that call.
With ``.best()`` the caller runs the kernel, so the helper cannot see it fail and forgets nothing.

Files beside a config (a compiled kernel, a module): ``artifacts={name: path}``, or a callable
``artifacts(config, *args, **kwargs) -> {name: path}`` called with the best config, names files
that the process that tuned uploads to the node's artifact store (``Client.put_artifacts``) and
names in the Record. ``.fetch_artifacts(dir, *args, **kwargs)`` writes the files of the stored
result for those arguments into ``dir``, each verified against its digest. If the files cannot
be uploaded (one missing, a name refused, the daemon failing), the holder gives its lease up,
logs why, and uses its own config.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tunecache import client as client_module
from tunecache.client import Client, Entry, Key, Result, tuned_by
from tunecache.errors import RpcError
from tunecache.integrations._base import Daemon, DaemonUnreachable

logger = logging.getLogger("tunecache.autotuning")

DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 10
# How long a process waits for another that is tuning the same problem, per Resolve.
DEFAULT_WAIT_MS = 60_000
# How many Resolve rounds a waiter makes (each up to wait_ms) before it tunes for itself.
MAX_RESOLVE_ROUNDS = 10
DEVICE_ENV = "TUNECACHE_DEVICE"
# What a process does when the daemon cannot take its result (logged with the failure).
OWN_CONFIG = "this process uses its own best config"
# A result's provenance names the helper.
TUNER = "tunecache.autotune"


# A problem's config, and the Result of the daemon's it came from: None when this process tuned
# it, or once a call with it has completed (see the module doc: only such configs are forgotten).
Choice = Tuple[Any, Optional[Result]]


def default_device() -> str:
    """``$TUNECACHE_DEVICE``; else the current CUDA device as ``<name>|sm_<major><minor>`` when
    torch is already imported and sees one; else ``cpu|<machine>``."""
    configured = os.environ.get(DEVICE_ENV, "")
    if configured:
        return configured
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"{torch.cuda.get_device_name()}|sm_{major}{minor}"
    except Exception:  # a broken CUDA setup must not stop the kernel launcher
        pass
    return f"cpu|{platform.machine()}"


def problem_text(problem: Any) -> str:
    """Key.problem for what key_fn returned: a string as is, anything else as canonical JSON."""
    if isinstance(problem, str):
        return problem
    return json.dumps(problem, sort_keys=True, separators=(",", ":"))


def _config_json(config: Any) -> Any:
    """The JSON form of a config (tuples become lists), to compare and to store."""
    return json.loads(json.dumps(config))


def measure(bench: Callable[..., Any], config: Any, args: Sequence[Any], kwargs: Dict[str, Any],
            warmup: int, repeats: int) -> List[float]:
    """Microseconds of ``repeats`` timed calls of bench(config, ...), after ``warmup`` untimed."""
    for _ in range(warmup):
        bench(config, *args, **kwargs)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        reported = bench(config, *args, **kwargs)
        elapsed_us = (time.perf_counter_ns() - started) / 1000.0
        if isinstance(reported, (int, float)) and not isinstance(reported, bool):
            elapsed_us = float(reported)
        samples.append(elapsed_us)
    return samples


class _Daemon(Daemon):
    """The helper's client, the one given or else the process's default one (get_or_tune's),
    with the package's one daemon warning (tunecache.client's) instead of a drop-in's."""

    def __init__(self, client: Optional[Client]):
        # No warning of its own: report() says every problem as get_or_tune does.
        super().__init__(logger, "", "", connect=lambda: client or client_module._process_client())

    def report(self, call: str, problem: Any, key: Any) -> None:
        if isinstance(problem, DaemonUnreachable):
            client_module._warn_once_daemon_problem(client_module.default_socket_path(), "connect", problem)
        else:
            client_module.report_failures(self.socket_path, [(call, problem)], key, OWN_CONFIG)


class Autotuner:
    """One tuned operation: ``best(*args, **kwargs)`` gives its config for the problem of those
    arguments; calling it on a function decorates that function. Thread- and fork-safe."""

    def __init__(
        self,
        namespace: str,
        op: str,
        key_fn: Callable[..., Any],
        configs: Sequence[Any],
        bench: Callable[..., Any],
        *,
        device: Optional[str] = None,
        warmup: int = DEFAULT_WARMUP,
        repeats: int = DEFAULT_REPEATS,
        wait_ms: int = DEFAULT_WAIT_MS,
        lease_ms: int = 0,
        client: Optional[Client] = None,
        artifacts: Any = None,
    ):
        if not configs:
            raise ValueError("autotune needs at least one config")
        if repeats < 1 or warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        self.namespace = namespace
        self.op = op
        self.key_fn = key_fn
        self.configs = list(configs)
        self.bench = bench
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.wait_ms = wait_ms
        self.lease_ms = lease_ms
        self._daemon = _Daemon(client)
        self.artifacts = artifacts
        self._config_json = [_config_json(config) for config in self.configs]
        self._memo: Dict[str, Choice] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def tuned(*args: Any, **kwargs: Any) -> Any:
            problem = problem_text(self.key_fn(*args, **kwargs))
            choice = self._choose(problem, args, kwargs)
            try:
                answer = function(*args, config=choice[0], **kwargs)
            except Exception as error:
                if choice[1] is None:
                    raise
                # A cached config this process never ran to completion: it may be broken here.
                choice = self._replace_broken(problem, choice, error, args, kwargs)
                answer = function(*args, config=choice[0], **kwargs)
            self._completed(problem, choice)
            return answer

        tuned.autotuner = self  # type: ignore[attr-defined]
        return tuned

    def best(self, *args: Any, **kwargs: Any) -> Any:
        """The config for the problem of these arguments (tuned at most once per node)."""
        return self._choose(problem_text(self.key_fn(*args, **kwargs)), args, kwargs)[0]

    def fetch_artifacts(self, dir: Any, *args: Any, **kwargs: Any) -> List[str]:
        """Writes the files the stored result for the problem of these arguments names into the
        existing directory ``dir`` (``Client.fetch_artifacts``: each verified against its
        digest); answers the paths written, [] when nothing is stored for it."""
        key = self._key(problem_text(self.key_fn(*args, **kwargs)))
        try:
            daemon = self._daemon.client()
        except DaemonUnreachable as err:  # the caller asked for the files: the client's own error
            raise err.__cause__ from None
        hits = daemon.lookup([key])
        return daemon.fetch_artifacts(hits[0], dir) if hits else []

    def _attach_artifacts(self, key: Key, config: Any, result: Result,
                          args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
        """Uploads the files ``artifacts`` names for ``config`` and names them in ``result``;
        False (logged) when they cannot be: the caller then records nothing."""
        if self.artifacts is None:
            return True
        try:
            files = self.artifacts(config, *args, **kwargs) if callable(self.artifacts) else self.artifacts
            if files:
                result.artifacts = self._daemon.client().put_artifacts(files)
            return True
        except (RpcError, DaemonUnreachable) as err:
            self._daemon.report("PutArtifact", err, key)
        except Exception as err:  # a missing file or a refused name must not stop the kernel
            logger.warning("tunecache: the artifacts of %s cannot be stored (%s); %s",
                           client_module.describe_key(key), err, OWN_CONFIG)
        return False

    def _lock(self, problem: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(problem, threading.Lock())

    def _choose(self, problem: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> Choice:
        with self._lock(problem):
            if problem not in self._memo:
                self._memo[problem] = self._resolve(problem, args, kwargs)
            return self._memo[problem]

    def _completed(self, problem: str, choice: Choice) -> None:
        """A call with ``choice`` returned: its config works for this problem, never forget it."""
        if choice[1] is None:
            return
        with self._lock(problem):
            if self._memo.get(problem) is choice:
                self._memo[problem] = (choice[0], None)

    def _replace_broken(
        self, problem: str, broken: Choice, error: Exception, args: Sequence[Any], kwargs: Dict[str, Any]
    ) -> Choice:
        """Forgets the cached result behind ``broken`` (only if it is still the key's winner) and
        tunes the problem again; returns the new choice. A thread that finds ``broken`` already
        replaced by another takes that one."""
        with self._lock(problem):
            current = self._memo.get(problem)
            if current is not None and current is not broken:
                return current
            key = self._key(problem)
            _warn_once_broken_config(key, broken[0], error)
            self._forget(key, broken[1])
            # As on a miss; should the daemon still answer the broken result, _resolve tunes here.
            choice = self._resolve(problem, args, kwargs, broken=broken[1])
            self._memo[problem] = choice
            return choice

    def _forget(self, key: Key, result: Result) -> None:
        """Forgets ``key`` on every node, only if ``result`` is still its winner. A failure (a
        daemon without Forget, or none) is the once-per-process daemon warning: the caller tunes
        again regardless."""
        try:
            forgotten = self._daemon.client().forget(key.namespace, key.op, key.device, key.problem, only_if=result)
        except (RpcError, DaemonUnreachable) as err:
            self._daemon.report("Forget", err, key)
            return
        # 0: the winner is no longer that result (someone forgot it first, or recorded a better one).
        logger.debug("tunecache: Forget of %s dropped %d entries", client_module.describe_key(key), forgotten)

    # --- the node-wide part ------------------------------------------------------------------------

    def _key(self, problem: str) -> Key:
        device = self.device if self.device is not None else default_device()
        return Key(namespace=self.namespace, op=self.op, device=device, problem=problem)

    def _resolve(
        self, problem: str, args: Sequence[Any], kwargs: Dict[str, Any], broken: Optional[Result] = None
    ) -> Choice:
        """The problem's config from the daemon, or tuned here: the base's tune-once dispatch
        (the Rust client's split lease). The lease holder times every config and Records the
        best (a tuning that raises gives the lease up first, then propagates); a miss (the wait
        ran out, or the holder gave its lease up) asks again, up to MAX_RESOLVE_ROUNDS times.
        This process uses its own best config whatever the daemon says of it. ``broken``: a
        result just forgotten; should the daemon still answer it (the Forget did not take),
        tune here."""
        key = self._key(problem)

        def tune() -> Tuple[Choice, Optional[Result]]:
            config, result = self._tune(key, args, kwargs)
            return (config, None), (result if self._attach_artifacts(key, config, result, args, kwargs) else None)

        def hit(result: Result) -> Choice:
            found = self._config_from_result(result)
            if found is not None and not _same_result(result, broken):
                return found[0], result
            # A result this helper cannot read, or the broken one still: tune and let the faster
            # one win.
            config, tuned = self._tune(key, args, kwargs)
            if self._attach_artifacts(key, config, tuned, args, kwargs):
                self._record(key, tuned)
            return config, None

        def fall_back(reason: Optional[str]) -> Choice:
            if reason is not None:
                logger.warning("tunecache: no result for %s after %d waits; tuning here",
                               client_module.describe_key(key), MAX_RESOLVE_ROUNDS)
            # Else the daemon is away or failing (warned once): tune for this process only.
            return self._tune(key, args, kwargs)[0], None

        return self._daemon.tune_once(key, wait_ms=self.wait_ms, lease_ms=self.lease_ms, what=key, hit=hit,
                                      tune=tune, fall_back=fall_back, rounds=MAX_RESOLVE_ROUNDS)

    def _tune(self, key: Key, args: Sequence[Any], kwargs: Dict[str, Any]):
        """Times every config; returns (best config, the Result to record)."""
        medians: List[Optional[float]] = []
        best_index, best_samples = -1, None
        failures = 0
        for index, config in enumerate(self.configs):
            try:
                samples = measure(self.bench, config, args, kwargs, self.warmup, self.repeats)
                median = statistics.median(samples)
                if not math.isfinite(median) or median < 0:
                    raise ValueError(f"measured {median} us")
            except Exception as err:
                failures += 1
                logger.info("tunecache: config %r failed for %s: %s", config, client_module.describe_key(key), err)
                medians.append(None)
                continue
            medians.append(median)
            if best_samples is None or median < statistics.median(best_samples):
                best_index, best_samples = index, samples
        if best_samples is None:
            raise RuntimeError(
                f"tunecache: every one of the {len(self.configs)} configs failed for {client_module.describe_key(key)}"
            )
        median = statistics.median(best_samples)
        stored = {
            "config": self._config_json[best_index],
            "index": best_index,
            "stats": {
                "median_us": median,
                "min_us": min(best_samples),
                "max_us": max(best_samples),
                "warmup": self.warmup,
                "repeats": self.repeats,
                "configs_timed": len(self.configs) - failures,
                "configs_failed": failures,
                "medians_us": medians,
            },
        }
        result = Result(
            config=json.dumps(stored),
            time_us=median,
            tuned_by=tuned_by(TUNER),
            tuned_at_unix_ms=int(time.time() * 1000),
        )
        return self.configs[best_index], result

    def _config_from_result(self, result: Result):
        """(config,) from a stored result, the caller's own config object when it is one of
        ``configs``; None when the result is not this helper's."""
        try:
            stored = json.loads(result.config)
            config = stored["config"]
            index = stored.get("index")
        except (ValueError, TypeError, KeyError):
            logger.warning("tunecache: a stored result for %s/%s is not the helper's; retuning", self.namespace, self.op)
            return None
        if isinstance(index, int) and 0 <= index < len(self.configs) and self._config_json[index] == config:
            return (self.configs[index],)
        for position, candidate in enumerate(self._config_json):
            if candidate == config:
                return (self.configs[position],)
        return (config,)

    def _record(self, key: Key, result: Result) -> None:
        """Records a result tuned without a lease (the faster one wins); a failure is the
        once-per-process daemon warning, and this process uses its own best config either way."""
        try:
            self._daemon.client().record([Entry(key=key, result=result)])
        except (RpcError, DaemonUnreachable) as err:
            self._daemon.report("Record", err, key)


def _same_result(result: Result, other: Optional[Result]) -> bool:
    """What Forget's only_if compares: the config text and time_us."""
    return other is not None and result.config == other.config and result.time_us == other.time_us


# --- once-per-process warning about a broken cached config ------------------------------------------
# A launcher calls its kernels in a loop over many problems; after a kernel update every cached
# problem may break in turn. One warning says what happens; the rest go to DEBUG. The pid makes a
# forked child warn once on its own.
_broken_warned_pid: Optional[int] = None
_broken_warn_lock = threading.Lock()


def _warn_once_broken_config(key: Key, config: Any, error: Exception) -> None:
    global _broken_warned_pid
    with _broken_warn_lock:
        first = _broken_warned_pid != os.getpid()
        _broken_warned_pid = os.getpid()
    log = logger.warning if first else logger.debug
    log(
        "tunecache: the cached config %r for %s raised %s: %s; forgetting it (on every node, "
        "unless a better result replaced it), tuning again and retrying once.%s",
        config,
        client_module.describe_key(key),
        type(error).__name__,
        error,
        " Further such cases in this process are logged at DEBUG." if first else "",
    )


def autotune(
    namespace: str,
    op: str,
    key_fn: Callable[..., Any],
    configs: Sequence[Any],
    bench: Callable[..., Any],
    **options: Any,
) -> Autotuner:
    """An :class:`Autotuner`: decorate a function with it, or call ``.best(*args)``. Options:
    ``device`` (default :func:`default_device`), ``warmup`` (3), ``repeats`` (10), ``wait_ms``,
    ``lease_ms``, ``client``, ``artifacts`` ({name: path}, or a callable of the best config and
    the arguments answering one: files stored beside the config)."""
    return Autotuner(namespace, op, key_fn, configs, bench, **options)
