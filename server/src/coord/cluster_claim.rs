//! Cross-node single-flight through the cluster tier: before this node tunes a missing key,
//! one caller asks the cluster for the key's lease. Another node holding it makes the flight
//! wait for that node's result (watched here, taken over when its lease runs out); a result
//! already in Redis answers at once; no answer in time falls back to this node alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::flights::{AfterClaim, ClaimAnswer, WaiterId};
use super::{Coordinator, Inner, Resolution, ResolveCall};
use crate::cluster::{Claim, Cluster, ClusterLease};
use crate::error::Result;
use crate::model::entry::CacheKey;

impl Coordinator {
    /// Asks the cluster for the key's lease, waiting at most the cluster timeout. `Some`
    /// answers the call; `None` continues with node-local coordination, where the flight
    /// now says who tunes (this node, another node, or nobody yet).
    pub(super) async fn claim_in_cluster(
        &self,
        cluster: &Arc<Cluster>,
        call: &ResolveCall,
    ) -> Result<Option<Resolution>> {
        {
            let mut inner = self.lock();
            if call.can_tune && !inner.flights.has_lease_room(call.caller_pid) {
                return Ok(None); // refused on the node-local path
            }
            if let Some(result) = self.store.get(&call.key) {
                return Ok(Some(Resolution::Hit(result)));
            }
            let tuner_takes = self.tuner_takes(&call.key);
            if !inner
                .flights
                .begin_claim(&call.key, call.can_tune, tuner_takes, SystemTime::now())
            {
                return Ok(None);
            }
        }
        // If this call goes away mid-claim, the flight passes on as after a lost lease.
        let abandoned = ClaimGuard {
            coordinator: self,
            key: &call.key,
        };
        let claim = cluster.claim(&call.key).await;
        std::mem::forget(abandoned);

        let (answer, cluster_lease, retry_in) = match claim {
            Claim::Found(result) => {
                cluster
                    .apply_learned(vec![(call.key.clone(), result)])
                    .await;
                match self.store.get(&call.key) {
                    Some(stored) => {
                        self.end_claim(&call.key);
                        return Ok(Some(Resolution::Hit(stored)));
                    }
                    // The store did not take it (a result forgotten here and not yet deleted
                    // from Redis, or a failed write): not a hit; this node coordinates.
                    None => (ClaimAnswer::Unavailable, None, Duration::ZERO),
                }
            }
            Claim::Acquired(lease) => (ClaimAnswer::Acquired, Some(lease), Duration::ZERO),
            Claim::HeldBy { holder, retry_in } => (ClaimAnswer::HeldBy(holder), None, retry_in),
            Claim::Unavailable(reason) => {
                tracing::debug!(problem = %call.key.problem, %reason, "cluster lease unavailable; coordinating node-locally");
                (ClaimAnswer::Unavailable, None, Duration::ZERO)
            }
        };
        let mut inner = self.lock();
        match inner
            .flights
            .claim_answered(&call.key, answer, SystemTime::now())
        {
            // Finished meanwhile (a result arrived): a lease just taken is released on drop.
            AfterClaim::Finished => Ok(self.store.get(&call.key).map(Resolution::Hit)),
            AfterClaim::WatchRemote => {
                let stop = self.tasks.stop_token().child_token();
                if let Some(resources) = inner.flights.attachments_mut(&call.key) {
                    resources.remote_watch = Some(stop.clone().drop_guard());
                }
                if let Some(me) = self.me.upgrade() {
                    self.tasks.spawn(watch_remote(
                        me,
                        Arc::clone(cluster),
                        call.key.clone(),
                        retry_in,
                        stop,
                    ));
                }
                Ok(None)
            }
            AfterClaim::TuneHere => {
                if let Some(resources) = inner.flights.attachments_mut(&call.key) {
                    resources.cluster_lease = cluster_lease;
                }
                self.tune_here(&mut inner, call)
            }
        }
    }

    /// This node tunes the claimed key: the tuner if it measures such keys, else this
    /// caller if it can, else a waiter that can (or nobody yet).
    fn tune_here(&self, inner: &mut Inner, call: &ResolveCall) -> Result<Option<Resolution>> {
        if self.tuner_takes(&call.key) {
            if let Err(refused) = self.start_tuner_job(inner, &call.key) {
                self.hand_over(inner, &call.key);
                return Err(refused);
            }
            return Ok(None);
        }
        if call.can_tune {
            return match inner
                .flights
                .lease_to(&call.key, &call.caller(), SystemTime::now())
            {
                Ok(grant) => {
                    self.watch(inner, &grant);
                    Ok(Some(Resolution::TuneHere {
                        lease_id: grant.lease_id,
                        expires_in: grant.length,
                    }))
                }
                Err((pid, limit)) => {
                    self.hand_over(inner, &call.key);
                    Err(self.refuse_lease(pid, limit))
                }
            };
        }
        self.hand_over(inner, &call.key);
        Ok(None)
    }

    /// A claim ended without this node tuning: wake waiters from the store, or pass on.
    fn end_claim(&self, key: &CacheKey) {
        let mut inner = self.lock();
        if let Some(result) = self.store.get(key) {
            self.finish(&mut inner, key, &result);
            return;
        }
        let Inner { flights, replies } = &mut *inner;
        let alive = |id: WaiterId| replies.get(&id).is_some_and(|r| !r.is_closed());
        let effects = flights.claim_abandoned(key, SystemTime::now(), &alive);
        self.run(&mut inner, effects);
    }

    /// The other node's cluster lease ran out (or Redis went away) while local callers
    /// waited: this node tunes it now, with `lease` if it took the cluster lease.
    fn take_over(&self, key: &CacheKey, lease: Option<ClusterLease>) {
        let mut inner = self.lock();
        if !inner.flights.take_over(key, SystemTime::now()) {
            return; // nobody waits on that node any more; the lease is released on drop
        }
        if let Some(resources) = inner.flights.attachments_mut(key) {
            resources.cluster_lease = lease;
        }
        if self.tuner_takes(key) {
            if let Err(refused) = self.start_tuner_job(&mut inner, key) {
                tracing::warn!(problem = %key.problem, error = %refused, "taking over a tuning job failed");
                self.hand_over(&mut inner, key);
            }
            return;
        }
        self.hand_over(&mut inner, key);
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
                cluster.apply_learned(vec![(key.clone(), result)]).await;
                coordinator.finish_from_store(&key);
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
