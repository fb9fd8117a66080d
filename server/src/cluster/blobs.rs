//! Artifact blobs in Redis: one string per digest, `<prefix>b:{sNN}<sha256>`, for blobs up to
//! `--cluster-max-artifact-bytes`. The shard tag is the digest's own (FNV of its text, as
//! for keys): a blob is stored once however many entries, of whatever shards, name it.
//!
//! - Publish: before the merge script announces an entry, each blob it names that Redis
//!   lacks is written, in 1 MiB `APPEND`s to a temporary key of the same slot, then renamed
//!   in by a script that keeps a blob already there (so a reader never sees a partial
//!   blob). A larger blob stays on the node and the shared directory; its entry is still
//!   published, and the limit's bytes are counted and logged once.
//! - Fetch ([`ClusterBlobs`], a tier of the artifact store): lazily, when a GetArtifact asks
//!   for a blob a held entry names, in 1 MiB `GETRANGE`s; the store keeps it only if it
//!   hashes to its digest.
//! - Collection and audit: every blob carries a TTL of twice `--artifact-grace-secs`; each
//!   node renews the TTL of the blobs its live entries name every half grace period, and
//!   writes again those Redis lost that it holds, so a blob no entry on any node names
//!   (beaten, forgotten) expires from Redis after the grace period, and a lost one returns.
//! - A blob key of another type than a string (a hostile or careless writer) is never taken
//!   for the blob: every path that meets it (upload, fetch, renewal) lists it in Stats
//!   `cluster_wrong_type_keys` and names it once in the log, and takes it off the list once
//!   it reads as a blob (or as nothing) again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands;

use super::link::Conn;
use super::{Cluster, Redis};
use crate::artifacts::{Artifacts, BlobSource, Partial};
use crate::error::{TierError, TierResult};
use crate::tiers::{PublishedBlobs, TierKind};

/// Bytes per APPEND or GETRANGE.
const PIECE: usize = tunecache_proto::artifact::CHUNK_BYTES;
/// A temporary blob key left by a node killed mid-upload goes after this long.
const TEMP_TTL_MS: u64 = 600_000;

/// KEYS: the temporary key, the blob key. ARGV: the TTL in ms. Renames the upload in unless a
/// blob is there already (same digest, same bytes): then drops the upload and renews the TTL.
/// A blob key of another type is left alone (-1).
const FINISH: &str = r"
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind ~= 'none' and kind ~= 'string' then
  redis.call('DEL', KEYS[1])
  return -1
end
if kind == 'string' then
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  return 0
end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
";

static FINISH_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(FINISH));

/// What the cluster tier knows of blobs: the store, the limit, and the digests it knows
/// Redis holds (cleared when Redis may have lost them: a flushed or replaced server).
pub struct BlobTier {
    pub(super) artifacts: Arc<Artifacts>,
    pub(super) max_bytes: u64,
    pub(super) ttl: Duration,
    pub(super) published: Mutex<PublishedBlobs>,
}

impl BlobTier {
    pub fn new(artifacts: Arc<Artifacts>, max_bytes: u64) -> BlobTier {
        let grace = Duration::from_millis(artifacts.grace_ms()).max(Duration::from_secs(1));
        BlobTier {
            artifacts,
            max_bytes,
            ttl: grace * 2,
            published: Mutex::new(PublishedBlobs::default()),
        }
    }
}

fn blob_key(redis: &Redis, digest: &str) -> String {
    redis.layout.blob(digest)
}

/// A blob key's type as `TYPE` names it: a string (the blob), none, or another, which is
/// listed as wrong-typed (and a string or none takes it off the list). Whether it holds the
/// blob, or `None` when it holds another type.
fn blob_type(redis: &Redis, key: &str, kind: &str) -> Option<bool> {
    match kind {
        "string" | "none" => {
            redis.wrong_types.fixed(key);
            Some(kind == "string")
        }
        _ => {
            redis.wrong_types.found(key);
            None
        }
    }
}

/// A failed command on a blob key: a wrong type lists the key.
fn failed(redis: &Redis, key: &str, error: redis::RedisError) -> TierError {
    if super::refusals::is_wrong_type(&error) {
        redis.wrong_types.found(key);
        return TierError::refused(format!("{key} holds the wrong type"));
    }
    TierError::from(error)
}

/// Writes every blob `artifacts` names that Redis does not hold yet, before the entries
/// that name them are announced.
pub(super) async fn publish_named(
    cluster: &Cluster,
    conn: &Conn,
    artifacts: impl Iterator<Item = (String, u64)>,
) -> TierResult<()> {
    let tier = &cluster.blobs;
    for (digest, size) in artifacts {
        if crate::sync::lock(&tier.published).holds(&digest) {
            continue;
        }
        if size > tier.max_bytes {
            let over = cluster
                .counters
                .artifact_bytes_over_limit
                .fetch_add(size, Ordering::Relaxed);
            if over == 0 {
                tracing::warn!(
                    digest,
                    size,
                    limit = tier.max_bytes,
                    "a blob over --cluster-max-artifact-bytes stays on this node and the shared \
                     directory; its entry is published to Redis all the same (logged once; \
                     Stats counts artifact_bytes_over_cluster_limit)"
                );
            }
            crate::sync::lock(&tier.published).mark(digest);
            continue;
        }
        let Some(path) = tier.artifacts.held_path(&digest) else {
            // Learned from another node and not fetched here: that node publishes it.
            continue;
        };
        upload(cluster, tier, conn.clone(), &digest, path, size).await?;
        crate::sync::lock(&tier.published).mark(digest);
    }
    Ok(())
}

async fn upload(
    cluster: &Cluster,
    tier: &BlobTier,
    mut conn: Conn,
    digest: &str,
    path: std::path::PathBuf,
    size: u64,
) -> TierResult<()> {
    let key = blob_key(&cluster.redis, digest);
    let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
    match blob_type(&cluster.redis, &key, &kind) {
        // Another type: the blob stays on this node (and the shared directory) until the key
        // is repaired; the renewal then finds it lost and writes it.
        None => return Ok(()),
        Some(true) => {
            let _: bool = conn.pexpire(&key, tier.ttl.as_millis() as i64).await?;
            return Ok(());
        }
        Some(false) => {}
    }
    let temp = format!("{key}.{:016x}", cluster.instance);
    let _: () = conn.del(&temp).await?;
    let shown = path.clone();
    let mut file = Some(
        tokio::task::spawn_blocking(move || std::fs::File::open(path))
            .await?
            .map_err(|e| TierError::io(format!("opening blob {digest}"), &shown, e))?,
    );
    let mut sent = 0u64;
    while sent < size {
        let Some(mut reading) = file.take() else {
            break;
        };
        let (back, piece) = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut piece = vec![0; PIECE];
            let n = reading.read(&mut piece)?;
            piece.truncate(n);
            Ok::<_, std::io::Error>((reading, piece))
        })
        .await?
        .map_err(|e| TierError::io(format!("reading blob {digest}"), &shown, e))?;
        if piece.is_empty() {
            break;
        }
        sent += piece.len() as u64;
        let _: () = redis::pipe()
            .append(&temp, piece)
            .ignore()
            .pexpire(&temp, TEMP_TTL_MS as i64)
            .ignore()
            .query_async(&mut conn)
            .await?;
        file = Some(back);
    }
    let stored: i64 = FINISH_SCRIPT
        .key(&temp)
        .key(&key)
        .arg(tier.ttl.as_millis() as u64)
        .invoke_async(&mut conn)
        .await?;
    if stored < 0 {
        cluster.redis.wrong_types.found(&key);
    }
    tracing::debug!(digest, size, stored, "cluster tier: blob written to Redis");
    Ok(())
}

/// Renews the TTL of every blob this node's live entries name, and writes again those Redis
/// lost that this node holds (the blob side of the audit: a flushed server, an eviction).
pub(super) async fn keep_named(cluster: &Cluster, conn: &Conn) -> TierResult<()> {
    let tier = &cluster.blobs;
    let named = tier.artifacts.named_digests();
    let ttl = tier.ttl.as_millis() as i64;
    let mut lost = Vec::new();
    for batch in named.chunks(512) {
        // Each blob's type with its renewal, in one round trip.
        let mut pipe = redis::pipe();
        for (digest, _) in batch {
            let key = blob_key(&cluster.redis, digest);
            pipe.cmd("TYPE").arg(&key).pexpire(&key, ttl);
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn.clone()).await?;
        for ((digest, size), reply) in batch.iter().zip(replies.chunks_exact(2)) {
            let kind = match &reply[0] {
                redis::Value::SimpleString(kind) => kind.as_str(),
                _ => "none",
            };
            let holds = blob_type(&cluster.redis, &blob_key(&cluster.redis, digest), kind);
            if holds == Some(false) && *size <= tier.max_bytes {
                lost.push((digest.clone(), *size));
            }
        }
    }
    if !lost.is_empty() {
        {
            let mut published = crate::sync::lock(&tier.published);
            for (digest, _) in &lost {
                published.unmark(digest);
            }
        }
        tracing::debug!(
            blobs = lost.len(),
            "cluster tier: writing blobs Redis lost again"
        );
        publish_named(cluster, conn, lost.into_iter()).await?;
    }
    Ok(())
}

/// The renewal loop: every half grace period, while connected.
pub(super) async fn run_keeper(cluster: Arc<Cluster>, stop: tokio_util::sync::CancellationToken) {
    let every = cluster.blobs.ttl / 4;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Some((conn, _)) = cluster.redis.link.conn() {
            if let Err(why) = keep_named(&cluster, &conn).await {
                tracing::debug!(%why, "cluster tier: renewing blob TTLs failed; next period");
            }
        }
    }
}

/// Redis as a tier of the artifact store: its fetching side, built before the store opens.
pub struct ClusterBlobs(pub Arc<Redis>);

impl BlobSource for ClusterBlobs {
    fn kind(&self) -> TierKind {
        TierKind::Cluster
    }

    fn fetch(
        &self,
        digest: String,
        size: u64,
        into: Partial,
    ) -> crate::artifacts::tiers::FetchFuture {
        let redis = Arc::clone(&self.0);
        Box::pin(async move {
            let Some((conn, _)) = redis.link.conn() else {
                return Err(TierError::unavailable("not connected to Redis"));
            };
            fetch(&redis, conn, &digest, size, into).await
        })
    }
}

async fn fetch(
    redis: &Redis,
    mut conn: Conn,
    digest: &str,
    size: u64,
    into: Partial,
) -> TierResult<Option<Partial>> {
    let key = blob_key(redis, digest);
    let held: u64 = conn
        .strlen(&key)
        .await
        .map_err(|e| failed(redis, &key, e))?;
    redis.wrong_types.fixed(&key);
    if held == 0 && size > 0 {
        return Ok(None);
    }
    // At most one byte past the size: a longer value fails its digest without being read.
    let want = held.min(size.saturating_add(1));
    let mut into = Some(into);
    let mut at = 0u64;
    while at < want {
        let end = (at + PIECE as u64).min(want) - 1;
        let piece: Vec<u8> = conn
            .getrange(&key, at as isize, end as isize)
            .await
            .map_err(|e| failed(redis, &key, e))?;
        if piece.is_empty() {
            break;
        }
        at += piece.len() as u64;
        let Some(mut writing) = into.take() else {
            break;
        };
        let back = tokio::task::spawn_blocking(move || {
            writing.write(&piece)?;
            Ok::<_, std::io::Error>(writing)
        })
        .await?
        .map_err(|e| TierError::io("writing blob", digest, e))?;
        into = Some(back);
    }
    Ok(into)
}
