//! Replay (issue 52, docs/bundles.md): what it changes in a read. A daemon started with
//! `--replay` answers every key a bundle holds with the bundle's result, whatever the cache
//! holds ([`Replay::bundled`], and [`Replay::overlay_chunk`] for a Scan's chunk); a read in
//! replay (any read of such a daemon, or a Resolve that asks for it) never waits and never
//! takes a lease, and what it misses is listed per view of its uid (`misses`, the rules;
//! this is their adapter, with the clock and the log).

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::entry::{CacheKey, KeyView};
use crate::store::scan::Step;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::misses::{BoundHit, MissCaps, MissLog, Recorded, ViewMisses};
use super::pins::Answer;

/// Why a read in replay had no answer, as its Miss says.
pub const NOT_IN_ANY_BUNDLE: &str = "replay: not in any bundle";
pub const NOT_CACHED: &str = "replay: not cached on this node";

crate::report::stats_registry! {
    /// Replay's counters.
    #[derive(Default)]
    struct ReplayCounters {
        misses: AtomicU64 as replay_misses
            => counter(138, "Reads in replay (a replaying daemon's Lookups and Resolves, Resolves asking for replay) of keys with no answer."),
    }
}

/// The replay of this node: the bundles' entries when it replays, and the misses.
pub struct Replay {
    /// `Some` only on a daemon started with `--replay`: the entries of its bundles, which
    /// answer their keys.
    bundled: Option<Arc<EntryMap>>,
    misses: Mutex<MissLog>,
    counters: ReplayCounters,
}

impl Replay {
    /// `bundled`: the bundles' entries when the daemon replays (`--replay`), else `None`.
    pub fn new(bundled: Option<Arc<EntryMap>>, caps: MissCaps) -> Replay {
        Replay {
            bundled,
            misses: Mutex::new(MissLog::new(caps)),
            counters: ReplayCounters::default(),
        }
    }

    /// Whether the daemon replays (`--replay`): every read is in replay.
    pub fn daemon_replays(&self) -> bool {
        self.bundled.is_some()
    }

    /// The bundle's entry for `key`, when the daemon replays and a bundle holds it.
    pub fn bundled(&self, key: &KeyView<'_>) -> Option<&StoredEntry> {
        self.bundled.as_ref()?.get_view(key)
    }

    /// The reason a read in replay of a key with no answer gives.
    pub fn miss_reason(&self) -> &'static str {
        if self.daemon_replays() {
            NOT_IN_ANY_BUNDLE
        } else {
            NOT_CACHED
        }
    }

    /// `uid` read `key` in replay, in `view` ("" for none), and had no answer: counted and
    /// listed. Logged when the key is first listed in its view, and once per uid and bound
    /// past the list's bounds: the log is bounded as the list is.
    pub fn missed(&self, uid: u32, view: &str, key: &CacheKey) {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let recorded = crate::sync::lock(&self.misses).record(uid, view, key, unix_ms());
        match recorded {
            Recorded::Listed => {
                tracing::info!(uid, view, ?key, reason = self.miss_reason(), "replay miss");
            }
            Recorded::LeftOut { bound, first: true } => {
                let which = match bound {
                    BoundHit::KeysPerView => "keys per view",
                    BoundHit::KeysPerUid => "keys per uid",
                    BoundHit::ViewsPerUid => "views per uid",
                };
                tracing::warn!(
                    uid,
                    view,
                    bound = which,
                    "replay misses past a bound are counted (left_out), not listed; logged once per uid and bound"
                );
            }
            Recorded::Again | Recorded::LeftOut { first: false, .. } => {}
        }
    }

    /// The listed misses: `uid`'s (every uid's for `None`), of `view` only when given.
    pub fn list(&self, uid: Option<u32>, view: Option<&str>) -> Vec<(u32, String, ViewMisses)> {
        crate::sync::lock(&self.misses).list(uid, view)
    }

    /// A Scan's step with the bundles' entries over it (`overlay_chunk` within the Scan's
    /// filter).
    pub fn overlay_step(&self, step: &Step<'_>) -> Vec<StoredEntry> {
        let filter = step.filter;
        self.overlay_chunk(
            step.chosen,
            step.start,
            step.last,
            |entry| filter.in_namespace(entry),
            |entry| filter.matches(entry),
        )
    }

    /// A Scan's chunk with the bundles' entries over it when the daemon replays: `chosen`
    /// (the cache's matching entries from `start` to `end`, `None` meaning the end of the
    /// Scan, where `in_scan` stops holding) merged, in key order, with the bundled entries
    /// of that range that `keep` accepts, a bundled entry answering its key. Without
    /// replay, `chosen` as it is.
    pub fn overlay_chunk(
        &self,
        chosen: &[&StoredEntry],
        start: Bound<KeyView<'_>>,
        end: Option<&StoredEntry>,
        in_scan: impl Fn(&StoredEntry) -> bool,
        keep: impl Fn(&StoredEntry) -> bool,
    ) -> Vec<StoredEntry> {
        let Some(bundled) = &self.bundled else {
            return chosen.iter().map(|entry| (*entry).clone()).collect();
        };
        // The same merge as a view's pins over a chunk: a bundled entry is a pin that never
        // moves.
        let (answers, _) = super::pins::merge_chunk(bundled, chosen, start, end, in_scan, keep);
        answers
            .into_iter()
            .filter_map(|answer| match answer {
                Answer::Pinned(entry) | Answer::Candidate(entry) => Some(entry),
                Answer::Miss => None,
            })
            .collect()
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

crate::report::stats_registry! {
    /// Replay's Stats fields.
    impl FillStats for Replay {
        fn fill_stats(replay, stats) {
            let bundled = replay.bundled.as_ref().map_or(0, |bundled| bundled.len());
        }
        include ReplayCounters = replay.counters;
        fields {
            replay_bundled_entries = bundled as u64
                => gauge(139, "Entries the bundles answer on a daemon started with --replay (0 without)."),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{key, result};

    fn stored(problem: &str, time_us: f64) -> StoredEntry {
        StoredEntry::new(&key(problem), &result(time_us))
    }

    fn map(entries: &[StoredEntry]) -> EntryMap {
        let mut map = EntryMap::new();
        for entry in entries {
            map.insert(entry.clone());
        }
        map
    }

    #[test]
    fn a_replaying_chunk_answers_bundled_keys_with_the_bundle_and_adds_those_the_cache_lacks() {
        let bundle = map(&[stored("b", 9.0), stored("d", 9.0)]);
        let replay = Replay::new(
            Some(Arc::new(bundle)),
            super::super::misses::DEFAULT_MISS_CAPS,
        );
        let cache = [stored("a", 1.0), stored("b", 1.0), stored("c", 1.0)];
        let chosen: Vec<&StoredEntry> = cache.iter().collect();
        let merged = replay.overlay_chunk(&chosen, Bound::Unbounded, None, |_| true, |_| true);
        let got: Vec<(String, f64)> = merged
            .iter()
            .map(|entry| {
                let (key, result) = entry.to_pair();
                (key.problem, result.time_us)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), 1.0),
                ("b".into(), 9.0),
                ("c".into(), 1.0),
                ("d".into(), 9.0)
            ]
        );
    }

    #[test]
    fn without_replay_a_chunk_is_the_cache_and_nothing_is_bundled() {
        let replay = Replay::new(None, super::super::misses::DEFAULT_MISS_CAPS);
        let cache = [stored("a", 1.0)];
        let chosen: Vec<&StoredEntry> = cache.iter().collect();
        let merged = replay.overlay_chunk(&chosen, Bound::Unbounded, None, |_| true, |_| true);
        assert_eq!(merged.len(), 1);
        assert!(replay.bundled(&key("a").view()).is_none());
        assert_eq!(replay.miss_reason(), NOT_CACHED);
    }
}
