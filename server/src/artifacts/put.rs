//! PutArtifact: a blob streamed in, hashed as it is written to a temporary file, and renamed
//! under its digest only once its bytes hash to the announced digest and add up to the
//! announced size. Nothing of a refused upload stays, on disk or in the index.

use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::Status;
use tunecache_proto::artifact::{self, CHUNK_BYTES};
use tunecache_proto::v1;

use super::index::{Admit, Refusal};
use super::{add, disk, Artifacts};
use crate::error::Error;
use crate::model::validate::InvalidField;

/// An upload's reservation in the index, released however the upload ends.
struct Reservation<'a> {
    artifacts: &'a Artifacts,
    uid: u32,
    size: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.artifacts.index).release(self.uid, self.size);
    }
}

impl Artifacts {
    /// Stores the blob `chunks` carry for `uid`. A blob already held is answered
    /// `already_held` from the first chunk, without reading the rest.
    pub async fn put(
        self: &Arc<Self>,
        uid: u32,
        mut chunks: impl Stream<Item = Result<v1::ArtifactChunk, Status>> + Unpin,
    ) -> Result<v1::PutArtifactResponse, Status> {
        let outcome = self.put_inner(uid, &mut chunks).await;
        if outcome.is_err() {
            add(&self.counters.uploads_refused, 1);
        }
        outcome
    }

    async fn put_inner(
        self: &Arc<Self>,
        uid: u32,
        chunks: &mut (impl Stream<Item = Result<v1::ArtifactChunk, Status>> + Unpin),
    ) -> Result<v1::PutArtifactResponse, Status> {
        let Some(first) = chunks.next().await.transpose()? else {
            return Err(InvalidField::new("sha256", "the stream held no chunk").into());
        };
        let digest = first.sha256;
        artifact::check_digest(&digest)
            .map_err(|refusal| InvalidField::new("sha256", refusal.to_string()))?;
        let size = first.size;
        let now = self.now_ms();
        if let Some(blob) = crate::sync::lock(&self.index).blob(&digest) {
            // Same digest, same bytes: the size must agree, or the caller is confused.
            if blob.size != size {
                return Err(InvalidField::new(
                    "size",
                    format!("{size}, but blob {digest} is {} bytes", blob.size),
                )
                .into());
            }
            add(&self.counters.uploads_already_held, 1);
            return Ok(v1::PutArtifactResponse { already_held: true });
        }
        let _reservation = self.reserve(uid, size, now).await?;
        let dir = self.dir.clone();
        let mut partial = Self::blocking("creating a blob", move || dir.partial()).await?;
        let mut data = first.data;
        let mut index = 0usize;
        loop {
            if data.len() > CHUNK_BYTES {
                return Err(InvalidField::new(
                    format!("chunks[{index}].data"),
                    format!("{} bytes, at most {CHUNK_BYTES} per chunk", data.len()),
                )
                .into());
            }
            if partial.written + data.len() as u64 > size {
                return Err(InvalidField::new(
                    "size",
                    format!(
                        "the stream carries more than the {size} bytes announced (chunk {index})"
                    ),
                )
                .into());
            }
            if !data.is_empty() {
                partial = Self::blocking("writing a blob", move || {
                    partial.write(&data)?;
                    Ok(partial)
                })
                .await?;
            }
            let Some(next) = chunks.next().await.transpose()? else {
                break;
            };
            data = next.data;
            index += 1;
        }
        if partial.written != size {
            return Err(InvalidField::new(
                "size",
                format!(
                    "a short stream: {} of the {size} bytes announced",
                    partial.written
                ),
            )
            .into());
        }
        let received = partial.digest();
        if received != digest {
            add(&self.counters.digest_failures, 1);
            return Err(InvalidField::new(
                "sha256",
                format!("the content's digest is {received}, not the {digest} announced"),
            )
            .into());
        }
        if crate::sync::lock(&self.index).is_deleting(&digest) {
            return Err(Error::ArtifactUnavailable {
                digest,
                reason: "an older copy is being removed; upload it again".into(),
            }
            .into());
        }
        let (dir, name) = (self.dir.clone(), digest.clone());
        Self::blocking("storing a blob", move || partial.finish(&dir, &name)).await?;
        if crate::sync::lock(&self.index).insert(digest, size, Some(uid), self.now_ms()) {
            add(&self.counters.uploads, 1);
            Ok(v1::PutArtifactResponse {
                already_held: false,
            })
        } else {
            // Another upload of the same bytes finished first.
            add(&self.counters.uploads_already_held, 1);
            Ok(v1::PutArtifactResponse { already_held: true })
        }
    }

    /// Reserves room for an upload, collecting unreferenced blobs past their grace period
    /// first if that makes it fit; refuses it, naming the flag, if nothing does.
    async fn reserve(&self, uid: u32, size: u64, now: u64) -> Result<Reservation<'_>, Error> {
        for _ in 0..4 {
            let decision = crate::sync::lock(&self.index).admit(uid, size, now);
            match decision {
                Admit::Reserved => {
                    return Ok(Reservation {
                        artifacts: self,
                        uid,
                        size,
                    })
                }
                Admit::CollectFirst(digests) => self.collect(digests).await,
                Admit::Refused(refusal) => return Err(self.refused(uid, refusal)),
            }
        }
        Err(Error::ArtifactLimit {
            flag: "--artifact-store-mib",
            limit: crate::sync::lock(&self.index).limits().store_bytes,
            message: format!("{size} bytes do not fit: the store kept filling while collecting"),
        })
    }

    fn refused(&self, uid: u32, refusal: Refusal) -> Error {
        let (counter, flag, limit, message) = match refusal {
            Refusal::BlobTooLarge { size, limit } => (
                &self.counters.bytes_over_blob_limit,
                "--max-artifact-bytes",
                limit,
                format!("a blob of {size} bytes is over the largest this node stores"),
            ),
            Refusal::StoreFull { size, held, limit } => (
                &self.counters.bytes_over_store_limit,
                "--artifact-store-mib",
                limit,
                format!(
                    "{size} more bytes do not fit in the artifact store, which holds {held} \
                     bytes that live entries name or that are within their grace period"
                ),
            ),
            Refusal::UidUnreferenced {
                uid,
                size,
                held,
                limit,
            } => (
                &self.counters.bytes_over_uid_limit,
                "--artifact-unreferenced-mib-per-uid",
                limit,
                format!(
                    "uid {uid} has {held} bytes of uploads no entry names yet; {size} more \
                     would pass its bound (Record the entries that name them first)"
                ),
            ),
        };
        add(
            counter,
            match refusal {
                Refusal::BlobTooLarge { size, .. }
                | Refusal::StoreFull { size, .. }
                | Refusal::UidUnreferenced { size, .. } => size,
            },
        );
        if self.logged.first(format!("{flag} {uid}")) {
            tracing::warn!(
                uid,
                flag,
                limit,
                "refused an upload over {flag}: {message} (logged once per uid and limit; \
                 Stats counts the bytes refused)"
            );
        }
        Error::ArtifactLimit {
            flag,
            limit,
            message,
        }
    }

    /// Deletes blobs collection chose (unreferenced, past their grace period).
    pub(super) async fn collect(&self, digests: Vec<String>) {
        let now = self.now_ms();
        let mut gone = Vec::new();
        {
            let mut index = crate::sync::lock(&self.index);
            // Still collectable now (a Record may have named one since).
            let collectable: std::collections::HashSet<String> =
                index.collectable(now).into_iter().collect();
            for digest in digests {
                if collectable.contains(&digest) && index.begin_delete(&digest).is_some() {
                    gone.push(digest);
                }
            }
        }
        if gone.is_empty() {
            return;
        }
        add(&self.counters.collections, gone.len() as u64);
        tracing::info!(blobs = gone.len(), "collected unreferenced artifact blobs");
        let dir: disk::BlobDir = self.dir.clone();
        let removing = gone.clone();
        let removed = Self::blocking("collecting blobs", move || {
            for digest in &removing {
                dir.remove(digest)?;
            }
            Ok(())
        })
        .await;
        // A removal that failed or hung leaves the names marked: no upload renames over a
        // file that may still be removed.
        if removed.is_ok() {
            let mut index = crate::sync::lock(&self.index);
            for digest in &gone {
                index.deleted(digest);
            }
        }
    }
}
