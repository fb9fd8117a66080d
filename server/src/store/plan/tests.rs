//! The planning rules, checked without a journal, a thread or a runtime.

use std::sync::Arc;

use super::*;
use crate::model::forget::{ForgetScope, RankScope};
use crate::model::testing::key;
use crate::store::feed::RecordLease;

/// A day on which nothing expires: these tests are about the merge rule.
fn today() -> Today {
    Today {
        day: 20_000,
        retention: Retention::keep_all(),
    }
}

fn result(time_us: f64, epoch: u64) -> TunedResult {
    TunedResult {
        config: format!("{{\"t\":{time_us}}}"),
        time_us,
        tuned_by: "t".into(),
        tuned_at_unix_ms: 1,
        forget_epoch: epoch,
        artifacts: Default::default(),
    }
}

fn stored(problem: &str, time_us: f64, epoch: u64) -> StoredEntry {
    StoredEntry::new(&key(problem), &result(time_us, epoch))
}

fn write(source: Source, origin: Origin, entries: &[(&str, f64, u64)]) -> Write {
    Write {
        entries: entries
            .iter()
            .map(|(p, t, e)| Incoming::Decoded(key(p), result(*t, *e), 0))
            .collect(),
        origin,
        source,
    }
}

fn record(entries: &[(&str, f64, u64)]) -> Write {
    write(Source::Record { lease: None }, Origin::Own, entries)
}

fn learned(entries: &[(&str, f64, u64)]) -> Write {
    write(Source::Cluster, Origin::Learned, entries)
}

fn time_of(map: &EntryMap, problem: &str) -> Option<f64> {
    map.get(&key(problem))
        .map(|e| e.result().to_result().time_us)
}

fn epoch_of(map: &EntryMap, problem: &str) -> Option<u64> {
    map.get(&key(problem)).map(|e| e.result().forget_epoch)
}

fn exact(problem: &str, stamp: u64) -> Tombstone {
    Tombstone {
        scope: ForgetScope::exact(&key(problem)),
        stamp,
    }
}

fn held(tombstones: &[Tombstone]) -> Tombstones {
    let mut held = Tombstones::default();
    for t in tombstones {
        held.insert(t.clone());
    }
    held
}

fn summary(plan: &GroupPlan) -> Vec<(String, Origin, bool, bool)> {
    plan.changes
        .iter()
        .zip(&plan.records)
        .map(|(change, (entry, origin))| {
            assert!(change.entry.same_entry(entry));
            (
                change.entry.key().to_key().problem,
                *origin,
                change.in_cache,
                change.own,
            )
        })
        .collect()
}

#[test]
fn the_faster_result_wins_and_each_caller_is_answered_its_own_counts() {
    let map: EntryMap = [stored("a", 5.0, 0)].into_iter().collect();
    let own = map.clone();
    let plan = plan_group(
        &map,
        &own,
        &Tombstones::default(),
        &today(),
        vec![
            // Beats a; b is new.
            record(&[("a", 4.0, 0), ("b", 9.0, 0)]),
            // Meets what the first write stored: slower than both.
            record(&[("a", 4.5, 0), ("b", 9.5, 0)]),
            // The same result again is no change.
            record(&[("a", 4.0, 0), ("c", 1.0, 0)]),
        ],
    );
    assert_eq!(
        plan.outcomes,
        vec![
            ApplyOutcome {
                stored: 2,
                unchanged: 0
            },
            ApplyOutcome {
                stored: 0,
                unchanged: 2
            },
            ApplyOutcome {
                stored: 1,
                unchanged: 1
            },
        ]
    );
    assert_eq!(time_of(&plan.map, "a"), Some(4.0));
    assert_eq!(time_of(&plan.map, "b"), Some(9.0));
    assert_eq!(
        time_of(&map, "a"),
        Some(5.0),
        "the current version is untouched"
    );
    assert_eq!(
        summary(&plan),
        vec![
            ("a".into(), Origin::Own, true, true),
            ("b".into(), Origin::Own, true, true),
            ("c".into(), Origin::Own, true, true),
        ]
    );
    let own_next = plan.own.as_ref().expect("own contributions changed");
    assert_eq!(time_of(own_next, "a"), Some(4.0));
}

#[test]
fn nothing_better_changes_nothing_and_journals_nothing() {
    let map: EntryMap = [stored("a", 1.0, 0)].into_iter().collect();
    let plan = plan_group(
        &map,
        &map,
        &Tombstones::default(),
        &today(),
        vec![record(&[("a", 2.0, 0)]), learned(&[("a", 3.0, 0)])],
    );
    assert!(plan.records.is_empty() && plan.changes.is_empty());
    assert!(plan.own.is_none());
    assert!(plan.map.ptr_eq(&map));
    assert_eq!(plan.outcomes[0].unchanged + plan.outcomes[1].unchanged, 2);
    assert_eq!((plan.live_bytes_added, plan.live_bytes_removed), (0, 0));
    assert!(plan.bytes_in > 0, "what came in is counted, changed or not");
}

#[test]
fn own_results_are_kept_as_contributions_and_learned_ones_only_enter_the_cache() {
    // The cache holds a learned 1.0; this node's own best is 5.0.
    let map: EntryMap = [stored("a", 1.0, 0)].into_iter().collect();
    let own: EntryMap = [stored("a", 5.0, 0)].into_iter().collect();
    let plan = plan_group(
        &map,
        &own,
        &Tombstones::default(),
        &today(),
        vec![
            // Better than the own 5.0, not than the cache's 1.0: own only.
            record(&[("a", 4.0, 0)]),
            // Learned and better than everything: the cache only, journalled as learned.
            learned(&[("a", 0.5, 0), ("b", 2.0, 0)]),
        ],
    );
    assert_eq!(
        summary(&plan),
        vec![
            ("a".into(), Origin::Own, false, true),
            ("a".into(), Origin::Learned, true, false),
            ("b".into(), Origin::Learned, true, false),
        ]
    );
    assert_eq!(
        plan.outcomes[0],
        ApplyOutcome {
            stored: 0,
            unchanged: 1
        },
        "not the cache's winner: unchanged for the caller"
    );
    let own_next = plan.own.as_ref().unwrap();
    assert_eq!(time_of(own_next, "a"), Some(4.0));
    assert_eq!(time_of(own_next, "b"), None, "learned entries are not own");
    assert_eq!(time_of(&plan.map, "a"), Some(0.5));
}

#[test]
fn tombstones_drop_what_they_remove_on_every_path_in_but_records_live_after_them() {
    let stamp = 100;
    let tombstones = held(&[exact("a", stamp)]);
    let map = EntryMap::new();
    let stored_write = |source, origin| Write {
        entries: vec![
            Incoming::Stored(stored("a", 1.0, stamp - 1)),
            Incoming::Stored(stored("b", 1.0, 0)),
        ],
        origin,
        source,
    };
    for write in [
        learned(&[("a", 1.0, stamp - 1), ("b", 1.0, 0)]),
        stored_write(Source::Snapshot, Origin::Learned),
        // This node's own results read back from its segments: dropped too.
        stored_write(Source::Snapshot, Origin::Own),
    ] {
        let plan = plan_group(&map, &map, &tombstones, &today(), vec![write]);
        assert_eq!(time_of(&plan.map, "a"), None);
        assert_eq!(time_of(&plan.map, "b"), Some(1.0), "not covered");
        assert_eq!(
            plan.outcomes,
            vec![ApplyOutcome {
                stored: 1,
                unchanged: 1
            }]
        );
        assert!(plan.records.iter().all(|(e, _)| e.key().problem == "b"));
    }
    // At the tombstone's stamp a learned result was recorded after the Forget: it lives.
    let plan = plan_group(
        &map,
        &map,
        &tombstones,
        &today(),
        vec![learned(&[("a", 9.0, stamp)])],
    );
    assert_eq!(time_of(&plan.map, "a"), Some(9.0));
    // A Record or the tuner lives whatever epoch the client sent.
    for source in [Source::Record { lease: None }, Source::Tuner] {
        let plan = plan_group(
            &map,
            &map,
            &tombstones,
            &today(),
            vec![write(source, Origin::Own, &[("a", 50.0, 0)])],
        );
        assert_eq!(epoch_of(&plan.map, "a"), Some(stamp));
    }
}

#[test]
fn records_get_the_epoch_of_the_forgets_known_or_of_their_winner() {
    let tombstones = held(&[exact("a", 100)]);
    // b's winner (learned) carries a higher epoch than any tombstone here knows.
    let map: EntryMap = [stored("b", 1.0, 300)].into_iter().collect();
    // c's own contribution carries epoch 200; the cache's c (learned, faster) has 0.
    let own: EntryMap = [stored("c", 9.0, 200)].into_iter().collect();
    let map = {
        let mut map = map;
        map.insert(stored("c", 0.1, 0));
        map
    };
    let plan = plan_group(
        &map,
        &own,
        &tombstones,
        &today(),
        vec![record(&[
            ("a", 5.0, 7),
            ("b", 0.5, u64::MAX),
            ("c", 0.05, 0),
            ("d", 5.0, 9),
        ])],
    );
    assert_eq!(
        epoch_of(&plan.map, "a"),
        Some(100),
        "the floor of the Forgets"
    );
    assert_eq!(
        epoch_of(&plan.map, "b"),
        Some(300),
        "level with the winner, not the client's"
    );
    assert_eq!(
        epoch_of(&plan.map, "c"),
        Some(200),
        "level with the own one too"
    );
    assert_eq!(epoch_of(&plan.map, "d"), Some(0), "no Forget, no winner");
    assert_eq!(plan.highest_epoch, 300);
    // Learned results keep the epoch they came with, and the clock hears of it.
    let plan = plan_group(
        &map,
        &own,
        &tombstones,
        &today(),
        vec![learned(&[("e", 1.0, 777)])],
    );
    assert_eq!(epoch_of(&plan.map, "e"), Some(777));
    assert_eq!(plan.highest_epoch, 777);
}

#[test]
fn the_feed_hears_each_change_with_its_source() {
    let lease = Arc::new(RecordLease {
        id: "lease-1".into(),
        key: Some(key("a")),
        view: None,
    });
    let map = EntryMap::new();
    let plan = plan_group(
        &map,
        &map,
        &Tombstones::default(),
        &today(),
        vec![
            write(
                Source::Record {
                    lease: Some(lease.clone()),
                },
                Origin::Own,
                &[("a", 1.0, 0)],
            ),
            write(Source::Tuner, Origin::Own, &[("b", 1.0, 0)]),
        ],
    );
    let sources: Vec<Source> = plan.changes.iter().map(|c| c.source.clone()).collect();
    assert_eq!(
        sources,
        vec![Source::Record { lease: Some(lease) }, Source::Tuner]
    );
}

#[test]
fn live_bytes_follow_what_the_cache_holds() {
    let map: EntryMap = [stored("a", 5.0, 0)].into_iter().collect();
    let plan = plan_group(
        &map,
        &map,
        &Tombstones::default(),
        &today(),
        vec![record(&[("a", 4.0, 0), ("b", 1.0, 0)])],
    );
    let size = |e: StoredEntry| e.encoded_len_estimate() as u64;
    let a_new = stored("a", 4.0, 0);
    assert_eq!(
        plan.live_bytes_added,
        size(a_new) + size(stored("b", 1.0, 0))
    );
    assert_eq!(plan.live_bytes_removed, size(stored("a", 5.0, 0)));
}

fn state<'a>(
    map: &'a EntryMap,
    own: &'a EntryMap,
    tombstones: &'a Tombstones,
    own_tombstones: &'a Tombstones,
) -> ForgetState<'a> {
    ForgetState {
        map,
        own,
        tombstones,
        own_tombstones,
    }
}

fn ask(problem: &str, only_if: Option<(&str, f64)>) -> ForgetCommand {
    ForgetCommand::Ask(ForgetAsk {
        scope: ForgetScope::exact(&key(problem)),
        only_if: only_if.map(|(config, time)| (config.to_owned(), time)),
    })
}

#[test]
fn only_if_forgets_only_the_winner_it_names() {
    let map: EntryMap = [stored("a", 5.0, 0)].into_iter().collect();
    let none = Tombstones::default();
    let config = result(5.0, 0).config;
    let mut clock = ForgetClock::default();
    for refused in [
        ask("a", Some((&config, 4.0))),
        ask("a", Some(("{}", 5.0))),
        ask("missing", Some((&config, 5.0))),
    ] {
        let plan = plan_forget(state(&map, &map, &none, &none), &mut clock, 1_000, refused);
        assert!(plan.is_none());
    }
    assert_eq!(
        clock.last(),
        0,
        "no stamp spent on a Forget that does nothing"
    );
    let plan = plan_forget(
        state(&map, &map, &none, &none),
        &mut clock,
        1_000,
        ask("a", Some((&config, 5.0))),
    )
    .expect("the winner it names");
    assert_eq!(plan.dropped, 1);
    assert!(plan.map.is_empty() && plan.own.is_empty());
    assert_eq!(map.len(), 1, "the current version is untouched");
    let stamp = clock.last();
    assert_eq!(stamp, 1_000 << 16);
    assert_eq!(plan.records, vec![(exact("a", stamp), Origin::Own)]);
    assert_eq!(plan.tombstones.len(), 1);
    assert_eq!(plan.own_tombstones.len(), 1);
    assert_eq!(
        plan.told,
        vec![ForgetChange {
            tombstone: exact("a", stamp),
            source: Source::Forget,
            dropped: 1
        }]
    );
    assert_eq!(
        plan.freed_bytes,
        stored("a", 5.0, 0).encoded_len_estimate() as u64
    );
}

#[test]
fn a_forget_asked_here_is_stamped_after_everything_the_node_has_seen() {
    let map = EntryMap::new();
    let none = Tombstones::default();
    let mut clock = ForgetClock::default();
    clock.observe(5_000 << 16);
    // Asked again of a key it already forgot: journalled and told again all the same.
    let held_one = held(&[exact("a", 1)]);
    let plan = plan_forget(
        state(&map, &map, &held_one, &none),
        &mut clock,
        1_000,
        ask("a", None),
    )
    .unwrap();
    assert!(plan.records[0].0.stamp > 5_000 << 16);
    assert_eq!(plan.dropped, 0);
}

#[test]
fn learned_tombstones_drop_what_they_cover_and_only_what_is_new_is_journalled() {
    let map: EntryMap = [stored("a", 1.0, 10), stored("b", 1.0, 10)]
        .into_iter()
        .collect();
    let own = map.clone();
    let known = held(&[exact("b", 50)]);
    let none = Tombstones::default();
    let mut clock = ForgetClock::default();
    let learned = |tombstones: Vec<Tombstone>, origin| {
        ForgetCommand::Learned(tombstones, Source::Cluster, origin)
    };
    // b's tombstone is already held, with a newer stamp: nothing new.
    let plan = plan_forget(
        state(&map, &own, &known, &none),
        &mut clock,
        0,
        learned(vec![exact("b", 40)], Origin::Learned),
    );
    assert!(plan.is_none());
    assert_eq!(clock.last(), 40, "the clock still hears of it");
    let plan = plan_forget(
        state(&map, &own, &known, &none),
        &mut clock,
        0,
        learned(vec![exact("a", 20), exact("b", 40)], Origin::Learned),
    )
    .unwrap();
    assert_eq!(plan.records, vec![(exact("a", 20), Origin::Learned)]);
    assert_eq!(plan.dropped, 1);
    assert_eq!(time_of(&plan.map, "a"), None);
    assert_eq!(time_of(&plan.own, "a"), None);
    assert!(plan.own_tombstones.is_empty(), "learned is not own");
    // This node's own tombstone read back from its segment: held as its own again.
    let plan = plan_forget(
        state(&map, &own, &known, &none),
        &mut clock,
        0,
        learned(vec![exact("b", 50)], Origin::Own),
    )
    .unwrap();
    assert_eq!(plan.records, vec![(exact("b", 50), Origin::Own)]);
    assert_eq!(plan.own_tombstones.len(), 1);
    // A wide tombstone drops every covered entry at once.
    let wide = Tombstone {
        scope: ForgetScope {
            namespace: "ns".into(),
            op: "op".into(),
            device: String::new(),
            problem: String::new(),
            rank: RankScope::Every,
        },
        stamp: 30,
    };
    let plan = plan_forget(
        state(&map, &own, &none, &none),
        &mut clock,
        0,
        learned(vec![wide], Origin::Learned),
    )
    .unwrap();
    assert_eq!(plan.dropped, 2);
    assert!(plan.map.is_empty());
}

#[test]
fn forgets_queued_together_apply_in_order_each_answered_its_own() {
    let map: EntryMap = [stored("a", 5.0, 0), stored("b", 6.0, 0)]
        .into_iter()
        .collect();
    let none = Tombstones::default();
    let config = result(5.0, 0).config;
    let mut clock = ForgetClock::default();
    let every_problem = ForgetCommand::Ask(ForgetAsk {
        scope: ForgetScope {
            namespace: key("a").namespace,
            op: key("a").op,
            device: String::new(),
            problem: String::new(),
            rank: RankScope::Every,
        },
        only_if: None,
    });
    let plan = plan_forgets(
        state(&map, &map, &none, &none),
        &mut clock,
        1_000,
        [
            ask("a", Some((&config, 5.0))),
            // After the first: "a" is gone, so this one names no winner and does nothing.
            ask("a", Some((&config, 5.0))),
            every_problem,
        ],
    );
    assert_eq!(plan.answers, vec![1, 0, 1]);
    assert_eq!(plan.dropped, 2);
    assert!(plan.map.is_empty());
    assert_eq!(
        plan.records.len(),
        2,
        "one tombstone per Forget that applied"
    );
    assert_eq!(
        plan.tombstones.len(),
        1,
        "the scope covers the exact one before it"
    );
}
