//! Lifecycle: when an entry no rank uses any more leaves the cache (docs/lifecycle.md). The
//! rules, as pure functions and types: the day, the retention per namespace, whether an entry
//! is expired, which entries a bound on their number expires first, and the age buckets
//! `du` shows.
//!
//! An entry's last use is a day (days since the Unix epoch, UTC), merged across nodes by
//! maximum, so every node that has heard the same uses judges the same entries expired.
//! Expiry is a function of that day and the clock, never a stored fact: a node that comes
//! back after 200 days finds its old entries already expired, and a later Record revives a
//! key because it is a use.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Days since the Unix epoch (UTC). 0 means "no use known".
pub type Day = u32;

pub const MS_PER_DAY: i64 = 86_400_000;

/// Default of `--retain-days`.
pub const DEFAULT_RETAIN_DAYS: u32 = 90;
/// Default of `--max-entries`.
pub const DEFAULT_MAX_ENTRIES: u64 = 10_000_000;

/// The day of a Unix time in milliseconds (times before 1970 are day 0).
pub fn day_of_ms(unix_ms: i64) -> Day {
    (unix_ms.max(0) / MS_PER_DAY).min(i64::from(u32::MAX)) as Day
}

/// The day an entry counts as last used: its last use, or the day its result was recorded,
/// whichever is later. A day after `today` counts as today, so neither a skewed clock nor a
/// careless writer can keep an entry for ever.
pub fn effective_day(last_use: Day, tuned_at_unix_ms: i64, today: Day) -> Day {
    last_use.max(day_of_ms(tuned_at_unix_ms)).min(today)
}

/// A last use read from another node, the journal or Redis, checked like a client's value:
/// a day after `today` (damage, a clock that ran ahead, a careless writer) is taken as today.
/// None known (0: written by a daemon from before lifecycle existed) is taken as today too:
/// the arrival is the first use seen, rather than expire what nobody judged.
pub fn plausible_day(day: Day, today: Day) -> Day {
    match day {
        0 => today,
        day => day.min(today),
    }
}

/// The last use an entry arriving from elsewhere holds: the day its source knew, checked
/// (`plausible_day`), raised by the last use of what this node holds for the key. The writer
/// stores it; a tier that must know whether the writer will drop the entry judges by it too.
pub fn arriving_day(known: Day, held: Day, today: Day) -> Day {
    plausible_day(known, today).max(held)
}

/// How long entries are kept after their last use: a default and per-namespace overrides
/// (`--retain-days`, `--retain NS=DAYS`). 0 days keeps for ever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    default_days: u32,
    per_namespace: BTreeMap<String, u32>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention::new(DEFAULT_RETAIN_DAYS, [])
    }
}

impl Retention {
    pub fn new(default_days: u32, overrides: impl IntoIterator<Item = (String, u32)>) -> Self {
        Retention {
            default_days,
            per_namespace: overrides.into_iter().collect(),
        }
    }

    /// Keeps every entry for ever.
    pub fn keep_all() -> Self {
        Retention::new(0, [])
    }

    /// The retention of `namespace`, in days; 0: kept for ever.
    pub fn days_for(&self, namespace: &str) -> u32 {
        self.per_namespace
            .get(namespace)
            .copied()
            .unwrap_or(self.default_days)
    }

    /// Whether anything can expire by age at all.
    pub fn expires_anything(&self) -> bool {
        self.default_days > 0 || self.per_namespace.values().any(|days| *days > 0)
    }

    /// Whether an entry of `namespace` last used on `effective` is expired on `today`: its
    /// age is more than its retention.
    pub fn expired(&self, namespace: &str, effective: Day, today: Day) -> bool {
        let days = self.days_for(namespace);
        days > 0 && today.saturating_sub(effective) > days
    }

    /// Whether an entry of `namespace` last used on `last_use` and recorded at
    /// `tuned_at_unix_ms` is expired on `today` (`effective_day`, then `expired`).
    pub fn entry_expired(
        &self,
        namespace: &str,
        last_use: Day,
        tuned_at_unix_ms: i64,
        today: Day,
    ) -> bool {
        self.expired(
            namespace,
            effective_day(last_use, tuned_at_unix_ms, today),
            today,
        )
    }

    /// Parses `NS=DAYS` (`--retain`).
    pub fn parse_override(text: &str) -> Result<(String, u32), String> {
        let (namespace, days) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected NAMESPACE=DAYS"))?;
        if namespace.is_empty() {
            return Err(format!("{text:?}: the namespace is empty"));
        }
        let days = days
            .parse::<u32>()
            .map_err(|e| format!("{text:?}: DAYS: {e}"))?;
        Ok((namespace.to_owned(), days))
    }
}

/// Which entries a bound expires: all those last used before `before`, and, of those last
/// used on `before`, the first in key order until `at_day` of their weight is taken. A bound on
/// the number of entries weighs each entry 1; a bound on bytes weighs each by its size. Every
/// node holding the same entries with the same merged last uses cuts the same ones, so all
/// converge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LruCut {
    pub before: Day,
    pub at_day: u64,
}

impl LruCut {
    /// The cut that leaves `max` of the entries whose effective days are `days`, or `None`
    /// when they are within it.
    pub fn plan(days: impl Iterator<Item = Day>, max: u64) -> Option<LruCut> {
        LruCut::plan_weighted(days.map(|day| (day, 1)), max)
    }

    /// The cut that leaves at most `max` of the total weight of the entries whose (effective
    /// day, weight) are given, or `None` when they are within it.
    pub fn plan_weighted(entries: impl Iterator<Item = (Day, u64)>, max: u64) -> Option<LruCut> {
        let mut per_day: BTreeMap<Day, u64> = BTreeMap::new();
        let mut total = 0u64;
        for (day, weight) in entries {
            *per_day.entry(day).or_default() += weight;
            total = total.saturating_add(weight);
        }
        let mut excess = total.checked_sub(max).filter(|excess| *excess > 0)?;
        for (day, weight) in per_day {
            if weight >= excess {
                return Some(LruCut {
                    before: day,
                    at_day: excess,
                });
            }
            excess -= weight;
        }
        None
    }

    /// Walks entries in key order: whether the entry last used on `day` is cut (weight 1).
    /// `taken_at_day` counts what was cut so far of day `before`.
    pub fn cuts(&self, day: Day, taken_at_day: &mut u64) -> bool {
        self.cuts_weighted(day, 1, taken_at_day)
    }

    /// `cuts`, for an entry of `weight`: of day `before`, entries are cut in key order until
    /// the weight taken reaches `at_day`.
    pub fn cuts_weighted(&self, day: Day, weight: u64, taken_at_day: &mut u64) -> bool {
        if day < self.before {
            return true;
        }
        if day == self.before && *taken_at_day < self.at_day {
            *taken_at_day += weight;
            return true;
        }
        false
    }
}

/// The last-use age buckets of `tunecache du` and the Prometheus gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AgeBucket {
    Today,
    UpToWeek,
    UpToMonth,
    UpToQuarter,
    Older,
}

impl AgeBucket {
    pub const ALL: [AgeBucket; 5] = [
        AgeBucket::Today,
        AgeBucket::UpToWeek,
        AgeBucket::UpToMonth,
        AgeBucket::UpToQuarter,
        AgeBucket::Older,
    ];

    /// The bucket of an entry last used `age` days ago: 0, 1–6, 7–29, 30–89, 90 and more.
    pub fn of(age: u32) -> AgeBucket {
        match age {
            0 => AgeBucket::Today,
            1..=6 => AgeBucket::UpToWeek,
            7..=29 => AgeBucket::UpToMonth,
            30..=89 => AgeBucket::UpToQuarter,
            _ => AgeBucket::Older,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            AgeBucket::Today => "today",
            AgeBucket::UpToWeek => "1-7d",
            AgeBucket::UpToMonth => "7-30d",
            AgeBucket::UpToQuarter => "30-90d",
            AgeBucket::Older => "older",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The daemon's wall clock for lifecycle decisions: the system's, or one a test or the
/// year benchmark sets by hand. Cheap to clone; clones share a set time.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<AtomicI64>>,
}

impl Clock {
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock that stands at `unix_ms` until set or advanced.
    pub fn manual(unix_ms: i64) -> Clock {
        Clock {
            manual: Some(Arc::new(AtomicI64::new(unix_ms))),
        }
    }

    pub fn now_ms(&self) -> i64 {
        match &self.manual {
            Some(ms) => ms.load(Ordering::Relaxed),
            None => tunecache_proto::unix_now_ms(),
        }
    }

    pub fn today(&self) -> Day {
        day_of_ms(self.now_ms())
    }

    /// Moves a manual clock on by `days` (a system clock is not moved).
    pub fn advance_days(&self, days: u32) {
        if let Some(ms) = &self.manual {
            ms.fetch_add(i64::from(days) * MS_PER_DAY, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_expires_the_day_its_age_passes_its_retention() {
        let retention = Retention::new(30, [("keep".to_owned(), 0), ("short".to_owned(), 2)]);
        assert!(!retention.expired("ns", 100, 130), "30 days old: kept");
        assert!(retention.expired("ns", 100, 131), "31 days old: expired");
        assert!(!retention.expired("keep", 0, 10_000), "0 keeps for ever");
        assert!(retention.expired("short", 100, 103));
        assert!(!Retention::keep_all().expires_anything());
        assert!(retention.expires_anything());
    }

    #[test]
    fn the_later_of_use_and_record_counts_and_the_future_counts_as_today() {
        let day = 20_000;
        let recorded = i64::from(day) * MS_PER_DAY + 5;
        assert_eq!(effective_day(0, recorded, day + 3), day);
        assert_eq!(effective_day(day + 2, recorded, day + 3), day + 2);
        assert_eq!(
            effective_day(0, recorded + 400 * MS_PER_DAY, day + 3),
            day + 3
        );
        assert_eq!(effective_day(u32::MAX, 0, day), day);
        assert_eq!(day_of_ms(-5), 0);
        assert_eq!(plausible_day(0, day), day, "none known: today");
        assert_eq!(plausible_day(day + 9, day), day);
        assert_eq!(plausible_day(day - 9, day), day - 9);
    }

    #[test]
    fn a_cut_keeps_exactly_the_most_recently_used() {
        // Days of entries in key order.
        let days = [5, 1, 3, 1, 5, 3, 3, 9];
        let cut = LruCut::plan(days.iter().copied(), 4).unwrap();
        let mut taken = 0;
        let cut_days: Vec<Day> = days
            .iter()
            .copied()
            .filter(|day| cut.cuts(*day, &mut taken))
            .collect();
        // Both day-1 entries and the first two day-3 entries (key order) go.
        assert_eq!(cut_days, vec![1, 3, 1, 3]);
        assert_eq!(LruCut::plan(days.iter().copied(), 8), None);
        assert_eq!(LruCut::plan(days.iter().copied(), 100), None);
        let all = LruCut::plan(days.iter().copied(), 0).unwrap();
        let mut taken = 0;
        assert!(days.iter().all(|day| all.cuts(*day, &mut taken)));
    }

    #[test]
    fn a_cut_by_weight_keeps_the_most_recently_used_within_the_bytes() {
        // (day, bytes) in key order.
        let entries = [(5, 100), (1, 50), (3, 70), (1, 60), (5, 10), (3, 40)];
        // 330 bytes in all; 200 allowed: both day-1 entries (110) go, then day 3 in key order
        // until 20 more are taken: the first (70).
        let cut = LruCut::plan_weighted(entries.iter().copied(), 200).unwrap();
        let mut taken = 0;
        let kept: Vec<(Day, u64)> = entries
            .iter()
            .copied()
            .filter(|(day, bytes)| !cut.cuts_weighted(*day, *bytes, &mut taken))
            .collect();
        assert_eq!(kept, vec![(5, 100), (5, 10), (3, 40)]);
        assert!(kept.iter().map(|(_, bytes)| bytes).sum::<u64>() <= 200);
        assert_eq!(LruCut::plan_weighted(entries.iter().copied(), 330), None);
    }

    #[test]
    fn buckets_cover_every_age_once() {
        let labels: Vec<_> = [0, 1, 6, 7, 29, 30, 89, 90, 5000]
            .into_iter()
            .map(|age| AgeBucket::of(age).label())
            .collect();
        assert_eq!(
            labels,
            ["today", "1-7d", "1-7d", "7-30d", "7-30d", "30-90d", "30-90d", "older", "older"]
        );
    }

    #[test]
    fn overrides_parse_or_say_why_not() {
        assert_eq!(
            Retention::parse_override("trtllm=7"),
            Ok(("trtllm".to_owned(), 7))
        );
        assert!(Retention::parse_override("=7").is_err());
        assert!(Retention::parse_override("x").is_err());
        assert!(Retention::parse_override("x=-1").is_err());
    }

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_follow() {
        let clock = Clock::manual(10 * MS_PER_DAY);
        let clone = clock.clone();
        assert_eq!(clock.today(), 10);
        clock.advance_days(3);
        assert_eq!(clone.today(), 13);
    }
}
