//! Waiting on facts: one rule for every wait in the tests. A wait polls its check every
//! [`POLL`] (or what [`Wait::every`] says) until the check holds, and gives up after its limit;
//! a wait that gives up panics naming what it waited for and the limit.
//!
//! The faces: [`eventually`] (an async check), [`eventually_sync`] (a synchronous check from
//! async code), [`eventually_some`] (returns what the check found), [`eventually_blocking`] (for
//! thread-based tests, off any runtime), and [`wait`] for the rest (another poll interval, an
//! async check that finds a value, a blocking check that finds one, or a wait that does not
//! panic but lets the caller act on the timeout). All of them run [`Wait::try_until_some_async`]
//! or [`Wait::try_blocking_some`], which share [`Deadline`].

use std::fmt::{self, Display};
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a wait polls its check unless told otherwise ([`Wait::every`]).
pub const POLL: Duration = Duration::from_millis(20);

/// A wait for `what`, at most `limit`, polling every `poll`.
#[derive(Clone, Copy, Debug)]
pub struct Wait<W> {
    limit: Duration,
    poll: Duration,
    what: W,
}

/// A wait for `what` (anything printable: a `&str`, a `String`, or a [`Lazy`] message worked out
/// only when the wait times out) of at most `limit`, polling every [`POLL`].
pub fn wait<W: Display>(limit: Duration, what: W) -> Wait<W> {
    Wait {
        limit,
        poll: POLL,
        what,
    }
}

/// A message worked out only if a wait times out: the daemon's log, the last state seen.
pub struct Lazy<F>(pub F);

impl<F: Fn() -> String> Display for Lazy<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&(self.0)())
    }
}

/// The rule every wait keeps: the limit counts from the start of the wait; the check runs
/// first, then again after each pause while time is left.
struct Deadline {
    at: Instant,
    poll: Duration,
}

impl Deadline {
    fn start<W>(wait: &Wait<W>) -> Deadline {
        Deadline {
            at: Instant::now() + wait.limit,
            poll: wait.poll,
        }
    }

    /// The pause before the next check, or `None` when the limit has passed.
    fn pause(&self) -> Option<Duration> {
        (Instant::now() < self.at).then_some(self.poll)
    }
}

impl<W: Display> Wait<W> {
    /// The same wait, polling every `poll`.
    pub fn every(self, poll: Duration) -> Self {
        Wait { poll, ..self }
    }

    /// Panics: the wait timed out.
    fn timed_out(&self) -> ! {
        panic!("not within {:?}: {}", self.limit, self.what)
    }

    /// Polls `find` until it finds something; `None` once the limit has passed.
    pub async fn try_until_some_async<T, F, Fut>(&self, mut find: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Deadline::start(self);
        loop {
            if let Some(found) = find().await {
                return Some(found);
            }
            tokio::time::sleep(deadline.pause()?).await;
        }
    }

    /// Polls `find` until it finds something, blocking the thread; `None` once the limit has
    /// passed.
    pub fn try_blocking_some<T>(&self, mut find: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Deadline::start(self);
        loop {
            if let Some(found) = find() {
                return Some(found);
            }
            std::thread::sleep(deadline.pause()?);
        }
    }

    /// Polls `find` until it finds something, and returns it.
    pub async fn until_some_async<T, F, Fut>(&self, find: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match self.try_until_some_async(find).await {
            Some(found) => found,
            None => self.timed_out(),
        }
    }

    /// Polls `check` until it holds.
    pub async fn until_async<F, Fut>(&self, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.until_some_async(|| {
            let holds = check();
            async move { holds.await.then_some(()) }
        })
        .await
    }

    /// Polls the synchronous `check` until it holds; whether it held before the limit passed
    /// (for a caller that asserts the outcome itself).
    pub async fn try_until(&self, mut check: impl FnMut() -> bool) -> bool {
        self.try_until_some_async(|| std::future::ready(check().then_some(())))
            .await
            .is_some()
    }

    /// Polls the synchronous `find` until it finds something, and returns it.
    pub async fn until_some<T>(&self, mut find: impl FnMut() -> Option<T>) -> T {
        self.until_some_async(|| std::future::ready(find())).await
    }

    /// Polls the synchronous `check` until it holds.
    pub async fn until(&self, mut check: impl FnMut() -> bool) {
        self.until_some(|| check().then_some(())).await
    }

    /// Polls `find` until it finds something, blocking the thread, and returns it.
    pub fn blocking_some<T>(&self, find: impl FnMut() -> Option<T>) -> T {
        self.try_blocking_some(find)
            .unwrap_or_else(|| self.timed_out())
    }

    /// Polls `check` until it holds, blocking the thread.
    pub fn blocking(&self, mut check: impl FnMut() -> bool) {
        self.blocking_some(|| check().then_some(()))
    }
}

/// Polls the async `check` every [`POLL`] until it holds; panics naming `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: impl Display, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait(limit, what).until_async(check).await
}

/// Polls the synchronous `check` every [`POLL`], sleeping on the runtime, until it holds;
/// panics naming `what` after `limit`.
pub async fn eventually_sync(limit: Duration, what: impl Display, check: impl FnMut() -> bool) {
    wait(limit, what).until(check).await
}

/// Polls the synchronous `find` every [`POLL`] until it finds something, and returns it;
/// panics naming `what` after `limit`.
pub async fn eventually_some<T>(
    limit: Duration,
    what: impl Display,
    find: impl FnMut() -> Option<T>,
) -> T {
    wait(limit, what).until_some(find).await
}

/// Polls `check` every [`POLL`], blocking the thread, until it holds; panics naming `what`
/// after `limit`. For tests that run off any async runtime.
pub fn eventually_blocking(limit: Duration, what: impl Display, check: impl FnMut() -> bool) {
    wait(limit, what).blocking(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_blocking_wait_returns_what_it_found_once_found() {
        let calls = Cell::new(0);
        let found = wait(Duration::from_secs(5), "the third call")
            .every(Duration::from_millis(1))
            .blocking_some(|| {
                calls.set(calls.get() + 1);
                (calls.get() == 3).then_some(calls.get())
            });
        assert_eq!(found, 3);
    }

    #[test]
    fn a_blocking_wait_that_times_out_names_what_and_the_limit() {
        let panic = std::panic::catch_unwind(|| {
            eventually_blocking(Duration::from_millis(30), "a fact that never holds", || {
                false
            })
        })
        .expect_err("the wait must time out");
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert_eq!(message, "not within 30ms: a fact that never holds");
    }

    #[test]
    fn a_lazy_message_is_worked_out_only_on_timeout() {
        let worked_out = Cell::new(false);
        let what = Lazy(|| {
            worked_out.set(true);
            "the log".to_owned()
        });
        wait(Duration::from_secs(5), &what).blocking(|| true);
        assert!(!worked_out.get());
        assert!(wait(Duration::from_millis(5), &what)
            .try_blocking_some(|| None::<()>)
            .is_none());
        assert!(!worked_out.get(), "try_ does not panic, so never prints");
    }

    #[tokio::test]
    async fn an_async_wait_polls_until_the_check_holds_and_times_out_naming_what() {
        let calls = Cell::new(0);
        eventually_sync(Duration::from_secs(5), "the fifth call", || {
            calls.set(calls.get() + 1);
            calls.get() == 5
        })
        .await;
        assert_eq!(calls.get(), 5);
        let found = eventually_some(Duration::from_secs(5), "a value", || Some(7)).await;
        assert_eq!(found, 7);
        let timed_out = tokio::spawn(eventually(
            Duration::from_millis(30),
            "an async fact that never holds",
            || async { false },
        ))
        .await
        .expect_err("the wait must time out");
        let panic = timed_out.into_panic();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert_eq!(message, "not within 30ms: an async fact that never holds");
    }
}
