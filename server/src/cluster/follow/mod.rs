//! Learns other nodes' winners: bootstraps from the entries in Redis (in the background,
//! while the daemon serves), then follows the shards' streams of published winners: one
//! blocking read over every shard on a single server, so a new winner arrives within
//! milliseconds without polling; a short poll per shard on Redis Cluster, where one read
//! cannot span slots.
//!
//! Keeps its place in each shard's stream across disconnects to catch up on exactly what it
//! missed. Every message carries its shard's sequence number, so a gap (the stream was
//! trimmed past this node's place) or a restart (the shard's data was lost) is seen at the
//! next message, and only that shard is read again. After every reconnect, and every audit
//! interval, the audit compares each shard's entry count and digest in Redis with what this
//! node holds, fetches what the stream failed to deliver, and queues for publishing what
//! Redis lacks (`cluster_audit_repaired` counts the first kind: 0 while the tier is
//! healthy). Also watches the server's epoch marker: a flushed or replaced server gets this
//! node's winners republished.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::Value;
use tokio_util::sync::CancellationToken;

use super::checkpoint;
use super::keys::{encode_result, entry_digest, format_digest, Layout, SHARDS};
use super::link::{timed, Conn, BACKGROUND_TIMEOUT};
use super::places::{self, SavedPlace, SavedPlaces};
use super::refusals::{self, ReadFrom};
use super::values;
use super::{scripts, Cluster};
use crate::error::TierError;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::merge::{merge, MergeOutcome};

mod audit;
mod checkpoints;
mod resync;
mod start;

/// How long one blocking stream read waits for news (single server).
const BLOCK: Duration = Duration::from_millis(1000);
/// How often each shard's stream is polled on Redis Cluster.
const CLUSTER_POLL: Duration = Duration::from_millis(100);
/// Entries per stream read (per shard) and per bootstrap batch.
const READ_COUNT: usize = 512;
/// How often the epoch marker is checked while connected.
const EPOCH_CHECK: Duration = Duration::from_secs(1);
/// Longest the audit waits for this node's own publish queue to drain first.
const AUDIT_DRAIN: Duration = Duration::from_secs(2);
/// How often the stream places are saved at most (`places`): a restart reads at most this
/// much again.
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// How long a checkpoint builder holds a shard's lease at most.
const CHECKPOINT_LEASE: Duration = Duration::from_secs(60);
/// New checkpoint parts expire unless the header swap makes them permanent.
const CHECKPOINT_PART_TTL: Duration = Duration::from_secs(300);
/// Learned entries per store write when a checkpoint is loaded.
const APPLY_BATCH: usize = 4096;

/// Tries to find a quiet moment for a shard (no write in Redis between this node's place in
/// its stream and the comparison) before the audit leaves it to the next round.
const AUDIT_ATTEMPTS: usize = 5;

/// Where this node is in one shard's stream.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    /// Last message id read (`0-0` before any).
    id: String,
    /// The shard sequence number that message carried (0 before any).
    seq: u64,
}

impl Place {
    fn start() -> Place {
        Place {
            id: "0-0".to_owned(),
            seq: 0,
        }
    }
}

/// A shard to read again from its entries, and the sequence number through which its stream
/// had already been read: an entry written at or before it that this node lacks is one the
/// stream should have delivered (a repair); a later one is ordinary catching up.
#[derive(Clone, Copy, Debug)]
struct Resync {
    shard: usize,
    known_through: u64,
}

/// What reading shards again found.
#[derive(Clone, Copy, Debug, Default)]
struct Resynced {
    /// Entries this node lacked although their stream messages were already behind it.
    repaired: u64,
    /// Every entry that improved this node's results, repairs included.
    learned: u64,
}

/// A shard's state in Redis: the META script's reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Meta {
    seq: u64,
    count: u64,
    digest: String,
}

struct Follower {
    cluster: Arc<Cluster>,
    /// Per shard: the place in its stream; `None` before the first bootstrap.
    places: Option<Vec<Place>>,
    /// The server's epoch marker as last seen.
    epoch: Option<String>,
    /// The single server's `run_id` as last seen: the connection manager reconnects by
    /// itself, so a changed id is how a restart that no command failed on is noticed.
    run_id: Option<String>,
    /// The shards' stream names, and the shard of each.
    logs: Vec<String>,
    shard_of_log: HashMap<String, usize>,
    /// Shards whose stream or meta hash holds the wrong type: not followed (their entries are
    /// still read at bootstrap and by the audit), tried again at every audit.
    broken: [bool; SHARDS],
    /// The places came from the state directory (`places`), not from a bootstrap.
    restored: bool,
    /// The start (bootstrap, or the first audit of restored places) is over.
    start_done: bool,
    started: Instant,
    /// Shards read again from their entries during the start.
    reread_at_start: [bool; SHARDS],
    /// The places last saved, and when.
    saved: Option<Vec<Place>>,
    saved_at: Instant,
    /// Each shard's checkpoint as last seen: sequence number and entry count.
    checkpoints: [Option<(u64, u64)>; SHARDS],
    /// What loaded checkpoints brought that no audit has borne out yet (`checkpoints`).
    unconfirmed: checkpoints::Unconfirmed,
    next_checkpoint_check: Instant,
}

/// A shard found equal to Redis's at `seq` (whose message is `id`) in `current`.
struct Settled {
    shard: usize,
    seq: u64,
    id: String,
    current: Arc<crate::wire::stored::EntryMap>,
}

/// `every`, give or take half of it, at random.
fn jittered(every: Duration) -> Duration {
    let spread = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
    every / 2 + Duration::from_millis(super::random_u64() % spread)
}

type Failure = TierError;

pub async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let cluster_checkpoint_check = cluster.tuning.checkpoint_check;
    let unconfirmed = checkpoints::Unconfirmed::new(cluster.redis.layout.clone());
    let logs: Vec<String> = (0..SHARDS).map(|s| cluster.redis.layout.log(s)).collect();
    let shard_of_log = logs.iter().cloned().zip(0..).collect();
    let mut follower = Follower {
        cluster,
        places: None,
        epoch: None,
        run_id: None,
        logs,
        shard_of_log,
        broken: [false; SHARDS],
        restored: false,
        start_done: false,
        started: Instant::now(),
        reread_at_start: [false; SHARDS],
        saved: None,
        saved_at: Instant::now(),
        checkpoints: [None; SHARDS],
        unconfirmed,
        next_checkpoint_check: Instant::now() + jittered(cluster_checkpoint_check),
    };
    follower.restore_places().await;
    let mut seen_generation = 0;
    loop {
        let Some((conn, generation)) = follower.cluster.redis.link.conn() else {
            tokio::select! {
                () = follower.cluster.redis.link.wait_newer(seen_generation) => {}
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
            follower.cluster.redis.link.failed(generation, &why);
            tokio::select! {
                () = follower.cluster.redis.link.wait_newer(generation) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

impl Follower {
    /// Runs on one connection until it fails.
    async fn follow(&mut self, mut conn: Conn) -> Result<(), Failure> {
        let flushed = self.check_epoch(&mut conn).await?;
        self.check_restart(&mut conn).await?;
        if self.places.is_none() {
            self.bootstrap(&mut conn).await?;
        } else if !flushed {
            let why = if self.start_done {
                "reconnected"
            } else {
                "restarted"
            };
            self.audit(&mut conn, why).await?;
        }
        self.finish_start().await;
        // Blocking reads get their own connection, so they never hold up the shared one.
        let mut reader = match conn {
            Conn::Single(_) => Some(
                self.cluster
                    .redis
                    .link
                    .open_dedicated()
                    .await
                    .map_err(|e| TierError::from(e).during("opening the stream reader"))?,
            ),
            Conn::Cluster(_) => None,
        };
        let mut epoch_checked = Instant::now();
        let mut audited = Instant::now();
        loop {
            match reader.as_mut() {
                Some(reader) => {
                    self.read_streams(reader, Some(BLOCK)).await?;
                }
                None => {
                    self.read_streams(&mut conn, None).await?;
                    tokio::time::sleep(CLUSTER_POLL).await;
                }
            }
            if epoch_checked.elapsed() >= EPOCH_CHECK {
                let flushed = self.check_epoch(&mut conn).await?;
                if self.check_restart(&mut conn).await? && !flushed {
                    self.audit(&mut conn, "redis restarted").await?;
                    audited = Instant::now();
                }
                epoch_checked = Instant::now();
            }
            if audited.elapsed() >= self.cluster.tuning.audit_interval {
                self.audit(&mut conn, "periodic").await?;
                audited = Instant::now();
            }
            self.save_places(false).await;
            if Instant::now() >= self.next_checkpoint_check {
                self.build_checkpoints(&mut conn).await?;
                self.next_checkpoint_check =
                    Instant::now() + jittered(self.cluster.tuning.checkpoint_check);
            }
        }
    }

    /// Reads the epoch marker, creating it on a fresh server. A changed or vanished marker
    /// means the server lost its data: republish, and follow the new streams from their start.
    async fn check_epoch(&mut self, conn: &mut Conn) -> Result<bool, Failure> {
        let layout = &self.cluster.redis.layout;
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
        let epoch = super::forget::read_epoch(&self.cluster, conn).await?;
        let flushed = match (&self.epoch, &epoch) {
            (Some(known), Some(now)) => known != now,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if self.restored && !self.start_done {
            if flushed {
                tracing::info!(
                    "cluster tier: saved stream places are of another redis data lifetime"
                );
            } else {
                self.cluster
                    .counters
                    .places_restored
                    .store(SHARDS as u64, Ordering::Relaxed);
            }
        }
        self.epoch = epoch;
        if created == Value::Okay && !flushed && !self.cluster.store.is_empty() {
            // A fresh server (or one restarted empty while this node was away).
            self.cluster.schedule_republish_all();
        }
        if flushed {
            tracing::warn!("cluster tier: redis lost its data (flushed or replaced); republishing this node's winners");
            self.cluster.schedule_republish_all();
            if let Some(places) = &mut self.places {
                places.fill(Place::start());
            }
        }
        Ok(flushed)
    }

    /// Whether the single server is another process than at the last check (restarted with
    /// its data, or a failover to a replica): then what it lost since its last save is
    /// found by an audit. Redis Cluster connections report their failures instead.
    async fn check_restart(&mut self, conn: &mut Conn) -> Result<bool, Failure> {
        let Conn::Single(_) = conn else {
            return Ok(false);
        };
        let info: String = timed(
            "reading the server's run id",
            redis::cmd("INFO").arg("server").query_async(conn),
        )
        .await?;
        let run_id = info
            .lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned());
        let restarted = self.run_id.is_some() && run_id.is_some() && self.run_id != run_id;
        if restarted {
            tracing::info!("cluster tier: redis restarted; auditing this node against it");
        }
        self.run_id = run_id;
        Ok(restarted)
    }

    /// Loads every entry in Redis: each shard's checkpoint where it has a good one, its
    /// entries otherwise. Each shard's place is taken first, so whatever is published
    /// meanwhile is read from the streams afterwards; a shard loaded from its checkpoint is
    /// read from the checkpoint's place instead, which is no later (docs/cluster.md).
    async fn bootstrap(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let started = Instant::now();
        // Tombstones before entries: a forgotten entry still in Redis (or in a checkpoint
        // built before the Forget) is never served here.
        super::forget::load_all(&self.cluster, conn).await?;
        let all: Vec<usize> = (0..SHARDS).collect();
        let mut places = self.positions(conn, &all).await?;
        let (from_checkpoints, loaded) = self.load_checkpoints(conn).await?;
        let mut everything = Vec::new();
        for shard in 0..SHARDS {
            match &from_checkpoints[shard] {
                Some(place) => places[shard] = place.clone(),
                None => {
                    self.reread_at_start[shard] = true;
                    everything.push(Resync {
                        shard,
                        known_through: 0,
                    });
                }
            }
        }
        let scanned = if everything.is_empty() {
            0
        } else {
            self.resync(conn, &everything, false).await?.learned
        };
        self.cluster
            .counters
            .bootstrap_entries
            .fetch_add(loaded + scanned, Ordering::Relaxed);
        self.places = Some(places);
        tracing::info!(
            learned = loaded + scanned,
            from_checkpoints = loaded,
            shards_scanned = everything.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "cluster tier: bootstrapped from redis"
        );
        Ok(())
    }

    /// Each of `shards`' place now (last message id and sequence number, in one step); a
    /// shard whose stream or meta holds the wrong type is marked broken and starts at 0.
    async fn positions(&mut self, conn: &Conn, shards: &[usize]) -> Result<Vec<Place>, Failure> {
        let layout = &self.cluster.redis.layout;
        let reads = shards.iter().map(|&shard| {
            let mut conn = conn.clone();
            let mut invocation = scripts::POSITION.prepare_invoke();
            invocation.key(layout.log(shard)).key(layout.meta(shard));
            async move { invocation.invoke_async::<(String, u64)>(&mut conn).await }
        });
        let replies = timed("reading the stream positions", async {
            Ok(join_all(reads).await)
        })
        .await?;
        let mut places = Vec::with_capacity(shards.len());
        for (&shard, reply) in shards.iter().zip(replies) {
            match reply {
                Ok((id, seq)) => {
                    self.broken[shard] = false;
                    places.push(Place { id, seq });
                }
                Err(error) if refusals::is_wrong_type(&error) => {
                    let (log, meta) = (layout.log(shard), layout.meta(shard));
                    self.cluster
                        .redis
                        .wrong_types
                        .found(refusals::wrong_typed_key(&error, &[&log, &meta]));
                    self.broken[shard] = true;
                    places.push(Place::start());
                }
                Err(error) => {
                    return Err(TierError::from(error).during("reading the stream positions"))
                }
            }
        }
        Ok(places)
    }

    /// One read of every followed shard's stream (blocking for at most `block` on a single
    /// server); applies what it brings, reads again the shards with a gap; returns the
    /// messages read. Each announcement is checked like a Record (`values::stream_entry`).
    async fn read_streams(
        &mut self,
        conn: &mut Conn,
        block: Option<Duration>,
    ) -> Result<usize, Failure> {
        let Some(places) = self.places.clone() else {
            return Ok(0);
        };
        let followed: Vec<usize> = (0..SHARDS).filter(|&s| !self.broken[s]).collect();
        if followed.is_empty() {
            if let Some(block) = block {
                tokio::time::sleep(block).await;
            }
            return Ok(0);
        }
        let replies: Vec<Value> = match conn {
            Conn::Single(_) => {
                let mut read = redis::cmd("XREAD");
                read.arg("COUNT").arg(READ_COUNT);
                if let Some(block) = block {
                    read.arg("BLOCK").arg(block.as_millis() as u64);
                }
                read.arg("STREAMS");
                for &shard in &followed {
                    read.arg(&self.logs[shard]);
                }
                for &shard in &followed {
                    read.arg(&places[shard].id);
                }
                let wait = block.unwrap_or_default() + BACKGROUND_TIMEOUT;
                match tokio::time::timeout(wait, read.query_async::<Value>(conn)).await {
                    Ok(Ok(reply)) => vec![reply],
                    Ok(Err(error)) if refusals::is_wrong_type(&error) => {
                        self.find_broken_streams(conn, &followed).await?;
                        return Ok(0);
                    }
                    Ok(Err(error)) => {
                        return Err(TierError::from(error).during("reading the streams"))
                    }
                    Err(_) => return Err(TierError::no_answer("reading the streams")),
                }
            }
            Conn::Cluster(_) => {
                // One read per shard: a command's keys must share a slot on Redis Cluster.
                let reads = followed.iter().map(|&shard| {
                    let mut conn = conn.clone();
                    let mut read = redis::cmd("XREAD");
                    read.arg("COUNT")
                        .arg(READ_COUNT)
                        .arg("STREAMS")
                        .arg(&self.logs[shard])
                        .arg(&places[shard].id);
                    async move { read.query_async::<Value>(&mut conn).await }
                });
                let replies =
                    timed("reading the streams", async { Ok(join_all(reads).await) }).await?;
                let mut read = Vec::new();
                for (&shard, reply) in followed.iter().zip(replies) {
                    match reply {
                        Ok(reply) => read.push(reply),
                        Err(error) if refusals::is_wrong_type(&error) => {
                            self.cluster.redis.wrong_types.found(&self.logs[shard]);
                            self.broken[shard] = true;
                        }
                        Err(error) => {
                            return Err(TierError::from(error).during("reading the streams"))
                        }
                    }
                }
                read
            }
        };
        let me = self.cluster.node_id();
        let mut entries = Vec::new();
        let mut gaps: Vec<Resync> = Vec::new();
        let mut read = 0;
        let places = self.places.get_or_insert_with(Vec::new);
        for (stream, messages) in replies.iter().flat_map(values::stream_read) {
            let Some(&shard) = self.shard_of_log.get(&stream) else {
                continue;
            };
            let place = &mut places[shard];
            for message in messages {
                read += 1;
                if let Some(seq) = message.text("s").and_then(|s| s.parse::<u64>().ok()) {
                    if seq != place.seq + 1 && !gaps.iter().any(|g| g.shard == shard) {
                        // Trimmed past this node's place (everything before stays known), or
                        // the shard started over (it lost its data: nothing is known).
                        let known_through = if seq > place.seq { place.seq } else { 0 };
                        tracing::info!(
                            shard,
                            expected = place.seq + 1,
                            got = seq,
                            "cluster tier: a shard's stream skipped; reading the shard again"
                        );
                        gaps.push(Resync {
                            shard,
                            known_through,
                        });
                    }
                    place.seq = seq;
                }
                place.id = message.id.clone();
                let publisher = message.text("n");
                if publisher == Some(me.as_str()) {
                    continue; // our own publish
                }
                if publisher
                    .and_then(|n| n.rsplit_once('/'))
                    .is_some_and(|(name, _)| name == self.cluster.node_name())
                {
                    self.cluster.name_taken_by(publisher.unwrap_or_default());
                }
                let entry = values::stream_entry(&message.fields).and_then(|(key, result)| {
                    Ok((key, result, values::stream_day(&message.fields)?))
                });
                match entry {
                    Ok(entry) => entries.push(entry),
                    Err(why) => {
                        self.cluster
                            .observed
                            .refusals
                            .refuse(ReadFrom::Stream, &message.id, &why)
                    }
                }
            }
        }
        self.cluster.apply_learned(entries).await;
        if !gaps.is_empty() {
            self.cluster
                .counters
                .stream_gaps
                .fetch_add(gaps.len() as u64, Ordering::Relaxed);
            // A shard that started over lost what this node may hold: publish it again.
            let restarted = gaps.iter().any(|g| g.known_through == 0);
            self.resync_counted(conn, &gaps, restarted).await?;
        }
        Ok(read)
    }

    /// A stream read failed on a key of the wrong type, which the error does not name: asks
    /// each followed stream's type and stops following those that are not streams.
    async fn find_broken_streams(
        &mut self,
        conn: &mut Conn,
        followed: &[usize],
    ) -> Result<(), Failure> {
        for &shard in followed {
            let kind: String = timed(
                "asking a stream's type",
                redis::cmd("TYPE").arg(&self.logs[shard]).query_async(conn),
            )
            .await?;
            if kind != "stream" && kind != "none" {
                self.cluster.redis.wrong_types.found(&self.logs[shard]);
                self.broken[shard] = true;
            }
        }
        Ok(())
    }
}
