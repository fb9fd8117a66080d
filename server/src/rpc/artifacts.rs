//! The artifact store over gRPC: its chunks and answers as the `tunecache.v1` messages
//! (GetArtifact's stream out, PutArtifact's stream in), and the one place the store's answers
//! (`artifacts::ArtifactError`) become statuses, with the details clients read.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::Status;
use tunecache_proto::v1;

use crate::artifacts::{ArtifactError, Artifacts, Chunk};

/// GetArtifact's answer stream.
pub type ArtifactStream = Pin<Box<dyn Stream<Item = Result<v1::ArtifactChunk, Status>> + Send>>;

/// GetArtifact: the store's stream of blob `request.sha256`, as chunk messages.
pub async fn get(
    artifacts: &Arc<Artifacts>,
    request: v1::GetArtifactRequest,
) -> Result<ArtifactStream, Status> {
    let chunks = artifacts.get(request.sha256, request.wait_ms).await?;
    Ok(Box::pin(chunks.map(|chunk| {
        chunk.map(chunk_message).map_err(Status::from)
    })))
}

/// PutArtifact: the caller's chunk messages into the store. A stream that fails (its
/// connection, or a message the request limits refuse) ends the upload with its own status.
pub async fn put(
    artifacts: &Arc<Artifacts>,
    uid: u32,
    chunks: impl Stream<Item = Result<v1::ArtifactChunk, Status>> + Unpin,
) -> Result<v1::PutArtifactResponse, Status> {
    let chunks = chunks.map(|message| {
        message.map(|message| Chunk {
            sha256: message.sha256,
            size: message.size,
            data: message.data,
        })
    });
    let stored = artifacts.put::<Status>(uid, chunks).await?;
    Ok(v1::PutArtifactResponse {
        already_held: stored.already_held,
    })
}

fn chunk_message(chunk: Chunk) -> v1::ArtifactChunk {
    v1::ArtifactChunk {
        sha256: chunk.sha256,
        size: chunk.size,
        data: chunk.data,
    }
}

impl From<ArtifactError> for Status {
    /// A refused field travels as `google.rpc.BadRequest` (as every refused field does); a
    /// limit with a `google.rpc.ErrorInfo` (reason `ARTIFACT_LIMIT`, the flag and the limit)
    /// and a `google.rpc.QuotaFailure` whose subject is the flag; a Record naming a blob not
    /// held with a `google.rpc.PreconditionFailure` (`ARTIFACT_NOT_HELD`, the digest).
    fn from(error: ArtifactError) -> Self {
        use tonic::Code;
        use tonic_types::{ErrorDetails, StatusExt};
        let message = error.to_string();
        match error {
            ArtifactError::Invalid(field) => crate::error::Error::InvalidField(field).into(),
            ArtifactError::Daemon(error) => error.into(),
            ArtifactError::Limit { flag, limit, .. } => {
                let metadata = std::collections::HashMap::from([
                    (
                        tunecache_proto::limits::FLAG_KEY.to_owned(),
                        flag.to_owned(),
                    ),
                    (
                        tunecache_proto::limits::LIMIT_BYTES_KEY.to_owned(),
                        limit.to_string(),
                    ),
                ]);
                let mut details = ErrorDetails::with_error_info(
                    tunecache_proto::artifact::LIMIT_REASON,
                    tunecache_proto::limits::ERROR_DOMAIN,
                    metadata,
                );
                details.add_quota_failure_violation(flag, message.clone());
                Status::with_error_details(Code::ResourceExhausted, message, details)
            }
            ArtifactError::NotHeld { path, digest } => {
                let mut details = ErrorDetails::new();
                details.add_precondition_failure_violation(
                    "ARTIFACT_NOT_HELD",
                    digest,
                    format!("{path} names a blob this node does not hold"),
                );
                Status::with_error_details(Code::FailedPrecondition, message, details)
            }
            ArtifactError::NotFound { .. } => Status::new(Code::NotFound, message),
            ArtifactError::Unavailable { .. } => Status::new(Code::Unavailable, message),
            ArtifactError::Corrupt { .. } => Status::new(Code::DataLoss, message),
        }
    }
}
