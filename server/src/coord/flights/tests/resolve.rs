//! Unit tests of the rules that were the adapter's: a Resolve's order driven step by step
//! with given facts, who tunes a key this node is to tune (after a claim, at a take-over),
//! which keys the tuner measures, the give-up after a Record, a wait's end and a tuner
//! job's end.

use tunecache_proto::v1;

use crate::coord::flights::resolve::{who_tunes, Tunes};

use super::*;

fn seen(stored: Option<TunedResult>, tuner_takes: bool) -> Seen {
    Seen {
        stored,
        tuner_takes,
    }
}

fn looked(stored: Option<TunedResult>, tuner_takes: bool) -> Fact<()> {
    Fact::Seen(seen(stored, tuner_takes))
}

/// A Resolve of `k` past its lock-free first look (the store had nothing).
fn started(k: &CacheKey, caller: Caller, will_wait: bool, cluster: bool) -> Resolve {
    let mut r = Resolve::new(k.clone(), caller, will_wait, cluster);
    assert_eq!(r.first(None), Next::LookInStore);
    r
}

fn go(f: &mut Flights<Asked>, r: &mut Resolve, fact: Fact<()>, ms: u64) -> Advance {
    f.advance(r, fact, at(ms), &everyone)
}

/// A Resolve with the cluster on, up to its claim being out.
fn claiming(f: &mut Flights<Asked>, k: &CacheKey, caller: Caller, tuner_takes: bool) -> Resolve {
    let mut r = started(k, caller, true, true);
    assert_eq!(
        go(f, &mut r, looked(None, tuner_takes), 0).next,
        Next::AskCluster
    );
    r
}

fn tuner_key(device: &str) -> CacheKey {
    CacheKey {
        namespace: tunecache_proto::tuner::problem::NAMESPACE.into(),
        device: device.into(),
        ..key("p")
    }
}

fn device(fingerprint: &str) -> v1::Device {
    v1::Device {
        fingerprint: fingerprint.into(),
        ..Default::default()
    }
}

#[test]
fn the_tuner_takes_keys_of_its_namespace_on_a_device_it_reported() {
    let devices = [device("sm90-a"), device("sm80-b")];
    assert!(tuner_takes(&tuner_key("sm80-b"), &devices));
    assert!(
        !tuner_takes(&tuner_key("sm70-c"), &devices),
        "another device"
    );
    assert!(
        !tuner_takes(&tuner_key("sm90-a"), &[]),
        "no device reported"
    );
    let other_namespace = CacheKey {
        device: "sm90-a".into(),
        ..key("p")
    };
    assert!(
        !tuner_takes(&other_namespace, &devices),
        "a rank's namespace"
    );
}

#[test]
fn the_tuner_comes_first_then_the_caller_then_a_waiter() {
    assert_eq!(who_tunes(true, true), Tunes::Tuner);
    assert_eq!(who_tunes(true, false), Tunes::Tuner);
    assert_eq!(who_tunes(false, true), Tunes::Caller);
    assert_eq!(who_tunes(false, false), Tunes::Waiter);
}

#[test]
fn a_stored_result_answers_first_then_again_under_the_lock() {
    let mut f = flights();
    let k = key("a");
    let mut r = Resolve::new(k.clone(), tuner(1), true, true);
    assert_eq!(r.first(Some(result(1.0))), Next::Hit(result(1.0)));
    // Missed without the lock, found under it: a hit, and neither a claim nor a flight.
    for cluster in [false, true] {
        let mut r = started(&k, tuner(1), true, cluster);
        let step = go(&mut f, &mut r, looked(Some(result(2.0)), true), 0);
        assert_eq!(step, Next::Hit(result(2.0)).into());
        assert!(f.is_new(&k));
    }
}

#[test]
fn with_the_cluster_on_a_key_someone_here_would_tune_is_claimed_first() {
    let mut f = flights();
    let k = key("a");
    claiming(&mut f, &k, tuner(1), false);
    assert_eq!(f.holder(&k), Some(&Holder::Claiming));
    // Others wait for the claim, even one that can tune.
    let mut other = started(&k, tuner(2), true, true);
    assert!(matches!(
        go(&mut f, &mut other, looked(None, false), 1).next,
        Next::Wait(_)
    ));
    // Nobody here to tune it (a reader, a key the tuner does not measure): no claim.
    let mut r = started(&key("b"), reader(3), true, true);
    assert!(matches!(
        go(&mut f, &mut r, looked(None, false), 2).next,
        Next::Wait(_)
    ));
    // The node's tuner would: the reader claims it.
    claiming(&mut f, &key("c"), reader(3), true);
    // The cluster off: the same caller never claims.
    let mut r = started(&key("d"), tuner(1), true, false);
    assert!(matches!(
        go(&mut f, &mut r, looked(None, false), 3).next,
        Next::Lease(_)
    ));
}

#[test]
fn a_caller_at_its_lease_cap_asks_the_cluster_nothing_and_is_refused_here() {
    let mut f = flights();
    lease(f.resolve(&key("a"), &tuner(1), true, at(0)));
    lease(f.resolve(&key("b"), &tuner(1), true, at(0)));
    let mut r = started(&key("c"), tuner(1), true, true);
    assert_eq!(
        go(&mut f, &mut r, looked(None, false), 1).next,
        Next::TooManyLeases { pid: 1, limit: 2 }
    );
    assert!(f.is_new(&key("c")), "no claim was begun");
}

#[test]
fn a_new_key_the_tuner_measures_is_offered_to_it_before_any_lease() {
    let mut f = flights();
    let k = key("a");
    let mut r = started(&k, tuner(1), true, false);
    assert_eq!(
        go(&mut f, &mut r, looked(None, true), 0).next,
        Next::OfferTuner
    );
    let Next::Wait(_) = go(&mut f, &mut r, Fact::Offered(Offer::Accepted), 1).next else {
        panic!("the caller waits for the tuner")
    };
    assert_eq!(
        f.holder(&k),
        Some(&Holder::Tuner {
            what: "gemm job on dev".into()
        })
    );
    // A caller that will not wait gets a miss naming the tuner.
    let mut r = started(&k, tuner(2), false, false);
    let Next::Miss(reason) = go(&mut f, &mut r, looked(None, true), 2).next else {
        panic!("a miss")
    };
    assert!(
        reason.starts_with("the node's tuner worker is tuning it"),
        "{reason}"
    );
    // Only a new key: a flight nobody holds goes to a caller that can tune.
    let other = key("b");
    let w = waiter(f.resolve(&other, &reader(3), true, at(3)));
    let mut r = started(&other, tuner(4), true, false);
    assert!(matches!(
        go(&mut f, &mut r, looked(None, true), 4).next,
        Next::Lease(Grant { pid: Some(4), .. })
    ));
    let _ = w;
}

#[test]
fn an_offer_declined_falls_to_a_lease_and_a_full_tuner_queue_refuses() {
    let mut f = flights();
    let k = key("a");
    let mut r = started(&k, tuner(1), true, false);
    go(&mut f, &mut r, looked(None, true), 0);
    let step = go(&mut f, &mut r, Fact::Offered(Offer::Declined), 1);
    let Next::Lease(grant) = step.next else {
        panic!("{step:?}")
    };
    assert_eq!(
        grant.answer(),
        Resolution::TuneHere {
            lease_id: grant.lease_id.clone(),
            expires_in: Duration::from_secs(120),
        }
    );
    let other = key("b");
    let mut r = started(&other, reader(2), true, false);
    go(&mut f, &mut r, looked(None, true), 2);
    assert_eq!(
        go(
            &mut f,
            &mut r,
            Fact::Offered(Offer::QueueFull { capacity: 4 }),
            3
        ),
        Next::TunerQueueFull { capacity: 4 }.into()
    );
    assert!(f.is_new(&other), "a refused Resolve leaves no flight");
}

#[test]
fn a_claim_this_node_won_goes_to_the_tuner_first_and_the_flight_holds_the_lease() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, tuner(1), true);
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    let won = Fact::Claimed(ClaimAnswer::Acquired(()), seen(None, true));
    assert_eq!(go(&mut f, &mut r, won, 2).next, Next::OfferTuner);
    assert_eq!(asked(), ["hold cluster lease"]);
    // Accepted: the tuner holds it, and the caller looks again and then waits too.
    assert_eq!(
        go(&mut f, &mut r, Fact::Offered(Offer::Accepted), 3).next,
        Next::LookInStore
    );
    assert!(matches!(f.holder(&k), Some(Holder::Tuner { .. })));
    assert!(matches!(
        go(&mut f, &mut r, looked(None, true), 4).next,
        Next::Wait(_)
    ));
    assert_eq!(f.gauges(), (2, 1));
    let _ = w;
}

#[test]
fn a_claim_this_node_won_without_the_tuner_goes_to_the_caller() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, tuner(1), false);
    let won = Fact::Claimed(ClaimAnswer::Acquired(()), seen(None, false));
    let step = go(&mut f, &mut r, won, 1);
    assert!(step.effects.is_empty());
    assert!(
        matches!(step.next, Next::Lease(Grant { pid: Some(1), .. })),
        "{step:?}"
    );
    // The tuner declines a claimed key's job: the caller tunes it, not a waiter.
    let other = key("b");
    let mut r = claiming(&mut f, &other, tuner(3), true);
    let won = Fact::Claimed(ClaimAnswer::Unavailable, seen(None, true));
    assert_eq!(go(&mut f, &mut r, won, 2).next, Next::OfferTuner);
    let step = go(&mut f, &mut r, Fact::Offered(Offer::Declined), 3);
    assert!(
        matches!(step.next, Next::Lease(Grant { pid: Some(3), .. })),
        "{step:?}"
    );
}

#[test]
fn a_claim_won_by_a_caller_that_cannot_tune_is_handed_over_or_released() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, reader(1), true);
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    let won = Fact::Claimed(ClaimAnswer::Acquired(()), seen(None, false));
    let step = go(&mut f, &mut r, won, 2);
    assert!(
        matches!(step.effects.as_slice(), [Effect::Grant(to, _)] if *to == w),
        "{step:?}"
    );
    assert_eq!(step.next, Next::LookInStore);
    assert!(matches!(
        go(&mut f, &mut r, looked(None, false), 3).next,
        Next::Wait(_)
    ));
    // Nobody to hand it to: the cluster lease it holds is released, not kept.
    let other = key("b");
    let mut r = claiming(&mut f, &other, reader(3), true);
    let before = asked().len();
    let won = Fact::Claimed(ClaimAnswer::Acquired(()), seen(None, true));
    go(&mut f, &mut r, won, 4);
    let step = go(&mut f, &mut r, Fact::Offered(Offer::Declined), 5);
    assert_eq!(step, Next::LookInStore.into());
    assert_eq!(
        asked()[before..],
        ["hold cluster lease", "release cluster lease"]
    );
    assert!(f.is_new(&other));
}

#[test]
fn a_refusal_after_a_claim_passes_the_flight_on() {
    let mut f = flights();
    let k = key("a");
    // Pid 1 fills its lease cap while its claim is out.
    let mut r = claiming(&mut f, &k, tuner(1), false);
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    lease(f.resolve(&key("x"), &tuner(1), true, at(1)));
    lease(f.resolve(&key("y"), &tuner(1), true, at(1)));
    let won = Fact::Claimed(ClaimAnswer::Acquired(()), seen(None, false));
    let step = go(&mut f, &mut r, won, 2);
    assert_eq!(step.next, Next::TooManyLeases { pid: 1, limit: 2 });
    assert!(
        matches!(step.effects.as_slice(), [Effect::Grant(to, _)] if *to == w),
        "{step:?}"
    );
    // The tuner's queue is full for a claimed key: refused, and passed on.
    let other = key("b");
    let mut r = claiming(&mut f, &other, tuner(3), true);
    let w = waiter(f.resolve(&other, &tuner(4), true, at(3)));
    let won = Fact::Claimed(ClaimAnswer::Unavailable, seen(None, true));
    go(&mut f, &mut r, won, 4);
    let step = go(
        &mut f,
        &mut r,
        Fact::Offered(Offer::QueueFull { capacity: 8 }),
        5,
    );
    assert_eq!(step.next, Next::TunerQueueFull { capacity: 8 });
    assert!(
        matches!(step.effects.as_slice(), [Effect::Grant(to, _)] if *to == w),
        "{step:?}"
    );
}

#[test]
fn a_result_the_cluster_had_answers_only_when_the_store_took_it() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, tuner(1), false);
    let w = waiter(f.resolve(&k, &reader(2), true, at(1)));
    let found = Fact::Claimed(ClaimAnswer::Found, seen(Some(result(4.0)), false));
    assert_eq!(
        go(&mut f, &mut r, found, 2),
        Advance {
            effects: vec![Effect::Reply(w, Resolution::Hit(result(4.0)))],
            next: Next::Hit(result(4.0)),
        }
    );
    assert!(f.is_new(&k));
    // The store refused it (forgotten here): this node tunes it, as with no answer.
    let mut r = claiming(&mut f, &k, tuner(1), false);
    let found = Fact::Claimed(ClaimAnswer::Found, seen(None, false));
    assert!(matches!(go(&mut f, &mut r, found, 3).next, Next::Lease(_)));
}

#[test]
fn an_answer_to_a_claim_that_ended_goes_by_the_store() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, tuner(1), false);
    f.stored(&k, &result(1.0));
    let before = asked().len();
    let late = Fact::Claimed(ClaimAnswer::Acquired(()), seen(Some(result(1.0)), false));
    assert_eq!(go(&mut f, &mut r, late, 1).next, Next::Hit(result(1.0)));
    assert_eq!(asked().len(), before, "the lease just taken is not held");
    // Ended without a result in the store (forgotten meanwhile): decided here again.
    let mut r = claiming(&mut f, &k, tuner(1), false);
    f.stored(&k, &result(1.0));
    let late = Fact::Claimed(ClaimAnswer::Unavailable, seen(None, false));
    assert!(matches!(go(&mut f, &mut r, late, 2).next, Next::Lease(_)));
}

#[test]
fn another_nodes_lease_is_watched_and_the_caller_waits() {
    let mut f = flights();
    let k = key("a");
    let mut r = claiming(&mut f, &k, tuner(1), false);
    let held = Fact::Claimed(ClaimAnswer::HeldBy("node-b".into()), seen(None, false));
    assert_eq!(go(&mut f, &mut r, held, 1).next, Next::WatchRemote);
    assert!(matches!(
        go(&mut f, &mut r, looked(None, false), 2).next,
        Next::Wait(_)
    ));
    assert_eq!(
        f.holder(&k),
        Some(&Holder::Remote {
            node: "node-b".into()
        })
    );
}

#[test]
fn a_take_over_goes_to_the_tuner_or_else_a_waiter_and_holds_the_lease() {
    let mut f = flights();
    let k = key("a");
    let watching = |f: &mut Flights<Asked>, k: &CacheKey| {
        f.begin_claim(k, &tuner(1), false, at(0));
        f.claim_answered(k, ClaimAnswer::HeldBy("node-b".into()), at(0));
        waiter(f.resolve(k, &tuner(2), true, at(1)))
    };
    watching(&mut f, &k);
    assert_eq!(
        f.take_over(&k, Some(()), true, at(2), &everyone),
        TakeOver::OfferTuner
    );
    assert_eq!(asked().last(), Some(&"hold cluster lease"));
    assert!(f
        .take_over_offered(&k, Offer::Accepted, at(3), &everyone)
        .is_empty());
    assert!(matches!(f.holder(&k), Some(Holder::Tuner { .. })));
    // The tuner declines, or its queue is full: the waiter that can tune gets the lease.
    for offer in [Offer::Declined, Offer::QueueFull { capacity: 1 }] {
        let other = key("b");
        let w = watching(&mut f, &other);
        f.take_over(&other, None, true, at(4), &everyone);
        let effects = f.take_over_offered(&other, offer, at(5), &everyone);
        assert!(
            matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == w),
            "{effects:?}"
        );
        f.stored(&other, &result(1.0));
    }
}

#[test]
fn a_remote_result_the_store_took_wakes_the_waiters_and_one_it_refused_is_taken_over() {
    let mut f = flights();
    let k = key("a");
    f.begin_claim(&k, &tuner(1), false, at(0));
    f.claim_answered(&k, ClaimAnswer::HeldBy("node-b".into()), at(0));
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    assert_eq!(
        f.remote_found(&k, Some(&result(2.0)), false, at(2), &everyone),
        TakeOver::Done(vec![Effect::Reply(w, Resolution::Hit(result(2.0)))])
    );
    f.begin_claim(&k, &tuner(1), false, at(3));
    f.claim_answered(&k, ClaimAnswer::HeldBy("node-b".into()), at(3));
    let w = waiter(f.resolve(&k, &tuner(2), true, at(4)));
    let TakeOver::Done(effects) = f.remote_found(&k, None, false, at(5), &everyone) else {
        panic!("taken over")
    };
    assert!(
        matches!(effects.as_slice(), [Effect::Grant(to, _)] if *to == w),
        "{effects:?}"
    );
}

#[test]
fn an_abandoned_claim_answers_the_waiters_from_the_store() {
    let mut f = flights();
    let k = key("a");
    f.begin_claim(&k, &tuner(1), false, at(0));
    let w = waiter(f.resolve(&k, &reader(2), true, at(1)));
    assert_eq!(
        f.claim_abandoned(&k, Some(&result(3.0)), at(2), &everyone),
        vec![Effect::Reply(w, Resolution::Hit(result(3.0)))]
    );
    assert!(f.is_new(&k));
}

#[test]
fn a_record_that_left_its_lease_held_gives_it_up_and_one_that_completed_it_does_not() {
    let mut f = flights();
    let k = key("a");
    let held = lease(f.resolve(&k, &tuner(1), true, at(0)));
    let w = waiter(f.resolve(&k, &tuner(2), true, at(1)));
    let Some((given_up, effects)) = f.recorded(&held.lease_id, at(2), &everyone) else {
        panic!("still held after its Record: given up")
    };
    assert_eq!(given_up, k);
    let [Effect::Grant(to, next)] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert_eq!(*to, w);
    assert_eq!(f.tally().leases_given_up, 1);
    // The change feed completed this one before the Record was answered.
    f.stored(&k, &result(1.0));
    assert_eq!(f.recorded(&next.lease_id, at(3), &everyone), None);
    assert_eq!(f.recorded("unknown", at(3), &everyone), None);
    assert_eq!(f.tally().leases_given_up, 1);
}

#[test]
fn a_wait_that_times_out_says_who_was_producing_the_result() {
    let mut f = flights();
    let k = key("a");
    let held = lease(f.resolve(&k, &tuner(7), true, at(0)));
    let w = waiter(f.resolve(&k, &reader(2), true, at(1)));
    let timed_out = WaitEnd::TimedOut {
        waited: Duration::from_millis(250),
    };
    let Resolution::Miss(reason) = f.wait_ended(&k, w, timed_out, at(251)) else {
        panic!("a miss")
    };
    let expected = format!(
        "no result within 250 ms: pid 7 holds lease {}",
        held.lease_id
    );
    assert!(reason.starts_with(&expected), "{reason}");
    assert_eq!(f.gauges(), (0, 1));
    // The reason is taken while the waiter still waits: its leaving ends this flight.
    let other = key("b");
    let w = waiter(f.resolve(&other, &reader(2), true, at(2)));
    let Resolution::Miss(reason) = f.wait_ended(&other, w, timed_out, at(3)) else {
        panic!("a miss")
    };
    assert!(
        reason.starts_with("no result within 250 ms: no caller that can tune it has asked"),
        "{reason}"
    );
    assert!(f.is_new(&other));
    let w = waiter(f.resolve(&other, &reader(2), true, at(4)));
    assert_eq!(
        f.wait_ended(&other, w, WaitEnd::Stopping, at(5)),
        Resolution::Miss("the daemon is shutting down".into())
    );
    assert!(f.is_new(&other));
}

#[test]
fn a_tuner_job_ends_with_the_stored_result_or_a_miss_naming_why() {
    let ended = |end: TunerEnd| {
        let mut f = flights();
        let k = key("a");
        f.tuner_started(&k, at(0));
        let w = waiter(f.resolve(&k, &reader(2), true, at(1)));
        let (effects, failure) = f.tuner_ended(&k, end);
        assert!(f.is_new(&k), "the flight ends");
        let [Effect::Reply(to, answer)] = effects.as_slice() else {
            panic!("{effects:?}")
        };
        assert_eq!(*to, w);
        (answer.clone(), failure)
    };
    assert_eq!(
        ended(TunerEnd::Stored(Some(result(2.0)))),
        (Resolution::Hit(result(2.0)), None)
    );
    for (end, reason) in [
        (TunerEnd::Stored(None), "the tuned result was not stored"),
        (
            TunerEnd::StoreFailed("disk".into()),
            "storing the tuned result failed: disk",
        ),
        (
            TunerEnd::Failed("no kernel".into()),
            "the node's tuner could not tune it: no kernel",
        ),
        (
            TunerEnd::Stopped,
            "the node's tuner stopped before finishing",
        ),
    ] {
        assert_eq!(
            ended(end),
            (Resolution::Miss(reason.into()), Some(reason.into()))
        );
    }
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "was told something else")]
fn a_fact_the_step_did_not_ask_for_is_the_adapters_mistake() {
    let mut f = flights();
    let mut r = started(&key("a"), tuner(1), true, false);
    go(&mut f, &mut r, Fact::Offered(Offer::Accepted), 0);
}
