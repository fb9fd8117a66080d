# Owns the Python side of talking to tunecached: where the socket is, the gRPC channel and the
# calls with their deadlines (Lookup, Scan and Resolve in the client's view, see view.py), and the
# rank helper get_or_tune, which turns every cache problem
# into "use the fallback" so that nothing here can stop or crash a model.
"""Client for tunecached, the per-node GPU autotuning cache daemon."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import socket as socketlib
import stat
import struct
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Tuple, Union

import grpc

try:
    from tunecache.v1 import tunecache_pb2 as pb
    from tunecache.v1 import tunecache_pb2_grpc as pb_grpc
except ImportError as err:
    raise ImportError(
        "tunecache: the generated gRPC stubs are missing; run "
        "`python client/python/gen_stubs.py` (needs grpcio-tools)"
    ) from err
except RuntimeError as err:
    # The stubs check at import that grpcio/protobuf are at least as new as their generator.
    raise ImportError(
        f"tunecache: the generated gRPC stubs do not match the installed grpcio/protobuf ({err}); "
        "regenerate them in this environment with `python client/python/gen_stubs.py`"
    ) from err

from tunecache.view import resolve_view

logger = logging.getLogger("tunecache")

SOCKET_ENV = "TUNECACHE_SOCKET"
# Extra daemon uids a client trusts besides its own and root's (comma-separated), for a daemon
# run by another account, e.g. the system unit's `tunecache` user. The Rust client reads it too.
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

# How Client._record_tuned ended.
_RECORDED, _REFUSED, _FAILED = "recorded", "refused", "failed"

# Over a Unix socket grpcio (>= 1.57) sends the %-encoded socket path as the HTTP/2 `:authority`,
# which is not a valid authority; tonic's HTTP/2 layer (h2) rejects such requests outright.
# Client sets this itself; callers never need it.
CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"),)

Key = pb.Key
Result = pb.Result
Entry = pb.Entry
KeyLike = Union[pb.Key, Mapping[str, Any]]
EntryLike = Union[pb.Entry, Mapping[str, Any]]
# A Result, or a mapping with its fields (Forget's only_if reads config and time_us).
ResultLike = Union[pb.Result, Mapping[str, Any]]
# What a tune function returns: the winning config (JSON text, or a JSON-serializable value)
# and its measured time in microseconds.
TuneOutput = Tuple[Union[str, Any], float]


class UntrustedSocketError(ConnectionError):
    """The default socket path is in a place another local user could have planted it."""


def default_socket_path(environ: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """The socket the daemon and every client use by default: $TUNECACHE_SOCKET, else
    $XDG_RUNTIME_DIR/tunecache/tunecache.sock, else /tmp/tunecache-<uid>/tunecache.sock.
    An empty variable counts as unset."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(SOCKET_ENV, "")
    if explicit:
        return explicit
    runtime_dir = environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir:
        return os.path.join(runtime_dir, SOCKET_DIR_NAME, SOCKET_FILE_NAME)
    uid = os.getuid() if uid is None else uid
    return os.path.join("/tmp", f"tunecache-{uid}", SOCKET_FILE_NAME)


def check_default_socket(path: str, uid: Optional[int] = None) -> None:
    """Refuses (UntrustedSocketError) a default socket another user could have planted, as
    ssh-agent does for its directory: the directory and the socket must be owned by the caller
    or root and not be symlinks, and the directory must not be writable by group or others.
    A directory or socket that does not exist yet passes (there is nothing to talk to)."""
    uid = os.getuid() if uid is None else uid
    directory = os.path.dirname(os.path.abspath(path))
    for place, kind in ((directory, "directory"), (path, "socket")):
        try:
            info = os.lstat(place)
        except FileNotFoundError:
            return
        except OSError as err:
            raise UntrustedSocketError(f"tunecache: cannot check the default socket {kind} {place}: {err}") from err
        if stat.S_ISLNK(info.st_mode):
            raise UntrustedSocketError(
                f"tunecache: refusing the default socket: {kind} {place} is a symlink; remove it, or "
                f"set {SOCKET_ENV} to a socket you trust"
            )
        if info.st_uid not in (uid, 0):
            raise UntrustedSocketError(
                f"tunecache: refusing the default socket: {kind} {place} is owned by uid {info.st_uid}, "
                f"not by uid {uid} or root; another user may have created it. Remove it, or set "
                f"{SOCKET_ENV} to a socket you trust"
            )
        if kind == "directory":
            if not stat.S_ISDIR(info.st_mode):
                raise UntrustedSocketError(f"tunecache: refusing the default socket: {place} is not a directory")
            if info.st_mode & 0o022:
                raise UntrustedSocketError(
                    f"tunecache: refusing the default socket: directory {place} is writable by group or "
                    f"others (mode {stat.S_IMODE(info.st_mode):04o}); it must be 0700 or 0755. Fix the mode, "
                    f"or set {SOCKET_ENV} to a socket you trust"
                )


class UntrustedDaemonError(UntrustedSocketError):
    """The daemon answering on the socket runs as a uid the caller does not trust."""


def trusted_daemon_uids(environ: Optional[Mapping[str, str]] = None) -> set:
    """The uids whose daemon this process talks to: its own, root, and $TUNECACHE_TRUST_UID."""
    environ = os.environ if environ is None else environ
    uids = {os.geteuid(), 0}
    for item in environ.get(TRUST_UID_ENV, "").split(","):
        if item.strip().isdigit():
            uids.add(int(item.strip()))
    return uids


def check_daemon_uid(path: str, timeout: float = DEFAULT_TIMEOUT_S) -> Optional[int]:
    """Refuses (UntrustedDaemonError) a socket whose daemon runs as a uid other than the
    caller's, root's or one in $TUNECACHE_TRUST_UID, on any path, named or default: a squatted
    path must not get a rank's entries. The uid is the daemon's own, read from a connection to
    the socket (SO_PEERCRED), like the Rust client does. Returns that uid, or None when nothing
    answers (the calls then fail as usual and get_or_tune uses its fallback).

    grpcio dials the path again for its own connection, so a user who may write the socket's
    directory could swap the socket between the two; in a directory only the caller or root
    can write (the default one is checked for that) nobody can."""
    probe = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM | socketlib.SOCK_CLOEXEC)
    try:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except OSError:
            return None
        credentials = probe.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_PEERCRED, struct.calcsize("3i"))
    finally:
        probe.close()
    _pid, uid, _gid = struct.unpack("3i", credentials)
    if uid not in trusted_daemon_uids():
        raise UntrustedDaemonError(
            f"tunecache: refusing the daemon at {path}: it runs as uid {uid}, not as this user "
            f"({os.geteuid()}) or root; another user may have put it there. To trust that uid "
            f"(e.g. the system unit's `tunecache` user), set {TRUST_UID_ENV}={uid}"
        )
    return uid


_STATUS_DETAILS_KEY = "grpc-status-details-bin"


def refused_entry_index(error: grpc.RpcError) -> Optional[int]:
    """The index of the entry a Record's INVALID_ARGUMENT refused, read from the standard
    google.rpc.BadRequest detail the daemon sends with it (field path `entries[<index>]...`);
    None when the error names no entry. A caller drops that entry and sends the rest again."""
    from google.rpc import error_details_pb2, status_pb2

    if not callable(getattr(error, "code", None)) or error.code() != grpc.StatusCode.INVALID_ARGUMENT:
        return None
    trailers = error.trailing_metadata() if callable(getattr(error, "trailing_metadata", None)) else None
    for key, value in trailers or ():
        if key != _STATUS_DETAILS_KEY:
            continue
        for detail in status_pb2.Status.FromString(value).details:
            if not detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                continue
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            for violation in bad_request.field_violations:
                field = violation.field
                if field.startswith("entries[") and "]" in field:
                    index = field[len("entries[") : field.index("]")]
                    if index.isdigit():
                        return int(index)
    return None


def _as_key(key: KeyLike) -> pb.Key:
    if isinstance(key, pb.Key):
        return key
    return pb.Key(**dict(key))


def _as_entry(entry: EntryLike) -> pb.Entry:
    if isinstance(entry, pb.Entry):
        return entry
    fields = dict(entry)
    if isinstance(fields.get("key"), Mapping):
        fields["key"] = pb.Key(**fields["key"])
    if isinstance(fields.get("result"), Mapping):
        fields["result"] = pb.Result(**fields["result"])
    return pb.Entry(**fields)


def _only_if(result: ResultLike) -> pb.Result:
    """Forget's only_if: just the config and time_us the daemon compares, so a Result read back
    from the daemon (with its tuned_by and forget_epoch) can be passed as it is."""
    if isinstance(result, pb.Result):
        return pb.Result(config=result.config, time_us=result.time_us)
    fields = dict(result)
    return pb.Result(config=fields["config"], time_us=fields["time_us"])


def describe_key(key: pb.Key) -> str:
    rank = f" rank {key.rank}" if key.HasField("rank") else ""
    return f"{key.namespace}/{key.op} on {key.device!r}{rank}: {key.problem}"


class Client:
    """One channel to tunecached. Thread-safe; create it after fork (gRPC channels do not survive
    a fork). Every call has a deadline: `timeout` seconds unless the call says otherwise. Lookup,
    Scan and Resolve (and so get_or_tune) read in the client's ``view``."""

    def __init__(
        self,
        socket: Union[str, os.PathLike, None] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        view: Optional[str] = None,
    ):
        """``socket``: the daemon's socket; by default $TUNECACHE_SOCKET, else the default path,
        whose directory is checked first (see check_default_socket). On every path the daemon
        must run as the caller, root or a uid in $TUNECACHE_TRUST_UID (see check_daemon_uid).

        ``view``: the job's view, used only when the environment names none ($TUNECACHE_VIEW,
        then Slurm's job and step, then torchrun's run id; see tunecache.view). Within a view the
        first answer for a key is pinned: every rank of the job reads the same result. The
        resolved name is ``self.view`` (empty: no view)."""
        self.view = resolve_view(explicit=view)
        if socket is not None:
            self.socket_path = os.fspath(socket)
        else:
            self.socket_path = default_socket_path()
            if not os.environ.get(SOCKET_ENV, ""):
                check_default_socket(self.socket_path)
        check_daemon_uid(self.socket_path, timeout)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            "unix:" + os.path.abspath(self.socket_path), options=CHANNEL_OPTIONS
        )
        self._stub = pb_grpc.TuneCacheStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _deadline(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout

    def lookup(self, keys: Iterable[KeyLike], timeout: Optional[float] = None) -> list:
        """The cached entries among `keys` (hits only, in request order), in the client's view."""
        request = pb.LookupRequest(keys=[_as_key(key) for key in keys], view=self.view)
        return list(self._stub.Lookup(request, timeout=self._deadline(timeout)).hits)

    def record(
        self, entries: Iterable[EntryLike], lease_id: str = "", timeout: Optional[float] = None
    ) -> pb.RecordResponse:
        """Stores entries (a lower time_us wins over what the cache holds). With the lease_id from
        Resolve it completes that lease; with a lease_id and no entries it gives the lease up."""
        request = pb.RecordRequest(entries=[_as_entry(entry) for entry in entries], lease_id=lease_id)
        return self._stub.Record(request, timeout=self._deadline(timeout))

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
        request = pb.ScanRequest(namespace=namespace, device=device, rank=rank, view=self.view)
        for chunk in self._stub.Scan(request, timeout=self._deadline(timeout)):
            yield list(chunk.entries)

    def stats(self, timeout: Optional[float] = None) -> pb.StatsResponse:
        return self._stub.Stats(pb.StatsRequest(), timeout=self._deadline(timeout))

    def devices(self, timeout: Optional[float] = None) -> list:
        return list(self._stub.Devices(pb.DevicesRequest(), timeout=self._deadline(timeout)).devices)

    def snapshot(self, timeout: Optional[float] = None) -> pb.SnapshotResponse:
        return self._stub.Snapshot(pb.SnapshotRequest(), timeout=self._deadline(timeout))

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
        a better result recorded since. Raises grpc.RpcError, like the other calls."""
        request = pb.ForgetRequest(
            namespace=namespace,
            op=op,
            device=device,
            problem=problem,
            rank=rank,
            only_if=None if only_if is None else _only_if(only_if),
        )
        return self._stub.Forget(request, timeout=self._deadline(timeout)).forgotten

    def list_views(self, timeout: Optional[float] = None) -> list:
        """The views this node holds pins for (ViewInfo: name, pins, idle_ms), most recently read
        first."""
        return list(self._stub.ListViews(pb.ListViewsRequest(), timeout=self._deadline(timeout)).views)

    def end_view(self, name: str, timeout: Optional[float] = None) -> pb.EndViewResponse:
        """Ends view ``name`` on this node (and, with the cluster tier, in Redis): its pins are
        dropped and the next read in it pins afresh. An administrator's act, like a scope
        Forget. Answers ``ended`` (the view existed on this node) and ``pins_dropped``."""
        return self._stub.EndView(pb.EndViewRequest(name=name), timeout=self._deadline(timeout))

    def resolve(
        self,
        key: KeyLike,
        wait_ms: int = DEFAULT_WAIT_MS,
        can_tune: bool = True,
        lease_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> pb.ResolveResponse:
        """Asks for key's result in the client's view: `hit` (use it), `tune_here` (tune, then
        record with tune_here.lease_id) or `miss` (use a fallback). The daemon may hold the call
        up to wait_ms, so the deadline is wait_ms plus the usual timeout."""
        wait_ms = max(0, min(int(wait_ms), MAX_WAIT_MS))
        request = pb.ResolveRequest(
            key=_as_key(key),
            wait_ms=wait_ms,
            can_tune=can_tune,
            lease_ms=max(0, int(lease_ms)),
            view=self.view,
        )
        return self._stub.Resolve(request, timeout=wait_ms / 1000.0 + self._deadline(timeout))

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
        when told to tune, runs tune_fn() -> (config, time_us), records it under the lease and
        returns the config decoded from JSON (so the tuning rank gets what the others get); if
        tune_fn raises or returns something unusable, or the daemon refuses the result (a config
        over 64 KiB or not strict JSON; one warning with the daemon's reason), gives the lease up
        at once and returns fallback; on a miss returns fallback. When the daemon is absent or
        fails, returns fallback and logs one warning per process. Never raises (except KeyboardInterrupt/SystemExit from tune_fn) and
        never blocks longer than wait_ms plus the client timeout, plus tune_fn's own time."""
        try:
            key_message = _as_key(key)
        except Exception as err:
            logger.warning("tunecache: unusable key %r (%s); using the fallback", key, err)
            return fallback
        try:
            response = self.resolve(key_message, wait_ms=wait_ms, can_tune=can_tune, lease_ms=lease_ms)
        except Exception as err:
            _warn_once_daemon_problem(self.socket_path, "Resolve", err)
            return fallback
        try:
            outcome = response.WhichOneof("outcome")
            if outcome == "hit":
                return _decoded_config(response.hit.config, key_message, fallback)
            if outcome == "tune_here":
                return self._tune_and_record(key_message, response.tune_here.lease_id, tune_fn, fallback)
            if outcome == "miss":
                logger.debug("tunecache: miss for %s: %s", describe_key(key_message), response.miss.reason)
                return fallback
            _warn_once_daemon_problem(self.socket_path, "Resolve", f"answer without an outcome ({outcome!r})")
            return fallback
        except Exception as err:  # a bug here must not reach the model either
            logger.warning("tunecache: get_or_tune failed for %s: %s", describe_key(key_message), err, exc_info=True)
            return fallback

    def _tune_and_record(
        self, key: pb.Key, lease_id: str, tune_fn: Callable[[], TuneOutput], fallback: Any
    ) -> Any:
        try:
            config, time_us = tune_fn()
            config_text = config if isinstance(config, str) else json.dumps(config)
            decoded = json.loads(config_text)
            time_us = float(time_us)
            if not math.isfinite(time_us) or time_us < 0:
                raise ValueError(f"time_us must be finite and >= 0, got {time_us}")
        except Exception:
            logger.warning(
                "tunecache: tuning %s failed; giving the lease up and using the fallback",
                describe_key(key),
                exc_info=True,
            )
            self._give_up(lease_id)
            return fallback
        except BaseException:
            # Interrupted: hand the lease back so waiting ranks need not wait for it to expire.
            self._give_up(lease_id)
            raise
        entry = pb.Entry(
            key=key,
            result=pb.Result(
                config=config_text,
                time_us=time_us,
                tuned_by=_tuned_by(key),
                tuned_at_unix_ms=int(time.time() * 1000),
            ),
        )
        if self._record_tuned(entry, lease_id, "using the fallback") == _REFUSED:
            # No rank will ever get this result from the cache; fall back as they will.
            return fallback
        # Recorded, or the daemon is failing: the model should use the tuned config either way.
        return decoded

    def _record_tuned(self, entry: pb.Entry, lease_id: str, consequence: str) -> str:
        """Records a tuned result, completing ``lease_id`` when one is given. Returns _RECORDED;
        when the result was not recorded, gives the lease up at once (the daemon leaves a failed
        Record's lease held, so its waiters would sit out their whole wait) and returns _REFUSED
        when the daemon rejected the result itself (INVALID_ARGUMENT: a config over 64 KiB or not
        strict JSON, such as Python's NaN), logged at WARNING with the daemon's reason and
        ``consequence``, or _FAILED when the daemon is unreachable or failing (the once-per-process
        warning). After a deadline the lease is not given up: the Record may still be applied (and
        then completes the lease itself), and a second call would block for another timeout."""
        try:
            self.record([entry], lease_id=lease_id)
            return _RECORDED
        except Exception as err:
            failure = err
        code = failure.code() if isinstance(failure, grpc.Call) else None
        if lease_id and code != grpc.StatusCode.DEADLINE_EXCEEDED:
            self._give_up(lease_id)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # The daemon works; the result is bad. Not the once-per-process daemon warning, which
            # stays unspent for a real outage.
            logger.warning(
                "tunecache: the daemon refused the tuned result for %s: %s; %s%s",
                describe_key(entry.key),
                failure.details(),
                "gave the lease up so a waiter can tune it; " if lease_id else "",
                consequence,
            )
            return _REFUSED
        _warn_once_daemon_problem(self.socket_path, "Record", failure)
        return _FAILED

    def _give_up(self, lease_id: str) -> None:
        try:
            self.record([], lease_id=lease_id)
        except Exception as err:
            _warn_once_daemon_problem(self.socket_path, "Record (giving the lease up)", err)


def _decoded_config(config_text: str, key: pb.Key, fallback: Any) -> Any:
    try:
        return json.loads(config_text)
    except ValueError:
        logger.warning("tunecache: cached config for %s is not JSON; using the fallback", describe_key(key))
        return fallback


def _tuned_by(key: pb.Key) -> str:
    rank = f" rank {key.rank}" if key.HasField("rank") else ""
    return f"{platform.node()} pid {os.getpid()}{rank} (python get_or_tune)"


# --- once-per-process warning -------------------------------------------------------------------
# A model calls get_or_tune for every tuned op; with the daemon down, a warning per call would
# flood the logs. The pid makes a forked child warn once on its own.
_warned_pid: Optional[int] = None
_warn_lock = threading.Lock()


def _warn_once_daemon_problem(socket_path: str, call: str, problem: Any) -> None:
    global _warned_pid
    detail = problem.details() if isinstance(problem, grpc.RpcError) else problem
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
    """A Client made on first use and again after a fork (gRPC channels do not survive one),
    plus a once-per-process warning flag: what a drop-in patched into a framework needs, so
    that a model never fails because of its cache and the log never floods."""

    def __init__(self, socket: Union[str, os.PathLike, None] = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.socket = socket
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._client_pid: Optional[int] = None
        self._warned_pid: Optional[int] = None

    def client(self) -> Client:
        """This process's client (raises what Client() raises: UntrustedSocketError...)."""
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = Client(self.socket, timeout=self.timeout)
                self._client_pid = os.getpid()
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


def describe_problem(problem: Any) -> str:
    """An RpcError as `CODE: details`, anything else as its text."""
    if isinstance(problem, grpc.RpcError):
        return f"{problem.code()}: {problem.details()}"
    return str(problem)


# --- process-wide default client -------------------------------------------------------------------
_default_client: Optional[Client] = None
_default_client_pid: Optional[int] = None
_default_client_lock = threading.Lock()


def _process_client() -> Client:
    global _default_client, _default_client_pid
    with _default_client_lock:
        if _default_client is None or _default_client_pid != os.getpid():
            # After a fork the parent's channel is unusable in the child; make a new one.
            _default_client = Client()
            _default_client_pid = os.getpid()
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
