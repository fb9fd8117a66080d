//! The rules of job views, with no runtime, socket or Redis in them: within one view, the
//! first answer for a key is pinned, and every later read of that key in the view returns
//! it, even after a better result is stored. Events come in as method calls with the time
//! they happened; the adapter (`views`) does the I/O.
//!
//! - A read answers the view's pin if it has one; else the cache's winner is the candidate to
//!   pin, and a miss pins nothing (`answer`).
//! - `pin` is how a candidate enters (after the cluster tier said which pin is first): the
//!   first pin of a key in a view wins, here as in Redis.
//! - A Forget drops the pins whose result it removes (`forget::drops`): a view must not keep
//!   handing out a config an operator removed as broken.
//! - A view ends after `idle` without a request (checked on its next request too, so the
//!   rule does not depend on the sweep's timing), or when an operator ends it.
//! - The total of pins is capped: whole views go, the one idle longest first, never the one
//!   being read. A view that alone holds the cap answers new keys unpinned (counted, logged
//!   once by the adapter) rather than grow.
//!
//! Pins are `StoredEntry`s in an `EntryMap` per view: a pin of the cache's own winner shares
//! its bytes, and a Scan merges the view's map (an O(1) copy) with the cache's in key order.

use std::collections::HashMap;
use std::ops::Bound;
use std::time::{Duration, Instant};

use crate::model::entry::KeyView;
use crate::model::forget::Tombstone;
use crate::model::merge::rank_views;
use crate::wire::stored::{EntryMap, StoredEntry};

/// Counters the Stats and metrics report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinCounters {
    /// Pins made (first answers of a key in a view).
    pub pinned: u64,
    /// Reads answered with a pin while the cache held a better result.
    pub conflicts: u64,
    /// Pins dropped with whole views to hold the cap.
    pub evicted: u64,
    /// Views ended for being idle.
    pub ended_idle: u64,
    /// Views ended by an operator.
    pub ended: u64,
    /// Pins dropped by Forgets.
    pub forgotten: u64,
    /// Answers left unpinned because their view alone held the cap.
    pub over_cap: u64,
}

struct View {
    pins: EntryMap,
    last_request: Instant,
}

/// One view as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSummary {
    pub name: String,
    pub pins: usize,
    pub idle: Duration,
}

/// What a read of one key in a view answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// The view's pin.
    Pinned(StoredEntry),
    /// No pin yet: the cache's winner, to be pinned (`pin`) before it is answered.
    Candidate(StoredEntry),
    /// No pin and no result: a miss, nothing pinned.
    Miss,
}

/// What `pin` did that the adapter logs (once) and counts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Views dropped whole to hold the cap.
    pub views: Vec<String>,
    pub pins: usize,
    /// Answers of the pinning view left unpinned: it alone holds the cap.
    pub over_cap: usize,
}

pub struct ViewPins {
    views: HashMap<String, View>,
    total: usize,
    max_pins: usize,
    idle: Duration,
    counters: PinCounters,
}

impl ViewPins {
    pub fn new(max_pins: usize, idle: Duration) -> ViewPins {
        ViewPins {
            views: HashMap::new(),
            total: 0,
            max_pins: max_pins.max(1),
            idle,
            counters: PinCounters::default(),
        }
    }

    pub fn counters(&self) -> PinCounters {
        self.counters
    }

    pub fn total_pins(&self) -> usize {
        self.total
    }

    pub fn view_count(&self) -> usize {
        self.views.len()
    }

    pub fn max_pins(&self) -> usize {
        self.max_pins
    }

    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// A request in `view` at `now`: the view's entry, created if new, emptied first if it
    /// was idle too long (it ended; this request starts it afresh).
    fn touch(&mut self, view: &str, now: Instant) -> &mut View {
        let expired = self
            .views
            .get(view)
            .is_some_and(|v| now.saturating_duration_since(v.last_request) >= self.idle);
        if expired {
            self.remove(view);
            self.counters.ended_idle += 1;
        }
        let entry = self.views.entry(view.to_owned()).or_insert_with(|| View {
            pins: EntryMap::new(),
            last_request: now,
        });
        entry.last_request = entry.last_request.max(now);
        entry
    }

    /// A read of `key` in `view`, while the cache's winner is `current`.
    pub fn answer(
        &mut self,
        view: &str,
        key: &KeyView<'_>,
        current: Option<&StoredEntry>,
        now: Instant,
    ) -> Answer {
        let pinned = self.touch(view, now).pins.get_view(key).cloned();
        match (pinned, current) {
            (Some(pinned), current) => {
                self.count_conflict(&pinned, current);
                Answer::Pinned(pinned)
            }
            (None, Some(current)) => Answer::Candidate(current.clone()),
            (None, None) => Answer::Miss,
        }
    }

    /// Counts a read answered with `pinned` while the cache held a better `current`.
    fn count_conflict(&mut self, pinned: &StoredEntry, current: Option<&StoredEntry>) {
        if current.is_some_and(|current| is_conflict(pinned, current)) {
            self.counters.conflicts += 1;
        }
    }

    /// Counts `n` reads answered with a pin while a better result was stored (a Scan's).
    pub fn add_conflicts(&mut self, n: u64) {
        self.counters.conflicts += n;
    }

    /// The pins of `view` (an O(1) copy, for a Scan to merge with the cache), as a request.
    pub fn pins_of(&mut self, view: &str, now: Instant) -> EntryMap {
        self.touch(view, now).pins.clone()
    }

    /// Pins each of `entries` in `view` unless the view pinned its key already; returns, in
    /// order, what the view answers for each key from now on, and what the cap dropped.
    /// `planned`: the view's pins the entries were found missing from (`pins_of`); while the
    /// view still holds exactly those, no key needs looking up again (a Scan's first read).
    pub fn pin(
        &mut self,
        view: &str,
        entries: Vec<StoredEntry>,
        planned: Option<&EntryMap>,
        now: Instant,
    ) -> (Vec<StoredEntry>, Evicted) {
        let current = &self.touch(view, now).pins;
        let unchanged = planned.is_some_and(|planned| current.ptr_eq(planned));
        let mut evicted = Evicted::default();
        let mut answers = Vec::with_capacity(entries.len());
        for entry in entries {
            let pinned = if unchanged {
                None
            } else {
                self.views
                    .get(view)
                    .and_then(|v| v.pins.get_view(&entry.key()))
            };
            if let Some(pinned) = pinned {
                answers.push(pinned.clone());
                continue;
            }
            if self.total >= self.max_pins {
                self.make_room(view, &mut evicted);
            }
            if self.total >= self.max_pins {
                evicted.over_cap += 1;
                self.counters.over_cap += 1;
                answers.push(entry);
                continue;
            }
            if let Some(v) = self.views.get_mut(view) {
                // A key twice in one batch (a Lookup may ask so) has one candidate.
                if v.pins.insert(entry.clone()) {
                    self.total += 1;
                    self.counters.pinned += 1;
                }
            }
            answers.push(entry);
        }
        (answers, evicted)
    }

    /// Drops the view idle longest other than `reading`, if there is one.
    fn make_room(&mut self, reading: &str, evicted: &mut Evicted) {
        let oldest = self
            .views
            .iter()
            .filter(|(name, view)| name.as_str() != reading && !view.pins.is_empty())
            .min_by(|(a_name, a), (b_name, b)| {
                a.last_request
                    .cmp(&b.last_request)
                    .then_with(|| a_name.cmp(b_name))
            })
            .map(|(name, _)| name.clone());
        if let Some(oldest) = oldest {
            let pins = self.remove(&oldest);
            self.counters.evicted += pins as u64;
            evicted.pins += pins;
            evicted.views.push(oldest);
        }
    }

    fn remove(&mut self, view: &str) -> usize {
        let pins = self.views.remove(view).map_or(0, |v| v.pins.len());
        self.total -= pins;
        pins
    }

    /// Ends `view` (an operator's `tunecache view end`): how many pins it held, `None` if
    /// there was no such view.
    pub fn end(&mut self, view: &str) -> Option<usize> {
        if !self.views.contains_key(view) {
            return None;
        }
        self.counters.ended += 1;
        Some(self.remove(view))
    }

    /// Ends the views without a request for `idle` or longer; returns their names.
    pub fn expire_idle(&mut self, now: Instant) -> Vec<String> {
        let idle = self.idle;
        let ended: Vec<String> = self
            .views
            .iter()
            .filter(|(_, view)| now.saturating_duration_since(view.last_request) >= idle)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &ended {
            self.remove(name);
        }
        self.counters.ended_idle += ended.len() as u64;
        ended
    }

    /// The views with a request since `since`: the cluster tier keeps their Redis pins alive.
    pub fn requested_since(&self, since: Instant) -> Vec<String> {
        self.views
            .iter()
            .filter(|(_, view)| view.last_request >= since)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Drops, in every view, the pins `tombstone` removes; returns how many.
    pub fn forget(&mut self, tombstone: &Tombstone) -> usize {
        let mut dropped = 0;
        for view in self.views.values_mut() {
            dropped += view.pins.remove_dropped_by(tombstone).len();
        }
        self.total -= dropped;
        self.counters.forgotten += dropped as u64;
        dropped
    }

    /// The views, most recently requested first.
    pub fn list(&self, now: Instant) -> Vec<ViewSummary> {
        let mut views: Vec<ViewSummary> = self
            .views
            .iter()
            .map(|(name, view)| ViewSummary {
                name: name.clone(),
                pins: view.pins.len(),
                idle: now.saturating_duration_since(view.last_request),
            })
            .collect();
        views.sort_by(|a, b| a.idle.cmp(&b.idle).then_with(|| a.name.cmp(&b.name)));
        views
    }
}

/// A pin answered while the cache holds `current`, a better result.
pub fn is_conflict(pinned: &StoredEntry, current: &StoredEntry) -> bool {
    !current.same_entry(pinned) && rank_views(current.result(), pinned.result()).is_lt()
}

/// A Scan chunk in a view, in key order: `chosen` (the cache's matching entries from `start`
/// to `end`, `None` meaning to the end of the Scan, where `in_scan` stops holding) merged with
/// the `pins` in that range that `keep` accepts (the Scan's filter). A pinned key answers its
/// pin; another chosen entry is a candidate to pin. Also returns how many pins answered while
/// a better result was stored.
pub fn merge_chunk(
    pins: &EntryMap,
    chosen: &[&StoredEntry],
    start: Bound<KeyView<'_>>,
    end: Option<&StoredEntry>,
    in_scan: impl Fn(&StoredEntry) -> bool,
    keep: impl Fn(&StoredEntry) -> bool,
) -> (Vec<Answer>, u64) {
    let mut answers = Vec::with_capacity(chosen.len());
    let mut conflicts = 0;
    // Stops at the end of the chunk, or of the Scan's namespace: a view's pins of other
    // namespaces are never walked.
    let mut pinned = pins
        .range_from(start)
        .take_while(|pin| end.map_or_else(|| in_scan(pin), |end| *pin <= end))
        .filter(|pin| keep(pin))
        .peekable();
    for &entry in chosen {
        while let Some(pin) = pinned.next_if(|pin| *pin < entry) {
            answers.push(Answer::Pinned(pin.clone()));
        }
        match pinned.next_if(|pin| *pin == entry) {
            Some(pin) => {
                if is_conflict(pin, entry) {
                    conflicts += 1;
                }
                answers.push(Answer::Pinned(pin.clone()));
            }
            None => answers.push(Answer::Candidate(entry.clone())),
        }
    }
    answers.extend(pinned.map(|pin| Answer::Pinned(pin.clone())));
    (answers, conflicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::forget::{ForgetScope, RankScope};

    fn key(problem: &str) -> CacheKey {
        CacheKey {
            namespace: "ns".into(),
            op: "gemm".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        }
    }

    fn entry(problem: &str, time_us: f64) -> StoredEntry {
        entry_at(problem, time_us, 0)
    }

    fn entry_at(problem: &str, time_us: f64, forget_epoch: u64) -> StoredEntry {
        StoredEntry::new(
            &key(problem),
            &TunedResult {
                config: format!("{{\"t\":{time_us}}}"),
                time_us,
                tuned_by: "x".into(),
                tuned_at_unix_ms: 1,
                forget_epoch,
            },
        )
    }

    fn read(pins: &mut ViewPins, view: &str, current: &StoredEntry, now: Instant) -> StoredEntry {
        match pins.answer(view, &current.key(), Some(current), now) {
            Answer::Pinned(pinned) => pinned,
            Answer::Candidate(candidate) => pins.pin(view, vec![candidate], None, now).0.remove(0),
            Answer::Miss => panic!("a miss with a current result"),
        }
    }

    #[test]
    fn the_first_answer_is_pinned_and_a_better_result_later_changes_nothing_in_the_view() {
        let now = Instant::now();
        let mut pins = ViewPins::new(100, Duration::from_secs(60));
        let (r1, r2) = (entry("k", 5.0), entry("k", 2.0));
        assert!(read(&mut pins, "job-1", &r1, now).same_entry(&r1));
        assert!(read(&mut pins, "job-1", &r2, now).same_entry(&r1));
        assert_eq!(pins.counters().conflicts, 1);
        // Another view sees the better one, and pins it.
        assert!(read(&mut pins, "job-2", &r2, now).same_entry(&r2));
        // A miss pins nothing; the result that fills it is pinned by `pin`, first one wins.
        let m = key("m");
        assert!(matches!(
            pins.answer("job-1", &m.view(), None, now),
            Answer::Miss
        ));
        let (first, second) = (entry("m", 3.0), entry("m", 1.0));
        assert!(pins.pin("job-1", vec![first.clone()], None, now).0[0].same_entry(&first));
        assert!(
            pins.pin("job-1", vec![second], None, now).0[0].same_entry(&first),
            "the first pin wins"
        );
        assert_eq!(pins.total_pins(), 3);
        assert_eq!(pins.counters().pinned, 3);
    }

    #[test]
    fn a_forget_drops_the_pins_it_removes_and_keeps_those_recorded_after_it() {
        let now = Instant::now();
        let mut pins = ViewPins::new(100, Duration::from_secs(60));
        read(&mut pins, "job-1", &entry("k", 5.0), now);
        let later = entry_at("k", 9.0, 10);
        read(&mut pins, "job-2", &later, now);
        let tombstone = Tombstone {
            scope: ForgetScope {
                namespace: "ns".into(),
                op: "gemm".into(),
                device: String::new(),
                problem: String::new(),
                rank: RankScope::Every,
            },
            stamp: 10,
        };
        assert_eq!(pins.forget(&tombstone), 1);
        assert!(matches!(
            pins.answer("job-1", &key("k").view(), None, now),
            Answer::Miss
        ));
        match pins.answer("job-2", &key("k").view(), None, now) {
            Answer::Pinned(pinned) => assert!(pinned.same_entry(&later)),
            other => panic!("{other:?}"),
        }
        assert_eq!(pins.total_pins(), 1);
        assert_eq!(pins.counters().forgotten, 1);
    }

    #[test]
    fn idle_views_end_and_the_cap_drops_the_view_idle_longest() {
        let start = Instant::now();
        let mut pins = ViewPins::new(3, Duration::from_secs(60));
        read(&mut pins, "old", &entry("a", 1.0), start);
        read(&mut pins, "old", &entry("b", 1.0), start);
        let later = start + Duration::from_secs(30);
        read(&mut pins, "new", &entry("a", 1.0), later);
        let (_, evicted) = pins.pin("new", vec![entry("b", 1.0)], None, later);
        assert_eq!(evicted.views, vec!["old".to_owned()]);
        assert_eq!(pins.total_pins(), 2);
        assert_eq!(pins.counters().evicted, 2);
        assert_eq!(
            pins.list(later),
            vec![ViewSummary {
                name: "new".into(),
                pins: 2,
                idle: Duration::ZERO
            }]
        );
        assert!(pins.expire_idle(later + Duration::from_secs(59)).is_empty());
        assert_eq!(
            pins.expire_idle(later + Duration::from_secs(60)),
            vec!["new".to_owned()]
        );
        assert_eq!(pins.total_pins(), 0);
        assert_eq!(pins.end("new"), None);
    }

    #[test]
    fn a_view_alone_at_the_cap_answers_new_keys_unpinned_and_keeps_its_pins() {
        let now = Instant::now();
        let mut pins = ViewPins::new(2, Duration::from_secs(60));
        read(&mut pins, "job", &entry("a", 1.0), now);
        read(&mut pins, "job", &entry("b", 1.0), now);
        let (answers, evicted) = pins.pin("job", vec![entry("c", 1.0)], None, now);
        assert!(answers[0].same_entry(&entry("c", 1.0)));
        assert_eq!(evicted.over_cap, 1);
        assert_eq!(pins.total_pins(), 2);
        // Its old pins still answer.
        assert!(read(&mut pins, "job", &entry("a", 0.5), now).same_entry(&entry("a", 1.0)));
    }

    #[test]
    fn a_request_after_the_idle_time_starts_the_view_afresh_without_the_sweep() {
        let start = Instant::now();
        let mut pins = ViewPins::new(10, Duration::from_secs(60));
        read(&mut pins, "job", &entry("a", 5.0), start);
        let after = start + Duration::from_secs(61);
        assert!(read(&mut pins, "job", &entry("a", 1.0), after).same_entry(&entry("a", 1.0)));
        assert_eq!(pins.counters().ended_idle, 1);
        assert_eq!(pins.total_pins(), 1);
    }

    #[test]
    fn a_scan_chunk_answers_pins_in_its_range_also_of_keys_the_cache_lacks() {
        let (a, b, c, d) = (
            entry("a", 1.0),
            entry("b", 1.0),
            entry("c", 1.0),
            entry("d", 1.0),
        );
        let pinned_b = entry("b", 9.0);
        // Pinned: b (worse than the cache's), a0 (a key the cache lacks, between a and b),
        // and e (after the chunk's end).
        let pins: EntryMap = [pinned_b.clone(), entry("a0", 4.0), entry("e", 2.0)]
            .into_iter()
            .collect();
        let chosen = [&a, &b, &c];
        let (answers, conflicts) = merge_chunk(
            &pins,
            &chosen,
            Bound::Included(KeyView::namespace_start("ns")),
            Some(&d),
            |_| true,
            |_| true,
        );
        let shown: Vec<(String, bool)> = answers
            .iter()
            .map(|answer| match answer {
                Answer::Pinned(e) => (format!("{}@{}", problem(e), e.result().time_us), true),
                Answer::Candidate(e) => (format!("{}@{}", problem(e), e.result().time_us), false),
                Answer::Miss => ("miss".to_owned(), false),
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                ("a@1".to_owned(), false),
                ("a0@4".to_owned(), true),
                ("b@9".to_owned(), true),
                ("c@1".to_owned(), false),
            ]
        );
        assert_eq!(conflicts, 1, "b's pin is worse than the cache's b");
        // The last chunk (no end) takes every pin left; the filter applies to pins too.
        let every = |_: &StoredEntry| true;
        let after_c = || Bound::Excluded(c.key());
        let (answers, _) = merge_chunk(&pins, &[&d], after_c(), None, every, every);
        assert_eq!(answers.len(), 2);
        let not_e = |e: &StoredEntry| problem(e) != "e";
        let (answers, _) = merge_chunk(&pins, &[&d], after_c(), None, every, not_e);
        assert_eq!(answers.len(), 1);
        // The walk stops where the Scan ends (its namespace), not at the map's end.
        let (answers, _) = merge_chunk(&pins, &[&d], after_c(), None, not_e, every);
        assert_eq!(answers.len(), 1);
    }

    fn problem(entry: &StoredEntry) -> String {
        entry.key().problem.to_owned()
    }

    mod laws {
        use super::*;
        use proptest::prelude::*;
        use std::collections::HashMap as Map;

        #[derive(Clone, Debug)]
        enum Op {
            /// A read of key `k` in view `v` while the cache holds time `t` (None: a miss).
            Read {
                v: u8,
                k: u8,
                t: Option<u8>,
            },
            /// A Forget of key `k`, stamped above every epoch so far.
            Forget {
                k: u8,
            },
            End {
                v: u8,
            },
            /// Time passes, in seconds.
            Wait {
                secs: u8,
            },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0..4u8, 0..6u8, proptest::option::weighted(0.8, 0..5u8))
                    .prop_map(|(v, k, t)| Op::Read { v, k, t }),
                1 => (0..6u8).prop_map(|k| Op::Forget { k }),
                1 => (0..4u8).prop_map(|v| Op::End { v }),
                1 => (0..40u8).prop_map(|secs| Op::Wait { secs }),
            ]
        }

        proptest! {
            /// Whatever happens, a view answers a key the same way from its first answer on,
            /// until a Forget of the key, the view's end (operator, idle, or the cap); and the
            /// node never holds more pins than the cap.
            #[test]
            fn a_view_answers_a_key_the_same_until_something_ends_the_pin(
                ops in proptest::collection::vec(op(), 1..200),
                cap in 1..12usize,
            ) {
                let idle = Duration::from_secs(60);
                let start = Instant::now();
                let mut now = start;
                let mut pins = ViewPins::new(cap, idle);
                // What each (view, key) answered first, while no event ended it.
                let mut first: Map<(u8, u8), String> = Map::new();
                let mut epoch = 0u64;
                for op in ops {
                    match op {
                        Op::Read { v, k, t } => {
                            let view = format!("v{v}");
                            let problem = format!("k{k}");
                            let current = t.map(|t| entry_at(&problem, f64::from(t), epoch));
                            let before = pins.counters();
                            let answer = match pins.answer(&view, &key(&problem).view(), current.as_ref(), now) {
                                Answer::Pinned(pinned) => Some(pinned),
                                Answer::Candidate(c) => {
                                    let (mut answers, evicted) = pins.pin(&view, vec![c], None, now);
                                    for gone in &evicted.views {
                                        let gone: u8 = gone[1..].parse().unwrap();
                                        first.retain(|(fv, _), _| *fv != gone);
                                    }
                                    if evicted.over_cap > 0 {
                                        // Unpinned: this answer promises nothing.
                                        answers.pop();
                                        None
                                    } else {
                                        answers.pop()
                                    }
                                }
                                Answer::Miss => None,
                            };
                            if pins.counters().ended_idle > before.ended_idle {
                                first.retain(|(fv, _), _| *fv != v);
                            }
                            if let Some(answer) = answer {
                                let shown = format!("{}@{}", answer.result().config, answer.result().forget_epoch);
                                let held = first.entry((v, k)).or_insert_with(|| shown.clone());
                                prop_assert_eq!(&*held, &shown, "view {} key {}", v, k);
                            }
                        }
                        Op::Forget { k } => {
                            epoch += 1;
                            let problem = format!("k{k}");
                            pins.forget(&Tombstone {
                                scope: ForgetScope::exact(&key(&problem)),
                                stamp: epoch,
                            });
                            first.retain(|(_, fk), _| *fk != k);
                        }
                        Op::End { v } => {
                            pins.end(&format!("v{v}"));
                            first.retain(|(fv, _), _| *fv != v);
                        }
                        Op::Wait { secs } => {
                            now += Duration::from_secs(u64::from(secs));
                            for ended in pins.expire_idle(now) {
                                let gone: u8 = ended[1..].parse().unwrap();
                                first.retain(|(fv, _), _| *fv != gone);
                            }
                        }
                    }
                    prop_assert!(pins.total_pins() <= cap);
                    let listed: usize = pins.list(now).iter().map(|v| v.pins).sum();
                    prop_assert_eq!(listed, pins.total_pins());
                }
            }
        }
    }
}
