//! The cluster tier as one of the daemon's tiers (`crate::tiers::Tier`): its health on
//! `HEALTH_NAME`, its resume point (the stream places, `places`) and the last publish at
//! shutdown, which waits for the publish queue to drain.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{places, Cluster, LinkState};
use crate::error::{TierError, TierResult};
use crate::tiers::{Tier, TierFuture, TierHealth, TierKind};

/// The gRPC health name that reports the cluster tier.
const HEALTH_NAME: &str = "tunecache.v1.TuneCache/cluster";
/// How often the health name is brought up to date.
const HEALTH_POLL: Duration = Duration::from_millis(200);

impl Cluster {
    /// Nothing of this node's waits to be published or is being published.
    pub(super) fn publish_idle(&self) -> bool {
        self.lock_pending().entries.is_empty()
            && !self.queue.republish_all.load(Ordering::Relaxed)
            && self.queue.publishing.load(Ordering::Relaxed) == 0
    }

    /// Waits until `publish_idle`, at most until `deadline`; whether it is.
    pub(super) async fn wait_publish_idle(&self, deadline: tokio::time::Instant) -> bool {
        while !self.publish_idle() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.publish_idle()
    }

    /// At shutdown: waits until this node's queue is published, at most until `deadline`;
    /// says how far it got.
    async fn drain_at_shutdown(&self, deadline: tokio::time::Instant) -> String {
        let waiting = self.lock_pending().entries.len();
        if self.publish_idle() {
            return "nothing waiting to publish".to_owned();
        }
        let idle = self.wait_publish_idle(deadline).await;
        let left = self.lock_pending().entries.len();
        if idle {
            format!("published the {waiting} results that were waiting")
        } else {
            format!("{left} results still waiting when the time ran out (redis slow or away)")
        }
    }

    /// Saves stream places (`places`): the journal is synced first, so the file never
    /// claims more than the journal holds.
    pub(super) async fn save_places(&self, saved: places::SavedPlaces) -> TierResult<()> {
        let Some(dir) = self.places.state_dir.clone() else {
            return Ok(());
        };
        if self.places.unsafe_to_save.load(Ordering::Relaxed) {
            return Err(TierError::refused("a learned batch was refused this run"));
        }
        self.store
            .sync_journal()
            .await
            .map_err(|e| TierError::unavailable(e.to_string()).during("journal sync"))?;
        let sync = self.store.fsync_policy() != crate::journal::FsyncPolicy::Never;
        let path = places::path(&dir);
        tokio::task::spawn_blocking(move || places::write(&dir, &saved, sync))
            .await?
            .map_err(|e| TierError::io("writing the stream places", path, e))
    }
}

impl Tier for Cluster {
    fn kind(&self) -> TierKind {
        TierKind::Cluster
    }

    fn health(&self) -> TierHealth {
        TierHealth {
            name: HEALTH_NAME,
            poll: HEALTH_POLL,
        }
    }

    /// Connected, with no key of the wrong type known and this node's clock within the
    /// bound of Redis's.
    fn serving(&self) -> bool {
        matches!(self.state(), LinkState::Connected { .. })
            && self.redis.wrong_types.is_empty()
            && !self.observed.prune_paused.load(Ordering::Relaxed)
    }

    /// The stream places as of now, so the next start reads only what comes after.
    fn save_resume_point(&self) -> TierFuture<'_, TierResult<()>> {
        Box::pin(async move {
            let latest = crate::sync::lock(&self.places.latest).take();
            match latest {
                Some(latest) => self.save_places(latest).await,
                None => Ok(()),
            }
        })
    }

    fn publish_pending(&self, deadline: tokio::time::Instant) -> TierFuture<'_, Option<String>> {
        Box::pin(async move { Some(self.drain_at_shutdown(deadline).await) })
    }
}
