# Owns the Python face of the daemon client: the public Client class and get_or_tune over the
# native binding of tunecache-client (tunecache._native, built from client/python/src), and the
# once-per-process warnings that turn every cache problem into "use the fallback" so that
# nothing here can stop or crash a model. Socket discovery and trust, auto-start, the connection,
# the rank flow (Resolve, tune, Record, giving the lease up), artifacts (upload, verified fetch,
# the name and digest rules) and error details are the Rust client's; this module only presents
# them (logging, JSON decoding of configs).
"""Client for tunecached, the per-node GPU autotuning cache daemon."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Tuple, Union

from tunecache import _native
from tunecache.errors import ArtifactError, RpcError, StatusCode, UntrustedDaemonError, UntrustedSocketError

logger = logging.getLogger("tunecache")

SOCKET_ENV = "TUNECACHE_SOCKET"
# Extra daemon uids a client trusts besides its own and root's (comma-separated), for a daemon
# run by another account, e.g. the system unit's `tunecache` user. Read by the Rust client.
TRUST_UID_ENV = "TUNECACHE_TRUST_UID"
SOCKET_DIR_NAME = "tunecache"
SOCKET_FILE_NAME = "tunecache.sock"

# Deadline of one plain call. The daemon is local and answers from memory, so seconds are plenty;
# a daemon that takes longer is as good as absent for a rank.
DEFAULT_TIMEOUT_S = 5.0
# Scan streams the whole cache; its deadline covers the full stream.
DEFAULT_SCAN_TIMEOUT_S = 60.0
# How long get_or_tune waits for another rank that is tuning the same key.
DEFAULT_WAIT_MS = 60_000
# The daemon caps Resolve waits at 10 minutes; asking for more only stretches our deadline.
MAX_WAIT_MS = 600_000

# For code that talks raw gRPC to the daemon with grpcio (the `[grpc]` extra's stubs): over a
# Unix socket grpcio (>= 1.57) sends the %-encoded socket path as the HTTP/2 `:authority`, which
# is not a valid authority, and tonic's HTTP/2 layer (h2) rejects such requests outright. The
# package itself does not use grpcio.
CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"),)

Key = _native.Key
Result = _native.Result
Entry = _native.Entry
Artifact = _native.Artifact
KeyLike = Union[Key, Mapping[str, Any]]
EntryLike = Union[Entry, Mapping[str, Any]]
# A Result, or a mapping with its fields (Forget's only_if reads config and time_us).
ResultLike = Union[Result, Mapping[str, Any]]
# What a tune function returns: the winning config (JSON text, or a JSON-serializable value)
# and its measured time in microseconds.
# Or, with files to store beside the config, (config, time_us, {name: path}).
TuneOutput = Tuple[Union[str, Any], float]
# Files to store beside a result: {name: path}, or (name, path) pairs.
ArtifactFiles = Union[Mapping[str, Union[str, os.PathLike]], Iterable[Tuple[str, Union[str, os.PathLike]]]]

__all__ = ["ArtifactError", "UntrustedDaemonError", "UntrustedSocketError", "RpcError", "StatusCode"]


def default_socket_path(environ: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """The socket the daemon and every client use by default: $TUNECACHE_SOCKET, else
    $XDG_RUNTIME_DIR/tunecache/tunecache.sock, else /tmp/tunecache-<uid>/tunecache.sock.
    An empty variable counts as unset. For this process's environment the answer is the Rust
    client's; ``environ``/``uid`` ask what it would be for another environment (the same rule,
    which tests/test_without_daemon.py checks against the Rust one)."""
    if environ is None and uid is None:
        return os.fspath(_native.default_socket_path())
    environ = os.environ if environ is None else environ
    explicit = environ.get(SOCKET_ENV, "")
    if explicit:
        return explicit
    runtime_dir = environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir:
        return os.path.join(runtime_dir, SOCKET_DIR_NAME, SOCKET_FILE_NAME)
    uid = os.getuid() if uid is None else uid
    return os.path.join("/tmp", f"tunecache-{uid}", SOCKET_FILE_NAME)


def check_default_socket(path: Union[str, os.PathLike], uid: Optional[int] = None) -> None:
    """Refuses (UntrustedSocketError) a default socket another user could have planted, as
    ssh-agent does for its directory: the directory and the socket must be owned by the caller
    or root and not be symlinks, and the directory must not be writable by group or others.
    A directory or socket that does not exist yet passes (there is nothing to talk to).
    ``uid``: the caller's (the only one the Rust check knows); another is refused."""
    if uid is not None and uid != os.getuid():
        raise ValueError(f"check_default_socket checks for the caller's uid {os.getuid()}, not {uid}")
    _native.check_default_socket(os.fspath(path))


def check_daemon_uid(path: Union[str, os.PathLike], timeout: float = DEFAULT_TIMEOUT_S) -> Optional[int]:
    """Refuses (UntrustedDaemonError) a socket whose daemon runs as a uid other than the
    caller's, root's or one in $TUNECACHE_TRUST_UID, on any path, named or default. The uid is
    the daemon's own, read from a connection to the socket (SO_PEERCRED). Returns that uid, or
    None when nothing answers. (``timeout`` is accepted for compatibility; connecting to a
    local socket does not wait.)"""
    del timeout
    return _native.check_daemon_uid(os.fspath(path))


_STATUS_DETAILS_KEY = "grpc-status-details-bin"


def refused_entry_index(error: BaseException) -> Optional[int]:
    """The index of the entry a Record's INVALID_ARGUMENT refused, read from the standard
    google.rpc.BadRequest detail the daemon sends with it (field path `entries[<index>]...`);
    None when the error names no entry. A caller drops that entry and sends the rest again.
    Takes this package's RpcError, or a grpcio one (from the `[grpc]` extra's stubs): both are
    read by the Rust client's one reader of the detail."""
    if isinstance(error, RpcError):
        return error.refused_entry_index
    code = getattr(error, "code", None)
    trailers = getattr(error, "trailing_metadata", None)
    if not callable(code) or not callable(trailers):
        return None
    status = code()
    number = status.value[0] if isinstance(getattr(status, "value", None), tuple) else None
    if number is None:
        return None
    for name, value in trailers() or ():
        if name == _STATUS_DETAILS_KEY:
            details = error.details() if callable(getattr(error, "details", None)) else ""
            return _native.refused_entry_index_of(number, details or "", bytes(value))
    return None


def _as_key(key: KeyLike) -> Key:
    if isinstance(key, Key):
        return key
    if isinstance(key, Mapping):
        return Key(**dict(key))
    # A generated tunecache.v1.Key (the `[grpc]` extra) or anything with its attributes.
    return Key(
        namespace=key.namespace,
        op=key.op,
        device=key.device,
        problem=key.problem,
        rank=key.rank if key.HasField("rank") else None,
    )


def describe_key(key: Key) -> str:
    rank = f" rank {key.rank}" if key.HasField("rank") else ""
    return f"{key.namespace}/{key.op} on {key.device!r}{rank}: {key.problem}"


def describe_problem(problem: Any) -> str:
    """An RpcError as `CODE: details`, anything else as its text."""
    if isinstance(problem, RpcError):
        return f"{problem.code()}: {problem.details()}"
    return str(problem)


class _TuningFailed(Exception):
    """tune_fn raised or returned something unusable (already logged): the lease is given up."""


class Client:
    """One connection to tunecached, made on the first call. Thread-safe and fork-safe: a
    forked child (a DataLoader worker, a multiprocessing fork) gets its own connection on its
    first call. Every call releases the GIL while it waits, and Ctrl-C interrupts it. Every call
    has a deadline: `timeout` seconds unless the call says otherwise."""

    def __init__(
        self,
        socket: Union[str, os.PathLike, None] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        view: Optional[str] = None,
    ):
        """``socket``: the daemon's socket; by default $TUNECACHE_SOCKET, else the default path,
        whose directory is checked first (UntrustedSocketError). On every path the daemon, if
        one answers, must run as the caller, root or a uid in $TUNECACHE_TRUST_UID
        (UntrustedDaemonError).

        ``view``: the job's view, used only when the environment names none ($TUNECACHE_VIEW,
        then Slurm's job and step, then torchrun's run id; see tunecache.view). Within a view the
        first answer for a key is pinned: every rank of the job reads the same result. The
        resolved name is ``self.view`` (empty: no view)."""
        self._native = _native.Client(None if socket is None else os.fspath(socket), float(timeout), view)
        self.socket_path = self._native.socket_path
        self.timeout = timeout
        self.view = self._native.view

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def lookup(self, keys: Iterable[KeyLike], timeout: Optional[float] = None) -> list:
        """The cached entries among `keys` (hits only, in request order), in the client's view."""
        return self._native.lookup(keys, timeout)

    def record(self, entries: Iterable[EntryLike], lease_id: str = "", timeout: Optional[float] = None):
        """Stores entries (a lower time_us wins over what the cache holds). With the lease_id from
        Resolve it completes that lease; with a lease_id and no entries it gives the lease up.
        Answers a RecordResponse (`stored`, `unchanged`)."""
        return self._native.record(entries, lease_id, timeout)

    def scan(
        self,
        namespace: str = "",
        device: str = "",
        timeout: Optional[float] = DEFAULT_SCAN_TIMEOUT_S,
        rank: Optional[int] = None,
    ) -> Iterator[list]:
        """Yields the matching entries chunk by chunk (a list of Entry per chunk); empty filters
        match everything. With ``rank``, only the entries shared by all ranks and that rank's
        own (what a rank loads at start). In the client's view. The deadline covers the whole
        stream."""
        yield from self._native.scan(namespace, device, rank, timeout)

    def stats(self, timeout: Optional[float] = None):
        """The daemon's counters (the fields of tunecache.v1.StatsResponse as attributes)."""
        return self._native.stats(timeout)

    def devices(self, timeout: Optional[float] = None) -> list:
        return self._native.devices(timeout)

    def snapshot(self, timeout: Optional[float] = None):
        return self._native.snapshot(timeout)

    def forget(
        self,
        namespace: str,
        op: str = "",
        device: str = "",
        problem: str = "",
        rank: Optional[int] = None,
        only_if: Optional[ResultLike] = None,
        timeout: Optional[float] = None,
    ) -> int:
        """Forgets results on every node, for good; returns how many entries this node dropped.
        Without ``only_if``, every entry of ``namespace`` whose op, device and problem equal the
        non-empty ones given (``rank=None``: the shared entries and every rank's own), which only
        an administrator may do (root, the daemon's own uid, its --admin-uid / --admin-gid;
        anyone else gets PERMISSION_DENIED). With ``only_if`` (a Result, or a mapping with its
        ``config`` text and ``time_us``), the one key named (op, device and problem all given;
        ``rank=None``: the shared entry), and only while its winner has exactly that config and
        time_us: how a caller who may Record reports a config it found broken without dropping
        a better result recorded since. Raises RpcError, like the other calls."""
        return self._native.forget(namespace, op, device, problem, rank, only_if, timeout)

    def list_views(self, timeout: Optional[float] = None) -> list:
        """The views this node holds pins for (ViewInfo: name, pins, idle_ms), most recently read
        first."""
        return self._native.list_views(timeout)

    def end_view(self, name: str, timeout: Optional[float] = None):
        """Ends view ``name`` on this node (and, with the cluster tier, in Redis): its pins are
        dropped and the next read in it pins afresh. An administrator's act, like a scope
        Forget. Answers ``ended`` (the view existed on this node) and ``pins_dropped``."""
        return self._native.end_view(name, timeout)

    def resolve(
        self,
        key: KeyLike,
        wait_ms: int = DEFAULT_WAIT_MS,
        can_tune: bool = True,
        lease_ms: int = 0,
        timeout: Optional[float] = None,
    ):
        """Asks for key's result in the client's view: `hit` (use it), `tune_here` (tune, then record with
        tune_here.lease_id) or `miss` (use a fallback); ``WhichOneof("outcome")`` says which.
        The daemon may hold the call up to wait_ms, so the deadline is wait_ms plus the usual
        timeout."""
        return self._native.resolve(_as_key(key), _wait_ms(wait_ms), can_tune, max(0, int(lease_ms)), timeout)

    # --- the split lease, for callers with a tuning loop of their own (the drop-ins) -------------

    def begin_tune(
        self,
        key: KeyLike,
        wait_ms: int = DEFAULT_WAIT_MS,
        can_tune: bool = True,
        lease_ms: int = 0,
        timeout: Optional[float] = None,
    ):
        """Resolves key in the client's view, as the Rust client's ``begin_tune``: a TuneStart
        whose ``kind`` is "hit" (``result``), "tune" (``lease``: tune now, then end the lease
        with finish_tune or abandon) or "miss" (``reason``). Raises RpcError when the daemon
        cannot be asked."""
        return self._native.begin_tune(_as_key(key), _wait_ms(wait_ms), can_tune, max(0, int(lease_ms)), timeout)

    def finish_tune(self, lease: Any, result: ResultLike, timeout: Optional[float] = None):
        """Records ``result`` under ``lease`` (from begin_tune), which ends it. Answers a
        TuneFinish: ``error`` None when Recorded; else the RpcError, ``refused`` (the daemon
        refused the result itself) and ``lease`` ("given_up", "kept" after a deadline, when the
        Record may still land, or "give_up_failed"): the Rust client's rule, the same for every
        caller. Raises RpcError only when the daemon cannot be reached at all."""
        return self._native.finish_tune(lease, result, timeout)

    def abandon(self, lease: Any, timeout: Optional[float] = None) -> bool:
        """Gives ``lease`` up (tuning failed), so the next waiter tunes at once. False when it
        was ended already (nothing is sent)."""
        return self._native.abandon(lease, timeout)

    # --- artifacts: the files beside a result (a compiled kernel, a module) ------------------------

    def put_artifact(self, path: Union[str, os.PathLike], timeout: Optional[float] = None):
        """Uploads the file at ``path`` to the node's artifact store (hashed, then streamed in
        1 MiB chunks; never read whole into memory). Answers ``sha256``, ``size`` and
        ``already_held``; a Result names it with ``Artifact(name=..., sha256=..., size=...)``
        (or use put_artifacts). The daemon collects a blob no entry names after its grace
        period, so Record the result naming it soon after."""
        return self._native.put_artifact(os.fspath(path), timeout)

    def put_artifacts(self, files: ArtifactFiles, timeout: Optional[float] = None) -> list:
        """Uploads each file of ``files`` ({name: path}, or (name, path) pairs) and answers the
        list of Artifact naming them, for ``Result(artifacts=...)``. Names are 1-128 bytes of
        [A-Za-z0-9._-], not "." or "..", unique, at most 64 (checked before anything is
        uploaded: ArtifactError)."""
        if isinstance(files, Mapping):
            files = files.items()
        return self._native.put_artifacts([(name, os.fspath(path)) for name, path in files], timeout)

    def fetch_artifacts(self, entry: Any, dir: Union[str, os.PathLike], timeout: Optional[float] = None) -> list:
        """Writes each file ``entry`` (an Entry, or its Result) names into the existing
        directory ``dir`` as ``dir/<name>``, each verified against its digest as it is written
        to a temporary file, then renamed; answers the paths written (str). Raises ArtifactError
        for a name or digest refused or bytes that are not the blob named (its temporary file is
        deleted), RpcError when the daemon cannot serve a blob (NOT_FOUND), OSError for the
        directory."""
        return [os.fspath(path) for path in self._native.fetch_artifacts(entry, os.fspath(dir), timeout)]

    def stat_artifacts(self, digests: Iterable[str], timeout: Optional[float] = None) -> list:
        """Which of ``digests`` (lowercase hex SHA-256) this node cannot serve."""
        return self._native.stat_artifacts(list(digests), timeout)

    def record_keeping_valid(self, entries: Iterable[EntryLike], timeout: Optional[float] = None):
        """Records ``entries`` keeping every valid one (the Rust client's rule: an entry the
        daemon refuses is set aside, a batch over its message size is halved). Answers
        ``stored``, ``unchanged`` and ``refused``, a list of ``(index, entry, RpcError)``."""
        return self._native.record_keeping_valid(entries, timeout)

    def get_or_tune(
        self,
        key: KeyLike,
        tune_fn: Callable[[], TuneOutput],
        fallback: Any,
        wait_ms: int = DEFAULT_WAIT_MS,
        can_tune: bool = True,
        lease_ms: int = 0,
    ) -> Any:
        """The rank helper. Resolves key; on a hit returns the cached config decoded from JSON;
        when told to tune, runs tune_fn() -> (config, time_us), or (config, time_us, files) to
        store files beside it ({name: path}: uploaded with put_artifacts, then named in the
        result; a rank reads them with lookup and fetch_artifacts), records it under the lease and
        returns the config decoded from JSON (so the tuning rank gets what the others get); if
        tune_fn raises or returns something unusable, or the daemon refuses the result (a config
        over 64 KiB or not strict JSON; one warning with the daemon's reason), gives the lease up
        at once and returns fallback; on a miss returns fallback. When the daemon is absent or
        fails, returns fallback and logs one warning per process. Never raises (except
        KeyboardInterrupt/SystemExit from tune_fn, after giving the lease up) and never blocks
        longer than wait_ms plus the client timeout, plus tune_fn's own time."""
        try:
            key_message = _as_key(key)
        except Exception as err:
            logger.warning("tunecache: unusable key %r (%s); using the fallback", key, err)
            return fallback
        tuned: dict = {}

        def tune() -> tuple:
            try:
                answer = tune_fn()
                files = None
                if len(answer) == 3:
                    config, time_us, files = answer
                else:
                    config, time_us = answer
                config_text = config if isinstance(config, str) else json.dumps(config)
                decoded = json.loads(config_text)
                time_us = float(time_us)
                if not math.isfinite(time_us) or time_us < 0:
                    raise ValueError(f"time_us must be finite and >= 0, got {time_us}")
            except Exception:
                logger.warning(
                    "tunecache: tuning %s failed; giving the lease up and using the fallback",
                    describe_key(key_message),
                    exc_info=True,
                )
                raise _TuningFailed() from None
            tuned["config"] = decoded
            tuned_at = int(time.time() * 1000)
            if files:
                try:
                    artifacts = self.put_artifacts(files)
                except Exception:
                    logger.warning(
                        "tunecache: uploading the artifacts of %s failed; giving the lease up and using the fallback",
                        describe_key(key_message),
                        exc_info=True,
                    )
                    raise _TuningFailed() from None
                return config_text, time_us, _tuned_by(key_message), tuned_at, artifacts
            return config_text, time_us, _tuned_by(key_message), tuned_at

        try:
            outcome = self._rank_flow(key_message, tune, wait_ms, can_tune, lease_ms, "using the fallback")
        except Exception as err:  # a bug here must not reach the model either
            logger.warning("tunecache: get_or_tune failed for %s: %s", describe_key(key_message), err, exc_info=True)
            return fallback
        if outcome.kind == "cached":
            return _decoded_config(outcome.result.config, key_message, fallback)
        if outcome.kind == "tuned":
            # Recorded, or the daemon is failing: the model should use the tuned config either way.
            return tuned["config"]
        if not outcome.failures and outcome.raised is None:
            logger.debug("tunecache: miss for %s: %s", describe_key(key_message), outcome.reason)
        return fallback

    def _rank_flow(self, key: Key, tune: Callable[[], tuple], wait_ms: int, can_tune: bool, lease_ms: int,
                   consequence: str):
        """The Rust client's rank flow; logs its failed calls (see _report_failures) and raises
        again what tune raised, except _TuningFailed (already logged: the caller falls back)."""
        outcome = self._native.resolve_tune_record(key, tune, _wait_ms(wait_ms), can_tune, max(0, int(lease_ms)))
        self._report_failures(outcome.failures, key, consequence)
        if outcome.raised is not None and not isinstance(outcome.raised, _TuningFailed):
            raise outcome.raised
        return outcome

    def _report_failures(self, failures: list, key: Key, consequence: str) -> None:
        """A refused result (INVALID_ARGUMENT: a config over 64 KiB or not strict JSON, such as
        Python's NaN) is logged at WARNING with the daemon's reason and ``consequence``: the
        daemon works, the result is bad, so the once-per-process "daemon failing" warning stays
        unspent for a real outage. Any other failure is that warning."""
        for call, error in failures:
            if call == "Record" and isinstance(error, RpcError) and error.code() == StatusCode.INVALID_ARGUMENT:
                logger.warning(
                    "tunecache: the daemon refused the tuned result for %s: %s; gave the lease up so a "
                    "waiter can tune it; %s",
                    describe_key(key),
                    error.details(),
                    consequence,
                )
            else:
                _warn_once_daemon_problem(self.socket_path, call, error)


def _wait_ms(wait_ms: int) -> int:
    return max(0, min(int(wait_ms), MAX_WAIT_MS))


def _decoded_config(config_text: str, key: Key, fallback: Any) -> Any:
    try:
        return json.loads(config_text)
    except ValueError:
        logger.warning("tunecache: cached config for %s is not JSON; using the fallback", describe_key(key))
        return fallback


def _tuned_by(key: Key) -> str:
    rank = f" rank {key.rank}" if key.HasField("rank") else ""
    return f"{platform.node()} pid {os.getpid()}{rank} (python get_or_tune)"


# --- once-per-process warning -------------------------------------------------------------------
# A model calls get_or_tune for every tuned op; with the daemon down, a warning per call would
# flood the logs. The pid makes a forked child warn once on its own.
_warned_pid: Optional[int] = None
_warn_lock = threading.Lock()


def _warn_once_daemon_problem(socket_path: str, call: str, problem: Any) -> None:
    global _warned_pid
    detail = problem.details() if isinstance(problem, RpcError) else problem
    with _warn_lock:
        first = _warned_pid != os.getpid()
        _warned_pid = os.getpid()
    if first:
        logger.warning(
            "tunecache: daemon at %s unavailable or failing (%s: %s); using fallbacks. "
            "Further tunecache errors in this process are logged at DEBUG.",
            socket_path,
            call,
            detail,
        )
    else:
        logger.debug("tunecache: %s failed: %s", call, detail)


# --- one client per process, for the framework drop-ins --------------------------------------------
class ProcessClient:
    """A Client made on first use, plus a once-per-process warning flag: what a drop-in patched
    into a framework needs, so that a model never fails because of its cache and the log never
    floods. (The Client itself is fork-safe; the warning flag is per process.)"""

    def __init__(self, socket: Union[str, os.PathLike, None] = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.socket = socket
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._warned_pid: Optional[int] = None

    def client(self) -> Client:
        """This process's client (raises what Client() raises: UntrustedSocketError...)."""
        with self._lock:
            if self._client is None:
                self._client = Client(self.socket, timeout=self.timeout)
            return self._client

    @property
    def socket_path(self) -> str:
        if self._client is not None:
            return self._client.socket_path
        return os.fspath(self.socket) if self.socket is not None else "default socket"

    def first_warning(self) -> bool:
        """True once per process: the caller logs its first problem as a warning, the rest at
        debug."""
        with self._lock:
            first = self._warned_pid != os.getpid()
            self._warned_pid = os.getpid()
        return first


# --- process-wide default client -------------------------------------------------------------------
_default_client: Optional[Client] = None
_default_client_lock = threading.Lock()


def _process_client() -> Client:
    global _default_client
    with _default_client_lock:
        if _default_client is None:
            _default_client = Client()
        return _default_client


def get_or_tune(
    key: KeyLike,
    tune_fn: Callable[[], TuneOutput],
    fallback: Any,
    wait_ms: int = DEFAULT_WAIT_MS,
    can_tune: bool = True,
    lease_ms: int = 0,
    client: Optional[Client] = None,
) -> Any:
    """Client.get_or_tune on `client`, or on a per-process client for the default socket."""
    if client is None:
        try:
            client = _process_client()
        except Exception as err:
            _warn_once_daemon_problem(default_socket_path(), "connect", err)
            return fallback
    return client.get_or_tune(
        key, tune_fn, fallback, wait_ms=wait_ms, can_tune=can_tune, lease_ms=lease_ms
    )
