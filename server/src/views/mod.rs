//! Job views (docs/views.md): every rank of a job sees the same winner for a key, on every
//! node. Within a view the first answer for a key is pinned; later reads in the view return
//! the pin even after a better result is stored, which every other view and every request
//! without a view gets at once.
//!
//! The rules are a plain type, [`pins::ViewPins`], tested without a runtime. This module is
//! its adapter, the one owner of the node's pins and the one door of every read: Lookup,
//! Scan and Resolve reach the cache and the coordinator through [`Views`] (`read`), with or
//! without a view. It asks the cluster tier which pin is first (the first node to pin a key
//! for a view wins, within the cluster timeout, else a counted node-local pin), and follows
//! the store's change feed: a Forget drops the pins it removes, and a Record made under a
//! lease granted in a view pins, in that view, the entry the lease holder produced (the
//! coordinator's lease says which view; a task of its own makes those pins). Its sweep ends
//! idle views and keeps active ones alive in Redis.

pub mod misses;
pub mod pins;
mod read;
pub mod replay;

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::cluster::Cluster;
use crate::coord::Coordinator;
use crate::model::entry::{CacheKey, KeyView};
use crate::report::LogOnce;
use crate::store::{Change, ChangeListener, ForgetChange, Source, Store};
use crate::tasks::Tasks;
use crate::wire::stored::{EntryMap, StoredEntry};
use pins::{Answer, Dropped, ViewPins};
pub use pins::{Caps, ViewId, ViewSummary};

pub use read::LookupPlan;
pub use replay::Replay;

/// Lease holders' results waiting for `run` to pin them; past this many (a writer far ahead
/// of Redis), the rest are not pinned from the feed, and the view's next read pins what the
/// cache holds then.
const MAX_QUEUED_LEASE_PINS: usize = 10_000;

/// Pins made under one hold of the pins' lock: a request of many keys takes it a chunk at a
/// time, so the other views' requests wait for a chunk at most, never for a whole request.
const PINS_PER_LOCK: usize = 256;

/// Longest ListViews page.
pub const MAX_LIST_PAGE: usize = 10_000;

/// What `--view-idle-secs`, `--max-view-pins`, `--max-view-pins-per-uid` and
/// `--max-views-per-uid` say.
pub type ViewSettings = Caps;

/// The defaults of the view flags.
pub const DEFAULT_CAPS: Caps = Caps {
    max_pins: 1_000_000,
    max_pins_per_uid: 250_000,
    max_views_per_uid: 1_000,
    idle: Duration::from_secs(24 * 3600),
};

/// What a read in a view answers before its candidates are pinned (`settle`), and the view's
/// pins it was planned from.
pub struct Plan {
    answers: Vec<Answer>,
    planned: EntryMap,
}

/// Whether a tombstone held removes `pin` (its result parsed only under a covering one).
fn removed(tombstones: &crate::model::tombstones::Tombstones, pin: &StoredEntry) -> bool {
    tombstones.drops_epoch(&pin.key(), || pin.result().forget_epoch)
}

crate::report::stats_registry! {
    /// Counters kept outside the rules.
    #[derive(Default)]
    struct ViewCounters {
        fallbacks: AtomicU64 as view_pin_fallbacks
            => counter(87, "Pins made node-locally because Redis did not answer in time."),
        from_cluster: AtomicU64 as view_pins_from_cluster
            => counter(88, "Pins another node made first, taken from Redis."),
    }
}

/// A lease holder's result, to pin in the view its lease was granted in.
struct LeasePin {
    view: ViewId,
    entry: StoredEntry,
}

pub struct Views {
    pins: Mutex<ViewPins>,
    store: Store,
    coordinator: Arc<Coordinator>,
    cluster: Option<Arc<Cluster>>,
    counters: ViewCounters,
    logged: LogOnce,
    lease_pins: mpsc::Sender<LeasePin>,
    /// Where its tasks run: the pins from the feed, the sweep, each Scan.
    tasks: Tasks,
    /// What replay changes in a read: the bundles' answers (`--replay`), the misses.
    replay: Replay,
}

impl Views {
    /// The node's views, reading through `coordinator` (Resolve) and `store`, pinning
    /// through `cluster` when it is on. Subscribes to the store's change feed (Forgets drop
    /// pins; a lease holder's Record pins its result), and starts its tasks on `tasks`: the
    /// one that makes the feed's pins, and the sweep.
    pub fn new(
        settings: ViewSettings,
        store: Store,
        coordinator: Arc<Coordinator>,
        cluster: Option<Arc<Cluster>>,
        replay: Replay,
        tasks: &Tasks,
    ) -> Arc<Views> {
        tracing::info!(
            view_idle_secs = settings.idle.as_secs(),
            max_view_pins = settings.max_pins,
            max_view_pins_per_uid = settings.max_pins_per_uid,
            max_views_per_uid = settings.max_views_per_uid,
            cluster_wide = cluster.is_some(),
            "views: each uid's own; pins end after --view-idle-secs without a request; a uid \
             at --max-view-pins-per-uid or --max-views-per-uid drops its own idle-longest view; \
             --max-view-pins caps the node"
        );
        let (lease_pins, lease_pins_to_make) = mpsc::channel(MAX_QUEUED_LEASE_PINS);
        let views = Arc::new(Views {
            pins: Mutex::new(ViewPins::new(settings)),
            store: store.clone(),
            coordinator,
            cluster,
            counters: ViewCounters::default(),
            logged: LogOnce::default(),
            lease_pins,
            tasks: tasks.clone(),
            replay,
        });
        store.add_change_listener(Arc::new(ChangeFeed(Arc::downgrade(&views))));
        tasks.spawn(Arc::clone(&views).pin_lease_results(lease_pins_to_make));
        tasks.spawn(Arc::clone(&views).sweep());
        views
    }

    /// What replay changes in a read, and its misses (ListMisses, Stats).
    pub fn replay(&self) -> &Replay {
        &self.replay
    }

    fn lock(&self) -> MutexGuard<'_, ViewPins> {
        crate::sync::lock(&self.pins)
    }

    /// The answers of a read of `keys` in `view`, `current` being the cache's winner of each:
    /// pins where the view has them, candidates to pin (`settle`) elsewhere. The lock is
    /// held only to take the view's pins (an O(1) copy); the keys are answered from the copy.
    fn plan<'k, 'm>(
        &self,
        view: &ViewId,
        keys: impl Iterator<Item = (KeyView<'k>, Option<&'m StoredEntry>)>,
    ) -> Plan {
        let planned = self.lock().pins_of(view, Instant::now());
        let mut conflicts = 0;
        let answers = keys
            .map(|(key, current)| {
                let (answer, conflict) = pins::answer_from(&planned, &key, current);
                conflicts += u64::from(conflict);
                answer
            })
            .collect();
        if conflicts > 0 {
            self.lock().add_conflicts(conflicts);
        }
        Plan { answers, planned }
    }

    /// Pins the candidates among the answers and returns what the view answers for each
    /// (`None` for a miss), in order.
    async fn settle(&self, view: &ViewId, plan: Plan) -> Vec<Option<StoredEntry>> {
        let Plan { answers, planned } = plan;
        let mut settled: Vec<Option<StoredEntry>> = Vec::with_capacity(answers.len());
        let mut candidates = Vec::new();
        let mut at = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Answer::Pinned(pinned) => settled.push(Some(pinned)),
                Answer::Candidate(candidate) => {
                    at.push(i);
                    candidates.push(candidate);
                    settled.push(None);
                }
                Answer::Miss => settled.push(None),
            }
        }
        for (i, pin) in at
            .into_iter()
            .zip(self.pin(view, candidates, Some(&planned)).await)
        {
            settled[i] = pin;
        }
        settled
    }

    /// A read of one key in `view` from the cache's current winner: the pin, or `None` (a
    /// miss: the caller resolves it).
    async fn read_one(&self, view: &ViewId, key: &CacheKey) -> Option<StoredEntry> {
        let map = self.store.current();
        let current = map.get(key).cloned();
        drop(map);
        let plan = self.plan(view, std::iter::once((key.view(), current.as_ref())));
        self.settle(view, plan).await.pop().flatten()
    }

    /// Pins `entry`, a result a Resolve produced for the view (a waiter's result), and
    /// returns what the view answers: the first pin of the key wins.
    async fn pin_produced(&self, view: &ViewId, entry: StoredEntry) -> Option<StoredEntry> {
        self.pin(view, vec![entry], None).await.pop().flatten()
    }

    /// Pins `candidates` in `view`: first in the cluster (the pin another node made first
    /// wins), then here. `None` where a Forget removed the pin meanwhile. `planned`: the
    /// view's pins the candidates were found missing from.
    async fn pin(
        &self,
        view: &ViewId,
        candidates: Vec<StoredEntry>,
        planned: Option<&EntryMap>,
    ) -> Vec<Option<StoredEntry>> {
        if candidates.is_empty() {
            return Vec::new();
        }
        let winners = match &self.cluster {
            None => candidates,
            Some(cluster) => {
                let tombstones = self.store.tombstones();
                let forgotten = |pin: &StoredEntry| removed(&tombstones, pin);
                let idle = self.lock().idle();
                match cluster
                    .pin_in_view(&view.shared_name(), &candidates, idle, forgotten)
                    .await
                {
                    Ok(winners) => {
                        let taken = winners
                            .iter()
                            .zip(&candidates)
                            .filter(|(winner, candidate)| !winner.same_entry(candidate))
                            .count();
                        self.counters
                            .from_cluster
                            .fetch_add(taken as u64, Ordering::Relaxed);
                        winners
                    }
                    Err(failure) => {
                        // The keys Redis answered for keep its pins; the rest pin here.
                        let local = candidates.len() - failure.settled.len();
                        self.counters
                            .fallbacks
                            .fetch_add(local as u64, Ordering::Relaxed);
                        if self
                            .logged
                            .first(format!("fallback {}", view.shared_name()))
                        {
                            tracing::warn!(
                                %view,
                                why = %failure.why,
                                "view pins made on this node only: Redis did not answer \
                                 (logged once per view; Stats counts view_pin_fallbacks)"
                            );
                        }
                        let done = failure.settled.len();
                        let mut winners = failure.settled;
                        winners.extend(candidates.into_iter().skip(done));
                        winners
                    }
                }
            }
        };
        // A Forget applied while the cluster answered has dropped the view's pins already;
        // it must not get its removed result back through this pin.
        let tombstones = self.store.tombstones();
        let asked = winners.len();
        let (live, at): (Vec<StoredEntry>, Vec<usize>) = winners
            .into_iter()
            .enumerate()
            .filter(|(_, pin)| !removed(&tombstones, pin))
            .map(|(i, pin)| (pin, i))
            .unzip();
        let mut answers = Vec::with_capacity(live.len());
        let mut over_cap = 0;
        let mut live = live.into_iter().peekable();
        // A chunk at a time: the lock is never held for all of a large read's keys. The
        // first chunk may skip the lookups its plan made (`planned`); later ones check.
        let mut planned = planned;
        while live.peek().is_some() {
            let chunk: Vec<StoredEntry> = live.by_ref().take(PINS_PER_LOCK).collect();
            let (dropped, (pinned, over)) = {
                let mut pins = self.lock();
                let made = pins.pin(view, chunk, planned.take(), Instant::now());
                (pins.take_dropped(), made)
            };
            answers.extend(pinned);
            over_cap += over;
            self.log_dropped(&dropped);
        }
        if over_cap > 0
            && self
                .logged
                .first(format!("over cap {}", view.shared_name()))
        {
            tracing::warn!(
                %view,
                "this view's new keys are answered unpinned: it alone holds its uid's \
                 --max-view-pins-per-uid, or the node holds --max-view-pins (logged once per \
                 view; Stats counts view_pins_over_cap)"
            );
        }
        let mut out = vec![None; asked];
        for (i, answer) in at.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
        out
    }

    fn log_dropped(&self, dropped: &[Dropped]) {
        for Dropped::Evicted(view) in dropped {
            if self.logged.first(format!("evicted {}", view.shared_name())) {
                tracing::warn!(
                    %view,
                    "view dropped to hold its uid's --max-view-pins-per-uid or \
                     --max-views-per-uid (that uid's view idle longest goes first; logged \
                     once per view; Stats counts views_evicted and view_pins_evicted)"
                );
            }
        }
    }

    /// The pins of `view`, to merge with a Scan's chunk (an O(1) copy), as a request in it.
    fn pins_of(&self, view: &ViewId) -> EntryMap {
        let mut pins = self.lock();
        let map = pins.pins_of(view, Instant::now());
        let dropped = pins.take_dropped();
        drop(pins);
        self.log_dropped(&dropped);
        map
    }

    /// A Scan chunk in a view: `chosen` (the cache's matching entries, in key order, from
    /// `start` to `end`, or to where `in_scan` stops) merged with the view's `pins` in that
    /// range that `keep` accepts.
    fn scan_plan(
        &self,
        pins: EntryMap,
        chosen: &[&StoredEntry],
        start: Bound<KeyView<'_>>,
        end: Option<&StoredEntry>,
        in_scan: impl Fn(&StoredEntry) -> bool,
        keep: impl Fn(&StoredEntry) -> bool,
    ) -> Plan {
        let (answers, conflicts) = pins::merge_chunk(&pins, chosen, start, end, in_scan, keep);
        if conflicts > 0 {
            self.lock().add_conflicts(conflicts);
        }
        Plan {
            answers,
            planned: pins,
        }
    }

    /// A page of the views this node holds, in (uid, name) order after `after`: every uid's
    /// for an administrator (`uid` `None`), else the caller's own; and whether more follow.
    pub fn list(
        &self,
        uid: Option<u32>,
        after: Option<&ViewId>,
        limit: usize,
    ) -> (Vec<ViewSummary>, bool) {
        self.lock()
            .list(Instant::now(), uid, after, limit.clamp(1, MAX_LIST_PAGE))
    }

    /// Ends every uid's view named `name` here and, with the cluster tier, in Redis: how
    /// many views and pins it dropped here (`None`: no view of that name here).
    pub async fn end(&self, name: &str) -> Option<(usize, usize)> {
        let ended: Vec<(ViewId, usize)> = {
            let mut pins = self.lock();
            pins.named(name)
                .into_iter()
                .filter_map(|view| pins.end(&view).map(|held| (view, held)))
                .collect()
        };
        if let Some(cluster) = &self.cluster {
            for (view, _) in &ended {
                if let Err(why) = cluster.end_view(&view.shared_name()).await {
                    tracing::warn!(%view, %why, "view ended here, but not in Redis: its pins there expire after --view-idle-secs");
                }
            }
        }
        (!ended.is_empty()).then(|| (ended.len(), ended.iter().map(|(_, held)| held).sum()))
    }

    /// Pins each lease holder's result in its lease's view, in the order they were stored.
    async fn pin_lease_results(self: Arc<Self>, mut lease_pins: mpsc::Receiver<LeasePin>) {
        loop {
            let pin = tokio::select! {
                pin = lease_pins.recv() => pin,
                () = self.tasks.stopping() => return,
            };
            let Some(LeasePin { view, entry }) = pin else {
                return;
            };
            self.pin(&view, vec![entry], None).await;
        }
    }

    /// Ends idle views and keeps the active ones alive in Redis, until the daemon stops.
    async fn sweep(self: Arc<Self>) {
        let idle = self.lock().idle();
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let mut last = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = self.tasks.stopping() => return,
            }
            let now = Instant::now();
            let (ended, active) = {
                let mut pins = self.lock();
                (pins.expire_idle(now), pins.requested_since(last))
            };
            last = now;
            if !ended.is_empty() {
                let shown: Vec<String> = ended.iter().take(20).map(ViewId::to_string).collect();
                tracing::info!(
                    views = ended.len(),
                    first = ?shown,
                    "views ended: idle for --view-idle-secs"
                );
            }
            if let (Some(cluster), false) = (&self.cluster, active.is_empty()) {
                let active: Vec<String> = active.iter().map(ViewId::shared_name).collect();
                cluster.refresh_views(&active, idle).await;
            }
        }
    }
}

/// The store's change feed: Forgets drop the pins they remove, in every view; a Record
/// under a lease granted in a view queues its key's new winner, the entry the holder
/// produced, for that view.
struct ChangeFeed(std::sync::Weak<Views>);

/// The pins a batch of changes asks for: each change to the cache's winner that a Record
/// made under a lease granted in a view, for the lease's own key, is what the holder
/// produced, and is pinned in that view as it was stored (not as the cache holds it when the
/// pin is made).
fn lease_pins(changes: &[Change]) -> impl Iterator<Item = LeasePin> + '_ {
    changes.iter().filter_map(|change| {
        let Source::Record { lease: Some(lease) } = &change.source else {
            return None;
        };
        let (Some(view), Some(key)) = (&lease.view, &lease.key) else {
            return None;
        };
        (change.in_cache && change.entry.key() == key.view()).then(|| LeasePin {
            view: view.clone(),
            entry: change.entry.clone(),
        })
    })
}

impl ChangeListener for ChangeFeed {
    fn entries_changed(&self, changes: &[Change]) {
        let Some(views) = self.0.upgrade() else {
            return;
        };
        for pin in lease_pins(changes) {
            let view = pin.view.clone();
            if views.lease_pins.try_send(pin).is_err() && views.logged.first("lease pins") {
                tracing::warn!(
                    view = %view,
                    "more than {MAX_QUEUED_LEASE_PINS} lease holders' results wait to be pinned; \
                     the rest are pinned by their view's next read (logged once)"
                );
            }
        }
    }

    fn forgotten(&self, forgets: &[ForgetChange]) {
        let Some(views) = self.0.upgrade() else {
            return;
        };
        let mut pins = views.lock();
        for forget in forgets {
            pins.forget(&forget.tombstone);
        }
    }
}

crate::report::stats_registry! {
    /// The views' Stats fields: views, pins, their caps and what the caps did.
    impl FillStats for Views {
        fn fill_stats(views, stats) {
            let (counters, count, total, caps) = {
                let pins = views.lock();
                (
                    pins.counters(),
                    pins.view_count(),
                    pins.total_pins(),
                    pins.caps(),
                )
            };
        }
        include pins::PinCounters = counters;
        include ViewCounters = views.counters;
        fields {
            views_active = count as u64
                => gauge(80, "Job views on this node, empty ones included."),
            view_pins = total as u64 => gauge(81, "Pins held now, all views."),
            max_view_pins = caps.max_pins as u64
                => gauge(82, "Most pins this node holds (--max-view-pins)."),
            max_view_pins_per_uid = caps.max_pins_per_uid as u64
                => gauge(83, "Most pins one uid's views hold (--max-view-pins-per-uid)."),
            max_views_per_uid = caps.max_views_per_uid as u64
                => gauge(84, "Most views one uid holds (--max-views-per-uid)."),
            view_idle_secs = caps.idle.as_secs() => not_exported,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::TunedResult;
    use crate::model::testing::key;
    use crate::store::RecordLease;

    fn change(problem: &str, time_us: f64, source: Source, in_cache: bool) -> Change {
        let result = TunedResult {
            config: format!("{{\"t\":{time_us}}}"),
            time_us,
            tuned_by: "r".into(),
            tuned_at_unix_ms: 0,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        Change {
            entry: StoredEntry::new(&key(problem), &result),
            source,
            in_cache,
            own: true,
        }
    }

    fn under_lease(problem: &str, view: Option<&str>) -> Source {
        Source::Record {
            lease: Some(Arc::new(RecordLease {
                id: "lease-1".into(),
                key: Some(key(problem)),
                view: view.map(|name| ViewId {
                    uid: 1000,
                    name: name.to_owned(),
                }),
            })),
        }
    }

    #[test]
    fn a_lease_holders_record_pins_what_it_stored_in_the_leases_view_only() {
        let changes = vec![
            // The holder's own key, now the winner: pinned in job-1, as stored.
            change("k", 5.0, under_lease("k", Some("job-1")), true),
            // Another key of the holder's batch: not the lease's key.
            change("other", 1.0, under_lease("k", Some("job-1")), true),
            // A lease granted without a view, or one this node no longer held.
            change("k", 4.0, under_lease("k", None), true),
            change(
                "k",
                4.0,
                Source::Record {
                    lease: Some(Arc::new(RecordLease {
                        id: "gone".into(),
                        key: None,
                        view: None,
                    })),
                },
                true,
            ),
            // A Record that did not change the cache's winner (own only), and one without a lease.
            change("k", 6.0, under_lease("k", Some("job-1")), false),
            change("k", 3.0, Source::Record { lease: None }, true),
            change("k", 2.0, Source::Cluster, true),
        ];
        let pins: Vec<(String, f64)> = lease_pins(&changes)
            .map(|pin| (pin.view.shared_name(), pin.entry.result().time_us))
            .collect();
        assert_eq!(pins, vec![("1000/job-1".to_owned(), 5.0)]);
    }
}
