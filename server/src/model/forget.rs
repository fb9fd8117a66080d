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
//! Tombstones are bounded (`model::tombstones`): one that a wider or newer one covers is dropped at
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

    /// The fields of this scope before its first wildcard (op, device, problem in key order):
    /// every key it covers shares them, so the keys it covers lie in one range of the key
    /// order, from `first_key` while `in_leading_range` holds.
    fn leading_fields(&self) -> usize {
        [&self.op, &self.device, &self.problem]
            .iter()
            .take_while(|field| !field.is_empty())
            .count()
    }

    /// The smallest key of the range that holds every key this scope covers.
    pub fn first_key(&self) -> KeyView<'_> {
        let leading = self.leading_fields();
        fn named(leading: usize, place: usize, value: &str) -> &str {
            if leading > place {
                value
            } else {
                ""
            }
        }
        KeyView {
            namespace: &self.namespace,
            op: named(leading, 0, &self.op),
            device: named(leading, 1, &self.device),
            problem: named(leading, 2, &self.problem),
            rank: None,
        }
    }

    /// Whether `key` is in the range that holds every key this scope covers (its namespace
    /// and leading fields): a walk from `first_key` stops at the first key that is not.
    pub fn in_leading_range(&self, key: &KeyView<'_>) -> bool {
        let leading = self.leading_fields();
        self.namespace == key.namespace
            && (leading < 1 || self.op == key.op)
            && (leading < 2 || self.device == key.device)
            && (leading < 3 || self.problem == key.problem)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The key of `problem` under op `op` in namespace `ns` and device `dev` (the builder
    /// every part's tests take through `model::testing`, which this module may not import).
    pub(crate) fn key(op: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: "ns".into(),
            op: op.into(),
            device: "dev".into(),
            problem: problem.into(),
            rank,
        }
    }

    /// The Forget scope of namespace `ns` and op `op` (every device), `problem` (empty:
    /// every problem) and `rank`.
    pub(crate) fn scope(op: &str, problem: &str, rank: RankScope) -> ForgetScope {
        ForgetScope {
            namespace: "ns".into(),
            op: op.into(),
            device: String::new(),
            problem: problem.into(),
            rank,
        }
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
}
