//! Coordinated tuning: `Resolve` makes each missing problem get tuned once per node.
//!
//! The rules (a Resolve's order, who holds a key's flight, who tunes it, who waits, what
//! each event does) are a plain type, [`flights::Flights`], tested without a runtime. This
//! module is its adapter and decides nothing: it keeps the waiters' reply channels and
//! timers, does the steps a Resolve's rules ask for (look in the store, claim in the
//! cluster, offer the tuner the job) and carries out the effects they return (answer a
//! waiter, hand a lease on), and it brings the events in: a result for the key, whoever
//! stored it (a rank's Record, the node's tuner, a snapshot, the cluster tier), arrives
//! through the store's change feed (`entries_changed`); a lease's end comes from its watch
//! ([`lease_watch`]), a tuner job's from [`tuner_job`], cluster answers from
//! [`cluster_claim`]. Waiting costs a oneshot channel and a timer, no thread.
//!
//! Leases and waiters live in memory only: after a daemon restart callers simply Resolve
//! again.

mod cluster_claim;
pub mod flights;
mod lease_watch;
mod tuner_job;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio_util::sync::DropGuard;
use tunecache_proto::v1;

use crate::cluster::{Cluster, ClusterLease};
use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::names::ViewId;
use crate::store::{ApplyOutcome, Change, ChangeListener, RecordLease, Store};
use crate::tasks::Tasks;
use crate::tuner::TunerHandle;
use flights::{
    Advance, Attachments, Caller, ClaimAnswer, Effect, Fact, Flights, Grant, LeaseEnd, Next,
    Resolve, Seen, WaitEnd, WaiterId,
};

/// Longest a caller may wait for someone else's result.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Lease length when the caller does not say.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(120);
/// Longest lease a caller may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

crate::report::stats_registry! {
    /// Resolve outcomes counted outside the rules (the lease outcomes are the rules' `Tally`).
    #[derive(Default)]
    struct CoordCounters {
        waits_satisfied: AtomicU64 => counter(
            9,
            "Resolve outcome: a waiting caller got someone else's result.",
            named "resolve_waits_satisfied",
        ),
        waits_timed_out: AtomicU64 => counter(
            10,
            "Resolve outcome: a waiting caller gave up (miss).",
            named "resolve_waits_timed_out",
        ),
        /// Resolves refused because the caller's process held `max_leases_per_pid` leases.
        leases_refused_per_pid: AtomicU64
            => counter(33, "Resolves refused: the process held --max-leases-per-pid leases."),
        /// Resolves refused because the node's tuner queue was full.
        tuner_queue_refusals: AtomicU64
            => counter(34, "Resolves refused: the node's tuner queue was full."),
    }
}

/// What a Resolve call ends with.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    Hit(TunedResult),
    TuneHere {
        lease_id: String,
        expires_in: Duration,
    },
    Miss(String),
}

impl From<Resolution> for v1::ResolveResponse {
    fn from(resolution: Resolution) -> Self {
        use v1::resolve_response::Outcome;
        let outcome = match resolution {
            Resolution::Hit(result) => Outcome::Hit(result.into()),
            Resolution::TuneHere {
                lease_id,
                expires_in,
            } => Outcome::TuneHere(v1::Lease {
                lease_id,
                expires_in_ms: u32::try_from(expires_in.as_millis()).unwrap_or(u32::MAX),
            }),
            Resolution::Miss(reason) => Outcome::Miss(v1::Miss { reason }),
        };
        v1::ResolveResponse {
            outcome: Some(outcome),
        }
    }
}

/// One Resolve request, validated.
pub struct ResolveCall {
    pub key: CacheKey,
    pub wait: Duration,
    pub can_tune: bool,
    pub lease: Duration,
    /// The caller's pid from the socket's peer credentials, when known.
    pub caller_pid: Option<i32>,
    /// The caller's uid: whose replay misses a miss is listed under.
    pub uid: u32,
    /// Replay (`ResolveRequest.replay`): answered at once from what is here, never a lease
    /// (`views` answers it; the coordinator never sees it).
    pub replay: bool,
    /// The job view the caller reads in (`views`): a lease granted to it carries the view,
    /// so that the change feed tells `views` where its holder's result is pinned.
    pub view: Option<ViewId>,
}

impl ResolveCall {
    fn caller(&self) -> Caller {
        Caller {
            can_tune: self.can_tune,
            pid: self.caller_pid,
            lease: self.lease,
            view: self.view.clone(),
        }
    }
}

/// What a flight owns outside the rules; dropping it (the flight ended) stops and releases
/// all of it.
#[derive(Default)]
struct Resources {
    /// Ends the lease at expiry or the holder's death; dropped, the watch stops.
    lease_watch: Option<DropGuard>,
    /// Polls another node's cluster lease; dropped, the poll stops.
    remote_watch: Option<DropGuard>,
    /// This node's cluster lease on the key, renewed while held; dropped, it is released.
    cluster_lease: Option<ClusterLease>,
}

impl Attachments for Resources {
    type ClusterLease = ClusterLease;

    fn hold_cluster_lease(&mut self, lease: ClusterLease) {
        self.cluster_lease = Some(lease);
    }

    fn stop_lease_watch(&mut self) {
        self.lease_watch = None;
    }

    fn stop_remote_watch(&mut self) {
        self.remote_watch = None;
    }

    fn keep_cluster_lease_for_result(&mut self) {
        if let Some(lease) = self.cluster_lease.take() {
            // Deleted by the publish of this result, so no node takes it before then.
            lease.keep_for_result();
        }
    }

    fn release_cluster_lease(&mut self) {
        self.cluster_lease = None;
    }
}

/// The rules and the reply channels of their waiters, under one lock.
struct Inner {
    flights: Flights<Resources>,
    replies: HashMap<WaiterId, oneshot::Sender<Resolution>>,
}

impl Inner {
    /// Applies a rule that needs to know which waiters still listen (their reply channel
    /// is open).
    fn rules<R>(
        &mut self,
        rule: impl FnOnce(&mut Flights<Resources>, &dyn Fn(WaiterId) -> bool) -> R,
    ) -> R {
        let Inner { flights, replies } = self;
        let alive = |id: WaiterId| replies.get(&id).is_some_and(|reply| !reply.is_closed());
        rule(flights, &alive)
    }
}

/// Where a Resolve stands when the lock is let go.
enum Unlocked {
    /// Answered or refused.
    Answer(Result<Resolution>),
    /// Waiting, as this waiter, for its answer on the channel.
    Wait(WaiterId, oneshot::Receiver<Resolution>),
    /// The rules asked for a claim in the cluster.
    AskCluster,
}

/// A cluster's answer to a claim, and when to ask again if another node holds the lease.
type Claimed = (ClaimAnswer<ClusterLease>, Duration);

pub struct Coordinator {
    inner: Mutex<Inner>,
    store: Store,
    tuner: TunerHandle,
    /// The Redis cluster tier, when on: cross-node single-flight before local tuning.
    cluster: Option<Arc<Cluster>>,
    counters: CoordCounters,
    /// Watches are started here, also when an event arrives on a non-runtime thread; they
    /// and every waiter end when it stops.
    tasks: Tasks,
    me: Weak<Coordinator>,
    refusals_logged: crate::report::LogOnce,
}

impl Coordinator {
    /// Creates the coordinator with what it coordinates with: the store, the node's tuner
    /// and, when on, the cluster tier. Call it inside the tokio runtime, and subscribe it to
    /// the store's change feed (`Store::add_change_listener`) before serving: that is how
    /// stored results wake waiters. One process may hold at most `max_leases_per_pid` leases.
    pub fn new(
        store: Store,
        tuner: TunerHandle,
        cluster: Option<Arc<Cluster>>,
        tasks: &Tasks,
        max_leases_per_pid: usize,
    ) -> Arc<Coordinator> {
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        Arc::new_cyclic(|me| Coordinator {
            inner: Mutex::new(Inner {
                flights: Flights::new(format!("{nonce:016x}"), max_leases_per_pid),
                replies: HashMap::new(),
            }),
            store,
            tuner,
            cluster,
            counters: CoordCounters::default(),
            tasks: tasks.clone(),
            me: me.clone(),
            refusals_logged: Default::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Counts and logs (once per pid) a Resolve refused for the per-pid lease cap.
    fn refuse_lease(&self, pid: i32, limit: usize) -> Error {
        self.counters
            .leases_refused_per_pid
            .fetch_add(1, Ordering::Relaxed);
        if self.refusals_logged.first(format!("leases of pid {pid}")) {
            tracing::warn!(
                pid,
                limit,
                "refused a lease: this process already holds --max-leases-per-pid leases \
                 (logged once per pid; Stats counts each as leases_refused_per_pid)"
            );
        }
        Error::LeasesPerPid { pid, limit }
    }

    /// What the rules look at for `key`: the store's result, and whether the node's tuner
    /// measures it (from the devices its worker reported).
    fn look(&self, key: &CacheKey) -> Seen {
        Seen {
            stored: self.store.get(key),
            tuner_takes: flights::tuner_takes(key, &self.tuner.devices()),
        }
    }

    /// Starts the expiry/death watch of a lease just granted and attaches it to the flight.
    fn watch(&self, inner: &mut Inner, grant: &Grant) {
        let stop = self.tasks.stop_token().child_token();
        if let Some(resources) = inner.flights.attachments_mut(&grant.key) {
            resources.lease_watch = Some(stop.clone().drop_guard());
        }
        if let Some(me) = self.me.upgrade() {
            self.tasks.spawn(lease_watch::watch_lease(
                me,
                grant.key.clone(),
                grant.lease_id.clone(),
                grant.pid,
                grant.length,
                stop,
            ));
        }
    }

    /// Carries out what the rules asked: answers waiters, hands leases on (and, when the
    /// waiter has gone meanwhile, asks the rules for the next one).
    fn run(&self, inner: &mut Inner, effects: Vec<Effect>) {
        let mut queue = VecDeque::from(effects);
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::Reply(waiter, resolution) => {
                    if let Some(reply) = inner.replies.remove(&waiter) {
                        let _ = reply.send(resolution);
                    }
                }
                Effect::Grant(waiter, grant) => {
                    self.watch(inner, &grant);
                    let delivered = inner
                        .replies
                        .remove(&waiter)
                        .is_some_and(|reply| reply.send(grant.answer()).is_ok());
                    if !delivered {
                        queue.extend(inner.rules(|flights, alive| {
                            let now = SystemTime::now();
                            flights.grant_undelivered(&grant.key, &grant.lease_id, now, alive)
                        }));
                    }
                }
            }
        }
    }

    /// Wakes `key`'s waiters with `result` and ends its flight.
    fn finish(&self, inner: &mut Inner, key: &CacheKey, result: &TunedResult) {
        let effects = inner.flights.stored(key, result);
        self.run(inner, effects);
    }

    /// A lease's watch fired: it expired or its holder died.
    fn lease_ended(&self, key: &CacheKey, lease_id: &str, why: LeaseEnd) {
        let mut inner = self.lock();
        let ended = inner.rules(|flights, alive| {
            flights.lease_ended(key, lease_id, why, SystemTime::now(), alive)
        });
        if let Some(effects) = ended {
            log_lease_end(key, lease_id, why);
            self.run(&mut inner, effects);
        }
    }

    /// Resolves one key: a hit, a lease to tune it here, or a wait for someone else, in the
    /// order the rules say (`flights::resolve`). Refused only when the node's tuner should
    /// take the job but its queue is full, or the caller's process holds the most leases it
    /// may.
    pub async fn resolve(&self, call: ResolveCall) -> Result<Resolution> {
        let mut resolve = Resolve::new(
            call.key.clone(),
            call.caller(),
            !call.wait.is_zero(),
            self.cluster.is_some(),
        );
        if let Next::Hit(result) = resolve.first(self.store.get(&call.key)) {
            return Ok(Resolution::Hit(result));
        }
        let mut claimed = None;
        let (waiter, receiver) = loop {
            match self.advance(&mut resolve, claimed.take()) {
                Unlocked::Answer(answer) => return answer,
                Unlocked::Wait(waiter, receiver) => break (waiter, receiver),
                Unlocked::AskCluster => claimed = Some(self.ask_cluster(&call.key).await),
            }
        };

        // Removes this waiter if the call ends any other way than through its channel:
        // the caller going away (the future is dropped).
        let guard = WaiterGuard {
            coordinator: self,
            key: &call.key,
            waiter,
        };
        let timed_out = WaitEnd::TimedOut { waited: call.wait };
        let end = tokio::select! {
            outcome = receiver => match outcome {
                Ok(resolution) => {
                    std::mem::forget(guard);
                    if matches!(resolution, Resolution::Hit(_)) {
                        self.counters
                            .waits_satisfied
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(resolution);
                }
                // Its answer was dropped unsent: as good as a timeout.
                Err(_) => timed_out,
            },
            () = tokio::time::sleep(call.wait) => timed_out,
            () = self.tasks.stopping() => WaitEnd::Stopping,
        };
        std::mem::forget(guard);
        if end == timed_out {
            self.counters
                .waits_timed_out
                .fetch_add(1, Ordering::Relaxed);
        }
        let mut inner = self.lock();
        inner.replies.remove(&waiter);
        Ok(inner
            .flights
            .wait_ended(&call.key, waiter, end, SystemTime::now()))
    }

    /// Takes `resolve` on under the lock, from a look in the store (after `claimed`, the
    /// cluster's answer, when a claim was out), and carries out the steps the rules ask for
    /// until one needs the lock let go: the answer, a wait, or a claim in the cluster.
    fn advance(&self, resolve: &mut Resolve, claimed: Option<Claimed>) -> Unlocked {
        let key = resolve.key().clone();
        let mut inner = self.lock();
        let (mut fact, retry_in) = match claimed {
            None => (Fact::Seen(self.look(&key)), Duration::ZERO),
            Some((answer, retry_in)) => (Fact::Claimed(answer, self.look(&key)), retry_in),
        };
        loop {
            let Advance { effects, next } = inner
                .rules(|flights, alive| flights.advance(resolve, fact, SystemTime::now(), alive));
            self.run(&mut inner, effects);
            fact = match next {
                Next::LookInStore => Fact::Seen(self.look(&key)),
                Next::WatchRemote => {
                    self.watch_remote(&mut inner, &key, retry_in);
                    Fact::Seen(self.look(&key))
                }
                Next::OfferTuner => Fact::Offered(self.offer_tuner(&key)),
                Next::AskCluster => return Unlocked::AskCluster,
                Next::Hit(result) => return Unlocked::Answer(Ok(Resolution::Hit(result))),
                Next::Lease(grant) => {
                    self.watch(&mut inner, &grant);
                    return Unlocked::Answer(Ok(grant.answer()));
                }
                Next::Wait(waiter) => {
                    let (reply, receiver) = oneshot::channel();
                    inner.replies.insert(waiter, reply);
                    return Unlocked::Wait(waiter, receiver);
                }
                Next::Miss(reason) => {
                    self.counters
                        .waits_timed_out
                        .fetch_add(1, Ordering::Relaxed);
                    return Unlocked::Answer(Ok(Resolution::Miss(reason)));
                }
                Next::TooManyLeases { pid, limit } => {
                    return Unlocked::Answer(Err(self.refuse_lease(pid, limit)));
                }
                Next::TunerQueueFull { capacity } => {
                    return Unlocked::Answer(Err(Error::TunerQueueFull { capacity }));
                }
            };
        }
    }

    /// A rank's Record, with the lease it tuned under (empty: none). Stored through the
    /// store's write queue (refused when it is full); the change feed, which runs before
    /// the write is answered, wakes the waiters of every key it changes and so completes a
    /// lease whose key now has a result. A refused Record leaves the lease held.
    pub async fn record(
        &self,
        entries: Vec<(CacheKey, TunedResult)>,
        lease_id: &str,
    ) -> Result<ApplyOutcome> {
        let lease = (!lease_id.is_empty()).then(|| self.record_lease(lease_id));
        let outcome = if entries.is_empty() {
            ApplyOutcome::default()
        } else {
            self.store.try_apply(entries, lease).await?
        };
        if !lease_id.is_empty() {
            let mut inner = self.lock();
            let given_up =
                inner.rules(|flights, alive| flights.recorded(lease_id, SystemTime::now(), alive));
            if let Some((key, effects)) = given_up {
                log_lease_end(&key, lease_id, LeaseEnd::GivenUp);
                self.run(&mut inner, effects);
            }
        }
        Ok(outcome)
    }

    /// The lease a Record names, as the change feed tells it: with its key and view while
    /// this node holds it.
    fn record_lease(&self, lease_id: &str) -> RecordLease {
        let inner = self.lock();
        let held = inner.flights.lease(lease_id);
        RecordLease {
            id: lease_id.to_owned(),
            key: held.map(|(key, _)| key.clone()),
            view: held.and_then(|(_, view)| view.cloned()),
        }
    }

    fn remove_waiter(&self, key: &CacheKey, waiter: WaiterId) {
        let mut inner = self.lock();
        inner.replies.remove(&waiter);
        inner.flights.waiter_left(key, waiter);
    }
}

fn log_lease_end(key: &CacheKey, lease_id: &str, why: LeaseEnd) {
    tracing::info!(lease = lease_id, problem = %key.problem, reason = ?why, "lease ended without a result");
}

/// The store's change feed: every stored result wakes the waiters of its key.
impl ChangeListener for Coordinator {
    fn entries_changed(&self, changes: &[Change]) {
        let mut inner = self.lock();
        if inner.flights.is_empty() {
            return;
        }
        for change in changes.iter().filter(|change| change.in_cache) {
            let key = change.entry.key().to_key();
            if !inner.flights.is_new(&key) {
                self.finish(&mut inner, &key, &change.entry.result().to_result());
            }
        }
    }
}

struct WaiterGuard<'a> {
    coordinator: &'a Coordinator,
    key: &'a CacheKey,
    waiter: WaiterId,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.coordinator.remove_waiter(self.key, self.waiter);
    }
}

crate::report::stats_registry! {
    /// The coordinator's Stats fields: Resolve outcomes, leases and waiters.
    impl FillStats for Coordinator {
        fn fill_stats(coordinator, stats) {
            let (tally, (waiting, in_flight), max_per_pid) = {
                let inner = coordinator.lock();
                (
                    inner.flights.tally(),
                    inner.flights.gauges(),
                    inner.flights.max_leases_per_pid(),
                )
            };
        }
        include flights::Tally = tally;
        include CoordCounters = coordinator.counters;
        fields {
            waiters = waiting
                => gauge(43, "Resolve callers waiting right now.", named "resolve_waiters"),
            leases_active = in_flight => gauge(44, "Tuning leases and tuner jobs in flight."),
            max_leases_per_pid = max_per_pid as u64 => not_exported,
        }
    }
}
