//! The node's tuner as a flight's holder: a new key it measures becomes its job, and the
//! job's end (a result to store, or a failure) ends the flight.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::oneshot;

use super::{Coordinator, Inner};
use crate::error::{Error, Result};
use crate::model::entry::CacheKey;
use crate::store::Source;
use crate::tuner::{JobReply, SubmitError};

impl Coordinator {
    /// Hands the flight of `key` to the node's tuner when it measures such keys. Called
    /// with the lock held and no flight for `key`, or one nobody holds.
    pub(super) fn start_tuner_job(&self, inner: &mut Inner, key: &CacheKey) -> Result<()> {
        if !self.tuner_takes(key) {
            return Ok(());
        }
        let reply = match self.tuner.submit(&key.op, &key.problem, &key.device) {
            Ok(reply) => reply,
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
                return Err(Error::TunerQueueFull { capacity });
            }
            Err(other) => {
                // Off or no such device after all: the lease path takes over.
                tracing::debug!(error = %other, "tuner declined a job");
                return Ok(());
            }
        };
        let what = format!("{} job on {}", key.op, key.device);
        inner.flights.tuner_started(key, what, SystemTime::now());
        if let Some(me) = self.me.upgrade() {
            self.tasks.spawn(finish_tuner_job(me, key.clone(), reply));
        }
        Ok(())
    }

    /// The tuner could not produce a result for `key`: its waiters get a miss with `reason`.
    fn fail_tuner_job(&self, key: &CacheKey, reason: &str) {
        let mut inner = self.lock();
        let effects = inner.flights.tuner_failed(key, reason);
        self.run(&mut inner, effects);
    }
}

/// Records what the tuner measured for `key`, which wakes its waiters, or fails them.
async fn finish_tuner_job(
    coordinator: Arc<Coordinator>,
    key: CacheKey,
    reply: oneshot::Receiver<JobReply>,
) {
    let failure = match reply.await {
        // The supervisor has checked the result (`validate::result`).
        Ok(Ok(result)) => match coordinator
            .store
            .apply(vec![(key.clone(), result)], Source::Tuner)
            .await
        {
            // A better result recorded meanwhile leaves this one unchanged, and then the
            // change feed has nothing to announce: finish from the store.
            Ok(_) if coordinator.finish_from_store(&key) => return,
            Ok(_) => "the tuned result was not stored".to_owned(),
            Err(error) => format!("storing the tuned result failed: {error}"),
        },
        Ok(Err(reason)) => format!("the node's tuner could not tune it: {reason}"),
        Err(_) => "the node's tuner stopped before finishing".to_owned(),
    };
    tracing::warn!(problem = %key.problem, reason = %failure, "tuning job failed");
    coordinator.fail_tuner_job(&key, &failure);
}
