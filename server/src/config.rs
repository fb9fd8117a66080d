//! Command-line flags of `tunecached`. Every flag has a `TUNECACHE_*` environment twin so a
//! launcher can configure the daemon without building a command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::journal::FsyncPolicy;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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

    /// This node's name in snapshots and `tuned_by` [default: the hostname]
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

    /// fsync each snapshot file and the shared directory before and after the rename. Off
    /// by default: a snapshot needs an atomic replacement, not durability (each node's
    /// journal is the durable copy), and fsync on a shared filesystem can take minutes.
    #[arg(long, env = "TUNECACHE_SNAPSHOT_FSYNC")]
    pub snapshot_fsync: bool,
}

impl Config {
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(tunecache_proto::socket_path::fallback_socket_path)
    }

    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
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

    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "localhost".to_owned())
        })
    }

    pub fn snapshot_interval(&self) -> Duration {
        Duration::from_secs(self.snapshot_interval.max(1))
    }
}
