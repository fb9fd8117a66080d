//! The daemon's background tasks, under one owner: every part starts its tasks here (from
//! the runtime or from any other thread, such as the store's writer telling the change
//! feed), the daemon stops them all with one signal, and `server::run` returns only once
//! every one has ended.
//!
//! A task is told to stop through [`Tasks::stopping`] and ends on its own; one still running
//! [`STOP_GRACE`] after the signal is dropped at its next await, so that a part waiting on a
//! hung peer cannot hold the daemon's exit. Blocking work a task awaits (the blocking pool)
//! is not cut: its thread ends when the work returns.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

/// How long a task may run on after the stop signal before it is dropped.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// The tracker of every background task of one daemon, and its stop signal.
#[derive(Clone)]
pub struct Tasks {
    tracker: TaskTracker,
    stop: CancellationToken,
    runtime: Handle,
    grace: Duration,
}

impl Tasks {
    /// The tasks of a daemon running on the current runtime (call it inside the runtime).
    pub fn new() -> Tasks {
        Tasks::with_grace(STOP_GRACE)
    }

    /// As `new`, with another grace than `STOP_GRACE` after the stop signal.
    pub fn with_grace(grace: Duration) -> Tasks {
        Tasks {
            tracker: TaskTracker::new(),
            stop: CancellationToken::new(),
            runtime: Handle::current(),
            grace,
        }
    }

    /// Starts `task` on the daemon's runtime, from any thread. It is expected to end soon
    /// after `stopping`; `STOP_GRACE` after the signal it is dropped.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let (stop, grace) = (self.stop.clone(), self.grace);
        self.tracker.spawn_on(
            async move {
                tokio::select! {
                    () = task => {}
                    () = async {
                        stop.cancelled().await;
                        tokio::time::sleep(grace).await;
                    } => {
                        tracing::warn!(
                            "a background task still running {grace:?} after the stop signal \
                             was dropped"
                        );
                    }
                }
            },
            &self.runtime,
        );
    }

    /// Resolves once the daemon stops: every task ends when it does.
    pub fn stopping(&self) -> WaitForCancellationFuture<'_> {
        self.stop.cancelled()
    }

    /// The stop signal, for a part that hands it on (a child token per resource, say).
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Sends the stop signal: every task ends (or is dropped) within `STOP_GRACE`.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Stops every task and waits until all have ended. New tasks may still be started
    /// meanwhile (a last publish's), and are waited for too; returns when none is left.
    pub async fn stop_and_wait(&self) {
        self.stop();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn every_task_ends_on_the_signal_and_a_stuck_one_is_dropped_after_the_grace() {
        let grace = Duration::from_millis(200);
        let tasks = Tasks::with_grace(grace);
        let ended = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let (tasks2, ended) = (tasks.clone(), Arc::clone(&ended));
            tasks.spawn(async move {
                tasks2.stopping().await;
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
        // One that ignores the signal.
        tasks.spawn(std::future::pending());
        // One started from another thread.
        let from_thread = tasks.clone();
        std::thread::spawn(move || from_thread.spawn(async {}))
            .join()
            .unwrap();
        tokio::task::yield_now().await;
        assert!(tasks.running() >= 4, "{}", tasks.running());
        let started = std::time::Instant::now();
        tasks.stop_and_wait().await;
        assert_eq!(ended.load(Ordering::SeqCst), 3);
        assert_eq!(tasks.running(), 0);
        let waited = started.elapsed();
        assert!(
            waited >= grace && waited < grace * 10,
            "the stuck one held the wait for the grace: {waited:?}"
        );
    }
}
