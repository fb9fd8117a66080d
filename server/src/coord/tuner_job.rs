//! The node's tuner as a flight's holder, as effects: the rules offer it a key's job
//! ([`flights::Next::OfferTuner`](super::flights::Next::OfferTuner)), and the job's end (a
//! result to store, or a failure) goes back to them as a
//! [`TunerEnd`](super::flights::TunerEnd).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::flights::{Offer, TunerEnd};
use super::Coordinator;
use crate::model::entry::CacheKey;
use crate::store::Source;
use crate::tuner::{JobReply, SubmitError};

impl Coordinator {
    /// Offers `key`'s job to the node's tuner; the end of a job it takes is awaited by a
    /// task. Called with the lock held, so the rules learn of the job before its end.
    pub(super) fn offer_tuner(&self, key: &CacheKey) -> Offer {
        match self.tuner.submit(&key.op, &key.problem, &key.device) {
            Ok(reply) => {
                if let Some(me) = self.me.upgrade() {
                    self.tasks.spawn(finish_tuner_job(me, key.clone(), reply));
                }
                Offer::Accepted
            }
            Err(SubmitError::QueueFull { capacity }) => {
                self.counters
                    .tuner_queue_refusals
                    .fetch_add(1, Ordering::Relaxed);
                if self.refusals_logged.first("tuner queue full") {
                    tracing::warn!(
                        capacity,
                        "refused a Resolve: the node's tuner queue is full (--tuner-queue; \
                         logged once; Stats counts each as tuner_queue_refusals)"
                    );
                }
                Offer::QueueFull { capacity }
            }
            Err(other) => {
                tracing::debug!(error = %other, "tuner declined a job");
                Offer::Declined
            }
        }
    }

    /// `key`'s tuner job ended: `None` when its result went to the store (the rules get
    /// what the store holds now, looked at under the lock).
    fn end_tuner_job(&self, key: &CacheKey, end: Option<TunerEnd>) {
        let mut inner = self.lock();
        let end = end.unwrap_or_else(|| TunerEnd::Stored(self.store.get(key)));
        let (effects, failure) = inner.flights.tuner_ended(key, end);
        self.run(&mut inner, effects);
        drop(inner);
        if let Some(reason) = failure {
            tracing::warn!(problem = %key.problem, %reason, "tuning job failed");
        }
    }
}

/// Records what the tuner measured for `key` (the change feed then wakes its waiters), and
/// tells the rules how the job ended.
async fn finish_tuner_job(
    coordinator: Arc<Coordinator>,
    key: CacheKey,
    reply: oneshot::Receiver<JobReply>,
) {
    let end = match reply.await {
        // The supervisor has checked the result (`validate::result`).
        Ok(Ok(result)) => match coordinator
            .store
            .apply(vec![(key.clone(), result)], Source::Tuner)
            .await
        {
            Ok(_) => None,
            Err(error) => Some(TunerEnd::StoreFailed(error.to_string())),
        },
        Ok(Err(reason)) => Some(TunerEnd::Failed(reason)),
        Err(_) => Some(TunerEnd::Stopped),
    };
    coordinator.end_tuner_job(&key, end);
}
