//! A Resolve's order, as the rules drive it: a stored result first (looked up once without
//! the coordinator's lock, and again under it, so that a result stored after the look wakes
//! the call); then, with the cluster tier on and someone here to tune the key, a claim in
//! the cluster; then the node's tuner for a new key it measures; then a lease, a wait or a
//! miss. The adapter asks [`Resolve::first`] and [`Flights::advance`] for the [`Next`] step,
//! does it, and tells what it found as a [`Fact`].
//!
//! Also here, because a claim's answer and a take-over decide the same thing: who tunes a
//! key this node is to tune ([`who_tunes`]: the tuner, then the caller, then a waiter), and
//! which keys the node's tuner measures ([`tuner_takes`]).

use std::time::SystemTime;

use tunecache_proto::v1;

use super::{Attachments, Caller, Effect, Flights, Grant, Holder, WaiterId};
use crate::model::entry::{CacheKey, TunedResult};

/// Whether the node's tuner measures `key`: its namespace, and a device fingerprint the
/// worker reported (`devices`). Keys of other devices follow the lease path.
pub fn tuner_takes(key: &CacheKey, devices: &[v1::Device]) -> bool {
    key.namespace == tunecache_proto::tuner::problem::NAMESPACE
        && devices
            .iter()
            .any(|device| device.fingerprint == key.device)
}

/// Who tunes a key that this node is to tune.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tunes {
    /// The node's tuner worker.
    Tuner,
    /// The rank that asks.
    Caller,
    /// A rank that waits and can tune, when there is one: the flight is handed over.
    Waiter,
}

/// The one order of who tunes: the node's tuner when it measures the key (`tuner`: its
/// measurement costs no rank any time), then the caller when it can tune (`caller`), then
/// a waiter that can.
pub fn who_tunes(tuner: bool, caller: bool) -> Tunes {
    if tuner {
        Tunes::Tuner
    } else if caller {
        Tunes::Caller
    } else {
        Tunes::Waiter
    }
}

/// What the adapter found when it looked (under the coordinator's lock).
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// The store's result for the key.
    pub stored: Option<TunedResult>,
    /// Whether the node's tuner measures the key ([`tuner_takes`]).
    pub tuner_takes: bool,
}

/// What the cluster said to a claim.
#[derive(Debug)]
pub enum ClaimAnswer<L> {
    /// This node holds the cluster lease now.
    Acquired(L),
    /// Another node holds it.
    HeldBy(String),
    /// The cluster had the result; the adapter gave it to the store and then looked: the
    /// look says whether the store took it.
    Found,
    /// No answer (Redis slow or away): coordinate on this node.
    Unavailable,
}

/// What follows a cluster answer.
#[derive(Debug, PartialEq)]
pub(super) enum AfterClaim {
    /// The flight ended while the claim was out (its result arrived): nothing to do.
    Finished,
    /// Another node tunes it: watch its lease; the waiters wait for its result.
    WatchRemote,
    /// This node tunes it: see [`who_tunes`].
    TuneHere,
}

/// What the node's tuner said when offered a key's job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Offer {
    /// It took the job; its end comes as [`Flights::tuner_ended`].
    Accepted,
    /// It does not measure the key after all (turned off, or the device went away).
    Declined,
    /// Its queue of `capacity` jobs is full.
    QueueFull { capacity: usize },
}

/// What the adapter tells the rules after doing a [`Next`] step.
#[derive(Debug)]
pub enum Fact<L> {
    /// After [`Next::LookInStore`] (and [`Next::WatchRemote`]).
    Seen(Seen),
    /// After [`Next::AskCluster`]: the answer, then a look in the store under the lock.
    Claimed(ClaimAnswer<L>, Seen),
    /// After [`Next::OfferTuner`].
    Offered(Offer),
}

/// The next step of a Resolve.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Look in the store under the coordinator's lock (a result stored after the look wakes
    /// this call) and ask the tuner which keys it measures; go on with [`Fact::Seen`].
    LookInStore,
    /// Ask the cluster who tunes the key, without the lock; go on with [`Fact::Claimed`].
    /// A call that goes away meanwhile reports [`Flights::claim_abandoned`].
    AskCluster,
    /// Offer the key's job to the node's tuner; go on with [`Fact::Offered`].
    OfferTuner,
    /// Another node tunes the key: watch its cluster lease ([`Flights::take_over`] when it
    /// runs out), then go on as after [`Next::LookInStore`].
    WatchRemote,
    /// Answer the stored result.
    Hit(TunedResult),
    /// The caller tunes it: start the lease's watch and answer [`Grant::answer`].
    Lease(Grant),
    /// The caller waits, as this waiter, for an [`Effect`] or [`Flights::wait_ended`].
    Wait(WaiterId),
    /// Answer no result, for this reason.
    Miss(String),
    /// Refuse: the caller's process holds `limit` leases already.
    TooManyLeases { pid: i32, limit: usize },
    /// Refuse: the node's tuner should take the job and its queue of `capacity` is full.
    TunerQueueFull { capacity: usize },
}

/// A step, and the effects to carry out first.
#[derive(Debug, PartialEq)]
pub struct Advance {
    pub effects: Vec<Effect>,
    pub next: Next,
}

impl From<Next> for Advance {
    fn from(next: Next) -> Self {
        Advance {
            effects: Vec::new(),
            next,
        }
    }
}

/// Where a Resolve is: what the step it is waiting for was.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// Nothing looked at yet.
    Start,
    /// The store had nothing, and the cluster tier is on: look again, then maybe claim.
    BeforeClaim,
    /// The claim is out.
    Claiming,
    /// Coordinating on this node: look again, then the tuner, a lease, a wait or a miss.
    Here,
    /// The tuner was offered the job, for a new key or (`after_claim`) a claimed one.
    Offered { after_claim: bool },
    /// Answered.
    Done,
}

/// One Resolve call, as the rules follow it.
#[derive(Debug)]
pub struct Resolve {
    key: CacheKey,
    caller: Caller,
    will_wait: bool,
    /// Whether the cluster tier is on.
    cluster: bool,
    stage: Stage,
}

impl Resolve {
    pub fn new(key: CacheKey, caller: Caller, will_wait: bool, cluster: bool) -> Self {
        Resolve {
            key,
            caller,
            will_wait,
            cluster,
            stage: Stage::Start,
        }
    }

    pub fn key(&self) -> &CacheKey {
        &self.key
    }

    /// The first step, needing no lock: a stored result answers (most Resolves end here);
    /// else the rules take over, from a look under the lock.
    pub fn first(&mut self, stored: Option<TunedResult>) -> Next {
        if let Some(result) = stored {
            self.stage = Stage::Done;
            return Next::Hit(result);
        }
        self.stage = if self.cluster {
            Stage::BeforeClaim
        } else {
            Stage::Here
        };
        Next::LookInStore
    }
}

impl<A: Attachments> Flights<A> {
    /// The step after `fact`, which the last step asked for.
    pub fn advance(
        &mut self,
        resolve: &mut Resolve,
        fact: Fact<A::ClusterLease>,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Advance {
        match (std::mem::replace(&mut resolve.stage, Stage::Done), fact) {
            (Stage::Start, Fact::Seen(seen)) => resolve.first(seen.stored).into(),
            (Stage::BeforeClaim, Fact::Seen(seen)) => {
                if seen.stored.is_none()
                    && self.begin_claim(&resolve.key, &resolve.caller, seen.tuner_takes, now)
                {
                    resolve.stage = Stage::Claiming;
                    return Next::AskCluster.into();
                }
                self.here(resolve, seen, now).into()
            }
            (Stage::Here, Fact::Seen(seen)) => self.here(resolve, seen, now).into(),
            (Stage::Claiming, Fact::Claimed(answer, seen)) => {
                self.claimed(resolve, answer, seen, now, alive)
            }
            (Stage::Offered { after_claim }, Fact::Offered(offer)) => {
                self.offered(resolve, after_claim, offer, now, alive)
            }
            (stage, _) => {
                // Not the fact this step asked for (the adapter's mistake): starting over
                // from a look in the store is always safe.
                debug_assert!(false, "a Resolve at {stage:?} was told something else");
                resolve.stage = Stage::Here;
                Next::LookInStore.into()
            }
        }
    }

    /// On this node, with `seen` looked up under the lock: the stored result, else the
    /// tuner for a new key it measures, else what [`Flights::resolve_here`] says.
    fn here(&mut self, resolve: &mut Resolve, seen: Seen, now: SystemTime) -> Next {
        if let Some(result) = seen.stored {
            return Next::Hit(result);
        }
        let next = self.resolve_here(
            &resolve.key,
            &resolve.caller,
            resolve.will_wait,
            seen.tuner_takes,
            now,
        );
        if next == Next::OfferTuner {
            resolve.stage = Stage::Offered { after_claim: false };
        }
        next
    }

    /// A Resolve for `key` that the store could not answer, on this node: the node's
    /// tuner for a new key it measures (`tuner_takes`); else a lease for a caller that can
    /// tune when nobody produces the result; else a wait, or a miss when the caller will
    /// not wait.
    pub(super) fn resolve_here(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        will_wait: bool,
        tuner_takes: bool,
        now: SystemTime,
    ) -> Next {
        let tuner = tuner_takes && self.is_new(key);
        match who_tunes(tuner, caller.can_tune && self.is_free(key)) {
            Tunes::Tuner => Next::OfferTuner,
            Tunes::Caller => self.lease_or_refuse(key, caller, now),
            Tunes::Waiter => self.wait_or_miss(key, caller, will_wait, now),
        }
    }

    fn lease_or_refuse(&mut self, key: &CacheKey, caller: &Caller, now: SystemTime) -> Next {
        match self.lease_to(key, caller, now) {
            Ok(grant) => Next::Lease(grant),
            Err((pid, limit)) => Next::TooManyLeases { pid, limit },
        }
    }

    /// Before this node tunes a missing key, a caller asks the cluster who tunes it: needed
    /// when no flight exists and someone here would tune it (the caller, or the node's
    /// tuner), or when nobody holds the flight and the caller can tune. A caller that can
    /// tune but whose process holds the most leases it may asks nobody (it is refused on
    /// this node). Marks the flight as claiming, so that others wait meanwhile.
    pub(super) fn begin_claim(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        tuner_takes: bool,
        now: SystemTime,
    ) -> bool {
        if caller.can_tune && !self.has_lease_room(caller.pid) {
            return false;
        }
        let needed = match self.flights.get(key) {
            None => caller.can_tune || tuner_takes,
            Some(flight) => caller.can_tune && flight.holder == Holder::Nobody,
        };
        if needed {
            self.flight_of(key, now);
            self.set_holder(key, Holder::Claiming, now);
        }
        needed
    }

    /// The cluster answered a Resolve's claim, and the store was looked at after it.
    fn claimed(
        &mut self,
        resolve: &mut Resolve,
        answer: ClaimAnswer<A::ClusterLease>,
        seen: Seen,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Advance {
        let answer = match answer {
            ClaimAnswer::Found => match seen.stored {
                Some(result) => {
                    let effects = self.stored(&resolve.key, &result);
                    return Advance {
                        effects,
                        next: Next::Hit(result),
                    };
                }
                // The store did not take it (a result forgotten here and not yet deleted
                // from Redis, or a failed write): not a hit; this node coordinates.
                None => ClaimAnswer::Unavailable,
            },
            other => other,
        };
        match self.claim_answered(&resolve.key, answer, now) {
            AfterClaim::Finished => self.here(resolve, seen, now).into(),
            AfterClaim::WatchRemote => {
                resolve.stage = Stage::Here;
                Next::WatchRemote.into()
            }
            AfterClaim::TuneHere => self.tune_claimed(resolve, seen.tuner_takes, now, alive),
        }
    }

    /// The cluster answered the claim on `key`: the flight records who tunes it, and holds
    /// this node's cluster lease when it took one. An answer to a claim that ended drops
    /// it (a lease just taken is released).
    pub(super) fn claim_answered(
        &mut self,
        key: &CacheKey,
        answer: ClaimAnswer<A::ClusterLease>,
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
            ClaimAnswer::Acquired(lease) => {
                self.set_holder(key, Holder::Nobody, now);
                if let Some(attachments) = self.attachments_mut(key) {
                    attachments.hold_cluster_lease(lease);
                }
                AfterClaim::TuneHere
            }
            ClaimAnswer::Found | ClaimAnswer::Unavailable => {
                self.set_holder(key, Holder::Nobody, now);
                AfterClaim::TuneHere
            }
        }
    }

    /// This node tunes a key it claimed: in [`who_tunes`]'s order. `tuner_takes` is false
    /// once the tuner declined.
    fn tune_claimed(
        &mut self,
        resolve: &mut Resolve,
        tuner_takes: bool,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Advance {
        let key = &resolve.key;
        match who_tunes(tuner_takes, resolve.caller.can_tune) {
            Tunes::Tuner => {
                resolve.stage = Stage::Offered { after_claim: true };
                Next::OfferTuner.into()
            }
            Tunes::Caller => match self.lease_or_refuse(key, &resolve.caller, now) {
                refused @ Next::TooManyLeases { .. } => Advance {
                    effects: self.hand_over(key, now, alive),
                    next: refused,
                },
                next => next.into(),
            },
            Tunes::Waiter => {
                let effects = self.hand_over(key, now, alive);
                resolve.stage = Stage::Here;
                Advance {
                    effects,
                    next: Next::LookInStore,
                }
            }
        }
    }

    /// The tuner answered the offer of a Resolve's key.
    fn offered(
        &mut self,
        resolve: &mut Resolve,
        after_claim: bool,
        offer: Offer,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Advance {
        let key = &resolve.key;
        match offer {
            Offer::Accepted => {
                self.tuner_started(key, now);
                if after_claim {
                    resolve.stage = Stage::Here;
                    return Next::LookInStore.into();
                }
                // The tuner holds it now: the caller waits for it, or misses.
                self.resolve_here(key, &resolve.caller, resolve.will_wait, false, now)
                    .into()
            }
            Offer::Declined if after_claim => self.tune_claimed(resolve, false, now, alive),
            Offer::Declined => self
                .resolve_here(key, &resolve.caller, resolve.will_wait, false, now)
                .into(),
            Offer::QueueFull { capacity } => Advance {
                // A claimed flight passes on; a new key has no flight yet.
                effects: self.hand_over(key, now, alive),
                next: Next::TunerQueueFull { capacity },
            },
        }
    }

    /// A claim ended without this node tuning (its caller went away mid-claim): with a
    /// stored result (`stored`, looked up under the lock) the waiters get it; else the
    /// flight passes on if still claiming.
    pub fn claim_abandoned(
        &mut self,
        key: &CacheKey,
        stored: Option<&TunedResult>,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Vec<Effect> {
        if let Some(result) = stored {
            return self.stored(key, result);
        }
        if self.holder(key) == Some(&Holder::Claiming) {
            self.hand_over(key, now, alive)
        } else {
            Vec::new()
        }
    }

    /// The other node's cluster lease ran out (or Redis went away) while callers here
    /// waited: this node tunes it now, holding `lease` when it took the cluster lease, in
    /// [`who_tunes`]'s order (no caller asks: the tuner, else a waiter).
    pub fn take_over(
        &mut self,
        key: &CacheKey,
        lease: Option<A::ClusterLease>,
        tuner_takes: bool,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> TakeOver {
        if !matches!(self.holder(key), Some(Holder::Remote { .. })) {
            // Nobody waits on that node any more; a lease taken is released as it drops.
            return TakeOver::NotWaiting;
        }
        self.set_holder(key, Holder::Nobody, now);
        if let (Some(lease), Some(attachments)) = (lease, self.attachments_mut(key)) {
            attachments.hold_cluster_lease(lease);
        }
        match who_tunes(tuner_takes, false) {
            Tunes::Tuner => TakeOver::OfferTuner,
            Tunes::Caller | Tunes::Waiter => TakeOver::Done(self.hand_over(key, now, alive)),
        }
    }

    /// The watch on another node's lease found the key's result in the cluster and gave it
    /// to the store, which holds `stored` now. The waiters get it; a result the store did
    /// not take is no result (as after a claim): this node takes the key over.
    pub fn remote_found(
        &mut self,
        key: &CacheKey,
        stored: Option<&TunedResult>,
        tuner_takes: bool,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> TakeOver {
        match stored {
            Some(result) => TakeOver::Done(self.stored(key, result)),
            None => self.take_over(key, None, tuner_takes, now, alive),
        }
    }

    /// The tuner answered the offer of a key taken over ([`TakeOver::OfferTuner`]).
    pub fn take_over_offered(
        &mut self,
        key: &CacheKey,
        offer: Offer,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Vec<Effect> {
        match offer {
            Offer::Accepted => {
                self.tuner_started(key, now);
                Vec::new()
            }
            // Not the tuner, and no caller asks: a waiter that can tune.
            Offer::Declined | Offer::QueueFull { .. } => self.hand_over(key, now, alive),
        }
    }
}

/// What follows a take-over.
#[derive(Debug, PartialEq)]
pub enum TakeOver {
    /// The flight no longer waits on that node: nothing to do.
    NotWaiting,
    /// Offer the key's job to the node's tuner; go on with [`Flights::take_over_offered`].
    OfferTuner,
    /// Carry out the effects: the flight got its result, or went to a waiter that can tune,
    /// or to nobody.
    Done(Vec<Effect>),
}
