//! The writer's upkeep of the journal: compaction, repair, syncs under `--fsync batch`, the
//! heap trim after a burst, and the journal's health as Stats and the log show it.
//!
//! Compaction rewrites the journal from memory once it holds more than twice the live data
//! (or still holds damage skipped at start), after dropping the tombstones no longer needed.
//! Repair is the same rewrite, while the journal refuses appends. Both go through
//! `Journal::rewrite`, whose protocol leaves the old or the new journal whatever fails.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::journal::BATCH_SYNC_INTERVAL;
use crate::model::entry::{CacheKey, Origin};
use crate::model::forget::Tombstone;
use crate::model::tombstones::Tombstones;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::writer::{Writer, COMPACT_RETRY_MIN};

/// Compaction waits until the journal is at least this big, so small caches never churn.
const MIN_COMPACT_BYTES: u64 = 1024 * 1024;
const COMPACT_RETRY_MAX: Duration = Duration::from_secs(60);
/// While the journal refuses appends, try to repair it (rewrite from memory) this often.
const REPAIR_RETRY: Duration = Duration::from_secs(1);
/// Entry bytes written in a burst after which the writer, once idle, hands freed heap pages
/// back (`heap`): a burst's decoded requests leave that much garbage in the allocator.
const TRIM_AFTER_BYTES: u64 = 8 * 1024 * 1024;
/// How long the writer must have been idle after such a burst before it trims.
const IDLE_BEFORE_TRIM: Duration = Duration::from_millis(200);

/// How long after a sweep's last batch but one compaction still waits for the sweep's end.
const SWEEP_QUIET: Duration = Duration::from_secs(10);

/// Whether a journal of `len` bytes, `live_bytes` of them live, is due for a compaction.
fn compaction_due(len: u64, live_bytes: u64, holds_damage: bool) -> bool {
    (len > MIN_COMPACT_BYTES && len > 2 * live_bytes) || holds_damage
}

impl Writer {
    /// How long to wait for the next write before doing idle work: a pending sync or repair
    /// (under `--fsync batch`, or while the journal refuses appends), else a heap trim after
    /// a burst. `None`: nothing to do, wait for the next write.
    pub(super) fn idle_work_wait(&self) -> Option<Duration> {
        if self.journal.sync_pending() || self.journal.needs_rewrite() {
            Some(BATCH_SYNC_INTERVAL)
        } else if self.written_since_trim >= TRIM_AFTER_BYTES {
            Some(IDLE_BEFORE_TRIM)
        } else {
            None
        }
    }

    pub(super) fn idle_work(&mut self) {
        if self.journal.sync_pending() || self.journal.needs_rewrite() {
            self.sync_or_repair();
        } else {
            crate::ops::heap::return_free_pages();
            self.written_since_trim = 0;
        }
    }

    /// Rewrites the journal once it holds more than twice the live data, or when it still
    /// holds damage skipped at start.
    pub(super) fn compact_if_due(&mut self) {
        let due = compaction_due(
            self.journal.len(),
            self.live_bytes,
            self.journal.holds_damage(),
        );
        let sweeping = self
            .sweep_batch_at
            .is_some_and(|at| at.elapsed() < SWEEP_QUIET);
        if !due || sweeping || Instant::now() < self.compact_not_before {
            return;
        }
        let map = self.shared.map.load_full();
        let own = self.shared.own.load_full();
        let held = self.compact_tombstones(&map);
        match self.journal.rewrite(live_entries(&map, &own), &held) {
            Ok(()) => {
                // What was just written is all live: entries and the tombstones kept.
                self.live_bytes = self.journal.len();
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
    pub(super) fn repair_if_needed(&mut self) {
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

    pub(super) fn note_write_failure(&mut self, error: &Error) {
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
    pub(super) fn note_health(&mut self) {
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

/// The tombstones a rewritten journal holds: this node's own, then every other one it knows
/// as learned (replay holds an own one in both sets, so it is written once).
pub(super) fn held_tombstones(all: &Tombstones, own: &Tombstones) -> Vec<(Tombstone, Origin)> {
    own.iter()
        .map(|t| (t, Origin::Own))
        .chain(
            all.iter()
                .filter(|t| !own.contains(t))
                .map(|t| (t, Origin::Learned)),
        )
        .collect()
}

/// What a compacted journal holds: every own contribution, then every cache entry that is
/// not one of them (learned, or an own result later beaten by a learned one).
pub(super) fn live_entries<'a>(
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
    use crate::model::testing;

    fn stored(problem: &str, time_us: f64) -> StoredEntry {
        StoredEntry::new(&testing::key(problem), &testing::result(time_us))
    }

    fn problems(live: Vec<(&StoredEntry, Origin)>) -> Vec<(String, f64, Origin)> {
        live.into_iter()
            .map(|(e, o)| {
                let (key, result) = e.to_pair();
                (key.problem, result.time_us, o)
            })
            .collect()
    }

    #[test]
    fn a_compacted_journal_keeps_every_own_contribution_and_every_winner() {
        // a: own and the winner (one entry); b: own 5.0 beaten by a learned 1.0; c: learned.
        let own: EntryMap = [stored("a", 1.0), stored("b", 5.0)].into_iter().collect();
        let map: EntryMap = [stored("a", 1.0), stored("b", 1.0), stored("c", 2.0)]
            .into_iter()
            .collect();
        assert_eq!(
            problems(live_entries(&map, &own).collect()),
            vec![
                ("a".into(), 1.0, Origin::Own),
                ("b".into(), 5.0, Origin::Own),
                ("b".into(), 1.0, Origin::Learned),
                ("c".into(), 2.0, Origin::Learned),
            ]
        );
    }

    #[test]
    fn a_rewritten_journal_keeps_own_tombstones_as_own_and_once() {
        let tombstone = |problem: &str| Tombstone {
            scope: ForgetScope::exact(&stored(problem, 0.0).to_pair().0),
            stamp: 9,
        };
        let mut all = Tombstones::default();
        all.insert(tombstone("a"));
        all.insert(tombstone("b"));
        let mut own = Tombstones::default();
        own.insert(tombstone("a"));
        assert_eq!(
            held_tombstones(&all, &own),
            vec![
                (tombstone("a"), Origin::Own),
                (tombstone("b"), Origin::Learned)
            ]
        );
    }

    #[test]
    fn compaction_waits_for_a_journal_twice_its_live_data_and_past_the_minimum() {
        let min = MIN_COMPACT_BYTES;
        assert!(!compaction_due(min, 0, false), "not past the minimum");
        assert!(compaction_due(min + 1, 0, false));
        assert!(!compaction_due(4 * min, 2 * min, false), "exactly twice");
        assert!(compaction_due(4 * min + 1, 2 * min, false));
        assert!(
            compaction_due(0, 0, true),
            "damage is rewritten whatever the size"
        );
    }
}
