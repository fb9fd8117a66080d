//! Learns other nodes' winners: bootstraps from the entries in Redis (in the background,
//! while the daemon serves), then follows the stream of published winners with a blocking
//! read, so a new winner arrives within milliseconds without polling. Keeps its place in the
//! stream across disconnects to catch up on exactly what it missed; bootstraps again only if
//! the stream was trimmed past that place. Also watches the server's epoch marker: a
//! flushed or replaced server gets this node's winners republished.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::streams::StreamReadReply;
use redis::Value;
use tokio_util::sync::CancellationToken;

use super::keys::{decode_result, Layout};
use super::link::{Conn, BACKGROUND_TIMEOUT};
use super::Cluster;
use crate::entry::{CacheKey, TunedResult};

/// How long one blocking stream read waits for news.
const BLOCK: Duration = Duration::from_millis(1000);
/// Entries per stream read and per bootstrap batch.
const READ_COUNT: usize = 512;
/// How often the epoch marker is checked while connected.
const EPOCH_CHECK: Duration = Duration::from_secs(1);

struct Follower {
    cluster: Arc<Cluster>,
    /// Last stream id applied; `None` before the first bootstrap.
    last_id: Option<String>,
    /// The server's epoch marker as last seen.
    epoch: Option<String>,
}

type Failure = String;

pub async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut follower = Follower {
        cluster,
        last_id: None,
        epoch: None,
    };
    let mut seen_generation = 0;
    loop {
        let Some((conn, generation)) = follower.cluster.link.conn() else {
            tokio::select! {
                () = follower.cluster.link.wait_newer(seen_generation) => {}
                () = stop.cancelled() => return,
            }
            continue;
        };
        seen_generation = generation;
        let outcome = tokio::select! {
            outcome = follower.follow(conn) => outcome,
            () = stop.cancelled() => return,
        };
        if let Err(why) = outcome {
            follower.cluster.link.failed(generation, &why);
            tokio::select! {
                () = follower.cluster.link.wait_newer(generation) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

async fn timed<T>(
    what: &str,
    future: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(BACKGROUND_TIMEOUT, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(format!("{what}: {error}")),
        Err(_) => Err(format!("{what}: no answer within {BACKGROUND_TIMEOUT:?}")),
    }
}

impl Follower {
    /// Runs on one connection until it fails.
    async fn follow(&mut self, mut conn: Conn) -> Result<(), Failure> {
        let flushed = self.check_epoch(&mut conn).await?;
        let mut bootstrap = self.last_id.is_none();
        if !flushed && !bootstrap {
            bootstrap = self.trimmed_past_us(&mut conn).await?;
        }
        if bootstrap {
            self.bootstrap(&mut conn).await?;
        }
        // Blocking reads get their own connection, so they never hold up the shared one.
        let mut reader = self
            .cluster
            .link
            .open_dedicated()
            .await
            .map_err(|e| format!("opening the stream reader: {e}"))?;
        let mut epoch_checked = Instant::now();
        loop {
            self.read_stream(&mut reader).await?;
            if epoch_checked.elapsed() >= EPOCH_CHECK {
                self.check_epoch(&mut conn).await?;
                epoch_checked = Instant::now();
            }
        }
    }

    /// Reads the epoch marker, creating it on a fresh server. A changed or vanished marker
    /// means the server lost its data: republish, and follow the new stream from its start.
    async fn check_epoch(&mut self, conn: &mut Conn) -> Result<bool, Failure> {
        let layout = &self.cluster.layout;
        let fresh = format!("{:016x}", super::random_u64());
        let created: Value = timed(
            "setting the epoch",
            redis::cmd("SET")
                .arg(layout.epoch())
                .arg(&fresh)
                .arg("NX")
                .query_async(conn),
        )
        .await?;
        let epoch: Option<String> = timed(
            "reading the epoch",
            redis::cmd("GET").arg(layout.epoch()).query_async(conn),
        )
        .await?;
        let flushed = match (&self.epoch, &epoch) {
            (Some(known), Some(now)) => known != now,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.epoch = epoch;
        if created == Value::Okay && !flushed && !self.cluster.store.is_empty() {
            // A fresh server (or one restarted empty while this node was away).
            self.cluster.republish_all.store(true, Ordering::Relaxed);
            self.cluster.publish_wake.notify_one();
        }
        if flushed {
            tracing::warn!("cluster tier: redis lost its data (flushed or replaced); republishing this node's winners");
            self.cluster.republish_all.store(true, Ordering::Relaxed);
            self.cluster.publish_wake.notify_one();
            self.last_id = Some("0-0".to_owned());
        }
        Ok(flushed)
    }

    /// Whether the stream no longer holds the entry after `last_id` (trimmed while away).
    async fn trimmed_past_us(&self, conn: &mut Conn) -> Result<bool, Failure> {
        let Some(last) = self.last_id.as_deref().filter(|id| *id != "0-0") else {
            return Ok(false);
        };
        let first: Vec<(String, Value)> = timed(
            "reading the stream start",
            redis::cmd("XRANGE")
                .arg(self.cluster.layout.log())
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .query_async(conn),
        )
        .await?;
        Ok(first
            .first()
            .is_some_and(|(id, _)| stream_id(id) > stream_id(last)))
    }

    /// Loads every entry in Redis. The stream position is taken first, so whatever is
    /// published meanwhile is read from the stream afterwards.
    async fn bootstrap(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let started = Instant::now();
        let newest: Vec<(String, Value)> = timed(
            "reading the stream end",
            redis::cmd("XREVRANGE")
                .arg(self.cluster.layout.log())
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(conn),
        )
        .await?;
        let position = newest
            .first()
            .map_or_else(|| "0-0".to_owned(), |(id, _)| id.clone());
        let nodes = timed("listing cluster nodes", conn.scan_nodes()).await?;
        let pattern = self.cluster.layout.entry_pattern();
        let mut loaded = 0u64;
        for node in nodes {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = timed("scanning entries", conn.on_node(node.as_ref(), &scan)).await?;
                let (next, names): (u64, Vec<String>) = redis::from_redis_value(&reply)
                    .map_err(|e| format!("scanning entries: {e}"))?;
                for chunk in names.chunks(READ_COUNT) {
                    let entries = self.read_entries(conn, chunk).await?;
                    let stored = self.cluster.apply_learned(entries).await;
                    loaded += u64::from(stored);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        self.cluster
            .counters
            .bootstrap_entries
            .fetch_add(loaded, Ordering::Relaxed);
        self.cluster.bootstrapped.store(true, Ordering::Relaxed);
        self.last_id = Some(position);
        tracing::info!(
            learned = loaded,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "cluster tier: bootstrapped from redis"
        );
        Ok(())
    }

    async fn read_entries(
        &self,
        conn: &Conn,
        names: &[String],
    ) -> Result<Vec<(CacheKey, TunedResult)>, Failure> {
        let layout: &Layout = &self.cluster.layout;
        let reads = names.iter().map(|name| {
            let mut conn = conn.clone();
            async move {
                let fields: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(name)
                    .arg("t")
                    .arg("c")
                    .arg("b")
                    .arg("a")
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((name, fields))
            }
        });
        let replies = timed("reading entries", async { Ok(join_all(reads).await) }).await?;
        let mut entries = Vec::new();
        for reply in replies {
            let (name, fields) = reply.map_err(|e| format!("reading entries: {e}"))?;
            let (Some(key), [Some(t), Some(c), Some(b), Some(a)]) = (
                layout.key_of_entry(name),
                <[Option<String>; 4]>::try_from(fields).unwrap_or_default(),
            ) else {
                continue; // not ours, or damaged: skipped
            };
            if let Some(result) = decode_result(&t, c, b, &a) {
                entries.push((key, result));
            }
        }
        Ok(entries)
    }

    /// One blocking read of the stream; applies what it brings.
    async fn read_stream(&mut self, reader: &mut Conn) -> Result<(), Failure> {
        let last = self.last_id.clone().unwrap_or_else(|| "0-0".to_owned());
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(self.cluster.layout.log())
            .arg(&last);
        let reply = match tokio::time::timeout(
            BLOCK + BACKGROUND_TIMEOUT,
            read.query_async::<Option<StreamReadReply>>(reader),
        )
        .await
        {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(format!("reading the stream: {error}")),
            Err(_) => return Err("reading the stream: no answer".to_owned()),
        };
        let Some(reply) = reply else {
            return Ok(()); // nothing new within BLOCK
        };
        let me = self.cluster.node_id();
        let mut entries = Vec::new();
        for stream in reply.keys {
            for message in stream.ids {
                self.last_id = Some(message.id.clone());
                let field = |name: &str| message.get::<String>(name);
                if field("n").as_deref() == Some(me.as_str()) {
                    continue; // our own publish
                }
                let (Some(k), Some(t), Some(c), Some(b), Some(a)) =
                    (field("k"), field("t"), field("c"), field("b"), field("a"))
                else {
                    continue;
                };
                let (Some(key), Some(result)) =
                    (Layout::parse_key_text(&k), decode_result(&t, c, b, &a))
                else {
                    continue;
                };
                entries.push((key, result));
            }
        }
        self.cluster.apply_learned(entries).await;
        Ok(())
    }
}

/// A stream id as a comparable pair (milliseconds, sequence).
fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}
