//! This node's uses of keys on their way into its next segment (`used`), and the entries
//! expiry dropped, which stop counting as published.
//!
//! The change feed tells the tier every last use that rose (`ChangeListener::used`); only
//! local ones (this node's ranks read the key, or a Record repeated a result held) are
//! published: a use another tier reported is its writer's to publish. Each key is held once
//! (a key read on many days is one use, its latest); the publish writes each key's entry as
//! the cache holds it then, with its day, so a reader that lacks the key learns entry and day
//! in one step, whatever order it reads the nodes' segments in.

use std::sync::Mutex;

use crate::store::{Source, UseChange};
use crate::sync::lock;
use crate::wire::stored::{EntryMap, StoredEntry};

/// What the feed told since the last publish.
#[derive(Default)]
pub(super) struct PendingUses {
    /// One entry per key used here, not yet published.
    used: Mutex<EntryMap>,
    /// Entries expiry dropped since the last publish: no compaction carries them again.
    expired: Mutex<Vec<StoredEntry>>,
}

impl PendingUses {
    /// Takes in the uses the feed told; returns whether any is this node's own (something to
    /// publish).
    pub(super) fn note(&self, uses: &[UseChange]) -> bool {
        let mut local = uses.iter().filter(|used| is_local(&used.source)).peekable();
        if local.peek().is_none() {
            return false;
        }
        let mut pending = lock(&self.used);
        for used in local {
            // The entry's day is the cache's own (raised in place), so the one held last is
            // never behind an earlier one of the same key.
            pending.insert(used.entry.clone());
        }
        true
    }

    /// The uses to publish now; `put_back` them if the publish fails.
    pub(super) fn take(&self) -> EntryMap {
        std::mem::take(&mut *lock(&self.used))
    }

    /// A publish failed: its uses go out with the next one (a key noted meanwhile keeps the
    /// newer entry).
    pub(super) fn put_back(&self, taken: EntryMap) {
        if taken.is_empty() {
            return;
        }
        let mut pending = lock(&self.used);
        for entry in taken.iter() {
            if pending.get_view(&entry.key()).is_none() {
                pending.insert(entry.clone());
            }
        }
    }

    /// Takes in entries expiry dropped.
    pub(super) fn note_expired(&self, entries: &[StoredEntry]) {
        lock(&self.expired).extend(entries.iter().cloned());
    }

    /// The entries expired since the last publish.
    pub(super) fn take_expired(&self) -> Vec<StoredEntry> {
        std::mem::take(&mut *lock(&self.expired))
    }
}

/// A use made on this node: its ranks read the key, or a Record (or the tuner) repeated a
/// result it holds. Uses reported by a tier (the shared directory, Redis) are their
/// writers' to publish, never republished.
pub(super) fn is_local(source: &Source) -> bool {
    matches!(source, Source::Read | Source::Record { .. } | Source::Tuner)
}

/// The uses as the cache holds their keys now: each key's current entry, with the later of
/// its day and the one noted (a new result carries over the day of the one it replaced, so
/// that is the cache's). A key no longer in the cache (expired, forgotten) is left out: a
/// use of what is gone must not bring it back elsewhere.
pub(super) fn current(taken: &EntryMap, cache: &EntryMap) -> EntryMap {
    taken
        .iter()
        .filter_map(|noted| {
            let held = cache.get_view(&noted.key())?;
            if held.last_use() >= noted.last_use() {
                return Some(held.clone());
            }
            // A copy, so the cache's entry is raised only by the writer, which journals it.
            let (key, result) = held.views();
            Some(StoredEntry::from_views(&key, &result).with_last_use(noted.last_use()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing;

    fn entry(problem: &str, time_us: f64) -> StoredEntry {
        StoredEntry::new(&testing::key(problem), &testing::result(time_us))
    }

    fn use_of(entry: &StoredEntry, day: u32, source: Source) -> UseChange {
        entry.raise_last_use(day);
        UseChange {
            entry: entry.clone(),
            day,
            source,
        }
    }

    #[test]
    fn only_local_uses_are_published_each_key_once_as_the_cache_holds_it() {
        let pending = PendingUses::default();
        let (p1, p2, p3) = (entry("p1", 1.0), entry("p2", 1.0), entry("p3", 1.0));
        assert!(!pending.note(&[
            use_of(&p1, 5, Source::Snapshot),
            use_of(&p2, 5, Source::Cluster)
        ]));
        assert!(pending.take().is_empty(), "reported by tiers: not ours");
        assert!(pending.note(&[
            use_of(&p1, 6, Source::Read),
            use_of(&p1, 7, Source::Read),
            use_of(&p2, 7, Source::Tuner),
            use_of(&p3, 7, Source::Record { lease: None }),
        ]));
        let taken = pending.take();
        assert_eq!(taken.len(), 3, "each key once");
        // p2 has a faster result now (the day carried over); p3 is gone from the cache.
        let faster = entry("p2", 0.5).with_last_use(3);
        let cache: EntryMap = [p1.clone(), faster].into_iter().collect();
        let used = current(&taken, &cache);
        let days: Vec<(String, f64, u32)> = used
            .iter()
            .map(|e| {
                let (key, result) = e.views();
                (key.problem.to_owned(), result.time_us, e.last_use())
            })
            .collect();
        assert_eq!(
            days,
            vec![("p1".into(), 1.0, 7), ("p2".into(), 0.5, 7)],
            "the cache's result, the latest day; nothing of a key gone"
        );
        // Not published: back for the next segment, behind a use noted meanwhile.
        pending.note(&[use_of(&entry("p1", 2.0), 9, Source::Read)]);
        pending.put_back(taken);
        let again = pending.take();
        assert_eq!(again.len(), 3);
        let p1_again = again.iter().find(|e| e.key().problem == "p1").unwrap();
        assert_eq!(p1_again.result().time_us, 2.0, "the newer use stays");
    }
}
