//! The coordination rules' unit tests: each event on given times, no runtime.

mod resolve;

use super::resolve::AfterClaim;
use super::*;
use crate::model::testing::{key_in, result};

/// Keys of op `gemm`, which the tests' tuner measures.
fn key(problem: &str) -> CacheKey {
    key_in("gemm", problem, None)
}

/// The Resolve rule on this node for a key the tuner does not measure, as most of these
/// tests ask it (the store has nothing).
impl Flights<Asked> {
    fn resolve(
        &mut self,
        key: &CacheKey,
        caller: &Caller,
        will_wait: bool,
        now: SystemTime,
    ) -> Next {
        self.resolve_here(key, caller, will_wait, false, now)
    }
}

/// Records what the rules asked of a flight's attachments.
#[derive(Default, Debug, PartialEq)]
struct Asked {
    lease_watch_stops: u32,
    remote_watch_stops: u32,
    cluster_lease_kept: u32,
    cluster_lease_released: u32,
    cluster_lease_held: u32,
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
    type ClusterLease = ();
    fn hold_cluster_lease(&mut self, (): ()) {
        self.cluster_lease_held += 1;
        ASKED.with(|asked| asked.borrow_mut().push("hold cluster lease"));
    }
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
    let Next::Lease(first) = f.resolve(&k, &in_view(tuner(1), "job-1"), true, at(0)) else {
        panic!("the first tuner gets the lease")
    };
    assert_eq!(f.lease(&first.lease_id), Some((&k, Some(&job("job-1")))));
    let Next::Wait(next) = f.resolve(&k, &in_view(tuner(2), "job-2"), true, at(1)) else {
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
    let Next::Lease(plain) = f.resolve(&other, &tuner(3), true, at(3)) else {
        panic!("a lease")
    };
    assert_eq!(f.lease(&plain.lease_id), Some((&other, None)));
}

fn flights() -> Flights<Asked> {
    Flights::new("p".into(), 2)
}

fn everyone(_: WaiterId) -> bool {
    true
}

fn lease(step: Next) -> Grant {
    match step {
        Next::Lease(grant) => grant,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn waiter(step: Next) -> WaiterId {
    match step {
        Next::Wait(id) => id,
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
    let Next::Miss(reason) = f.resolve(&k, &reader(2), false, at(1500)) else {
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
    let Next::Miss(reason) = f.resolve(&key("b"), &reader(2), false, at(2)) else {
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
        Next::TooManyLeases { pid: 1, limit: 2 }
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
    f.tuner_started(&k, at(0));
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
    f.tuner_started(&k, at(4));
    assert!(f.stored(&k, &result(1.0)).is_empty());
}

#[test]
fn a_claim_makes_others_wait_and_another_nodes_lease_is_watched_until_taken_over() {
    let mut f = flights();
    let k = key("a");
    assert!(f.begin_claim(&k, &tuner(1), false, at(0)));
    assert!(
        !f.begin_claim(&k, &tuner(1), false, at(1)),
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
    let TakeOver::Done(effects) = f.take_over(&k, None, false, at(6), &everyone) else {
        panic!("taken over, and the tuner does not measure it")
    };
    assert_eq!(f.attachments_mut(&k).unwrap().remote_watch_stops, 1);
    assert!(
        matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == tuner_waiting),
        "{effects:?}"
    );
    assert_eq!(
        f.take_over(&k, None, false, at(7), &everyone),
        TakeOver::NotWaiting,
        "no longer waiting on another node"
    );
    let effects = f.stored(&k, &result(3.0));
    assert_eq!(effects.len(), 2);
    assert!(effects.contains(&Effect::Reply(reader, Resolution::Hit(result(3.0)))));
}

#[test]
fn a_claim_this_node_won_keeps_the_cluster_lease_for_the_result() {
    let mut f = flights();
    let k = key("a");
    assert!(f.begin_claim(&k, &tuner(1), false, at(0)));
    assert_eq!(
        f.claim_answered(&k, ClaimAnswer::Acquired(()), at(1)),
        AfterClaim::TuneHere
    );
    let grant = f.lease_to(&k, &tuner(1), at(1)).unwrap();
    assert_eq!(f.lease_key(&grant.lease_id), Some(&k));
    assert_eq!(asked(), ["hold cluster lease"]);
    f.stored(&k, &result(1.0));
    assert!(f.is_new(&k));
    assert_eq!(
        asked(),
        [
            "hold cluster lease",
            "keep cluster lease",
            "stop lease watch"
        ]
    );
    // Won, but nobody here tunes it after all: the cluster lease is released.
    let k = key("b");
    f.begin_claim(&k, &tuner(1), false, at(2));
    f.claim_answered(&k, ClaimAnswer::Acquired(()), at(3));
    f.hand_over(&k, at(3), &everyone);
    assert_eq!(asked().last(), Some(&"release cluster lease"));
    assert!(f.is_new(&k), "an idle flight ends");
}

#[test]
fn an_answer_after_the_result_or_an_abandoned_claim_changes_nothing_or_passes_on() {
    let mut f = flights();
    let k = key("a");
    f.begin_claim(&k, &tuner(1), false, at(0));
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    assert_eq!(f.stored(&k, &result(1.0)).len(), 1);
    assert_eq!(
        f.claim_answered(&k, ClaimAnswer::Acquired(()), at(2)),
        AfterClaim::Finished
    );
    // An abandoned claim hands the flight to a waiter that can tune.
    f.begin_claim(&k, &tuner(1), false, at(3));
    let w2 = waiter(f.resolve(&k, &tuner(2), true, at(4)));
    let effects = f.claim_abandoned(&k, None, at(5), &everyone);
    assert!(
        matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == w2),
        "{effects:?}"
    );
    let _ = w;
    // Nobody needs a claim when the tuner and the caller cannot tune it.
    assert!(!f.begin_claim(&key("b"), &reader(1), false, at(6)));
    assert!(
        f.begin_claim(&key("c"), &reader(1), true, at(6)),
        "the node's tuner would tune it"
    );
}
