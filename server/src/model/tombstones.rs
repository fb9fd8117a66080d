//! The tombstones a replica holds (`Tombstones`), reduced and indexed so that what a Record
//! or a Forget asks of them costs O(log n) plus what it matches, however many are held.
//!
//! Reduced: none is covered by another (a wider scope with a stamp at least as high), so
//! their number is bounded by the distinct scopes forgotten, and exact-key ones cost no more
//! than the entries they removed.
//!
//! Indexed: every scope is kept under its packed form (`pack_scope`): its fields
//! length-prefixed in key order, then its ranks. So the scopes a key could be covered by are
//! a fixed few to look up (each field named or a wildcard: `covering_scopes`), and the scopes a
//! new wide one covers share its leading fields, one range of the order (`leading_prefix`).
//! Both maps are persistent (`imbl`): the writer makes each new version by copying one path,
//! while readers keep the versions they loaded; a Forget never copies the whole set.

use std::ops::Bound;

use crate::model::entry::{CacheKey, KeyView, ResultView};
use crate::model::forget::{stamp_unix_ms, ForgetScope, RankScope, Tombstone};

/// The rank byte of a packed scope: the shared entry (`0`), one rank (`1`, then u32 LE), or
/// every rank (`2`). An exact key packs as the scope naming only it.
const RANK_SHARED: u8 = 0;
const RANK_ONE: u8 = 1;
const RANK_EVERY: u8 = 2;

fn push_field(bytes: &mut Vec<u8>, field: &str) {
    bytes.extend_from_slice(&(field.len() as u32).to_le_bytes());
    bytes.extend_from_slice(field.as_bytes());
}

fn push_rank(bytes: &mut Vec<u8>, rank: RankScope) {
    match rank {
        RankScope::Shared => bytes.push(RANK_SHARED),
        RankScope::Rank(n) => {
            bytes.push(RANK_ONE);
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        RankScope::Every => bytes.push(RANK_EVERY),
    }
}

fn key_rank(rank: Option<u32>) -> RankScope {
    rank.map_or(RankScope::Shared, RankScope::Rank)
}

/// A scope given by its fields as one byte string: unambiguous for any field contents.
fn pack_fields(fields: [&str; 4], rank: RankScope) -> Box<[u8]> {
    let mut bytes = Vec::with_capacity(fields.iter().map(|f| f.len() + 4).sum::<usize>() + 5);
    for field in fields {
        push_field(&mut bytes, field);
    }
    push_rank(&mut bytes, rank);
    bytes.into_boxed_slice()
}

fn pack_scope(scope: &ForgetScope) -> Box<[u8]> {
    pack_fields(
        [&scope.namespace, &scope.op, &scope.device, &scope.problem],
        scope.rank,
    )
}

/// A key as the scope naming only it.
fn pack(key: &KeyView<'_>) -> Box<[u8]> {
    pack_fields(
        [key.namespace, key.op, key.device, key.problem],
        key_rank(key.rank),
    )
}

fn unpack_scope(mut bytes: &[u8]) -> Option<ForgetScope> {
    let mut field = || -> Option<String> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let (text, rest) = rest.split_at_checked(u32::from_le_bytes(*len) as usize)?;
        bytes = rest;
        String::from_utf8(text.to_vec()).ok()
    };
    let (namespace, op, device, problem) = (field()?, field()?, field()?, field()?);
    let rank = match bytes {
        [RANK_SHARED] => RankScope::Shared,
        [RANK_ONE, rank @ ..] => RankScope::Rank(u32::from_le_bytes(rank.try_into().ok()?)),
        [RANK_EVERY] => RankScope::Every,
        _ => return None,
    };
    Some(ForgetScope {
        namespace,
        op,
        device,
        problem,
        rank,
    })
}

fn unpack(bytes: &[u8]) -> Option<CacheKey> {
    let scope = unpack_scope(bytes)?;
    let rank = match scope.rank {
        RankScope::Shared => None,
        RankScope::Rank(n) => Some(n),
        RankScope::Every => return None,
    };
    Some(CacheKey {
        namespace: scope.namespace,
        op: scope.op,
        device: scope.device,
        problem: scope.problem,
        rank,
    })
}

/// The one key `scope` names, borrowed from it, if it names one (`ForgetScope::exact_key`
/// without its copy: replay asks this of every tombstone).
fn exact_view(scope: &ForgetScope) -> Option<KeyView<'_>> {
    let rank = match scope.rank {
        RankScope::Every => return None,
        RankScope::Shared => None,
        RankScope::Rank(n) => Some(n),
    };
    let all_set = !(scope.op.is_empty() || scope.device.is_empty() || scope.problem.is_empty());
    all_set.then_some(KeyView {
        namespace: &scope.namespace,
        op: &scope.op,
        device: &scope.device,
        problem: &scope.problem,
        rank,
    })
}

/// The packed prefix every scope and key within `scope` shares: its namespace and the fields
/// it names before its first wildcard.
fn leading_prefix(scope: &ForgetScope) -> Vec<u8> {
    let mut bytes = Vec::new();
    push_field(&mut bytes, &scope.namespace);
    for field in [&scope.op, &scope.device, &scope.problem] {
        if field.is_empty() {
            break;
        }
        push_field(&mut bytes, field);
    }
    bytes
}

/// The wide scopes that could cover something `fields` and `rank` name: each field as named or
/// a wildcard, each rank as named or every rank. At most 16.
fn covering_scopes(fields: [&str; 4], rank: RankScope) -> impl Iterator<Item = Box<[u8]>> + '_ {
    let [namespace, op, device, problem] = fields;
    let ranks: &'static [bool] = if rank == RankScope::Every {
        &[true]
    } else {
        &[false, true]
    };
    (0..8u8).flat_map(move |wild| {
        let pick = move |bit: u8, value: &'_ str| -> Option<String> {
            match (wild & bit != 0, value.is_empty()) {
                (true, _) => Some(String::new()),
                (false, true) => None, // already a wildcard: its (true) twin names it
                (false, false) => Some(value.to_owned()),
            }
        };
        let named = (pick(1, op), pick(2, device), pick(4, problem));
        ranks.iter().filter_map(move |every| {
            let (Some(op), Some(device), Some(problem)) = named.clone() else {
                return None;
            };
            let rank = if *every { RankScope::Every } else { rank };
            Some(pack_fields([namespace, &op, &device, &problem], rank))
        })
    })
}

/// The packed keys of `map` within `scope`'s leading range, with their stamps.
fn within_prefix<'m>(
    map: &'m imbl::OrdMap<Box<[u8]>, u64>,
    prefix: &'m [u8],
) -> impl Iterator<Item = (&'m Box<[u8]>, &'m u64)> + 'm {
    map.range::<_, [u8]>((Bound::Included(prefix), Bound::Unbounded))
        .take_while(move |(packed, _)| packed.starts_with(prefix))
}

/// The tombstones a replica holds, reduced and indexed (see the module's doc).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tombstones {
    /// Scopes that name one key, by key in packed form (no bigger than the key's bytes in the
    /// entry it removed): looked up on every Record.
    exact: imbl::OrdMap<Box<[u8]>, u64>,
    /// Wider scopes, by packed scope: one stamp each (the same scope with a higher stamp
    /// covers it).
    wide: imbl::OrdMap<Box<[u8]>, u64>,
}

impl Tombstones {
    pub fn len(&self) -> usize {
        self.exact.len() + self.wide.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The highest stamp of the wide scopes among `candidates`.
    fn highest_wide(&self, candidates: impl Iterator<Item = Box<[u8]>>) -> u64 {
        candidates
            .filter_map(|packed| self.wide.get(&packed).copied())
            .max()
            .unwrap_or(0)
    }

    /// Whether any wide scope of `namespace` is held: most keys have none to look for.
    fn wide_in_namespace(&self, namespace: &str) -> bool {
        let mut prefix = Vec::with_capacity(namespace.len() + 4);
        push_field(&mut prefix, namespace);
        let found = within_prefix(&self.wide, &prefix).next().is_some();
        found
    }

    /// The highest stamp of the tombstones covering `key`: results of it with a lower epoch
    /// are gone, and a result recorded now gets at least this epoch. 0 when none covers it.
    pub fn floor(&self, key: &KeyView<'_>) -> u64 {
        let wide = if !self.wide.is_empty() && self.wide_in_namespace(key.namespace) {
            self.highest_wide(covering_scopes(
                [key.namespace, key.op, key.device, key.problem],
                key_rank(key.rank),
            ))
        } else {
            0
        };
        if self.exact.is_empty() {
            return wide;
        }
        let exact = self.exact.get(&pack(key)).copied().unwrap_or(0);
        wide.max(exact)
    }

    /// Whether a result of `key` is removed by a tombstone held here.
    pub fn drops(&self, key: &KeyView<'_>, result: &ResultView<'_>) -> bool {
        self.drops_epoch(key, || result.forget_epoch)
    }

    /// `drops`, asking for the result's epoch only when a tombstone covers `key` (reading a
    /// stored result parses its record: a view's first read pins every key, mostly with no
    /// tombstone in sight).
    pub fn drops_epoch(&self, key: &KeyView<'_>, epoch: impl FnOnce() -> u64) -> bool {
        if self.is_empty() {
            return false;
        }
        let floor = self.floor(key);
        floor > 0 && epoch() < floor
    }

    /// Whether the tombstones held already remove everything `tombstone` would.
    pub fn subsumes(&self, tombstone: &Tombstone) -> bool {
        if let Some(key) = exact_view(&tombstone.scope) {
            return self.floor(&key) >= tombstone.stamp;
        }
        let scope = &tombstone.scope;
        self.highest_wide(covering_scopes(
            [&scope.namespace, &scope.op, &scope.device, &scope.problem],
            scope.rank,
        )) >= tombstone.stamp
    }

    /// Whether this very tombstone (its scope, with its stamp) is held.
    pub fn contains(&self, tombstone: &Tombstone) -> bool {
        let held = match exact_view(&tombstone.scope) {
            Some(_) => &self.exact,
            None => &self.wide,
        };
        held.get(&pack_scope(&tombstone.scope)) == Some(&tombstone.stamp)
    }

    /// Adds `tombstone` unless it is subsumed, dropping those it subsumes (found in its
    /// leading range, never by a walk of the whole set). Returns whether it was new knowledge
    /// (something a result could be dropped by).
    pub fn insert(&mut self, tombstone: Tombstone) -> bool {
        if self.subsumes(&tombstone) {
            return false;
        }
        let Tombstone { scope, stamp } = tombstone;
        if exact_view(&scope).is_some() {
            // An exact key packs as the scope naming only it.
            self.exact.insert(pack_scope(&scope), stamp);
            return true;
        }
        let prefix = leading_prefix(&scope);
        let covered = |map: &imbl::OrdMap<Box<[u8]>, u64>| -> Vec<Box<[u8]>> {
            within_prefix(map, &prefix)
                .filter(|(packed, held)| {
                    **held <= stamp
                        && unpack_scope(packed).is_some_and(|held| scope.includes(&held))
                })
                .map(|(packed, _)| packed.clone())
                .collect()
        };
        for packed in covered(&self.wide) {
            self.wide.remove(&packed);
        }
        for packed in covered(&self.exact) {
            self.exact.remove(&packed);
        }
        self.wide.insert(pack_scope(&scope), stamp);
        true
    }

    /// Drops exact-key tombstones whose key now holds a result at or above their stamp (the
    /// result carries the floor from now on), and every tombstone issued before
    /// `expire_before_unix_ms`. Returns how many went.
    pub fn compact(
        &mut self,
        epoch_held: impl Fn(&CacheKey) -> Option<u64>,
        expire_before_unix_ms: i64,
    ) -> usize {
        let before = self.len();
        let expired = |stamp: u64| stamp_unix_ms(stamp) < expire_before_unix_ms;
        let gone: Vec<Box<[u8]>> = self
            .exact
            .iter()
            .filter(|(packed, stamp)| {
                expired(**stamp)
                    || unpack(packed)
                        .is_none_or(|key| epoch_held(&key).is_some_and(|epoch| epoch >= **stamp))
            })
            .map(|(packed, _)| packed.clone())
            .collect();
        for packed in gone {
            self.exact.remove(&packed);
        }
        let gone: Vec<Box<[u8]>> = self
            .wide
            .iter()
            .filter(|(_, stamp)| expired(**stamp))
            .map(|(packed, _)| packed.clone())
            .collect();
        for packed in gone {
            self.wide.remove(&packed);
        }
        before - self.len()
    }

    /// Every tombstone, exact-key ones in key order, then the wide ones in scope order: a
    /// canonical order, so replicas holding the same tombstones write the same bytes.
    pub fn iter(&self) -> impl Iterator<Item = Tombstone> + '_ {
        let mut exact: Vec<(CacheKey, u64)> = self
            .exact
            .iter()
            .filter_map(|(packed, stamp)| Some((unpack(packed)?, *stamp)))
            .collect();
        exact.sort();
        let mut wide: Vec<Tombstone> = self
            .wide
            .iter()
            .filter_map(|(packed, stamp)| {
                Some(Tombstone {
                    scope: unpack_scope(packed)?,
                    stamp: *stamp,
                })
            })
            .collect();
        wide.sort_by(|a, b| a.scope.cmp(&b.scope).then(a.stamp.cmp(&b.stamp)));
        exact
            .into_iter()
            .map(|(key, stamp)| Tombstone {
                scope: ForgetScope::exact(&key),
                stamp,
            })
            .chain(wide)
    }

    /// Approximate memory held, for the bound the issue states (no more than the entries).
    pub fn encoded_len_estimate(&self) -> usize {
        // A packed scope is its fields and their lengths; the stamp and framing add about 8.
        self.exact
            .keys()
            .chain(self.wide.keys())
            .map(|packed| packed.len() + 8)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::testing::{key_in as key, scope};

    #[test]
    fn packed_keys_read_back_whatever_their_fields_hold() {
        for key in [
            key("gemm", "p", None),
            key("", "", Some(0)),
            key("a\0b", "\u{e9}", Some(u32::MAX)),
        ] {
            assert_eq!(unpack(&pack(&key.view())), Some(key));
        }
        assert_eq!(unpack(&[1, 0, 0]), None);
    }

    #[test]
    fn subsumed_tombstones_are_not_kept() {
        let mut held = Tombstones::default();
        let exact = Tombstone {
            scope: ForgetScope::exact(&key("gemm", "p", None)),
            stamp: 10,
        };
        assert!(held.insert(exact.clone()));
        assert!(!held.insert(exact.clone()), "the same tombstone twice");
        let wide = Tombstone {
            scope: scope("gemm", "", RankScope::Every),
            stamp: 20,
        };
        assert!(held.insert(wide.clone()));
        assert_eq!(held.len(), 1, "the wide one covers the exact one");
        assert!(!held.insert(exact), "older and narrower: nothing new");
        assert_eq!(held.floor(&key("gemm", "p", Some(2)).view()), 20);
        assert_eq!(held.floor(&key("conv", "p", None).view()), 0);
        // An older wide one is kept beside a newer narrower one: it covers more keys.
        assert!(held.insert(Tombstone {
            scope: scope("", "", RankScope::Every),
            stamp: 5,
        }));
        assert_eq!(held.len(), 2);
        assert_eq!(held.floor(&key("conv", "p", None).view()), 5);
    }

    #[test]
    fn compaction_drops_exact_tombstones_once_a_newer_result_carries_the_floor() {
        let mut held = Tombstones::default();
        let k = key("gemm", "p", None);
        let stamp = 1_000 << 16;
        held.insert(Tombstone {
            scope: ForgetScope::exact(&k),
            stamp,
        });
        assert_eq!(held.compact(|_| None, 0), 0, "no result: kept");
        assert_eq!(
            held.compact(|_| Some(stamp - 1), 0),
            0,
            "an older result: kept"
        );
        assert_eq!(held.compact(|_| Some(stamp), 0), 1);
        assert!(held.is_empty());
        held.insert(Tombstone {
            scope: scope("gemm", "", RankScope::Every),
            stamp,
        });
        assert_eq!(held.compact(|_| None, 999), 0);
        assert_eq!(held.compact(|_| None, 1_001), 1, "past the retention");
    }

    #[test]
    fn scopes_pack_and_read_back_with_every_rank_form() {
        for rank in [RankScope::Every, RankScope::Shared, RankScope::Rank(7)] {
            let scope = scope("gemm", "", rank);
            assert_eq!(unpack_scope(&pack_scope(&scope)), Some(scope));
        }
        assert_eq!(unpack_scope(&[0, 0, 0, 0, 9]), None);
    }

    /// What the index answers equals the rule applied to every tombstone ever inserted:
    /// reduction and indexing never change a floor.
    fn naive_floor(all: &[Tombstone], key: &CacheKey) -> u64 {
        all.iter()
            .filter(|t| t.scope.covers(&key.view()))
            .map(|t| t.stamp)
            .max()
            .unwrap_or(0)
    }

    fn any_scope() -> impl proptest::strategy::Strategy<Value = ForgetScope> {
        use proptest::prelude::*;
        let field = || prop_oneof![Just(String::new()), "[ab]"];
        let rank = prop_oneof![
            Just(RankScope::Every),
            Just(RankScope::Shared),
            (0u32..2).prop_map(RankScope::Rank)
        ];
        ("[xy]", field(), field(), field(), rank).prop_map(
            |(namespace, op, device, problem, rank)| ForgetScope {
                namespace,
                op,
                device,
                problem,
                rank,
            },
        )
    }

    proptest::proptest! {
        #[test]
        fn the_index_answers_what_every_tombstone_would(
            inserted in proptest::collection::vec((any_scope(), 1u64..6), 0..24),
        ) {
            let mut held = Tombstones::default();
            let all: Vec<Tombstone> = inserted
                .into_iter()
                .map(|(scope, stamp)| Tombstone { scope, stamp })
                .collect();
            for tombstone in &all {
                held.insert(tombstone.clone());
            }
            for namespace in ["x", "y"] {
                for op in ["a", "b"] {
                    for device in ["a", "b"] {
                        for problem in ["a", "b"] {
                            for rank in [None, Some(0), Some(1)] {
                                let key = CacheKey {
                                    namespace: namespace.into(),
                                    op: op.into(),
                                    device: device.into(),
                                    problem: problem.into(),
                                    rank,
                                };
                                proptest::prop_assert_eq!(
                                    held.floor(&key.view()),
                                    naive_floor(&all, &key),
                                    "{:?}", key
                                );
                            }
                        }
                    }
                }
            }
            // Reduced: no tombstone held is covered by another one held.
            let kept: Vec<Tombstone> = held.iter().collect();
            for (i, a) in kept.iter().enumerate() {
                for (j, b) in kept.iter().enumerate() {
                    proptest::prop_assert!(
                        i == j || !(b.stamp >= a.stamp && b.scope.includes(&a.scope)),
                        "{:?} covers {:?}", b, a
                    );
                }
            }
        }
    }

    #[test]
    fn a_wide_scope_drops_only_the_tombstones_in_its_leading_range() {
        let mut held = Tombstones::default();
        for problem in ["p", "q"] {
            for op in ["gemm", "conv"] {
                held.insert(Tombstone {
                    scope: ForgetScope::exact(&key(op, problem, None)),
                    stamp: 3,
                });
            }
        }
        assert!(held.insert(Tombstone {
            scope: scope("gemm", "", RankScope::Every),
            stamp: 4,
        }));
        let kept: Vec<String> = held.iter().map(|t| t.scope.to_string()).collect();
        assert_eq!(
            kept,
            [
                "ns/conv/dev/p (shared)",
                "ns/conv/dev/q (shared)",
                "ns/gemm/*/* (every rank)"
            ]
        );
    }
}
