//! The background side: the periodic load-then-publish loop (with backoff after a failed
//! pass), the sweep of unnamed blobs once per grace period, and the shared directory as one
//! of the daemon's tiers (`crate::tiers::Tier`): its health on `HEALTH_SERVICE_NAME`
//! (logging as jobs get stuck and return), its resume point and the last publish at
//! shutdown.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::io::IoJob;
use super::{
    blobs, IoSlot, Operation, SnapshotHandle, HEALTH_POLL, HEALTH_SERVICE_NAME, MAX_BACKOFF,
};
use crate::error::{Error, TierResult};
use crate::sync::lock;
use crate::tiers::{Tier, TierFuture, TierHealth, TierKind};

impl SnapshotHandle {
    /// The periodic load-then-publish loop, until the daemon stops.
    pub(super) async fn run_periodic(self) {
        let mut ticker = tokio::time::interval(self.shared.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = self.periodic_pass() => {}
            }
        }
    }

    /// One interval: read what is new in the shared directory, then publish our new
    /// contributions. Skipped while a Snapshot RPC holds the slot or during backoff.
    async fn periodic_pass(&self) {
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        if slot.retry_after.is_some_and(|at| Instant::now() < at) {
            return;
        }
        match self.pass(&mut slot).await {
            Ok(_) => {
                slot.consecutive_failures = 0;
                slot.retry_after = None;
            }
            // A stuck job costs nothing while we wait for it: no backoff, so the next
            // snapshot lands as soon as the filesystem answers again.
            Err(Error::SharedDirStuck { .. }) => {}
            Err(error) => {
                slot.consecutive_failures = slot.consecutive_failures.saturating_add(1);
                let backoff = self
                    .shared
                    .settings
                    .interval
                    .saturating_mul(1 << slot.consecutive_failures.min(10))
                    .min(MAX_BACKOFF);
                slot.retry_after = Some(Instant::now() + backoff);
                tracing::debug!(%error, ?backoff, "shared directory pass failed; backing off");
            }
        }
    }

    /// Collects the shared directory's blobs no entry names (`blobs::sweep`), at most once per
    /// `--artifact-grace-secs` (and 100 ms), and only after a load that caught up: then the
    /// store holds every live entry of the directory. A sweep lists the whole blob directory,
    /// so it runs once per grace period rather than every pass: what every node's listing
    /// costs the shared filesystem stays one listing per node per hour at the default. A
    /// failure is logged; the pass goes on.
    pub(super) async fn sweep_blobs_if_due(&self, slot: &mut IoSlot) {
        let artifacts = &self.shared.artifacts;
        let grace = Duration::from_millis(artifacts.grace_ms());
        let interval = grace.max(Duration::from_millis(100));
        if !slot.caught_up || slot.last_sweep.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        slot.last_sweep = Some(Instant::now());
        let entries = self.store.current();
        match self
            .run_job(slot, Operation::Write, |reply| IoJob::SweepBlobs {
                entries,
                grace,
                reply,
            })
            .await
        {
            Ok(report) => {
                let counters = &self.shared.counters;
                counters
                    .blobs_collected
                    .fetch_add(report.deleted as u64, Ordering::Relaxed);
                if report != blobs::SweepReport::default() {
                    tracing::info!(
                        trashed = report.trashed,
                        restored = report.restored,
                        deleted = report.deleted,
                        deleted_bytes = report.deleted_bytes,
                        temps_deleted = report.temps_deleted,
                        "swept the shared directory's artifact blobs"
                    );
                }
            }
            Err(error) => tracing::debug!(%error, "sweeping the shared directory's blobs failed"),
        }
    }
}

impl Tier for SnapshotHandle {
    fn kind(&self) -> TierKind {
        TierKind::SharedDir
    }

    fn health(&self) -> TierHealth {
        TierHealth {
            name: HEALTH_SERVICE_NAME,
            poll: HEALTH_POLL,
        }
    }

    /// No job stuck, the last write and every blob published; logs when a job gets stuck
    /// and when it returns.
    fn serving(&self) -> bool {
        let stuck = self.stuck();
        let was_stuck = self
            .shared
            .reported_stuck
            .swap(stuck.is_some(), Ordering::Relaxed);
        match (stuck, was_stuck) {
            (Some((operation, since_unix_ms)), false) => tracing::warn!(
                operation = operation.as_str(),
                since_unix_ms,
                dir = %self.shared.settings.dir.display(),
                "shared directory stuck; lookups and records go on, snapshots wait"
            ),
            (None, true) => tracing::info!("shared directory answers again"),
            _ => {}
        }
        stuck.is_none()
            && self.shared.last_write_ok.load(Ordering::Relaxed)
            && !self.shared.blobs_failing.load(Ordering::Acquire)
    }

    /// The places merged through, recorded in the state directory.
    fn save_resume_point(&self) -> TierFuture<'_, TierResult<()>> {
        Box::pin(async move {
            let mut slot = self.slot.lock().await;
            self.save_places(&mut slot).await
        })
    }

    /// What is not yet published goes out before `deadline` (the daemon's stop does not cut
    /// it short).
    fn publish_pending(&self, deadline: tokio::time::Instant) -> TierFuture<'_, Option<String>> {
        Box::pin(async move {
            let work = async {
                let mut slot = self.slot.lock().await;
                self.publish_if_changed(&mut slot).await
            };
            let outcome = match tokio::time::timeout_at(deadline, work).await {
                Ok(Ok(written)) if written.skipped_unchanged => "nothing new to publish".to_owned(),
                Ok(Ok(written)) => format!(
                    "published {} bytes ({} contributions in all) to {:?}",
                    written.bytes, written.entries, written.path
                ),
                Ok(Err(error)) => format!("failed: {error}"),
                Err(_) => "not done in time (the shared directory is slow or hung)".to_owned(),
            };
            *lock(&self.shared.shutdown_publish) = outcome.clone();
            Some(outcome)
        })
    }
}
