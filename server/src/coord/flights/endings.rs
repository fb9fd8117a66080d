//! What ends a flight's holder, and what comes after: a stored result (every waiter gets
//! it), a lease that expires, is given up, whose holder dies or whose grant was not
//! delivered, a Record that did not complete its lease, a tuner job that ends; the flight is
//! handed over to its next waiter that may tune (`hand_over`), or its waiters get a miss.

use std::collections::HashMap;
use std::time::SystemTime;

use super::{Attachments, Effect, Flights, Holder, LeaseEnd, TunerEnd, WaiterId};
use crate::coord::Resolution;
use crate::model::entry::{CacheKey, TunedResult};

impl<A: Attachments> Flights<A> {
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

    /// A Record that named `lease_id` has been stored (the change feed, which runs before,
    /// completed the lease if the Record gave its key a result). A lease still held means
    /// it did not (it held other keys, or none): the lease is given up and passes on.
    /// `Some` with the lease's key when it was given up.
    pub fn recorded(
        &mut self,
        lease_id: &str,
        now: SystemTime,
        alive: &dyn Fn(WaiterId) -> bool,
    ) -> Option<(CacheKey, Vec<Effect>)> {
        // Not held: completed by the change feed, expired, or unknown.
        let key = self.lease_key(lease_id)?.clone();
        let effects = self.lease_ended(&key, lease_id, LeaseEnd::GivenUp, now, alive)?;
        Some((key, effects))
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
    pub(super) fn hand_over(
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

    /// The node's tuner job for `key` ended. With a stored result every waiter gets it;
    /// else they get a miss naming the failure, which comes back second for the log.
    pub fn tuner_ended(&mut self, key: &CacheKey, end: TunerEnd) -> (Vec<Effect>, Option<String>) {
        let failure = match end {
            TunerEnd::Stored(Some(result)) => return (self.stored(key, &result), None),
            TunerEnd::Stored(None) => "the tuned result was not stored".to_owned(),
            TunerEnd::StoreFailed(error) => format!("storing the tuned result failed: {error}"),
            TunerEnd::Failed(reason) => format!("the node's tuner could not tune it: {reason}"),
            TunerEnd::Stopped => "the node's tuner stopped before finishing".to_owned(),
        };
        (self.tuner_failed(key, &failure), Some(failure))
    }

    /// The tuner could not produce `key`'s result: its waiters get a miss with `reason`.
    pub(super) fn tuner_failed(&mut self, key: &CacheKey, reason: &str) -> Vec<Effect> {
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
}
