//! The coordination rules, with no runtime, socket or process in them: who holds the flight
//! of a missing key (a rank's lease, the node's tuner, a cluster claim in progress, another
//! node, or nobody yet), who waits for it, and what each event does to it: a Resolve, a
//! stored result, a lease that expires, whose holder dies or gives up, a Record that did not
//! complete its lease, a tuner job that ends, a cluster answer, a wait that times out.
//!
//! Events come in as method calls with the time they happened; what the caller must do comes
//! back as [`Effect`]s (answer a waiter, hand a lease to a waiter) and return values. A
//! Resolve is a short conversation ([`resolve`]): the rules say the next step ([`Next`]: look
//! in the store, ask the cluster, offer the tuner the job, or the answer), the adapter does
//! it and tells what it found ([`Fact`]). What a flight owns in the outside world (a lease's
//! expiry watch, a cluster lease, the watch on another node's lease) travels with the flight
//! as its [`Attachments`], so dropping a flight releases all of it, and every change of holder
//! goes through one place ([`Flights::set_holder`]) that stops what the old holder had.
//!
//! Here: the types and the events that are not a Resolve or an end; `endings`: a stored
//! result, a lease or a tuner job that ends, a holder's flight handed over; [`resolve`]: a
//! Resolve's order, who tunes a key this node is to tune, a cluster claim and a take-over.

mod endings;
pub mod resolve;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::Resolution;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::names::ViewId;
pub use resolve::{tuner_takes, Advance, ClaimAnswer, Fact, Next, Offer, Resolve, Seen, TakeOver};

/// A waiting Resolve, as the caller's side knows it.
pub type WaiterId = u64;

/// What a flight holds outside this type; the adapter's implementation owns the tasks and
/// the cluster lease, a test's records what was asked.
pub trait Attachments: Default {
    /// This node's lease on a key in the cluster tier (renewed while held, released when
    /// dropped).
    type ClusterLease;
    /// This node tunes the key, under `lease`: the flight holds it from now on.
    fn hold_cluster_lease(&mut self, lease: Self::ClusterLease);
    /// The lease holder changed or ended: its expiry/death watch stops.
    fn stop_lease_watch(&mut self);
    /// The flight no longer waits on another node: the watch on that node's lease stops.
    fn stop_remote_watch(&mut self);
    /// The key has its result: this node's cluster lease stays until the result's publish
    /// deletes it, so no other node takes it before the result is there to find.
    fn keep_cluster_lease_for_result(&mut self);
    /// Nobody here tunes the key any more: this node's cluster lease goes.
    fn release_cluster_lease(&mut self);
}

/// Who asks: whether it can tune, its process (for the per-process lease cap and the death
/// watch), the lease length it wants and the job view it reads in (a lease it is granted
/// carries the view).
#[derive(Clone, Debug)]
pub struct Caller {
    pub can_tune: bool,
    pub pid: Option<i32>,
    pub lease: Duration,
    pub view: Option<ViewId>,
}

/// A lease just granted: the caller's side starts its expiry/death watch and answers
/// `TuneHere`.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub key: CacheKey,
    pub lease_id: String,
    pub pid: Option<i32>,
    pub length: Duration,
}

impl Grant {
    /// The answer its holder gets.
    pub fn answer(&self) -> Resolution {
        Resolution::TuneHere {
            lease_id: self.lease_id.clone(),
            expires_in: self.length,
        }
    }
}

/// What the caller's side must do after an event.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Answer this waiter (a hit, or a miss with its reason).
    Reply(WaiterId, Resolution),
    /// This waiter now holds the lease: answer it `TuneHere`. If it has gone, report back
    /// with [`Flights::grant_undelivered`].
    Grant(WaiterId, Grant),
}

/// Why a lease ended without a result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LeaseEnd {
    Expired,
    HolderDied,
    GivenUp,
}

/// How a waiting Resolve ended without its answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WaitEnd {
    /// It waited as long as it asked (`waited`), or its answer was lost.
    TimedOut { waited: Duration },
    /// The daemon is stopping.
    Stopping,
}

/// How the node's tuner job for a key ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TunerEnd {
    /// The measured result went to the store, which holds `stored` for the key now (a
    /// better result recorded meanwhile stays, and answers the waiters all the same).
    Stored(Option<TunedResult>),
    /// Storing the measured result failed.
    StoreFailed(String),
    /// The tuner could not tune it.
    Failed(String),
    /// The tuner stopped before it answered.
    Stopped,
}

crate::report::stats_registry! {
    /// Lease outcomes, for Stats.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct Tally {
        pub leases_granted: u64 => counter(
            8,
            "Resolve outcome: the caller was told to tune (lease granted).",
            named "resolve_leases_granted",
        ),
        pub leases_expired: u64 => counter(11, "Tuning leases that ran out before a Record."),
        pub leases_released_dead: u64
            => counter(12, "Tuning leases released because their holder died."),
        pub leases_given_up: u64 => counter(13, "Tuning leases given up by an empty Record."),
    }
}

/// Who is producing a flight's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Holder {
    /// Nobody yet: the waiters wait for a caller that can tune.
    Nobody,
    Lease {
        id: String,
        pid: Option<i32>,
        /// The job view of the Resolve that was granted the lease.
        view: Option<ViewId>,
    },
    /// The node's tuner worker; `what` describes the job for miss reasons.
    Tuner { what: String },
    /// A caller is asking the cluster who tunes it; others wait meanwhile.
    Claiming,
    /// Another node holds the cluster lease: its result arrives by push.
    Remote { node: String },
}

struct Waiter {
    id: WaiterId,
    can_tune: bool,
    pid: Option<i32>,
    lease: Duration,
    view: Option<ViewId>,
}

struct Flight<A> {
    holder: Holder,
    /// When the current holder took over, for miss reasons.
    since: SystemTime,
    waiters: Vec<Waiter>,
    attachments: A,
}

impl<A: Attachments> Flight<A> {
    /// Nobody produces its result and nobody waits: the flight can go.
    fn is_idle(&self) -> bool {
        matches!(self.holder, Holder::Nobody | Holder::Remote { .. }) && self.waiters.is_empty()
    }
}

/// Every in-flight key of the node and the rules that move them.
pub struct Flights<A: Attachments> {
    flights: HashMap<CacheKey, Flight<A>>,
    /// lease id → the key it is for.
    leases: HashMap<String, CacheKey>,
    /// Leases held per process: each one's watch holds a pidfd, so a process is capped.
    leases_per_pid: HashMap<i32, usize>,
    max_leases_per_pid: usize,
    lease_prefix: String,
    next_id: u64,
    tally: Tally,
}

impl<A: Attachments> Flights<A> {
    /// `lease_prefix` makes lease ids unique across daemon runs; one process may hold at
    /// most `max_leases_per_pid` leases (at least 1).
    pub fn new(lease_prefix: String, max_leases_per_pid: usize) -> Self {
        Flights {
            flights: HashMap::new(),
            leases: HashMap::new(),
            leases_per_pid: HashMap::new(),
            max_leases_per_pid: max_leases_per_pid.max(1),
            lease_prefix,
            next_id: 0,
            tally: Tally::default(),
        }
    }

    /// No key is in flight (the change feed's fast path).
    pub fn is_empty(&self) -> bool {
        self.flights.is_empty()
    }

    pub fn max_leases_per_pid(&self) -> usize {
        self.max_leases_per_pid
    }

    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Callers waiting now, and flights someone is producing a result for.
    pub fn gauges(&self) -> (u64, u64) {
        let waiters = self.flights.values().map(|f| f.waiters.len() as u64).sum();
        let active = self
            .flights
            .values()
            .filter(|f| !matches!(f.holder, Holder::Nobody | Holder::Remote { .. }))
            .count() as u64;
        (waiters, active)
    }

    /// Who holds `key`'s flight, if there is one.
    fn holder(&self, key: &CacheKey) -> Option<&Holder> {
        self.flights.get(key).map(|flight| &flight.holder)
    }

    /// The key a live lease is for.
    fn lease_key(&self, lease_id: &str) -> Option<&CacheKey> {
        self.leases.get(lease_id)
    }

    /// The key a live lease is for, and the job view it was granted in.
    pub fn lease(&self, lease_id: &str) -> Option<(&CacheKey, Option<&ViewId>)> {
        let key = self.leases.get(lease_id)?;
        match self.holder(key) {
            Some(Holder::Lease { id, view, .. }) if id == lease_id => Some((key, view.as_ref())),
            _ => None,
        }
    }

    /// What `key`'s flight owns outside, for the caller's side to attach a watch.
    pub fn attachments_mut(&mut self, key: &CacheKey) -> Option<&mut A> {
        self.flights
            .get_mut(key)
            .map(|flight| &mut flight.attachments)
    }

    /// Whether `pid` may take one more lease.
    fn has_lease_room(&self, pid: Option<i32>) -> bool {
        pid.is_none_or(|pid| {
            self.leases_per_pid.get(&pid).copied().unwrap_or(0) < self.max_leases_per_pid
        })
    }

    /// No flight exists for `key`: a stored result for it wakes nobody, and the node's
    /// tuner may take it.
    pub fn is_new(&self, key: &CacheKey) -> bool {
        !self.flights.contains_key(key)
    }

    /// Nobody produces `key`'s result (no flight, or one held by nobody): a caller that can
    /// tune may take a lease.
    fn is_free(&self, key: &CacheKey) -> bool {
        self.flights
            .get(key)
            .is_none_or(|flight| flight.holder == Holder::Nobody)
    }

    /// The node's tuner took `key`'s job.
    fn tuner_started(&mut self, key: &CacheKey, now: SystemTime) {
        let what = format!("{} job on {}", key.op, key.device);
        self.flight_of(key, now);
        self.set_holder(key, Holder::Tuner { what }, now);
    }

    /// Makes `caller` the holder of a new lease on `key`, unless its process holds the most
    /// leases it may (then `Err((pid, limit))`).
    fn lease_to(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        now: SystemTime,
    ) -> Result<Grant, (i32, usize)> {
        if let Some(pid) = caller.pid.filter(|_| !self.has_lease_room(caller.pid)) {
            return Err((pid, self.max_leases_per_pid));
        }
        Ok(self.grant(key, caller.pid, caller.lease, caller.view.clone(), now))
    }

    /// A caller with no result and nobody to tune it for it: it waits, or gets a miss
    /// naming who is producing the result when it will not wait.
    fn wait_or_miss(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        will_wait: bool,
        now: SystemTime,
    ) -> Next {
        if !will_wait {
            let reason = match self.flights.get(key) {
                Some(flight) => busy_reason(flight, now),
                None => "not cached, and the caller cannot tune it and will not wait".to_owned(),
            };
            self.remove_if_idle(key);
            return Next::Miss(reason);
        }
        let id = self.next_id();
        self.flight_of(key, now).waiters.push(Waiter {
            id,
            can_tune: caller.can_tune,
            pid: caller.pid,
            lease: caller.lease,
            view: caller.view.clone(),
        });
        Next::Wait(id)
    }

    /// A waiter's call ended without an answer because the caller went away.
    pub fn waiter_left(&mut self, key: &CacheKey, waiter: WaiterId) {
        if let Some(flight) = self.flights.get_mut(key) {
            flight.waiters.retain(|w| w.id != waiter);
        }
        self.remove_if_idle(key);
    }

    /// A waiter's call ended without its answer: it leaves, and gets a miss saying why;
    /// after a timeout, who is producing the result and since when (as it was while the
    /// waiter still waited).
    pub fn wait_ended(
        &mut self,
        key: &CacheKey,
        waiter: WaiterId,
        end: WaitEnd,
        now: SystemTime,
    ) -> Resolution {
        let reason = match end {
            WaitEnd::TimedOut { waited } => format!(
                "no result within {} ms: {}",
                waited.as_millis(),
                self.miss_reason(key, now)
            ),
            WaitEnd::Stopping => "the daemon is shutting down".to_owned(),
        };
        self.waiter_left(key, waiter);
        Resolution::Miss(reason)
    }

    /// Why a waiter of `key` got no result: who is producing it, since when.
    fn miss_reason(&self, key: &CacheKey, now: SystemTime) -> String {
        match self.flights.get(key) {
            Some(flight) => busy_reason(flight, now),
            None => "the flight ended without a result".to_owned(),
        }
    }

    // --- the one place holders change ---

    /// Replaces `key`'s holder, ending what the old one had (its lease, its remote watch).
    fn set_holder(&mut self, key: &CacheKey, holder: Holder, now: SystemTime) {
        let Some(mut flight) = self.flights.remove(key) else {
            return;
        };
        self.end_holder(&mut flight);
        flight.holder = holder;
        flight.since = now;
        self.flights.insert(key.clone(), flight);
    }

    /// Ends what `flight`'s holder had, leaving it held by nobody.
    fn end_holder(&mut self, flight: &mut Flight<A>) {
        match std::mem::replace(&mut flight.holder, Holder::Nobody) {
            Holder::Lease { id, pid, .. } => {
                self.leases.remove(&id);
                if let Some(pid) = pid {
                    if let Some(held) = self.leases_per_pid.get_mut(&pid) {
                        *held = held.saturating_sub(1);
                        if *held == 0 {
                            self.leases_per_pid.remove(&pid);
                        }
                    }
                }
                flight.attachments.stop_lease_watch();
            }
            Holder::Remote { .. } => flight.attachments.stop_remote_watch(),
            Holder::Nobody | Holder::Tuner { .. } | Holder::Claiming => {}
        }
    }

    fn grant(
        &mut self,
        key: &CacheKey,
        pid: Option<i32>,
        length: Duration,
        view: Option<ViewId>,
        now: SystemTime,
    ) -> Grant {
        let serial = self.next_id();
        let lease_id = format!("{}-{serial:x}", self.lease_prefix);
        self.flight_of(key, now);
        self.set_holder(
            key,
            Holder::Lease {
                id: lease_id.clone(),
                pid,
                view,
            },
            now,
        );
        self.leases.insert(lease_id.clone(), key.clone());
        if let Some(pid) = pid {
            *self.leases_per_pid.entry(pid).or_default() += 1;
        }
        self.tally.leases_granted += 1;
        Grant {
            key: key.clone(),
            lease_id,
            pid,
            length,
        }
    }

    fn flight_of(&mut self, key: &CacheKey, now: SystemTime) -> &mut Flight<A> {
        self.flights.entry(key.clone()).or_insert_with(|| Flight {
            holder: Holder::Nobody,
            since: now,
            waiters: Vec::new(),
            attachments: A::default(),
        })
    }

    fn remove_if_idle(&mut self, key: &CacheKey) {
        if self.flights.get(key).is_some_and(Flight::is_idle) {
            if let Some(mut flight) = self.flights.remove(key) {
                self.end_holder(&mut flight);
            }
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

fn busy_reason<A>(flight: &Flight<A>, now: SystemTime) -> String {
    let ago = now.duration_since(flight.since).unwrap_or_default();
    let since = format!(
        "since unix ms {} ({:.1} s ago)",
        tunecache_proto::unix_ms(flight.since),
        ago.as_secs_f64()
    );
    match &flight.holder {
        Holder::Lease {
            id, pid: Some(pid), ..
        } => {
            format!("pid {pid} holds lease {id} and is tuning it, {since}")
        }
        Holder::Lease { id, pid: None, .. } => format!("lease {id} is tuning it, {since}"),
        Holder::Tuner { what } => format!("the node's tuner worker is tuning it ({what}), {since}"),
        Holder::Nobody => format!("no caller that can tune it has asked, waiting {since}"),
        Holder::Claiming => format!("asking the cluster who tunes it, {since}"),
        Holder::Remote { node } => {
            format!("node {node} holds the cluster lease and is tuning it, {since}")
        }
    }
}
