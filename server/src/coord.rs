//! Coordinated tuning: `Resolve` makes each missing problem get tuned once per node.
//!
//! Owns the in-flight problems ("flights"): for each key being tuned, who holds it (a rank's
//! lease, the tuner worker, or nobody yet) and who waits for it. Waiting costs a oneshot
//! channel and a timer, no thread. A flight ends when the key is stored, or its holder goes
//! away: the lease expires, the holder process exits (watched with a pidfd), or the holder
//! gives up; the lease then passes to the next waiter that can tune.
//!
//! Two events reach a flight, each by one path. A result for the key, whoever stored it (a
//! rank's Record, the node's tuner, a snapshot, the cluster tier), arrives through the
//! store's change feed (`entries_changed`, subscribed by the server), which wakes every
//! waiter with the merged result. The holder's end arrives directly: a rank's Record goes
//! through `record`, which applies it and then ends its lease; a tuner job ends in
//! `finish_tuner_job`.
//!
//! Leases and waiters live in memory only: after a daemon restart callers simply Resolve
//! again.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tunecache_proto::v1;

use crate::cluster::{Claim, Cluster, ClusterLease};
use crate::entry::{CacheKey, TunedResult};
use crate::error::{Error, Result};
use crate::store::{ApplyOutcome, ChangeListener, Store, StoredEntry};
use crate::tuner::{JobReply, SubmitError, TunerHandle};

/// Longest a caller may wait for someone else's result.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Lease length when the caller does not say.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(120);
/// Longest lease a caller may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct CoordCounters {
    pub resolves: AtomicU64,
    pub leases_granted: AtomicU64,
    pub leases_expired: AtomicU64,
    pub leases_released_dead: AtomicU64,
    pub leases_given_up: AtomicU64,
    pub waits_satisfied: AtomicU64,
    pub waits_timed_out: AtomicU64,
    /// Resolves refused because the caller's process held `max_leases_per_pid` leases.
    pub leases_refused_per_pid: AtomicU64,
    /// Resolves refused because the node's tuner queue was full.
    pub tuner_queue_refusals: AtomicU64,
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
}

/// Who is producing a flight's result.
enum Holder {
    /// Nobody yet: the waiters wait for a caller that can tune.
    Nobody,
    Lease(LeaseHolder),
    /// The daemon's own tuner worker; `what` describes the job for miss reasons.
    Tuner {
        what: String,
    },
    /// A caller is asking the cluster tier for the cluster lease; others wait meanwhile.
    Claiming,
    /// Another node holds the cluster lease: its result arrives by push. The watch (which
    /// takes over when that lease runs out) stops when this holder is replaced.
    Remote {
        node: String,
        _watch: tokio_util::sync::DropGuard,
    },
}

struct LeaseHolder {
    id: String,
    pid: Option<i32>,
    /// Cancelled when the lease ends, which stops its expiry/death watch.
    ended: CancellationToken,
    /// The lease's place in its process's count; given back when the holder is dropped.
    _counted: Option<PidLease>,
}

/// Leases held per process: each one's watch holds a pidfd, so a process is capped.
type LeasesPerPid = Arc<Mutex<HashMap<i32, usize>>>;

/// One lease in its holder process's count.
struct PidLease {
    pid: i32,
    counts: LeasesPerPid,
}

impl Drop for PidLease {
    fn drop(&mut self) {
        let mut counts = crate::sync::lock(&self.counts);
        if let Some(held) = counts.get_mut(&self.pid) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                counts.remove(&self.pid);
            }
        }
    }
}

struct Waiter {
    id: u64,
    can_tune: bool,
    pid: Option<i32>,
    lease: Duration,
    reply: oneshot::Sender<Resolution>,
}

struct Flight {
    holder: Holder,
    /// When the current holder took over, for miss reasons.
    since: SystemTime,
    waiters: Vec<Waiter>,
    /// This node's cluster lease on the key, renewed while the flight lives.
    cluster_lease: Option<ClusterLease>,
}

#[derive(Default)]
struct State {
    flights: HashMap<CacheKey, Flight>,
    /// lease id → the key it is for.
    leases: HashMap<String, CacheKey>,
    next_id: u64,
}

pub struct Coordinator {
    state: Mutex<State>,
    store: Store,
    tuner: TunerHandle,
    counters: CoordCounters,
    shutdown: CancellationToken,
    lease_prefix: String,
    me: Weak<Coordinator>,
    /// Lease watches are spawned from here, also when a lease ends on a non-runtime thread.
    runtime: tokio::runtime::Handle,
    max_leases_per_pid: usize,
    leases_per_pid: LeasesPerPid,
    refusals_logged: crate::limits::LogOnce,
    /// The Redis cluster tier, when on: cross-node single-flight before local tuning.
    cluster: OnceLock<Arc<Cluster>>,
}

/// Why a lease ended without a result.
#[derive(Clone, Copy, Debug)]
enum LeaseEnd {
    Expired,
    HolderDied,
    GivenUp,
}

fn describe_since(since: SystemTime) -> String {
    let ago = since.elapsed().unwrap_or_default();
    let at_ms = tunecache_proto::unix_ms(since);
    format!("since unix ms {at_ms} ({:.1} s ago)", ago.as_secs_f64())
}

impl Coordinator {
    /// Creates the coordinator. Call it inside the tokio runtime, and subscribe it to the
    /// store's change feed (`Store::add_change_listener`) before serving: that is how stored
    /// results wake waiters. One process may hold at most `max_leases_per_pid` leases.
    pub fn new(
        store: Store,
        tuner: TunerHandle,
        shutdown: CancellationToken,
        max_leases_per_pid: usize,
    ) -> Arc<Coordinator> {
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        Arc::new_cyclic(|me| Coordinator {
            state: Mutex::new(State::default()),
            store,
            tuner,
            counters: CoordCounters::default(),
            shutdown,
            lease_prefix: format!("{nonce:016x}"),
            me: me.clone(),
            runtime: tokio::runtime::Handle::current(),
            max_leases_per_pid: max_leases_per_pid.max(1),
            leases_per_pid: LeasesPerPid::default(),
            refusals_logged: Default::default(),
            cluster: OnceLock::new(),
        })
    }

    /// Turns on cross-node single-flight through the cluster tier.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    /// Whether `pid` may take one more lease.
    fn has_lease_room(&self, pid: Option<i32>) -> bool {
        let Some(pid) = pid else {
            return true;
        };
        let counts = crate::sync::lock(&self.leases_per_pid);
        counts.get(&pid).copied().unwrap_or(0) < self.max_leases_per_pid
    }

    /// Counts and logs (once per pid) a Resolve refused for the per-pid lease cap.
    fn refuse_lease(&self, pid: i32) -> Error {
        let limit = self.max_leases_per_pid;
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

    /// Callers waiting right now, and flights in progress.
    pub fn gauges(&self) -> (u64, u64) {
        let state = self.lock();
        let waiters = state.flights.values().map(|f| f.waiters.len() as u64).sum();
        let active = state
            .flights
            .values()
            .filter(|f| !matches!(f.holder, Holder::Nobody | Holder::Remote { .. }))
            .count() as u64;
        (waiters, active)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Makes `pid` the holder of a new lease on `key`, starting now.
    fn grant_lease(
        &self,
        state: &mut State,
        key: &CacheKey,
        pid: Option<i32>,
        length: Duration,
    ) -> Resolution {
        let (holder, resolution) = self.new_lease(state, key, pid, length);
        let flight = flight_of(state, key);
        flight.holder = Holder::Lease(holder);
        flight.since = SystemTime::now();
        resolution
    }

    /// Grants the caller of `call` a lease on its key, unless its process already holds
    /// `max_leases_per_pid` leases.
    fn lease_to_caller(&self, state: &mut State, call: &ResolveCall) -> Result<Resolution> {
        if let Some(pid) = call
            .caller_pid
            .filter(|_| !self.has_lease_room(call.caller_pid))
        {
            return Err(self.refuse_lease(pid));
        }
        Ok(self.grant_lease(state, &call.key, call.caller_pid, call.lease))
    }

    fn new_lease(
        &self,
        state: &mut State,
        key: &CacheKey,
        pid: Option<i32>,
        length: Duration,
    ) -> (LeaseHolder, Resolution) {
        state.next_id += 1;
        let id = format!("{}-{:x}", self.lease_prefix, state.next_id);
        state.leases.insert(id.clone(), key.clone());
        let counted = pid.map(|pid| {
            let mut counts = crate::sync::lock(&self.leases_per_pid);
            *counts.entry(pid).or_default() += 1;
            PidLease {
                pid,
                counts: self.leases_per_pid.clone(),
            }
        });
        let ended = CancellationToken::new();
        self.counters.leases_granted.fetch_add(1, Ordering::Relaxed);
        if let Some(me) = self.me.upgrade() {
            self.runtime.spawn(watch_lease(
                me,
                key.clone(),
                id.clone(),
                pid,
                length,
                ended.clone(),
            ));
        }
        let holder = LeaseHolder {
            id: id.clone(),
            pid,
            ended,
            _counted: counted,
        };
        let resolution = Resolution::TuneHere {
            lease_id: id,
            expires_in: length,
        };
        (holder, resolution)
    }

    /// Resolves one key: a hit, a lease to tune it here, or a wait for someone else.
    /// Refused only when the node's tuner should take the job but its queue is full.
    pub async fn resolve(&self, call: ResolveCall) -> Result<Resolution> {
        self.counters.resolves.fetch_add(1, Ordering::Relaxed);
        if let Some(result) = self.store.get(&call.key) {
            return Ok(Resolution::Hit(result));
        }
        if let Some(cluster) = self.cluster.get() {
            if let Some(resolution) = self.claim_in_cluster(cluster, &call).await? {
                return Ok(resolution);
            }
        }
        let (waiter_id, receiver) = {
            let mut state = self.lock();
            // Checked again under the lock: the store publishes before it notifies, so a
            // result stored after the first check is either visible here or will wake us.
            if let Some(result) = self.store.get(&call.key) {
                return Ok(Resolution::Hit(result));
            }
            let state = &mut *state;
            if !state.flights.contains_key(&call.key) {
                self.start_tuner_job(state, &call.key)?;
            }
            let can_take_lease = match state.flights.get(&call.key) {
                None => true,
                Some(flight) => matches!(flight.holder, Holder::Nobody),
            };
            if call.can_tune && can_take_lease {
                return self.lease_to_caller(state, &call);
            }
            if call.wait.is_zero() {
                let reason = match state.flights.get(&call.key) {
                    Some(flight) => self.busy_reason(flight),
                    None => {
                        "not cached, and the caller cannot tune it and will not wait".to_owned()
                    }
                };
                self.counters
                    .waits_timed_out
                    .fetch_add(1, Ordering::Relaxed);
                if flight_is_idle(state.flights.get(&call.key)) {
                    state.flights.remove(&call.key);
                }
                return Ok(Resolution::Miss(reason));
            }
            state.next_id += 1;
            let waiter_id = state.next_id;
            let (reply, receiver) = oneshot::channel();
            flight_of(state, &call.key).waiters.push(Waiter {
                id: waiter_id,
                can_tune: call.can_tune,
                pid: call.caller_pid,
                lease: call.lease,
                reply,
            });
            (waiter_id, receiver)
        };

        // Removes this waiter if the call ends any other way than through its channel:
        // timeout, shutdown, or the caller going away (the future is dropped).
        let guard = WaiterGuard {
            coordinator: self,
            key: &call.key,
            waiter_id,
        };
        let outcome = tokio::select! {
            outcome = receiver => outcome.ok(),
            () = tokio::time::sleep(call.wait) => None,
            () = self.shutdown.cancelled() => {
                return Ok(Resolution::Miss("the daemon is shutting down".to_owned()));
            }
        };
        match outcome {
            Some(resolution) => {
                std::mem::forget(guard);
                if matches!(resolution, Resolution::Hit(_)) {
                    self.counters
                        .waits_satisfied
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(resolution)
            }
            None => {
                let reason = {
                    let state = self.lock();
                    match state.flights.get(&call.key) {
                        Some(flight) => self.busy_reason(flight),
                        None => "the flight ended without a result".to_owned(),
                    }
                };
                drop(guard);
                self.counters
                    .waits_timed_out
                    .fetch_add(1, Ordering::Relaxed);
                Ok(Resolution::Miss(format!(
                    "no result within {} ms: {reason}",
                    call.wait.as_millis()
                )))
            }
        }
    }

    fn busy_reason(&self, flight: &Flight) -> String {
        let since = describe_since(flight.since);
        match &flight.holder {
            Holder::Lease(lease) => match lease.pid {
                Some(pid) => format!(
                    "pid {pid} holds lease {} and is tuning it, {since}",
                    lease.id
                ),
                None => format!("lease {} is tuning it, {since}", lease.id),
            },
            Holder::Tuner { what } => {
                format!("the node's tuner worker is tuning it ({what}), {since}")
            }
            Holder::Nobody => format!("no caller that can tune it has asked, waiting {since}"),
            Holder::Claiming => format!("asking the cluster who tunes it, {since}"),
            Holder::Remote { node, .. } => {
                format!("node {node} holds the cluster lease and is tuning it, {since}")
            }
        }
    }

    /// A rank's Record, with the lease it tuned under (empty: none). Stored through the
    /// store's write queue (refused when it is full), so the change feed wakes the waiters
    /// of every key it changes; then the lease ends. A refused Record leaves the lease held.
    pub async fn record(
        &self,
        entries: Vec<(CacheKey, TunedResult)>,
        lease_id: &str,
    ) -> Result<ApplyOutcome> {
        let outcome = if entries.is_empty() {
            ApplyOutcome::default()
        } else {
            self.store.try_apply(entries).await?
        };
        if !lease_id.is_empty() {
            self.complete_lease(lease_id);
        }
        Ok(outcome)
    }

    /// A Record carrying `lease_id` was applied: the lease is complete. If the key now has
    /// a result the change feed has already woken the waiters; otherwise (the Record did
    /// not hold the key, or was empty) the lease is given up and passes on.
    fn complete_lease(&self, lease_id: &str) {
        let mut state = self.lock();
        let Some(key) = state.leases.get(lease_id).cloned() else {
            return; // unknown, expired or already completed: nothing to do
        };
        match self.store.get(&key) {
            Some(result) => self.finish(&mut state, &key, &result),
            None => self.end_lease(&mut state, &key, lease_id, LeaseEnd::GivenUp),
        }
    }

    /// Wakes every waiter of `key` with `result` and forgets the flight.
    fn finish(&self, state: &mut State, key: &CacheKey, result: &TunedResult) {
        let Some(mut flight) = state.flights.remove(key) else {
            return;
        };
        if let Some(cluster_lease) = flight.cluster_lease.take() {
            // Deleted by the publish of this result, so no node takes it before then.
            cluster_lease.keep_for_result();
        }
        if let Holder::Lease(lease) = &flight.holder {
            lease.ended.cancel();
            state.leases.remove(&lease.id);
        }
        for waiter in flight.waiters {
            let _ = waiter.reply.send(Resolution::Hit(result.clone()));
        }
    }

    /// The lease `lease_id` on `key` ended without a result: hand it to the next waiter
    /// that can tune, if any.
    fn end_lease(&self, state: &mut State, key: &CacheKey, lease_id: &str, why: LeaseEnd) {
        let current = matches!(
            state.flights.get(key).map(|f| &f.holder),
            Some(Holder::Lease(lease)) if lease.id == lease_id
        );
        state.leases.remove(lease_id);
        if !current {
            return;
        }
        let counter = match why {
            LeaseEnd::Expired => &self.counters.leases_expired,
            LeaseEnd::HolderDied => &self.counters.leases_released_dead,
            LeaseEnd::GivenUp => &self.counters.leases_given_up,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(lease = lease_id, problem = %key.problem, reason = ?why, "lease ended without a result");
        self.hand_over(state, key);
    }

    /// Gives the flight of `key` to its first live waiter that can tune, or to nobody.
    fn hand_over(&self, state: &mut State, key: &CacheKey) {
        loop {
            let Some(flight) = state.flights.get_mut(key) else {
                return;
            };
            if let Holder::Lease(lease) = &flight.holder {
                lease.ended.cancel();
            }
            flight.holder = Holder::Nobody;
            flight.since = SystemTime::now();
            // A waiter whose process holds the most leases keeps waiting for someone else.
            let next = flight
                .waiters
                .iter()
                .position(|w| w.can_tune && !w.reply.is_closed() && self.has_lease_room(w.pid));
            let Some(index) = next else {
                flight.cluster_lease = None; // nobody here tunes it: release it
                if flight_is_idle(Some(flight)) {
                    state.flights.remove(key);
                }
                return;
            };
            let waiter = flight.waiters.remove(index);
            let (holder, resolution) = self.new_lease(state, key, waiter.pid, waiter.lease);
            if waiter.reply.send(resolution).is_ok() {
                if let Some(flight) = state.flights.get_mut(key) {
                    flight.holder = Holder::Lease(holder);
                }
                return;
            }
            // The waiter left between the check and the send: take the lease back.
            holder.ended.cancel();
            state.leases.remove(&holder.id);
        }
    }

    fn remove_waiter(&self, key: &CacheKey, waiter_id: u64) {
        let mut state = self.lock();
        if let Some(flight) = state.flights.get_mut(key) {
            flight.waiters.retain(|w| w.id != waiter_id);
        }
        if flight_is_idle(state.flights.get(key)) {
            state.flights.remove(key);
        }
    }

    /// Whether the node's tuner measures this key: its namespace, and a device fingerprint
    /// the worker reported. Keys of other devices follow the lease path.
    fn tuner_takes(&self, key: &CacheKey) -> bool {
        key.namespace == tunecache_proto::tuner::problem::NAMESPACE
            && self
                .tuner
                .devices()
                .iter()
                .any(|d| d.fingerprint == key.device)
    }

    /// Hands the flight of `key` to the node's tuner when it measures such keys. Called
    /// with the state locked and no flight for `key`, or one nobody holds.
    fn start_tuner_job(&self, state: &mut State, key: &CacheKey) -> Result<()> {
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
        let flight = flight_of(state, key);
        flight.holder = Holder::Tuner {
            what: format!("{} job on {}", key.op, key.device),
        };
        flight.since = SystemTime::now();
        if let Some(me) = self.me.upgrade() {
            self.runtime.spawn(finish_tuner_job(me, key.clone(), reply));
        }
        Ok(())
    }

    /// Wakes the waiters of `key` with the stored result, if there is one now.
    fn finish_from_store(&self, key: &CacheKey) -> bool {
        let mut state = self.lock();
        match self.store.get(key) {
            Some(result) => {
                self.finish(&mut state, key, &result);
                true
            }
            None => false,
        }
    }

    /// The tuner could not produce a result for `key`: its waiters get a miss with `reason`.
    fn fail_tuner_job(&self, key: &CacheKey, reason: &str) {
        let mut state = self.lock();
        if let Some(flight) = state.flights.remove(key) {
            for waiter in flight.waiters {
                let _ = waiter.reply.send(Resolution::Miss(reason.to_owned()));
            }
        }
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
        Ok(Ok(result)) => match coordinator.store.apply(vec![(key.clone(), result)]).await {
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

/// The flight of `key`, created (held by nobody yet) if there is none.
fn flight_of<'a>(state: &'a mut State, key: &CacheKey) -> &'a mut Flight {
    state.flights.entry(key.clone()).or_insert_with(|| Flight {
        holder: Holder::Nobody,
        since: SystemTime::now(),
        waiters: Vec::new(),
        cluster_lease: None,
    })
}

fn flight_is_idle(flight: Option<&Flight>) -> bool {
    flight.is_some_and(|f| {
        matches!(f.holder, Holder::Nobody | Holder::Remote { .. }) && f.waiters.is_empty()
    })
}

/// The store's change feed: every stored result wakes the waiters of its key.
impl ChangeListener for Coordinator {
    fn entries_changed(&self, changed: &[StoredEntry]) {
        let mut state = self.lock();
        if state.flights.is_empty() {
            return;
        }
        for entry in changed {
            let key = entry.key().to_key();
            if state.flights.contains_key(&key) {
                self.finish(&mut state, &key, &entry.result().to_result());
            }
        }
    }
}

struct WaiterGuard<'a> {
    coordinator: &'a Coordinator,
    key: &'a CacheKey,
    waiter_id: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.coordinator.remove_waiter(self.key, self.waiter_id);
    }
}

/// Opens a pidfd for `pid`: readable once the process exits (zombie or reaped).
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until `pid` exits. Never returns if the process cannot be watched.
async fn process_exit(pid: Option<i32>) {
    let Some(fd) = pid.and_then(pidfd_open) else {
        return std::future::pending().await;
    };
    // SAFETY: the AsyncFd owns the only handle to this freshly opened pidfd, so the fd
    // stays valid and unshared for as long as it is registered.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(async_fd) => {
            let _ = async_fd.readable().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// Ends the lease when it expires or its holder process exits, unless it ends first.
async fn watch_lease(
    coordinator: Arc<Coordinator>,
    key: CacheKey,
    lease_id: String,
    pid: Option<i32>,
    length: Duration,
    ended: CancellationToken,
) {
    let deadline = Instant::now() + length;
    let why = tokio::select! {
        () = ended.cancelled() => return,
        () = tokio::time::sleep_until(deadline.into()) => LeaseEnd::Expired,
        () = process_exit(pid) => LeaseEnd::HolderDied,
    };
    let mut state = coordinator.lock();
    coordinator.end_lease(&mut state, &key, &lease_id, why);
}

// --- Cross-node single-flight through the cluster tier ---

impl Coordinator {
    /// Before this node starts tuning a missing key (a lease for this caller, or a tuner
    /// job), asks the cluster for the key's lease, waiting at most the cluster timeout.
    /// `Some` answers the call; `None` continues with node-local coordination, where the
    /// flight now says who tunes (this node, another node, or nobody yet).
    async fn claim_in_cluster(
        &self,
        cluster: &Arc<Cluster>,
        call: &ResolveCall,
    ) -> Result<Option<Resolution>> {
        if call.can_tune && !self.has_lease_room(call.caller_pid) {
            return Ok(None); // refused on the node-local path
        }
        {
            let mut state = self.lock();
            if let Some(result) = self.store.get(&call.key) {
                return Ok(Some(Resolution::Hit(result)));
            }
            let needs_claim = match state.flights.get(&call.key) {
                None => call.can_tune || self.tuner_takes(&call.key),
                Some(flight) => call.can_tune && matches!(flight.holder, Holder::Nobody),
            };
            if !needs_claim {
                return Ok(None);
            }
            let flight = flight_of(&mut state, &call.key);
            flight.holder = Holder::Claiming;
            flight.since = SystemTime::now();
        }
        // If this call goes away mid-claim, the flight passes on as after a lost lease.
        let abandoned = ClaimGuard {
            coordinator: self,
            key: &call.key,
        };
        let claim = cluster.claim(&call.key).await;
        std::mem::forget(abandoned);

        if let Claim::Found(result) = claim {
            cluster
                .apply_learned(vec![(call.key.clone(), result.clone())])
                .await;
            self.end_claim(&call.key);
            return Ok(Some(Resolution::Hit(
                self.store.get(&call.key).unwrap_or(result),
            )));
        }
        let mut state = self.lock();
        let state = &mut *state;
        let claiming = matches!(
            state.flights.get(&call.key).map(|f| &f.holder),
            Some(Holder::Claiming)
        );
        if !claiming {
            // Finished meanwhile (a result arrived): any lease just taken is released.
            return Ok(self.store.get(&call.key).map(Resolution::Hit));
        }
        let flight = flight_of(state, &call.key);
        flight.holder = Holder::Nobody;
        match claim {
            Claim::Found(_) => return Ok(None), // answered above
            Claim::Acquired(lease) => flight.cluster_lease = Some(lease),
            Claim::HeldBy { holder, retry_in } => {
                let watch = CancellationToken::new();
                flight.holder = Holder::Remote {
                    node: holder,
                    _watch: watch.clone().drop_guard(),
                };
                if let Some(me) = self.me.upgrade() {
                    self.runtime.spawn(watch_remote(
                        me,
                        Arc::clone(cluster),
                        call.key.clone(),
                        retry_in,
                        watch,
                    ));
                }
                return Ok(None);
            }
            Claim::Unavailable(reason) => {
                tracing::debug!(problem = %call.key.problem, %reason, "cluster lease unavailable; coordinating node-locally");
            }
        }
        // This node tunes it: the tuner if it measures such keys, else this caller.
        if self.tuner_takes(&call.key) {
            if let Err(refused) = self.start_tuner_job(state, &call.key) {
                self.hand_over(state, &call.key);
                return Err(refused);
            }
            return Ok(None);
        }
        if call.can_tune {
            let leased = self.lease_to_caller(state, call);
            if leased.is_err() {
                self.hand_over(state, &call.key);
            }
            return leased.map(Some);
        }
        self.hand_over(state, &call.key);
        Ok(None)
    }

    /// A claim ended without this node tuning: wake waiters from the store, or pass on.
    fn end_claim(&self, key: &CacheKey) {
        let mut state = self.lock();
        if let Some(result) = self.store.get(key) {
            self.finish(&mut state, key, &result);
        } else if matches!(
            state.flights.get(key).map(|f| &f.holder),
            Some(Holder::Claiming)
        ) {
            self.hand_over(&mut state, key);
        }
    }

    /// The other node's cluster lease ran out (or Redis went away) while local callers
    /// waited: this node tunes it now, with `lease` if it took the cluster lease.
    fn take_over(&self, key: &CacheKey, lease: Option<ClusterLease>) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(flight) = state.flights.get_mut(key) else {
            return; // nobody waits any more; the lease is released on drop
        };
        if !matches!(flight.holder, Holder::Remote { .. }) {
            return;
        }
        flight.holder = Holder::Nobody;
        flight.since = SystemTime::now();
        flight.cluster_lease = lease;
        if self.tuner_takes(key) {
            if let Err(refused) = self.start_tuner_job(state, key) {
                tracing::warn!(problem = %key.problem, error = %refused, "taking over a tuning job failed");
                self.hand_over(state, key);
            }
            return;
        }
        self.hand_over(state, key);
    }
}

/// The coordinator's Stats fields: Resolve outcomes, leases and waiters.
impl crate::stats::FillStats for Coordinator {
    fn fill_stats(&self, stats: &mut v1::StatsResponse) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        let (waiters, leases_active) = self.gauges();
        stats.resolves = load(&counters.resolves);
        stats.leases_granted = load(&counters.leases_granted);
        stats.leases_expired = load(&counters.leases_expired);
        stats.leases_released_dead = load(&counters.leases_released_dead);
        stats.leases_given_up = load(&counters.leases_given_up);
        stats.waits_satisfied = load(&counters.waits_satisfied);
        stats.waits_timed_out = load(&counters.waits_timed_out);
        stats.waiters = waiters;
        stats.leases_active = leases_active;
        stats.max_leases_per_pid = self.max_leases_per_pid as u64;
        stats.leases_refused_per_pid = load(&counters.leases_refused_per_pid);
        stats.tuner_queue_refusals = load(&counters.tuner_queue_refusals);
    }
}

/// Passes the flight on if a claiming call is dropped before its claim ends.
struct ClaimGuard<'a> {
    coordinator: &'a Coordinator,
    key: &'a CacheKey,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.coordinator.end_claim(self.key);
    }
}

/// Waits for another node's result while that node holds the cluster lease; asks for the
/// lease again when it would run out, and takes over once it gets it. Stops when the
/// flight no longer waits on that node (the result arrived, or every caller left).
async fn watch_remote(
    coordinator: Arc<Coordinator>,
    cluster: Arc<Cluster>,
    key: CacheKey,
    mut retry_in: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(retry_in) => {}
            () = stop.cancelled() => return,
        }
        match cluster.claim(&key).await {
            Claim::HeldBy { retry_in: next, .. } => retry_in = next,
            Claim::Found(result) => {
                cluster.apply_learned(vec![(key.clone(), result)]).await;
                coordinator.finish_from_store(&key);
                return;
            }
            Claim::Acquired(lease) => {
                cluster.counters.takeovers.fetch_add(1, Ordering::Relaxed);
                tracing::info!(problem = %key.problem, "another node's cluster lease ran out; tuning here");
                coordinator.take_over(&key, Some(lease));
                return;
            }
            Claim::Unavailable(_) => {
                // No push can arrive without Redis: coordinate node-locally.
                coordinator.take_over(&key, None);
                return;
            }
        }
    }
}
