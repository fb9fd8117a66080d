//! Storing an upload (PutArtifact's, mapped from its messages in `rpc::artifacts`): a blob
//! streamed in, hashed as it is written to a temporary file, and renamed
//! under its digest only once its bytes hash to the announced digest and add up to the
//! announced size. Nothing of a refused upload stays, on disk or in the index.

use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tunecache_proto::artifact::{self, CHUNK_BYTES};

use super::index::{Admit, Refusal};
use super::ArtifactError;
use super::{add, disk, Artifacts, Chunk};
use crate::model::validate::InvalidField;

/// An upload's or a fetch's reservation in the index, released however it ends.
pub(super) struct Reservation<'a> {
    artifacts: &'a Artifacts,
    /// The uploader; `None` for a fetch from the tiers.
    uploader: Option<u32>,
    size: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut index = crate::sync::lock(&self.artifacts.index);
        match self.uploader {
            Some(uid) => index.release(uid, self.size),
            None => index.release_fetch(self.size),
        }
    }
}

/// What an upload stored.
pub struct Stored {
    /// The node held these bytes already (nothing but the first chunk was read).
    pub already_held: bool,
}

impl Artifacts {
    /// Stores the blob `chunks` carry for `uid`. A blob already held is answered
    /// `already_held` from the first chunk, without reading the rest. The stream's own errors
    /// (`E`: its transport's) end the upload as they are; the store's answers become `E`.
    pub async fn put<E: From<ArtifactError>>(
        self: &Arc<Self>,
        uid: u32,
        mut chunks: impl Stream<Item = Result<Chunk, E>> + Unpin,
    ) -> Result<Stored, E> {
        let outcome = self.put_inner(uid, &mut chunks).await;
        if outcome.is_err() {
            add(&self.counters.uploads_refused, 1);
        }
        outcome
    }

    async fn put_inner<E: From<ArtifactError>>(
        self: &Arc<Self>,
        uid: u32,
        chunks: &mut (impl Stream<Item = Result<Chunk, E>> + Unpin),
    ) -> Result<Stored, E> {
        let Some(first) = chunks.next().await.transpose()? else {
            return Err(refused(InvalidField::new(
                "sha256",
                "the stream held no chunk",
            )));
        };
        let digest = first.sha256;
        artifact::check_digest(&digest).map_err(|refusal| {
            ArtifactError::from(InvalidField::new("sha256", refusal.to_string()))
        })?;
        let size = first.size;
        if let Some(blob) = crate::sync::lock(&self.index).blob(&digest) {
            // Same digest, same bytes: the size must agree, or the caller is confused.
            if blob.size != size {
                return Err(refused(InvalidField::new(
                    "size",
                    format!("{size}, but blob {digest} is {} bytes", blob.size),
                )));
            }
            add(&self.counters.uploads_already_held, 1);
            return Ok(Stored { already_held: true });
        }
        let _reservation = self
            .reserve(Some(uid), &digest, size)
            .await
            .map_err(refusal_error)?;
        let dir = self.dir.clone();
        let mut partial = Self::blocking("creating a blob", move || dir.partial())
            .await
            .map_err(E::from)?;
        let mut data = first.data;
        let mut index = 0usize;
        loop {
            if data.len() > CHUNK_BYTES {
                return Err(refused(InvalidField::new(
                    format!("chunks[{index}].data"),
                    format!("{} bytes, at most {CHUNK_BYTES} per chunk", data.len()),
                )));
            }
            if partial.written + data.len() as u64 > size {
                return Err(refused(InvalidField::new(
                    "size",
                    format!(
                        "the stream carries more than the {size} bytes announced (chunk {index})"
                    ),
                )));
            }
            if !data.is_empty() {
                partial = Self::blocking("writing a blob", move || {
                    partial.write(&data)?;
                    Ok(partial)
                })
                .await
                .map_err(E::from)?;
            }
            let Some(next) = chunks.next().await.transpose()? else {
                break;
            };
            data = next.data;
            index += 1;
        }
        if partial.written != size {
            return Err(refused(InvalidField::new(
                "size",
                format!(
                    "a short stream: {} of the {size} bytes announced",
                    partial.written
                ),
            )));
        }
        let received = partial.digest();
        if received != digest {
            add(&self.counters.digest_failures, 1);
            return Err(refused(InvalidField::new(
                "sha256",
                format!("the content's digest is {received}, not the {digest} announced"),
            )));
        }
        if crate::sync::lock(&self.index).is_deleting(&digest) {
            return Err(ArtifactError::Unavailable {
                digest,
                reason: "an older copy is being removed; upload it again".into(),
            }
            .into());
        }
        let (dir, name) = (self.dir.clone(), digest.clone());
        Self::blocking("storing a blob", move || partial.finish(&dir, &name))
            .await
            .map_err(E::from)?;
        if crate::sync::lock(&self.index).insert(digest, size, Some(uid), self.now_ms()) {
            add(&self.counters.uploads, 1);
            Ok(Stored {
                already_held: false,
            })
        } else {
            // Another upload of the same bytes finished first.
            add(&self.counters.uploads_already_held, 1);
            Ok(Stored { already_held: true })
        }
    }

    /// Reserves room for an upload of blob `digest` by `uploader` (`None`: a fetch from the
    /// tiers, held to the store's bound alone), collecting unreferenced blobs past their grace
    /// period first if that makes it fit; refuses it, counted and logged, if nothing does.
    pub(super) async fn reserve(
        &self,
        uploader: Option<u32>,
        digest: &str,
        size: u64,
    ) -> Result<Reservation<'_>, Refusal> {
        for _ in 0..4 {
            let now = self.now_ms();
            let decision = {
                let mut index = crate::sync::lock(&self.index);
                match uploader {
                    Some(uid) => index.admit(uid, digest, size, now),
                    None => index.admit_fetch(size, now),
                }
            };
            match decision {
                Admit::Reserved => {
                    return Ok(Reservation {
                        artifacts: self,
                        uploader,
                        size,
                    })
                }
                Admit::CollectFirst(digests) => self.collect(digests).await,
                Admit::Refused(refusal) => {
                    self.count_refusal(uploader, refusal);
                    return Err(refusal);
                }
            }
        }
        // The store kept filling while collecting.
        let refusal = {
            let index = crate::sync::lock(&self.index);
            Refusal::StoreFull {
                size,
                held: index.held_bytes(),
                limit: index.limits().store_bytes,
            }
        };
        self.count_refusal(uploader, refusal);
        Err(refusal)
    }

    /// Counts a refusal, and logs it once per uploader (or once for the tiers) and limit.
    fn count_refusal(&self, uploader: Option<u32>, refusal: Refusal) {
        let (flag, limit, message) = refusal_text(refusal);
        let c = &self.counters;
        let (counter, n) = match (uploader, refusal) {
            (None, _) => (&c.fetches_over_store_limit, 1),
            (Some(_), Refusal::BlobTooLarge { .. }) => (&c.bytes_over_blob_limit, refusal.size()),
            (Some(_), Refusal::StoreFull { .. }) => (&c.bytes_over_store_limit, refusal.size()),
            (Some(_), Refusal::UidUnreferenced { .. }) => (&c.bytes_over_uid_limit, refusal.size()),
            (Some(_), Refusal::UidShare { .. }) => (&c.bytes_over_uid_share, refusal.size()),
        };
        add(counter, n);
        let who = uploader.map_or_else(|| "tiers".to_owned(), |uid| uid.to_string());
        if !self.logged.first(format!("{flag} {who}")) {
            return;
        }
        match uploader {
            Some(uid) => tracing::warn!(
                uid,
                flag,
                limit,
                "refused an upload over {flag}: {message} (logged once per uid and limit; \
                 Stats counts the bytes refused)"
            ),
            None => tracing::warn!(
                flag,
                limit,
                "refused a fetch from the tiers over {flag}: {message} (logged once; Stats \
                 counts artifact_fetches_over_store_limit)"
            ),
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

/// A refused field, as the upload's error.
fn refused<E: From<ArtifactError>>(field: InvalidField) -> E {
    ArtifactError::from(field).into()
}

/// The flag a refusal names, its limit and what the caller is told.
fn refusal_text(refusal: Refusal) -> (&'static str, u64, String) {
    match refusal {
        Refusal::BlobTooLarge { size, limit } => (
            "--max-artifact-bytes",
            limit,
            format!("a blob of {size} bytes is over the largest this node stores"),
        ),
        Refusal::StoreFull { size, held, limit } => (
            "--artifact-store-mib",
            limit,
            format!(
                "{size} more bytes do not fit in the artifact store, which holds {held} bytes \
                 that live entries name or that are within their grace period"
            ),
        ),
        Refusal::UidUnreferenced {
            uid,
            size,
            held,
            limit,
        } => (
            "--artifact-unreferenced-mib-per-uid",
            limit,
            format!(
                "uid {uid} has {held} bytes of uploads no entry names yet; {size} more would \
                 pass its bound (Record the entries that name them first)"
            ),
        ),
        Refusal::UidShare {
            uid,
            size,
            held,
            limit,
        } => (
            "--artifact-store-mib-per-uid",
            limit,
            format!(
                "uid {uid} holds {held} bytes in the artifact store (the blobs its live \
                 entries name and its uploads no entry names yet); {size} more would pass its \
                 share (Forget or beat its entries to free it)"
            ),
        ),
    }
}

/// The error a refusal answers: RESOURCE_EXHAUSTED naming the flag.
pub(super) fn refusal_error(refusal: Refusal) -> ArtifactError {
    let (flag, limit, message) = refusal_text(refusal);
    ArtifactError::Limit {
        flag,
        limit,
        message,
    }
}
