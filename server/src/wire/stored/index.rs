//! The ordered index of stored entries (the cache map), looked up by key views.

use std::ops::Bound;

use crate::model::entry::{CacheKey, EntryViews, KeyView, ResultView};
use crate::model::forget::{drops, Tombstone};
use crate::model::tombstones::Tombstones;

use super::entry::*;
use super::vocab::*;

/// One immutable version of the cache (or of this node's own contributions): the stored
/// entries in key order. Cloning is O(1) (structural sharing); so is sharing an entry between
/// versions and between the cache and the own-contributions map.
#[derive(Clone, Default)]
pub struct EntryMap {
    index: imbl::OrdMap<StoredEntry, ()>,
}

impl EntryMap {
    pub fn new() -> EntryMap {
        EntryMap::default()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn get(&self, key: &CacheKey) -> Option<&StoredEntry> {
        self.get_view(&key.view())
    }

    pub fn get_view(&self, key: &KeyView<'_>) -> Option<&StoredEntry> {
        self.index.get_key_value(key).map(|(entry, ())| entry)
    }

    /// The entry held for `entry`'s key: a lookup that compares vocabularies by pointer.
    pub fn get_entry(&self, entry: &StoredEntry) -> Option<&StoredEntry> {
        self.index.get_key_value(entry).map(|(held, ())| held)
    }

    /// The entries of `keys` the map holds, in the order asked (misses left out): a Lookup.
    pub fn get_many<'k, I>(&self, keys: I) -> Vec<&StoredEntry>
    where
        I: Iterator<Item = KeyView<'k>> + Clone,
    {
        let mut found = Vec::with_capacity(keys.size_hint().0);
        self.for_each_key(keys, |entry| found.extend(entry));
        found
    }

    /// The entry of each of `keys`, `None` for a miss, in the order asked: a Lookup in a view.
    pub fn get_each<'k, I>(&self, keys: I) -> Vec<Option<&StoredEntry>>
    where
        I: Iterator<Item = KeyView<'k>> + Clone,
    {
        let mut each = Vec::with_capacity(keys.size_hint().0);
        self.for_each_key(keys, |entry| each.push(entry));
        each
    }

    /// Calls `found` with the entry of each of `keys` (`None`: a miss), in order.
    /// Each run of keys with equal (namespace, op, device) is resolved to its interned
    /// vocabulary once, so the index compares those fields by pointer instead of by bytes (the
    /// comparisons were a third of a 1,000-key Lookup), and keys of a vocabulary no entry has
    /// are misses without a search.
    fn for_each_key<'k, 's, I>(&'s self, keys: I, mut found: impl FnMut(Option<&'s StoredEntry>))
    where
        I: Iterator<Item = KeyView<'k>> + Clone,
    {
        let runs = find_vocab_runs(keys.clone());
        let mut keys = keys;
        for (vocab, len) in &runs {
            let run = keys.by_ref().take(*len);
            let Some(vocab) = vocab else {
                run.for_each(|_| found(None));
                continue;
            };
            for key in run {
                let probe = VocabKey {
                    vocab,
                    problem: key.problem,
                    rank: key.rank,
                };
                found(self.index.get_key_value(&probe).map(|(entry, ())| entry));
            }
        }
    }

    /// Whether the map holds this very entry (same key and result).
    pub fn contains(&self, entry: &StoredEntry) -> bool {
        self.index
            .get_key_value(entry)
            .is_some_and(|(held, ())| held.same_entry(entry))
    }

    /// Inserts `entry`, replacing the entry of the same key; whether the key is new.
    pub fn insert(&mut self, entry: StoredEntry) -> bool {
        self.index.insert(entry, ()).is_none()
    }

    /// Removes the entry of `entry`'s key, and returns it.
    pub fn remove(&mut self, entry: &StoredEntry) -> Option<StoredEntry> {
        self.index.remove_with_key(entry).map(|(held, ())| held)
    }

    /// Whether `other` is this very version (a copy not changed since).
    pub fn ptr_eq(&self, other: &EntryMap) -> bool {
        self.index.ptr_eq(&other.index)
    }

    /// Removes the entries `tombstone` drops (`forget::drops`) and returns them.
    pub fn remove_dropped_by(&mut self, tombstone: &Tombstone) -> Vec<StoredEntry> {
        let dropped = |entry: &&StoredEntry| drops(tombstone, &entry.key(), &entry.result());
        let doomed: Vec<StoredEntry> = match tombstone.scope.exact_key() {
            Some(key) => self
                .get(&key)
                .filter(dropped)
                .cloned()
                .into_iter()
                .collect(),
            // Only the range of the scope's leading fields: O(log n + what it holds).
            None => {
                let scope = &tombstone.scope;
                self.range_from(Bound::Included(scope.first_key()))
                    .take_while(|entry| scope.in_leading_range(&entry.key()))
                    .filter(dropped)
                    .cloned()
                    .collect()
            }
        };
        for entry in &doomed {
            self.index.remove(entry);
        }
        doomed
    }

    /// Removes the entries any of `tombstones` drops; returns their estimated journal bytes
    /// (`StoredEntry::encoded_len_estimate`). One floor lookup per entry: what replay does
    /// once, cheaper than a walk per tombstone when they outnumber the entries.
    pub fn remove_dropped_by_any(&mut self, tombstones: &Tombstones) -> u64 {
        if tombstones.is_empty() {
            return 0;
        }
        let doomed: Vec<StoredEntry> = self
            .index
            .keys()
            .filter(|entry| tombstones.drops_epoch(&entry.key(), || entry.result().forget_epoch))
            .cloned()
            .collect();
        for entry in &doomed {
            self.index.remove(entry);
        }
        doomed
            .iter()
            .map(|entry| entry.encoded_len_estimate() as u64)
            .sum()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = &StoredEntry> + '_ {
        self.index.keys()
    }

    /// The entries from `start` on, in key order.
    pub fn range_from(&self, start: Bound<KeyView<'_>>) -> impl Iterator<Item = &StoredEntry> {
        self.index
            .range((start, Bound::Unbounded))
            .map(|(entry, ())| entry)
    }
}

impl FromIterator<StoredEntry> for EntryMap {
    fn from_iter<I: IntoIterator<Item = StoredEntry>>(entries: I) -> Self {
        let mut map = EntryMap::new();
        for entry in entries {
            map.insert(entry);
        }
        map
    }
}

impl EntryViews for EntryMap {
    fn entry_count(&self) -> usize {
        self.len()
    }

    fn views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>)> + '_> {
        Box::new(self.iter().map(StoredEntry::views))
    }
}
