from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Key(_message.Message):
    __slots__ = ("namespace", "op", "device", "problem", "rank")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    op: str
    device: str
    problem: str
    rank: int
    def __init__(self, namespace: _Optional[str] = ..., op: _Optional[str] = ..., device: _Optional[str] = ..., problem: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("config", "time_us", "tuned_by", "tuned_at_unix_ms", "forget_epoch", "artifacts")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    TUNED_BY_FIELD_NUMBER: _ClassVar[int]
    TUNED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FORGET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    config: str
    time_us: float
    tuned_by: str
    tuned_at_unix_ms: int
    forget_epoch: int
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    def __init__(self, config: _Optional[str] = ..., time_us: _Optional[float] = ..., tuned_by: _Optional[str] = ..., tuned_at_unix_ms: _Optional[int] = ..., forget_epoch: _Optional[int] = ..., artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("name", "sha256", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    size: int
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("key", "result")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    key: Key
    result: Result
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("keys", "view")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Key]
    view: str
    def __init__(self, keys: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., view: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, hits: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class RecordRequest(_message.Message):
    __slots__ = ("entries", "lease_id")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    lease_id: str
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., lease_id: _Optional[str] = ...) -> None: ...

class RecordResponse(_message.Message):
    __slots__ = ("stored", "unchanged")
    STORED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    unchanged: int
    def __init__(self, stored: _Optional[int] = ..., unchanged: _Optional[int] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("namespace", "device", "rank", "view")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    device: str
    rank: int
    view: str
    def __init__(self, namespace: _Optional[str] = ..., device: _Optional[str] = ..., rank: _Optional[int] = ..., view: _Optional[str] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("node_name", "version", "uptime_ms", "entries", "lookups", "hits", "misses", "records", "entries_stored", "entries_unchanged", "journal_bytes", "journal_live_bytes", "journal_compactions", "fsync_policy", "journal_compaction_failures", "journal_write_failures", "journal_unwritable_episodes", "journal_unwritable", "journal_unwritable_since_unix_ms", "resolves", "leases_granted", "leases_expired", "leases_released_dead", "leases_given_up", "waits_satisfied", "waits_timed_out", "waiters", "leases_active", "shared_dir", "last_snapshot_unix_ms", "snapshots_written", "snapshots_skipped_unchanged", "snapshot_errors", "peer_files_loaded", "peer_files_skipped", "stuck_operation", "stuck_since_unix_ms", "last_snapshot_error", "snapshot_passes", "snapshot_pass_bytes_read", "snapshot_pass_bytes_written", "snapshot_bytes_read", "snapshot_bytes_written", "peer_segments_loaded", "segment_compactions", "own_entries_published", "snapshot_format_version", "snapshot_untrusted_files", "snapshot_name_conflicts", "snapshot_invalid_entries", "previous_shutdown_publish", "daemon_pid", "daemon_uid", "forgets_received", "forget_entries_dropped", "tombstones_held", "forgets_refused", "cluster_forgets_published", "cluster_forgets_learned", "max_exact_forgets_per_uid", "exact_forgets_refused", "oversize_records_dropped", "views_active", "view_pins", "max_view_pins", "view_idle_secs", "view_pins_made", "view_pin_conflicts", "view_pin_fallbacks", "view_pins_from_cluster", "view_pins_evicted", "views_ended_idle", "view_pins_forgotten", "views_ended", "view_pins_over_cap", "tuner_backend", "tuner_state", "tuner_queue_depth", "tuner_jobs_done", "tuner_jobs_failed", "tuner_restarts", "nofile_soft_limit", "nofile_hard_limit", "connections_open", "max_connections_per_uid", "connections_refused_per_uid", "preface_timeouts", "accept_errors", "max_leases_per_pid", "leases_refused_per_pid", "write_queue_bytes", "write_queue_limit_bytes", "writes_shed", "tuner_queue_refusals", "max_message_bytes", "max_request_bytes_per_uid", "request_bytes_in_flight", "requests_refused_too_large", "requests_refused_per_uid", "cluster_state", "cluster_url", "cluster_bootstrapped", "cluster_published", "cluster_publish_queue", "cluster_publish_dropped", "cluster_received", "cluster_bootstrap_entries", "cluster_leases_acquired", "cluster_leases_held_elsewhere", "cluster_lease_fallbacks", "cluster_takeovers", "cluster_republished", "cluster_reconnects", "cluster_errors", "cluster_publish_already", "cluster_audits", "cluster_audit_repaired", "cluster_stream_gaps", "cluster_resync_entries", "cluster_publish_queue_limit", "cluster_name_conflicts", "cluster_audit_differing", "max_view_pins_per_uid", "max_views_per_uid", "views_evicted", "cluster_refused_stream", "cluster_refused_entries", "cluster_refused_tombstones", "cluster_wrong_type_keys", "cluster_clock_skew_ms", "cluster_prune_paused", "cluster_places_restored", "cluster_shards_resumed", "cluster_shards_reread", "cluster_checkpoints_built", "cluster_checkpoints_loaded", "cluster_checkpoints_rejected", "cluster_startup_commands", "cluster_startup_bytes", "cluster_startup_ms", "cluster_checkpoint_results_withheld", "peer_nodes_resumed", "artifact_blobs_held", "artifact_bytes_held", "artifact_uploads", "artifact_uploads_already_held", "artifact_uploads_refused", "artifact_digest_failures", "artifact_fetches_local", "artifact_fetches_shared_dir", "artifact_fetches_cluster", "artifact_fetches_missing", "artifact_bytes_served", "artifact_bytes_read_from_tiers", "artifact_collections", "artifact_bytes_over_blob_limit", "artifact_bytes_over_store_limit", "artifact_bytes_over_uid_limit", "max_artifact_bytes", "artifact_store_bytes", "artifact_records_refused", "artifact_bytes_over_cluster_limit", "artifact_shared_dir_collections", "artifact_handoffs", "artifact_store_bytes_per_uid", "artifact_bytes_over_uid_store_limit", "artifact_fetches_over_store_limit", "artifact_shared_dir_squatted", "snapshot_squatted_files", "replay_misses", "replay_bundled_entries", "bundles_loaded", "bundle_entries", "artifact_fetches_bundle", "last_use_updates_written", "entries_expired", "entries_expired_by_bound", "entries_expired_on_arrival", "artifacts_unnamed_by_expiry", "cluster_last_use_commands", "cluster_entries_expired", "snapshot_last_uses_published", "expiry_paused", "namespace_usage", "namespace_usage_at_unix_ms")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_MS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_STORED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_LIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_COMPACTIONS_FIELD_NUMBER: _ClassVar[int]
    FSYNC_POLICY_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_COMPACTION_FAILURES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_WRITE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_UNWRITABLE_EPISODES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_UNWRITABLE_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_UNWRITABLE_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RESOLVES_FIELD_NUMBER: _ClassVar[int]
    LEASES_GRANTED_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    LEASES_RELEASED_DEAD_FIELD_NUMBER: _ClassVar[int]
    LEASES_GIVEN_UP_FIELD_NUMBER: _ClassVar[int]
    WAITS_SATISFIED_FIELD_NUMBER: _ClassVar[int]
    WAITS_TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    LEASES_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SHARED_DIR_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SKIPPED_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    PEER_FILES_LOADED_FIELD_NUMBER: _ClassVar[int]
    PEER_FILES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    STUCK_OPERATION_FIELD_NUMBER: _ClassVar[int]
    STUCK_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ERROR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PASSES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PASS_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PASS_BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    PEER_SEGMENTS_LOADED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COMPACTIONS_FIELD_NUMBER: _ClassVar[int]
    OWN_ENTRIES_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_UNTRUSTED_FILES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_NAME_CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INVALID_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_SHUTDOWN_PUBLISH_FIELD_NUMBER: _ClassVar[int]
    DAEMON_PID_FIELD_NUMBER: _ClassVar[int]
    DAEMON_UID_FIELD_NUMBER: _ClassVar[int]
    FORGETS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FORGET_ENTRIES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_HELD_FIELD_NUMBER: _ClassVar[int]
    FORGETS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FORGETS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FORGETS_LEARNED_FIELD_NUMBER: _ClassVar[int]
    MAX_EXACT_FORGETS_PER_UID_FIELD_NUMBER: _ClassVar[int]
    EXACT_FORGETS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    OVERSIZE_RECORDS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_FIELD_NUMBER: _ClassVar[int]
    MAX_VIEW_PINS_FIELD_NUMBER: _ClassVar[int]
    VIEW_IDLE_SECS_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_MADE_FIELD_NUMBER: _ClassVar[int]
    VIEW_PIN_CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    VIEW_PIN_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_FROM_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_EVICTED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_ENDED_IDLE_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    VIEWS_ENDED_FIELD_NUMBER: _ClassVar[int]
    VIEW_PINS_OVER_CAP_FIELD_NUMBER: _ClassVar[int]
    TUNER_BACKEND_FIELD_NUMBER: _ClassVar[int]
    TUNER_STATE_FIELD_NUMBER: _ClassVar[int]
    TUNER_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TUNER_JOBS_DONE_FIELD_NUMBER: _ClassVar[int]
    TUNER_JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TUNER_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    NOFILE_SOFT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    NOFILE_HARD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_OPEN_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_PER_UID_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_REFUSED_PER_UID_FIELD_NUMBER: _ClassVar[int]
    PREFACE_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASES_PER_PID_FIELD_NUMBER: _ClassVar[int]
    LEASES_REFUSED_PER_PID_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITES_SHED_FIELD_NUMBER: _ClassVar[int]
    TUNER_QUEUE_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_PER_UID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BYTES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REFUSED_TOO_LARGE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REFUSED_PER_UID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_URL_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_BOOTSTRAPPED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PUBLISH_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PUBLISH_DROPPED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_BOOTSTRAP_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LEASES_ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LEASES_HELD_ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LEASE_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_REPUBLISHED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_RECONNECTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PUBLISH_ALREADY_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_AUDITS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_AUDIT_REPAIRED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STREAM_GAPS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_RESYNC_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PUBLISH_QUEUE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_AUDIT_DIFFERING_FIELD_NUMBER: _ClassVar[int]
    MAX_VIEW_PINS_PER_UID_FIELD_NUMBER: _ClassVar[int]
    MAX_VIEWS_PER_UID_FIELD_NUMBER: _ClassVar[int]
    VIEWS_EVICTED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_REFUSED_STREAM_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_REFUSED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_REFUSED_TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_WRONG_TYPE_KEYS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CLOCK_SKEW_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PRUNE_PAUSED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_PLACES_RESTORED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SHARDS_RESUMED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SHARDS_REREAD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CHECKPOINTS_BUILT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CHECKPOINTS_LOADED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CHECKPOINTS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STARTUP_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STARTUP_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STARTUP_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CHECKPOINT_RESULTS_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    PEER_NODES_RESUMED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BLOBS_HELD_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_UPLOADS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_UPLOADS_ALREADY_HELD_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_UPLOADS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DIGEST_FAILURES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_LOCAL_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_SHARED_DIR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_MISSING_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_READ_FROM_TIERS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_OVER_BLOB_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_OVER_STORE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_OVER_UID_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_ARTIFACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_RECORDS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_OVER_CLUSTER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHARED_DIR_COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_STORE_BYTES_PER_UID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_OVER_UID_STORE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_OVER_STORE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHARED_DIR_SQUATTED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_SQUATTED_FILES_FIELD_NUMBER: _ClassVar[int]
    REPLAY_MISSES_FIELD_NUMBER: _ClassVar[int]
    REPLAY_BUNDLED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_LOADED_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FETCHES_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_UPDATES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_EXPIRED_BY_BOUND_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_EXPIRED_ON_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_UNNAMED_BY_EXPIRY_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LAST_USE_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ENTRIES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_LAST_USES_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_PAUSED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_USAGE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_USAGE_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    version: str
    uptime_ms: int
    entries: int
    lookups: int
    hits: int
    misses: int
    records: int
    entries_stored: int
    entries_unchanged: int
    journal_bytes: int
    journal_live_bytes: int
    journal_compactions: int
    fsync_policy: str
    journal_compaction_failures: int
    journal_write_failures: int
    journal_unwritable_episodes: int
    journal_unwritable: str
    journal_unwritable_since_unix_ms: int
    resolves: int
    leases_granted: int
    leases_expired: int
    leases_released_dead: int
    leases_given_up: int
    waits_satisfied: int
    waits_timed_out: int
    waiters: int
    leases_active: int
    shared_dir: str
    last_snapshot_unix_ms: int
    snapshots_written: int
    snapshots_skipped_unchanged: int
    snapshot_errors: int
    peer_files_loaded: int
    peer_files_skipped: int
    stuck_operation: str
    stuck_since_unix_ms: int
    last_snapshot_error: str
    snapshot_passes: int
    snapshot_pass_bytes_read: int
    snapshot_pass_bytes_written: int
    snapshot_bytes_read: int
    snapshot_bytes_written: int
    peer_segments_loaded: int
    segment_compactions: int
    own_entries_published: int
    snapshot_format_version: int
    snapshot_untrusted_files: int
    snapshot_name_conflicts: int
    snapshot_invalid_entries: int
    previous_shutdown_publish: str
    daemon_pid: int
    daemon_uid: int
    forgets_received: int
    forget_entries_dropped: int
    tombstones_held: int
    forgets_refused: int
    cluster_forgets_published: int
    cluster_forgets_learned: int
    max_exact_forgets_per_uid: int
    exact_forgets_refused: int
    oversize_records_dropped: int
    views_active: int
    view_pins: int
    max_view_pins: int
    view_idle_secs: int
    view_pins_made: int
    view_pin_conflicts: int
    view_pin_fallbacks: int
    view_pins_from_cluster: int
    view_pins_evicted: int
    views_ended_idle: int
    view_pins_forgotten: int
    views_ended: int
    view_pins_over_cap: int
    tuner_backend: str
    tuner_state: str
    tuner_queue_depth: int
    tuner_jobs_done: int
    tuner_jobs_failed: int
    tuner_restarts: int
    nofile_soft_limit: int
    nofile_hard_limit: int
    connections_open: int
    max_connections_per_uid: int
    connections_refused_per_uid: int
    preface_timeouts: int
    accept_errors: int
    max_leases_per_pid: int
    leases_refused_per_pid: int
    write_queue_bytes: int
    write_queue_limit_bytes: int
    writes_shed: int
    tuner_queue_refusals: int
    max_message_bytes: int
    max_request_bytes_per_uid: int
    request_bytes_in_flight: int
    requests_refused_too_large: int
    requests_refused_per_uid: int
    cluster_state: str
    cluster_url: str
    cluster_bootstrapped: bool
    cluster_published: int
    cluster_publish_queue: int
    cluster_publish_dropped: int
    cluster_received: int
    cluster_bootstrap_entries: int
    cluster_leases_acquired: int
    cluster_leases_held_elsewhere: int
    cluster_lease_fallbacks: int
    cluster_takeovers: int
    cluster_republished: int
    cluster_reconnects: int
    cluster_errors: int
    cluster_publish_already: int
    cluster_audits: int
    cluster_audit_repaired: int
    cluster_stream_gaps: int
    cluster_resync_entries: int
    cluster_publish_queue_limit: int
    cluster_name_conflicts: int
    cluster_audit_differing: int
    max_view_pins_per_uid: int
    max_views_per_uid: int
    views_evicted: int
    cluster_refused_stream: int
    cluster_refused_entries: int
    cluster_refused_tombstones: int
    cluster_wrong_type_keys: str
    cluster_clock_skew_ms: int
    cluster_prune_paused: bool
    cluster_places_restored: int
    cluster_shards_resumed: int
    cluster_shards_reread: int
    cluster_checkpoints_built: int
    cluster_checkpoints_loaded: int
    cluster_checkpoints_rejected: int
    cluster_startup_commands: int
    cluster_startup_bytes: int
    cluster_startup_ms: int
    cluster_checkpoint_results_withheld: int
    peer_nodes_resumed: int
    artifact_blobs_held: int
    artifact_bytes_held: int
    artifact_uploads: int
    artifact_uploads_already_held: int
    artifact_uploads_refused: int
    artifact_digest_failures: int
    artifact_fetches_local: int
    artifact_fetches_shared_dir: int
    artifact_fetches_cluster: int
    artifact_fetches_missing: int
    artifact_bytes_served: int
    artifact_bytes_read_from_tiers: int
    artifact_collections: int
    artifact_bytes_over_blob_limit: int
    artifact_bytes_over_store_limit: int
    artifact_bytes_over_uid_limit: int
    max_artifact_bytes: int
    artifact_store_bytes: int
    artifact_records_refused: int
    artifact_bytes_over_cluster_limit: int
    artifact_shared_dir_collections: int
    artifact_handoffs: int
    artifact_store_bytes_per_uid: int
    artifact_bytes_over_uid_store_limit: int
    artifact_fetches_over_store_limit: int
    artifact_shared_dir_squatted: int
    snapshot_squatted_files: int
    replay_misses: int
    replay_bundled_entries: int
    bundles_loaded: int
    bundle_entries: int
    artifact_fetches_bundle: int
    last_use_updates_written: int
    entries_expired: int
    entries_expired_by_bound: int
    entries_expired_on_arrival: int
    artifacts_unnamed_by_expiry: int
    cluster_last_use_commands: int
    cluster_entries_expired: int
    snapshot_last_uses_published: int
    expiry_paused: str
    namespace_usage: _containers.RepeatedCompositeFieldContainer[UsageGroup]
    namespace_usage_at_unix_ms: int
    def __init__(self, node_name: _Optional[str] = ..., version: _Optional[str] = ..., uptime_ms: _Optional[int] = ..., entries: _Optional[int] = ..., lookups: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., records: _Optional[int] = ..., entries_stored: _Optional[int] = ..., entries_unchanged: _Optional[int] = ..., journal_bytes: _Optional[int] = ..., journal_live_bytes: _Optional[int] = ..., journal_compactions: _Optional[int] = ..., fsync_policy: _Optional[str] = ..., journal_compaction_failures: _Optional[int] = ..., journal_write_failures: _Optional[int] = ..., journal_unwritable_episodes: _Optional[int] = ..., journal_unwritable: _Optional[str] = ..., journal_unwritable_since_unix_ms: _Optional[int] = ..., resolves: _Optional[int] = ..., leases_granted: _Optional[int] = ..., leases_expired: _Optional[int] = ..., leases_released_dead: _Optional[int] = ..., leases_given_up: _Optional[int] = ..., waits_satisfied: _Optional[int] = ..., waits_timed_out: _Optional[int] = ..., waiters: _Optional[int] = ..., leases_active: _Optional[int] = ..., shared_dir: _Optional[str] = ..., last_snapshot_unix_ms: _Optional[int] = ..., snapshots_written: _Optional[int] = ..., snapshots_skipped_unchanged: _Optional[int] = ..., snapshot_errors: _Optional[int] = ..., peer_files_loaded: _Optional[int] = ..., peer_files_skipped: _Optional[int] = ..., stuck_operation: _Optional[str] = ..., stuck_since_unix_ms: _Optional[int] = ..., last_snapshot_error: _Optional[str] = ..., snapshot_passes: _Optional[int] = ..., snapshot_pass_bytes_read: _Optional[int] = ..., snapshot_pass_bytes_written: _Optional[int] = ..., snapshot_bytes_read: _Optional[int] = ..., snapshot_bytes_written: _Optional[int] = ..., peer_segments_loaded: _Optional[int] = ..., segment_compactions: _Optional[int] = ..., own_entries_published: _Optional[int] = ..., snapshot_format_version: _Optional[int] = ..., snapshot_untrusted_files: _Optional[int] = ..., snapshot_name_conflicts: _Optional[int] = ..., snapshot_invalid_entries: _Optional[int] = ..., previous_shutdown_publish: _Optional[str] = ..., daemon_pid: _Optional[int] = ..., daemon_uid: _Optional[int] = ..., forgets_received: _Optional[int] = ..., forget_entries_dropped: _Optional[int] = ..., tombstones_held: _Optional[int] = ..., forgets_refused: _Optional[int] = ..., cluster_forgets_published: _Optional[int] = ..., cluster_forgets_learned: _Optional[int] = ..., max_exact_forgets_per_uid: _Optional[int] = ..., exact_forgets_refused: _Optional[int] = ..., oversize_records_dropped: _Optional[int] = ..., views_active: _Optional[int] = ..., view_pins: _Optional[int] = ..., max_view_pins: _Optional[int] = ..., view_idle_secs: _Optional[int] = ..., view_pins_made: _Optional[int] = ..., view_pin_conflicts: _Optional[int] = ..., view_pin_fallbacks: _Optional[int] = ..., view_pins_from_cluster: _Optional[int] = ..., view_pins_evicted: _Optional[int] = ..., views_ended_idle: _Optional[int] = ..., view_pins_forgotten: _Optional[int] = ..., views_ended: _Optional[int] = ..., view_pins_over_cap: _Optional[int] = ..., tuner_backend: _Optional[str] = ..., tuner_state: _Optional[str] = ..., tuner_queue_depth: _Optional[int] = ..., tuner_jobs_done: _Optional[int] = ..., tuner_jobs_failed: _Optional[int] = ..., tuner_restarts: _Optional[int] = ..., nofile_soft_limit: _Optional[int] = ..., nofile_hard_limit: _Optional[int] = ..., connections_open: _Optional[int] = ..., max_connections_per_uid: _Optional[int] = ..., connections_refused_per_uid: _Optional[int] = ..., preface_timeouts: _Optional[int] = ..., accept_errors: _Optional[int] = ..., max_leases_per_pid: _Optional[int] = ..., leases_refused_per_pid: _Optional[int] = ..., write_queue_bytes: _Optional[int] = ..., write_queue_limit_bytes: _Optional[int] = ..., writes_shed: _Optional[int] = ..., tuner_queue_refusals: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_request_bytes_per_uid: _Optional[int] = ..., request_bytes_in_flight: _Optional[int] = ..., requests_refused_too_large: _Optional[int] = ..., requests_refused_per_uid: _Optional[int] = ..., cluster_state: _Optional[str] = ..., cluster_url: _Optional[str] = ..., cluster_bootstrapped: _Optional[bool] = ..., cluster_published: _Optional[int] = ..., cluster_publish_queue: _Optional[int] = ..., cluster_publish_dropped: _Optional[int] = ..., cluster_received: _Optional[int] = ..., cluster_bootstrap_entries: _Optional[int] = ..., cluster_leases_acquired: _Optional[int] = ..., cluster_leases_held_elsewhere: _Optional[int] = ..., cluster_lease_fallbacks: _Optional[int] = ..., cluster_takeovers: _Optional[int] = ..., cluster_republished: _Optional[int] = ..., cluster_reconnects: _Optional[int] = ..., cluster_errors: _Optional[int] = ..., cluster_publish_already: _Optional[int] = ..., cluster_audits: _Optional[int] = ..., cluster_audit_repaired: _Optional[int] = ..., cluster_stream_gaps: _Optional[int] = ..., cluster_resync_entries: _Optional[int] = ..., cluster_publish_queue_limit: _Optional[int] = ..., cluster_name_conflicts: _Optional[int] = ..., cluster_audit_differing: _Optional[int] = ..., max_view_pins_per_uid: _Optional[int] = ..., max_views_per_uid: _Optional[int] = ..., views_evicted: _Optional[int] = ..., cluster_refused_stream: _Optional[int] = ..., cluster_refused_entries: _Optional[int] = ..., cluster_refused_tombstones: _Optional[int] = ..., cluster_wrong_type_keys: _Optional[str] = ..., cluster_clock_skew_ms: _Optional[int] = ..., cluster_prune_paused: _Optional[bool] = ..., cluster_places_restored: _Optional[int] = ..., cluster_shards_resumed: _Optional[int] = ..., cluster_shards_reread: _Optional[int] = ..., cluster_checkpoints_built: _Optional[int] = ..., cluster_checkpoints_loaded: _Optional[int] = ..., cluster_checkpoints_rejected: _Optional[int] = ..., cluster_startup_commands: _Optional[int] = ..., cluster_startup_bytes: _Optional[int] = ..., cluster_startup_ms: _Optional[int] = ..., cluster_checkpoint_results_withheld: _Optional[int] = ..., peer_nodes_resumed: _Optional[int] = ..., artifact_blobs_held: _Optional[int] = ..., artifact_bytes_held: _Optional[int] = ..., artifact_uploads: _Optional[int] = ..., artifact_uploads_already_held: _Optional[int] = ..., artifact_uploads_refused: _Optional[int] = ..., artifact_digest_failures: _Optional[int] = ..., artifact_fetches_local: _Optional[int] = ..., artifact_fetches_shared_dir: _Optional[int] = ..., artifact_fetches_cluster: _Optional[int] = ..., artifact_fetches_missing: _Optional[int] = ..., artifact_bytes_served: _Optional[int] = ..., artifact_bytes_read_from_tiers: _Optional[int] = ..., artifact_collections: _Optional[int] = ..., artifact_bytes_over_blob_limit: _Optional[int] = ..., artifact_bytes_over_store_limit: _Optional[int] = ..., artifact_bytes_over_uid_limit: _Optional[int] = ..., max_artifact_bytes: _Optional[int] = ..., artifact_store_bytes: _Optional[int] = ..., artifact_records_refused: _Optional[int] = ..., artifact_bytes_over_cluster_limit: _Optional[int] = ..., artifact_shared_dir_collections: _Optional[int] = ..., artifact_handoffs: _Optional[int] = ..., artifact_store_bytes_per_uid: _Optional[int] = ..., artifact_bytes_over_uid_store_limit: _Optional[int] = ..., artifact_fetches_over_store_limit: _Optional[int] = ..., artifact_shared_dir_squatted: _Optional[int] = ..., snapshot_squatted_files: _Optional[int] = ..., replay_misses: _Optional[int] = ..., replay_bundled_entries: _Optional[int] = ..., bundles_loaded: _Optional[int] = ..., bundle_entries: _Optional[int] = ..., artifact_fetches_bundle: _Optional[int] = ..., last_use_updates_written: _Optional[int] = ..., entries_expired: _Optional[int] = ..., entries_expired_by_bound: _Optional[int] = ..., entries_expired_on_arrival: _Optional[int] = ..., artifacts_unnamed_by_expiry: _Optional[int] = ..., cluster_last_use_commands: _Optional[int] = ..., cluster_entries_expired: _Optional[int] = ..., snapshot_last_uses_published: _Optional[int] = ..., expiry_paused: _Optional[str] = ..., namespace_usage: _Optional[_Iterable[_Union[UsageGroup, _Mapping]]] = ..., namespace_usage_at_unix_ms: _Optional[int] = ...) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("key", "wait_ms", "can_tune", "lease_ms", "view", "replay")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    CAN_TUNE_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    key: Key
    wait_ms: int
    can_tune: bool
    lease_ms: int
    view: str
    replay: bool
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., wait_ms: _Optional[int] = ..., can_tune: _Optional[bool] = ..., lease_ms: _Optional[int] = ..., view: _Optional[str] = ..., replay: _Optional[bool] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "expires_in_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    expires_in_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., expires_in_ms: _Optional[int] = ...) -> None: ...

class Miss(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ResolveResponse(_message.Message):
    __slots__ = ("hit", "tune_here", "miss")
    HIT_FIELD_NUMBER: _ClassVar[int]
    TUNE_HERE_FIELD_NUMBER: _ClassVar[int]
    MISS_FIELD_NUMBER: _ClassVar[int]
    hit: Result
    tune_here: Lease
    miss: Miss
    def __init__(self, hit: _Optional[_Union[Result, _Mapping]] = ..., tune_here: _Optional[_Union[Lease, _Mapping]] = ..., miss: _Optional[_Union[Miss, _Mapping]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("path", "entries", "bytes", "duration_ms", "skipped_unchanged")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    path: str
    entries: int
    bytes: int
    duration_ms: int
    skipped_unchanged: bool
    def __init__(self, path: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., duration_ms: _Optional[int] = ..., skipped_unchanged: _Optional[bool] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("namespace", "op", "device", "problem", "rank", "only_if")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    op: str
    device: str
    problem: str
    rank: int
    only_if: Result
    def __init__(self, namespace: _Optional[str] = ..., op: _Optional[str] = ..., device: _Optional[str] = ..., problem: _Optional[str] = ..., rank: _Optional[int] = ..., only_if: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("forgotten",)
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    forgotten: int
    def __init__(self, forgotten: _Optional[int] = ...) -> None: ...

class ListViewsRequest(_message.Message):
    __slots__ = ("limit", "after")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    limit: int
    after: str
    def __init__(self, limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ViewInfo(_message.Message):
    __slots__ = ("name", "pins", "idle_ms", "uid")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    name: str
    pins: int
    idle_ms: int
    uid: int
    def __init__(self, name: _Optional[str] = ..., pins: _Optional[int] = ..., idle_ms: _Optional[int] = ..., uid: _Optional[int] = ...) -> None: ...

class ListViewsResponse(_message.Message):
    __slots__ = ("views", "next")
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    views: _containers.RepeatedCompositeFieldContainer[ViewInfo]
    next: str
    def __init__(self, views: _Optional[_Iterable[_Union[ViewInfo, _Mapping]]] = ..., next: _Optional[str] = ...) -> None: ...

class EndViewRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class EndViewResponse(_message.Message):
    __slots__ = ("ended", "pins_dropped")
    ENDED_FIELD_NUMBER: _ClassVar[int]
    PINS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    pins_dropped: int
    def __init__(self, ended: _Optional[bool] = ..., pins_dropped: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("sha256", "size", "data")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    data: bytes
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutArtifactResponse(_message.Message):
    __slots__ = ("already_held",)
    ALREADY_HELD_FIELD_NUMBER: _ClassVar[int]
    already_held: bool
    def __init__(self, already_held: _Optional[bool] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("sha256", "wait_ms")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    wait_ms: int
    def __init__(self, sha256: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class StatArtifactsRequest(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sha256: _Optional[_Iterable[str]] = ...) -> None: ...

class StatArtifactsResponse(_message.Message):
    __slots__ = ("missing",)
    MISSING_FIELD_NUMBER: _ClassVar[int]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, missing: _Optional[_Iterable[str]] = ...) -> None: ...

class ListMissesRequest(_message.Message):
    __slots__ = ("view",)
    VIEW_FIELD_NUMBER: _ClassVar[int]
    view: str
    def __init__(self, view: _Optional[str] = ...) -> None: ...

class MissedKey(_message.Message):
    __slots__ = ("key", "count", "first_unix_ms", "last_unix_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    key: Key
    count: int
    first_unix_ms: int
    last_unix_ms: int
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., count: _Optional[int] = ..., first_unix_ms: _Optional[int] = ..., last_unix_ms: _Optional[int] = ...) -> None: ...

class ViewMisses(_message.Message):
    __slots__ = ("view", "uid", "keys", "left_out")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    view: str
    uid: int
    keys: _containers.RepeatedCompositeFieldContainer[MissedKey]
    left_out: int
    def __init__(self, view: _Optional[str] = ..., uid: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[MissedKey, _Mapping]]] = ..., left_out: _Optional[int] = ...) -> None: ...

class ListMissesResponse(_message.Message):
    __slots__ = ("views",)
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    views: _containers.RepeatedCompositeFieldContainer[ViewMisses]
    def __init__(self, views: _Optional[_Iterable[_Union[ViewMisses, _Mapping]]] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("by",)
    BY_FIELD_NUMBER: _ClassVar[int]
    by: str
    def __init__(self, by: _Optional[str] = ...) -> None: ...

class UsageGroup(_message.Message):
    __slots__ = ("name", "entries", "entry_bytes", "artifact_bytes", "by_age")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    BY_AGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    entries: int
    entry_bytes: int
    artifact_bytes: int
    by_age: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., entries: _Optional[int] = ..., entry_bytes: _Optional[int] = ..., artifact_bytes: _Optional[int] = ..., by_age: _Optional[_Iterable[int]] = ...) -> None: ...

class UsageResponse(_message.Message):
    __slots__ = ("groups", "today", "retain_days", "max_entries", "journal_bytes")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TODAY_FIELD_NUMBER: _ClassVar[int]
    RETAIN_DAYS_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[UsageGroup]
    today: int
    retain_days: int
    max_entries: int
    journal_bytes: int
    def __init__(self, groups: _Optional[_Iterable[_Union[UsageGroup, _Mapping]]] = ..., today: _Optional[int] = ..., retain_days: _Optional[int] = ..., max_entries: _Optional[int] = ..., journal_bytes: _Optional[int] = ...) -> None: ...

class PruneRequest(_message.Message):
    __slots__ = ("unused_for_days", "namespace", "device", "dry_run")
    UNUSED_FOR_DAYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    unused_for_days: int
    namespace: str
    device: str
    dry_run: bool
    def __init__(self, unused_for_days: _Optional[int] = ..., namespace: _Optional[str] = ..., device: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PruneResponse(_message.Message):
    __slots__ = ("keys", "count")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Key]
    count: int
    def __init__(self, keys: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., count: _Optional[int] = ...) -> None: ...

class DevicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Device(_message.Message):
    __slots__ = ("backend", "name", "compute_capability", "memory_bytes", "driver_version", "cuda_version", "fingerprint")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    backend: str
    name: str
    compute_capability: str
    memory_bytes: int
    driver_version: str
    cuda_version: str
    fingerprint: str
    def __init__(self, backend: _Optional[str] = ..., name: _Optional[str] = ..., compute_capability: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class DevicesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...
