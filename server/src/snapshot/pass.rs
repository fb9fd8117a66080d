//! One pass over the shared directory: read what is new and merge it through the merge rule
//! (each file's `used` list as learned entries), record the places merged through once the
//! journal holds them, then publish this node's new contributions and uses unless nothing
//! changed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::io::{self, IoJob, WriteReport};
use super::{segments, uses, IoSlot, Operation, SnapshotHandle, Written, APPLY_BATCH};
use crate::error::{Error, Result, TierError, TierResult};
use crate::journal::FsyncPolicy;
use crate::model::entry::Origin;
use crate::store::Source;
use crate::sync::lock;
use crate::wire::stored::StoredEntry;

impl SnapshotHandle {
    /// Load, then publish; counts the file bytes this pass read and wrote.
    pub(super) async fn pass(&self, slot: &mut IoSlot) -> Result<Written> {
        let counters = &self.shared.counters;
        let read_before = counters.bytes_read.load(Ordering::Relaxed);
        let written_before = counters.bytes_written.load(Ordering::Relaxed);
        let outcome = match self.load_and_apply(slot).await {
            Ok(()) => {
                slot.last_load_error = None;
                let published = self.publish_if_changed(slot).await;
                if published.is_ok() {
                    self.sweep_blobs_if_due(slot).await;
                }
                published
            }
            Err(error) => {
                slot.last_load_error = Some(error.to_string());
                Err(error)
            }
        };
        // A stuck job has not finished: its bytes belong to the pass that sees it return.
        if !matches!(outcome, Err(Error::SharedDirStuck { .. })) {
            let read = counters.bytes_read.load(Ordering::Relaxed) - read_before;
            let written = counters.bytes_written.load(Ordering::Relaxed) - written_before;
            counters.last_pass_bytes_read.store(read, Ordering::Relaxed);
            counters
                .last_pass_bytes_written
                .store(written, Ordering::Relaxed);
            counters.passes.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Reads what is new and merges it into the store through the merge rule: other nodes'
    /// entries as learned, this node's own segments (first load) as its own again.
    pub(super) async fn load_and_apply(&self, slot: &mut IoSlot) -> Result<()> {
        // A wiped node (empty store) also starts from the version-1 file it published before.
        let include_own_v1 = self.store.is_empty();
        let started = Instant::now();
        let report = self
            .run_job(slot, Operation::Load, |reply| IoJob::Load {
                include_own_v1,
                reply,
            })
            .await?;
        let read_elapsed = started.elapsed();
        // Until the store has taken every file below, it does not hold every live entry.
        slot.caught_up = false;
        let caught_up = report.caught_up;
        if std::mem::replace(&mut slot.merging, true) && !slot.places_unsafe {
            slot.places_unsafe = true;
            tracing::warn!(
                "a merge from the shared directory was cut short; the segments merged are not \
                 recorded again this run, so a restart reads on from the last record"
            );
        }
        if report.own_vanished {
            // What vanished has to go out again although nothing changed here.
            slot.last_published_changes = None;
        }
        // Every file's tombstones before any file's entries: a forgotten entry in an older
        // segment is never served, not even for the moment until a newer segment is merged.
        let mut files = report.files;
        for file in &mut files {
            let tombstones = std::mem::take(&mut file.tombstones);
            let forgotten = self
                .store
                .apply_tombstones(tombstones, Source::Snapshot, file.origin)
                .await?;
            if forgotten > 0 {
                tracing::info!(file = %file.name, forgotten, "a Forget from the shared directory dropped entries");
            }
        }
        for file in files {
            let merge_started = Instant::now();
            let total = file.entries.len();
            let stored = self.apply_batched(file.entries, file.origin).await?;
            // Uses are another node's (or an earlier run's) reads: learned whoever wrote them,
            // so they raise days and are never taken as this node's contributions.
            let uses = file.used.len();
            self.apply_batched(file.used, Origin::Learned).await?;
            tracing::info!(
                file = %file.name,
                node = %file.node,
                entries = total,
                stored,
                uses,
                read = ?read_elapsed,
                merge = ?merge_started.elapsed(),
                "merged from the shared directory"
            );
        }
        slot.merging = false;
        slot.caught_up = caught_up;
        if let Some(record) = report.merged {
            slot.unsaved_places = Some(record);
        }
        // A failure is logged and kept for the next pass.
        let _ = self.save_places(slot).await;
        slot.initial_load_done = true;
        Ok(())
    }

    /// Merges `entries` through the merge rule in batches of `APPLY_BATCH`; returns how many
    /// the cache took.
    async fn apply_batched(&self, entries: Vec<StoredEntry>, origin: Origin) -> Result<u64> {
        let mut stored = 0;
        let mut entries = entries.into_iter();
        loop {
            let batch: Vec<_> = entries.by_ref().take(APPLY_BATCH).collect();
            if batch.is_empty() {
                return Ok(stored);
            }
            stored += u64::from(
                self.store
                    .apply_stored(batch, origin, Source::Snapshot)
                    .await?
                    .stored,
            );
        }
    }

    /// Records in the state directory the places merged through (`io::merged`), once the
    /// journal holds what they claim: it is synced first, so after any crash the record is
    /// at most as new as the journal. A failure is kept for the next pass and costs only
    /// reading again after a restart.
    pub(super) async fn save_places(&self, slot: &mut IoSlot) -> TierResult<()> {
        if slot.places_unsafe {
            slot.unsaved_places = None;
            return Err(TierError::refused("a merge was cut short this run"));
        }
        let Some(record) = slot.unsaved_places.take() else {
            return Ok(());
        };
        let saved = async {
            self.store
                .sync_journal()
                .await
                .map_err(|e| TierError::unavailable(e.to_string()).during("journal sync"))?;
            let sync = self.store.fsync_policy() != FsyncPolicy::Never;
            let shared = Arc::clone(&self.shared);
            let written = record.clone();
            let dir = self.shared.settings.state_dir.clone();
            tokio::task::spawn_blocking(move || io::merged::write(&shared, &written, sync))
                .await?
                .map_err(|e| TierError::io("recording the segments merged", dir, e))
        };
        let saved = saved.await;
        if let Err(why) = &saved {
            slot.unsaved_places = Some(record);
            if lock(&self.shared.logged_failures).insert("recording merged segments".to_owned()) {
                tracing::warn!(
                    dir = ?self.shared.settings.state_dir,
                    "the segments merged are not recorded in the state directory ({why}); \
                     retried each pass, a restart until then reads them again (logged once)"
                );
            } else {
                tracing::debug!(%why, "the segments merged are not recorded yet");
            }
        }
        saved
    }

    /// Publishes the own contributions not yet published, unless nothing changed since the
    /// last publish; then nothing touches the filesystem at all.
    pub(super) async fn publish_if_changed(&self, slot: &mut IoSlot) -> Result<Written> {
        if !slot.initial_load_done {
            let why = match &slot.last_load_error {
                Some(cause) => format!(
                    "this node has not read what it published before, so it cannot tell what \
                     is new: {cause}"
                ),
                None => "the first load of the shared directory has not finished".to_owned(),
            };
            return Err(Error::SharedDirUnavailable(why));
        }
        // Count before map: a change landing in between is published next time.
        let changes = self.shared.own_changes.load(Ordering::Acquire);
        let published = self.shared.counters.published.load(Ordering::Relaxed) as usize;
        // Blobs held back by an earlier publish go out as soon as they can.
        let blobs_failing = self.shared.blobs_failing.load(Ordering::Acquire);
        if slot.last_published_changes == Some(changes) && !blobs_failing {
            self.shared
                .counters
                .skipped_unchanged
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Written {
                path: self.shared.settings.dir.join(segments::SEGMENT_DIR),
                entries: published,
                bytes: 0,
                skipped_unchanged: true,
            });
        }
        let own = self.store.own_contributions();
        let own_tombstones = self.store.own_tombstones();
        let all_tombstones = self.store.tombstones();
        let taken = self.shared.uses.take();
        let used = uses::current(&taken, &self.store.current());
        let expired = self.shared.uses.take_expired();
        let written = self
            .run_job(slot, Operation::Write, |reply| IoJob::Write {
                own,
                own_tombstones,
                all_tombstones,
                used,
                expired,
                reply,
            })
            .await;
        let report: WriteReport = match written {
            Ok(report) => report,
            Err(error) => {
                // Not published: they go out with the next segment. The expired entries are
                // not kept: at worst a compaction carries one, and every reader drops it on
                // arrival as expired.
                self.shared.uses.put_back(taken);
                return Err(error);
            }
        };
        slot.last_published_changes = Some(changes);
        self.shared
            .counters
            .published
            .store(report.published as u64, Ordering::Relaxed);
        if !report.wrote {
            self.shared
                .counters
                .skipped_unchanged
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(Written {
            path: report.path,
            entries: report.published,
            bytes: report.bytes,
            skipped_unchanged: !report.wrote,
        })
    }
}
