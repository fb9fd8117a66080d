//! Owns putting artifacts (the files a tuner built for a result: a compiled kernel, a module)
//! into a rank's node's daemon, which holds each once under its SHA-256 digest:
//!
//! * [`Client::put_artifact`] (a path) and [`Client::put_artifact_reader`] (any reader) upload
//!   a file with PutArtifact. The digest is the first chunk's, so it is computed first: a path
//!   is hashed in a first pass and then streamed; a reader is copied into an unnamed temporary
//!   file while it is hashed, then streamed from there. [`Client::put_artifact_with_digest`]
//!   streams a reader whose digest and size the caller knows. Nothing holds more than one chunk
//!   ([`CHUNK_BYTES`]) of a file in memory.
//! * [`Client::put_artifacts`] uploads named files and answers the `Artifact`s a `Result` names
//!   them with: what the CLI's `put --artifact`, `tunecache.autotune(artifacts=...)` and a
//!   [`Client::get_or_tune`] tune closure use before they Record.
//! * [`Client::stat_artifacts`] answers which digests this node cannot serve; getting blobs
//!   back ([`Client::fetch_artifacts`], [`Client::get_artifact`]) is `crate::fetch`'s.
//!
//! The rules of a name, a digest and a chunk are `tunecache_proto::artifact`'s, the daemon's
//! own. Every file operation runs on tokio's blocking pool, so the runtime thread (in the
//! Python binding, the process's only one) never waits on a disk.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};
use tunecache_proto::artifact::{check_digest, check_name, CHUNK_BYTES, MAX_PER_RESULT};
use tunecache_proto::v1;

use crate::{Client, ClientError, Result};

/// Default deadline of one artifact's upload or download (after GetArtifact's `wait_ms` for
/// the tiers below): a blob is at most `--max-artifact-bytes` (256 MiB by default), which a
/// local socket moves in seconds; this bounds a daemon that stops sending.
pub const DEFAULT_ARTIFACT_TIMEOUT: Duration = Duration::from_secs(300);

/// A blob the daemon holds after [`Client::put_artifact`]: its digest and size, which a
/// `Result` names it by ([`StoredArtifact::named`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    pub size: u64,
    /// The node held these bytes already (nothing but the first chunk was read).
    pub already_held: bool,
}

impl StoredArtifact {
    /// The `Artifact` a `Result` names this blob with, as the file `name` (checked with
    /// [`check_name`]).
    pub fn named(&self, name: &str) -> Result<v1::Artifact> {
        check_name(name)
            .map_err(|refusal| ClientError::Artifact(format!("name {name:?}: {refusal}")))?;
        Ok(v1::Artifact {
            name: name.to_owned(),
            sha256: self.sha256.clone(),
            size: self.size,
        })
    }
}

/// Lowercase hex of a digest, the one spelling `check_digest` accepts.
pub(crate) fn hex(digest: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(digest.len() * 2);
    for byte in digest {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// An I/O error with what was being done.
pub(crate) fn io_error(what: String) -> impl FnOnce(std::io::Error) -> ClientError {
    move |source| ClientError::Io { what, source }
}

/// Runs blocking file work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(outcome) => outcome.map_err(io_error(what.to_owned())),
        Err(join) => Err(ClientError::Io {
            what: what.to_owned(),
            source: std::io::Error::other(join.to_string()),
        }),
    }
}

/// Reads up to `want` bytes, fewer only at the end of the file.
fn read_up_to(file: &mut impl Read, want: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; want];
    let mut filled = 0;
    while filled < want {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The digest and length of everything `file` reads, one chunk in memory at a time; with
/// `copy`, each chunk is also written there.
pub(crate) fn hash_all(
    file: &mut impl Read,
    mut copy: Option<&mut std::fs::File>,
) -> std::io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let chunk = read_up_to(file, CHUNK_BYTES)?;
        if chunk.is_empty() {
            return Ok((hex(&hasher.finalize()), size));
        }
        hasher.update(&chunk);
        size += chunk.len() as u64;
        if let Some(copy) = copy.as_deref_mut() {
            copy.write_all(&chunk)?;
        }
    }
}

/// The upload stream of `size` bytes read from `file`: the first chunk carries the digest and
/// the size, every chunk at most [`CHUNK_BYTES`]. A read that fails ends the stream early (the
/// daemon then refuses a short stream) and leaves its error in `failed`, which the caller
/// reports instead.
fn upload_chunks(
    sha256: String,
    size: u64,
    file: std::fs::File,
    failed: Arc<Mutex<Option<std::io::Error>>>,
) -> impl futures::Stream<Item = v1::ArtifactChunk> + Send + 'static {
    struct State {
        file: Option<std::fs::File>,
        sent: u64,
        first: Option<String>,
    }
    let state = State {
        file: Some(file),
        sent: 0,
        first: Some(sha256),
    };
    futures::stream::unfold(state, move |mut state| {
        let failed = Arc::clone(&failed);
        async move {
            // After the last chunk (or a failed read) the file is gone: the stream ends.
            let mut file = state.file.take()?;
            let want = (size - state.sent).min(CHUNK_BYTES as u64) as usize;
            let read = tokio::task::spawn_blocking(move || {
                read_up_to(&mut file, want).map(|chunk| (file, chunk))
            })
            .await
            .unwrap_or_else(|join| Err(std::io::Error::other(join.to_string())));
            let chunk = match read {
                Ok((file, chunk)) => {
                    state.sent += chunk.len() as u64;
                    // A file cut short since it was hashed ends here too: the daemon refuses
                    // the short stream.
                    if state.sent < size && chunk.len() == want {
                        state.file = Some(file);
                    }
                    chunk
                }
                Err(error) => {
                    if let Ok(mut slot) = failed.lock() {
                        *slot = Some(error);
                    }
                    // Past the first chunk the stream just ends; the first is still sent, so
                    // that the daemon reads a digest and refuses the short stream.
                    state.first.as_ref()?;
                    Vec::new()
                }
            };
            let (sha256, announced) = match state.first.take() {
                Some(sha256) => (sha256, size),
                None => (String::new(), 0),
            };
            let message = v1::ArtifactChunk {
                sha256,
                size: announced,
                data: Bytes::from(chunk),
            };
            Some((message, state))
        }
    })
}

impl Client {
    /// Uploads the file at `path` (PutArtifact): hashed in a first pass, then streamed in
    /// chunks of [`CHUNK_BYTES`]. Answers its digest and size, which a `Result` names it by
    /// ([`StoredArtifact::named`]). A file that changes between the two passes is refused by
    /// the daemon (its bytes no longer hash to the digest announced).
    pub async fn put_artifact(&self, path: impl AsRef<Path>) -> Result<StoredArtifact> {
        let path = path.as_ref().to_path_buf();
        let what = format!("reading {}", path.display());
        let (file, sha256, size) = blocking(&what, move || {
            let mut file = std::fs::File::open(&path)?;
            let (sha256, size) = hash_all(&mut file, None)?;
            // The same open file is streamed from its start: no second open of a path that
            // may have been replaced meanwhile.
            std::io::Seek::rewind(&mut file)?;
            Ok((file, sha256, size))
        })
        .await?;
        self.upload(sha256, size, file, what).await
    }

    /// Uploads everything `reader` reads: copied into an unnamed temporary file while it is
    /// hashed (the digest must come first), then streamed from there. For content that is not
    /// a file already (a compiler's output in memory, a pipe).
    pub async fn put_artifact_reader<R>(&self, mut reader: R) -> Result<StoredArtifact>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let mut spool = blocking("creating a temporary file", tempfile::tempfile).await?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        loop {
            let mut chunk = vec![0; CHUNK_BYTES];
            let n = reader
                .read(&mut chunk)
                .await
                .map_err(io_error("reading the artifact".to_owned()))?;
            if n == 0 {
                break;
            }
            chunk.truncate(n);
            hasher.update(&chunk);
            size += n as u64;
            spool = blocking("writing a temporary file", move || {
                spool.write_all(&chunk)?;
                Ok(spool)
            })
            .await?;
        }
        let spool = blocking("rewinding a temporary file", move || {
            std::io::Seek::rewind(&mut spool)?;
            Ok(spool)
        })
        .await?;
        self.upload(
            hex(&hasher.finalize()),
            size,
            spool,
            "reading a temporary file".to_owned(),
        )
        .await
    }

    /// Uploads `size` bytes read from `file` that hash to `sha256`, for a caller that hashed
    /// the content already (while it built the file). A wrong digest or size is refused by the
    /// daemon, and nothing of it is kept.
    pub async fn put_artifact_with_digest(
        &self,
        sha256: &str,
        size: u64,
        file: std::fs::File,
    ) -> Result<StoredArtifact> {
        check_digest(sha256)
            .map_err(|refusal| ClientError::Artifact(format!("digest {sha256:?}: {refusal}")))?;
        self.upload(
            sha256.to_owned(),
            size,
            file,
            "reading the artifact".to_owned(),
        )
        .await
    }

    async fn upload(
        &self,
        sha256: String,
        size: u64,
        file: std::fs::File,
        what: String,
    ) -> Result<StoredArtifact> {
        let failed = Arc::new(Mutex::new(None));
        let chunks = upload_chunks(sha256.clone(), size, file, Arc::clone(&failed));
        let request = self.request(chunks, self.timeout + DEFAULT_ARTIFACT_TIMEOUT);
        let answer = self.inner.clone().put_artifact(request).await;
        // A read that failed mid-stream is the cause of whatever the daemon said about it.
        if let Some(source) = failed.lock().ok().and_then(|mut slot| slot.take()) {
            return Err(ClientError::Io { what, source });
        }
        let already_held = answer?.into_inner().already_held;
        Ok(StoredArtifact {
            sha256,
            size,
            already_held,
        })
    }

    /// Uploads each `(name, path)` ([`Client::put_artifact`]) and answers the `Artifact`s that
    /// name them, in the order given, for the `artifacts` of a `Result` to Record: the way to
    /// store files beside a config. Names are checked ([`check_name`], unique, at most
    /// [`MAX_PER_RESULT`]) before anything is uploaded. A Record may name only blobs the node
    /// holds, so upload first, then Record; a blob nobody names is collected after the daemon's
    /// `--artifact-grace-secs`.
    pub async fn put_artifacts<N, P>(
        &self,
        files: impl IntoIterator<Item = (N, P)>,
    ) -> Result<Vec<v1::Artifact>>
    where
        N: Into<String>,
        P: AsRef<Path>,
    {
        let files: Vec<(String, PathBuf)> = files
            .into_iter()
            .map(|(name, path)| (name.into(), path.as_ref().to_path_buf()))
            .collect();
        if files.len() > MAX_PER_RESULT {
            return Err(ClientError::Artifact(format!(
                "{} artifacts, a result names at most {MAX_PER_RESULT}",
                files.len()
            )));
        }
        let mut names = HashSet::new();
        for (name, _) in &files {
            check_name(name)
                .map_err(|refusal| ClientError::Artifact(format!("name {name:?}: {refusal}")))?;
            if !names.insert(name.as_str()) {
                return Err(ClientError::Artifact(format!(
                    "name {name:?} is given twice"
                )));
            }
        }
        let mut artifacts = Vec::with_capacity(files.len());
        for (name, path) in &files {
            artifacts.push(self.put_artifact(path).await?.named(name)?);
        }
        Ok(artifacts)
    }

    /// Which of `digests` this node cannot serve (StatArtifacts): held blobs, and blobs a held
    /// entry names that a tier below can supply, are not missing.
    pub async fn stat_artifacts(&self, digests: Vec<String>) -> Result<Vec<String>> {
        for digest in &digests {
            check_digest(digest).map_err(|refusal| {
                ClientError::Artifact(format!("digest {digest:?}: {refusal}"))
            })?;
        }
        let message = v1::StatArtifactsRequest { sha256: digests };
        let answer = crate::opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.stat_artifacts(request).await }
        });
        Ok(answer.await?.into_inner().missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_spells_the_digest_as_the_contract_does() {
        let (digest, size) = hash_all(&mut &b"hello\n"[..], None).unwrap();
        assert_eq!(
            digest,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(size, 6);
        assert_eq!(check_digest(&digest), Ok(()));
        let (empty, zero) = hash_all(&mut &b""[..], None).unwrap();
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(zero, 0);
    }

    #[tokio::test]
    async fn uploads_are_chunked_with_the_digest_first() {
        let mut file = tempfile::tempfile().unwrap();
        let content: Vec<u8> = (0..CHUNK_BYTES * 2 + 10).map(|i| (i % 251) as u8).collect();
        file.write_all(&content).unwrap();
        std::io::Seek::rewind(&mut file).unwrap();
        let failed = Arc::new(Mutex::new(None));
        let chunks: Vec<v1::ArtifactChunk> = futures::StreamExt::collect(upload_chunks(
            "d".repeat(64),
            content.len() as u64,
            file,
            Arc::clone(&failed),
        ))
        .await;
        let sizes: Vec<usize> = chunks.iter().map(|c| c.data.len()).collect();
        assert_eq!(sizes, [CHUNK_BYTES, CHUNK_BYTES, 10]);
        assert_eq!(chunks[0].sha256, "d".repeat(64));
        assert_eq!(chunks[0].size, content.len() as u64);
        assert!(chunks[1..]
            .iter()
            .all(|c| c.sha256.is_empty() && c.size == 0));
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(joined, content);
        assert!(failed.lock().unwrap().is_none());

        // An empty blob is one chunk that announces it.
        let empty: Vec<v1::ArtifactChunk> = futures::StreamExt::collect(upload_chunks(
            "e".repeat(64),
            0,
            tempfile::tempfile().unwrap(),
            failed,
        ))
        .await;
        assert_eq!(empty.len(), 1);
        assert_eq!((empty[0].size, empty[0].data.len()), (0, 0));
    }
}
