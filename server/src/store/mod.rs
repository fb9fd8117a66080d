//! The cache itself: a sorted in-memory map published as immutable versions, and the one
//! writer thread that owns every mutation and the journal.
//!
//! Readers (`Lookup`, `Scan`, snapshots) load the current version with one atomic pointer
//! read and never wait for the writer or its disk I/O. Writers send their batch to the
//! writer thread; it merges every batch that has queued up meanwhile into one new version,
//! appends the changes to the journal as one write (group commit), then publishes the
//! version and acknowledges. So an acknowledged Record is in the journal, and a batch is
//! applied whole or not at all.
//!
//! Beside the cache the store keeps this node's own contributions (`Origin::Own`: its ranks'
//! Records and its tuner's results, the best per key), which is what snapshots publish;
//! entries learned from other nodes (`Origin::Learned`) only enter the cache.
//!
//! The writer also owns Forgets (`model::forget`): it stamps them from its clock, keeps the
//! tombstones (all known, and this node's own, which it publishes), gives each Record the
//! epoch that makes it live after the Forgets it knows, and drops what a tombstone removes
//! on every path in, so no replica brings a forgotten entry back.
//!
//! Each entry carries the day its key was last used; reads mark it, the writer journals it,
//! and a sweep expires what no rank uses any more (`lifecycle`, docs/lifecycle.md).
//!
//! The parts: `admission` (the handle's write calls and the bounded write queue), `writer`
//! (the thread and its effects), `plan` (its rules, a pure step), `upkeep` (compaction,
//! repair, the journal's health), `open` (replay and start), `feed` (what the change feed
//! tells), `scan` (Scan's chunked reads), `lifecycle` (last uses and expiry) and `expiry` (its rules, pure). This file holds the shared state and the reads.

mod admission;
pub mod expiry;
mod feed;
pub mod lifecycle;
mod open;
mod plan;
pub(crate) mod scan;
mod upkeep;
mod writer;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;

use crate::journal::FsyncPolicy;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::tombstones::Tombstones;
pub use crate::wire::stored::{EntryMap, StoredEntry};

pub use admission::DEFAULT_WRITE_QUEUE_BYTES;
pub use expiry::{Expiring, Expiry, LifecycleSettings, Usage, UsageBy};
pub use feed::{Change, ChangeListener, ForgetChange, RecordLease, Source, UseChange};
pub use plan::ApplyOutcome;
use writer::WriteCommand;

/// Entries decoded into owned keys and results, in key order: what tests and tools build
/// snapshot segments from. The store itself keeps its entries in wire form (`EntryMap`).
#[cfg(any(test, feature = "test-support"))]
pub type CacheMap = imbl::OrdMap<CacheKey, TunedResult>;

/// Default of `--forget-retention-days`: how long a tombstone is kept (docs/forget.md).
pub const DEFAULT_FORGET_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

crate::report::stats_registry! {
    /// What the store and its journal writer counted, for Stats.
    #[derive(Default)]
    pub struct StoreCounters {
        pub journal_bytes: AtomicU64 => gauge(46, "Size of the journal."),
        pub journal_live_bytes: AtomicU64
            => gauge(47, "Journal bytes still needed by live entries."),
        pub journal_compactions: AtomicU64 => counter(14, "Journal compactions."),
        /// Compactions and repair rewrites of the journal that failed (each cause logged once).
        pub journal_compaction_failures: AtomicU64
            => counter(15, "Journal compactions and repair rewrites that failed."),
        /// Appends or syncs that failed; the Records in them were refused.
        pub journal_write_failures: AtomicU64
            => counter(16, "Journal appends or syncs that failed; their Records were refused."),
        /// Times the journal stopped taking appends until repaired.
        pub journal_unwritable_episodes: AtomicU64 => not_exported,
        /// Why the journal refuses appends right now; empty while it takes them.
        pub journal_unwritable: Mutex<String> => signed_gauge(
            17,
            "1 while the journal refuses Records until it is repaired.",
            via |why: &String| i64::from(!why.is_empty()),
        ),
        /// Since when (unix ms) the journal refuses appends; 0 while it takes them.
        pub journal_unwritable_since_unix_ms: AtomicI64 => not_exported,
        /// Records refused because the write queue was full.
        pub writes_shed: AtomicU64
            => counter(35, "Records refused: the journal writer's queue was full."),
        /// Forgets applied (asked here or learned), entries they dropped, tombstones held now.
        pub forgets_received: AtomicU64
            => counter(71, "Forgets applied: asked of this node, or learned from other nodes."),
        pub forget_entries_dropped: AtomicU64
            => counter(72, "Entries removed from this node's cache by Forgets."),
        pub tombstones_held: AtomicU64
            => gauge(74, "Forgets kept so that no replica brings their entries back."),
        /// Entries and tombstones from other nodes too big for a journal frame of their own
        /// (`journal::MAX_RECORD_BYTES`): dropped before the writer, each logged once per source.
        pub oversize_records_dropped: AtomicU64 => counter(
            79,
            "Entries and tombstones from other nodes too big for a journal frame, dropped.",
        ),
        /// Last uses journalled (`lifecycle`): at most one per entry and day per source, so
        /// they grow with the distinct entries used, never with the reads.
        pub last_use_updates_written: AtomicU64
            => counter(143, "Last uses of entries written to the journal."),
        /// Entries expired: unused past their retention, or past --max-entries.
        pub entries_expired: AtomicU64
            => counter(144, "Entries expired: unused past their retention, or past --max-entries."),
        /// Of `entries_expired`, those past --max-entries.
        pub entries_expired_by_bound: AtomicU64
            => counter(145, "Entries expired early because the cache held more than --max-entries."),
        /// Entries from other nodes already expired when they arrived, dropped.
        pub entries_expired_on_arrival: AtomicU64
            => counter(146, "Entries from other nodes already expired when they arrived."),
        /// Why no sweep expires anything now (the cluster tier found this node's clock off
        /// from Redis's); empty while expiry runs (`Store::set_expiry_paused`).
        pub expiry_paused: Mutex<String> => not_exported,
    }
}

struct Shared {
    map: ArcSwap<EntryMap>,
    /// This node's own contributions, best per key (a subset of the history of `map`; an
    /// entry in both is one allocation).
    own: ArcSwap<EntryMap>,
    counters: StoreCounters,
    /// Told about changed entries, in the order they were added (the coordinator's waiters,
    /// the cluster tier's publish feed).
    listeners: std::sync::RwLock<Vec<Arc<dyn ChangeListener>>>,
    fsync: FsyncPolicy,
    /// Room in the write queue, in `QUEUE_UNIT_BYTES` units: what bounds the memory held
    /// by writes waiting for the writer (and its disk).
    queue_room: Arc<Semaphore>,
    queue_units: u32,
    logged: crate::report::LogOnce,
    /// Every tombstone this node knows, and those it made itself (what it publishes).
    tombstones: ArcSwap<Tombstones>,
    own_tombstones: ArcSwap<Tombstones>,
    /// `--forget-retention-days`, in milliseconds.
    forget_retention_ms: AtomicI64,
    /// How last use is judged (`lifecycle`).
    lifecycle: ArcSwap<LifecycleSettings>,
    /// Entries whose last use a read raised, not yet journalled (`Store::touch`).
    pending_uses: Mutex<Vec<StoredEntry>>,
    /// When, and what, the last sweep counted per namespace (`Store::namespace_usage`).
    namespace_usage: ArcSwap<(i64, std::collections::BTreeMap<String, Usage>)>,
}

/// Cheap, cloneable handle to the cache.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    writes: mpsc::Sender<WriteCommand>,
}

/// Owns the writer thread. Dropping it (or calling `shutdown`) stops accepting writes,
/// lets the writer finish what is queued, syncs the journal and joins the thread.
pub struct StoreGuard {
    store: Option<Store>,
    writer: Option<JoinHandle<()>>,
}

impl Store {
    /// Adds a listener told about changed entries, after those added before it.
    pub fn add_change_listener(&self, listener: Arc<dyn ChangeListener>) {
        crate::sync::write(&self.shared.listeners).push(listener);
    }

    /// The current version of the whole cache, for scans and snapshots.
    pub fn current(&self) -> Arc<EntryMap> {
        self.shared.map.load_full()
    }

    /// Every tombstone this node knows.
    pub fn tombstones(&self) -> Arc<Tombstones> {
        self.shared.tombstones.load_full()
    }

    /// The tombstones of Forgets asked of this node: what it publishes.
    pub fn own_tombstones(&self) -> Arc<Tombstones> {
        self.shared.own_tombstones.load_full()
    }

    /// How long tombstones are kept, in milliseconds (`--forget-retention-days`).
    pub fn forget_retention_ms(&self) -> i64 {
        self.shared.forget_retention_ms.load(Ordering::Relaxed)
    }

    /// Sets how long tombstones are kept (`--forget-retention-days`).
    pub fn set_forget_retention(&self, retention: Duration) {
        let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        self.shared.forget_retention_ms.store(ms, Ordering::Relaxed);
    }

    /// The current version of this node's own contributions (best per key): what it
    /// publishes to the shared directory.
    pub fn own_contributions(&self) -> Arc<EntryMap> {
        self.shared.own.load_full()
    }

    pub fn get(&self, key: &CacheKey) -> Option<TunedResult> {
        self.shared
            .map
            .load()
            .get(key)
            .map(|entry| entry.result().to_result())
    }

    pub fn len(&self) -> usize {
        self.shared.map.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn counters(&self) -> &StoreCounters {
        &self.shared.counters
    }

    pub fn fsync_policy(&self) -> FsyncPolicy {
        self.shared.fsync
    }
}

crate::report::stats_registry! {
    /// The store's Stats fields: the cache size, the journal writer and its queue.
    impl FillStats for Store {
        fn fill_stats(store, stats) {}
        include StoreCounters = store.shared.counters;
        fields {
            entries = store.len() as u64 => gauge(42, "Entries in the cache."),
            fsync_policy = store.fsync_policy().as_str().to_owned() => not_exported,
            write_queue_bytes = store.write_queue_bytes()
                => gauge(39, "Bytes of Records waiting for the journal writer."),
            write_queue_limit_bytes = store.write_queue_limit_bytes() => not_exported,
            namespace_usage = expiry::usage_groups(&store.namespace_usage().1)
                => gauge_family(
                    151,
                    "Entries of each namespace by the age of their last use (as of the last sweep).",
                    named "namespace_entries",
                    via expiry::entries_by_namespace_and_age,
                ),
            // Its row is the bytes per namespace, read from `namespace_usage` beside it.
            namespace_usage_at_unix_ms = store.namespace_usage().0
                => gauge_family(
                    152,
                    "Bytes of each namespace's entries and of the artifacts they name (as of the last sweep).",
                    named "namespace_bytes",
                    via expiry::bytes_by_namespace,
                ),
        }
    }
}

impl StoreGuard {
    pub fn store(&self) -> Store {
        // The store is only taken out in shutdown, which consumes the guard.
        self.store.clone().expect("store present until shutdown")
    }

    /// Stops the writer after it has drained queued writes, and syncs the journal.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(store) = self.store.take() {
            let _ = store.writes.send(WriteCommand::Stop);
        }
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Drop for StoreGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::FsyncPolicy;
    use crate::model::forget::{ForgetAsk, ForgetScope};
    use crate::model::testing;

    /// Keeps what the feed told it.
    #[derive(Default)]
    struct Told(Mutex<Vec<(String, Source, bool, bool)>>);

    impl ChangeListener for Told {
        fn entries_changed(&self, changes: &[Change]) {
            let mut told = crate::sync::lock(&self.0);
            for change in changes {
                let problem = change.entry.key().to_key().problem;
                told.push((problem, change.source.clone(), change.in_cache, change.own));
            }
        }
    }

    fn pair(problem: &str, time_us: f64) -> (CacheKey, TunedResult) {
        (testing::key(problem), testing::result(time_us))
    }

    fn scope_of(op: &str) -> ForgetScope {
        ForgetScope {
            namespace: "ns".into(),
            op: op.into(),
            device: String::new(),
            problem: String::new(),
            rank: crate::model::forget::RankScope::Every,
        }
    }

    #[tokio::test]
    async fn a_forget_drops_what_it_covers_for_good_and_what_is_recorded_after_it_lives() {
        let dir = tempfile::tempdir().unwrap();
        let (bogus_key, bogus) = pair("a", 0.0);
        {
            let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
            let store = guard.store();
            store
                .try_apply(
                    vec![pair("a", 41.5), (bogus_key.clone(), bogus.clone())],
                    None,
                )
                .await
                .unwrap();
            store.try_apply(vec![pair("b", 3.0)], None).await.unwrap();
            let ask = ForgetAsk {
                scope: ForgetScope::exact(&bogus_key),
                only_if: Some(("{}".into(), 41.5)),
            };
            assert_eq!(
                store.forget(ask).await.unwrap(),
                0,
                "only_if no longer the winner"
            );
            let ask = ForgetAsk {
                scope: scope_of("op"),
                only_if: None,
            };
            assert_eq!(store.forget(ask).await.unwrap(), 2);
            assert!(store.is_empty());
            // The old result arriving from another node is dropped; a new Record lives,
            // though slower than what was forgotten.
            store
                .apply_learned(vec![(bogus_key.clone(), bogus.clone())], Source::Cluster)
                .await
                .unwrap();
            assert!(store.get(&bogus_key).is_none());
            store.try_apply(vec![pair("a", 50.0)], None).await.unwrap();
            let live = store.get(&bogus_key).unwrap();
            assert_eq!(live.time_us, 50.0);
            assert!(live.forget_epoch > 0);
            assert_eq!(store.tombstones().len(), 1);
            assert_eq!(store.own_tombstones().len(), 1);
        }
        // After a restart: the journal's tombstone still drops what it covered, and the
        // result recorded after the Forget is still live.
        let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
        let store = guard.store();
        assert_eq!(store.get(&bogus_key).unwrap().time_us, 50.0);
        assert!(store.get(&pair("b", 0.0).0).is_none());
        assert_eq!(store.tombstones().len(), 1);
        assert_eq!(store.counters().tombstones_held.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_restart_brings_back_the_cache_and_the_own_contributions_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = pair("a", 0.0);
        {
            let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
            let store = guard.store();
            store.try_apply(vec![pair("a", 4.0)], None).await.unwrap();
            // Learned and better: the cache's winner; the own 4.0 stays a contribution.
            store
                .apply_learned(vec![pair("a", 1.0)], Source::Cluster)
                .await
                .unwrap();
            store
                .apply_learned(vec![pair("b", 2.0)], Source::Cluster)
                .await
                .unwrap();
        }
        let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
        let store = guard.store();
        assert_eq!(store.get(&a).unwrap().time_us, 1.0);
        let own = store.own_contributions();
        assert_eq!(own.len(), 1, "learned entries are not own");
        assert_eq!(own.get(&a).unwrap().result().to_result().time_us, 4.0);
        assert_eq!(store.len(), 2);
    }

    #[tokio::test]
    async fn a_restart_counts_the_live_bytes_and_stamps_forgets_past_every_epoch_held() {
        let dir = tempfile::tempdir().unwrap();
        let exact = |problem: &str| ForgetAsk {
            scope: ForgetScope::exact(&pair(problem, 0.0).0),
            only_if: None,
        };
        {
            let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
            let store = guard.store();
            // Replaced results, a learned winner over an own one, a forgotten key, and a
            // result recorded after a Forget (so it carries an epoch).
            store.try_apply(vec![pair("a", 4.0)], None).await.unwrap();
            store.try_apply(vec![pair("a", 3.0)], None).await.unwrap();
            store
                .apply_learned(vec![pair("a", 1.0), pair("b", 2.0)], Source::Cluster)
                .await
                .unwrap();
            store.try_apply(vec![pair("c", 5.0)], None).await.unwrap();
            store.forget(exact("c")).await.unwrap();
            store.try_apply(vec![pair("d", 6.0)], None).await.unwrap();
            store.forget(exact("d")).await.unwrap();
            store.try_apply(vec![pair("d", 7.0)], None).await.unwrap();
            assert!(store.get(&pair("d", 0.0).0).unwrap().forget_epoch > 0);
            // From a node whose clock runs an hour ahead (within what is accepted): its epoch
            // is above every tombstone this journal holds, and above this node's clock.
            let (key, mut result) = pair("e", 8.0);
            let hour_ahead = crate::model::entry::unix_now_ms() + 3_600_000;
            result.forget_epoch = (hour_ahead as u64) << 16;
            store
                .apply_learned(vec![(key, result)], Source::Cluster)
                .await
                .unwrap();
        }
        let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
        let store = guard.store();
        assert_eq!(store.len(), 4, "a, b, d and e; c forgotten");
        // What a walk of the cache counts: the replay kept it as entries went in.
        let walked = store
            .current()
            .iter()
            .map(|entry| entry.encoded_len_estimate() as u64)
            .sum::<u64>()
            + store.tombstones().encoded_len_estimate() as u64;
        assert_eq!(
            store.counters().journal_live_bytes.load(Ordering::Relaxed),
            walked
        );
        // The clock starts past the highest epoch replayed: a Forget now drops e's result.
        assert_eq!(store.forget(exact("e")).await.unwrap(), 1);
        assert!(store.get(&pair("e", 0.0).0).is_none());
    }

    fn lease(id: &str) -> RecordLease {
        RecordLease {
            id: id.to_owned(),
            key: Some(pair("a", 0.0).0),
            view: Some(crate::model::names::ViewId {
                uid: 1000,
                name: "job-1".to_owned(),
            }),
        }
    }

    #[tokio::test]
    async fn the_change_feed_says_where_each_change_came_from_and_what_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
        let store = guard.store();
        let told = Arc::new(Told::default());
        store.add_change_listener(told.clone());

        store
            .try_apply(vec![pair("a", 5.0)], Some(lease("lease-1")))
            .await
            .unwrap();
        store
            .apply(vec![pair("b", 5.0)], Source::Tuner)
            .await
            .unwrap();
        // Learned from the cluster and better than b: the cache changes, not the own part.
        store
            .apply_learned(vec![pair("b", 1.0)], Source::Cluster)
            .await
            .unwrap();
        // This node's own b improves (4 < 5) but does not beat the cache's 1: own only.
        store.try_apply(vec![pair("b", 4.0)], None).await.unwrap();
        // Nothing better: nothing told.
        store.try_apply(vec![pair("a", 9.0)], None).await.unwrap();

        let record = |id: Option<&str>| Source::Record {
            lease: id.map(|id| Arc::new(lease(id))),
        };
        let told = crate::sync::lock(&told.0).clone();
        assert_eq!(
            told,
            vec![
                ("a".into(), record(Some("lease-1")), true, true),
                ("b".into(), Source::Tuner, true, true),
                ("b".into(), Source::Cluster, true, false),
                ("b".into(), record(None), false, true),
            ]
        );
    }
}
