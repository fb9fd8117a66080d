//! Artifact blobs for tests: content made from a seed (any size, never held whole in the
//! test's memory), its digest, and uploads and downloads over the raw gRPC stream, so that a
//! test can cut an upload short or count what a download carried.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tunecache_client::{proto, Client};

/// One chunk of the content, as PutArtifact carries it.
pub const CHUNK: usize = tunecache_proto::artifact::CHUNK_BYTES;

/// `size` bytes made from `seed` (xorshift64), in chunks of [`CHUNK`].
#[derive(Clone, Copy, Debug)]
pub struct Content {
    pub seed: u64,
    pub size: u64,
}

impl Content {
    pub fn new(seed: u64, size: u64) -> Content {
        Content { seed, size }
    }

    /// The content's chunks, made on demand.
    pub fn chunks(self) -> impl Iterator<Item = Vec<u8>> {
        let mut state = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut left = self.size;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let len = left.min(CHUNK as u64) as usize;
            left -= len as u64;
            let mut chunk = Vec::with_capacity(len + 8);
            while chunk.len() < len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                chunk.extend_from_slice(&state.to_le_bytes());
            }
            chunk.truncate(len);
            Some(chunk)
        })
    }

    /// The lowercase hex SHA-256 of the content.
    pub fn digest(self) -> String {
        let mut hasher = Sha256::new();
        for chunk in self.chunks() {
            hasher.update(&chunk);
        }
        hex(&hasher.finalize())
    }

    /// The content as one buffer (small blobs only).
    pub fn bytes(self) -> Vec<u8> {
        self.chunks().flatten().collect()
    }

    pub fn artifact(self, name: &str) -> proto::Artifact {
        proto::Artifact {
            name: name.into(),
            sha256: self.digest(),
            size: self.size,
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The chunks of an upload announcing `digest` and `size`, carrying `data` in pieces of at
/// most [`CHUNK`] (the first chunk carries the first piece; an empty upload is one chunk).
pub fn upload_chunks(
    digest: &str,
    size: u64,
    data: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> impl futures::Stream<Item = proto::ArtifactChunk> + Send + 'static {
    let mut first = Some((digest.to_owned(), size));
    let mut data = data.fuse();
    futures::stream::iter(std::iter::from_fn(move || {
        let piece = data.next();
        let announce = first.take();
        if piece.is_none() && announce.is_none() {
            return None;
        }
        let (sha256, size) = announce.unwrap_or_default();
        Some(proto::ArtifactChunk {
            sha256,
            size,
            data: piece.unwrap_or_default().into(),
        })
    }))
}

/// PutArtifact of `content` as it is.
pub async fn put(
    client: &Client,
    content: Content,
) -> Result<proto::PutArtifactResponse, tonic::Status> {
    put_raw(client, &content.digest(), content.size, content.chunks()).await
}

/// PutArtifact announcing `digest` and `size`, carrying `data`: what a careless or hostile
/// client may send.
pub async fn put_raw(
    client: &Client,
    digest: &str,
    size: u64,
    data: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> Result<proto::PutArtifactResponse, tonic::Status> {
    let mut request = tonic::Request::new(upload_chunks(digest, size, data));
    request.set_timeout(Duration::from_secs(300));
    client
        .raw()
        .put_artifact(request)
        .await
        .map(tonic::Response::into_inner)
}

/// GetArtifact of `digest`: the digest of what came and its length, or the status the stream
/// ended with.
pub async fn get_digest(
    client: &Client,
    digest: &str,
    wait_ms: u32,
) -> Result<(String, u64), tonic::Status> {
    let mut stream = client
        .raw()
        .get_artifact(proto::GetArtifactRequest {
            sha256: digest.into(),
            wait_ms,
        })
        .await?
        .into_inner();
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut first = true;
    while let Some(chunk) = stream.message().await? {
        assert!(
            chunk.data.len() <= CHUNK,
            "a chunk of {} bytes",
            chunk.data.len()
        );
        if first {
            assert_eq!(chunk.sha256, digest, "the first chunk names the digest");
            first = false;
        }
        hasher.update(&chunk.data);
        len += chunk.data.len() as u64;
    }
    Ok((hex(&hasher.finalize()), len))
}

/// StatArtifacts: the digests the daemon cannot serve.
pub async fn missing(client: &Client, digests: &[String]) -> Vec<String> {
    client
        .raw()
        .stat_artifacts(proto::StatArtifactsRequest {
            sha256: digests.to_vec(),
        })
        .await
        .expect("StatArtifacts")
        .into_inner()
        .missing
}

/// Puts `content` and records an entry of `problem` naming it as `name`; answers the entry.
pub async fn held_entry(
    client: &Client,
    problem: &str,
    content: Content,
    name: &str,
) -> proto::Entry {
    put(client, content).await.expect("PutArtifact");
    let mut entry = crate::entry(
        crate::test_key("matmul", problem),
        "{\"block\":64}",
        1.0,
        "test",
    );
    if let Some(result) = entry.result.as_mut() {
        result.artifacts = vec![content.artifact(name)];
    }
    client.record(vec![entry.clone()]).await.expect("Record");
    entry
}
