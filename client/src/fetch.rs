//! Owns getting blobs from the daemon into the caller's hands (the uploads are
//! `crate::artifacts`):
//!
//! * [`Client::fetch_artifacts`] writes the files an entry names into a directory, each hashed
//!   as it is written to a temporary file in that directory and renamed to its name only when
//!   its bytes hash to the digest the entry names; a mismatch is refused and the temporary
//!   file deleted. Every name is checked again with [`check_name`] (the daemon checked it when
//!   it was recorded), so a daemon that sent a hostile name cannot write outside the directory.
//! * [`Client::get_artifact`] streams one blob into any writer, verifying it at the end.
//!
//! Each blob is first asked for on the descriptor handoff (`crate::handed`, on the one
//! connection the process keeps per socket), and streamed by GetArtifact otherwise; the
//! GetArtifact stream is received by one loop ([`Client::receive_blob`]) into either a writer
//! or a file ([`BlobSink`]). Every file operation runs on tokio's blocking pool.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tunecache_proto::artifact::{check_digest, check_name};
use tunecache_proto::v1;

use crate::artifacts::{blocking, hex, io_error, DEFAULT_ARTIFACT_TIMEOUT};
use crate::handed::{copied_whole, copy_to_file, copy_to_writer, hand_over, FileCopy};
use crate::{Client, ClientError, Result};

/// Where a GetArtifact stream's bytes go, each chunk hashed on its way there.
trait BlobSink {
    /// Writes `data`, adding it to `hasher`; answers the hasher back.
    async fn take(&mut self, data: Bytes, hasher: Sha256) -> Result<Sha256>;
    /// Everything arrived: flushed (a writer) or synced (a file, so that after a crash its
    /// name holds the whole blob or the previous file, never a torn one).
    async fn finish(&mut self) -> Result<()>;
}

/// Any writer: hashed and written on the runtime, as the writer is async.
struct WriterSink<'a, W> {
    writer: &'a mut W,
    what: String,
}

impl<W: AsyncWrite + Unpin> BlobSink for WriterSink<'_, W> {
    async fn take(&mut self, data: Bytes, mut hasher: Sha256) -> Result<Sha256> {
        hasher.update(&data);
        self.writer
            .write_all(&data)
            .await
            .map_err(io_error(self.what.clone()))?;
        Ok(hasher)
    }

    async fn finish(&mut self) -> Result<()> {
        self.writer
            .flush()
            .await
            .map_err(io_error(self.what.clone()))
    }
}

/// A file: hashed and written on the blocking pool, so the runtime thread never waits on a
/// disk. `None` only while a chunk is being written.
struct FileSink {
    file: Option<std::fs::File>,
    what: String,
}

impl FileSink {
    fn file_gone(&self) -> ClientError {
        ClientError::Artifact(format!("{}: the file was lost mid-write", self.what))
    }
}

impl BlobSink for FileSink {
    async fn take(&mut self, data: Bytes, mut hasher: Sha256) -> Result<Sha256> {
        let mut file = self.file.take().ok_or_else(|| self.file_gone())?;
        let (file, hasher) = blocking(&self.what, move || {
            hasher.update(&data);
            file.write_all(&data)?;
            Ok((file, hasher))
        })
        .await?;
        self.file = Some(file);
        Ok(hasher)
    }

    async fn finish(&mut self) -> Result<()> {
        let file = self.file.take().ok_or_else(|| self.file_gone())?;
        let synced = blocking(&self.what, move || file.sync_all().map(|()| file)).await?;
        self.file = Some(synced);
        Ok(())
    }
}

/// How long one blob's fetch may take: the tiers' wait, then the transfer.
fn fetch_limit() -> Duration {
    Duration::from_millis(u64::from(tunecache_proto::artifact::DEFAULT_WAIT_MS))
        + DEFAULT_ARTIFACT_TIMEOUT
}

/// Checks a GetArtifact stream as it arrives: its first chunk's digest and size must be the
/// ones asked for, and no more bytes may come than that size.
struct Expected {
    sha256: String,
    size: Option<u64>,
    received: u64,
    first: bool,
}

impl Expected {
    fn new(sha256: &str, size: Option<u64>) -> Expected {
        Expected {
            sha256: sha256.to_owned(),
            size,
            received: 0,
            first: true,
        }
    }

    fn chunk(&mut self, chunk: &v1::ArtifactChunk) -> Result<()> {
        if self.first {
            self.first = false;
            if chunk.sha256 != self.sha256 {
                return Err(ClientError::Artifact(format!(
                    "asked for blob {}, the daemon announced {:?}",
                    self.sha256, chunk.sha256
                )));
            }
            match self.size {
                Some(size) if size != chunk.size => {
                    return Err(ClientError::Artifact(format!(
                        "blob {} is named with {size} bytes, the daemon announced {}",
                        self.sha256, chunk.size
                    )))
                }
                _ => self.size = Some(chunk.size),
            }
        }
        self.received += chunk.data.len() as u64;
        let size = self.size.unwrap_or(0);
        if self.received > size {
            return Err(ClientError::Artifact(format!(
                "blob {}: the daemon sent more than its {size} bytes",
                self.sha256
            )));
        }
        Ok(())
    }

    /// The whole blob arrived: its length and digest are the ones asked for.
    fn finish(&self, received_digest: &str) -> Result<u64> {
        let size = self.size.unwrap_or(0);
        if self.first || self.received != size {
            return Err(ClientError::Artifact(format!(
                "blob {}: a short stream, {} of {size} bytes",
                self.sha256, self.received
            )));
        }
        if received_digest != self.sha256 {
            return Err(ClientError::Artifact(format!(
                "blob {}: the bytes received hash to {received_digest}; refused",
                self.sha256
            )));
        }
        Ok(size)
    }
}

/// A temporary file in the destination directory, removed unless it was renamed to its name:
/// on a refusal explicitly (on the blocking pool), on a cancelled fetch when dropped.
struct Partial {
    path: Option<PathBuf>,
}

impl Partial {
    fn disarm(&mut self) -> Option<PathBuf> {
        self.path.take()
    }

    async fn remove(mut self) {
        if let Some(path) = self.disarm() {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A temporary name beside `name` in `dir`, hidden and unique to this process and call.
fn partial_path(dir: &Path, name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        ".{name}.{}-{n}.tunecache-partial",
        std::process::id()
    ))
}

fn past_its_deadline(what: &str) -> ClientError {
    ClientError::Rpc(tonic::Status::deadline_exceeded(format!(
        "{what} took longer than its deadline"
    )))
}

impl Client {
    /// Asks the descriptor handoff for blob `sha256` (of `size` bytes, when named), when this
    /// client has the socket: the file and its size if the daemon handed it.
    async fn handed(&self, sha256: &str, size: Option<u64>) -> Option<(std::fs::File, u64)> {
        let path = self.handoff.as_ref()?;
        hand_over(path, self.timeout, sha256, size).await
    }

    async fn open_blob(&self, sha256: &str) -> Result<tonic::codec::Streaming<v1::ArtifactChunk>> {
        check_digest(sha256)
            .map_err(|refusal| ClientError::Artifact(format!("digest {sha256:?}: {refusal}")))?;
        let wait_ms = tunecache_proto::artifact::DEFAULT_WAIT_MS;
        let message = v1::GetArtifactRequest {
            sha256: sha256.to_owned(),
            wait_ms,
        };
        let deadline = Duration::from_millis(u64::from(wait_ms)) + DEFAULT_ARTIFACT_TIMEOUT;
        let answer = crate::opening::call(message, deadline, |request| {
            let mut inner = self.inner.clone();
            async move { inner.get_artifact(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Streams blob `sha256` (GetArtifact, `size` bytes when named) into `sink`, checking the
    /// stream as it comes and the digest at its end; answers its size.
    async fn receive_blob(
        &self,
        sha256: &str,
        size: Option<u64>,
        sink: &mut impl BlobSink,
    ) -> Result<u64> {
        let mut stream = self.open_blob(sha256).await?;
        let mut expected = Expected::new(sha256, size);
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream.message().await? {
            expected.chunk(&chunk)?;
            hasher = sink.take(chunk.data, hasher).await?;
        }
        sink.finish().await?;
        expected.finish(&hex(&hasher.finalize()))
    }

    /// Streams blob `sha256` (GetArtifact) into `writer` and answers its size. The bytes are
    /// verified only once all arrived: on an error `writer` may hold part of them, or bytes
    /// that do not hash to the digest, and the caller discards them ([`Client::fetch_artifacts`]
    /// does that for files).
    pub async fn get_artifact<W>(&self, sha256: &str, writer: &mut W) -> Result<u64>
    where
        W: AsyncWrite + Unpin,
    {
        let copy = async {
            if let Some((file, size)) = self.handed(sha256, None).await {
                let verify = self.verify_handoffs;
                return copy_to_writer(file, size, sha256, verify, writer).await;
            }
            let what = format!("writing blob {sha256}");
            let mut sink = WriterSink { writer, what };
            self.receive_blob(sha256, None, &mut sink).await
        };
        tokio::time::timeout(fetch_limit(), copy)
            .await
            .unwrap_or_else(|_| Err(past_its_deadline("GetArtifact")))
    }

    /// Writes each file the entry's result names (`result.artifacts`) into `dir`, as
    /// `dir/<name>`, and answers their paths in the entry's order. See
    /// [`Client::fetch_artifact_list`].
    pub async fn fetch_artifacts(
        &self,
        entry: &v1::Entry,
        dir: impl AsRef<Path>,
    ) -> Result<Vec<PathBuf>> {
        let artifacts = entry
            .result
            .as_ref()
            .map(|result| result.artifacts.as_slice())
            .unwrap_or_default();
        self.fetch_artifact_list(artifacts, dir).await
    }

    /// Writes each of `artifacts` into `dir` (which must exist) as `dir/<name>`: streamed into a
    /// temporary file beside it, hashed as it is written, synced and renamed over `dir/<name>`
    /// only when its bytes hash to the digest and add up to the size named. A mismatch is
    /// refused (`ClientError::Artifact`) and its temporary file deleted; the files fetched
    /// before it stay. Every name is checked with [`check_name`] first, and a repeated one is
    /// refused, so nothing is written anywhere but `dir`.
    pub async fn fetch_artifact_list(
        &self,
        artifacts: &[v1::Artifact],
        dir: impl AsRef<Path>,
    ) -> Result<Vec<PathBuf>> {
        let dir = dir.as_ref();
        let mut names = HashSet::new();
        for artifact in artifacts {
            let name = &artifact.name;
            check_name(name)
                .map_err(|refusal| ClientError::Artifact(format!("name {name:?}: {refusal}")))?;
            check_digest(&artifact.sha256).map_err(|refusal| {
                ClientError::Artifact(format!("{name}: digest {:?}: {refusal}", artifact.sha256))
            })?;
            if !names.insert(name.as_str()) {
                return Err(ClientError::Artifact(format!(
                    "name {name:?} is named twice"
                )));
            }
        }
        let mut written = Vec::with_capacity(artifacts.len());
        for artifact in artifacts {
            written.push(self.fetch_one(artifact, dir).await?);
        }
        Ok(written)
    }

    async fn fetch_one(&self, artifact: &v1::Artifact, dir: &Path) -> Result<PathBuf> {
        let target = dir.join(&artifact.name);
        let path = partial_path(dir, &artifact.name);
        let what = format!("writing {}", target.display());
        let created = {
            let path = path.clone();
            blocking(&what, move || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
            })
            .await?
        };
        let mut partial = Partial { path: Some(path) };
        let handed = self.handed(&artifact.sha256, Some(artifact.size)).await;
        let receive = async {
            let mut created = created;
            if let Some((file, size)) = handed {
                let (sha256, verify) = (artifact.sha256.clone(), self.verify_handoffs);
                let copy = move || copy_to_file(file, created, &sha256, verify);
                match blocking(&what, copy).await? {
                    FileCopy::Synced { copied } => {
                        return copied_whole(&artifact.sha256, copied, size).map(drop)
                    }
                    // Changed under the copy: streamed instead, into the emptied file.
                    FileCopy::Changed { file } => created = file,
                }
            }
            let mut sink = FileSink {
                file: Some(created),
                what: what.clone(),
            };
            self.receive_blob(&artifact.sha256, Some(artifact.size), &mut sink)
                .await
                .map(drop)
        };
        let received = tokio::time::timeout(fetch_limit(), receive)
            .await
            .unwrap_or_else(|_| Err(past_its_deadline("GetArtifact")));
        if let Err(error) = received {
            partial.remove().await;
            return Err(error);
        }
        let Some(from) = partial.disarm() else {
            return Err(ClientError::Artifact(
                "the temporary file is gone".to_owned(),
            ));
        };
        let to = target.clone();
        let renamed = blocking(&what, {
            let from = from.clone();
            move || std::fs::rename(from, to)
        })
        .await;
        if let Err(error) = renamed {
            Partial { path: Some(from) }.remove().await;
            return Err(error);
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(sha256: &str, size: u64, data: &[u8]) -> v1::ArtifactChunk {
        v1::ArtifactChunk {
            sha256: sha256.to_owned(),
            size,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn a_received_blob_must_be_the_one_named() {
        let digest = crate::artifacts::hash_all(&mut &b"hello\n"[..], None)
            .unwrap()
            .0;
        let mut good = Expected::new(&digest, Some(6));
        good.chunk(&chunk(&digest, 6, b"hel")).unwrap();
        good.chunk(&chunk("", 0, b"lo\n")).unwrap();
        assert_eq!(good.finish(&digest).unwrap(), 6);

        // Another digest announced, another size, too many bytes, too few, wrong bytes.
        let other = "0".repeat(64);
        assert!(Expected::new(&digest, Some(6))
            .chunk(&chunk(&other, 6, b""))
            .is_err());
        assert!(Expected::new(&digest, Some(6))
            .chunk(&chunk(&digest, 7, b""))
            .is_err());
        let mut long = Expected::new(&digest, Some(6));
        assert!(long.chunk(&chunk(&digest, 6, b"hello\n!")).is_err());
        let mut short = Expected::new(&digest, Some(6));
        short.chunk(&chunk(&digest, 6, b"hello")).unwrap();
        assert!(short.finish(&digest).is_err());
        let mut wrong = Expected::new(&digest, Some(6));
        wrong.chunk(&chunk(&digest, 6, b"HELLO\n")).unwrap();
        let wrong_digest = crate::artifacts::hash_all(&mut &b"HELLO\n"[..], None)
            .unwrap()
            .0;
        assert!(wrong.finish(&wrong_digest).is_err());
        // No chunk at all is a short stream, even of an empty blob.
        assert!(Expected::new(&digest, Some(0)).finish(&digest).is_err());
    }
}
