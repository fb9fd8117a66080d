# Owns the types of tunecache._native, the binding built from client/python/src: each class and
# call is declared there once, with its documentation (help() shows it); this stub only says
# what each one takes and answers, for type checkers and editors.
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Tuple, Union, overload

DEFAULT_TIMEOUT_S: float
DEFAULT_SCAN_TIMEOUT_S: float
DEFAULT_WAIT_MS: int
MAX_WAIT_MS: int

_Path = Union[str, os.PathLike]
# Arguments are taken duck-typed: the classes below, a mapping of their fields, or anything with
# those attributes (a grpcio user's generated tunecache.v1 message included).
KeyLike = Union[Key, Mapping[str, Any]]
EntryLike = Union[Entry, Mapping[str, Any]]
ResultLike = Union[Result, Mapping[str, Any]]
ArtifactLike = Union[Artifact, Mapping[str, Any]]
# Files to store beside a result: {name: path}, or (name, path) pairs.
ArtifactFiles = Union[Mapping[str, _Path], Iterable[Tuple[str, _Path]]]

class Key:
    namespace: str
    op: str
    device: str
    problem: str
    # An int sets the rank; None unsets it (the entry shared by all ranks), which reads 0.
    rank: int
    def __init__(
        self,
        *,
        namespace: str = "",
        op: str = "",
        device: str = "",
        problem: str = "",
        rank: Optional[int] = None,
    ) -> None: ...
    def HasField(self, name: str) -> bool: ...
    def ClearField(self, name: str) -> None: ...

class Artifact:
    name: str
    sha256: str
    size: int
    def __init__(self, *, name: str = "", sha256: str = "", size: int = 0) -> None: ...

class Result:
    config: str
    time_us: float
    tuned_by: str
    tuned_at_unix_ms: int
    forget_epoch: int
    artifacts: list[Artifact]
    def __init__(
        self,
        *,
        config: str = "",
        time_us: float = 0.0,
        tuned_by: str = "",
        tuned_at_unix_ms: int = 0,
        forget_epoch: int = 0,
        artifacts: Optional[Iterable[ArtifactLike]] = None,
    ) -> None: ...

class Entry:
    key: Key
    result: Result
    def __init__(self, *, key: Optional[KeyLike] = None, result: Optional[ResultLike] = None) -> None: ...
    def HasField(self, name: str) -> bool: ...

class Lease:
    lease_id: str
    expires_in_ms: int

class Miss:
    reason: str

class ResolveResponse:
    hit: Result
    tune_here: Lease
    miss: Miss
    def WhichOneof(self, name: str) -> Optional[str]: ...
    def HasField(self, name: str) -> bool: ...

class RecordResponse:
    stored: int
    unchanged: int

class Message:
    """Stats, a Device, Snapshot's answer, a view, a stored artifact: their fields as attributes."""
    def __getattr__(self, name: str) -> Any: ...
    def HasField(self, name: str) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...

class TuneLease:
    key: Key
    lease_id: str
    expires_in_ms: int
    open: bool

class TuneStart:
    kind: str  # "hit", "tune" or "miss"
    result: Optional[Result]
    lease: Optional[TuneLease]
    reason: str

class TuneFinish:
    stored: int
    unchanged: int
    error: Optional[BaseException]
    refused: bool
    lease: str  # "completed", "given_up", "kept" or "give_up_failed"
    give_up_error: Optional[BaseException]

class KeptRecord:
    stored: int
    unchanged: int
    refused: list[Tuple[int, Entry, BaseException]]

class RankOutcome:
    kind: str  # "cached", "tuned" or "fallback"
    result: Optional[Result]
    reason: str
    failures: list[Tuple[str, BaseException]]
    raised: Optional[BaseException]

class Scan(Iterator[list[Entry]]):
    def __iter__(self) -> Scan: ...
    def __next__(self) -> list[Entry]: ...

class ScanView(Mapping[Union[KeyLike, tuple], Entry]):
    @property
    def decoded(self) -> int: ...
    def __getitem__(self, key: Union[KeyLike, tuple]) -> Entry: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Key]: ...
    def get(self, key: Union[KeyLike, tuple], default: Any = None) -> Any: ...  # type: ignore[override]
    def keys(self) -> list[Key]: ...  # type: ignore[override]
    def values(self) -> list[Entry]: ...  # type: ignore[override]
    def items(self) -> list[tuple[Key, Entry]]: ...  # type: ignore[override]

class Client:
    socket_path: str
    view: str
    mode: Literal["tune", "replay"]
    timeout: float
    def __init__(
        self,
        socket: Optional[_Path] = None,
        timeout: float = 5.0,
        view: Optional[str] = None,
        mode: Optional[Literal["tune", "replay"]] = None,
    ) -> None: ...
    def close(self) -> None: ...
    def lookup(self, keys: Iterable[KeyLike], timeout: Optional[float] = None) -> list[Entry]: ...
    def record(
        self, entries: Iterable[EntryLike], lease_id: str = "", timeout: Optional[float] = None
    ) -> RecordResponse: ...
    @overload
    def scan(
        self,
        namespace: str = "",
        device: str = "",
        timeout: Optional[float] = 60.0,
        rank: Optional[int] = None,
        lazy: Literal[False] = False,
    ) -> Scan: ...
    @overload
    def scan(
        self,
        namespace: str = "",
        device: str = "",
        timeout: Optional[float] = 60.0,
        rank: Optional[int] = None,
        *,
        lazy: Literal[True],
    ) -> ScanView: ...
    def stats(self, timeout: Optional[float] = None) -> Message: ...
    def devices(self, timeout: Optional[float] = None) -> list[Message]: ...
    def snapshot(self, timeout: Optional[float] = None) -> Message: ...
    def forget(
        self,
        namespace: str,
        op: str = "",
        device: str = "",
        problem: str = "",
        rank: Optional[int] = None,
        only_if: Optional[ResultLike] = None,
        timeout: Optional[float] = None,
    ) -> int: ...
    def list_views(self, timeout: Optional[float] = None) -> list[Message]: ...
    def end_view(self, name: str, timeout: Optional[float] = None) -> Message: ...
    def resolve(
        self,
        key: KeyLike,
        wait_ms: int = 60000,
        can_tune: bool = True,
        lease_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> ResolveResponse: ...
    def resolve_tune_record(
        self,
        key: KeyLike,
        tune: Callable[[], tuple],
        wait_ms: int = 60000,
        can_tune: bool = True,
        lease_ms: int = 0,
    ) -> RankOutcome: ...
    def begin_tune(
        self,
        key: KeyLike,
        wait_ms: int = 60000,
        can_tune: bool = True,
        lease_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> TuneStart: ...
    def finish_tune(
        self,
        lease: TuneLease,
        result: ResultLike,
        timeout: Optional[float] = None,
        also: Optional[Iterable[EntryLike]] = None,
    ) -> TuneFinish: ...
    def abandon(self, lease: TuneLease, timeout: Optional[float] = None) -> bool: ...
    def put_artifact(self, path: _Path, timeout: Optional[float] = None) -> Message: ...
    def put_artifacts(self, files: ArtifactFiles, timeout: Optional[float] = None) -> list[Artifact]: ...
    def fetch_artifacts(
        self, entry: Union[EntryLike, ResultLike], dir: _Path, timeout: Optional[float] = None
    ) -> list[str]: ...
    def stat_artifacts(self, digests: Iterable[str], timeout: Optional[float] = None) -> list[str]: ...
    def record_keeping_valid(self, entries: Iterable[EntryLike], timeout: Optional[float] = None) -> KeptRecord: ...

def default_socket_path() -> os.PathLike: ...
def check_default_socket(path: _Path) -> None: ...
def check_daemon_uid(path: _Path) -> Optional[int]: ...
def resolve_view(environ: Mapping[str, str], explicit: Optional[str] = None) -> str: ...
def as_key(value: KeyLike) -> Key: ...
def refused_entry_index_of(code: int, message: str, status_details: bytes) -> Optional[int]: ...
def _decode_scan_chunks(chunks: list[bytes]) -> list[list[Entry]]: ...
def trtllm_device(metadata_json: str) -> str: ...
def trtllm_entries(
    metadata_json: str,
    items: list[Tuple[str, str, Optional[int]]],
    tuned_by: str,
    tuned_at_unix_ms: int,
) -> Tuple[list[Entry], list[Tuple[str, str]]]: ...
def trtllm_file_values(
    entries: list[Entry],
) -> Tuple[list[Tuple[str, Optional[int], str]], list[Tuple[str, str]], Optional[str]]: ...
def flashinfer_key(file_key: str) -> Tuple[str, Optional[str], str]: ...
def flashinfer_env(manifest_json: str) -> Tuple[str, str]: ...
def flashinfer_entries(manifest_json: str, entry_json: str, tuned_by: str, tuned_at_unix_ms: int) -> Tuple[Entry, Entry]: ...
def flashinfer_file_entry(problem: Optional[str], config: str) -> Tuple[str, str, str]: ...
def inductor_device(system_hash: str, device_name: Optional[str]) -> str: ...
def inductor_gemm_key(
    system_hash: str,
    device_name: Optional[str],
    op: str,
    cache_key: str,
    precision: str,
    choice_hashes: list[str],
) -> Key: ...
def inductor_timings_config(timings: list[Tuple[str, float]]) -> str: ...
def inductor_timings(config: str) -> list[Tuple[str, float]]: ...
def inductor_time_us(timings: list[Tuple[str, float]]) -> float: ...
def inductor_best_config_key(rel_path: str, configs_hash: str) -> Key: ...
