//! Forgets through the Redis tier: this node's tombstones published, other nodes' learned
//! within a stream read, and the entries a tombstone drops deleted from Redis too, so a node
//! that bootstraps later, and the audit's digests, see the cache as every node holds it.
//!
//! Redis keeps every tombstone in one hash (`Layout::forgets`: scope text → stamp), and
//! announces each new one on one stream (`Layout::forget_log`); both share the slot `{f}`,
//! so one script stores and announces atomically, as the merge script does for results. A
//! follower takes its place in the stream first and reads the whole hash after, so a
//! tombstone stored in between is in both, never in neither; it reads the hash again on
//! every (re)connection, so a stream trimmed past it loses nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::Value;
use tokio_util::sync::CancellationToken;

use super::backoff::{self, Backoff};
use super::keys::{encode_stamp, Layout};
use super::link::{timed, Conn, BACKGROUND_TIMEOUT};
use super::refusals::{self, ReadFrom};
use super::tombstone_expiry::{redis_now_ms, Expiry};
use super::values;
use super::{scripts, Cluster};
use crate::error::TierError;
use crate::model::entry::{CacheKey, Origin};
use crate::model::forget::{stamp_unix_ms, ForgetScope, Tombstone};
use crate::store::Source;

/// How long one blocking read of the forget stream waits (single server).
const BLOCK: Duration = Duration::from_millis(1000);
/// How often the forget stream is polled on Redis Cluster.
const CLUSTER_POLL: Duration = Duration::from_millis(100);
/// Messages per stream read.
const READ_COUNT: usize = 512;
/// How often the follower checks that the server kept its data (the epoch marker).
const EPOCH_CHECK: Duration = Duration::from_secs(2);

type Failure = TierError;

/// A scope as the tombstone hash names it: a JSON array of its fields.
fn scope_text(scope: &ForgetScope) -> String {
    let (rank, every_rank) = scope.rank.to_fields();
    serde_json::json!([
        scope.namespace,
        scope.op,
        scope.device,
        scope.problem,
        rank,
        every_rank
    ])
    .to_string()
}

/// A tombstone as the stream carries it: the scope text, a space, the stamp.
fn tombstone_text(tombstone: &Tombstone) -> String {
    format!(
        "{} {}",
        encode_stamp(tombstone.stamp),
        scope_text(&tombstone.scope)
    )
}

/// Publishes tombstones (stored and announced), then deletes from Redis the entries they
/// drop. Safe to repeat: a tombstone Redis holds already is not announced again.
pub(super) async fn publish(
    cluster: &Arc<Cluster>,
    conn: &Conn,
    tombstones: &[Tombstone],
) -> Result<(), Failure> {
    let layout = &cluster.redis.layout;
    let node = cluster.node_id();
    let stores = tombstones.iter().map(|tombstone| {
        let mut conn = conn.clone();
        let mut invocation = scripts::FORGET.prepare_invoke();
        invocation
            .key(layout.forgets())
            .key(layout.forget_log())
            .arg(scope_text(&tombstone.scope))
            .arg(encode_stamp(tombstone.stamp))
            .arg(tombstone_text(tombstone))
            .arg(&node)
            .arg(cluster.tuning.stream_max_len);
        async move { invocation.invoke_async::<i64>(&mut conn).await }
    });
    let stored = timed("publishing forgets", async { Ok(join_all(stores).await) }).await?;
    let mut announced = 0;
    for reply in stored {
        match reply {
            Ok(n) => announced += u64::from(n == 1),
            Err(error) if refusals::is_wrong_type(&error) => {
                // Published again once the key reads as a hash (`load_all`).
                let keys = [layout.forgets(), layout.forget_log()];
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                cluster
                    .redis
                    .wrong_types
                    .found(refusals::wrong_typed_key(&error, &keys));
            }
            Err(error) => return Err(TierError::from(error).during("publishing forgets")),
        }
    }
    cluster
        .counters
        .forgets_published
        .fetch_add(announced, Ordering::Relaxed);
    let deleted = sweep(cluster, conn, tombstones).await?;
    tracing::info!(
        forgets = tombstones.len(),
        announced,
        entries_deleted = deleted,
        "cluster tier: published forgets"
    );
    Ok(())
}

/// Deletes the Redis entries `tombstones` drop: the one entry of an exact-key tombstone
/// directly, else by one SCAN over the entries. Returns how many went.
async fn sweep(cluster: &Cluster, conn: &Conn, tombstones: &[Tombstone]) -> Result<u64, Failure> {
    let layout = &cluster.redis.layout;
    let mut doomed: Vec<(String, usize, u64)> = Vec::new();
    let mut wide = Vec::new();
    for tombstone in tombstones {
        match tombstone.scope.exact_key() {
            Some(key) => {
                let text = Layout::key_text(&key);
                let shard = Layout::shard_of_text(&text);
                doomed.push((layout.entry_of_text(&text), shard, tombstone.stamp));
            }
            None => wide.push(tombstone),
        }
    }
    if !wide.is_empty() {
        let mut conn = conn.clone();
        let pattern = layout.entry_pattern(None);
        let mut pages = timed("listing cluster nodes", conn.scan_pages(pattern)).await?;
        while let Some(names) = timed("scanning entries", pages.next_page(&mut conn)).await? {
            for name in names {
                let Ok((key, shard)) = values::key_of_entry(layout, &name) else {
                    continue; // refused where entries are read
                };
                let stamp = wide
                    .iter()
                    .filter(|t| t.scope.covers(&key.view()))
                    .map(|t| t.stamp)
                    .max();
                if let Some(stamp) = stamp {
                    doomed.push((name, shard, stamp));
                }
            }
        }
    }
    delete_entries(cluster, conn, &doomed).await
}

/// Deletes from Redis entries this node's tombstones drop, found by a resync: results a node
/// published before the Forget reached it. Afterwards Redis agrees with the nodes again (the
/// audit's digests). `forgotten`: each key with the floor of the tombstones covering it.
pub(super) async fn delete_forgotten(
    cluster: &Cluster,
    conn: &Conn,
    forgotten: Vec<(CacheKey, u64)>,
) -> Result<u64, Failure> {
    let doomed: Vec<(String, usize, u64)> = forgotten
        .into_iter()
        .map(|(key, floor)| {
            let text = Layout::key_text(&key);
            let shard = Layout::shard_of_text(&text);
            (cluster.redis.layout.entry_of_text(&text), shard, floor)
        })
        .collect();
    let deleted = delete_entries(cluster, conn, &doomed).await?;
    if deleted > 0 {
        tracing::info!(
            deleted,
            "cluster tier: deleted forgotten entries that reached redis after their Forget"
        );
    }
    Ok(deleted)
}

/// Runs the delete script for each (entry name, shard, stamp): the entry goes if a tombstone
/// with that stamp drops it. Returns how many went.
async fn delete_entries(
    cluster: &Cluster,
    conn: &Conn,
    doomed: &[(String, usize, u64)],
) -> Result<u64, Failure> {
    let layout = &cluster.redis.layout;
    let mut deleted = 0;
    for chunk in doomed.chunks(READ_COUNT) {
        let deletes = chunk.iter().map(|(name, shard, stamp)| {
            let mut conn = conn.clone();
            let mut invocation = scripts::FORGET_ENTRY.prepare_invoke();
            invocation
                .key(name)
                .key(layout.meta(*shard))
                .arg(encode_stamp(!stamp));
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        let replies = timed("deleting forgotten entries", async {
            Ok(join_all(deletes).await)
        })
        .await?;
        for ((name, shard, _), reply) in chunk.iter().zip(replies) {
            match reply {
                Ok(n) => deleted += u64::from(n == 1),
                Err(error) if refusals::is_wrong_type(&error) => {
                    let meta = layout.meta(*shard);
                    cluster
                        .redis
                        .wrong_types
                        .found(refusals::wrong_typed_key(&error, &[name.as_str(), &meta]));
                }
                Err(error) => {
                    return Err(TierError::from(error).during("deleting forgotten entries"))
                }
            }
        }
    }
    Ok(deleted)
}

/// Reads every tombstone Redis holds and applies the new ones: at bootstrap, before any
/// entry is read, and on every (re)connection of the forget follower. Those past the
/// retention (`--forget-retention-days`, by Redis's clock: `tombstone_expiry`) are deleted
/// from Redis instead, so the hash, and what a connecting node reads, stays bounded as every
/// node's own set is. Each field is checked like a Forget (`values::tombstone`); a hash of
/// the wrong type is named and gone on without.
pub(super) async fn load_all(cluster: &Cluster, conn: &mut Conn) -> Result<u32, Failure> {
    let forgets = cluster.redis.layout.forgets();
    let held: Value = match tokio::time::timeout(
        BACKGROUND_TIMEOUT,
        redis::cmd("HGETALL").arg(&forgets).query_async(conn),
    )
    .await
    {
        Ok(Ok(held)) => held,
        Ok(Err(error)) if refusals::is_wrong_type(&error) => {
            cluster.redis.wrong_types.found(&forgets);
            return Ok(0);
        }
        Ok(Err(error)) => return Err(TierError::from(error).during("reading the tombstones")),
        Err(_) => {
            return Err(TierError::timed_out(
                "reading the tombstones",
                BACKGROUND_TIMEOUT,
            ))
        }
    };
    if cluster.redis.wrong_types.fixed(&forgets) {
        // What this node could not publish meanwhile goes now.
        cluster.schedule_republish_all();
    }
    let expiry = cluster.judge_clock(redis_now_ms(conn).await?);
    let mut tombstones = Vec::new();
    let mut expired = Vec::new();
    for pair in values::hash_pairs(&held) {
        let (scope_text, stamp_text) = match pair {
            Ok(pair) => pair,
            Err(why) => {
                cluster
                    .observed
                    .refusals
                    .refuse(ReadFrom::Tombstones, &forgets, &why);
                continue;
            }
        };
        let tombstone = match values::tombstone(&scope_text, &stamp_text) {
            Ok(tombstone) => tombstone,
            Err(why) => {
                cluster
                    .observed
                    .refusals
                    .refuse(ReadFrom::Tombstones, &scope_text, &why);
                continue;
            }
        };
        match expiry {
            Expiry::Before(before) if stamp_unix_ms(tombstone.stamp) < before => {
                expired.push((scope_text, stamp_text));
            }
            _ => tombstones.push(tombstone),
        }
    }
    if !expired.is_empty() {
        let deletes = expired.iter().map(|(scope, stamp)| {
            let mut conn = conn.clone();
            let mut invocation = scripts::FORGET_EXPIRE.prepare_invoke();
            invocation
                .key(cluster.redis.layout.forgets())
                .arg(scope)
                .arg(stamp);
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        let deleted = timed("deleting expired tombstones", async {
            join_all(deletes)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
        tracing::info!(
            expired = deleted.iter().filter(|&&n| n == 1).count(),
            "cluster tier: deleted tombstones past --forget-retention-days from redis"
        );
    }
    Ok(cluster.apply_tombstones(tombstones).await)
}

/// Follows the forget stream while the tier is connected.
pub async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut seen_generation = 0;
    let mut backoff = Backoff::new(super::random_u64());
    loop {
        let Some((conn, generation)) = cluster.redis.link.conn() else {
            tokio::select! {
                () = cluster.redis.link.wait_newer(seen_generation) => {}
                () = stop.cancelled() => return,
            }
            continue;
        };
        seen_generation = generation;
        let started = Instant::now();
        let outcome = tokio::select! {
            outcome = follow(&cluster, conn) => outcome,
            () = stop.cancelled() => return,
        };
        if started.elapsed() >= backoff::HEALTHY_FOR {
            backoff.reset();
        }
        // The connection's health is for its main users (the follower, the publisher) to
        // report: this follower only starts over, on a new connection or after a pause, so a
        // Redis restart is never reported twice and a flush never reconnects the tier.
        // Every start over waits its backoff, also on a connection that stays up (a refused
        // command, a damaged forget stream): never a loop.
        if let Err(why) = outcome {
            let wait = backoff.next_wait();
            tracing::debug!(%why, retry_in_ms = wait.as_millis() as u64, "cluster tier: the forget follower starts over");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Runs on one connection until it fails, or the server lost its data (then the caller
/// starts over: a new place, the whole hash again).
async fn follow(cluster: &Arc<Cluster>, mut conn: Conn) -> Result<(), Failure> {
    let mut epoch = read_epoch(cluster, &mut conn).await?;
    let forget_log = cluster.redis.layout.forget_log();
    let last = tokio::time::timeout(
        BACKGROUND_TIMEOUT,
        redis::cmd("XREVRANGE")
            .arg(&forget_log)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async::<Value>(&mut conn),
    )
    .await
    .map_err(|_| TierError::no_answer("reading the forget stream's position"))?;
    let last = match last {
        Ok(last) => {
            cluster.redis.wrong_types.fixed(&forget_log);
            last
        }
        Err(error) if refusals::is_wrong_type(&error) => {
            // Forgets still arrive with the whole hash on every start over.
            cluster.redis.wrong_types.found(&forget_log);
            load_all(cluster, &mut conn).await?;
            return Err(TierError::refused("the forget stream holds the wrong type"));
        }
        Err(error) => {
            return Err(TierError::from(error).during("reading the forget stream's position"))
        }
    };
    let mut place = values::messages_of(&last)
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_owned(), |message| message.id);
    load_all(cluster, &mut conn).await?;
    let mut reader = match conn {
        Conn::Single(_) => Some(
            cluster
                .redis
                .link
                .open_dedicated()
                .await
                .map_err(|e| TierError::from(e).during("opening the forget stream reader"))?,
        ),
        Conn::Cluster(_) => None,
    };
    let me = cluster.node_id();
    let mut epoch_checked = Instant::now();
    loop {
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT").arg(READ_COUNT);
        if reader.is_some() {
            read.arg("BLOCK").arg(BLOCK.as_millis() as u64);
        }
        read.arg("STREAMS")
            .arg(cluster.redis.layout.forget_log())
            .arg(&place);
        let reply: Value = match reader.as_mut() {
            Some(reader) => {
                let wait = BLOCK + BACKGROUND_TIMEOUT;
                match tokio::time::timeout(wait, read.query_async(reader)).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(error)) => {
                        return Err(TierError::from(error).during("reading the forget stream"))
                    }
                    Err(_) => return Err(TierError::no_answer("reading the forget stream")),
                }
            }
            None => {
                let reply = timed("reading the forget stream", read.query_async(&mut conn)).await?;
                tokio::time::sleep(CLUSTER_POLL).await;
                reply
            }
        };
        let mut learned = Vec::new();
        for (_, messages) in values::stream_read(&reply) {
            for message in messages {
                place = message.id.clone();
                if message.text("n") == Some(me.as_str()) {
                    continue; // our own
                }
                match values::forget_field(&message.fields).and_then(values::tombstone_message) {
                    Ok(tombstone) => learned.push(tombstone),
                    Err(why) => {
                        cluster
                            .observed
                            .refusals
                            .refuse(ReadFrom::Tombstones, &message.id, &why)
                    }
                }
            }
        }
        cluster.apply_tombstones(learned).await;
        if epoch_checked.elapsed() >= EPOCH_CHECK {
            // A marker set since the start (the follower sets it on a fresh server) is not a
            // loss; a changed or vanished one is.
            let now = read_epoch(cluster, &mut conn).await?;
            if epoch.is_some() && now != epoch {
                return Err(TierError::unavailable(
                    "redis lost its data: reading the forgets again",
                ));
            }
            epoch = epoch.or(now);
            epoch_checked = Instant::now();
        }
    }
}

/// The epoch marker (`None` when absent, or named as damaged when not a string).
pub(super) async fn read_epoch(
    cluster: &Cluster,
    conn: &mut Conn,
) -> Result<Option<String>, Failure> {
    let epoch = cluster.redis.layout.epoch();
    let mut get = redis::cmd("GET");
    get.arg(&epoch);
    match tokio::time::timeout(BACKGROUND_TIMEOUT, get.query_async::<Option<String>>(conn)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) if refusals::is_wrong_type(&error) => {
            cluster.redis.wrong_types.found(&epoch);
            Ok(None)
        }
        Ok(Err(error)) => Err(TierError::from(error).during("reading the epoch")),
        Err(_) => Err(TierError::timed_out(
            "reading the epoch",
            BACKGROUND_TIMEOUT,
        )),
    }
}

impl Cluster {
    /// Applies tombstones learned from Redis, counting the new ones.
    pub(super) async fn apply_tombstones(&self, tombstones: Vec<Tombstone>) -> u32 {
        if tombstones.is_empty() {
            return 0;
        }
        let count = tombstones.len() as u64;
        match self
            .store
            .apply_tombstones(tombstones, Source::Cluster, Origin::Learned)
            .await
        {
            Ok(dropped) => {
                self.counters
                    .forgets_learned
                    .fetch_add(count, Ordering::Relaxed);
                dropped
            }
            Err(error) => {
                tracing::warn!(%error, "cluster tier: applying forgets learned from redis failed");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::forget::RankScope;

    #[test]
    fn tombstones_read_back_as_written() {
        for rank in [RankScope::Every, RankScope::Rank(3)] {
            let tombstone = Tombstone {
                scope: ForgetScope {
                    namespace: "ns".into(),
                    op: "gemm \" {s01}".into(),
                    device: String::new(),
                    problem: "m=1".into(),
                    rank,
                },
                stamp: (1_700_000_000_000 << 16) + 5,
            };
            let text = tombstone_text(&tombstone);
            assert_eq!(values::tombstone_message(&text), Ok(tombstone.clone()));
            assert_eq!(
                values::scope_text(&scope_text(&tombstone.scope)),
                Ok(tombstone.scope)
            );
        }
        assert!(values::tombstone_message("zz [\"ns\"]").is_err());
        // A stamp no daemon's clock made (a hand-written field) is refused.
        let forged = format!(
            "{} {}",
            encode_stamp(u64::MAX),
            r#"["ns","","","",null,true]"#
        );
        assert!(values::tombstone_message(&forged).is_err());
    }
}
