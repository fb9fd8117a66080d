//! Serving a blob (GetArtifact's, mapped to its messages in `rpc::artifacts`): a held blob
//! streamed out in chunks of at most 1 MiB, each read on the
//! blocking pool, hashed as it goes. A blob not yet verified is hashed whole first; one whose
//! bytes turn out not to match its digest is dropped and the stream ends DATA_LOSS, so a
//! caller never takes wrong bytes for the blob (the clients check the digest too).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio_stream::Stream;
use tunecache_proto::artifact::{self, CHUNK_BYTES};

use super::index::{Check, FileStamp};
use super::ArtifactError;
use super::{add, disk, Artifacts};
use crate::model::validate::InvalidField;

/// One piece of a blob, streamed out or in: the first names the blob (its digest and size),
/// the later ones name nothing; each carries at most `CHUNK_BYTES` of its bytes.
pub struct Chunk {
    pub sha256: String,
    pub size: u64,
    pub data: Bytes,
}

/// A served blob, chunk by chunk; an error ends it.
pub type BlobStream = std::pin::Pin<Box<dyn Stream<Item = Result<Chunk, ArtifactError>> + Send>>;

/// Where a served stream is.
struct Serving {
    artifacts: Arc<Artifacts>,
    digest: String,
    size: u64,
    file: Option<std::fs::File>,
    /// Hashing what is sent, unless this very file was hashed whole by an earlier serve and is
    /// unchanged since (`Index::must_hash`); with the stamp recorded when it matches.
    hashing: Option<(Sha256, FileStamp)>,
    sent: u64,
    first: bool,
    done: bool,
}

impl Artifacts {
    /// Serves blob `digest`, fetching it from the tiers first if a held entry names it and
    /// this node lacks it, waiting at most `wait_ms` for them (0: `DEFAULT_WAIT_MS`).
    pub async fn get(
        self: &Arc<Self>,
        digest: String,
        wait_ms: u32,
    ) -> Result<BlobStream, ArtifactError> {
        artifact::check_digest(&digest)
            .map_err(|refusal| InvalidField::new("sha256", refusal.to_string()))?;
        let wait = Duration::from_millis(u64::from(if wait_ms == 0 {
            artifact::DEFAULT_WAIT_MS
        } else {
            wait_ms
        }));
        // A blob found corrupt is dropped and fetched again: at most twice.
        for _ in 0..2 {
            self.ensure_held(&digest, wait).await?;
            let Some(blob) = crate::sync::lock(&self.index).blob(&digest).cloned() else {
                continue;
            };
            let path = self.dir.path_of(&digest);
            if blob.check == Check::Unverified {
                let hashed = Self::blocking("verifying a blob", {
                    let path = path.clone();
                    move || disk::hash_file(&path)
                })
                .await;
                match hashed {
                    Ok((received, len)) if received == digest && len == blob.size => {
                        crate::sync::lock(&self.index).verified(&digest);
                    }
                    _ => {
                        self.drop_corrupt(&digest).await;
                        continue;
                    }
                }
            }
            let opened = Self::blocking("opening a blob", move || {
                let file = std::fs::File::open(&path)?;
                let stamp = disk::stamp_of(&file.metadata()?);
                Ok((file, stamp))
            })
            .await;
            let (file, stamp) = match opened {
                Ok(opened) => opened,
                Err(_) => {
                    // Gone from the disk under the index: drop it, fetch it again.
                    self.drop_corrupt(&digest).await;
                    continue;
                }
            };
            add(&self.counters.fetches_local, 1);
            let must_hash = crate::sync::lock(&self.index).must_hash(&digest, &stamp);
            let serving = Serving {
                artifacts: self.clone(),
                digest,
                size: blob.size,
                file: Some(file),
                hashing: must_hash.then(|| (Sha256::new(), stamp)),
                sent: 0,
                first: true,
                done: false,
            };
            return Ok(Box::pin(futures::stream::unfold(serving, Serving::next)));
        }
        Err(ArtifactError::Corrupt { digest })
    }
}

impl Serving {
    async fn next(mut self) -> Option<(Result<Chunk, ArtifactError>, Serving)> {
        if self.done {
            return None;
        }
        let want = (self.size - self.sent).min(CHUNK_BYTES as u64) as usize;
        let file = self.file.take()?;
        let read = Artifacts::blocking("reading a blob", move || {
            let mut file = file;
            let mut buf = vec![0; want];
            let mut filled = 0;
            while filled < want {
                let n = file.read(&mut buf[filled..])?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            buf.truncate(filled);
            // One byte more than the size says the file grew: not the blob.
            let mut extra = [0u8; 1];
            let past_end = want < CHUNK_BYTES && file.read(&mut extra)? > 0;
            Ok((file, buf, past_end))
        })
        .await;
        let (file, buf, past_end) = match read {
            Ok(read) => read,
            Err(error) => {
                self.done = true;
                return Some((Err(error), self));
            }
        };
        if let Some((hasher, _)) = &mut self.hashing {
            hasher.update(&buf);
        }
        self.sent += buf.len() as u64;
        let last = self.sent >= self.size || buf.len() < want || past_end;
        if last {
            self.done = true;
            let whole = buf.len() == want && !past_end;
            let matches = match self.hashing.take() {
                Some((hasher, stamp)) => {
                    let matches = disk::hex(hasher.finalize().as_slice()) == self.digest;
                    if matches && whole {
                        crate::sync::lock(&self.artifacts.index).served_whole(&self.digest, stamp);
                    }
                    matches
                }
                None => true,
            };
            if !whole || !matches {
                self.artifacts.drop_corrupt(&self.digest).await;
                let error = ArtifactError::Corrupt {
                    digest: self.digest.clone(),
                };
                return Some((Err(error), self));
            }
        } else {
            self.file = Some(file);
        }
        add(&self.artifacts.counters.bytes_served, buf.len() as u64);
        let chunk = Chunk {
            sha256: if self.first {
                self.digest.clone()
            } else {
                String::new()
            },
            size: if self.first { self.size } else { 0 },
            data: Bytes::from(buf),
        };
        self.first = false;
        Some((Ok(chunk), self))
    }
}
