//! The error every call of this client answers, and the crate's `Result`.

use std::path::PathBuf;

use crate::{autostart, UntrustedSocket, TRUST_UID_ENV};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach tunecached at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{} ({:?})", .0.message(), .0.code())]
    Rpc(tonic::Status),
    #[error("auto-start: {0}")]
    Autostart(#[from] autostart::AutostartError),
    /// The default socket location is not private to the caller (see
    /// [`socket_path`](crate::socket_path)).
    #[error(transparent)]
    UntrustedSocket(#[from] UntrustedSocket),
    /// The daemon answering on the socket runs as a uid the caller does not trust.
    #[error(
        "refusing the daemon at {}: it runs as uid {uid}, not as this user ({me}) or root; \
         another user may have put it there. To trust that uid (e.g. the system unit's \
         `tunecache` user), set {TRUST_UID_ENV}={uid}",
        path.display()
    )]
    UntrustedDaemon { path: PathBuf, uid: u32, me: u32 },
    /// A local file operation of an artifact's upload or fetch failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An artifact refused by this client: a name or digest the contract does not allow
    /// (`tunecache_proto::artifact`), or bytes the daemon sent that are not the blob named.
    #[error("artifact refused: {0}")]
    Artifact(String),
    /// `TUNECACHE_MODE`, or the mode asked for, is neither `tune` nor `replay`.
    #[error(transparent)]
    Mode(#[from] crate::mode::UnknownMode),
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Rpc(status)
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
