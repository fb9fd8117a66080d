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
//! - A view belongs to its reader's uid ([`ViewId`]), and each uid's views are capped, in
//!   pins (`max_pins_per_uid`) and in views, empty ones included (`max_views_per_uid`). A
//!   uid at a cap makes room from its own views only, the one idle longest first, never the
//!   one being read: no uid can evict another's pins. A view that alone holds its uid's cap,
//!   or a read while the node holds its total cap (`max_pins`), answers new keys unpinned
//!   (counted, logged once by the adapter) rather than grow.
//! - Every step costs O(log n) in the views held: views are kept in idle order (per uid, and
//!   node-wide for expiry), never walked to find one to drop.
//!
//! Pins are `StoredEntry`s in an `EntryMap` per view: a pin of the cache's own winner shares
//! its bytes, and a Scan merges the view's map (an O(1) copy) with the cache's in key order.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

use crate::model::entry::KeyView;
use crate::model::forget::Tombstone;
use crate::model::merge::rank_views;
pub use crate::model::names::ViewId;
use crate::wire::stored::{EntryMap, StoredEntry};

crate::report::stats_registry! {
    /// Counters the Stats and metrics report.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PinCounters {
        /// Pins made (first answers of a key in a view).
        pub pinned: u64 as view_pins_made
            => counter(85, "First answers pinned in a view (here, or taken from the cluster)."),
        /// Reads answered with a pin while the cache held a better result.
        pub conflicts: u64 as view_pin_conflicts
            => counter(86, "View reads answered with a pin while a better result was stored."),
        /// Pins dropped with whole views to hold a uid's caps.
        pub evicted: u64 as view_pins_evicted
            => counter(89, "Pins dropped with whole views to hold their uid's caps."),
        /// Whole views dropped to hold a uid's caps.
        pub views_evicted: u64 => counter(90, "Whole views dropped to hold their uid's caps."),
        /// Views ended for being idle.
        pub ended_idle: u64 as views_ended_idle
            => counter(93, "Views ended after --view-idle-secs without a request."),
        /// Views ended by an operator.
        pub ended: u64 as views_ended => counter(94, "Views ended by an operator."),
        /// Pins dropped by Forgets.
        pub forgotten: u64 as view_pins_forgotten => counter(92, "Pins dropped by Forgets."),
        /// Answers left unpinned: their view alone held its uid's cap, or the node its total.
        pub over_cap: u64 as view_pins_over_cap => counter(
            91,
            "Answers left unpinned: their view alone held its uid's cap, or the node --max-view-pins.",
        ),
    }
}

/// The caps and the idle time.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Pins on the node, all uids.
    pub max_pins: usize,
    /// Pins of one uid's views.
    pub max_pins_per_uid: usize,
    /// Views of one uid, empty ones included.
    pub max_views_per_uid: usize,
    /// A view without a request this long ends.
    pub idle: Duration,
}

struct View {
    pins: EntryMap,
    last_request: Instant,
}

/// One uid's views, in idle order (all of them, and those holding pins).
#[derive(Default)]
struct Owner {
    pins: usize,
    by_idle: BTreeSet<(Instant, String)>,
    with_pins: BTreeSet<(Instant, String)>,
}

/// One view as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSummary {
    pub id: ViewId,
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

/// Why views were dropped whole, for the adapter to log (once each) and count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// To hold its uid's caps.
    Evicted(ViewId),
}

pub struct ViewPins {
    views: BTreeMap<ViewId, View>,
    owners: BTreeMap<u32, Owner>,
    /// Every view, in idle order: expiry and the cluster's keep-alive walk only the ends.
    by_idle: BTreeSet<(Instant, ViewId)>,
    total: usize,
    caps: Caps,
    counters: PinCounters,
    /// Views dropped since the adapter last asked (`take_dropped`).
    dropped: Vec<Dropped>,
    /// Views looked at to find one to drop: what keeps eviction O(log n) visible to tests.
    examined: u64,
}

/// A read of `key` in a view holding `pins`, while the cache's winner is `current`; and
/// whether a pin answered while the cache held a better result (a conflict). Pure: run on
/// a copy of the view's pins (`pins_of`), with no lock held.
pub fn answer_from(
    pins: &EntryMap,
    key: &KeyView<'_>,
    current: Option<&StoredEntry>,
) -> (Answer, bool) {
    match (pins.get_view(key), current) {
        (Some(pinned), current) => (
            Answer::Pinned(pinned.clone()),
            current.is_some_and(|current| is_conflict(pinned, current)),
        ),
        (None, Some(current)) => (Answer::Candidate(current.clone()), false),
        (None, None) => (Answer::Miss, false),
    }
}

impl ViewPins {
    pub fn new(caps: Caps) -> ViewPins {
        ViewPins {
            views: BTreeMap::new(),
            owners: BTreeMap::new(),
            by_idle: BTreeSet::new(),
            total: 0,
            caps: Caps {
                max_pins: caps.max_pins.max(1),
                max_pins_per_uid: caps.max_pins_per_uid.max(1),
                max_views_per_uid: caps.max_views_per_uid.max(1),
                idle: caps.idle,
            },
            counters: PinCounters::default(),
            dropped: Vec::new(),
            examined: 0,
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

    pub fn caps(&self) -> Caps {
        self.caps
    }

    pub fn idle(&self) -> Duration {
        self.caps.idle
    }

    /// Views looked at so far to find one to drop.
    #[cfg(test)]
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// The views dropped since the last call, for the adapter to log.
    pub fn take_dropped(&mut self) -> Vec<Dropped> {
        std::mem::take(&mut self.dropped)
    }

    /// A request in `view` at `now`: the view's entry, created if new (its uid's idle-longest
    /// view goes first if the uid holds its view cap), emptied first if it was idle too long
    /// (it ended; this request starts it afresh).
    fn touch(&mut self, view: &ViewId, now: Instant) -> &mut View {
        let last = self.views.get(view).map(|v| v.last_request);
        match last {
            Some(last) if now.saturating_duration_since(last) >= self.caps.idle => {
                self.remove(view);
                self.counters.ended_idle += 1;
                self.create(view, now);
            }
            Some(last) if now > last => self.reindex(view, last, now),
            Some(_) => {}
            None => self.create(view, now),
        }
        // Made or kept above; the fallback only keeps this total without a panic.
        self.views.entry(view.clone()).or_insert_with(|| View {
            pins: EntryMap::new(),
            last_request: now,
        })
    }

    fn create(&mut self, view: &ViewId, now: Instant) {
        let held = self
            .owners
            .get(&view.uid)
            .map_or(0, |owner| owner.by_idle.len());
        if held >= self.caps.max_views_per_uid {
            self.evict_from(view, false);
        }
        self.views.insert(
            view.clone(),
            View {
                pins: EntryMap::new(),
                last_request: now,
            },
        );
        self.by_idle.insert((now, view.clone()));
        self.owners
            .entry(view.uid)
            .or_default()
            .by_idle
            .insert((now, view.name.clone()));
    }

    /// Moves `view` in the idle orders from `last` to `now`.
    fn reindex(&mut self, view: &ViewId, last: Instant, now: Instant) {
        let Some(entry) = self.views.get_mut(view) else {
            return;
        };
        entry.last_request = now;
        let has_pins = !entry.pins.is_empty();
        let id = (last, view.clone());
        self.by_idle.remove(&id);
        self.by_idle.insert((now, id.1));
        if let Some(owner) = self.owners.get_mut(&view.uid) {
            let named = (last, view.name.clone());
            owner.by_idle.remove(&named);
            owner.by_idle.insert((now, view.name.clone()));
            if has_pins {
                owner.with_pins.remove(&named);
                owner.with_pins.insert((now, view.name.clone()));
            }
        }
    }

    /// Drops the idle-longest view of `reading`'s uid other than `reading`: any view (for
    /// the view cap), or one holding pins (`with_pins`, for the pin cap). `false` if there
    /// is none.
    fn evict_from(&mut self, reading: &ViewId, with_pins: bool) -> bool {
        let Some(owner) = self.owners.get(&reading.uid) else {
            return false;
        };
        let order = if with_pins {
            &owner.with_pins
        } else {
            &owner.by_idle
        };
        // The view being read is skipped, so at most two are looked at.
        let mut victim = None;
        for (_, name) in order.iter().take(2) {
            self.examined += 1;
            if *name != reading.name {
                victim = Some(name.clone());
                break;
            }
        }
        let Some(name) = victim else {
            return false;
        };
        let id = ViewId {
            uid: reading.uid,
            name,
        };
        let pins = self.remove(&id);
        self.counters.evicted += pins as u64;
        self.counters.views_evicted += 1;
        self.dropped.push(Dropped::Evicted(id));
        true
    }

    /// Removes `view` and its pins from every index: how many pins it held.
    fn remove(&mut self, view: &ViewId) -> usize {
        let Some(gone) = self.views.remove(view) else {
            return 0;
        };
        let pins = gone.pins.len();
        self.total -= pins;
        self.by_idle.remove(&(gone.last_request, view.clone()));
        if let Some(owner) = self.owners.get_mut(&view.uid) {
            let named = (gone.last_request, view.name.clone());
            owner.by_idle.remove(&named);
            owner.with_pins.remove(&named);
            owner.pins -= pins;
            if owner.by_idle.is_empty() {
                self.owners.remove(&view.uid);
            }
        }
        pins
    }

    /// Counts `n` reads answered with a pin while a better result was stored.
    pub fn add_conflicts(&mut self, n: u64) {
        self.counters.conflicts += n;
    }

    /// The pins of `view` (an O(1) copy, for a read to answer from with no lock held), as a
    /// request in it.
    pub fn pins_of(&mut self, view: &ViewId, now: Instant) -> EntryMap {
        self.touch(view, now).pins.clone()
    }

    /// Pins each of `entries` in `view` unless the view pinned its key already; returns, in
    /// order, what the view answers for each key from now on, and how many were left
    /// unpinned (a cap). `planned`: the view's pins the entries were found missing from
    /// (`pins_of`); while the view still holds exactly those, no key needs looking up again
    /// (a Scan's first read). The adapter calls it a chunk of a request at a time, so no
    /// request holds the pins' lock for all its keys.
    pub fn pin(
        &mut self,
        view: &ViewId,
        entries: Vec<StoredEntry>,
        planned: Option<&EntryMap>,
        now: Instant,
    ) -> (Vec<StoredEntry>, usize) {
        let current = &self.touch(view, now).pins;
        let unchanged = planned.is_some_and(|planned| current.ptr_eq(planned));
        let mut over_cap = 0;
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
            if self.owner_pins(view.uid) >= self.caps.max_pins_per_uid {
                self.evict_from(view, true);
            }
            if self.owner_pins(view.uid) >= self.caps.max_pins_per_uid
                || self.total >= self.caps.max_pins
            {
                over_cap += 1;
                self.counters.over_cap += 1;
                answers.push(entry);
                continue;
            }
            self.add_pin(view, entry.clone());
            answers.push(entry);
        }
        (answers, over_cap)
    }

    fn owner_pins(&self, uid: u32) -> usize {
        self.owners.get(&uid).map_or(0, |owner| owner.pins)
    }

    fn add_pin(&mut self, view: &ViewId, entry: StoredEntry) {
        let Some(v) = self.views.get_mut(view) else {
            return;
        };
        let was_empty = v.pins.is_empty();
        // A key twice in one batch (a Lookup may ask so) has one candidate.
        if !v.pins.insert(entry) {
            return;
        }
        let last = v.last_request;
        self.total += 1;
        self.counters.pinned += 1;
        if let Some(owner) = self.owners.get_mut(&view.uid) {
            owner.pins += 1;
            if was_empty {
                owner.with_pins.insert((last, view.name.clone()));
            }
        }
    }

    /// Ends `view` (an operator's `tunecache view end`): how many pins it held, `None` if
    /// there was no such view.
    pub fn end(&mut self, view: &ViewId) -> Option<usize> {
        if !self.views.contains_key(view) {
            return None;
        }
        self.counters.ended += 1;
        Some(self.remove(view))
    }

    /// The views of every uid named `name` (an operator ends a job's view by its name).
    pub fn named(&self, name: &str) -> Vec<ViewId> {
        self.owners
            .keys()
            .map(|&uid| ViewId {
                uid,
                name: name.to_owned(),
            })
            .filter(|id| self.views.contains_key(id))
            .collect()
    }

    /// Ends the views without a request for `idle` or longer; returns them.
    pub fn expire_idle(&mut self, now: Instant) -> Vec<ViewId> {
        let mut ended = Vec::new();
        while let Some((last, view)) = self.by_idle.first().cloned() {
            if now.saturating_duration_since(last) < self.caps.idle {
                break;
            }
            self.remove(&view);
            ended.push(view);
        }
        self.counters.ended_idle += ended.len() as u64;
        ended
    }

    /// The views with a request since `since`: the cluster tier keeps their Redis pins alive.
    pub fn requested_since(&self, since: Instant) -> Vec<ViewId> {
        let from = (
            since,
            ViewId {
                uid: 0,
                name: String::new(),
            },
        );
        self.by_idle
            .range(from..)
            .map(|(_, view)| view.clone())
            .collect()
    }

    /// Drops, in every view, the pins `tombstone` removes; returns how many.
    pub fn forget(&mut self, tombstone: &Tombstone) -> usize {
        let mut dropped = 0;
        for (id, view) in self.views.iter_mut() {
            let removed = view.pins.remove_dropped_by(tombstone).len();
            if removed == 0 {
                continue;
            }
            dropped += removed;
            if let Some(owner) = self.owners.get_mut(&id.uid) {
                owner.pins -= removed;
                if view.pins.is_empty() {
                    owner
                        .with_pins
                        .remove(&(view.last_request, id.name.clone()));
                }
            }
        }
        self.total -= dropped;
        self.counters.forgotten += dropped as u64;
        dropped
    }

    /// Up to `limit` views after `after` in (uid, name) order, only those of `uid` when it is
    /// given (a caller who is no administrator sees its own), and whether more follow.
    pub fn list(
        &self,
        now: Instant,
        uid: Option<u32>,
        after: Option<&ViewId>,
        limit: usize,
    ) -> (Vec<ViewSummary>, bool) {
        let start = match after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Included(ViewId {
                uid: uid.unwrap_or(0),
                name: String::new(),
            }),
        };
        let mut listed = self
            .views
            .range((start, Bound::Unbounded))
            .take_while(|(id, _)| uid.is_none_or(|uid| id.uid == uid))
            .map(|(id, view)| ViewSummary {
                id: id.clone(),
                pins: view.pins.len(),
                idle: now.saturating_duration_since(view.last_request),
            });
        let page: Vec<ViewSummary> = listed.by_ref().take(limit).collect();
        let more = listed.next().is_some();
        (page, more)
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
mod tests;
