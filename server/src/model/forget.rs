//! What a Forget removes, and what it leaves behind so that no replica brings it back.
//!
//! A Forget becomes a *tombstone*: a scope (which keys) and a stamp from the node's hybrid
//! logical clock (`ForgetClock`). Every result carries a `forget_epoch`: the highest stamp of
//! the tombstones covering its key that the recording node knew when it stored it. The rule:
//!
//! - a tombstone drops exactly the results of its scope whose epoch is below its stamp;
//! - the merge rule (`merge`) compares epochs first, so a result recorded after a Forget beats
//!   every result it removed, whatever their times.
//!
//! So the outcome is a function of the *set* of results and tombstones a replica has seen,
//! never of the order it saw them in: replicas converge to the same bytes. The causal order
//! is the clock's, never the `tuned_at_unix_ms` that clients set: a node advances its clock
//! past every stamp and epoch it learns, so what it records after learning of a Forget is
//! live everywhere, and a result recorded concurrently on a node that had not heard of it yet
//! may be dropped with the old ones.
//!
//! Tombstones are bounded (`Tombstones`): one that a wider or newer one covers is dropped at
//! once; an exact-key one is dropped once the key holds a result with an epoch at or above its
//! stamp (that result carries the floor from then on); the rest are kept for the retention
//! period (`--forget-retention-days`), documented in docs/forget.md.

use crate::model::entry::{CacheKey, KeyView, ResultView};

/// What a Forget asked of this node removes.
#[derive(Clone, Debug)]
pub struct ForgetAsk {
    pub scope: ForgetScope,
    /// With one exact key: forget it only if its winner still has this config and time.
    pub only_if: Option<(String, f64)>,
}

/// Which ranks of a key a scope covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RankScope {
    /// The shared entry and every per-rank entry (a scope Forget with `rank` unset).
    Every,
    /// The shared entry only (an exact-key Forget with `rank` unset).
    Shared,
    /// Rank n's own entry.
    Rank(u32),
}

impl RankScope {
    fn covers(self, rank: Option<u32>) -> bool {
        match self {
            RankScope::Every => true,
            RankScope::Shared => rank.is_none(),
            RankScope::Rank(n) => rank == Some(n),
        }
    }

    /// As files and messages carry it: the rank a scope names, and whether it covers every
    /// rank (neither: the shared entry only).
    pub fn to_fields(self) -> (Option<u32>, bool) {
        match self {
            RankScope::Every => (None, true),
            RankScope::Shared => (None, false),
            RankScope::Rank(n) => (Some(n), false),
        }
    }

    pub fn from_fields(rank: Option<u32>, every_rank: bool) -> RankScope {
        match (every_rank, rank) {
            (true, _) => RankScope::Every,
            (false, None) => RankScope::Shared,
            (false, Some(n)) => RankScope::Rank(n),
        }
    }

    fn includes(self, other: RankScope) -> bool {
        match (self, other) {
            (RankScope::Every, _) => true,
            (a, b) => a == b,
        }
    }
}

/// The keys a Forget covers: the namespace, and each other string unless empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForgetScope {
    pub namespace: String,
    pub op: String,
    pub device: String,
    pub problem: String,
    pub rank: RankScope,
}

fn field_covers(scope: &str, value: &str) -> bool {
    scope.is_empty() || scope == value
}

fn field_includes(wide: &str, narrow: &str) -> bool {
    wide.is_empty() || wide == narrow
}

impl ForgetScope {
    /// The scope of exactly one key.
    pub fn exact(key: &CacheKey) -> ForgetScope {
        ForgetScope {
            namespace: key.namespace.clone(),
            op: key.op.clone(),
            device: key.device.clone(),
            problem: key.problem.clone(),
            rank: key.rank.map_or(RankScope::Shared, RankScope::Rank),
        }
    }

    pub fn covers(&self, key: &KeyView<'_>) -> bool {
        self.namespace == key.namespace
            && field_covers(&self.op, key.op)
            && field_covers(&self.device, key.device)
            && field_covers(&self.problem, key.problem)
            && self.rank.covers(key.rank)
    }

    /// Every key `other` covers, this covers too.
    pub fn includes(&self, other: &ForgetScope) -> bool {
        self.namespace == other.namespace
            && field_includes(&self.op, &other.op)
            && field_includes(&self.device, &other.device)
            && field_includes(&self.problem, &other.problem)
            && self.rank.includes(other.rank)
    }

    /// The one key this scope covers, if it names one.
    pub fn exact_key(&self) -> Option<CacheKey> {
        let rank = match self.rank {
            RankScope::Every => return None,
            RankScope::Shared => None,
            RankScope::Rank(n) => Some(n),
        };
        let all_set = !(self.op.is_empty() || self.device.is_empty() || self.problem.is_empty());
        all_set.then(|| CacheKey {
            namespace: self.namespace.clone(),
            op: self.op.clone(),
            device: self.device.clone(),
            problem: self.problem.clone(),
            rank,
        })
    }

    pub fn encoded_len_estimate(&self) -> usize {
        self.namespace.len() + self.op.len() + self.device.len() + self.problem.len() + 24
    }
}

impl std::fmt::Display for ForgetScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let any = |s: &str| if s.is_empty() { "*" } else { s }.to_owned();
        let rank = match self.rank {
            RankScope::Every => "every rank".to_owned(),
            RankScope::Shared => "shared".to_owned(),
            RankScope::Rank(n) => format!("rank {n}"),
        };
        write!(
            f,
            "{}/{}/{}/{} ({rank})",
            self.namespace,
            any(&self.op),
            any(&self.device),
            any(&self.problem)
        )
    }
}

/// A Forget as every replica keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tombstone {
    pub scope: ForgetScope,
    /// From the forgetting node's `ForgetClock`: results of the scope with a lower epoch go.
    pub stamp: u64,
}

/// The rule itself: whether `tombstone` removes `result` of `key`.
pub fn drops(tombstone: &Tombstone, key: &KeyView<'_>, result: &ResultView<'_>) -> bool {
    result.forget_epoch < tombstone.stamp && tombstone.scope.covers(key)
}

/// The epoch a node gives a result it stores as its own (a Record, its tuner's result): the
/// floor of the Forgets it knows for the key, or its current winner's epoch if higher, so the
/// new result is live after those Forgets and competes with the winner on time.
pub fn record_epoch(floor: u64, winner_epoch: u64) -> u64 {
    floor.max(winner_epoch)
}

/// A hybrid logical clock: milliseconds of the daemon's own clock in the high 48 bits, a
/// counter in the low 16. It never goes back, and `observe` moves it past every stamp and
/// epoch the node learns, so a Forget made here covers everything this node has seen.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForgetClock {
    last: u64,
}

impl ForgetClock {
    /// A new stamp, greater than every one issued or observed before.
    pub fn tick(&mut self, now_unix_ms: i64) -> u64 {
        let physical = u64::try_from(now_unix_ms).unwrap_or(0) << 16;
        self.last = physical.max(self.last.saturating_add(1));
        self.last
    }

    pub fn observe(&mut self, stamp: u64) {
        self.last = self.last.max(stamp);
    }

    pub fn last(&self) -> u64 {
        self.last
    }
}

/// How far ahead of this node's clock a stamp or epoch from another node may be: clocks of
/// one cluster differ by seconds. A value further ahead was not made by a daemon's clock (a
/// damaged or forged file, a hand-written Redis field) and is refused: an epoch of
/// `u64::MAX` would make its result unforgettable, a stamp of it would forget everything for
/// good and stop every clock that learned it.
pub const MAX_AHEAD_MS: i64 = 24 * 3600 * 1000;

/// Whether a stamp or epoch learned from elsewhere could have come from a daemon's clock.
pub fn plausible(stamp: u64, now_unix_ms: i64) -> bool {
    stamp_unix_ms(stamp) <= now_unix_ms.saturating_add(MAX_AHEAD_MS)
}

/// The unix milliseconds a stamp was issued at (its physical part).
pub fn stamp_unix_ms(stamp: u64) -> i64 {
    i64::try_from(stamp >> 16).unwrap_or(i64::MAX)
}

/// A key as one byte string: each field length-prefixed (u32 LE), then the rank (0, or 1 and
/// u32 LE). Unambiguous for any field contents.
fn pack(key: &KeyView<'_>) -> Box<[u8]> {
    let fields = [key.namespace, key.op, key.device, key.problem];
    let len = fields.iter().map(|f| f.len() + 4).sum::<usize>() + 5;
    let mut bytes = Vec::with_capacity(len);
    for field in fields {
        bytes.extend_from_slice(&(field.len() as u32).to_le_bytes());
        bytes.extend_from_slice(field.as_bytes());
    }
    match key.rank {
        None => bytes.push(0),
        Some(rank) => {
            bytes.push(1);
            bytes.extend_from_slice(&rank.to_le_bytes());
        }
    }
    bytes.into_boxed_slice()
}

fn unpack(mut bytes: &[u8]) -> Option<CacheKey> {
    let mut field = || -> Option<String> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let (text, rest) = rest.split_at_checked(u32::from_le_bytes(*len) as usize)?;
        bytes = rest;
        String::from_utf8(text.to_vec()).ok()
    };
    let (namespace, op, device, problem) = (field()?, field()?, field()?, field()?);
    let rank = match bytes {
        [0] => None,
        [1, rank @ ..] => Some(u32::from_le_bytes(rank.try_into().ok()?)),
        _ => return None,
    };
    Some(CacheKey {
        namespace,
        op,
        device,
        problem,
        rank,
    })
}

/// The tombstones a replica holds, reduced: none is covered by another (a wider scope with a
/// stamp at least as high), so their number is bounded by the distinct scopes forgotten, and
/// exact-key ones cost no more than the entries they removed.
///
/// A persistent map (`imbl`): the writer makes each new version by copying one path of it,
/// O(log n) per tombstone added, while readers keep the versions they loaded; a Forget never
/// copies the whole set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tombstones {
    /// Scopes that name one key, by key in packed form (`pack`: one allocation, no bigger
    /// than the key's bytes in the entry it removed): looked up on every Record.
    exact: imbl::HashMap<Box<[u8]>, u64>,
    /// Wider scopes (few: each is an administrator's act, and one covering another is
    /// dropped), copied whole with each version.
    wide: Vec<Tombstone>,
}

impl Tombstones {
    pub fn len(&self) -> usize {
        self.exact.len() + self.wide.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The highest stamp of the tombstones covering `key`: results of it with a lower epoch
    /// are gone, and a result recorded now gets at least this epoch. 0 when none covers it.
    pub fn floor(&self, key: &KeyView<'_>) -> u64 {
        let wide = self
            .wide
            .iter()
            .filter(|t| t.scope.covers(key))
            .map(|t| t.stamp)
            .max()
            .unwrap_or(0);
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
        if let Some(key) = tombstone.scope.exact_key() {
            return self.floor(&key.view()) >= tombstone.stamp;
        }
        self.wide
            .iter()
            .any(|t| t.stamp >= tombstone.stamp && t.scope.includes(&tombstone.scope))
    }

    /// Whether this very tombstone (its scope, with its stamp) is held.
    pub fn contains(&self, tombstone: &Tombstone) -> bool {
        match tombstone.scope.exact_key() {
            Some(key) => self.exact.get(&pack(&key.view())) == Some(&tombstone.stamp),
            None => self.wide.contains(tombstone),
        }
    }

    /// Adds `tombstone` unless it is subsumed, dropping those it subsumes. Returns whether it
    /// was new knowledge (something a result could be dropped by).
    pub fn insert(&mut self, tombstone: Tombstone) -> bool {
        if self.subsumes(&tombstone) {
            return false;
        }
        let Tombstone { scope, stamp } = tombstone;
        if let Some(key) = scope.exact_key() {
            self.exact.insert(pack(&key.view()), stamp);
            return true;
        }
        self.wide
            .retain(|t| !(t.stamp <= stamp && scope.includes(&t.scope)));
        self.exact.retain(|packed, t| {
            !(*t <= stamp && unpack(packed).is_some_and(|key| scope.covers(&key.view())))
        });
        self.wide.push(Tombstone { scope, stamp });
        // A canonical order: replicas holding the same tombstones write the same bytes.
        self.wide
            .sort_by(|a, b| a.scope.cmp(&b.scope).then(a.stamp.cmp(&b.stamp)));
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
        self.exact.retain(|packed, stamp| {
            stamp_unix_ms(*stamp) >= expire_before_unix_ms
                && unpack(packed)
                    .is_some_and(|key| epoch_held(&key).is_none_or(|epoch| epoch < *stamp))
        });
        self.wide
            .retain(|t| stamp_unix_ms(t.stamp) >= expire_before_unix_ms);
        before - self.len()
    }

    /// Every tombstone, exact-key ones in key order, then the wide ones.
    pub fn iter(&self) -> impl Iterator<Item = Tombstone> + '_ {
        let mut exact: Vec<(CacheKey, u64)> = self
            .exact
            .iter()
            .filter_map(|(packed, stamp)| Some((unpack(packed)?, *stamp)))
            .collect();
        exact.sort();
        exact
            .into_iter()
            .map(|(key, stamp)| Tombstone {
                scope: ForgetScope::exact(&key),
                stamp,
            })
            .chain(self.wide.iter().cloned())
    }

    /// Approximate memory held, for the bound the issue states (no more than the entries).
    pub fn encoded_len_estimate(&self) -> usize {
        self.iter().map(|t| t.scope.encoded_len_estimate()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(op: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: "ns".into(),
            op: op.into(),
            device: "dev".into(),
            problem: problem.into(),
            rank,
        }
    }

    fn scope(op: &str, problem: &str, rank: RankScope) -> ForgetScope {
        ForgetScope {
            namespace: "ns".into(),
            op: op.into(),
            device: String::new(),
            problem: problem.into(),
            rank,
        }
    }

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
    fn scopes_cover_what_their_fields_name() {
        let every = scope("gemm", "", RankScope::Every);
        assert!(every.covers(&key("gemm", "p", None).view()));
        assert!(every.covers(&key("gemm", "q", Some(3)).view()));
        assert!(!every.covers(&key("conv", "p", None).view()));
        let shared = ForgetScope::exact(&key("gemm", "p", None));
        assert!(shared.covers(&key("gemm", "p", None).view()));
        assert!(!shared.covers(&key("gemm", "p", Some(0)).view()));
        assert!(every.includes(&shared));
        assert!(!shared.includes(&every));
        assert_eq!(shared.exact_key(), Some(key("gemm", "p", None)));
        assert_eq!(every.exact_key(), None);
    }

    #[test]
    fn the_clock_moves_past_what_it_observes_and_never_back() {
        let mut clock = ForgetClock::default();
        let first = clock.tick(1_000);
        assert_eq!(stamp_unix_ms(first), 1_000);
        clock.observe(first + 500);
        let second = clock.tick(900);
        assert!(second > first + 500);
        assert!(clock.tick(900) > second);
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
}
