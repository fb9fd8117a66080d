//! The per-uid budget of exact-key Forgets (`only_if`, open to every allowed caller), and
//! their log.
//!
//! Each uid may ask `--max-exact-forgets-per-uid` of them per minute: a token bucket holding
//! that many, refilled evenly over the minute, so a burst of a minute's worth is served and
//! a flood is held to the rate. Past it the Forget is refused RESOURCE_EXHAUSTED naming the
//! flag, before it reaches the writer; other uids never see it.
//!
//! The log is one line per uid per minute, not one per key: the first Forget of a uid's
//! minute is logged with its key and what the uid's previous minute came to (asked,
//! refused, entries forgotten); a minute nobody followed is summed up by the next sweep.
//! The rule is a pure type, `ExactForgetBudget`, with the clock passed in; its adapter,
//! `ExactForgets`, holds it behind a lock for the Forget handler (`rpc`), counts refusals
//! for Stats and writes the lines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Error;

/// Default of `--max-exact-forgets-per-uid`: 10 a second, sustained, which no rank
/// reporting broken results comes near, while a flood is cut to what the writer does in
/// well under a millisecond a second.
pub const DEFAULT_MAX_EXACT_FORGETS_PER_UID: u32 = 600;

/// The budget's period, and the log's: one summary line per uid per this.
pub const WINDOW: Duration = Duration::from_secs(60);

/// What one uid's minute came to, for its summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinuteTally {
    /// Exact-key Forgets the uid asked (admitted or not).
    pub asked: u64,
    /// Of those, refused over the budget.
    pub refused: u64,
    /// Entries the admitted ones removed.
    pub forgotten: u64,
}

/// A summary line to log: a uid's minute that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinuteSummary {
    pub uid: u32,
    pub tally: MinuteTally,
}

/// The answer to one exact-key Forget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Whether it may go to the writer.
    pub admitted: bool,
    /// It is the first of the uid's minute: log it, with `previous` (the minute before, if
    /// the uid asked anything in it).
    pub first_of_minute: bool,
    pub previous: Option<MinuteTally>,
    /// Minutes of other uids that ended unfollowed, found by a sweep: log each.
    pub ended: Vec<MinuteSummary>,
}

struct UidState {
    /// Forgets the uid may still ask now (fractional: the bucket refills continuously).
    tokens: f64,
    refilled_at: Instant,
    /// Its current minute, and what it came to so far.
    minute_started: Instant,
    tally: MinuteTally,
}

/// Every uid's budget and minute. Idle uids (a full bucket, a minute logged) are dropped by
/// the sweep, so the map holds only the uids of the last minute or two.
pub struct ExactForgetBudget {
    per_minute: u32,
    uids: HashMap<u32, UidState>,
    last_sweep: Option<Instant>,
}

impl ExactForgetBudget {
    pub fn new(per_minute: u32) -> Self {
        ExactForgetBudget {
            per_minute: per_minute.max(1),
            uids: HashMap::new(),
            last_sweep: None,
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    fn capacity(&self) -> f64 {
        f64::from(self.per_minute)
    }

    /// Takes one exact-key Forget of `uid` at `now` from its budget.
    pub fn admit(&mut self, uid: u32, now: Instant) -> Admission {
        let ended = self.sweep(now, uid);
        let capacity = self.capacity();
        let state = self.uids.entry(uid).or_insert_with(|| UidState {
            tokens: capacity,
            refilled_at: now,
            minute_started: now,
            tally: MinuteTally::default(),
        });
        let elapsed = now.saturating_duration_since(state.refilled_at);
        state.tokens =
            (state.tokens + elapsed.as_secs_f64() * capacity / WINDOW.as_secs_f64()).min(capacity);
        state.refilled_at = now;
        let mut previous = None;
        let mut first_of_minute = state.tally.asked == 0;
        if now.saturating_duration_since(state.minute_started) >= WINDOW {
            previous = (state.tally.asked > 0).then_some(state.tally);
            state.tally = MinuteTally::default();
            state.minute_started = now;
            first_of_minute = true;
        }
        let admitted = state.tokens >= 1.0;
        if admitted {
            state.tokens -= 1.0;
        }
        state.tally.asked += 1;
        if !admitted {
            state.tally.refused += 1;
        }
        Admission {
            admitted,
            first_of_minute,
            previous,
            ended,
        }
    }

    /// Adds entries an admitted Forget of `uid` removed to its minute.
    pub fn forgotten(&mut self, uid: u32, entries: u32) {
        if let Some(state) = self.uids.get_mut(&uid) {
            state.tally.forgotten += u64::from(entries);
        }
    }

    /// At most once a minute: the minutes that ended with no Forget after them (returned,
    /// to be logged, and reset), and the uids idle long enough to hold a full bucket again
    /// (dropped: a new entry for them starts full, the same thing).
    /// `asking` is left to `admit`, which logs its minute itself.
    fn sweep(&mut self, now: Instant, asking: u32) -> Vec<MinuteSummary> {
        if self
            .last_sweep
            .is_some_and(|last| now.saturating_duration_since(last) < WINDOW)
        {
            return Vec::new();
        }
        self.last_sweep = Some(now);
        let mut ended = Vec::new();
        self.uids.retain(|&uid, state| {
            if uid == asking {
                return true;
            }
            let since = now.saturating_duration_since(state.minute_started);
            if since < WINDOW {
                return true;
            }
            if state.tally.asked > 0 {
                ended.push(MinuteSummary {
                    uid,
                    tally: state.tally,
                });
                state.tally = MinuteTally::default();
            }
            // A minute without Forgets refills a bucket from empty.
            now.saturating_duration_since(state.refilled_at) < WINDOW
        });
        ended.sort_by_key(|summary| summary.uid);
        ended
    }

    /// Uids with a budget or a minute held now.
    #[cfg(test)]
    fn uids_held(&self) -> usize {
        self.uids.len()
    }
}

/// The budget as the Forget handler uses it: one lock, held for one `admit`, never across
/// an await.
pub struct ExactForgets {
    budget: Mutex<ExactForgetBudget>,
    counters: ExactForgetCounters,
}

crate::report::stats_registry! {
    /// What the budget refused.
    #[derive(Default)]
    struct ExactForgetCounters {
        /// Exact-key Forgets answered RESOURCE_EXHAUSTED: their uid was over its budget.
        refused: AtomicU64 as exact_forgets_refused => counter(
            78,
            "Forgets of one key refused: their uid was over --max-exact-forgets-per-uid.",
        ),
    }
}

impl ExactForgets {
    pub fn new(per_minute: u32) -> Self {
        ExactForgets {
            budget: Mutex::new(ExactForgetBudget::new(per_minute)),
            counters: ExactForgetCounters::default(),
        }
    }

    /// Takes one exact-key Forget of `scope` by `uid` from its budget, or refuses it
    /// (RESOURCE_EXHAUSTED naming the flag); logs the line of the uid's minute if it is the
    /// first, and the minutes of others the sweep found ended.
    pub fn admit(&self, uid: u32, scope: &str) -> Result<(), Error> {
        let (admission, per_minute) = {
            let mut budget = crate::sync::lock(&self.budget);
            (budget.admit(uid, Instant::now()), budget.per_minute())
        };
        for ended in &admission.ended {
            log_minute(ended.uid, &ended.tally);
        }
        if admission.first_of_minute {
            let previous = admission.previous.unwrap_or_default();
            tracing::info!(
                uid,
                %scope,
                admitted = admission.admitted,
                previous_minute_asked = previous.asked,
                previous_minute_refused = previous.refused,
                previous_minute_forgotten = previous.forgotten,
                "Forget of one key (only_if): the first of this uid's minute; the rest of \
                 the minute is summed up in one line"
            );
        }
        if admission.admitted {
            return Ok(());
        }
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        Err(Error::ExactForgetsPerUid {
            uid,
            limit: per_minute,
        })
    }

    /// Adds what an admitted Forget of `uid` removed to its minute.
    pub fn forgotten(&self, uid: u32, entries: u32) {
        crate::sync::lock(&self.budget).forgotten(uid, entries);
    }
}

fn log_minute(uid: u32, tally: &MinuteTally) {
    tracing::info!(
        uid,
        asked = tally.asked,
        refused = tally.refused,
        forgotten = tally.forgotten,
        "Forgets of one key (only_if) in this uid's last minute"
    );
}

crate::report::stats_registry! {
    /// The budget's Stats fields.
    impl FillStats for ExactForgets {
        fn fill_stats(forgets, stats) {
            let per_minute = crate::sync::lock(&forgets.budget).per_minute();
        }
        include ExactForgetCounters = forgets.counters;
        fields {
            max_exact_forgets_per_uid = u64::from(per_minute) => gauge(
                77,
                "Forgets of one key (only_if) one uid may ask per minute (--max-exact-forgets-per-uid).",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_uid_gets_its_minute_at_once_then_the_rate_and_other_uids_are_untouched() {
        let start = Instant::now();
        let mut budget = ExactForgetBudget::new(60);
        for i in 0..60 {
            assert!(budget.admit(7, start).admitted, "burst {i}");
        }
        assert!(!budget.admit(7, start).admitted, "past the budget");
        assert!(budget.admit(8, start).admitted, "another uid has its own");
        // One more a second.
        assert!(!budget.admit(7, start + SEC / 2).admitted);
        assert!(budget.admit(7, start + SEC).admitted);
        assert!(!budget.admit(7, start + SEC).admitted);
        // A minute idle fills the bucket again, and no more than that.
        let later = start + 10 * WINDOW;
        let admitted = (0..100).filter(|_| budget.admit(7, later).admitted).count();
        assert_eq!(admitted, 60);
    }

    #[test]
    fn one_line_per_uid_per_minute_carries_the_minute_before() {
        let start = Instant::now();
        let mut budget = ExactForgetBudget::new(2);
        let first = budget.admit(7, start);
        assert!(first.first_of_minute && first.previous.is_none());
        let logged = (0..4)
            .map(|_| budget.admit(7, start + SEC))
            .filter(|a| a.first_of_minute)
            .count();
        assert_eq!(logged, 0, "the rest of the minute is counted, not logged");
        budget.forgotten(7, 1);
        let next = budget.admit(7, start + WINDOW);
        assert!(next.first_of_minute);
        assert_eq!(
            next.previous,
            Some(MinuteTally {
                asked: 5,
                refused: 3,
                forgotten: 1
            })
        );
    }

    #[test]
    fn the_adapter_refuses_past_the_budget_naming_the_flag_and_counts_it() {
        let forgets = ExactForgets::new(2);
        forgets.admit(7, "ns/op/dev/p (shared)").unwrap();
        forgets.admit(7, "ns/op/dev/p (shared)").unwrap();
        let refused = forgets.admit(7, "ns/op/dev/p (shared)").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .to_string()
                .contains("--max-exact-forgets-per-uid 2"),
            "{refused}"
        );
        forgets.admit(8, "ns/op/dev/p (shared)").unwrap();
        let mut stats = tunecache_proto::v1::StatsResponse::default();
        crate::report::FillStats::fill_stats(&forgets, &mut stats);
        assert_eq!(
            (stats.max_exact_forgets_per_uid, stats.exact_forgets_refused),
            (2, 1)
        );
    }

    #[test]
    fn a_minute_nobody_followed_is_summed_up_by_the_sweep_and_idle_uids_go() {
        let start = Instant::now();
        let mut budget = ExactForgetBudget::new(10);
        budget.admit(7, start);
        budget.admit(7, start);
        budget.admit(9, start);
        assert_eq!(budget.uids_held(), 2);
        // Another uid's Forget after both minutes ended: the sweep reports them.
        let at = budget.admit(8, start + WINDOW);
        assert_eq!(
            at.ended,
            vec![
                MinuteSummary {
                    uid: 7,
                    tally: MinuteTally {
                        asked: 2,
                        refused: 0,
                        forgotten: 0
                    }
                },
                MinuteSummary {
                    uid: 9,
                    tally: MinuteTally {
                        asked: 1,
                        refused: 0,
                        forgotten: 0
                    }
                },
            ]
        );
        assert_eq!(
            budget.uids_held(),
            1,
            "idle a minute: only uid 8, which just asked"
        );
        // Logged once: a later sweep has nothing more for them.
        let at = budget.admit(8, start + 3 * WINDOW);
        assert!(at.ended.is_empty());
    }
}
