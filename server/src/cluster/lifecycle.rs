//! Last uses and expiry in Redis (docs/cluster.md "Last use and expiry"): this tier's side of
//! the store's lifecycle (`store::lifecycle`).
//!
//! - Uses: the change feed hands over the keys this node's ranks used (`Source::Read`, or a
//!   Record repeating a held result); the publisher sends them in batches through `TOUCH`,
//!   which raises the entry's `u` and announces it, so every node learns the day. The store
//!   tells each entry at most once a day, so the commands grow with the distinct entries used
//!   per day, never with the reads.
//! - Expiry: entries this node's sweep expired, and entries Redis handed this node that were
//!   already expired on arrival, are deleted from Redis through `EXPIRE_ENTRY`, which keeps
//!   any entry some node used or recorded after the day this node judged it by. Deleting on
//!   arrival too is what bounds Redis by the retention: an entry every node dropped while its
//!   tier was not listening (a start's sweep) would otherwise stay in Redis for ever.
//!
//! Both queues are filled on the writer thread (the feed) or by the follower, never wait on
//! Redis, and are bounded; the publisher's task drains them (`drain`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::join_all;
use redis::Value;

use super::keys::{encode_at, encode_day, Layout};
use super::link::{Conn, BACKGROUND_TIMEOUT};
use super::{refusals, scripts, Cluster};
use crate::error::{TierError, TierResult};
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::lifecycle::{arriving_day, effective_day, Day, MS_PER_DAY};
use crate::store::{LifecycleSettings, Source, StoredEntry, UseChange};

/// Keys per batch: one round of scripts, all in flight at once (pipelined).
const BATCH: usize = 256;

/// What waits for Redis: last uses to carry, entries to delete. Each map holds one day per
/// key (the latest use; the day an expiry was judged by), at most `limit` keys.
pub(super) struct LifecycleQueue {
    uses: Mutex<HashMap<CacheKey, Day>>,
    expired: Mutex<HashMap<CacheKey, Day>>,
    limit: usize,
    /// A full queue was logged (once per run).
    overflow_logged: AtomicBool,
}

impl LifecycleQueue {
    pub(super) fn new(limit: usize) -> LifecycleQueue {
        LifecycleQueue {
            uses: Mutex::default(),
            expired: Mutex::default(),
            limit: limit.max(1),
            overflow_logged: AtomicBool::new(false),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        crate::sync::lock(&self.uses).is_empty() && crate::sync::lock(&self.expired).is_empty()
    }

    /// Adds `items` to `queue`, keeping the later day of a key queued twice. Past the bound
    /// the rest are dropped: a use lost only lets another node expire the entry sooner (this
    /// node keeps its own copy), an expiry lost is found again when a node next reads the
    /// entry. Returns whether anything was queued.
    fn push(&self, queue: &Mutex<HashMap<CacheKey, Day>>, items: Vec<(CacheKey, Day)>) -> bool {
        let mut queue = crate::sync::lock(queue);
        let mut queued = false;
        for (key, day) in items {
            if queue.len() >= self.limit && !queue.contains_key(&key) {
                if !self.overflow_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        limit = self.limit,
                        "cluster tier: last uses or expiries wait for redis past the publish \
                         queue's bound; the rest are dropped (logged once)"
                    );
                }
                break;
            }
            let slot = queue.entry(key).or_insert(day);
            *slot = (*slot).max(day);
            queued = true;
        }
        queued
    }

    /// Up to `BATCH` keys of `queue`, taken out.
    fn take(queue: &Mutex<HashMap<CacheKey, Day>>) -> Vec<(CacheKey, Day)> {
        let mut queue = crate::sync::lock(queue);
        let keys: Vec<CacheKey> = queue.keys().take(BATCH).cloned().collect();
        keys.into_iter()
            .filter_map(|key| queue.remove_entry(&key))
            .collect()
    }
}

/// Whether a use came from this node (its ranks read the key, a Record repeated a held
/// result): those go to Redis. Uses a tier reported are there already.
pub(super) fn local_use(source: &Source) -> bool {
    matches!(source, Source::Read | Source::Record { .. } | Source::Tuner)
}

/// The day an entry arriving from Redis with last use `day` is judged by, if the store drops
/// it as expired on arrival: the same rule as the writer's (`store::plan`: the day checked
/// as any day from elsewhere, raised by the last use of what this node holds for the key).
pub(super) fn expired_on_arrival(
    settings: &LifecycleSettings,
    held: Option<&StoredEntry>,
    key: &CacheKey,
    result: &TunedResult,
    day: Day,
    today: Day,
) -> Option<Day> {
    let day = arriving_day(day, held.map_or(0, StoredEntry::last_use), today);
    settings
        .retention
        .entry_expired(&key.namespace, day, result.tuned_at_unix_ms, today)
        .then(|| effective_day(day, result.tuned_at_unix_ms, today))
}

impl Cluster {
    /// Queues this node's uses for Redis (the change feed, on the writer thread).
    pub(super) fn queue_uses(&self, uses: &[UseChange]) {
        let local: Vec<(CacheKey, Day)> = uses
            .iter()
            .filter(|used| local_use(&used.source))
            .map(|used| (used.entry.key().to_key(), used.day))
            .collect();
        if !local.is_empty() && self.lifecycle.push(&self.lifecycle.uses, local) {
            self.queue.wake.notify_one();
        }
    }

    /// Queues the deletion from Redis of entries this node's sweep expired (the change feed,
    /// on the writer thread), each judged by its effective day as the sweep saw it.
    pub(super) fn queue_expired(&self, entries: &[StoredEntry]) {
        let today = self.store.today();
        let doomed: Vec<(CacheKey, Day)> = entries
            .iter()
            .map(|entry| {
                let day = crate::store::expiry::entry_day(entry, today);
                (entry.key().to_key(), day)
            })
            .collect();
        if self.lifecycle.push(&self.lifecycle.expired, doomed) {
            self.queue.wake.notify_one();
        }
    }

    /// Queues the deletion from Redis of the learned entries the store is about to drop as
    /// expired on arrival; none while expiry is paused (a clock off from Redis's). Returns,
    /// for each entry, whether it expired.
    pub(super) fn expire_arrivals(&self, entries: &[(CacheKey, TunedResult, Day)]) -> Vec<bool> {
        let settings = self.store.lifecycle();
        if !settings.retention.expires_anything() || self.store.expiry_paused().is_some() {
            return vec![false; entries.len()];
        }
        let today = settings.clock.today();
        let map = self.store.current();
        let mut doomed = Vec::new();
        let expired = entries
            .iter()
            .map(|(key, result, day)| {
                let judged = expired_on_arrival(&settings, map.get(key), key, result, *day, today);
                if let Some(judged) = judged {
                    doomed.push((key.clone(), judged));
                }
                judged.is_some()
            })
            .collect();
        if !doomed.is_empty() && self.lifecycle.push(&self.lifecycle.expired, doomed) {
            self.queue.wake.notify_one();
        }
        expired
    }
}

/// One batch of each queue to Redis. On a failure the batch goes back to its queue (a use
/// keeps the later day) and the error is the caller's to act on (reconnect).
pub(super) async fn drain(cluster: &Arc<Cluster>, conn: &Conn) -> TierResult<()> {
    let queue = &cluster.lifecycle;
    let uses = LifecycleQueue::take(&queue.uses);
    if !uses.is_empty() {
        if let Err(why) = touch(cluster, conn, &uses).await {
            queue.push(&queue.uses, uses);
            return Err(why);
        }
    }
    let doomed = LifecycleQueue::take(&queue.expired);
    if !doomed.is_empty() {
        if let Err(why) = expire(cluster, conn, &doomed).await {
            queue.push(&queue.expired, doomed);
            return Err(why);
        }
    }
    Ok(())
}

/// Runs `TOUCH` for each (key, day): Redis raises the entry's `u` and announces it.
async fn touch(cluster: &Cluster, conn: &Conn, uses: &[(CacheKey, Day)]) -> TierResult<()> {
    let layout = &cluster.redis.layout;
    let node = cluster.node_id();
    let max_len = cluster.tuning.stream_max_len;
    let calls = uses.iter().map(|(key, day)| {
        let mut conn = conn.clone();
        let text = Layout::key_text(key);
        let shard = Layout::shard_of_text(&text);
        let mut invocation = scripts::TOUCH.prepare_invoke();
        invocation
            .key(layout.entry_of_text(&text))
            .key(layout.log(shard))
            .key(layout.meta(shard))
            .arg(encode_day(*day))
            .arg(text)
            .arg(&node)
            .arg(max_len);
        async move { invocation.invoke_async::<Value>(&mut conn).await }
    });
    cluster
        .counters
        .last_use_commands
        .fetch_add(uses.len() as u64, Ordering::Relaxed);
    let replies = tokio::time::timeout(BACKGROUND_TIMEOUT, join_all(calls))
        .await
        .map_err(|_| TierError::unavailable("carrying last uses timed out"))?;
    for ((key, _), reply) in uses.iter().zip(replies) {
        if let Err(error) = reply {
            let text = Layout::key_text(key);
            let shard = Layout::shard_of_text(&text);
            let names = [
                layout.entry_of_text(&text),
                layout.log(shard),
                layout.meta(shard),
            ];
            wrong_typed_or_fail(cluster, error, &names)?;
        }
    }
    Ok(())
}

/// Runs `EXPIRE_ENTRY` for each (key, day judged by); counts what Redis deleted.
async fn expire(cluster: &Cluster, conn: &Conn, doomed: &[(CacheKey, Day)]) -> TierResult<()> {
    let layout = &cluster.redis.layout;
    let today = cluster.store.today();
    let calls = doomed.iter().map(|(key, judged)| {
        let mut conn = conn.clone();
        let text = Layout::key_text(key);
        let shard = Layout::shard_of_text(&text);
        // The first instant after the day judged: a later `a` is a result recorded since.
        let after = (i64::from(*judged) + 1).saturating_mul(MS_PER_DAY);
        let mut invocation = scripts::EXPIRE_ENTRY.prepare_invoke();
        invocation
            .key(layout.entry_of_text(&text))
            .key(layout.meta(shard))
            .arg(encode_day(*judged))
            .arg(encode_day(today))
            .arg(encode_at(after));
        async move { invocation.invoke_async::<Value>(&mut conn).await }
    });
    let replies = tokio::time::timeout(BACKGROUND_TIMEOUT, join_all(calls))
        .await
        .map_err(|_| TierError::unavailable("deleting expired entries timed out"))?;
    let mut deleted = 0u64;
    for ((key, _), reply) in doomed.iter().zip(replies) {
        match reply {
            Ok(Value::Int(1)) => deleted += 1,
            Ok(_) => {}
            Err(error) => {
                let text = Layout::key_text(key);
                let shard = Layout::shard_of_text(&text);
                let names = [layout.entry_of_text(&text), layout.meta(shard)];
                wrong_typed_or_fail(cluster, error, &names)?;
            }
        }
    }
    cluster
        .counters
        .entries_expired
        .fetch_add(deleted, Ordering::Relaxed);
    Ok(())
}

/// A key of the wrong type is named and its item dropped (the audit repairs around it);
/// any other error fails the batch.
fn wrong_typed_or_fail(
    cluster: &Cluster,
    error: redis::RedisError,
    names: &[String],
) -> TierResult<()> {
    if !refusals::is_wrong_type(&error) {
        return Err(TierError::from(error));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    cluster
        .redis
        .wrong_types
        .found(refusals::wrong_typed_key(&error, &names));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lifecycle::{Clock, Retention};

    const TODAY: Day = 20_000;

    fn key(namespace: &str) -> CacheKey {
        CacheKey {
            namespace: namespace.into(),
            op: "op".into(),
            device: "dev".into(),
            problem: "p".into(),
            rank: None,
        }
    }

    fn result_tuned(day: Day) -> TunedResult {
        TunedResult {
            config: "{}".into(),
            time_us: 1.0,
            tuned_by: "t".into(),
            tuned_at_unix_ms: i64::from(day) * MS_PER_DAY,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    fn settings() -> LifecycleSettings {
        LifecycleSettings {
            retention: Retention::new(30, [("forever".to_owned(), 0)]),
            max_entries: 0,
            clock: Clock::manual(i64::from(TODAY) * MS_PER_DAY),
            ..LifecycleSettings::default()
        }
    }

    #[test]
    fn arrivals_are_judged_by_the_writers_rule() {
        let s = settings();
        let old = result_tuned(TODAY - 100);
        let judge = |namespace: &str, held: Option<&StoredEntry>, day: Day| {
            expired_on_arrival(&s, held, &key(namespace), &old, day, TODAY)
        };
        // Unused for 40 days: judged by that day.
        assert_eq!(judge("ns", None, TODAY - 40), Some(TODAY - 40));
        // Used within the retention, or no day known (an older daemon's entry: today).
        assert_eq!(judge("ns", None, TODAY - 30), None);
        assert_eq!(judge("ns", None, 0), None);
        // A day after today counts as today; a namespace kept for ever never expires.
        assert_eq!(judge("ns", None, TODAY + 9), None);
        assert_eq!(judge("forever", None, TODAY - 400), None);
        // What this node holds for the key and used lately keeps it.
        let held = StoredEntry::new(&key("ns"), &old).with_last_use(TODAY - 2);
        assert_eq!(judge("ns", Some(&held), TODAY - 40), None);
        // A result recorded lately counts as a use of that day.
        let fresh = result_tuned(TODAY - 3);
        assert_eq!(
            expired_on_arrival(&s, None, &key("ns"), &fresh, TODAY - 90, TODAY),
            None
        );
    }

    #[test]
    fn only_local_uses_go_to_redis() {
        assert!(local_use(&Source::Read));
        assert!(local_use(&Source::Record { lease: None }));
        assert!(local_use(&Source::Tuner));
        for reported in [Source::Cluster, Source::Snapshot, Source::Bundle] {
            assert!(!local_use(&reported), "{reported:?}");
        }
    }

    #[test]
    fn a_queue_keeps_the_latest_day_per_key_within_its_bound() {
        let queue = LifecycleQueue::new(2);
        assert!(queue.push(&queue.uses, vec![(key("a"), 5), (key("a"), 3)]));
        assert!(queue.push(&queue.uses, vec![(key("b"), 1), (key("c"), 1)]));
        // `c` did not fit; `a` kept its later day.
        let mut taken = LifecycleQueue::take(&queue.uses);
        taken.sort();
        assert_eq!(taken, [(key("a"), 5), (key("b"), 1)]);
        assert!(queue.is_empty());
    }
}
