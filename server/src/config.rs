//! Command-line flags of `tunecached`. Every flag has a `TUNECACHE_*` environment twin so a
//! launcher can configure the daemon without building a command line. Defaults for the socket
//! and state directory come from the directories systemd made for the service
//! (`$RUNTIME_DIRECTORY`, `$STATE_DIRECTORY`) when it sets them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use tunecache_proto::tuner::BackendChoice;

use crate::journal::FsyncPolicy;
use crate::model::shared_key::SharedKey;

mod artifacts;
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

/// `--max-request-bytes-per-uid` by default: this many messages of the largest size.
const DEFAULT_UID_MESSAGES: usize = 4;

/// Where the tuner worker comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunerSetting {
    Off,
    Worker(PathBuf),
}

impl Config {
    /// The snapshot module's settings; `None` when the daemon runs without `--shared-dir`.
    /// The key file is read here, so a missing or short key stops the start, naming the flag.
    pub(crate) fn snapshot_settings(
        &self,
    ) -> crate::Result<Option<crate::snapshot::SnapshotSettings>> {
        let Some(dir) = self.shared_dir.clone() else {
            return Ok(None);
        };
        let key = match &self.shared_dir_key_file {
            None => None,
            Some(path) => Some(read_shared_key(path).map_err(|why| {
                crate::Error::SharedDirUnsafe(format!(
                    "--shared-dir-key-file {}: {why}",
                    path.display()
                ))
            })?),
        };
        // This daemon's own files always count: it reads its own segments back at start.
        let mut writer_uids = vec![nix::unistd::geteuid().as_raw()];
        for uid in &self.shared_dir_writer_uid {
            if !writer_uids.contains(uid) {
                writer_uids.push(*uid);
            }
        }
        Ok(Some(crate::snapshot::SnapshotSettings {
            state_dir: self.state_dir(),
            key,
            writer_uids,
            dir,
            node: self.node_name(),
            interval: self.snapshot_interval(),
            fsync: self.snapshot_fsync,
            max_file_bytes: self.snapshot_max_file_bytes,
            compact_segments: self.snapshot_compact_segments.max(1),
            public: self.shared_dir_public,
        }))
    }

    /// The cluster tier's settings, checked; `None` without `--cluster-url`.
    pub(crate) fn cluster_settings(
        &self,
    ) -> crate::Result<Option<crate::cluster::ClusterSettings>> {
        let Some(url) = self.cluster_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let mut settings = crate::cluster::ClusterSettings::new(
            url,
            self.cluster_password_file.as_deref(),
            self.cluster_tls_ca_file.as_deref(),
            self.cluster_prefix.clone(),
            Duration::from_millis(self.cluster_timeout_ms.max(1)),
            Duration::from_millis(self.cluster_lease_ms.max(300)),
            self.node_name(),
        )?;
        settings.publish_queue = self.cluster_publish_queue.max(1);
        settings.stream_max_len = self.cluster_stream_max_len.max(1);
        settings.audit_interval = Duration::from_secs(self.cluster_audit_secs.max(1));
        settings.clock_offset_ms = self.cluster_clock_offset_ms;
        settings.state_dir = Some(self.state_dir());
        settings.checkpoint_every = self.cluster_checkpoint_every;
        settings.checkpoint_check = Duration::from_millis(self.cluster_checkpoint_check_ms.max(10));
        if let Some(path) = &self.cluster_key_file {
            settings.key = Some(read_shared_key(path).map_err(|why| {
                crate::Error::ClusterConfig(format!("--cluster-key-file {}: {why}", path.display()))
            })?);
        }
        Ok(Some(settings))
    }

    /// `--socket`/`$TUNECACHE_SOCKET`, then `$RUNTIME_DIRECTORY/tunecache.sock` (systemd's
    /// `RuntimeDirectory=`), then the XDG/tmp default every client uses.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .or_else(|| runtime_directory().map(|dir| dir.join("tunecache.sock")))
            .unwrap_or_else(tunecache_proto::socket_path::fallback_socket_path)
    }

    /// The artifact store's settings. One uid's share defaults to a quarter of the store
    /// only when users other than the daemon's own and root may call it.
    pub fn artifact_settings(&self) -> crate::artifacts::ArtifactSettings {
        let others_allowed = !self.allow_uid.is_empty() || !self.allow_gid.is_empty();
        self.artifacts.settings(self.state_dir(), others_allowed)
    }

    /// `--state-dir`/`$TUNECACHE_STATE_DIR`, then `$STATE_DIRECTORY` (systemd's
    /// `StateDirectory=`), then the XDG default.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        if let Some(dir) = state_directory() {
            return dir;
        }
        if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("tunecache");
        }
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        match home {
            Some(home) => PathBuf::from(home).join(".local/state/tunecache"),
            // SAFETY: getuid has no preconditions and cannot fail.
            None => PathBuf::from(format!("/tmp/tunecache-{}/state", unsafe {
                libc::getuid()
            })),
        }
    }

    /// `--node-name`, else the hostname (cut to the name rule) and this state directory's
    /// node id (`ensure_node_id` makes it at start).
    pub fn node_name(&self) -> String {
        if let Some(name) = &self.node_name {
            return name.clone();
        }
        let host: String = nix::unistd::gethostname()
            .ok()
            .and_then(|name| name.into_string().ok())
            .unwrap_or_else(|| "localhost".to_owned())
            .chars()
            .map(|c| {
                if crate::model::names::node_name_char(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(48)
            .collect();
        let host = host.trim_start_matches(['.', '-']);
        let host = if host.is_empty() { "node" } else { host };
        match std::fs::read_to_string(self.state_dir().join(NODE_ID_FILE)) {
            Ok(id) if check_node_id(id.trim()) => format!("{host}-{}", id.trim()),
            _ => host.to_owned(),
        }
    }

    /// Without `--node-name`, makes sure the state directory has a node id (8 random hex
    /// digits, made once), so two daemons on one host never share a default name.
    pub fn ensure_node_id(&self) -> crate::Result<()> {
        if self.node_name.is_some() {
            return Ok(());
        }
        let path = self.state_dir().join(NODE_ID_FILE);
        match std::fs::read_to_string(&path) {
            Ok(id) if check_node_id(id.trim()) => return Ok(()),
            _ => {}
        }
        let mut bytes = [0u8; 4];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| crate::Error::io("reading", std::path::Path::new("/dev/urandom"), e))?;
        let id = format!("{:08x}\n", u32::from_le_bytes(bytes));
        std::fs::write(&path, id).map_err(|e| crate::Error::io("writing the node id", &path, e))
    }

    /// The tuner's settings; `None` with `--tuner off`.
    pub(crate) fn tuner_settings(&self) -> Option<crate::tuner::SupervisorConfig> {
        let worker_path = match self.tuner_setting() {
            TunerSetting::Off => return None,
            TunerSetting::Worker(path) => path,
        };
        Some(crate::tuner::SupervisorConfig {
            worker_path,
            backend: self.tuner_backend,
            job_timeout: std::time::Duration::from_secs(self.tuner_job_timeout.max(1)),
            queue_capacity: self.tuner_queue.max(1),
            device: self.tuner_device,
            worker_args: Vec::new(),
        })
    }

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

    /// `--view-idle-secs` and `--max-view-pins`.
    pub(crate) fn view_settings(&self) -> crate::views::ViewSettings {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        crate::views::ViewSettings {
            idle: Duration::from_secs(self.view_idle_secs.max(1)),
            max_pins: count(self.max_view_pins),
            max_pins_per_uid: count(self.max_view_pins_per_uid),
            max_views_per_uid: count(self.max_views_per_uid),
        }
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

    /// The request limits of `--max-message-bytes` and `--max-request-bytes-per-uid`.
    pub(crate) fn request_limits(
        &self,
    ) -> crate::Result<crate::ops::request_limits::RequestLimits> {
        let max_message = usize::try_from(self.max_message_bytes).unwrap_or(usize::MAX);
        let per_uid = self
            .max_request_bytes_per_uid
            .map_or(max_message.saturating_mul(DEFAULT_UID_MESSAGES), |bytes| {
                usize::try_from(bytes).unwrap_or(usize::MAX)
            });
        crate::ops::request_limits::RequestLimits::new(max_message, per_uid)
    }

    pub fn exit_when_idle(&self) -> Option<Duration> {
        self.exit_when_idle
            .map(|secs| Duration::from_secs(secs.max(1)))
    }
}

/// The first directory of a `$STATE_DIRECTORY`-style variable (systemd separates several
/// `StateDirectory=` entries with colons).
fn first_directory(variable: &str) -> Option<PathBuf> {
    let value = std::env::var_os(variable)?;
    let value = value.to_str()?;
    value
        .split(':')
        .find(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// The state-directory file holding this daemon's node id.
const NODE_ID_FILE: &str = "node-id";

fn check_node_id(id: &str) -> bool {
    id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `StateDirectory=`'s directory, when the daemon runs as a systemd service that sets one.
fn state_directory() -> Option<PathBuf> {
    first_directory("STATE_DIRECTORY")
}

/// `RuntimeDirectory=`'s directory, when the daemon runs as a systemd service that sets one.
fn runtime_directory() -> Option<PathBuf> {
    first_directory("RUNTIME_DIRECTORY")
}

/// Reads a secret (a key file) only if it is private, as ssh reads a private key: the opened
/// file (`fstat`, so no rename can slip another file in between) must be owned by this
/// process's uid or root and give group and others no access. A key that other users can read
/// is no secret: any of them could MAC, and so forge, files every node accepts.
/// A shared key from its file: private (`read_private_file`), one line (the line end is not
/// part of the key), long enough.
fn read_shared_key(path: &std::path::Path) -> Result<SharedKey, String> {
    let text = read_private_file(path)?;
    let trimmed = text.strip_suffix(b"\n").unwrap_or(&text);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    SharedKey::new(trimmed)
}

pub(crate) fn read_private_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    let me = nix::unistd::geteuid().as_raw();
    if let Some(why) = private_file_refusal(metadata.uid(), metadata.mode(), me) {
        return Err(why);
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// Why a secret file owned by `owner` with `mode` may not be used by uid `me`; `None` when it
/// is private (ssh's rule for a private key).
fn private_file_refusal(owner: u32, mode: u32, me: u32) -> Option<String> {
    let mode = mode & 0o7777;
    let problem = if owner != me && owner != 0 {
        format!("it belongs to uid {owner}, not to this daemon's uid {me} or root")
    } else if mode & 0o077 != 0 {
        "group or others may access it".to_owned()
    } else {
        return None;
    };
    let owners = if me == 0 {
        "root".to_owned()
    } else {
        format!("uid {me} or root")
    };
    Some(format!(
        "owner uid {owner}, mode {mode:04o}: refused, {problem}; a key must be private \
         (owned by {owners}, chmod 600), since anyone who can read it can forge files every \
         node accepts"
    ))
}

#[cfg(test)]
mod tests;
