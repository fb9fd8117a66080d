//! The store's side of the lifecycle (`model::lifecycle`, docs/lifecycle.md): marking the
//! entries ranks read, writing those marks once a day, and expiring what is unused.
//!
//! - A read (`Store::touch`) raises its entries' last use to today, in place (an atomic in
//!   each entry), and queues the entries it raised: once per entry and day, so the queue and
//!   everything written from it grow with the distinct entries read, never with the reads.
//! - `Store::flush_uses` hands the queue to the writer, which journals the day of each and
//!   tells the feed (`ChangeListener::used`), so the tiers carry it to the other nodes.
//! - `Store::sweep` plans on a blocking thread, from one version of the cache, which entries
//!   are expired (`plan_expiry`: older than their retention, or past `--max-entries` by
//!   least recent use) and has the writer drop them in batches, each re-checked there against
//!   a use that came meanwhile, so a sweep of a million entries never holds a Record up for
//!   more than one batch. Nothing is journalled for them: their last use is, and a replay
//!   meets them expired again; the next compaction leaves them out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::model::lifecycle::{
    effective_day, AgeBucket, Clock, Day, LruCut, Retention, DEFAULT_MAX_ENTRIES,
};
use crate::wire::stored::{EntryMap, StoredEntry};

use super::writer::WriteCommand;
use super::Store;
use crate::tasks::Tasks;

/// Entries the writer drops per command of a sweep: about a millisecond of its time.
pub const EXPIRY_BATCH: usize = 1024;

/// How the store judges last use: `--retain-days`, `--retain`, `--max-entries`, and the
/// clock (the system's, or a test's).
#[derive(Clone, Debug)]
pub struct LifecycleSettings {
    pub retention: Retention,
    /// Most entries kept; past it the least recently used expire. 0: no bound.
    pub max_entries: u64,
    pub clock: Clock,
    /// How often marked uses are journalled and told to the tiers (`USE_FLUSH_INTERVAL`;
    /// tests shorten it).
    pub flush_every: Duration,
}

impl Default for LifecycleSettings {
    fn default() -> Self {
        LifecycleSettings {
            retention: Retention::default(),
            max_entries: DEFAULT_MAX_ENTRIES,
            clock: Clock::system(),
            flush_every: USE_FLUSH_INTERVAL,
        }
    }
}

/// Why a sweep expires an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Unused for longer than its namespace's retention.
    Age,
    /// Among the least recently used past `--max-entries`.
    Bound,
}

/// One entry a sweep expires: the entry, the effective day it was judged by, and why.
#[derive(Clone, Debug)]
pub struct Expiring {
    pub entry: StoredEntry,
    pub judged_day: Day,
    pub why: Expiry,
}

/// The entry's effective day (`model::lifecycle::effective_day`) on `today`.
pub fn entry_day(entry: &StoredEntry, today: Day) -> Day {
    effective_day(entry.last_use(), entry.result().tuned_at_unix_ms, today)
}

/// Which entries of `map` expire on `today`: every one past its retention, then, of those
/// left, the least recently used past `max_entries` (ties in key order, so every node
/// holding the same entries and uses cuts the same ones). In key order.
pub fn plan_expiry(map: &EntryMap, settings: &LifecycleSettings, today: Day) -> Vec<Expiring> {
    let retention = &settings.retention;
    let mut expiring = Vec::new();
    let mut live_days = Vec::with_capacity(map.len());
    for entry in map.iter() {
        let day = entry_day(entry, today);
        if retention.expired(entry.namespace(), day, today) {
            expiring.push(Expiring {
                entry: entry.clone(),
                judged_day: day,
                why: Expiry::Age,
            });
        } else {
            live_days.push(day);
        }
    }
    let cut = (settings.max_entries > 0)
        .then(|| LruCut::plan(live_days.iter().copied(), settings.max_entries))
        .flatten();
    if let Some(cut) = cut {
        let mut taken = 0;
        let mut bound = Vec::new();
        for entry in map.iter() {
            let day = entry_day(entry, today);
            if retention.expired(entry.namespace(), day, today) {
                continue;
            }
            if cut.cuts(day, &mut taken) {
                bound.push(Expiring {
                    entry: entry.clone(),
                    judged_day: day,
                    why: Expiry::Bound,
                });
            }
        }
        expiring.extend(bound);
        expiring.sort_by(|a, b| a.entry.cmp(&b.entry));
    }
    expiring
}

/// Whether the writer still drops `expiring` now: the map holds that very entry, and no use
/// after the day it was judged by has come.
pub fn still_expires(map: &EntryMap, expiring: &Expiring, today: Day) -> bool {
    let Some(held) = map.get_view(&expiring.entry.key()) else {
        return false;
    };
    held.same_entry(&expiring.entry) && entry_day(held, today) <= expiring.judged_day
}

/// One group of `tunecache du`: entries, their bytes, the artifact bytes they name, and
/// their last-use ages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    /// Bytes of the entries' records: what memory and the journal hold for them.
    pub entry_bytes: u64,
    /// Bytes of the artifacts they name (each named file counted once per entry).
    pub artifact_bytes: u64,
    /// Entries per `AgeBucket`, in `AgeBucket::ALL` order.
    pub by_age: [u64; 5],
}

/// What `du` groups by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageBy {
    Namespace,
    Device,
    Op,
}

/// The usage of `map` on `today`, per group, in group order.
pub fn usage(map: &EntryMap, by: UsageBy, today: Day) -> std::collections::BTreeMap<String, Usage> {
    let mut groups: std::collections::BTreeMap<String, Usage> = Default::default();
    for entry in map.iter() {
        let (key, result) = entry.views();
        let group = match by {
            UsageBy::Namespace => key.namespace,
            UsageBy::Device => key.device,
            UsageBy::Op => key.op,
        };
        let usage = match groups.get_mut(group) {
            Some(usage) => usage,
            None => groups.entry(group.to_owned()).or_default(),
        };
        usage.entries += 1;
        usage.entry_bytes += entry.record().len() as u64;
        usage.artifact_bytes += result
            .artifacts
            .iter()
            .map(|artifact| artifact.size)
            .sum::<u64>();
        let age = today.saturating_sub(entry_day(entry, today));
        usage.by_age[AgeBucket::of(age).index()] += 1;
    }
    groups
}

/// What `tunecache prune` expires: the entries of `namespace` and `device` (empty: any)
/// whose last use is more than `unused_for_days` before `today`. In key order.
pub fn plan_prune(
    map: &EntryMap,
    today: Day,
    unused_for_days: u32,
    namespace: &str,
    device: &str,
) -> Vec<StoredEntry> {
    let wanted = |entry: &&StoredEntry| {
        (namespace.is_empty() || entry.namespace() == namespace)
            && (device.is_empty() || entry.device() == device)
            && today.saturating_sub(entry_day(entry, today)) > unused_for_days
    };
    let entries: Box<dyn Iterator<Item = &StoredEntry>> = if namespace.is_empty() {
        Box::new(map.iter())
    } else {
        Box::new(
            map.range_from(std::ops::Bound::Included(
                crate::model::entry::KeyView::namespace_start(namespace),
            ))
            .take_while(|entry| entry.namespace() == namespace),
        )
    };
    entries.filter(wanted).cloned().collect()
}

/// How often the uses reads marked are journalled and told to the tiers: a crash loses at
/// most this much of them (a mark, not an acknowledged write).
pub const USE_FLUSH_INTERVAL: Duration = Duration::from_secs(60);
/// How often a sweep runs, besides at start and just after each day begins (UTC).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// The lifecycle's background task: journals marked uses every `flush_every`, sweeps every
/// `SWEEP_INTERVAL` and when the day changes, and journals the last marks at shutdown.
pub fn start_upkeep(store: Store, tasks: &Tasks) {
    let stopping = tasks.stop_token();
    tasks.spawn(async move {
        let mut swept_day = store.today();
        let mut next_sweep = tokio::time::Instant::now() + SWEEP_INTERVAL;
        loop {
            tokio::select! {
                () = stopping.cancelled() => break,
                () = tokio::time::sleep(store.lifecycle().flush_every) => {}
            }
            if let Err(error) = store.flush_uses().await {
                tracing::warn!(%error, "could not journal last uses; reads mark them again");
            }
            let today = store.today();
            if today != swept_day || tokio::time::Instant::now() >= next_sweep {
                swept_day = today;
                next_sweep = tokio::time::Instant::now() + SWEEP_INTERVAL;
                match store.sweep().await {
                    Ok(0) => {}
                    Ok(expired) => tracing::info!(expired, "expired entries no rank used"),
                    Err(error) => tracing::warn!(%error, "expiry sweep failed; retried later"),
                }
            }
        }
        let _ = store.flush_uses().await;
    });
}

impl Store {
    /// Sets how the store judges last use (the daemon's flags; a test's clock).
    pub fn set_lifecycle(&self, settings: LifecycleSettings) {
        self.shared.lifecycle.store(Arc::new(settings));
    }

    pub fn lifecycle(&self) -> Arc<LifecycleSettings> {
        self.shared.lifecycle.load_full()
    }

    /// Today, by the store's clock.
    pub fn today(&self) -> Day {
        self.shared.lifecycle.load().clock.today()
    }

    /// Marks `entries` used today: raises each one's last use, and queues those it raised
    /// for the writer (once per entry and day). Never waits on the writer or the disk.
    pub fn touch<'a>(&self, entries: impl IntoIterator<Item = &'a StoredEntry>) {
        let today = self.today();
        let raised: Vec<StoredEntry> = entries
            .into_iter()
            .filter(|entry| entry.raise_last_use(today))
            .cloned()
            .collect();
        if !raised.is_empty() {
            crate::sync::lock(&self.shared.pending_uses).extend(raised);
        }
    }

    /// Uses marked but not yet journalled.
    pub fn pending_uses(&self) -> usize {
        crate::sync::lock(&self.shared.pending_uses).len()
    }

    /// Has the writer journal the uses marked so far and tell the feed; returns how many.
    pub async fn flush_uses(&self) -> Result<usize> {
        let uses = std::mem::take(&mut *crate::sync::lock(&self.shared.pending_uses));
        if uses.is_empty() {
            return Ok(0);
        }
        let count = uses.len();
        let (reply, done) = oneshot::channel();
        self.writes
            .send(WriteCommand::Uses { uses, reply })
            .map_err(|_| Error::WriterGone)?;
        done.await.map_err(|_| Error::WriterGone)??;
        Ok(count)
    }

    /// Pauses sweeps (`Some(why)`: Stats `expiry_paused` says why) or lets them run again.
    /// The cluster tier pauses them while this node's clock is off from Redis's: a day
    /// judged by a wrong clock would expire, here and in Redis, what other nodes still use.
    pub fn set_expiry_paused(&self, why: Option<String>) {
        *crate::sync::lock(&self.shared.counters.expiry_paused) = why.unwrap_or_default();
    }

    /// Why sweeps are paused; `None` while they run.
    pub fn expiry_paused(&self) -> Option<String> {
        let why = crate::sync::lock(&self.shared.counters.expiry_paused);
        (!why.is_empty()).then(|| why.clone())
    }

    /// Expires what is unused now (`plan_expiry`), in batches the writer takes between
    /// writes. Returns the entries expired; none while paused (`set_expiry_paused`).
    pub async fn sweep(&self) -> Result<u64> {
        if self.expiry_paused().is_some() {
            return Ok(0);
        }
        let map = self.current();
        let settings = self.lifecycle();
        let today = settings.clock.today();
        if !settings.retention.expires_anything()
            && (settings.max_entries == 0 || map.len() as u64 <= settings.max_entries)
        {
            return Ok(0);
        }
        let planned = tokio::task::spawn_blocking(move || plan_expiry(&map, &settings, today));
        match planned.await {
            Ok(expiring) => self.expire(expiring).await,
            // Only a panic in the plan gets here; the next sweep plans again.
            Err(error) => {
                tracing::error!(%error, "planning the expiry sweep failed");
                Ok(0)
            }
        }
    }

    /// Has the writer drop `expiring`, in batches of `EXPIRY_BATCH`; returns how many went.
    pub async fn expire(&self, expiring: Vec<Expiring>) -> Result<u64> {
        let mut expired = 0;
        let bound = expiring.iter().filter(|e| e.why == Expiry::Bound).count();
        for batch in expiring.chunks(EXPIRY_BATCH) {
            let (reply, done) = oneshot::channel();
            self.writes
                .send(WriteCommand::Expire {
                    expiring: batch.to_vec(),
                    reply,
                })
                .map_err(|_| Error::WriterGone)?;
            expired += done.await.map_err(|_| Error::WriterGone)?;
        }
        if bound > 0 && self.shared.logged.first("max entries") {
            tracing::warn!(
                max_entries = self.lifecycle().max_entries,
                expired = bound,
                "the cache holds more than --max-entries: its least recently used entries \
                 expire early (logged once; Stats counts them in entries_expired_by_bound)"
            );
        }
        let counters = &self.shared.counters;
        counters
            .entries_expired_by_bound
            .fetch_add(bound.min(expired as usize) as u64, Ordering::Relaxed);
        Ok(expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::lifecycle::MS_PER_DAY;

    const DAY: Day = 20_000;

    fn entry(namespace: &str, problem: &str, last_use: Day) -> StoredEntry {
        let key = CacheKey {
            namespace: namespace.into(),
            op: "op".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        };
        let result = TunedResult {
            config: "{}".into(),
            time_us: 1.0,
            tuned_by: "t".into(),
            // Recorded long before any use.
            tuned_at_unix_ms: MS_PER_DAY,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        StoredEntry::new(&key, &result).with_last_use(last_use)
    }

    fn settings(retain: u32, max_entries: u64) -> LifecycleSettings {
        LifecycleSettings {
            retention: Retention::new(retain, [("forever".to_owned(), 0)]),
            max_entries,
            clock: Clock::manual(i64::from(DAY) * MS_PER_DAY),
            flush_every: USE_FLUSH_INTERVAL,
        }
    }

    fn problems(expiring: &[Expiring]) -> Vec<String> {
        expiring
            .iter()
            .map(|e| e.entry.key().problem.to_owned())
            .collect()
    }

    #[test]
    fn age_expires_what_is_older_than_its_namespace_keeps() {
        let mut map = EntryMap::new();
        map.insert(entry("ns", "old", DAY - 31));
        map.insert(entry("ns", "edge", DAY - 30));
        map.insert(entry("ns", "fresh", DAY));
        map.insert(entry("forever", "ancient", 1));
        let planned = plan_expiry(&map, &settings(30, 0), DAY);
        assert_eq!(problems(&planned), ["old"]);
        assert!(planned.iter().all(|e| e.why == Expiry::Age));
    }

    #[test]
    fn the_bound_keeps_exactly_the_most_recently_used() {
        let mut map = EntryMap::new();
        for i in 0..10u32 {
            map.insert(entry("ns", &format!("p{i}"), DAY - (i % 5)));
        }
        let planned = plan_expiry(&map, &settings(0, 4), DAY);
        assert_eq!(planned.len(), 6);
        assert!(planned.iter().all(|e| e.why == Expiry::Bound));
        let kept: Vec<_> = map
            .iter()
            .filter(|e| !planned.iter().any(|p| p.entry.same_entry(e)))
            .map(|e| e.last_use())
            .collect();
        // Two used today (p0, p5), two yesterday (p1, p6).
        assert_eq!(kept, [DAY, DAY - 1, DAY, DAY - 1]);
    }

    #[test]
    fn a_use_after_the_plan_saves_the_entry() {
        let mut map = EntryMap::new();
        let old = entry("ns", "old", DAY - 40);
        map.insert(old.clone());
        let planned = plan_expiry(&map, &settings(30, 0), DAY);
        assert!(still_expires(&map, &planned[0], DAY));
        old.raise_last_use(DAY);
        assert!(!still_expires(&map, &planned[0], DAY));
    }

    #[test]
    fn prune_takes_what_is_unused_for_longer_than_asked_in_its_scope() {
        let mut map = EntryMap::new();
        map.insert(entry("a", "old", DAY - 10));
        map.insert(entry("a", "new", DAY - 2));
        map.insert(entry("b", "old", DAY - 10));
        let problems_of = |pruned: Vec<StoredEntry>| -> Vec<String> {
            pruned
                .iter()
                .map(|e| format!("{}/{}", e.namespace(), e.key().problem))
                .collect()
        };
        assert_eq!(
            problems_of(plan_prune(&map, DAY, 5, "", "")),
            ["a/old", "b/old"]
        );
        assert_eq!(problems_of(plan_prune(&map, DAY, 5, "b", "")), ["b/old"]);
        assert_eq!(
            problems_of(plan_prune(&map, DAY, 1, "a", "dev")),
            ["a/new", "a/old"]
        );
        assert!(plan_prune(&map, DAY, 5, "a", "other").is_empty());
    }

    #[test]
    fn usage_groups_entries_and_their_ages() {
        let mut map = EntryMap::new();
        map.insert(entry("a", "1", DAY));
        map.insert(entry("a", "2", DAY - 10));
        map.insert(entry("b", "1", DAY - 100));
        let usage = usage(&map, UsageBy::Namespace, DAY);
        assert_eq!(usage["a"].entries, 2);
        assert_eq!(usage["a"].by_age, [1, 0, 1, 0, 0]);
        assert_eq!(usage["b"].by_age, [0, 0, 0, 0, 1]);
        assert!(usage["a"].entry_bytes > 0);
    }
}
