# Owns the Python face of the daemon client: tunecache.Client, the native binding's Client
# (tunecache._native, built from client/python/src, which declares every call once, with its
# documentation; tunecache/_native.pyi gives their types) plus what is Python by nature: the
# context manager and get_or_tune, whose logging and once-per-process warnings turn every cache
# problem into "use the fallback" so that nothing here can stop or crash a model. Socket
# discovery and trust, auto-start, the connection, the rank flow (Resolve, tune, Record, giving
# the lease up), artifacts (upload, verified fetch, the name and digest rules) and error details
# are the Rust client's; this module only presents them (logging, JSON decoding of configs).
"""Client for tunecached, the per-node GPU autotuning cache daemon."""

from __future__ import annotations

import collections.abc
import json
import logging
import math
import os
import platform
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Tuple, Union

from tunecache import _native
from tunecache.errors import ArtifactError, RpcError, StatusCode, UntrustedDaemonError, UntrustedSocketError

logger = logging.getLogger("tunecache")

SOCKET_ENV = "TUNECACHE_SOCKET"
# Extra daemon uids a client trusts besides its own and root's (comma-separated), for a daemon
# run by another account, e.g. the system unit's `tunecache` user. Read by the Rust client.
TRUST_UID_ENV = "TUNECACHE_TRUST_UID"
SOCKET_DIR_NAME = "tunecache"
SOCKET_FILE_NAME = "tunecache.sock"

# The calls' defaults, the binding's (client/python/src/args.rs). A plain call's deadline: the
# daemon is local and answers from memory, so seconds are plenty; a daemon that takes longer is
# as good as absent for a rank.
DEFAULT_TIMEOUT_S = _native.DEFAULT_TIMEOUT_S
# Scan streams the whole cache; its deadline covers the full stream.
DEFAULT_SCAN_TIMEOUT_S = _native.DEFAULT_SCAN_TIMEOUT_S
# How long get_or_tune (and Resolve) waits for another rank that is tuning the same key.
DEFAULT_WAIT_MS = _native.DEFAULT_WAIT_MS
# The daemon caps Resolve waits at 10 minutes; asking for more only stretches the deadline.
MAX_WAIT_MS = _native.MAX_WAIT_MS

# For code that talks raw gRPC to the daemon with grpcio (the `[grpc]` extra's stubs): over a
# Unix socket grpcio (>= 1.57) sends the %-encoded socket path as the HTTP/2 `:authority`, which
# is not a valid authority, and tonic's HTTP/2 layer (h2) rejects such requests outright. The
# package itself does not use grpcio.
CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"),)

Key = _native.Key
Result = _native.Result
Entry = _native.Entry
# Client.scan(..., lazy=True)'s answer: a read-only mapping from key to Entry.
ScanView = _native.ScanView
collections.abc.Mapping.register(ScanView)
Artifact = _native.Artifact
if TYPE_CHECKING:
    from tunecache._native import KeyLike
# What a tune function returns: the winning config (JSON text, or a JSON-serializable value)
# and its measured time in microseconds.
# Or, with files to store beside the config, (config, time_us, {name: path}).
TuneOutput = Tuple[Union[str, Any], float]

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


class Client(_native.Client):
    __doc__ = _native.Client.__doc__

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

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
            key_message = _native.as_key(key)
        except Exception as err:
            logger.warning("tunecache: unusable key %r (%s); using the fallback", key, err)
            return fallback
        tuned: dict = {}
        provenance = tuned_by("python get_or_tune", key_message.rank if key_message.HasField("rank") else None)

        def failed(doing: str) -> _TuningFailed:
            logger.warning(
                "tunecache: %s %s failed; giving the lease up and using the fallback",
                doing,
                describe_key(key_message),
                exc_info=True,
            )
            return _TuningFailed()

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
                raise failed("tuning") from None
            tuned["config"] = decoded
            tuned_at = int(time.time() * 1000)
            if files:
                try:
                    artifacts = self.put_artifacts(files)
                except Exception:
                    raise failed("uploading the artifacts of") from None
                return config_text, time_us, provenance, tuned_at, artifacts
            return config_text, time_us, provenance, tuned_at

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
        """The Rust client's rank flow; logs its failed calls (see report_failures) and raises
        again what tune raised, except _TuningFailed (already logged: the caller falls back)."""
        outcome = self.resolve_tune_record(key, tune, wait_ms, can_tune, lease_ms)
        report_failures(self.socket_path, outcome.failures, key, consequence)
        if outcome.raised is not None and not isinstance(outcome.raised, _TuningFailed):
            raise outcome.raised
        return outcome


def report_failures(socket_path: str, failures: list, key: Key, consequence: str) -> None:
    """Logs the failed daemon calls ``failures``, ``(call, error)`` pairs, of a tuning of
    ``key``. A refused result (INVALID_ARGUMENT: a config over 64 KiB or not strict JSON, such as
    Python's NaN) is logged at WARNING with the daemon's reason and ``consequence``: the daemon
    works, the result is bad, so the once-per-process "daemon failing" warning stays unspent for a
    real outage. Any other failure is that warning."""
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
            _warn_once_daemon_problem(socket_path, call, error)


def _decoded_config(config_text: str, key: Key, fallback: Any) -> Any:
    try:
        return json.loads(config_text)
    except ValueError:
        logger.warning("tunecache: cached config for %s is not JSON; using the fallback", describe_key(key))
        return fallback


def tuned_by(tuner: str, rank: Optional[int] = None) -> str:
    """A result's provenance, the same text for every Python tuner (get_or_tune, the drop-ins,
    tunecache.autotune): ``<host> pid <pid>[ rank <rank>] (<tuner>)``."""
    rank_text = "" if rank is None else f" rank {rank}"
    return f"{platform.node()} pid {os.getpid()}{rank_text} ({tuner})"


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
