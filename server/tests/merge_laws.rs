//! Property tests of the merge rule (`merge::merge` / `merge::rank_results`): it must be a
//! total order on results, so that merging is commutative, associative and idempotent, and
//! folding the same results in any order, on any node, stores the same winner and therefore
//! writes the same snapshot bytes.
//!
//! Values are drawn from small adversarial pools so that ties are the common case: equal
//! times, `-0.0` against `0.0`, subnormals, the extremes, NaN and infinities (validation
//! refuses those before they reach the store, but the rule itself must stay a total order
//! on every bit pattern), equal and nearly equal configs, empty strings, `i64::MIN/MAX`.
//!
//! Results are compared by bits (`f64::to_bits`), not with `==`: `-0.0 == 0.0` and
//! `NaN != NaN` would hide exactly the differences this file looks for. Artifacts are drawn
//! so that results equal in all but their files are common: the rule must order those too.
//!
//! The same laws hold with Forgets (`model::forget`): three replicas that make Records and
//! Forgets of their own and receive each other's in any interleaving, some compacting their
//! tombstones on the way, end with the same bytes, and those bytes are what the rule says
//! the set of results and tombstones gives.
//!
//! `PROPTEST_CASES=N` runs more cases (default 256); see docs/ci.md.

use std::cmp::Ordering;

use proptest::prelude::*;
use tunecache_server::model::artifacts::ArtifactList;
use tunecache_server::model::entry::{CacheKey, TunedResult};
use tunecache_server::model::forget::{
    drops, record_epoch, ForgetClock, ForgetScope, RankScope, Tombstone,
};
use tunecache_server::model::merge::{merge, rank_results, MergeOutcome};
use tunecache_server::model::tombstones::Tombstones;
use tunecache_server::snapshot::format::write_segment;
use tunecache_server::store::CacheMap;

/// Every field of a result, floats as bits: equal tuples mean equal bytes.
fn bits(result: &TunedResult) -> (u64, u64, String, String, i64, Vec<u8>) {
    (
        result.forget_epoch,
        result.time_us.to_bits(),
        result.config.clone(),
        result.tuned_by.clone(),
        result.tuned_at_unix_ms,
        result.artifacts.view().encoded().to_vec(),
    )
}

fn time_us() -> impl Strategy<Value = f64> {
    prop_oneof![
        // Small pool: ties on time are frequent, so the tie-breaks are exercised.
        prop::sample::select(vec![
            0.0,
            -0.0,
            f64::from_bits(1), // smallest subnormal
            f64::from_bits(2),
            f64::MIN_POSITIVE / 2.0, // subnormal
            f64::MIN_POSITIVE,
            1.0,
            1.0 + f64::EPSILON,
            0.1 + 0.2,
            0.3,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff8_0000_0000_0001), // NaN with another payload
        ]),
        any::<f64>(),
        (0.0f64..10.0),
    ]
}

fn config() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "{}",
            "{ }",
            r#"{"tile":1}"#,
            r#"{"tile":1.0}"#,
            r#"{"tile":2}"#,
            "",
            "null",
            "\u{e9}",
            "e\u{301}",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,8}",
    ]
}

fn tuned_by() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["", "node-a/rank0", "node-a/rank1", "node-b/rank0"])
            .prop_map(str::to_owned),
        "\\PC{0,6}",
    ]
}

fn tuned_at() -> impl Strategy<Value = i64> {
    prop_oneof![
        prop::sample::select(vec![i64::MIN, -1, 0, 1, 1_700_000_000_000, i64::MAX]),
        any::<i64>(),
    ]
}

fn forget_epoch() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0),
        1 => prop::sample::select(vec![1, 2, u64::MAX]),
    ]
}

/// Artifacts: none mostly, else one or two of few names and digests, so that results equal
/// in everything but their files are common.
fn artifacts() -> impl Strategy<Value = ArtifactList> {
    let artifact = (
        prop::sample::select(vec!["kernel.so", "source.cu"]),
        prop::sample::select(vec!['a', 'b']),
        0u64..3,
    )
        .prop_map(|(name, digit, size)| tunecache_proto::v1::Artifact {
            name: name.into(),
            sha256: digit.to_string().repeat(64),
            size,
        });
    prop_oneof![
        2 => Just(ArtifactList::default()),
        1 => prop::collection::vec(artifact, 1..3).prop_map(|mut list| {
            list.sort_by(|a, b| a.name.cmp(&b.name));
            list.dedup_by(|a, b| a.name == b.name);
            ArtifactList::from_wire(list)
        }),
    ]
}

fn result() -> impl Strategy<Value = TunedResult> {
    (
        time_us(),
        config(),
        tuned_by(),
        tuned_at(),
        forget_epoch(),
        artifacts(),
    )
        .prop_map(
            |(time_us, config, tuned_by, tuned_at_unix_ms, forget_epoch, artifacts)| TunedResult {
                config,
                time_us,
                tuned_by,
                tuned_at_unix_ms,
                forget_epoch,
                artifacts,
            },
        )
}

/// The result two results merge into, in either role: `current` keeps its place unless
/// `incoming` beats it.
fn merged(current: &TunedResult, incoming: &TunedResult) -> TunedResult {
    match merge(Some(current), incoming) {
        MergeOutcome::Replace => incoming.clone(),
        MergeOutcome::Keep => current.clone(),
    }
}

fn key(index: u8) -> CacheKey {
    CacheKey {
        namespace: "trtllm".into(),
        op: "gemm".into(),
        device: "NVIDIA H200|sm_90".into(),
        problem: format!("m={index}"),
        rank: index.is_multiple_of(3).then_some(u32::from(index)),
    }
}

/// Folds `(key, result)` pairs into a map through the merge rule, as every store path does.
fn fold(pairs: &[(u8, TunedResult)]) -> CacheMap {
    let mut map = CacheMap::new();
    for (index, result) in pairs {
        let key = key(*index);
        if merge(map.get(&key), result) == MergeOutcome::Replace {
            map.insert(key, result.clone());
        }
    }
    map
}

fn snapshot_bytes(map: &CacheMap) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_segment(&mut bytes, "node-a", (1, 1), 1, map, None).expect("writing to memory");
    bytes
}

/// Results for a few keys, as `(key index, result)`.
type Pairs = Vec<(u8, TunedResult)>;

/// A set of results with repeats (the same value arriving twice is normal) and a shuffled
/// copy of it.
fn pairs_and_permutation() -> impl Strategy<Value = (Pairs, Pairs)> {
    prop::collection::vec((0u8..4, result()), 0..24).prop_flat_map(|pairs| {
        let repeated: Vec<_> = pairs
            .iter()
            .cloned()
            .chain(pairs.iter().step_by(3).cloned())
            .collect();
        (Just(repeated.clone()), Just(repeated).prop_shuffle())
    })
}

proptest! {
    #[test]
    fn rank_is_a_total_order_on_bits(a in result(), b in result(), c in result()) {
        // Antisymmetric, and Equal only for identical bytes.
        prop_assert_eq!(rank_results(&a, &b), rank_results(&b, &a).reverse());
        prop_assert_eq!(rank_results(&a, &b) == Ordering::Equal, bits(&a) == bits(&b));
        // Transitive.
        if rank_results(&a, &b) != Ordering::Greater && rank_results(&b, &c) != Ordering::Greater {
            prop_assert_ne!(rank_results(&a, &c), Ordering::Greater);
        }
    }

    #[test]
    fn merge_is_commutative(a in result(), b in result()) {
        let ab = merged(&a, &b);
        let ba = merged(&b, &a);
        prop_assert_eq!(bits(&ab), bits(&ba));
        // The winner is one of the two: the one recorded after more Forgets, else never
        // slower than the other (in the total order).
        prop_assert!(bits(&ab) == bits(&a) || bits(&ab) == bits(&b));
        prop_assert_eq!(ab.forget_epoch, a.forget_epoch.max(b.forget_epoch));
        for other in [&a, &b] {
            if other.forget_epoch == ab.forget_epoch {
                prop_assert_ne!(ab.time_us.total_cmp(&other.time_us), Ordering::Greater);
            }
        }
    }

    #[test]
    fn merge_is_associative(a in result(), b in result(), c in result()) {
        let left = merged(&merged(&a, &b), &c);
        let right = merged(&a, &merged(&b, &c));
        prop_assert_eq!(bits(&left), bits(&right));
    }

    #[test]
    fn merge_is_idempotent(a in result(), b in result()) {
        // A repeated Record changes nothing and is reported as unchanged.
        prop_assert_eq!(merge(Some(&a), &a.clone()), MergeOutcome::Keep);
        prop_assert_eq!(bits(&merged(&a, &a)), bits(&a));
        // Merging the winner again changes nothing either.
        let ab = merged(&a, &b);
        prop_assert_eq!(bits(&merged(&ab, &b)), bits(&ab));
        prop_assert_eq!(bits(&merged(&ab, &a)), bits(&ab));
        // Into an empty slot, anything is stored.
        prop_assert_eq!(merge(None, &a), MergeOutcome::Replace);
    }

    #[test]
    fn any_order_of_the_same_results_gives_the_same_bytes(
        (pairs, shuffled) in pairs_and_permutation()
    ) {
        let in_order = fold(&pairs);
        let in_other_order = fold(&shuffled);
        let reversed: Vec<_> = pairs.iter().rev().cloned().collect();
        for (key, result) in in_order.iter() {
            // Each key holds the best of its results, whichever order they came in.
            let best = pairs
                .iter()
                .filter(|(index, _)| &self::key(*index) == key)
                .map(|(_, result)| result)
                .min_by(|a, b| rank_results(a, b))
                .expect("a stored key had a result");
            prop_assert_eq!(bits(result), bits(best));
            prop_assert_eq!(bits(result), bits(&in_other_order[key]));
        }
        prop_assert_eq!(in_order.len(), in_other_order.len());
        let bytes = snapshot_bytes(&in_order);
        prop_assert_eq!(&bytes, &snapshot_bytes(&in_other_order));
        prop_assert_eq!(&bytes, &snapshot_bytes(&fold(&reversed)));
    }
}

/// One replica as the store keeps it: the cache, its tombstones, its clock.
#[derive(Default)]
struct Replica {
    map: CacheMap,
    tombstones: Tombstones,
    clock: ForgetClock,
    /// Messages it has had, by index: each path delivers a message to a replica once (a
    /// cursor in a stream or in the segments), so a tombstone it compacted away is not
    /// handed to it again.
    received: std::collections::HashSet<usize>,
}

/// What travels between replicas: a stored result, or a tombstone.
#[derive(Clone, Debug)]
enum Message {
    Result(CacheKey, TunedResult),
    Tombstone(Tombstone),
}

impl Replica {
    /// A result from elsewhere, as every learned path applies it.
    fn learn(&mut self, key: &CacheKey, result: &TunedResult) {
        if self.tombstones.drops(&key.view(), &result.view()) {
            return;
        }
        self.clock.observe(result.forget_epoch);
        if merge(self.map.get(key), result) == MergeOutcome::Replace {
            self.map.insert(key.clone(), result.clone());
        }
    }

    /// A Record asked of this replica: the daemon sets the epoch.
    fn record(&mut self, key: &CacheKey, mut result: TunedResult) -> Message {
        let held = self.map.get(key).map_or(0, |r| r.forget_epoch);
        result.forget_epoch = record_epoch(self.tombstones.floor(&key.view()), held);
        self.learn(key, &result);
        Message::Result(key.clone(), result)
    }

    fn apply_tombstone(&mut self, tombstone: &Tombstone) {
        self.clock.observe(tombstone.stamp);
        if self.tombstones.insert(tombstone.clone()) {
            let doomed: Vec<CacheKey> = self
                .map
                .iter()
                .filter(|(key, result)| drops(tombstone, &key.view(), &result.view()))
                .map(|(key, _)| key.clone())
                .collect();
            for key in doomed {
                self.map.remove(&key);
            }
        }
    }

    /// A Forget asked of this replica, stamped from its clock at `now_ms` (any value: the
    /// clock never goes back).
    fn forget(&mut self, scope: ForgetScope, now_ms: i64) -> Message {
        let tombstone = Tombstone {
            scope,
            stamp: self.clock.tick(now_ms),
        };
        self.apply_tombstone(&tombstone);
        Message::Tombstone(tombstone)
    }

    fn receive(&mut self, message: &Message) {
        match message {
            Message::Result(key, result) => self.learn(key, result),
            Message::Tombstone(tombstone) => self.apply_tombstone(tombstone),
        }
    }

    /// What a journal compaction does to the tombstones (nothing expires here).
    fn compact(&mut self) {
        let map = &self.map;
        self.tombstones
            .compact(|key| map.get(key).map(|r| r.forget_epoch), i64::MIN);
    }
}

/// The scopes a Forget may name: a namespace, an op, one problem's every rank, one key.
fn scope() -> impl Strategy<Value = ForgetScope> {
    (0u8..5, 0u8..4).prop_map(|(kind, index)| {
        let key = key(index);
        match kind {
            0 => ForgetScope {
                op: String::new(),
                device: String::new(),
                problem: String::new(),
                rank: RankScope::Every,
                ..ForgetScope::exact(&key)
            },
            1 => ForgetScope {
                problem: String::new(),
                rank: RankScope::Every,
                ..ForgetScope::exact(&key)
            },
            2 => ForgetScope {
                rank: RankScope::Every,
                ..ForgetScope::exact(&key)
            },
            _ => ForgetScope::exact(&key),
        }
    })
}

#[derive(Clone, Debug)]
enum Step {
    Record {
        at: usize,
        key: u8,
        result: TunedResult,
    },
    Forget {
        at: usize,
        scope: ForgetScope,
        now_ms: i64,
    },
    /// Delivers message `message` (modulo those made so far) to replica `to`.
    Deliver {
        message: usize,
        to: usize,
    },
    Compact {
        at: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..3, 0u8..4, result().prop_map(|r| TunedResult { forget_epoch: 0, ..r }))
            .prop_map(|(at, key, result)| Step::Record { at, key, result }),
        1 => (0usize..3, scope(), 0i64..50).prop_map(|(at, scope, now_ms)| Step::Forget { at, scope, now_ms }),
        4 => (any::<usize>(), 0usize..3).prop_map(|(message, to)| Step::Deliver { message, to }),
        1 => (0usize..3).prop_map(|at| Step::Compact { at }),
    ]
}

/// What the rule says a set of results and tombstones gives: per key, the best result that
/// no tombstone drops.
fn expected(messages: &[Message]) -> CacheMap {
    let tombstones: Vec<&Tombstone> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Tombstone(t) => Some(t),
            Message::Result(..) => None,
        })
        .collect();
    let mut map = CacheMap::new();
    for message in messages {
        let Message::Result(key, result) = message else {
            continue;
        };
        if tombstones
            .iter()
            .any(|t| drops(t, &key.view(), &result.view()))
        {
            continue;
        }
        if merge(map.get(key), result) == MergeOutcome::Replace {
            map.insert(key.clone(), result.clone());
        }
    }
    map
}

proptest! {
    #[test]
    fn replicas_converge_under_any_interleaving_of_records_and_forgets(
        steps in prop::collection::vec(step(), 1..60),
        final_order in prop::collection::vec(any::<u64>(), 0..1),
    ) {
        let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::default()).collect();
        let mut messages: Vec<Message> = Vec::new();
        for step in steps {
            match step {
                Step::Record { at, key, result } => {
                    replicas[at].received.insert(messages.len());
                    messages.push(replicas[at].record(&self::key(key), result));
                }
                Step::Forget { at, scope, now_ms } => {
                    replicas[at].received.insert(messages.len());
                    messages.push(replicas[at].forget(scope, now_ms));
                }
                Step::Deliver { message, to } if !messages.is_empty() => {
                    let index = message % messages.len();
                    if replicas[to].received.insert(index) {
                        let message = messages[index].clone();
                        replicas[to].receive(&message);
                    }
                }
                Step::Deliver { .. } => {}
                Step::Compact { at } => replicas[at].compact(),
            }
        }
        // Then everything reaches everyone it has not reached, each replica in its own order.
        let seed = final_order.first().copied().unwrap_or(7);
        for (index, replica) in replicas.iter_mut().enumerate() {
            let mut order: Vec<usize> = (0..messages.len()).collect();
            let mut state = seed.wrapping_add(index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for i in (1..order.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                order.swap(i, (state % (i as u64 + 1)) as usize);
            }
            for i in order {
                if replica.received.insert(i) {
                    replica.receive(&messages[i]);
                }
            }
        }
        let want = snapshot_bytes(&expected(&messages));
        for replica in &replicas {
            prop_assert_eq!(&snapshot_bytes(&replica.map), &want);
        }
    }
}
