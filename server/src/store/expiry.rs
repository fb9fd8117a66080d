//! The rules of last use and expiry over one version of the cache, as pure functions the
//! writer, the sweep, Usage and Prune share (`lifecycle` is the store's side that acts on
//! them): which entries a sweep expires and whether one still does when the writer gets to
//! it, what `du` counts, what `prune` takes, and the metrics read from Stats' usage.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::lifecycle::{
    effective_day, AgeBucket, Clock, Day, LruCut, Retention, DEFAULT_MAX_ENTRIES,
};
use crate::report::registry::{Labels, StatsResponse};
use crate::wire::stored::{EntryMap, StoredEntry};

/// How often the uses reads marked are journalled and told to the tiers: a crash loses at
/// most this much of them (a mark, not an acknowledged write).
pub const USE_FLUSH_INTERVAL: Duration = Duration::from_secs(60);

/// Entries the writer drops per command of a sweep: about a millisecond of its time.
pub const EXPIRY_BATCH: usize = 1024;

/// How the store judges last use: `--retain-days`, `--retain`, `--max-entries`, and the
/// clock (the system's, or a test's).
#[derive(Clone, Debug)]
pub struct LifecycleSettings {
    pub retention: Retention,
    /// Most entries kept; past it the least recently used expire. 0: no bound.
    pub max_entries: u64,
    /// Most bytes the entries may take in a tier that holds them all (Redis:
    /// `--cluster-max-mib`), each entry weighed as its record plus `overhead_bytes`; past it
    /// the least recently used expire. 0: no bound.
    pub max_bytes: u64,
    pub overhead_bytes: u64,
    /// Artifacts up to this size count in an entry's weight too (Redis holds those:
    /// `--cluster-max-artifact-bytes`); 0: none do.
    pub counted_artifact_bytes: u64,
    pub clock: Clock,
    /// How often marked uses are journalled and told to the tiers (`USE_FLUSH_INTERVAL`;
    /// tests shorten it).
    pub flush_every: Duration,
}

impl Default for LifecycleSettings {
    fn default() -> Self {
        LifecycleSettings {
            retention: Retention::default(),
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: 0,
            overhead_bytes: 0,
            counted_artifact_bytes: 0,
            clock: Clock::system(),
            flush_every: USE_FLUSH_INTERVAL,
        }
    }
}

impl LifecycleSettings {
    /// What `entry` weighs against `max_bytes`: its record, the overhead, and the artifacts
    /// the tier holds (a blob two entries name counts for both: the bound errs low).
    pub fn bytes_of(&self, entry: &StoredEntry) -> u64 {
        let artifacts: u64 = entry
            .result()
            .artifacts
            .iter()
            .map(|artifact| artifact.size)
            .filter(|size| *size <= self.counted_artifact_bytes)
            .sum();
        entry.record().len() as u64 + self.overhead_bytes + artifacts
    }
}

/// Why a sweep expires an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Unused for longer than its namespace's retention.
    Age,
    /// Among the least recently used past `--max-entries` or `--cluster-max-mib`.
    Bound,
}

/// One entry a sweep expires: the entry, the effective day it was judged by, and why.
#[derive(Clone, Debug)]
pub struct Expiring {
    pub entry: StoredEntry,
    pub judged_day: Day,
    pub why: Expiry,
}

/// The entry's effective day (`model::lifecycle::effective_day`) on `today`.
pub fn entry_day(entry: &StoredEntry, today: Day) -> Day {
    effective_day(entry.last_use(), entry.result().tuned_at_unix_ms, today)
}

/// Which entries of `map` expire on `today`: every one past its retention, then, of those
/// left, the least recently used past `max_entries`, then past `max_bytes` (ties in key
/// order, so every node holding the same entries and uses cuts the same ones). In key order.
pub fn plan_expiry(map: &EntryMap, settings: &LifecycleSettings, today: Day) -> Vec<Expiring> {
    let retention = &settings.retention;
    let mut expiring = Vec::new();
    let (mut live, mut live_bytes) = (0u64, 0u64);
    for entry in map.iter() {
        let day = entry_day(entry, today);
        if retention.expired(entry.namespace(), day, today) {
            expiring.push(Expiring {
                entry: entry.clone(),
                judged_day: day,
                why: Expiry::Age,
            });
        } else {
            live += 1;
            live_bytes += settings.bytes_of(entry);
        }
    }
    let over_count = settings.max_entries > 0 && live > settings.max_entries;
    let over_bytes = settings.max_bytes > 0 && live_bytes > settings.max_bytes;
    if !(over_count || over_bytes) {
        return expiring;
    }
    // The entries left, in key order: their day and size, and whether a bound cuts them.
    let left: Vec<&StoredEntry> = map
        .iter()
        .filter(|entry| !retention.expired(entry.namespace(), entry_day(entry, today), today))
        .collect();
    let days: Vec<(Day, u64)> = left
        .iter()
        .map(|entry| (entry_day(entry, today), settings.bytes_of(entry)))
        .collect();
    let mut cut = vec![false; left.len()];
    let bounds = [
        (over_count, settings.max_entries, false),
        (over_bytes, settings.max_bytes, true),
    ];
    for (over, max, by_bytes) in bounds {
        if !over {
            continue;
        }
        let weight = |bytes: u64| if by_bytes { bytes } else { 1 };
        let remaining = days
            .iter()
            .zip(&cut)
            .filter(|(_, cut)| !**cut)
            .map(|((day, bytes), _)| (*day, weight(*bytes)));
        let Some(lru) = LruCut::plan_weighted(remaining, max) else {
            continue;
        };
        let mut taken = 0;
        for ((day, bytes), cut) in days.iter().zip(cut.iter_mut()) {
            if !*cut && lru.cuts_weighted(*day, weight(*bytes), &mut taken) {
                *cut = true;
            }
        }
    }
    for ((entry, (day, _)), cut) in left.iter().zip(&days).zip(&cut) {
        if *cut {
            expiring.push(Expiring {
                entry: (*entry).clone(),
                judged_day: *day,
                why: Expiry::Bound,
            });
        }
    }
    expiring.sort_by(|a, b| a.entry.cmp(&b.entry));
    expiring
}

/// Whether the writer still drops `expiring` now: the map holds that very entry, and no use
/// after the day it was judged by has come.
pub fn still_expires(map: &EntryMap, expiring: &Expiring, today: Day) -> bool {
    let Some(held) = map.get_view(&expiring.entry.key()) else {
        return false;
    };
    held.same_entry(&expiring.entry) && entry_day(held, today) <= expiring.judged_day
}

/// One group of `tunecache du`: entries, their bytes, the artifact bytes they name, and
/// their last-use ages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    /// Bytes of the entries' records: what memory and the journal hold for them.
    pub entry_bytes: u64,
    /// Bytes of the artifacts they name (each named file counted once per entry).
    pub artifact_bytes: u64,
    /// Entries per `AgeBucket`, in `AgeBucket::ALL` order.
    pub by_age: [u64; 5],
}

/// What `du` groups by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageBy {
    Namespace,
    Device,
    Op,
}

/// The usage of `map` on `today`, per group, in group order.
pub fn usage(map: &EntryMap, by: UsageBy, today: Day) -> BTreeMap<String, Usage> {
    let mut groups: BTreeMap<String, Usage> = Default::default();
    for entry in map.iter() {
        let (key, result) = entry.views();
        let group = match by {
            UsageBy::Namespace => key.namespace,
            UsageBy::Device => key.device,
            UsageBy::Op => key.op,
        };
        let usage = match groups.get_mut(group) {
            Some(usage) => usage,
            None => groups.entry(group.to_owned()).or_default(),
        };
        usage.entries += 1;
        usage.entry_bytes += entry.record().len() as u64;
        usage.artifact_bytes += result
            .artifacts
            .iter()
            .map(|artifact| artifact.size)
            .sum::<u64>();
        let age = today.saturating_sub(entry_day(entry, today));
        usage.by_age[AgeBucket::of(age).index()] += 1;
    }
    groups
}

/// What `tunecache prune` expires: the entries of `namespace` and `device` (empty: any)
/// whose last use is more than `unused_for_days` before `today`. In key order.
pub fn plan_prune(
    map: &EntryMap,
    today: Day,
    unused_for_days: u32,
    namespace: &str,
    device: &str,
) -> Vec<StoredEntry> {
    let wanted = |entry: &&StoredEntry| {
        (namespace.is_empty() || entry.namespace() == namespace)
            && (device.is_empty() || entry.device() == device)
            && today.saturating_sub(entry_day(entry, today)) > unused_for_days
    };
    let entries: Box<dyn Iterator<Item = &StoredEntry>> = if namespace.is_empty() {
        Box::new(map.iter())
    } else {
        Box::new(
            map.range_from(std::ops::Bound::Included(
                crate::model::entry::KeyView::namespace_start(namespace),
            ))
            .take_while(|entry| entry.namespace() == namespace),
        )
    };
    entries.filter(wanted).cloned().collect()
}

/// `usage`'s groups as Stats carries them.
pub fn usage_groups(groups: &BTreeMap<String, Usage>) -> Vec<tunecache_proto::v1::UsageGroup> {
    groups
        .iter()
        .map(|(name, usage)| tunecache_proto::v1::UsageGroup {
            name: name.clone(),
            entries: usage.entries,
            entry_bytes: usage.entry_bytes,
            artifact_bytes: usage.artifact_bytes,
            by_age: usage.by_age.to_vec(),
        })
        .collect()
}

fn saturating(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The metric `namespace_entries{namespace, age}`: Stats' `namespace_usage` by age bucket.
pub fn entries_by_namespace_and_age(stats: &StatsResponse) -> Vec<(Labels, i64)> {
    let mut samples = Vec::new();
    for group in &stats.namespace_usage {
        for (bucket, count) in AgeBucket::ALL.iter().zip(&group.by_age) {
            let labels = vec![
                ("namespace", group.name.clone()),
                ("age", bucket.label().to_owned()),
            ];
            samples.push((labels, saturating(*count)));
        }
    }
    samples
}

/// The metric `namespace_bytes{namespace, of}`: entry and artifact bytes per namespace.
pub fn bytes_by_namespace(stats: &StatsResponse) -> Vec<(Labels, i64)> {
    let mut samples = Vec::new();
    for group in &stats.namespace_usage {
        for (of, bytes) in [
            ("entries", group.entry_bytes),
            ("artifacts", group.artifact_bytes),
        ] {
            let labels = vec![("namespace", group.name.clone()), ("of", of.to_owned())];
            samples.push((labels, saturating(bytes)));
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::lifecycle::MS_PER_DAY;

    const DAY: Day = 20_000;

    fn entry(namespace: &str, problem: &str, last_use: Day) -> StoredEntry {
        let key = CacheKey {
            namespace: namespace.into(),
            op: "op".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank: None,
        };
        let result = TunedResult {
            config: "{}".into(),
            time_us: 1.0,
            tuned_by: "t".into(),
            // Recorded long before any use.
            tuned_at_unix_ms: MS_PER_DAY,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        StoredEntry::new(&key, &result).with_last_use(last_use)
    }

    fn settings(retain: u32, max_entries: u64) -> LifecycleSettings {
        LifecycleSettings {
            retention: Retention::new(retain, [("forever".to_owned(), 0)]),
            max_entries,
            clock: Clock::manual(i64::from(DAY) * MS_PER_DAY),
            ..LifecycleSettings::default()
        }
    }

    fn problems(expiring: &[Expiring]) -> Vec<String> {
        expiring
            .iter()
            .map(|e| e.entry.key().problem.to_owned())
            .collect()
    }

    #[test]
    fn age_expires_what_is_older_than_its_namespace_keeps() {
        let mut map = EntryMap::new();
        map.insert(entry("ns", "old", DAY - 31));
        map.insert(entry("ns", "edge", DAY - 30));
        map.insert(entry("ns", "fresh", DAY));
        map.insert(entry("forever", "ancient", 1));
        let planned = plan_expiry(&map, &settings(30, 0), DAY);
        assert_eq!(problems(&planned), ["old"]);
        assert!(planned.iter().all(|e| e.why == Expiry::Age));
    }

    #[test]
    fn the_bound_keeps_exactly_the_most_recently_used() {
        let mut map = EntryMap::new();
        for i in 0..10u32 {
            map.insert(entry("ns", &format!("p{i}"), DAY - (i % 5)));
        }
        let planned = plan_expiry(&map, &settings(0, 4), DAY);
        assert_eq!(planned.len(), 6);
        assert!(planned.iter().all(|e| e.why == Expiry::Bound));
        let kept: Vec<_> = map
            .iter()
            .filter(|e| !planned.iter().any(|p| p.entry.same_entry(e)))
            .map(|e| e.last_use())
            .collect();
        // Two used today (p0, p5), two yesterday (p1, p6).
        assert_eq!(kept, [DAY, DAY - 1, DAY, DAY - 1]);
    }

    #[test]
    fn the_byte_bound_keeps_the_most_recently_used_within_its_bytes() {
        let mut map = EntryMap::new();
        for i in 0..10u32 {
            map.insert(entry("ns", &format!("p{i}"), DAY - i));
        }
        let one = LifecycleSettings::default().bytes_of(map.iter().next().unwrap());
        let settings = LifecycleSettings {
            max_bytes: 3 * (one + 100) + 50,
            overhead_bytes: 100,
            ..settings(0, 0)
        };
        let planned = plan_expiry(&map, &settings, DAY);
        assert_eq!(planned.len(), 7);
        assert!(planned.iter().all(|e| e.why == Expiry::Bound));
        let kept: Vec<_> = map
            .iter()
            .filter(|e| !planned.iter().any(|p| p.entry.same_entry(e)))
            .map(|e| e.last_use())
            .collect();
        assert_eq!(kept, [DAY, DAY - 1, DAY - 2]);
        // Both bounds: the count cuts first, the bytes then cut what is left.
        let both = LifecycleSettings {
            max_entries: 2,
            ..settings
        };
        assert_eq!(plan_expiry(&map, &both, DAY).len(), 8);
    }

    #[test]
    fn a_use_after_the_plan_saves_the_entry() {
        let mut map = EntryMap::new();
        let old = entry("ns", "old", DAY - 40);
        map.insert(old.clone());
        let planned = plan_expiry(&map, &settings(30, 0), DAY);
        assert!(still_expires(&map, &planned[0], DAY));
        old.raise_last_use(DAY);
        assert!(!still_expires(&map, &planned[0], DAY));
    }

    #[test]
    fn prune_takes_what_is_unused_for_longer_than_asked_in_its_scope() {
        let mut map = EntryMap::new();
        map.insert(entry("a", "old", DAY - 10));
        map.insert(entry("a", "new", DAY - 2));
        map.insert(entry("b", "old", DAY - 10));
        let problems_of = |pruned: Vec<StoredEntry>| -> Vec<String> {
            pruned
                .iter()
                .map(|e| format!("{}/{}", e.namespace(), e.key().problem))
                .collect()
        };
        assert_eq!(
            problems_of(plan_prune(&map, DAY, 5, "", "")),
            ["a/old", "b/old"]
        );
        assert_eq!(problems_of(plan_prune(&map, DAY, 5, "b", "")), ["b/old"]);
        assert_eq!(
            problems_of(plan_prune(&map, DAY, 1, "a", "dev")),
            ["a/new", "a/old"]
        );
        assert!(plan_prune(&map, DAY, 5, "a", "other").is_empty());
    }

    #[test]
    fn usage_groups_entries_and_their_ages() {
        let mut map = EntryMap::new();
        map.insert(entry("a", "1", DAY));
        map.insert(entry("a", "2", DAY - 10));
        map.insert(entry("b", "1", DAY - 100));
        let usage = usage(&map, UsageBy::Namespace, DAY);
        assert_eq!(usage["a"].entries, 2);
        assert_eq!(usage["a"].by_age, [1, 0, 1, 0, 0]);
        assert_eq!(usage["b"].by_age, [0, 0, 0, 0, 1]);
        assert!(usage["a"].entry_bytes > 0);
    }
}
