//! The store's answers when it cannot do what was asked, as one typed enum: what a caller
//! asked wrongly, which limit refused it, why a blob cannot be had. The store speaks no
//! transport: the gRPC door maps each answer to a status, with its details, in one place
//! (`rpc::artifacts`); the descriptor handoff answers `not-held` or names it.

use crate::model::validate::InvalidField;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A field of the request (a digest, a size, a chunk) is not what the store takes.
    #[error(transparent)]
    Invalid(#[from] InvalidField),

    /// An upload, or a fetch from the tiers, over one of the store's limits; names the flag.
    #[error("{message} ({flag} {limit})")]
    Limit {
        flag: &'static str,
        limit: u64,
        message: String,
    },

    /// A Record names a blob this node cannot serve; nothing of the batch was applied.
    #[error("{path}: blob {digest} is not held on this node; PutArtifact it before the Record")]
    NotHeld { path: String, digest: String },

    /// This node cannot get the blob: no entry here names it, or no tier gave a copy that
    /// hashes to it (the reason says which, tier by tier).
    #[error("blob {digest}: {reason}")]
    NotFound { digest: String, reason: String },

    /// A tier below did not supply the blob within the caller's wait, or an older copy is
    /// still being removed.
    #[error("blob {digest}: {reason}")]
    Unavailable { digest: String, reason: String },

    /// A held blob's bytes did not hash to its digest while being served: dropped.
    #[error("blob {digest}: the bytes on this node do not hash to it; dropped, fetch it again")]
    Corrupt { digest: String },

    /// The disk (a blocking file operation failed or did not return in time), or the daemon
    /// stopping under a Record.
    #[error(transparent)]
    Daemon(#[from] crate::error::Error),
}
