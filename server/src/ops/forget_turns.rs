//! One Forget at a time per uid. A uid's Forgets wait for each other here, before the
//! writer, so one uid's flood (an administrator's scope Forgets, or exact ones within their
//! budget) holds at most one Forget in the writer's queue and about one core, and every other
//! uid's Records and reads go on beside it. The flood loses only concurrency it could not
//! use: the writer applies Forgets in order anyway. Waiting costs a queued call nothing but
//! its place; calls are bounded per uid by the connection limits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type Queues = Arc<Mutex<HashMap<u32, Arc<Semaphore>>>>;

/// Each uid's turn to Forget.
#[derive(Default)]
pub struct ForgetTurns {
    queues: Queues,
}

/// A uid's turn: the next Forget of that uid waits until this is dropped.
pub struct Turn {
    permit: Option<OwnedSemaphorePermit>,
    uid: u32,
    queue: Arc<Semaphore>,
    queues: Queues,
}

impl ForgetTurns {
    /// Waits for `uid`'s turn.
    pub async fn take(&self, uid: u32) -> Turn {
        let queue = crate::sync::lock(&self.queues)
            .entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        // Never closed: an error would only mean no wait.
        let permit = Arc::clone(&queue).acquire_owned().await.ok();
        Turn {
            permit,
            uid,
            queue,
            queues: Arc::clone(&self.queues),
        }
    }

    /// Uids with a Forget in progress or waiting.
    #[cfg(test)]
    fn uids_waiting(&self) -> usize {
        crate::sync::lock(&self.queues).len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut queues = crate::sync::lock(&self.queues);
        // Held by the map and this turn only: nobody waits, so the uid's entry goes.
        if Arc::strong_count(&self.queue) == 2 {
            queues.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_uids_forgets_take_turns_and_other_uids_never_wait() {
        let turns = ForgetTurns::default();
        let first = turns.take(1000).await;
        assert!(
            turns.take(1000).now_or_never().is_none(),
            "the same uid waits for its turn"
        );
        let other = turns.take(2000).now_or_never();
        assert!(other.is_some(), "another uid does not wait");
        drop(other);
        drop(first);
        let next = turns.take(1000).now_or_never();
        assert!(next.is_some(), "its turn comes once the first is done");
        drop(next);
        assert_eq!(turns.uids_waiting(), 0, "nothing kept for idle uids");
    }
}
