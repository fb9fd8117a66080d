//! Admission: how writes and Forgets reach the writer thread, and the bounded write queue.
//!
//! Every write takes its share of the write queue (`--write-queue-mib`, accounted in
//! `QUEUE_UNIT_BYTES` units of a semaphore) before it is queued, and gives it back when the
//! writer takes it, so the memory held by writes waiting for the writer (and its disk) is
//! bounded. A caller's Record (`try_apply`) is refused at once when the queue is full; the
//! daemon's own writers (the tuner, the tiers), which have no caller to retry, wait for room.
//!
//! What the journal could not write is dropped here, before it is queued: an entry or a
//! tombstone bigger than `journal::MAX_RECORD_BYTES` (no client's Record or Forget comes
//! near it; one read from another node could), counted and logged once per source.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::error::{Error, Result};
use crate::journal::MAX_RECORD_BYTES;
use crate::model::entry::{CacheKey, Origin, TunedResult};
use crate::model::forget::{ForgetAsk, Tombstone};
use crate::model::lifecycle::Day;
use crate::wire::stored::StoredEntry;

use super::plan::{decoded, ApplyOutcome, ForgetCommand, Incoming};
use super::writer::WriteCommand;
use super::{RecordLease, Source, Store};

/// Default bound on Records waiting for the writer (`--write-queue-mib`).
pub const DEFAULT_WRITE_QUEUE_BYTES: u64 = 256 * 1024 * 1024;
/// The write queue is accounted in units of this many bytes (a semaphore's permits).
pub(super) const QUEUE_UNIT_BYTES: u64 = 1024;
/// Memory a queued entry takes beyond its encoded size (string and vector headers).
const QUEUED_ENTRY_OVERHEAD: u64 = 128;

/// The queue units `bytes` take: at least one unit, at most the whole queue (so a batch
/// bigger than the queue still goes through an empty one).
pub(super) fn units_for_bytes(bytes: u64, queue_units: u32) -> u32 {
    u32::try_from(bytes.div_ceil(QUEUE_UNIT_BYTES))
        .unwrap_or(u32::MAX)
        .clamp(1, queue_units.max(1))
}

/// Whether the journal can write this entry (its estimated record fits `MAX_RECORD_BYTES`).
pub(super) fn entry_fits_journal(incoming: &Incoming) -> bool {
    let (key, result) = incoming.views();
    key.encoded_len_estimate() + result.encoded_len_estimate() <= MAX_RECORD_BYTES
}

/// Whether the journal can write this tombstone.
pub(super) fn tombstone_fits_journal(tombstone: &Tombstone) -> bool {
    tombstone.scope.encoded_len_estimate() <= MAX_RECORD_BYTES
}

impl Store {
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
        let before = tombstones.len();
        let tombstones: Vec<Tombstone> = tombstones
            .into_iter()
            .filter(tombstone_fits_journal)
            .collect();
        self.note_oversize(before - tombstones.len(), "tombstones", &source);
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

    /// `apply_learned`, each entry with the last use its source knew (`model::lifecycle`;
    /// 0: none known). An entry already expired by that day is dropped on arrival.
    pub async fn apply_learned_used(
        &self,
        entries: Vec<(CacheKey, TunedResult, Day)>,
        source: Source,
    ) -> Result<ApplyOutcome> {
        let entries = entries
            .into_iter()
            .map(|(key, result, day)| Incoming::Decoded(key, result, day))
            .collect();
        self.apply_from(entries, Origin::Learned, source).await
    }

    /// Merges entries already in stored form (each holding the last use its source knew) (read from the shared directory, a bundle)
    /// with the given provenance, waiting for room in the write queue.
    pub async fn apply_stored(
        &self,
        entries: Vec<StoredEntry>,
        origin: Origin,
        source: Source,
    ) -> Result<ApplyOutcome> {
        let entries = entries.into_iter().map(Incoming::Stored).collect();
        self.apply_from(entries, origin, source).await
    }

    /// Merges `entries` with the given provenance, waiting for room in the write queue.
    async fn apply_from(
        &self,
        entries: Vec<Incoming>,
        origin: Origin,
        source: Source,
    ) -> Result<ApplyOutcome> {
        let before = entries.len();
        let entries: Vec<Incoming> = entries.into_iter().filter(entry_fits_journal).collect();
        let oversize = before - entries.len();
        self.note_oversize(oversize, "entries", &source);
        let units = self.queue_units_for(&entries);
        let queued = Arc::clone(&self.shared.queue_room)
            .acquire_many_owned(units)
            .await
            .map_err(|_| Error::WriterGone)?;
        let mut outcome = self.send(entries, origin, source, queued).await?;
        outcome.unchanged += oversize as u32;
        Ok(outcome)
    }

    /// Counts and logs (once per kind and source) what was too big to journal.
    fn note_oversize(&self, dropped: usize, what: &str, source: &Source) {
        if dropped == 0 {
            return;
        }
        self.shared
            .counters
            .oversize_records_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        let source = match source {
            Source::Record { .. } => "Record",
            Source::Tuner => "tuner",
            Source::Snapshot => "shared directory",
            Source::Cluster => "cluster tier",
            Source::Bundle => "bundle",
            Source::Forget => "Forget",
            Source::Read => "read",
        };
        if self
            .shared
            .logged
            .first(format!("oversize {what} from {source}"))
        {
            tracing::warn!(
                dropped,
                limit = MAX_RECORD_BYTES,
                "dropped {what} from the {source} too big for a journal frame (logged once \
                 per source; Stats counts each as oversize_records_dropped)"
            );
        }
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

    /// The queue units a write takes: its estimated memory (`units_for_bytes`).
    fn queue_units_for(&self, entries: &[Incoming]) -> u32 {
        let bytes: u64 = entries
            .iter()
            .map(|incoming| {
                let (key, result) = incoming.views();
                (key.encoded_len_estimate() + result.encoded_len_estimate()) as u64
                    + QUEUED_ENTRY_OVERHEAD
            })
            .sum();
        units_for_bytes(bytes, self.shared.queue_units)
    }

    fn shed(&self) -> Error {
        let limit_mib = self.write_queue_limit_bytes() / (1024 * 1024);
        let counters = &self.shared.counters;
        counters.writes_shed.fetch_add(1, Ordering::Relaxed);
        if self.shared.logged.first("write queue full") {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_takes_its_bytes_in_units_at_least_one_and_at_most_the_queue() {
        assert_eq!(units_for_bytes(0, 100), 1);
        assert_eq!(units_for_bytes(1, 100), 1);
        assert_eq!(units_for_bytes(QUEUE_UNIT_BYTES, 100), 1);
        assert_eq!(units_for_bytes(QUEUE_UNIT_BYTES + 1, 100), 2);
        assert_eq!(
            units_for_bytes(u64::MAX, 100),
            100,
            "a huge batch fits an empty queue"
        );
    }

    #[tokio::test]
    async fn what_the_journal_could_not_write_is_dropped_before_the_writer_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let key = |problem: &str| CacheKey {
            namespace: "ns".into(),
            op: "op".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        };
        let result = |config_bytes: usize| TunedResult {
            config: "c".repeat(config_bytes),
            time_us: 1.0,
            tuned_by: "t".into(),
            tuned_at_unix_ms: 1,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        {
            let (guard, _) = Store::open(dir.path(), crate::journal::FsyncPolicy::Never).unwrap();
            let store = guard.store();
            let outcome = store
                .apply_learned(
                    vec![
                        (key("huge"), result(MAX_RECORD_BYTES)),
                        (key("ok"), result(10)),
                    ],
                    Source::Cluster,
                )
                .await
                .unwrap();
            assert_eq!(
                outcome,
                ApplyOutcome {
                    stored: 1,
                    unchanged: 1
                }
            );
            let huge = Tombstone {
                scope: crate::model::forget::ForgetScope::exact(
                    &key(&"p".repeat(MAX_RECORD_BYTES)),
                ),
                stamp: 1 << 16,
            };
            let fine = Tombstone {
                scope: crate::model::forget::ForgetScope::exact(&key("gone")),
                stamp: 1 << 16,
            };
            store
                .apply_tombstones(vec![huge, fine], Source::Cluster, Origin::Learned)
                .await
                .unwrap();
            assert_eq!(store.tombstones().len(), 1);
            let dropped = store
                .counters()
                .oversize_records_dropped
                .load(Ordering::Relaxed);
            assert_eq!(dropped, 2);
        }
        // What was kept is journalled, and replays clean.
        let (guard, report) = Store::open(dir.path(), crate::journal::FsyncPolicy::Never).unwrap();
        assert!(report.skipped.is_empty());
        let store = guard.store();
        assert!(store.get(&key("ok")).is_some() && store.get(&key("huge")).is_none());
        assert_eq!(store.tombstones().len(), 1);
    }

    #[tokio::test]
    async fn a_record_finding_the_queue_full_is_refused_at_once_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (guard, _) = Store::open_with_queue(
            dir.path(),
            crate::journal::FsyncPolicy::Never,
            QUEUE_UNIT_BYTES,
        )
        .unwrap();
        let store = guard.store();
        // Hold the whole queue, as writes waiting for a stalled disk would.
        let held = Arc::clone(&store.shared.queue_room)
            .try_acquire_many_owned(1)
            .unwrap();
        assert_eq!(store.write_queue_bytes(), QUEUE_UNIT_BYTES);
        let (key, result) = (
            crate::model::testing::key("p"),
            crate::model::testing::result(1.0),
        );
        let refused = store
            .try_apply(vec![(key.clone(), result.clone())], None)
            .await
            .unwrap_err();
        assert!(matches!(refused, Error::WriteQueueFull { .. }), "{refused}");
        assert_eq!(store.counters().writes_shed.load(Ordering::Relaxed), 1);
        drop(held);
        store.try_apply(vec![(key, result)], None).await.unwrap();
        assert_eq!(
            store.write_queue_bytes(),
            0,
            "given back when the writer takes it"
        );
    }
}
