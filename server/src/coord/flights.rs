//! The coordination rules, with no runtime, socket or process in them: who holds the flight
//! of a missing key (a rank's lease, the node's tuner, a cluster claim in progress, another
//! node, or nobody yet), who waits for it, and what each event does to it: a Resolve, a
//! stored result, a lease that expires, whose holder dies or gives up, a tuner job that
//! fails, a cluster answer.
//!
//! Events come in as method calls with the time they happened; what the caller must do comes
//! back as [`Effect`]s (answer a waiter, hand a lease to a waiter) and return values. What a
//! flight owns in the outside world (a lease's expiry watch, a cluster lease, the watch on
//! another node's lease) travels with the flight as its [`Attachments`], so dropping a flight
//! releases all of it, and every change of holder goes through one place
//! ([`Flights::set_holder`]) that stops what the old holder had.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::Resolution;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::names::ViewId;

/// A waiting Resolve, as the caller's side knows it.
pub type WaiterId = u64;

/// What a flight holds outside this type; the adapter's implementation owns the tasks and
/// the cluster lease, a test's records what was asked.
pub trait Attachments: Default {
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

/// What the caller's side must do after an event.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Answer this waiter (a hit, or a miss with its reason).
    Reply(WaiterId, Resolution),
    /// This waiter now holds the lease: answer it `TuneHere`. If it has gone, report back
    /// with [`Flights::grant_undelivered`].
    Grant(WaiterId, Grant),
}

/// How a Resolve goes on.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// The caller tunes it.
    Lease(Grant),
    /// The caller waits, as this waiter.
    Wait(WaiterId),
    /// No result for this caller.
    Miss(String),
    /// The caller's process holds `limit` leases already.
    TooManyLeases { pid: i32, limit: usize },
}

/// Why a lease ended without a result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LeaseEnd {
    Expired,
    HolderDied,
    GivenUp,
}

/// What the cluster said to a claim.
#[derive(Debug)]
pub enum ClaimAnswer {
    /// This node holds the cluster lease now.
    Acquired,
    /// Another node holds it.
    HeldBy(String),
    /// No answer (Redis slow or away): coordinate on this node.
    Unavailable,
}

/// What follows a cluster answer.
#[derive(Debug, PartialEq)]
pub enum AfterClaim {
    /// The flight ended while the claim was out (its result arrived): nothing to do.
    Finished,
    /// Another node tunes it: watch its lease; the waiters wait for its result.
    WatchRemote,
    /// This node tunes it: the tuner, if it measures such keys, else the caller or a waiter.
    TuneHere,
}

/// Lease outcomes, for Stats.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub leases_granted: u64,
    pub leases_expired: u64,
    pub leases_released_dead: u64,
    pub leases_given_up: u64,
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
    pub fn holder(&self, key: &CacheKey) -> Option<&Holder> {
        self.flights.get(key).map(|flight| &flight.holder)
    }

    /// The key a live lease is for.
    pub fn lease_key(&self, lease_id: &str) -> Option<&CacheKey> {
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

    /// What `key`'s flight owns outside, for the caller's side to attach a watch or a lease.
    pub fn attachments_mut(&mut self, key: &CacheKey) -> Option<&mut A> {
        self.flights
            .get_mut(key)
            .map(|flight| &mut flight.attachments)
    }

    /// Whether `pid` may take one more lease.
    pub fn has_lease_room(&self, pid: Option<i32>) -> bool {
        pid.is_none_or(|pid| {
            self.leases_per_pid.get(&pid).copied().unwrap_or(0) < self.max_leases_per_pid
        })
    }

    /// Whether the node's tuner may take `key`: only when no flight exists yet.
    pub fn is_new(&self, key: &CacheKey) -> bool {
        !self.flights.contains_key(key)
    }

    /// The node's tuner took `key`'s job.
    pub fn tuner_started(&mut self, key: &CacheKey, what: String, now: SystemTime) {
        self.flight_of(key, now);
        self.set_holder(key, Holder::Tuner { what }, now);
    }

    /// A Resolve for `key` that the store could not answer (and, for a new key, after the
    /// tuner was offered it): a lease for a caller that can tune when nobody produces the
    /// result, else a wait, or a miss when the caller will not wait.
    pub fn resolve(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        will_wait: bool,
        now: SystemTime,
    ) -> Step {
        let free = self
            .flights
            .get(key)
            .is_none_or(|flight| flight.holder == Holder::Nobody);
        if caller.can_tune && free {
            return match self.lease_to(key, caller, now) {
                Ok(grant) => Step::Lease(grant),
                Err((pid, limit)) => Step::TooManyLeases { pid, limit },
            };
        }
        if !will_wait {
            let reason = match self.flights.get(key) {
                Some(flight) => busy_reason(flight, now),
                None => "not cached, and the caller cannot tune it and will not wait".to_owned(),
            };
            self.remove_if_idle(key);
            return Step::Miss(reason);
        }
        let id = self.next_id();
        self.flight_of(key, now).waiters.push(Waiter {
            id,
            can_tune: caller.can_tune,
            pid: caller.pid,
            lease: caller.lease,
            view: caller.view.clone(),
        });
        Step::Wait(id)
    }

    /// Makes `caller` the holder of a new lease on `key`, unless its process holds the most
    /// leases it may (then `Err((pid, limit))`).
    pub fn lease_to(
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

    /// A waiter's call ended without an answer (timeout, or the caller went away).
    pub fn waiter_left(&mut self, key: &CacheKey, waiter: WaiterId) {
        if let Some(flight) = self.flights.get_mut(key) {
            flight.waiters.retain(|w| w.id != waiter);
        }
        self.remove_if_idle(key);
    }

    /// Why a waiter of `key` got no result: who is producing it, since when.
    pub fn miss_reason(&self, key: &CacheKey, now: SystemTime) -> String {
        match self.flights.get(key) {
            Some(flight) => busy_reason(flight, now),
            None => "the flight ended without a result".to_owned(),
        }
    }

    /// `key` has a stored result: every waiter gets it and the flight ends.
    pub fn stored(&mut self, key: &CacheKey, result: &TunedResult) -> Vec<Effect> {
        let Some(mut flight) = self.flights.remove(key) else {
            return Vec::new();
        };
        flight.attachments.keep_cluster_lease_for_result();
        self.end_holder(&mut flight);
        flight
            .waiters
            .into_iter()
            .map(|waiter| Effect::Reply(waiter.id, Resolution::Hit(result.clone())))
            .collect()
    }

    /// Lease `lease_id` on `key` ended without a result. If it still holds the flight, the
    /// flight passes to the next waiter that can tune (`alive` says which waiters still
    /// listen); `None` when it no longer held it (nothing changes).
    pub fn lease_ended(
        &mut self,
        key: &CacheKey,
        lease_id: &str,
        why: LeaseEnd,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Option<Vec<Effect>> {
        let current = matches!(
            self.holder(key),
            Some(Holder::Lease { id, .. }) if id == lease_id
        );
        if !current {
            self.leases.remove(lease_id);
            return None;
        }
        let counter = match why {
            LeaseEnd::Expired => &mut self.tally.leases_expired,
            LeaseEnd::HolderDied => &mut self.tally.leases_released_dead,
            LeaseEnd::GivenUp => &mut self.tally.leases_given_up,
        };
        *counter += 1;
        Some(self.hand_over(key, now, alive))
    }

    /// The waiter a lease was handed to had gone: take it back and pass it on again.
    pub fn grant_undelivered(
        &mut self,
        key: &CacheKey,
        lease_id: &str,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Vec<Effect> {
        match self.holder(key) {
            Some(Holder::Lease { id, .. }) if id == lease_id => self.hand_over(key, now, alive),
            _ => Vec::new(),
        }
    }

    /// Gives `key`'s flight to its first live waiter that can tune and may take a lease, or
    /// to nobody (then this node's cluster lease goes, and an idle flight ends).
    pub fn hand_over(
        &mut self,
        key: &CacheKey,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Vec<Effect> {
        if !self.flights.contains_key(key) {
            return Vec::new();
        }
        self.set_holder(key, Holder::Nobody, now);
        let room: HashMap<i32, bool> = self
            .flights
            .get(key)
            .into_iter()
            .flat_map(|flight| flight.waiters.iter().filter_map(|w| w.pid))
            .map(|pid| (pid, self.has_lease_room(Some(pid))))
            .collect();
        let Some(flight) = self.flights.get_mut(key) else {
            return Vec::new();
        };
        // A waiter whose process holds the most leases keeps waiting for someone else.
        let next = flight.waiters.iter().position(|w| {
            w.can_tune && alive(w.id) && w.pid.is_none_or(|pid| room.get(&pid) == Some(&true))
        });
        let Some(index) = next else {
            flight.attachments.release_cluster_lease();
            self.remove_if_idle(key);
            return Vec::new();
        };
        let waiter = flight.waiters.remove(index);
        let grant = self.grant(key, waiter.pid, waiter.lease, waiter.view, now);
        vec![Effect::Grant(waiter.id, grant)]
    }

    /// The tuner could not produce `key`'s result: its waiters get a miss with `reason`.
    pub fn tuner_failed(&mut self, key: &CacheKey, reason: &str) -> Vec<Effect> {
        let Some(mut flight) = self.flights.remove(key) else {
            return Vec::new();
        };
        self.end_holder(&mut flight);
        flight
            .waiters
            .into_iter()
            .map(|waiter| Effect::Reply(waiter.id, Resolution::Miss(reason.to_owned())))
            .collect()
    }

    /// Before this node tunes a missing key, a caller asks the cluster who tunes it: needed
    /// when no flight exists and someone here would tune it (the caller, or the node's
    /// tuner), or when nobody holds the flight and the caller can tune. Marks the flight
    /// as claiming, so that others wait meanwhile.
    pub fn begin_claim(
        &mut self,
        key: &CacheKey,
        can_tune: bool,
        tuner_takes: bool,
        now: SystemTime,
    ) -> bool {
        let needed = match self.flights.get(key) {
            None => can_tune || tuner_takes,
            Some(flight) => can_tune && flight.holder == Holder::Nobody,
        };
        if needed {
            self.flight_of(key, now);
            self.set_holder(key, Holder::Claiming, now);
        }
        needed
    }

    /// The cluster answered the claim on `key`: the flight records who tunes it.
    pub fn claim_answered(
        &mut self,
        key: &CacheKey,
        answer: ClaimAnswer,
        now: SystemTime,
    ) -> AfterClaim {
        if self.holder(key) != Some(&Holder::Claiming) {
            return AfterClaim::Finished;
        }
        match answer {
            ClaimAnswer::HeldBy(node) => {
                self.set_holder(key, Holder::Remote { node }, now);
                AfterClaim::WatchRemote
            }
            ClaimAnswer::Acquired | ClaimAnswer::Unavailable => {
                self.set_holder(key, Holder::Nobody, now);
                AfterClaim::TuneHere
            }
        }
    }

    /// A claim ended without this node tuning (its caller went away, or the cluster had the
    /// result, which the caller's side stores first): pass the flight on if still claiming.
    pub fn claim_abandoned(
        &mut self,
        key: &CacheKey,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Vec<Effect> {
        if self.holder(key) == Some(&Holder::Claiming) {
            self.hand_over(key, now, alive)
        } else {
            Vec::new()
        }
    }

    /// The other node's cluster lease ran out (or Redis went away) while callers here
    /// waited: this node tunes it now. `false` when the flight no longer waits on that node.
    pub fn take_over(&mut self, key: &CacheKey, now: SystemTime) -> bool {
        if !matches!(self.holder(key), Some(Holder::Remote { .. })) {
            return false;
        }
        self.set_holder(key, Holder::Nobody, now);
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what the rules asked of a flight's attachments.
    #[derive(Default, Debug, PartialEq)]
    struct Asked {
        lease_watch_stops: u32,
        remote_watch_stops: u32,
        cluster_lease_kept: u32,
        cluster_lease_released: u32,
    }

    thread_local! {
        /// Every request made of any flight's attachments on this test's thread, in order:
        /// what was asked of a flight that has since ended can still be checked.
        static ASKED: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    fn asked() -> Vec<&'static str> {
        ASKED.with(|asked| asked.borrow().clone())
    }

    impl Attachments for Asked {
        fn stop_lease_watch(&mut self) {
            self.lease_watch_stops += 1;
            ASKED.with(|asked| asked.borrow_mut().push("stop lease watch"));
        }
        fn stop_remote_watch(&mut self) {
            self.remote_watch_stops += 1;
            ASKED.with(|asked| asked.borrow_mut().push("stop remote watch"));
        }
        fn keep_cluster_lease_for_result(&mut self) {
            self.cluster_lease_kept += 1;
            ASKED.with(|asked| asked.borrow_mut().push("keep cluster lease"));
        }
        fn release_cluster_lease(&mut self) {
            self.cluster_lease_released += 1;
            ASKED.with(|asked| asked.borrow_mut().push("release cluster lease"));
        }
    }

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn at(ms: u64) -> SystemTime {
        T0 + Duration::from_millis(1_700_000_000_000 + ms)
    }

    fn key(problem: &str) -> CacheKey {
        CacheKey {
            namespace: "ns".into(),
            op: "gemm".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        }
    }

    fn tuner(pid: i32) -> Caller {
        Caller {
            can_tune: true,
            pid: Some(pid),
            lease: Duration::from_secs(120),
            view: None,
        }
    }

    fn reader(pid: i32) -> Caller {
        Caller {
            can_tune: false,
            pid: Some(pid),
            lease: Duration::from_secs(120),
            view: None,
        }
    }

    fn job(name: &str) -> ViewId {
        ViewId {
            uid: 1000,
            name: name.to_owned(),
        }
    }

    fn in_view(caller: Caller, view: &str) -> Caller {
        Caller {
            view: Some(job(view)),
            ..caller
        }
    }

    #[test]
    fn a_lease_carries_the_view_of_the_resolve_it_was_granted_to() {
        let mut f = flights();
        let k = key("p");
        let Step::Lease(first) = f.resolve(&k, &in_view(tuner(1), "job-1"), true, at(0)) else {
            panic!("the first tuner gets the lease")
        };
        assert_eq!(f.lease(&first.lease_id), Some((&k, Some(&job("job-1")))));
        let Step::Wait(next) = f.resolve(&k, &in_view(tuner(2), "job-2"), true, at(1)) else {
            panic!("the second waits")
        };
        // The first holder gives up: the lease passes on with the waiter's own view.
        let effects = f
            .lease_ended(&k, &first.lease_id, LeaseEnd::GivenUp, at(2), &|_| true)
            .expect("it held the flight");
        let [Effect::Grant(to, handed)] = effects.as_slice() else {
            panic!("{effects:?}")
        };
        assert_eq!(*to, next);
        assert_eq!(f.lease(&first.lease_id), None, "an ended lease has no view");
        assert_eq!(f.lease(&handed.lease_id), Some((&k, Some(&job("job-2")))));
        // A lease granted without a view has none.
        let other = key("q");
        let Step::Lease(plain) = f.resolve(&other, &tuner(3), true, at(3)) else {
            panic!("a lease")
        };
        assert_eq!(f.lease(&plain.lease_id), Some((&other, None)));
    }

    fn result(time_us: f64) -> TunedResult {
        TunedResult {
            config: "{}".into(),
            time_us,
            tuned_by: "t".into(),
            tuned_at_unix_ms: 1,
            forget_epoch: 0,
        }
    }

    fn flights() -> Flights<Asked> {
        Flights::new("p".into(), 2)
    }

    fn everyone(_: WaiterId) -> bool {
        true
    }

    fn lease(step: Step) -> Grant {
        match step {
            Step::Lease(grant) => grant,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    fn waiter(step: Step) -> WaiterId {
        match step {
            Step::Wait(id) => id,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn the_first_caller_that_can_tune_holds_the_lease_and_the_rest_wait() {
        let mut f = flights();
        let k = key("a");
        let grant = lease(f.resolve(&k, &tuner(1), true, at(0)));
        assert_eq!(
            (grant.pid, grant.length),
            (Some(1), Duration::from_secs(120))
        );
        assert_eq!(f.lease_key(&grant.lease_id), Some(&k));
        let second = waiter(f.resolve(&k, &tuner(2), true, at(1)));
        let third = waiter(f.resolve(&k, &reader(3), true, at(2)));
        assert_ne!(second, third);
        assert_eq!(f.gauges(), (2, 1));
        assert_eq!(f.tally().leases_granted, 1);
    }

    #[test]
    fn a_stored_result_wakes_every_waiter_and_ends_the_lease() {
        let mut f = flights();
        let k = key("a");
        let grant = lease(f.resolve(&k, &tuner(1), true, at(0)));
        let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
        let effects = f.stored(&k, &result(5.0));
        assert_eq!(
            effects,
            vec![Effect::Reply(w, Resolution::Hit(result(5.0)))]
        );
        assert_eq!(f.lease_key(&grant.lease_id), None, "the lease is complete");
        assert!(f.is_new(&k));
        assert_eq!(f.gauges(), (0, 0));
        // The pid's lease is given back: it may take two again.
        let other = key("b");
        lease(f.resolve(&other, &tuner(1), true, at(2)));
        lease(f.resolve(&key("c"), &tuner(1), true, at(3)));
        // A result for a key nobody waits on changes nothing.
        assert!(f.stored(&key("zzz"), &result(1.0)).is_empty());
    }

    #[test]
    fn an_expired_lease_passes_to_the_first_waiter_that_can_tune() {
        let mut f = flights();
        let k = key("a");
        let grant = lease(f.resolve(&k, &tuner(1), true, at(0)));
        let _reader = waiter(f.resolve(&k, &reader(2), true, at(1)));
        let next = waiter(f.resolve(&k, &tuner(3), true, at(2)));
        let effects = f
            .lease_ended(&k, &grant.lease_id, LeaseEnd::Expired, at(100), &everyone)
            .expect("the lease held the flight");
        let [Effect::Grant(to, handed)] = effects.as_slice() else {
            panic!("{effects:?}")
        };
        assert_eq!((*to, handed.pid), (next, Some(3)));
        assert_ne!(handed.lease_id, grant.lease_id);
        assert_eq!(
            f.holder(&k),
            Some(&Holder::Lease {
                id: handed.lease_id.clone(),
                pid: Some(3),
                view: None,
            })
        );
        assert_eq!(f.lease_key(&grant.lease_id), None);
        assert_eq!(f.tally().leases_expired, 1);
        assert_eq!(f.gauges(), (1, 1), "the reader still waits");
        // The old lease ending again (its watch firing late) changes nothing.
        assert!(f
            .lease_ended(&k, &grant.lease_id, LeaseEnd::Expired, at(101), &everyone)
            .is_none());
        assert_eq!(f.tally().leases_expired, 1);
    }

    #[test]
    fn each_way_a_lease_ends_is_counted_and_stops_its_watch() {
        for (why, count) in [
            (LeaseEnd::Expired, (1, 0, 0)),
            (LeaseEnd::HolderDied, (0, 1, 0)),
            (LeaseEnd::GivenUp, (0, 0, 1)),
        ] {
            let mut f = flights();
            let k = key("a");
            let grant = lease(f.resolve(&k, &tuner(1), true, at(0)));
            let _w = waiter(f.resolve(&k, &reader(2), true, at(1)));
            let effects = f
                .lease_ended(&k, &grant.lease_id, why, at(2), &everyone)
                .unwrap();
            assert!(effects.is_empty(), "no waiter can tune: {effects:?}");
            let t = f.tally();
            assert_eq!(
                (t.leases_expired, t.leases_released_dead, t.leases_given_up),
                count
            );
            assert_eq!(f.holder(&k), Some(&Holder::Nobody));
            let asked = f.attachments_mut(&k).unwrap();
            assert_eq!(
                (asked.lease_watch_stops, asked.cluster_lease_released),
                (1, 1)
            );
        }
    }

    #[test]
    fn with_nobody_holding_it_the_next_caller_that_can_tune_gets_the_lease() {
        let mut f = flights();
        let k = key("a");
        let grant = lease(f.resolve(&k, &tuner(1), true, at(0)));
        let reader = waiter(f.resolve(&k, &reader(2), true, at(1)));
        f.lease_ended(&k, &grant.lease_id, LeaseEnd::HolderDied, at(2), &everyone);
        let late = lease(f.resolve(&k, &tuner(4), true, at(3)));
        assert_eq!(late.pid, Some(4));
        assert_eq!(
            f.stored(&k, &result(2.0)),
            vec![Effect::Reply(reader, Resolution::Hit(result(2.0)))]
        );
    }

    #[test]
    fn a_caller_that_will_not_wait_gets_a_miss_naming_the_holder() {
        let mut f = flights();
        let k = key("a");
        let grant = lease(f.resolve(&k, &tuner(7), true, at(0)));
        let Step::Miss(reason) = f.resolve(&k, &reader(2), false, at(1500)) else {
            panic!()
        };
        assert!(
            reason.starts_with(&format!(
                "pid 7 holds lease {} and is tuning it",
                grant.lease_id
            )),
            "{reason}"
        );
        assert!(reason.contains("(1.5 s ago)"), "{reason}");
        // Nothing in flight and nobody to tune: a miss, and no flight is left behind.
        let Step::Miss(reason) = f.resolve(&key("b"), &reader(2), false, at(2)) else {
            panic!()
        };
        assert_eq!(
            reason,
            "not cached, and the caller cannot tune it and will not wait"
        );
        assert!(f.is_new(&key("b")));
    }

    #[test]
    fn a_process_at_its_lease_limit_is_refused_and_skipped_at_hand_over() {
        let mut f = flights();
        lease(f.resolve(&key("a"), &tuner(1), true, at(0)));
        lease(f.resolve(&key("b"), &tuner(1), true, at(0)));
        assert_eq!(
            f.resolve(&key("c"), &tuner(1), true, at(1)),
            Step::TooManyLeases { pid: 1, limit: 2 }
        );
        // Pid 1 waits on d behind pid 9's lease; when that ends, pid 1 (full) is passed over.
        let held = lease(f.resolve(&key("d"), &tuner(9), true, at(2)));
        let full = waiter(f.resolve(&key("d"), &tuner(1), true, at(3)));
        let free = waiter(f.resolve(&key("d"), &tuner(5), true, at(4)));
        let effects = f
            .lease_ended(
                &key("d"),
                &held.lease_id,
                LeaseEnd::GivenUp,
                at(5),
                &everyone,
            )
            .unwrap();
        assert!(
            matches!(effects.as_slice(), [Effect::Grant(to, g)] if *to == free && g.pid == Some(5)),
            "{effects:?}"
        );
        assert_eq!(f.gauges().0, 1, "pid 1 still waits");
        let _ = full;
    }

    #[test]
    fn a_grant_to_a_waiter_that_left_passes_to_the_next() {
        let mut f = flights();
        let k = key("a");
        let held = lease(f.resolve(&k, &tuner(1), true, at(0)));
        let gone = waiter(f.resolve(&k, &tuner(2), true, at(1)));
        let next = waiter(f.resolve(&k, &tuner(3), true, at(2)));
        // The liveness check says both listen, but the first one's answer cannot be sent.
        let effects = f
            .lease_ended(&k, &held.lease_id, LeaseEnd::Expired, at(3), &everyone)
            .unwrap();
        let [Effect::Grant(to, first)] = effects.as_slice() else {
            panic!()
        };
        assert_eq!(*to, gone);
        let effects = f.grant_undelivered(&k, &first.lease_id, at(4), &everyone);
        let [Effect::Grant(to, second)] = effects.as_slice() else {
            panic!()
        };
        assert_eq!((*to, second.pid), (next, Some(3)));
        assert_eq!(f.lease_key(&first.lease_id), None);
        // A waiter known to have left is skipped without a grant at all.
        let mut f = flights();
        let held = lease(f.resolve(&k, &tuner(1), true, at(0)));
        let left = waiter(f.resolve(&k, &tuner(2), true, at(1)));
        let effects = f
            .lease_ended(&k, &held.lease_id, LeaseEnd::Expired, at(2), &|id| {
                id != left
            })
            .unwrap();
        assert!(effects.is_empty());
    }

    #[test]
    fn a_waiter_that_leaves_an_idle_flight_ends_it() {
        let mut f = flights();
        let k = key("a");
        let w = waiter(f.resolve(&k, &reader(1), true, at(0)));
        assert_eq!(f.holder(&k), Some(&Holder::Nobody));
        f.waiter_left(&k, w);
        assert!(f.is_new(&k));
        assert_eq!(
            f.miss_reason(&k, at(1)),
            "the flight ended without a result"
        );
    }

    #[test]
    fn the_tuner_holds_a_flight_until_its_result_or_its_failure() {
        let mut f = flights();
        let k = key("a");
        assert!(f.is_new(&k));
        f.tuner_started(&k, "gemm job on dev".into(), at(0));
        // Callers that can tune wait for the tuner instead of taking a lease.
        let w1 = waiter(f.resolve(&k, &tuner(1), true, at(1)));
        let w2 = waiter(f.resolve(&k, &reader(2), true, at(2)));
        assert_eq!(f.gauges(), (2, 1));
        assert!(f
            .miss_reason(&k, at(3))
            .starts_with("the node's tuner worker is tuning it (gemm job on dev)"));
        let effects = f.tuner_failed(&k, "no device");
        assert_eq!(
            effects,
            vec![
                Effect::Reply(w1, Resolution::Miss("no device".into())),
                Effect::Reply(w2, Resolution::Miss("no device".into())),
            ]
        );
        assert!(f.is_new(&k));
        f.tuner_started(&k, "again".into(), at(4));
        assert!(f.stored(&k, &result(1.0)).is_empty());
    }

    #[test]
    fn a_claim_makes_others_wait_and_another_nodes_lease_is_watched_until_taken_over() {
        let mut f = flights();
        let k = key("a");
        assert!(f.begin_claim(&k, true, false, at(0)));
        assert!(
            !f.begin_claim(&k, true, false, at(1)),
            "one claim at a time"
        );
        let reader = waiter(f.resolve(&k, &reader(2), true, at(1)));
        let tuner_waiting = waiter(f.resolve(&k, &tuner(3), true, at(2)));
        assert_eq!(
            f.claim_answered(&k, ClaimAnswer::HeldBy("node-b".into()), at(3)),
            AfterClaim::WatchRemote
        );
        assert!(f
            .miss_reason(&k, at(4))
            .starts_with("node node-b holds the cluster lease"));
        // Another node tunes: a caller that can tune waits instead of leasing.
        let _third = waiter(f.resolve(&k, &tuner(4), true, at(5)));
        assert!(f.take_over(&k, at(6)));
        assert_eq!(f.attachments_mut(&k).unwrap().remote_watch_stops, 1);
        let effects = f.hand_over(&k, at(6), &everyone);
        assert!(
            matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == tuner_waiting),
            "{effects:?}"
        );
        assert!(!f.take_over(&k, at(7)), "no longer waiting on another node");
        let effects = f.stored(&k, &result(3.0));
        assert_eq!(effects.len(), 2);
        assert!(effects.contains(&Effect::Reply(reader, Resolution::Hit(result(3.0)))));
    }

    #[test]
    fn a_claim_this_node_won_keeps_the_cluster_lease_for_the_result() {
        let mut f = flights();
        let k = key("a");
        assert!(f.begin_claim(&k, true, false, at(0)));
        assert_eq!(
            f.claim_answered(&k, ClaimAnswer::Acquired, at(1)),
            AfterClaim::TuneHere
        );
        let grant = f.lease_to(&k, &tuner(1), at(1)).unwrap();
        assert_eq!(f.lease_key(&grant.lease_id), Some(&k));
        assert_eq!(asked(), Vec::<&str>::new());
        f.stored(&k, &result(1.0));
        assert!(f.is_new(&k));
        assert_eq!(asked(), ["keep cluster lease", "stop lease watch"]);
        // Won, but nobody here tunes it after all: the cluster lease is released.
        let k = key("b");
        f.begin_claim(&k, true, false, at(2));
        f.claim_answered(&k, ClaimAnswer::Acquired, at(3));
        f.hand_over(&k, at(3), &everyone);
        assert_eq!(asked().last(), Some(&"release cluster lease"));
        assert!(f.is_new(&k), "an idle flight ends");
    }

    #[test]
    fn an_answer_after_the_result_or_an_abandoned_claim_changes_nothing_or_passes_on() {
        let mut f = flights();
        let k = key("a");
        f.begin_claim(&k, true, false, at(0));
        let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
        assert_eq!(f.stored(&k, &result(1.0)).len(), 1);
        assert_eq!(
            f.claim_answered(&k, ClaimAnswer::Acquired, at(2)),
            AfterClaim::Finished
        );
        // An abandoned claim hands the flight to a waiter that can tune.
        f.begin_claim(&k, true, false, at(3));
        let w2 = waiter(f.resolve(&k, &tuner(2), true, at(4)));
        let effects = f.claim_abandoned(&k, at(5), &everyone);
        assert!(
            matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == w2),
            "{effects:?}"
        );
        let _ = w;
        // Nobody needs a claim when the tuner and the caller cannot tune it.
        assert!(!f.begin_claim(&key("b"), false, false, at(6)));
        assert!(
            f.begin_claim(&key("c"), false, true, at(6)),
            "the node's tuner would tune it"
        );
    }
}
