//! Job views (docs/views.md): every rank of a job sees the same winner for a key, on every
//! node. Within a view the first answer for a key is pinned; later reads in the view return
//! the pin even after a better result is stored, which every other view and every request
//! without a view gets at once.
//!
//! The rules are a plain type, [`pins::ViewPins`], tested without a runtime. This module is
//! its adapter, one owner for the node's pins: it asks the cluster tier which pin is first
//! (the first node to pin a key for a view wins, within the cluster timeout, else a counted
//! node-local pin), drops the pins a Forget removes (it listens to the store's change feed),
//! remembers which view a lease was granted in (so the lease holder's Record pins what it
//! produced), and runs the sweep that ends idle views and keeps active ones alive in Redis.

pub mod pins;

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tunecache_proto::v1;

use crate::cluster::Cluster;
use crate::model::entry::{CacheKey, KeyView};
use crate::store::{Change, ChangeListener, ForgetChange, Store};
use crate::wire::stored::{EntryMap, StoredEntry};
use pins::{Answer, Evicted, ViewPins, ViewSummary};

/// Longest view name accepted (a job id with a step; bounded like a key's fields).
pub const MAX_VIEW_NAME_BYTES: usize = 256;

/// Leases remembered with the view they were granted in, beyond which the oldest go (a
/// lease lives at most `coord::MAX_LEASE`).
const MAX_LEASES_IN_VIEWS: usize = 100_000;

/// What `--view-idle-secs` and `--max-view-pins` say.
#[derive(Clone, Copy, Debug)]
pub struct ViewSettings {
    pub idle: Duration,
    pub max_pins: usize,
}

impl Default for ViewSettings {
    fn default() -> Self {
        ViewSettings {
            idle: Duration::from_secs(24 * 3600),
            max_pins: 1_000_000,
        }
    }
}

/// Checks a request's view name: `Ok(None)` for none (empty).
pub fn checked_name(field: &str, view: &str) -> Result<Option<String>, tonic::Status> {
    if view.is_empty() {
        return Ok(None);
    }
    if view.len() > MAX_VIEW_NAME_BYTES {
        return Err(tonic::Status::invalid_argument(format!(
            "{field}: {} bytes, longer than the {MAX_VIEW_NAME_BYTES} a view name may have",
            view.len()
        )));
    }
    if view.chars().any(char::is_control) {
        return Err(tonic::Status::invalid_argument(format!(
            "{field}: a view name must not contain control characters"
        )));
    }
    Ok(Some(view.to_owned()))
}

/// What a read in a view answers before its candidates are pinned (`settle`), and the view's
/// pins it was planned from.
pub struct Plan {
    answers: Vec<Answer>,
    planned: EntryMap,
}

impl Plan {
    pub fn len(&self) -> usize {
        self.answers.len()
    }
}

/// Whether a tombstone held removes `pin` (its result parsed only under a covering one).
fn removed(tombstones: &crate::model::forget::Tombstones, pin: &StoredEntry) -> bool {
    tombstones.drops_epoch(&pin.key(), || pin.result().forget_epoch)
}

struct LeaseInView {
    view: String,
    key: CacheKey,
    granted: Instant,
}

/// Counters kept outside the rules.
#[derive(Default)]
struct ViewCounters {
    fallbacks: AtomicU64,
    from_cluster: AtomicU64,
}

pub struct Views {
    pins: Mutex<ViewPins>,
    store: Store,
    cluster: Option<Arc<Cluster>>,
    leases: Mutex<HashMap<String, LeaseInView>>,
    counters: ViewCounters,
    logged: crate::ops::limits::LogOnce,
}

impl Views {
    /// The node's views, pinning through `cluster` when it is on. Subscribes to the store's
    /// change feed (Forgets drop pins).
    pub fn new(settings: ViewSettings, store: Store, cluster: Option<Arc<Cluster>>) -> Arc<Views> {
        tracing::info!(
            view_idle_secs = settings.idle.as_secs(),
            max_view_pins = settings.max_pins,
            cluster_wide = cluster.is_some(),
            "views: pins end after --view-idle-secs without a request; --max-view-pins caps them all"
        );
        let views = Arc::new(Views {
            pins: Mutex::new(ViewPins::new(settings.max_pins, settings.idle)),
            store: store.clone(),
            cluster,
            leases: Mutex::default(),
            counters: ViewCounters::default(),
            logged: Default::default(),
        });
        store.add_change_listener(Arc::new(ForgetFeed(Arc::downgrade(&views))));
        views
    }

    fn lock(&self) -> MutexGuard<'_, ViewPins> {
        crate::sync::lock(&self.pins)
    }

    /// The answers of a read of `keys` in `view`, `current` being the cache's winner of each:
    /// pins where the view has them, candidates to pin (`settle`) elsewhere.
    pub fn plan<'k, 'm>(
        &self,
        view: &str,
        keys: impl Iterator<Item = (KeyView<'k>, Option<&'m StoredEntry>)>,
    ) -> Plan {
        let now = Instant::now();
        let mut pins = self.lock();
        let answers = keys
            .map(|(key, current)| pins.answer(view, &key, current, now))
            .collect();
        Plan {
            answers,
            planned: pins.pins_of(view, now),
        }
    }

    /// Pins the candidates among the answers and returns what the view answers for each
    /// (`None` for a miss), in order.
    pub async fn settle(&self, view: &str, plan: Plan) -> Vec<Option<StoredEntry>> {
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
    pub async fn read_one(&self, view: &str, key: &CacheKey) -> Option<StoredEntry> {
        let map = self.store.current();
        let current = map.get(key).cloned();
        drop(map);
        let plan = self.plan(view, std::iter::once((key.view(), current.as_ref())));
        self.settle(view, plan).await.pop().flatten()
    }

    /// Pins `entry`, a result a Resolve produced for the view (a waiter's result), and
    /// returns what the view answers: the first pin of the key wins.
    pub async fn pin_produced(&self, view: &str, entry: StoredEntry) -> Option<StoredEntry> {
        self.pin(view, vec![entry], None).await.pop().flatten()
    }

    /// Pins `candidates` in `view`: first in the cluster (the pin another node made first
    /// wins), then here. `None` where a Forget removed the pin meanwhile. `planned`: the
    /// view's pins the candidates were found missing from.
    async fn pin(
        &self,
        view: &str,
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
                    .pin_in_view(view, &candidates, idle, forgotten)
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
                        if self.logged.first(format!("fallback {view}")) {
                            tracing::warn!(
                                view,
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
        let (answers, evicted) = self.lock().pin(view, live, planned, Instant::now());
        self.log_evicted(view, &evicted);
        let mut out = vec![None; asked];
        for (i, answer) in at.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
        out
    }

    fn log_evicted(&self, view: &str, evicted: &Evicted) {
        for dropped in &evicted.views {
            if self.logged.first(format!("evicted {dropped}")) {
                tracing::warn!(
                    view = %dropped,
                    "view dropped to hold --max-view-pins (the view idle longest goes first; \
                     logged once per view; Stats counts view_pins_evicted)"
                );
            }
        }
        if evicted.over_cap > 0 && self.logged.first(format!("over cap {view}")) {
            tracing::warn!(
                view,
                "this view alone holds --max-view-pins: its new keys are answered unpinned \
                 (logged once per view; Stats counts view_pins_over_cap)"
            );
        }
    }

    /// The pins of `view`, to merge with a Scan's chunk (an O(1) copy), as a request in it.
    pub fn pins_of(&self, view: &str) -> EntryMap {
        self.lock().pins_of(view, Instant::now())
    }

    /// A Scan chunk in a view: `chosen` (the cache's matching entries, in key order, from
    /// `start` to `end`, or to where `in_scan` stops) merged with the view's `pins` in that
    /// range that `keep` accepts.
    pub fn scan_plan(
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

    /// A Resolve in `view` was answered with a lease: its holder's Record pins the result.
    pub fn lease_granted(&self, lease_id: &str, view: &str, key: &CacheKey) {
        let mut leases = crate::sync::lock(&self.leases);
        if leases.len() >= MAX_LEASES_IN_VIEWS {
            let now = Instant::now();
            leases.retain(|_, lease| now.duration_since(lease.granted) < crate::coord::MAX_LEASE);
            if leases.len() >= MAX_LEASES_IN_VIEWS {
                if let Some(oldest) = leases
                    .iter()
                    .min_by_key(|(_, lease)| lease.granted)
                    .map(|(id, _)| id.clone())
                {
                    leases.remove(&oldest);
                }
            }
        }
        leases.insert(
            lease_id.to_owned(),
            LeaseInView {
                view: view.to_owned(),
                key: key.clone(),
                granted: Instant::now(),
            },
        );
    }

    /// A Record carried `lease_id`: if it was granted in a view, the key's winner now is what
    /// the lease holder produced for that view, and is pinned there.
    pub async fn lease_recorded(&self, lease_id: &str) {
        let lease = crate::sync::lock(&self.leases).remove(lease_id);
        let Some(lease) = lease else {
            return;
        };
        let current = self.store.current().get(&lease.key).cloned();
        if let Some(current) = current {
            self.pin(&lease.view, vec![current], None).await;
        }
    }

    /// The views this node holds, most recently requested first.
    pub fn list(&self) -> Vec<ViewSummary> {
        self.lock().list(Instant::now())
    }

    /// Ends `view` here and, with the cluster tier, in Redis: how many pins it held here.
    pub async fn end(&self, view: &str) -> Option<usize> {
        let ended = self.lock().end(view);
        if let Some(cluster) = &self.cluster {
            if let Err(why) = cluster.end_view(view).await {
                tracing::warn!(view, %why, "view ended here, but not in Redis: its pins there expire after --view-idle-secs");
            }
        }
        ended
    }

    /// Ends idle views and keeps the active ones alive in Redis, until `stop`.
    pub async fn run_sweep(self: Arc<Self>, stop: CancellationToken) {
        let idle = self.lock().idle();
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let mut last = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            let now = Instant::now();
            let (ended, active) = {
                let mut pins = self.lock();
                (pins.expire_idle(now), pins.requested_since(last))
            };
            last = now;
            if !ended.is_empty() {
                tracing::info!(views = ?ended, "views ended: idle for --view-idle-secs");
            }
            if let (Some(cluster), false) = (&self.cluster, active.is_empty()) {
                cluster.refresh_views(&active, idle).await;
            }
        }
    }
}

/// Forgets drop the pins they remove, in every view.
struct ForgetFeed(std::sync::Weak<Views>);

impl ChangeListener for ForgetFeed {
    fn entries_changed(&self, _changes: &[Change]) {}

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

impl crate::rpc::stats::FillStats for Views {
    fn fill_stats(&self, stats: &mut v1::StatsResponse) {
        let (counters, views, total, max_pins, idle) = {
            let pins = self.lock();
            (
                pins.counters(),
                pins.view_count(),
                pins.total_pins(),
                pins.max_pins(),
                pins.idle(),
            )
        };
        stats.views_active = views as u64;
        stats.view_pins = total as u64;
        stats.max_view_pins = max_pins as u64;
        stats.view_idle_secs = idle.as_secs();
        stats.view_pins_made = counters.pinned;
        stats.view_pin_conflicts = counters.conflicts;
        stats.view_pins_evicted = counters.evicted;
        stats.views_ended_idle = counters.ended_idle;
        stats.view_pins_forgotten = counters.forgotten;
        stats.views_ended = counters.ended;
        stats.view_pins_over_cap = counters.over_cap;
        stats.view_pin_fallbacks = self.counters.fallbacks.load(Ordering::Relaxed);
        stats.view_pins_from_cluster = self.counters.from_cluster.load(Ordering::Relaxed);
    }
}
