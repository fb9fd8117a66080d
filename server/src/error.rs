//! The daemon library's one error type. Binaries wrap it in `anyhow`; the gRPC layer maps
//! the variants a request can meet onto status codes.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("another tunecached is already serving on {}", .0.display())]
    AlreadyServing(PathBuf),

    #[error("{} exists and is not a socket; refusing to remove it", .0.display())]
    NotASocket(PathBuf),

    #[error("the journal writer has stopped")]
    WriterGone,

    #[error("journal write failed: {0}")]
    JournalWrite(String),

    #[error(
        "the journal writer's queue is full (--write-queue-mib {limit_mib}): the disk is \
         slower than the callers; retry later"
    )]
    WriteQueueFull { limit_mib: u64 },

    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),

    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),

    // Deployment: socket activation, socket group, metrics endpoint.
    #[error("socket activation: {0}")]
    InheritedSocket(String),

    /// The default socket location is not private (squatted directory, symlink).
    #[error(transparent)]
    UntrustedSocket(#[from] tunecache_proto::socket_path::UntrustedSocket),

    #[error("group {0:?} does not exist (--socket-group / --allow-gid)")]
    UnknownGroup(String),

    #[error("--metrics-addr {0:?}: expected PORT (loopback) or HOST:PORT")]
    BadMetricsAddr(String),

    #[error("cluster tier: {0}")]
    ClusterConfig(String),

    #[error("no shared directory: start the daemon with --shared-dir")]
    NoSharedDir,

    #[error("shared directory unavailable: {0}")]
    SharedDirUnavailable(String),

    #[error("shared directory stuck: {operation} has not returned since unix ms {since_unix_ms}")]
    SharedDirStuck {
        operation: &'static str,
        since_unix_ms: i64,
    },

    #[error("shared directory did not finish {operation} within {waited:?}")]
    SharedDirTimeout {
        operation: &'static str,
        waited: std::time::Duration,
    },

    #[error("node name {0:?} cannot name a snapshot file (empty, leading '.' or '/')")]
    InvalidNodeName(String),

    #[error("snapshot file skipped: {0}")]
    SnapshotFormat(String),
}

impl Error {
    /// Builds an `Io` error that names what was being done and to which path.
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::WriterGone => tonic::Status::unavailable(error.to_string()),
            Error::JournalWrite(_) => tonic::Status::unavailable(error.to_string()),
            Error::WriteQueueFull { .. } => tonic::Status::resource_exhausted(error.to_string()),
            Error::NoSharedDir => tonic::Status::failed_precondition(error.to_string()),
            Error::SharedDirUnavailable(_) | Error::SharedDirStuck { .. } => {
                tonic::Status::unavailable(error.to_string())
            }
            Error::SharedDirTimeout { .. } => tonic::Status::deadline_exceeded(error.to_string()),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
