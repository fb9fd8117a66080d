//! Command-line flags of `tunecached`. Every flag has a `TUNECACHE_*` environment twin so a
//! launcher can configure the daemon without building a command line. Defaults for the socket
//! and state directory come from the directories systemd made for the service
//! (`$RUNTIME_DIRECTORY`, `$STATE_DIRECTORY`) when it sets them (`places`).
//!
//! Here: the flags. The typed settings each part starts with are made from them in
//! `settings`; key files are read in `secrets`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use tunecache_proto::tuner::BackendChoice;

use crate::journal::FsyncPolicy;

mod artifacts;
mod places;
mod secrets;
mod settings;
pub use artifacts::ArtifactFlags;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which tokio runtime serves gRPC (`--runtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeFlavor {
    MultiThread,
    CurrentThread,
}

/// The per-node daemon that owns the GPU autotuning cache.
#[derive(Clone, Debug, Parser)]
#[command(name = "tunecached", version, about)]
pub struct Config {
    /// Unix socket to serve on [default: $XDG_RUNTIME_DIR/tunecache/tunecache.sock, else
    /// /tmp/tunecache-<uid>/tunecache.sock]
    #[arg(long, env = "TUNECACHE_SOCKET")]
    pub socket: Option<PathBuf>,

    /// Directory of the durable node-local store (the journal) [default:
    /// $XDG_STATE_HOME/tunecache, else ~/.local/state/tunecache]
    #[arg(long, env = "TUNECACHE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// This node's name in snapshots, the cluster tier and `tuned_by`: 1 to 64 of
    /// A-Z a-z 0-9 . _ -, not starting with '.' or '-' [default: the hostname and an id made
    /// on first start and kept in the state directory (`node-id`), unique per daemon]
    #[arg(long, env = "TUNECACHE_NODE_NAME")]
    pub node_name: Option<String>,

    /// Log format on stderr; the level comes from RUST_LOG (default info).
    #[arg(long, env = "TUNECACHE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// When the journal reaches stable storage. Every policy writes before acknowledging,
    /// so acknowledged records survive a daemon crash; `batch` may lose the last 100 ms on
    /// power loss, `always` loses nothing.
    #[arg(long, env = "TUNECACHE_FSYNC", value_enum, default_value = "batch")]
    pub fsync: FsyncPolicy,

    /// Shared-filesystem directory where nodes publish and read snapshots.
    #[arg(long, env = "TUNECACHE_SHARED_DIR")]
    pub shared_dir: Option<PathBuf>,

    /// Seconds between snapshots to, and loads from, the shared directory.
    #[arg(long, env = "TUNECACHE_SNAPSHOT_INTERVAL", default_value_t = 30)]
    pub snapshot_interval: u64,

    /// The tuner worker binary, or `off` [default: tunecache-tuner next to tunecached]
    #[arg(long, env = "TUNECACHE_TUNER")]
    pub tuner: Option<String>,

    /// Which backend the tuner worker measures on: `auto` uses CUDA when a driver and a GPU
    /// are present, else the CPU stand-in.
    #[arg(long, env = "TUNECACHE_TUNER_BACKEND", default_value = "auto")]
    pub tuner_backend: BackendChoice,

    /// Seconds one tuning job may run before the worker is killed and the job failed.
    #[arg(long, env = "TUNECACHE_TUNER_JOB_TIMEOUT", default_value_t = 600)]
    pub tuner_job_timeout: u64,

    /// Tuning jobs that may queue; Resolve answers RESOURCE_EXHAUSTED beyond that.
    #[arg(long, env = "TUNECACHE_TUNER_QUEUE", default_value_t = 64)]
    pub tuner_queue: usize,

    /// The GPU (CUDA ordinal) the tuner worker measures on; it creates a context on that GPU
    /// only. Default: the least-loaded GPU by NVML when NVML loads, else the last GPU (rank 0
    /// usually runs on the first).
    #[arg(long, env = "TUNECACHE_TUNER_DEVICE", value_name = "ORDINAL")]
    pub tuner_device: Option<u32>,

    // --- Deployment and access ---
    /// Group (name or gid) given the socket, so its members can connect (mode is 0660).
    /// Ignored under socket activation, where the unit's SocketGroup= applies.
    #[arg(long, env = "TUNECACHE_SOCKET_GROUP", value_name = "NAME|GID")]
    pub socket_group: Option<String>,

    /// Also allow callers with this uid (repeatable, or comma-separated). The daemon's own
    /// uid and root are always allowed; others get PERMISSION_DENIED.
    #[arg(
        long,
        env = "TUNECACHE_ALLOW_UID",
        value_delimiter = ',',
        value_name = "UID"
    )]
    pub allow_uid: Vec<u32>,

    /// Also allow callers in this group (name or gid), primary or supplementary
    /// (repeatable, or comma-separated).
    #[arg(
        long,
        env = "TUNECACHE_ALLOW_GID",
        value_delimiter = ',',
        value_name = "NAME|GID"
    )]
    pub allow_gid: Vec<String>,

    /// Also let this uid run a scope Forget (repeatable, or comma-separated): an
    /// administrator's act. Root and the daemon's own uid always may; a Forget of one key
    /// with `only_if` is open to every allowed caller.
    #[arg(
        long,
        env = "TUNECACHE_ADMIN_UID",
        value_delimiter = ',',
        value_name = "UID"
    )]
    pub admin_uid: Vec<u32>,

    /// Also let members of this group (name or gid, primary or supplementary) run a scope
    /// Forget (repeatable, or comma-separated).
    #[arg(
        long,
        env = "TUNECACHE_ADMIN_GID",
        value_delimiter = ',',
        value_name = "NAME|GID"
    )]
    pub admin_gid: Vec<String>,

    /// Forgets of one key (`only_if`) one uid may ask per minute (a burst of that many, then
    /// that rate); past it they are refused RESOURCE_EXHAUSTED. Scope Forgets are an
    /// administrator's act and not counted.
    #[arg(
        long,
        env = "TUNECACHE_MAX_EXACT_FORGETS_PER_UID",
        default_value_t = crate::ops::forget_budget::DEFAULT_MAX_EXACT_FORGETS_PER_UID,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_exact_forgets_per_uid: u32,

    /// Keep each Forget's tombstone this many days, so that no replica (a node that was
    /// down, an old shared-directory file) brings its entries back (docs/forget.md).
    #[arg(
        long,
        env = "TUNECACHE_FORGET_RETENTION_DAYS",
        default_value_t = 90,
        value_name = "DAYS"
    )]
    pub forget_retention_days: u32,

    /// Expire entries no rank has used for this many days, on every node and in every tier
    /// (docs/lifecycle.md). 0 keeps everything.
    #[arg(
        long,
        env = "TUNECACHE_RETAIN_DAYS",
        default_value_t = crate::model::lifecycle::DEFAULT_RETAIN_DAYS,
        value_name = "DAYS"
    )]
    pub retain_days: u32,

    /// The retention of one namespace, over --retain-days: NS=DAYS (0 keeps its entries for
    /// ever). Repeatable; with the environment variable, comma-separated.
    #[arg(
        long = "retain",
        env = "TUNECACHE_RETAIN",
        value_name = "NS=DAYS",
        value_delimiter = ',',
        value_parser = crate::model::lifecycle::Retention::parse_override
    )]
    pub retain: Vec<(String, u32)>,

    /// Most entries this node keeps; past it the least recently used expire early, the same
    /// ones on every node (docs/lifecycle.md). 0: no bound.
    #[arg(
        long,
        env = "TUNECACHE_MAX_ENTRIES",
        default_value_t = crate::model::lifecycle::DEFAULT_MAX_ENTRIES,
        value_name = "N"
    )]
    pub max_entries: u64,

    /// How often the uses reads marked are journalled and sent to the tiers, in ms (tests).
    #[arg(
        long,
        env = "TUNECACHE_LIFECYCLE_FLUSH_MS",
        default_value_t = 60_000,
        value_name = "MS",
        hide = true
    )]
    pub lifecycle_flush_ms: u64,

    /// A job's view ends after this many seconds without a request on this node; its next
    /// read pins afresh (docs/views.md).
    #[arg(
        long,
        env = "TUNECACHE_VIEW_IDLE_SECS",
        default_value_t = 24 * 3600,
        value_name = "SECS"
    )]
    pub view_idle_secs: u64,

    /// Most pins this node holds, all views of all uids together; over it, new keys are
    /// answered unpinned, and no uid's pins are dropped for another's (docs/views.md).
    #[arg(
        long,
        env = "TUNECACHE_MAX_VIEW_PINS",
        default_value_t = crate::views::DEFAULT_CAPS.max_pins as u64,
        value_name = "PINS"
    )]
    pub max_view_pins: u64,

    /// Most pins one uid's views hold together; over it, that uid's own view idle longest is
    /// dropped first (docs/views.md).
    #[arg(
        long,
        env = "TUNECACHE_MAX_VIEW_PINS_PER_UID",
        default_value_t = crate::views::DEFAULT_CAPS.max_pins_per_uid as u64,
        value_name = "PINS"
    )]
    pub max_view_pins_per_uid: u64,

    /// Most views one uid holds, empty ones included; a new one drops that uid's view idle
    /// longest (docs/views.md).
    #[arg(
        long,
        env = "TUNECACHE_MAX_VIEWS_PER_UID",
        default_value_t = crate::views::DEFAULT_CAPS.max_views_per_uid as u64,
        value_name = "VIEWS"
    )]
    pub max_views_per_uid: u64,

    /// Exit cleanly (as on SIGTERM) once no client has called for this many seconds.
    #[arg(long, env = "TUNECACHE_EXIT_WHEN_IDLE", value_name = "SECS")]
    pub exit_when_idle: Option<u64>,

    /// Directory of this user's job markers on this node, one file per job named by its id
    /// (the Slurm prolog's `$SOCKET_ROOT/.jobs/<uid>`): while a job named there has a process
    /// on this node, --exit-when-idle counts no idle time.
    #[arg(long, env = "TUNECACHE_JOB_MARKERS", value_name = "DIR")]
    pub job_markers: Option<PathBuf>,

    /// Serve Prometheus metrics on http://ADDR/metrics: PORT (loopback only) or HOST:PORT.
    /// Off by default.
    #[arg(long, env = "TUNECACHE_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,

    // --- Snapshots ---
    /// fsync each snapshot file and the shared directory before and after the rename. Off
    /// by default: a snapshot needs an atomic replacement, not durability (each node's
    /// journal is the durable copy), and fsync on a shared filesystem can take minutes.
    #[arg(long, env = "TUNECACHE_SNAPSHOT_FSYNC")]
    pub snapshot_fsync: bool,

    /// Largest file read from the shared directory, in bytes; a larger one is skipped with
    /// one warning.
    #[arg(
        long,
        env = "TUNECACHE_SNAPSHOT_MAX_FILE_BYTES",
        default_value_t = crate::snapshot::shared_file::DEFAULT_MAX_FILE_BYTES,
        value_name = "BYTES"
    )]
    pub snapshot_max_file_bytes: u64,

    // --- Limits (README "Limits") ---
    /// Connections one uid may hold open; more are closed at accept, with a log line.
    #[arg(
        long,
        env = "TUNECACHE_MAX_CONNECTIONS_PER_UID",
        default_value_t = 512,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_connections_per_uid: u64,

    /// Seconds a new connection may take to send the HTTP/2 preface before it is closed.
    #[arg(
        long,
        env = "TUNECACHE_PREFACE_TIMEOUT",
        default_value_t = 10,
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub preface_timeout: u64,

    /// Seconds between HTTP/2 pings on a quiet connection; a peer that does not answer within
    /// 20 s is closed. 0 turns pings off.
    #[arg(
        long,
        env = "TUNECACHE_HTTP2_KEEPALIVE",
        default_value_t = 60,
        value_name = "SECS"
    )]
    pub http2_keepalive: u64,

    /// Close each connection gracefully (GOAWAY; clients reconnect) after this many seconds,
    /// letting calls in flight finish. Off by default.
    #[arg(long, env = "TUNECACHE_MAX_CONNECTION_AGE", value_name = "SECS")]
    pub max_connection_age: Option<u64>,

    // --- Transport tuning (defaults chosen by `tunecache-bench micro --only transport`) ---
    /// The async runtime: `multi-thread` (one worker per core) or `current-thread` (the
    /// whole gRPC front end on one thread; the journal writer keeps its own).
    #[arg(
        long,
        env = "TUNECACHE_RUNTIME",
        value_enum,
        default_value = "multi-thread"
    )]
    pub runtime: RuntimeFlavor,

    /// HTTP/2 flow-control window the daemon grants each stream and each connection, in
    /// bytes (how much a client may send before the daemon reads it) [default: hyper's, 1 MiB].
    #[arg(
        long,
        env = "TUNECACHE_HTTP2_WINDOW_BYTES",
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(65_535..=2_147_483_647)
    )]
    pub http2_window_bytes: Option<u32>,

    /// Largest HTTP/2 frame the daemon accepts, in bytes [default: 16384, the protocol's].
    #[arg(
        long,
        env = "TUNECACHE_HTTP2_MAX_FRAME_BYTES",
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(16_384..=16_777_215)
    )]
    pub http2_max_frame_bytes: Option<u32>,

    /// Let hyper size the HTTP/2 windows from measured bandwidth-delay (BDP pings) instead of
    /// fixed windows; overrides --http2-window-bytes.
    #[arg(long, env = "TUNECACHE_HTTP2_ADAPTIVE_WINDOW")]
    pub http2_adaptive_window: bool,

    /// Tuning leases one process may hold at once; Resolve answers RESOURCE_EXHAUSTED beyond.
    #[arg(
        long,
        env = "TUNECACHE_MAX_LEASES_PER_PID",
        default_value_t = 256,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_leases_per_pid: u64,

    /// MiB of Records that may wait for the journal writer; Record answers
    /// RESOURCE_EXHAUSTED beyond (the disk is slower than the callers).
    #[arg(
        long,
        env = "TUNECACHE_WRITE_QUEUE_MIB",
        default_value_t = 256,
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=1024 * 1024)
    )]
    pub write_queue_mib: u64,

    #[command(flatten)]
    pub artifacts: ArtifactFlags,

    /// Largest artifact blob the Redis tier carries, in bytes; a larger one stays on this
    /// node and the shared directory (its entry is still published).
    #[arg(
        long,
        env = "TUNECACHE_CLUSTER_MAX_ARTIFACT_BYTES",
        default_value_t = tunecache_proto::artifact::DEFAULT_CLUSTER_MAX_ARTIFACT_BYTES,
        value_name = "BYTES"
    )]
    pub cluster_max_artifact_bytes: u64,

    /// Most MiB this deployment's keys may take in Redis (docs/lifecycle.md): past it the
    /// least recently used entries expire early, the same ones on every node. The streams'
    /// share (--cluster-stream-max-len) is set aside first. 0: no bound.
    #[arg(
        long,
        env = "TUNECACHE_CLUSTER_MAX_MIB",
        default_value_t = 0,
        value_name = "MIB"
    )]
    pub cluster_max_mib: u64,

    /// Largest request message read, in bytes: a larger one is refused RESOURCE_EXHAUSTED
    /// from its gRPC header, before any of it is buffered. The default holds a full batch of
    /// 10,000 entries averaging 6.7 KB; the entry limits' worst case (10,000 keys or entries
    /// at every field limit: 164 MB / 861 MB) is more than one request should make the
    /// daemon hold.
    #[arg(
        long,
        env = "TUNECACHE_MAX_MESSAGE_BYTES",
        default_value_t = tunecache_proto::limits::DEFAULT_MAX_REQUEST_BYTES as u64,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(4096..=u64::from(u32::MAX))
    )]
    pub max_message_bytes: u64,

    /// Bytes of request messages one uid may have in flight (being read, decoded or served)
    /// at once, over all its connections; a message that would pass it is refused
    /// RESOURCE_EXHAUSTED from its header. At least --max-message-bytes [default: 4 times
    /// --max-message-bytes]
    #[arg(
        long,
        env = "TUNECACHE_MAX_REQUEST_BYTES_PER_UID",
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(4096..)
    )]
    pub max_request_bytes_per_uid: Option<u64>,

    /// Compact this node's own snapshot segments into one once there are more than this
    /// many (also once they hold twice the live entries).
    #[arg(
        long,
        env = "TUNECACHE_SNAPSHOT_COMPACT_SEGMENTS",
        default_value_t = crate::snapshot::DEFAULT_COMPACT_SEGMENTS,
        value_name = "N"
    )]
    pub snapshot_compact_segments: usize,

    // --- Redis cluster tier ---
    /// Redis of the cluster tier: redis://[user[:password]@]host:port[/db], rediss:// (TLS)
    /// or redis+unix:///path. Off by default. Prefer --cluster-password-file for the password.
    #[arg(
        long,
        env = "TUNECACHE_CLUSTER_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub cluster_url: Option<String>,

    /// File holding the Redis password (one line), so it is never on a command line.
    #[arg(long, env = "TUNECACHE_CLUSTER_PASSWORD_FILE", value_name = "PATH")]
    pub cluster_password_file: Option<PathBuf>,

    /// Prefix of every Redis key, so several clusters or format versions share one server.
    #[arg(long, env = "TUNECACHE_CLUSTER_PREFIX", default_value = "tunecache:")]
    pub cluster_prefix: String,

    /// File holding the key every node of the cluster shares (one line, at least 16 bytes):
    /// then every shared-directory file carries an HMAC-SHA256 under it, and files without
    /// one that verifies are skipped. Without it, only files owned by this daemon's uid or
    /// --shared-dir-writer-uid count. Refused at start unless private, as ssh does: owned by
    /// this daemon's uid or root, no access for group or others.
    #[arg(long, env = "TUNECACHE_SHARED_DIR_KEY_FILE", value_name = "PATH")]
    pub shared_dir_key_file: Option<PathBuf>,

    /// File holding the key every node of the Redis tier shares (one line, at least 16
    /// bytes; the same rules as --shared-dir-key-file, and it may be the same file): then
    /// every shard checkpoint a node builds carries an HMAC-SHA256 under it, and a checkpoint
    /// without one that verifies is rejected (the shard is read from its entries). Refused at
    /// start unless private: owned by this daemon's uid or root, no access for group or others.
    #[arg(long, env = "TUNECACHE_CLUSTER_KEY_FILE", value_name = "PATH")]
    pub cluster_key_file: Option<PathBuf>,

    /// Uids whose files in the shared directory count when no key is set, besides this
    /// daemon's own (e.g. a site-wide daemon's account), and who may own its `v2/`.
    #[arg(
        long,
        env = "TUNECACHE_SHARED_DIR_WRITER_UID",
        value_delimiter = ',',
        value_name = "UID"
    )]
    pub shared_dir_writer_uid: Vec<u32>,

    /// A bundle staging exported (`tunecache bundle export`; docs/bundles.md) to serve,
    /// read-only: repeatable. Each is verified whole at start, and one that fails stops the
    /// start, naming the file, the part and the reason. Its entries enter the cache as one
    /// more source; its blobs are read from the file when a rank asks for them.
    #[arg(
        long,
        env = "TUNECACHE_BUNDLE",
        value_delimiter = ',',
        value_name = "FILE"
    )]
    pub bundle: Vec<PathBuf>,

    /// An Ed25519 public key (PEM, as `openssl pkey -pubout` writes) a bundle must be
    /// signed by: repeatable. With any given, an unsigned bundle, or one signed by another
    /// key, stops the start.
    #[arg(
        long,
        env = "TUNECACHE_BUNDLE_TRUST_KEY",
        value_delimiter = ',',
        value_name = "PUB.pem"
    )]
    pub bundle_trust_key: Vec<PathBuf>,

    /// Serve the bundles exactly: a key a bundle holds answers the bundle's result on every
    /// read whatever the cache holds; no read waits or takes a lease, and a key in no bundle
    /// answers the cache's result or a miss at once (`replay: not in any bundle`), listed by
    /// `tunecache misses`. Records still merge into the cache.
    #[arg(long, env = "TUNECACHE_REPLAY")]
    pub replay: bool,

    /// In a `v2/` every user shares (root's, mode 1777), write segments every user may read
    /// (0644): a site-wide daemon's, whose results every user's daemon reads. Without it a
    /// daemon's segments there are its own uid's alone (0600).
    #[arg(long, env = "TUNECACHE_SHARED_DIR_PUBLIC")]
    pub shared_dir_public: bool,

    /// Longest a Resolve waits for Redis before coordinating node-locally.
    #[arg(long, env = "TUNECACHE_CLUSTER_TIMEOUT_MS", default_value_t = 20)]
    pub cluster_timeout_ms: u64,

    /// Length of a cluster lease; renewed every third while the local lease or job lives,
    /// so it only runs out when the holding node dies or hangs.
    #[arg(long, env = "TUNECACHE_CLUSTER_LEASE_MS", default_value_t = 10_000)]
    pub cluster_lease_ms: u64,

    /// PEM file of the certificates that verify a rediss:// server, for a site CA; without
    /// it the system's and webpki's roots are used.
    #[arg(long, env = "TUNECACHE_CLUSTER_TLS_CA_FILE", value_name = "PATH")]
    pub cluster_tls_ca_file: Option<PathBuf>,

    /// Most results the publish queue holds while Redis is away or slow; past it the queue
    /// is dropped and every winner republished once Redis keeps up.
    #[arg(long, env = "TUNECACHE_CLUSTER_PUBLISH_QUEUE", default_value_t = crate::cluster::DEFAULT_PUBLISH_QUEUE, value_name = "N")]
    pub cluster_publish_queue: usize,

    /// Messages kept (approximately) in each of the 16 shard streams; a node further behind
    /// reads the shard again from its entries.
    #[arg(long, env = "TUNECACHE_CLUSTER_STREAM_MAX_LEN", default_value_t = crate::cluster::DEFAULT_STREAM_MAX_LEN, value_name = "N")]
    pub cluster_stream_max_len: u64,

    /// Seconds between audits of this node against Redis (one also runs after every
    /// reconnect).
    #[arg(long, env = "TUNECACHE_CLUSTER_AUDIT_SECS", default_value_t = crate::cluster::DEFAULT_AUDIT_SECS, value_name = "SECS")]
    pub cluster_audit_secs: u64,

    /// Rebuild a shard's checkpoint in Redis once its stream moved this many messages past
    /// it; 0: a tenth of the shard's entries, at least 256 and at most half of
    /// --cluster-stream-max-len.
    #[arg(
        long,
        env = "TUNECACHE_CLUSTER_CHECKPOINT_EVERY",
        default_value_t = 0,
        value_name = "N"
    )]
    pub cluster_checkpoint_every: u64,

    /// Tests only: how often (ms, jittered by half) a node looks for checkpoints to rebuild.
    /// Hidden from --help.
    #[arg(long, hide = true, default_value_t = crate::cluster::DEFAULT_CHECKPOINT_CHECK_MS)]
    pub cluster_checkpoint_check_ms: u64,

    /// Tests only: shifts this node's clock as the cluster tier reads it by this many ms, so
    /// a test can run a node whose clock is off from Redis's. Hidden from --help.
    #[arg(long, hide = true, default_value_t = 0, allow_hyphen_values = true)]
    pub cluster_clock_offset_ms: i64,
}

/// Where the tuner worker comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunerSetting {
    Off,
    Worker(PathBuf),
}

impl Config {
    pub fn tuner_setting(&self) -> TunerSetting {
        match self.tuner.as_deref() {
            Some("off") => TunerSetting::Off,
            Some(path) => TunerSetting::Worker(PathBuf::from(path)),
            None => {
                let beside_daemon = std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(|dir| dir.join("tunecache-tuner")));
                TunerSetting::Worker(beside_daemon.unwrap_or_else(|| "tunecache-tuner".into()))
            }
        }
    }

    pub fn snapshot_interval(&self) -> Duration {
        Duration::from_secs(self.snapshot_interval.max(1))
    }

    pub fn preface_timeout(&self) -> Duration {
        Duration::from_secs(self.preface_timeout.max(1))
    }

    pub fn http2_keepalive(&self) -> Option<Duration> {
        (self.http2_keepalive > 0).then(|| Duration::from_secs(self.http2_keepalive))
    }

    pub fn max_connection_age(&self) -> Option<Duration> {
        self.max_connection_age
            .map(|secs| Duration::from_secs(secs.max(1)))
    }

    pub fn exit_when_idle(&self) -> Option<Duration> {
        self.exit_when_idle
            .map(|secs| Duration::from_secs(secs.max(1)))
    }
}

#[cfg(test)]
mod tests;
