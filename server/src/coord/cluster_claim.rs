//! Cross-node single-flight through the cluster tier, as effects: the claim a Resolve's
//! rules ask for (a result the cluster already has goes to the store first), the watch on
//! another node's lease (asking again when it would run out), and the take-over when it
//! does. What each answer means for the flight is the rules' (`flights::resolve`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::flights::{ClaimAnswer, Offer, TakeOver};
use super::{Claimed, Coordinator, Inner};
use crate::cluster::{Claim, Cluster, ClusterLease};
use crate::model::entry::CacheKey;

impl Coordinator {
    /// Asks the cluster for `key`'s lease, waiting at most the cluster timeout; the rules
    /// have marked the flight as claiming. A result the cluster has is given to the store
    /// before the answer comes back. If the call goes away meanwhile, the flight passes on.
    pub(super) async fn ask_cluster(&self, key: &CacheKey) -> Claimed {
        let Some(cluster) = &self.cluster else {
            return (ClaimAnswer::Unavailable, Duration::ZERO);
        };
        let abandoned = ClaimGuard {
            coordinator: self,
            key,
        };
        let answer = match cluster.claim(key).await {
            Claim::Found(result) => {
                // No day known (0) counts as today: a rank resolves the key now.
                cluster.apply_learned(vec![(key.clone(), result, 0)]).await;
                (ClaimAnswer::Found, Duration::ZERO)
            }
            Claim::Acquired(lease) => (ClaimAnswer::Acquired(lease), Duration::ZERO),
            Claim::HeldBy { holder, retry_in } => (ClaimAnswer::HeldBy(holder), retry_in),
            Claim::Unavailable(reason) => {
                tracing::debug!(problem = %key.problem, %reason, "cluster lease unavailable; coordinating node-locally");
                (ClaimAnswer::Unavailable, Duration::ZERO)
            }
        };
        std::mem::forget(abandoned);
        answer
    }

    /// Starts watching another node's lease on `key`, asking again in `retry_in`.
    pub(super) fn watch_remote(&self, inner: &mut Inner, key: &CacheKey, retry_in: Duration) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let stop = self.tasks.stop_token().child_token();
        if let Some(resources) = inner.flights.attachments_mut(key) {
            resources.remote_watch = Some(stop.clone().drop_guard());
        }
        if let Some(me) = self.me.upgrade() {
            self.tasks.spawn(watch_remote(
                me,
                Arc::clone(cluster),
                key.clone(),
                retry_in,
                stop,
            ));
        }
    }

    /// A claim ended without its answer (the call went away).
    fn end_claim(&self, key: &CacheKey) {
        let mut inner = self.lock();
        let stored = self.store.get(key);
        let effects = inner.rules(|flights, alive| {
            flights.claim_abandoned(key, stored.as_ref(), SystemTime::now(), alive)
        });
        self.run(&mut inner, effects);
    }

    /// The other node's cluster lease ran out (or Redis went away) while local callers
    /// waited, and this node took the cluster lease (`lease`) or Redis is away (`None`).
    fn take_over(&self, key: &CacheKey, lease: Option<ClusterLease>) {
        let mut inner = self.lock();
        let tuner_takes = self.look(key).tuner_takes;
        let after = inner.rules(|flights, alive| {
            flights.take_over(key, lease, tuner_takes, SystemTime::now(), alive)
        });
        self.after_take_over(&mut inner, key, after);
    }

    /// The watch found the other node's result in the cluster and gave it to the store.
    fn remote_found(&self, key: &CacheKey) {
        let mut inner = self.lock();
        let seen = self.look(key);
        let after = inner.rules(|flights, alive| {
            let now = SystemTime::now();
            flights.remote_found(key, seen.stored.as_ref(), seen.tuner_takes, now, alive)
        });
        self.after_take_over(&mut inner, key, after);
    }

    fn after_take_over(&self, inner: &mut Inner, key: &CacheKey, after: TakeOver) {
        let effects = match after {
            TakeOver::NotWaiting => return,
            TakeOver::Done(effects) => effects,
            TakeOver::OfferTuner => {
                let offer = self.offer_tuner(key);
                if let Offer::QueueFull { capacity } = offer {
                    tracing::warn!(problem = %key.problem, capacity, "taking over a tuning job failed: the node's tuner queue is full");
                }
                inner.rules(|flights, alive| {
                    flights.take_over_offered(key, offer, SystemTime::now(), alive)
                })
            }
        };
        self.run(inner, effects);
    }
}

/// Passes the flight on if a claiming call is dropped before its claim ends.
struct ClaimGuard<'a> {
    coordinator: &'a Coordinator,
    key: &'a CacheKey,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.coordinator.end_claim(self.key);
    }
}

/// Waits for another node's result while that node holds the cluster lease; asks for the
/// lease again when it would run out, and takes over once it gets it. Stops when the
/// flight no longer waits on that node (the result arrived, or every caller left).
async fn watch_remote(
    coordinator: Arc<Coordinator>,
    cluster: Arc<Cluster>,
    key: CacheKey,
    mut retry_in: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(retry_in) => {}
            () = stop.cancelled() => return,
        }
        match cluster.claim(&key).await {
            Claim::HeldBy { retry_in: next, .. } => retry_in = next,
            Claim::Found(result) => {
                // No day known (0) counts as today: a rank resolves the key now.
                cluster.apply_learned(vec![(key.clone(), result, 0)]).await;
                coordinator.remote_found(&key);
                return;
            }
            Claim::Acquired(lease) => {
                cluster.counters.takeovers.fetch_add(1, Ordering::Relaxed);
                tracing::info!(problem = %key.problem, "another node's cluster lease ran out; tuning here");
                coordinator.take_over(&key, Some(lease));
                return;
            }
            Claim::Unavailable(_) => {
                // No push can arrive without Redis: coordinate node-locally.
                coordinator.take_over(&key, None);
                return;
            }
        }
    }
}
