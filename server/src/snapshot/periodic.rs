//! The background side: the periodic load-then-publish loop (with backoff after a failed
//! pass), the sweep of unnamed blobs once per grace period, and the health status of
//! `HEALTH_SERVICE_NAME`, kept current as jobs get stuck and return.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tonic_health::server::HealthReporter;

use super::io::IoJob;
use super::{
    blobs, IoSlot, Operation, SnapshotHandle, HEALTH_POLL, HEALTH_SERVICE_NAME, MAX_BACKOFF,
};
use crate::error::Error;
use crate::tasks::Tasks;

impl SnapshotHandle {
    /// Starts the periodic load-then-publish loop and keeps `HEALTH_SERVICE_NAME` up to date,
    /// as tasks of the daemon's that end when it stops.
    pub fn start_background(&self, health: HealthReporter, tasks: &Tasks) {
        let handle = self.clone();
        tasks.spawn(async move {
            tokio::join!(handle.clone().run_periodic(), handle.report_health(health));
        });
    }

    async fn run_periodic(self) {
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
        let Some(artifacts) = self.shared.artifacts.as_ref() else {
            return;
        };
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

    /// Keeps the snapshot health status current and logs when a job gets stuck or returns.
    async fn report_health(self, health: HealthReporter) {
        let mut reported_stuck = false;
        let stop = self.stop.clone();
        crate::report::health::report(health, HEALTH_SERVICE_NAME, HEALTH_POLL, stop, || {
            let stuck = self.stuck();
            match (stuck, reported_stuck) {
                (Some((operation, since_unix_ms)), false) => tracing::warn!(
                    operation = operation.as_str(),
                    since_unix_ms,
                    dir = %self.shared.settings.dir.display(),
                    "shared directory stuck; lookups and records go on, snapshots wait"
                ),
                (None, true) => tracing::info!("shared directory answers again"),
                _ => {}
            }
            reported_stuck = stuck.is_some();
            stuck.is_none()
                && self.shared.last_write_ok.load(Ordering::Relaxed)
                && !self.shared.blobs_failing.load(Ordering::Acquire)
        })
        .await;
    }
}
