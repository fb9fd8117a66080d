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

pub(crate) mod scan;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::journal::{FsyncPolicy, Journal, ReplayReport, BATCH_SYNC_INTERVAL};
use crate::model::entry::{CacheKey, KeyView, Origin, ResultView, TunedResult};
use crate::model::forget::{ForgetAsk, ForgetClock, Tombstone, Tombstones};
use crate::model::merge::{merge_views, MergeOutcome};
pub use crate::wire::stored::{EntryMap, StoredEntry};

/// Entries decoded into owned keys and results, in key order: what tests and tools build
/// snapshot segments from. The store itself keeps its entries in wire form (`EntryMap`).
#[cfg(any(test, feature = "test-support"))]
pub type CacheMap = imbl::OrdMap<CacheKey, TunedResult>;

/// Compaction waits until the journal is at least this big, so small caches never churn.
const MIN_COMPACT_BYTES: u64 = 1024 * 1024;
/// After a failed compaction, wait this long before the first retry, doubling on each
/// further failure up to `COMPACT_RETRY_MAX`.
const COMPACT_RETRY_MIN: Duration = Duration::from_secs(1);
const COMPACT_RETRY_MAX: Duration = Duration::from_secs(60);
/// While the journal refuses appends, try to repair it (rewrite from memory) this often.
const REPAIR_RETRY: Duration = Duration::from_secs(1);
/// Entry bytes written in a burst after which the writer, once idle, hands freed heap pages
/// back (`heap`): a burst's decoded requests leave that much garbage in the allocator.
const TRIM_AFTER_BYTES: u64 = 8 * 1024 * 1024;
/// Default of `--forget-retention-days`: how long a tombstone is kept (docs/forget.md).
pub const DEFAULT_FORGET_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long the writer must have been idle after such a burst before it trims.
const IDLE_BEFORE_TRIM: Duration = Duration::from_millis(200);
/// Most write requests merged into one group commit.
const MAX_GROUP: usize = 1024;
/// Default bound on Records waiting for the writer (`--write-queue-mib`).
pub const DEFAULT_WRITE_QUEUE_BYTES: u64 = 256 * 1024 * 1024;
/// The write queue is accounted in units of this many bytes (a semaphore's permits).
const QUEUE_UNIT_BYTES: u64 = 1024;
/// Memory a queued entry takes beyond its encoded size (string and vector headers).
const QUEUED_ENTRY_OVERHEAD: u64 = 128;

/// Told, on the writer thread, about every entry that changed, after it is durable and
/// visible to readers, and before the writes that made the changes are answered. Its
/// subscribers: the coordinator (wakes callers waiting for a key), the cluster tier (publishes
/// what it did not bring itself), the snapshot writer (publishes this node's contributions).
pub trait ChangeListener: Send + Sync {
    fn entries_changed(&self, changes: &[Change]);

    /// Tombstones this node learned or made, after they are durable and their entries are
    /// gone from what readers see.
    fn forgotten(&self, _forgets: &[ForgetChange]) {}
}

/// A tombstone new to this node, as the feed tells it.
#[derive(Clone, Debug)]
pub struct ForgetChange {
    pub tombstone: Tombstone,
    /// `Source::Forget` when asked of this node (it publishes those), else where it came from.
    pub source: Source,
    /// Entries it removed from this node's cache.
    pub dropped: u32,
}

/// Where a change came from: the feed's subscribers filter on it, instead of keeping their
/// own records of what they wrote.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A rank's Record, with the lease it was tuned under, if any.
    Record { lease: Option<Arc<RecordLease>> },
    /// The node's tuner worker.
    Tuner,
    /// A segment read from the shared directory.
    Snapshot,
    /// The Redis cluster tier.
    Cluster,
    /// A Forget asked of this node (the Forget RPC).
    Forget,
}

/// The lease a Record was tuned under, as the coordinator knew it when the Record arrived:
/// its id and, while this node held it, the key it was granted for and the job view of the
/// Resolve it was granted to (`views` pins the holder's result there).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordLease {
    pub id: String,
    pub key: Option<CacheKey>,
    pub view: Option<crate::model::names::ViewId>,
}

/// One changed entry, as the feed tells it.
#[derive(Clone, Debug)]
pub struct Change {
    pub entry: StoredEntry,
    pub source: Source,
    /// The cache's winner for the key is now `entry`: readers see it.
    pub in_cache: bool,
    /// This node's own contributions (what it publishes) now hold `entry`.
    pub own: bool,
}

/// One entry of a write. Decoded entries (a Record, the tuner, the cluster tier) are encoded
/// by the writer only when they win; entries read from the shared directory arrive already
/// in stored form, so a load holds each entry once (the allocation the cache keeps), never a
/// decoded copy beside it.
enum Incoming {
    Decoded(CacheKey, TunedResult),
    Stored(StoredEntry),
}

impl Incoming {
    fn views(&self) -> (KeyView<'_>, ResultView<'_>) {
        match self {
            Incoming::Decoded(key, result) => (key.view(), result.view()),
            Incoming::Stored(entry) => entry.views(),
        }
    }

    fn set_forget_epoch(&mut self, epoch: u64) {
        match self {
            Incoming::Decoded(_, result) => result.forget_epoch = epoch,
            Incoming::Stored(entry) => {
                let (key, result) = entry.to_pair();
                *self = Incoming::Decoded(
                    key,
                    TunedResult {
                        forget_epoch: epoch,
                        ..result
                    },
                );
            }
        }
    }

    fn into_stored(self) -> StoredEntry {
        match self {
            Incoming::Decoded(key, result) => StoredEntry::new(&key, &result),
            Incoming::Stored(entry) => entry,
        }
    }
}

fn decoded(entries: Vec<(CacheKey, TunedResult)>) -> Vec<Incoming> {
    entries
        .into_iter()
        .map(|(key, result)| Incoming::Decoded(key, result))
        .collect()
}

/// Counts of a batch applied through the merge rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Entries that were new or beat the stored result.
    pub stored: u32,
    /// Entries that did not beat the stored result; nothing was written for them.
    pub unchanged: u32,
}

enum ForgetCommand {
    Ask(ForgetAsk),
    Learned(Vec<Tombstone>, Source, Origin),
}

enum WriteCommand {
    Apply {
        entries: Vec<Incoming>,
        origin: Origin,
        source: Source,
        reply: oneshot::Sender<Result<ApplyOutcome>>,
        /// This request's share of the write queue, given back when the writer takes it.
        _queued: OwnedSemaphorePermit,
    },
    /// A Forget asked here, or tombstones learned from other nodes.
    Forget {
        forget: ForgetCommand,
        reply: oneshot::Sender<Result<u32>>,
    },
    /// Finish what is queued before this, then sync the journal (`Store::sync_journal`).
    Sync { reply: oneshot::Sender<Result<()>> },
    /// Finish what is queued before this, sync, and stop. Handles still held elsewhere
    /// (by connections that outlive the shutdown) then get `WriterGone`.
    Stop,
}

#[derive(Default)]
pub struct StoreCounters {
    pub journal_bytes: AtomicU64,
    pub journal_live_bytes: AtomicU64,
    pub journal_compactions: AtomicU64,
    /// Compactions and repair rewrites of the journal that failed (each cause logged once).
    pub journal_compaction_failures: AtomicU64,
    /// Appends or syncs that failed; the Records in them were refused.
    pub journal_write_failures: AtomicU64,
    /// Times the journal stopped taking appends until repaired.
    pub journal_unwritable_episodes: AtomicU64,
    /// Why the journal refuses appends right now; empty while it takes them.
    pub journal_unwritable: Mutex<String>,
    /// Since when (unix ms) the journal refuses appends; 0 while it takes them.
    pub journal_unwritable_since_unix_ms: AtomicI64,
    /// Records refused because the write queue was full.
    pub writes_shed: AtomicU64,
    /// Forgets applied (asked here or learned), entries they dropped, tombstones held now.
    pub forgets_received: AtomicU64,
    pub forget_entries_dropped: AtomicU64,
    pub tombstones_held: AtomicU64,
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
    shed_logged: crate::report::LogOnce,
    /// Every tombstone this node knows, and those it made itself (what it publishes).
    tombstones: ArcSwap<Tombstones>,
    own_tombstones: ArcSwap<Tombstones>,
    /// `--forget-retention-days`, in milliseconds.
    forget_retention_ms: AtomicI64,
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
    /// Opens the store in `state_dir`: replays the journal (blocking; call it off the async
    /// runtime) and starts the writer thread.
    pub fn open(
        state_dir: &std::path::Path,
        fsync: FsyncPolicy,
    ) -> Result<(StoreGuard, ReplayReport)> {
        Store::open_with_queue(state_dir, fsync, DEFAULT_WRITE_QUEUE_BYTES)
    }

    /// `open`, with at most `queue_bytes` of writes waiting for the writer.
    pub fn open_with_queue(
        state_dir: &std::path::Path,
        fsync: FsyncPolicy,
        queue_bytes: u64,
    ) -> Result<(StoreGuard, ReplayReport)> {
        let queue_units = u32::try_from(queue_bytes.div_ceil(QUEUE_UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        let mut map = EntryMap::new();
        let mut own = EntryMap::new();
        let (mut journal, mut report) = Journal::open(state_dir, fsync, |key, result, origin| {
            let incoming = result.view();
            let own_replace = origin == Origin::Own
                && merge_views(own.get(&key).map(StoredEntry::result), incoming)
                    == MergeOutcome::Replace;
            let replace = merge_views(map.get(&key).map(StoredEntry::result), incoming)
                == MergeOutcome::Replace;
            if own_replace || replace {
                let entry = StoredEntry::new(&key, &result);
                if own_replace {
                    own.insert(entry.clone());
                }
                if replace {
                    map.insert(entry);
                }
            }
        })?;
        let mut clock = ForgetClock::default();
        let mut tombstones = Tombstones::default();
        let mut own_tombstones = Tombstones::default();
        for (tombstone, origin) in std::mem::take(&mut report.tombstones) {
            clock.observe(tombstone.stamp);
            if origin == Origin::Own {
                own_tombstones.insert(tombstone.clone());
            }
            tombstones.insert(tombstone);
        }
        for tombstone in tombstones.iter() {
            map.remove_dropped_by(&tombstone);
            own.remove_dropped_by(&tombstone);
        }
        for entry in map.iter().chain(own.iter()) {
            clock.observe(entry.result().forget_epoch);
        }
        if !report.skipped.is_empty() {
            // Damage was skipped: write the journal clean so it is not met again. Best effort
            // (a full disk must not stop the start): the writer retries, and appends after the
            // damage are safe meanwhile, as replay skips it.
            let held = held_tombstones(&tombstones, &own_tombstones);
            if let Err(error) = journal.rewrite(live_entries(&map, &own), &held) {
                tracing::warn!(
                    %error,
                    "journal: could not rewrite the damaged journal clean; will retry"
                );
            }
        }
        let live_bytes = map
            .iter()
            .map(|entry| entry.encoded_len_estimate() as u64)
            .sum();
        let shared = Arc::new(Shared {
            map: ArcSwap::from_pointee(map),
            own: ArcSwap::from_pointee(own),
            counters: StoreCounters::default(),
            listeners: Default::default(),
            fsync,
            queue_room: Arc::new(Semaphore::new(queue_units as usize)),
            queue_units,
            shed_logged: Default::default(),
            tombstones: ArcSwap::from_pointee(tombstones),
            own_tombstones: ArcSwap::from_pointee(own_tombstones),
            forget_retention_ms: AtomicI64::new(DEFAULT_FORGET_RETENTION.as_millis() as i64),
        });
        shared
            .counters
            .tombstones_held
            .store(shared.tombstones.load().len() as u64, Ordering::Relaxed);
        shared
            .counters
            .journal_bytes
            .store(journal.len(), Ordering::Relaxed);
        shared
            .counters
            .journal_live_bytes
            .store(live_bytes, Ordering::Relaxed);

        let (writes, commands) = mpsc::channel();
        let writer_shared = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("tunecache-writer".into())
            .spawn(move || run_writer(journal, commands, writer_shared, clock))
            .map_err(|e| Error::io("starting the writer thread", state_dir, e))?;
        let store = Store { shared, writes };
        Ok((
            StoreGuard {
                store: Some(store),
                writer: Some(writer),
            },
            report,
        ))
    }

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

    /// Sets how long tombstones are kept (`--forget-retention-days`).
    /// How long tombstones are kept, in milliseconds (`--forget-retention-days`).
    pub fn forget_retention_ms(&self) -> i64 {
        self.shared.forget_retention_ms.load(Ordering::Relaxed)
    }

    pub fn set_forget_retention(&self, retention: Duration) {
        let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        self.shared.forget_retention_ms.store(ms, Ordering::Relaxed);
    }

    /// Applies a Forget asked of this node: stamps it, drops what it covers, journals its
    /// tombstone and tells the feed. Answers the entries dropped from the cache (0, and no
    /// tombstone, when `only_if` no longer matches the winner).
    pub async fn forget(&self, ask: ForgetAsk) -> Result<u32> {
        self.send_forget(ForgetCommand::Ask(ask)).await
    }

    /// Applies tombstones read from elsewhere (`source`: Snapshot or Cluster): other nodes'
    /// (`Origin::Learned`), or this node's own read back from its segments.
    pub async fn apply_tombstones(
        &self,
        tombstones: Vec<Tombstone>,
        source: Source,
        origin: Origin,
    ) -> Result<u32> {
        if tombstones.is_empty() {
            return Ok(0);
        }
        self.send_forget(ForgetCommand::Learned(tombstones, source, origin))
            .await
    }

    /// Returns once everything written before the call is in the journal and synced to disk
    /// as `--fsync` promises (nothing more under `never`): what a part that records a claim
    /// about the cache beside the journal (the cluster tier's stream places) waits for, so
    /// that the claim never covers more than the journal holds.
    pub async fn sync_journal(&self) -> Result<()> {
        let (reply, outcome) = oneshot::channel();
        self.writes
            .send(WriteCommand::Sync { reply })
            .map_err(|_| Error::WriterGone)?;
        outcome.await.map_err(|_| Error::WriterGone)?
    }

    async fn send_forget(&self, forget: ForgetCommand) -> Result<u32> {
        let (reply, outcome) = oneshot::channel();
        self.writes
            .send(WriteCommand::Forget { forget, reply })
            .map_err(|_| Error::WriterGone)?;
        outcome.await.map_err(|_| Error::WriterGone)?
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

    /// Merges this node's own contributions into the cache through the merge rule and
    /// returns once the changes are in the journal and visible. All or nothing. Waits for room
    /// in the write queue: for the daemon's own writers (the tuner), which have no caller to
    /// retry.
    pub async fn apply(
        &self,
        entries: Vec<(CacheKey, TunedResult)>,
        source: Source,
    ) -> Result<ApplyOutcome> {
        self.apply_from(decoded(entries), Origin::Own, source).await
    }

    /// Like `apply`, for entries learned from other nodes (the cluster tier): they enter
    /// the cache but are not this node's contributions, so it never republishes them.
    pub async fn apply_learned(
        &self,
        entries: Vec<(CacheKey, TunedResult)>,
        source: Source,
    ) -> Result<ApplyOutcome> {
        self.apply_from(decoded(entries), Origin::Learned, source)
            .await
    }

    /// Merges entries already in stored form (read from the shared directory) with the
    /// given provenance, waiting for room in the write queue.
    pub async fn apply_stored(
        &self,
        entries: Vec<StoredEntry>,
        origin: Origin,
    ) -> Result<ApplyOutcome> {
        let entries = entries.into_iter().map(Incoming::Stored).collect();
        self.apply_from(entries, origin, Source::Snapshot).await
    }

    /// Merges `entries` with the given provenance, waiting for room in the write queue.
    async fn apply_from(
        &self,
        entries: Vec<Incoming>,
        origin: Origin,
        source: Source,
    ) -> Result<ApplyOutcome> {
        let units = self.queue_units_for(&entries);
        let queued = Arc::clone(&self.shared.queue_room)
            .acquire_many_owned(units)
            .await
            .map_err(|_| Error::WriterGone)?;
        self.send(entries, origin, source, queued).await
    }

    /// `apply` for callers (Record: this node's own contributions): when the write queue is
    /// full (the disk is slower than the callers) it answers `WriteQueueFull` at once instead
    /// of growing.
    /// `lease` is the lease the Record completes, which the change feed reports with it.
    pub async fn try_apply(
        &self,
        entries: Vec<(CacheKey, TunedResult)>,
        lease: Option<RecordLease>,
    ) -> Result<ApplyOutcome> {
        let entries = decoded(entries);
        let units = self.queue_units_for(&entries);
        let Ok(queued) = Arc::clone(&self.shared.queue_room).try_acquire_many_owned(units) else {
            return Err(self.shed());
        };
        let source = Source::Record {
            lease: lease.map(Arc::new),
        };
        self.send(entries, Origin::Own, source, queued).await
    }

    async fn send(
        &self,
        entries: Vec<Incoming>,
        origin: Origin,
        source: Source,
        queued: OwnedSemaphorePermit,
    ) -> Result<ApplyOutcome> {
        let (reply, outcome) = oneshot::channel();
        self.writes
            .send(WriteCommand::Apply {
                entries,
                origin,
                source,
                reply,
                _queued: queued,
            })
            .map_err(|_| Error::WriterGone)?;
        outcome.await.map_err(|_| Error::WriterGone)?
    }

    /// The queue units a write takes: its estimated memory, at least one unit, at most the
    /// whole queue (so a batch bigger than the queue still goes through an empty one).
    fn queue_units_for(&self, entries: &[Incoming]) -> u32 {
        let bytes: u64 = entries
            .iter()
            .map(|incoming| {
                let (key, result) = incoming.views();
                (key.encoded_len_estimate() + result.encoded_len_estimate()) as u64
                    + QUEUED_ENTRY_OVERHEAD
            })
            .sum();
        u32::try_from(bytes.div_ceil(QUEUE_UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, self.shared.queue_units)
    }

    fn shed(&self) -> Error {
        let limit_mib = self.write_queue_limit_bytes() / (1024 * 1024);
        let counters = &self.shared.counters;
        counters.writes_shed.fetch_add(1, Ordering::Relaxed);
        if self.shared.shed_logged.first("write queue full") {
            tracing::warn!(
                queued_bytes = self.write_queue_bytes(),
                limit_mib,
                "refused a Record: the journal writer's queue is full (--write-queue-mib; \
                 logged once; Stats counts each as writes_shed)"
            );
        }
        Error::WriteQueueFull { limit_mib }
    }

    /// Bytes of writes waiting for the writer now (in queue units, rounded up).
    pub fn write_queue_bytes(&self) -> u64 {
        let room = self.shared.queue_room.available_permits() as u64;
        (u64::from(self.shared.queue_units).saturating_sub(room)) * QUEUE_UNIT_BYTES
    }

    pub fn write_queue_limit_bytes(&self) -> u64 {
        u64::from(self.shared.queue_units) * QUEUE_UNIT_BYTES
    }
}

/// The store's Stats fields: the cache size, the journal writer and its queue.
impl crate::report::FillStats for Store {
    fn fill_stats(&self, stats: &mut tunecache_proto::v1::StatsResponse) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.shared.counters;
        stats.entries = self.len() as u64;
        stats.journal_bytes = load(&counters.journal_bytes);
        stats.journal_live_bytes = load(&counters.journal_live_bytes);
        stats.journal_compactions = load(&counters.journal_compactions);
        stats.journal_compaction_failures = load(&counters.journal_compaction_failures);
        stats.journal_write_failures = load(&counters.journal_write_failures);
        stats.journal_unwritable_episodes = load(&counters.journal_unwritable_episodes);
        stats.journal_unwritable = crate::sync::lock(&counters.journal_unwritable).clone();
        stats.journal_unwritable_since_unix_ms = counters
            .journal_unwritable_since_unix_ms
            .load(Ordering::Relaxed);
        stats.fsync_policy = self.fsync_policy().as_str().to_owned();
        stats.write_queue_bytes = self.write_queue_bytes();
        stats.write_queue_limit_bytes = self.write_queue_limit_bytes();
        stats.writes_shed = load(&counters.writes_shed);
        stats.forgets_received = load(&counters.forgets_received);
        stats.forget_entries_dropped = load(&counters.forget_entries_dropped);
        stats.tombstones_held = load(&counters.tombstones_held);
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

/// State of the writer thread: the journal and what it needs to decide on compaction.
struct Writer {
    journal: Journal,
    shared: Arc<Shared>,
    /// Estimated journal bytes the live entries would take after a compaction.
    live_bytes: u64,
    /// After a failed compaction (e.g. a full disk), wait before trying again.
    compact_not_before: Instant,
    /// The wait after the next failed compaction.
    compact_retry: Duration,
    /// While the journal refuses appends: when to try repairing it next.
    repair_not_before: Instant,
    /// The last compaction and append failure causes, so a repeating cause is logged once.
    compaction_failure: Option<String>,
    write_failure: Option<String>,
    /// Entry bytes written since the heap was last trimmed.
    written_since_trim: u64,
    /// Stamps Forgets; moved past every stamp and epoch the node learns.
    clock: ForgetClock,
}

fn run_writer(
    journal: Journal,
    commands: mpsc::Receiver<WriteCommand>,
    shared: Arc<Shared>,
    clock: ForgetClock,
) {
    let live_bytes = shared.counters.journal_live_bytes.load(Ordering::Relaxed);
    let mut writer = Writer {
        journal,
        shared,
        live_bytes,
        compact_not_before: Instant::now(),
        compact_retry: COMPACT_RETRY_MIN,
        repair_not_before: Instant::now(),
        compaction_failure: None,
        write_failure: None,
        written_since_trim: 0,
        clock,
    };
    writer.note_health();
    loop {
        let first = if let Some(wait) = writer.idle_work_wait() {
            match commands.recv_timeout(wait) {
                Ok(command) => command,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    writer.idle_work();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match commands.recv() {
                Ok(command) => command,
                Err(_) => break,
            }
        };
        // Group commit: everything queued meanwhile goes into one version and one append.
        let mut group = Vec::new();
        let mut stop = false;
        let mut next_command = Some(first);
        while let Some(command) = next_command.take() {
            match command {
                WriteCommand::Apply {
                    entries,
                    origin,
                    source,
                    reply,
                    ..
                } => group.push((entries, origin, source, reply)),
                WriteCommand::Forget { forget, reply } => {
                    // In order with the writes around it: what came before is applied first.
                    if !group.is_empty() {
                        writer.apply_group(std::mem::take(&mut group));
                    }
                    let _ = reply.send(writer.apply_forget(forget));
                }
                WriteCommand::Sync { reply } => {
                    if !group.is_empty() {
                        writer.apply_group(std::mem::take(&mut group));
                    }
                    let _ = reply.send(writer.journal.sync());
                }
                WriteCommand::Stop => {
                    stop = true;
                    break;
                }
            }
            if group.len() < MAX_GROUP {
                next_command = commands.try_recv().ok();
            }
        }
        if !group.is_empty() {
            writer.apply_group(group);
            writer.compact_if_due();
        }
        if stop {
            break;
        }
    }
    if let Err(error) = writer.journal.sync() {
        tracing::warn!(%error, "final journal sync failed");
    }
}

type Reply = oneshot::Sender<Result<ApplyOutcome>>;
/// One write request in a group commit: its entries, their provenance (for the journal and
/// for the change feed), who to answer.
type GroupedWrite = (Vec<Incoming>, Origin, Source, Reply);

impl Writer {
    /// How long to wait for the next write before doing idle work: a pending sync or repair
    /// (under `--fsync batch`, or while the journal refuses appends), else a heap trim after
    /// a burst. `None`: nothing to do, wait for the next write.
    fn idle_work_wait(&self) -> Option<Duration> {
        if self.journal.sync_pending() || self.journal.needs_rewrite() {
            Some(BATCH_SYNC_INTERVAL)
        } else if self.written_since_trim >= TRIM_AFTER_BYTES {
            Some(IDLE_BEFORE_TRIM)
        } else {
            None
        }
    }

    fn idle_work(&mut self) {
        if self.journal.sync_pending() || self.journal.needs_rewrite() {
            self.sync_or_repair();
        } else {
            crate::ops::heap::return_free_pages();
            self.written_since_trim = 0;
        }
    }

    /// Merges a group of write requests into one new version, journals the changes in one
    /// append, publishes, then acknowledges each request.
    fn apply_group(&mut self, group: Vec<GroupedWrite>) {
        self.journal.check_path();
        self.repair_if_needed();
        let mut next = EntryMap::clone(&self.shared.map.load());
        let mut own_next = EntryMap::clone(&self.shared.own.load());
        let tombstones = self.shared.tombstones.load_full();
        let mut changed = Vec::new();
        let mut journalled: Vec<(StoredEntry, Origin)> = Vec::new();
        let mut own_changed = false;
        let mut replies = Vec::with_capacity(group.len());
        let live_before = self.live_bytes;
        for (entries, origin, source, reply) in group {
            let mut outcome = ApplyOutcome::default();
            // This node's own new results get their epoch here (a client's is ignored): live
            // after every Forget of the key the node knows, and level with its winner.
            let stamps_epoch = matches!(source, Source::Record { .. } | Source::Tuner);
            for mut incoming in entries {
                if stamps_epoch {
                    let (key, _) = incoming.views();
                    let held = |map: &EntryMap| {
                        map.get_view(&key)
                            .map_or(0, |entry| entry.result().forget_epoch)
                    };
                    let winner = held(&next).max(held(&own_next));
                    let epoch = crate::model::forget::record_epoch(tombstones.floor(&key), winner);
                    incoming.set_forget_epoch(epoch);
                } else {
                    let (key, result) = incoming.views();
                    if tombstones.drops(&key, &result) {
                        outcome.unchanged += 1;
                        continue;
                    }
                }
                let (key, result) = incoming.views();
                self.clock.observe(result.forget_epoch);
                // An own result is kept as a contribution even when a learned one beats it
                // in the cache, so compaction of this node's segments never loses it.
                let own_replace = origin == Origin::Own
                    && merge_views(own_next.get_view(&key).map(StoredEntry::result), result)
                        == MergeOutcome::Replace;
                let current = next.get_view(&key).map(StoredEntry::result);
                let replace = merge_views(current, result) == MergeOutcome::Replace;
                let old_result_bytes = current.map(|r| r.encoded_len_estimate() as u64);
                let key_bytes = key.encoded_len_estimate() as u64;
                let result_bytes = result.encoded_len_estimate() as u64;
                self.written_since_trim += key_bytes + result_bytes;
                if !replace {
                    outcome.unchanged += 1;
                }
                if !(replace || own_replace) {
                    continue;
                }
                // One allocation, shared by the cache, the own contributions and the journal.
                let entry = incoming.into_stored();
                changed.push(Change {
                    entry: entry.clone(),
                    source: source.clone(),
                    in_cache: replace,
                    own: own_replace,
                });
                if replace {
                    let old = old_result_bytes.map_or(0, |r| key_bytes + r);
                    self.live_bytes = self.live_bytes + key_bytes + result_bytes - old;
                    next.insert(entry.clone());
                    outcome.stored += 1;
                }
                if own_replace {
                    own_next.insert(entry.clone());
                    own_changed = true;
                    journalled.push((entry, Origin::Own));
                } else {
                    journalled.push((entry, Origin::Learned));
                }
            }
            replies.push((reply, outcome));
        }

        if !journalled.is_empty() {
            if let Err(error) = self.journal.append_stored(&journalled) {
                self.live_bytes = live_before;
                self.note_write_failure(&error);
                self.note_health();
                let cause = match error {
                    Error::JournalWrite(cause) => cause,
                    other => Arc::new(other),
                };
                for (reply, _) in replies {
                    let _ = reply.send(Err(Error::JournalWrite(Arc::clone(&cause))));
                }
                return;
            }
            if self.write_failure.take().is_some() {
                tracing::info!("journal appends succeed again");
            }
            self.note_health();
            if own_changed {
                self.shared.own.store(Arc::new(own_next));
            }
            self.shared.map.store(Arc::new(next));
            let listeners = crate::sync::read(&self.shared.listeners);
            for listener in listeners.iter() {
                listener.entries_changed(&changed);
            }
        }
        for (reply, outcome) in replies {
            let _ = reply.send(Ok(outcome));
        }
        self.publish_journal_sizes();
    }

    /// The journal's size and its live part, for Stats.
    fn publish_journal_sizes(&self) {
        let counters = &self.shared.counters;
        counters
            .journal_bytes
            .store(self.journal.len(), Ordering::Relaxed);
        counters
            .journal_live_bytes
            .store(self.live_bytes, Ordering::Relaxed);
    }

    /// Rewrites the journal once it holds more than twice the live data, or when it still
    /// holds damage skipped at start.
    fn compact_if_due(&mut self) {
        let len = self.journal.len();
        let oversized = len > MIN_COMPACT_BYTES && len > 2 * self.live_bytes;
        if !(oversized || self.journal.holds_damage()) || Instant::now() < self.compact_not_before {
            return;
        }
        let map = self.shared.map.load_full();
        let own = self.shared.own.load_full();
        let held = self.compact_tombstones(&map);
        match self.journal.rewrite(live_entries(&map, &own), &held) {
            Ok(()) => {
                self.shared
                    .counters
                    .journal_compactions
                    .fetch_add(1, Ordering::Relaxed);
                self.compact_retry = COMPACT_RETRY_MIN;
                if self.compaction_failure.take().is_some() {
                    tracing::info!("journal compaction succeeds again");
                }
                tracing::info!(
                    bytes = self.journal.len(),
                    entries = map.len(),
                    "journal compacted"
                );
            }
            Err(error) => {
                self.compact_not_before = Instant::now() + self.compact_retry;
                self.note_compaction_failure(&error, self.compact_retry);
                self.compact_retry = (self.compact_retry * 2).min(COMPACT_RETRY_MAX);
            }
        }
        self.note_health();
        let counters = &self.shared.counters;
        counters
            .journal_bytes
            .store(self.journal.len(), Ordering::Relaxed);
    }

    /// Applies a Forget: asked here (stamped now, `only_if` checked against the winner), or
    /// learned (each tombstone new to this node). Drops what each removes from the cache and
    /// the own contributions, journals the tombstones, then publishes and tells the feed.
    fn apply_forget(&mut self, forget: ForgetCommand) -> Result<u32> {
        self.journal.check_path();
        self.repair_if_needed();
        let mut next = EntryMap::clone(&self.shared.map.load());
        let mut own_next = EntryMap::clone(&self.shared.own.load());
        let mut tombstones = Tombstones::clone(&self.shared.tombstones.load());
        let mut own_tombstones = Tombstones::clone(&self.shared.own_tombstones.load());
        let (new, source, origin) = match forget {
            ForgetCommand::Ask(ask) => {
                if let Some((config, time_us)) = &ask.only_if {
                    let winner = ask
                        .scope
                        .exact_key()
                        .and_then(|key| next.get(&key).map(|entry| entry.result().to_result()));
                    let same = winner.is_some_and(|w| &w.config == config && w.time_us == *time_us);
                    if !same {
                        return Ok(0);
                    }
                }
                let stamp = self.clock.tick(crate::model::entry::unix_now_ms());
                let tombstone = Tombstone {
                    scope: ask.scope,
                    stamp,
                };
                (vec![tombstone], Source::Forget, Origin::Own)
            }
            ForgetCommand::Learned(learned, source, origin) => (learned, source, origin),
        };
        let mut told = Vec::new();
        let mut journalled = Vec::new();
        let mut dropped_total = 0u32;
        let mut freed = 0u64;
        for tombstone in new {
            self.clock.observe(tombstone.stamp);
            let own_new = origin == Origin::Own && own_tombstones.insert(tombstone.clone());
            // Nothing new (it, or a wider and newer one, is held): nothing to drop or tell.
            if !tombstones.insert(tombstone.clone()) && !own_new && source != Source::Forget {
                continue;
            }
            let dropped = next.remove_dropped_by(&tombstone);
            own_next.remove_dropped_by(&tombstone);
            freed += dropped
                .iter()
                .map(|entry| entry.encoded_len_estimate() as u64)
                .sum::<u64>();
            let dropped = u32::try_from(dropped.len()).unwrap_or(u32::MAX);
            dropped_total = dropped_total.saturating_add(dropped);
            journalled.push((tombstone.clone(), origin));
            told.push(ForgetChange {
                tombstone,
                source: source.clone(),
                dropped,
            });
        }
        if journalled.is_empty() {
            return Ok(0);
        }
        if let Err(error) = self.journal.append_tombstones(&journalled) {
            self.note_write_failure(&error);
            self.note_health();
            return Err(error);
        }
        self.note_health();
        self.live_bytes = self.live_bytes.saturating_sub(freed);
        let counters = &self.shared.counters;
        counters
            .forgets_received
            .fetch_add(told.len() as u64, Ordering::Relaxed);
        counters
            .forget_entries_dropped
            .fetch_add(u64::from(dropped_total), Ordering::Relaxed);
        counters
            .tombstones_held
            .store(tombstones.len() as u64, Ordering::Relaxed);
        self.publish_journal_sizes();
        self.shared.tombstones.store(Arc::new(tombstones));
        self.shared.own_tombstones.store(Arc::new(own_tombstones));
        self.shared.own.store(Arc::new(own_next));
        self.shared.map.store(Arc::new(next));
        let listeners = crate::sync::read(&self.shared.listeners);
        for listener in listeners.iter() {
            listener.forgotten(&told);
        }
        Ok(dropped_total)
    }

    /// Before a compaction: drops the tombstones no longer needed (`Tombstones::compact`)
    /// and returns those to keep, with their provenance.
    fn compact_tombstones(&mut self, map: &EntryMap) -> Vec<(Tombstone, Origin)> {
        let retention = self.shared.forget_retention_ms.load(Ordering::Relaxed);
        let expire_before = crate::model::entry::unix_now_ms().saturating_sub(retention);
        let epoch_held = |key: &CacheKey| map.get(key).map(|e| e.result().forget_epoch);
        let mut tombstones = Tombstones::clone(&self.shared.tombstones.load());
        let mut own_tombstones = Tombstones::clone(&self.shared.own_tombstones.load());
        let went = tombstones.compact(epoch_held, expire_before);
        own_tombstones.compact(epoch_held, expire_before);
        if went > 0 {
            tracing::info!(
                dropped = went,
                held = tombstones.len(),
                "tombstones compacted (a newer result carries their floor, or past --forget-retention-days)"
            );
        }
        let held = held_tombstones(&tombstones, &own_tombstones);
        self.shared
            .counters
            .tombstones_held
            .store(tombstones.len() as u64, Ordering::Relaxed);
        self.shared.tombstones.store(Arc::new(tombstones));
        self.shared.own_tombstones.store(Arc::new(own_tombstones));
        held
    }

    /// Idle under `--fsync batch`, or while the journal refuses appends: sync, or repair.
    fn sync_or_repair(&mut self) {
        if self.journal.needs_rewrite() {
            self.repair_if_needed();
        } else if let Err(error) = self.journal.sync() {
            self.note_write_failure(&error);
        }
        self.note_health();
    }

    /// While the journal refuses appends, rewrites it from the current version (which holds
    /// every acknowledged entry), at most once per `REPAIR_RETRY`.
    fn repair_if_needed(&mut self) {
        if !self.journal.needs_rewrite() {
            return;
        }
        // Published (and counted) even when the repair below succeeds at once.
        self.note_health();
        if Instant::now() < self.repair_not_before {
            return;
        }
        let map = self.shared.map.load_full();
        let own = self.shared.own.load_full();
        let held = held_tombstones(
            &self.shared.tombstones.load(),
            &self.shared.own_tombstones.load(),
        );
        match self.journal.rewrite(live_entries(&map, &own), &held) {
            Ok(()) => {
                self.compaction_failure = None;
                tracing::info!(
                    bytes = self.journal.len(),
                    entries = map.len(),
                    "journal repaired: rewritten from memory"
                );
            }
            Err(error) => {
                self.repair_not_before = Instant::now() + REPAIR_RETRY;
                self.note_compaction_failure(&error, REPAIR_RETRY);
            }
        }
        self.note_health();
        self.shared
            .counters
            .journal_bytes
            .store(self.journal.len(), Ordering::Relaxed);
    }

    fn note_compaction_failure(&mut self, error: &Error, retry: Duration) {
        self.shared
            .counters
            .journal_compaction_failures
            .fetch_add(1, Ordering::Relaxed);
        let cause = error.to_string();
        if self.compaction_failure.as_ref() != Some(&cause) {
            tracing::warn!(%cause, "journal compaction failed; retrying in {retry:?} (logged once per cause)");
            self.compaction_failure = Some(cause);
        }
    }

    fn note_write_failure(&mut self, error: &Error) {
        self.shared
            .counters
            .journal_write_failures
            .fetch_add(1, Ordering::Relaxed);
        let cause = error.to_string();
        if self.write_failure.as_ref() != Some(&cause) {
            tracing::error!(%cause, "journal write failed; its Records are refused (logged once per cause)");
            self.write_failure = Some(cause);
        }
    }

    /// Publishes whether the journal takes appends, logging each change of state or cause.
    fn note_health(&mut self) {
        let counters = &self.shared.counters;
        let now = self.journal.unwritable().unwrap_or_default();
        let mut shown = crate::sync::lock(&counters.journal_unwritable);
        if *shown == now {
            return;
        }
        if now.is_empty() {
            counters
                .journal_unwritable_since_unix_ms
                .store(0, Ordering::Relaxed);
            tracing::info!("journal writable again; Records are accepted");
        } else {
            if shown.is_empty() {
                counters
                    .journal_unwritable_episodes
                    .fetch_add(1, Ordering::Relaxed);
                counters
                    .journal_unwritable_since_unix_ms
                    .store(crate::model::entry::unix_now_ms(), Ordering::Relaxed);
            }
            tracing::error!(cause = %now, "journal not writable: Records are refused (UNAVAILABLE) until it is repaired");
        }
        *shown = now;
    }
}

/// The tombstones a rewritten journal holds: this node's own, then every one it knows as
/// learned (a duplicate of an own one is subsumed on replay).
fn held_tombstones(all: &Tombstones, own: &Tombstones) -> Vec<(Tombstone, Origin)> {
    own.iter()
        .map(|t| (t, Origin::Own))
        .chain(all.iter().map(|t| (t, Origin::Learned)))
        .collect()
}

/// What a compacted journal holds: every own contribution, then every cache entry that is
/// not one of them (learned, or an own result later beaten by a learned one).
fn live_entries<'a>(
    map: &'a EntryMap,
    own: &'a EntryMap,
) -> impl Iterator<Item = (&'a StoredEntry, Origin)> {
    let own_entries = own.iter().map(|entry| (entry, Origin::Own));
    let learned = map
        .iter()
        .filter(|entry| !own.contains(entry))
        .map(|entry| (entry, Origin::Learned));
    own_entries.chain(learned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::forget::ForgetScope;

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
        let key = CacheKey {
            namespace: "ns".into(),
            op: "op".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        };
        let result = TunedResult {
            config: "{}".into(),
            time_us,
            tuned_by: "t".into(),
            tuned_at_unix_ms: 1,
            forget_epoch: 0,
        };
        (key, result)
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
