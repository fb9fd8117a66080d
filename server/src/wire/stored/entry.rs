//! One stored entry: its record bytes, its interned vocabulary, where its problem is, its
//! rank; ordered by key without parsing.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::Arc;

use triomphe::ThinArc;

use equivalent::{Comparable, Equivalent};

use crate::model::entry::{CacheKey, KeyView, ResultView, TunedResult};

use super::codec::*;
use super::vocab::*;

/// One cache entry in wire form. Cloning it is a reference-count increment.
///
/// Equality and order are those of its key (the index's); `same_entry` also compares the
/// result.
///
/// Beside its bytes, in the same allocation, it holds the day its key was last used
/// (`model::lifecycle`): an atomic, so a read marks it without the writer, and shared by every
/// version of the map that holds the entry. A thin pointer with the length in the allocation
/// keeps the entry as small as a fat `Arc<[u8]>` did.
#[derive(Clone)]
pub struct StoredEntry {
    /// The field-1 `Entry` record, behind the key's last use (a `Day`, 0: none known).
    record: ThinArc<AtomicU32, u8>,
    pub(super) vocab: Arc<Vocab>,
    /// Where the problem's bytes lie in `record`. Every entry is far below 4 GiB: key fields
    /// and configs are bounded by validation, journal frames by 16 MiB.
    problem_at: u32,
    problem_len: u32,
    pub(super) rank: Option<u32>,
}

thread_local! {
    /// Where records are encoded before being copied into their one exact-size allocation.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl StoredEntry {
    pub fn new(key: &CacheKey, result: &TunedResult) -> StoredEntry {
        StoredEntry::from_views(&key.view(), &result.view())
    }

    pub fn from_views(key: &KeyView<'_>, result: &ResultView<'_>) -> StoredEntry {
        StoredEntry::with_vocab(key, result, intern(key.namespace, key.op, key.device))
    }

    /// `from_views` for a bulk reader, which interns through the vocabularies it met last.
    pub fn from_views_in(
        key: &KeyView<'_>,
        result: &ResultView<'_>,
        recent: &mut RecentVocabs,
    ) -> StoredEntry {
        StoredEntry::with_vocab(
            key,
            result,
            recent.intern(key.namespace, key.op, key.device),
        )
    }

    fn with_vocab(key: &KeyView<'_>, result: &ResultView<'_>, vocab: Arc<Vocab>) -> StoredEntry {
        let (record, problem_at) = SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            scratch.clear();
            let problem_at = put_record(key, result, &mut scratch);
            let record = ThinArc::from_header_and_slice(AtomicU32::new(0), scratch.as_slice());
            // A huge config must not stay reserved on this thread.
            if scratch.capacity() > 256 * 1024 {
                *scratch = Vec::new();
            }
            (record, problem_at)
        });
        StoredEntry {
            record,
            vocab,
            problem_at: problem_at as u32,
            problem_len: key.problem.len() as u32,
            rank: key.rank,
        }
    }

    /// The field-1 `Entry` record: what a Lookup hit or Scan entry sends.
    pub fn record(&self) -> &[u8] {
        &self.record.slice
    }

    /// The day (`model::lifecycle::Day`) this entry's key was last used, as this node knows
    /// it; 0 when it knows none.
    pub fn last_use(&self) -> u32 {
        self.record.header.header.load(AtomicOrdering::Relaxed)
    }

    /// Raises the key's last use to `day`: true when it was earlier (the caller is the one
    /// that raised it, so each raise is reported once, however many readers race).
    pub fn raise_last_use(&self, day: u32) -> bool {
        let last_use = &self.record.header.header;
        // A plain load first: a key read many times a day costs its readers no shared write.
        last_use.load(AtomicOrdering::Relaxed) < day
            && last_use.fetch_max(day, AtomicOrdering::Relaxed) < day
    }

    /// This entry with `day` as its last use when that is later: what a new result of a key
    /// carries over from the one it replaces.
    pub fn with_last_use(self, day: u32) -> StoredEntry {
        self.raise_last_use(day);
        self
    }

    pub fn namespace(&self) -> &str {
        self.vocab.namespace()
    }

    pub fn device(&self) -> &str {
        self.vocab.device()
    }

    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    pub(super) fn problem_bytes(&self) -> &[u8] {
        let at = self.problem_at as usize;
        &self.record.slice[at..at + self.problem_len as usize]
    }

    fn parsed(&self) -> (KeyView<'_>, ResultView<'_>) {
        let parsed = parse_record(self.record());
        debug_assert!(parsed.is_some(), "a stored record always parses");
        parsed.unwrap_or((EMPTY_KEY, EMPTY_RESULT))
    }

    pub fn key(&self) -> KeyView<'_> {
        let problem = std::str::from_utf8(self.problem_bytes());
        debug_assert!(problem.is_ok(), "copied from a str");
        KeyView {
            namespace: &self.vocab.namespace,
            op: &self.vocab.op,
            device: &self.vocab.device,
            problem: problem.unwrap_or_default(),
            rank: self.rank,
        }
    }

    pub fn result(&self) -> ResultView<'_> {
        self.parsed().1
    }

    pub fn views(&self) -> (KeyView<'_>, ResultView<'_>) {
        self.parsed()
    }

    pub fn to_pair(&self) -> (CacheKey, TunedResult) {
        let (key, result) = self.parsed();
        (key.to_key(), result.to_result())
    }

    /// Same key and same result.
    pub fn same_entry(&self, other: &StoredEntry) -> bool {
        self.record.ptr() == other.record.ptr() || self.record() == other.record()
    }

    /// `KeyView::encoded_len_estimate` plus `ResultView::encoded_len_estimate`: the
    /// journal's measure of an entry.
    pub fn encoded_len_estimate(&self) -> usize {
        let (key, result) = self.parsed();
        key.encoded_len_estimate() + result.encoded_len_estimate()
    }

    /// Orders a borrowed key against this entry's key, as `CacheKey` orders.
    fn cmp_view(&self, key: &KeyView<'_>) -> Ordering {
        self.vocab
            .cmp_strs(key.namespace, key.op, key.device)
            .then_with(|| self.problem_bytes().cmp(key.problem.as_bytes()))
            .then_with(|| self.rank.cmp(&key.rank))
    }
}

impl std::fmt::Debug for StoredEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (key, result) = self.parsed();
        f.debug_struct("StoredEntry")
            .field("key", &key)
            .field("result", &result)
            .finish()
    }
}

impl Ord for StoredEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_vocab(&self.vocab, &other.vocab)
            .then_with(|| self.problem_bytes().cmp(other.problem_bytes()))
            .then_with(|| self.rank.cmp(&other.rank))
    }
}

impl PartialOrd for StoredEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for StoredEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for StoredEntry {}

impl Equivalent<StoredEntry> for KeyView<'_> {
    fn equivalent(&self, entry: &StoredEntry) -> bool {
        entry.cmp_view(self) == Ordering::Equal
    }
}

impl Comparable<StoredEntry> for KeyView<'_> {
    fn compare(&self, entry: &StoredEntry) -> Ordering {
        entry.cmp_view(self).reverse()
    }
}

/// A key whose (namespace, op, device) is already resolved to its interned `Vocab`: against
/// an entry of the same vocabulary the comparison is a pointer test, then the problem.
/// Orders exactly as `KeyView` (and `CacheKey`).
pub(super) struct VocabKey<'a> {
    pub(super) vocab: &'a Arc<Vocab>,
    pub(super) problem: &'a str,
    pub(super) rank: Option<u32>,
}

impl Equivalent<StoredEntry> for VocabKey<'_> {
    fn equivalent(&self, entry: &StoredEntry) -> bool {
        self.compare(entry) == Ordering::Equal
    }
}

impl Comparable<StoredEntry> for VocabKey<'_> {
    fn compare(&self, entry: &StoredEntry) -> Ordering {
        cmp_vocab(self.vocab, &entry.vocab)
            .then_with(|| self.problem.as_bytes().cmp(entry.problem_bytes()))
            .then_with(|| self.rank.cmp(&entry.rank))
    }
}
