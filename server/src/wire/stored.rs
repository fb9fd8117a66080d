//! The cache's entries as they are kept in memory: each one in wire form, beside an ordered
//! index whose keys point into those bytes.
//!
//! A [`StoredEntry`] holds one `tunecache.v1.Entry`, encoded exactly as prost encodes it, as a
//! field-1 record (tag, length, message): the bytes a `LookupResponse` hit, a `ScanResponse`
//! entry and a `JournalBatch` own entry all are. Lookup, Scan and the journal copy them out;
//! nothing re-encodes them. Its namespace, op and device come from an interned [`Vocab`]
//! (a cache has a few dozen distinct values of each), its problem is found at an offset in the
//! record, and its rank is kept beside it: so the index orders entries without parsing them
//! or holding a separate allocation per field. One entry is one allocation (its bytes, shared
//! by every version of the map and by the own-contributions map that holds it).
//!
//! Decoded views ([`KeyView`], [`ResultView`], or owned `CacheKey`/`TunedResult`) are read from
//! the bytes on demand, for the merge rule, snapshots and the cluster tier.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::ops::Bound;
use std::sync::{Arc, Mutex, OnceLock};

use equivalent::{Comparable, Equivalent};
use prost::bytes::BufMut;
use prost::encoding::{
    self, decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, WireType,
};

use crate::model::entry::{CacheKey, EntryViews, KeyView, ResultView, TunedResult};

/// Field number of the repeated `Entry` in `LookupResponse.hits`, `ScanResponse.entries` and
/// `JournalBatch.entries`: the field a stored record is encoded as.
pub const ENTRY_FIELD: u32 = 1;

// --- Interned vocabulary ------------------------------------------------------------------

/// One interned (namespace, op, device): shared by every entry that has it.
#[derive(Debug)]
pub struct Vocab {
    namespace: Box<str>,
    op: Box<str>,
    device: Box<str>,
}

impl Vocab {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    fn cmp_strs(&self, namespace: &str, op: &str, device: &str) -> Ordering {
        (*self.namespace)
            .cmp(namespace)
            .then_with(|| (*self.op).cmp(op))
            .then_with(|| (*self.device).cmp(device))
    }
}

/// The interning table. A value no entry uses any more is dropped at the next sweep, which
/// runs when the table has doubled since the last one: a hostile stream of distinct names
/// costs what the entries holding them cost, not more.
struct Interner {
    hasher: RandomState,
    by_hash: HashMap<u64, Vec<Arc<Vocab>>>,
    len: usize,
    sweep_at: usize,
}

const MIN_SWEEP_AT: usize = 1024;

fn interner() -> &'static Mutex<Interner> {
    static INTERNER: OnceLock<Mutex<Interner>> = OnceLock::new();
    INTERNER.get_or_init(|| {
        Mutex::new(Interner {
            hasher: RandomState::new(),
            by_hash: HashMap::new(),
            len: 0,
            sweep_at: MIN_SWEEP_AT,
        })
    })
}

/// The shared `Vocab` for these three values (the same `Arc` for equal values while any
/// entry holds it).
pub fn intern(namespace: &str, op: &str, device: &str) -> Arc<Vocab> {
    let mut table = crate::sync::lock(interner());
    let hash = table.hasher.hash_one((namespace, op, device));
    if let Some(found) = table.find(hash, namespace, op, device) {
        return Arc::clone(found);
    }
    if table.len >= table.sweep_at {
        table.by_hash.retain(|_, bucket| {
            bucket.retain(|v| Arc::strong_count(v) > 1);
            !bucket.is_empty()
        });
        table.len = table.by_hash.values().map(Vec::len).sum();
        table.sweep_at = (2 * table.len).max(MIN_SWEEP_AT);
    }
    let vocab = Arc::new(Vocab {
        namespace: namespace.into(),
        op: op.into(),
        device: device.into(),
    });
    table
        .by_hash
        .entry(hash)
        .or_default()
        .push(Arc::clone(&vocab));
    table.len += 1;
    vocab
}

impl Interner {
    /// The interned value equal to these three, if any.
    fn find(&self, hash: u64, namespace: &str, op: &str, device: &str) -> Option<&Arc<Vocab>> {
        self.by_hash.get(&hash).and_then(|bucket| {
            bucket
                .iter()
                .find(|v| v.cmp_strs(namespace, op, device) == Ordering::Equal)
        })
    }
}

/// The interned `Vocab` of each run of consecutive keys with equal (namespace, op, device),
/// with the run's length, found under one lock of the interner (a Lookup's keys mostly share
/// a few). `None` for values never interned: every stored entry holds its interned `Vocab`
/// (a sweep drops only values no entry holds), so no entry has them.
fn find_vocab_runs<'k>(
    keys: impl Iterator<Item = KeyView<'k>>,
) -> Vec<(Option<Arc<Vocab>>, usize)> {
    let table = crate::sync::lock(interner());
    let mut runs: Vec<(Option<Arc<Vocab>>, usize)> = Vec::new();
    let mut run_names = None;
    for key in keys {
        let names = (key.namespace, key.op, key.device);
        if let (Some((_, len)), true) = (runs.last_mut(), run_names == Some(names)) {
            *len += 1;
            continue;
        }
        let hash = table.hasher.hash_one(names);
        let vocab = table
            .find(hash, key.namespace, key.op, key.device)
            .map(Arc::clone);
        runs.push((vocab, 1));
        run_names = Some(names);
    }
    runs
}

/// A key whose (namespace, op, device) is already resolved to its interned `Vocab`: against
/// an entry of the same vocabulary the comparison is a pointer test, then the problem.
/// Orders exactly as `KeyView` (and `CacheKey`).
struct VocabKey<'a> {
    vocab: &'a Arc<Vocab>,
    problem: &'a str,
    rank: Option<u32>,
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

fn cmp_vocab(a: &Arc<Vocab>, b: &Arc<Vocab>) -> Ordering {
    if Arc::ptr_eq(a, b) {
        Ordering::Equal
    } else {
        a.cmp_strs(&b.namespace, &b.op, &b.device)
    }
}

// --- Encoding -------------------------------------------------------------------------------

fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoded_len_varint(value.len() as u64) + value.len()
    }
}

fn put_string(tag: u32, value: &str, buf: &mut impl BufMut) {
    if !value.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(value.len() as u64, buf);
        buf.put_slice(value.as_bytes());
    }
}

fn key_body_len(key: &KeyView<'_>) -> usize {
    string_len(1, key.namespace)
        + string_len(2, key.op)
        + string_len(3, key.device)
        + string_len(4, key.problem)
        + key
            .rank
            .map_or(0, |rank| encoding::uint32::encoded_len(5, &rank))
}

fn result_body_len(result: &ResultView<'_>) -> usize {
    string_len(1, result.config)
        + if result.time_us != 0.0 {
            encoding::double::encoded_len(2, &result.time_us)
        } else {
            0
        }
        + string_len(3, result.tuned_by)
        + if result.tuned_at_unix_ms != 0 {
            encoding::int64::encoded_len(4, &result.tuned_at_unix_ms)
        } else {
            0
        }
}

/// A length-delimited field of a field number below 16 (one tag byte).
fn nested_len(body: usize) -> usize {
    1 + encoded_len_varint(body as u64) + body
}

/// Appends `Entry { key, result }` as a field-`ENTRY_FIELD` record, exactly as prost writes it
/// (same field order, defaults skipped). Returns where in `buf` the problem's bytes start.
fn put_record(key: &KeyView<'_>, result: &ResultView<'_>, buf: &mut Vec<u8>) -> usize {
    let key_body = key_body_len(key);
    let result_body = result_body_len(result);
    let entry_body = nested_len(key_body) + nested_len(result_body);
    buf.reserve(nested_len(entry_body));
    encode_key(ENTRY_FIELD, WireType::LengthDelimited, buf);
    encode_varint(entry_body as u64, buf);

    encode_key(1, WireType::LengthDelimited, buf);
    encode_varint(key_body as u64, buf);
    put_string(1, key.namespace, buf);
    put_string(2, key.op, buf);
    put_string(3, key.device, buf);
    let problem_at = buf.len() + string_len(4, key.problem) - key.problem.len();
    put_string(4, key.problem, buf);
    if let Some(rank) = key.rank {
        encoding::uint32::encode(5, &rank, buf);
    }

    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(result_body as u64, buf);
    put_string(1, result.config, buf);
    if result.time_us != 0.0 {
        encoding::double::encode(2, &result.time_us, buf);
    }
    put_string(3, result.tuned_by, buf);
    if result.tuned_at_unix_ms != 0 {
        encoding::int64::encode(4, &result.tuned_at_unix_ms, buf);
    }
    problem_at
}

// --- Decoding (our own records only) --------------------------------------------------------

fn take<'a>(buf: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    let (head, tail) = buf.split_at_checked(len)?;
    *buf = tail;
    Some(head)
}

/// Takes a length-delimited field's bytes (after its tag) from the front of `buf`.
pub(crate) fn take_delimited<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
    take(buf, len)
}

fn take_str<'a>(buf: &mut &'a [u8]) -> Option<&'a str> {
    std::str::from_utf8(take_delimited(buf)?).ok()
}

/// Reads a `tunecache.v1.Key` message body as prost decodes it (a repeated field: the last
/// value wins; `rank` truncated to 32 bits), as long as it holds only the declared fields in
/// their declared wire types; `None` for anything else (an unknown field, a bad length,
/// invalid UTF-8). The Lookup route reads request keys with it too (`lookup_request`).
pub(crate) fn parse_key(mut body: &[u8]) -> Option<KeyView<'_>> {
    let mut key = KeyView {
        namespace: "",
        op: "",
        device: "",
        problem: "",
        rank: None,
    };
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => key.namespace = take_str(&mut body)?,
            (2, WireType::LengthDelimited) => key.op = take_str(&mut body)?,
            (3, WireType::LengthDelimited) => key.device = take_str(&mut body)?,
            (4, WireType::LengthDelimited) => key.problem = take_str(&mut body)?,
            (5, WireType::Varint) => key.rank = Some(decode_varint(&mut body).ok()? as u32),
            _ => return None,
        }
    }
    Some(key)
}

fn parse_result(mut body: &[u8]) -> Option<ResultView<'_>> {
    let mut result = ResultView {
        config: "",
        time_us: 0.0,
        tuned_by: "",
        tuned_at_unix_ms: 0,
    };
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => result.config = take_str(&mut body)?,
            (2, WireType::SixtyFourBit) => {
                result.time_us = f64::from_le_bytes(take(&mut body, 8)?.try_into().ok()?);
            }
            (3, WireType::LengthDelimited) => result.tuned_by = take_str(&mut body)?,
            (4, WireType::Varint) => {
                result.tuned_at_unix_ms = decode_varint(&mut body).ok()? as i64
            }
            _ => return None,
        }
    }
    Some(result)
}

/// Reads a record written by `put_record`.
fn parse_record(mut record: &[u8]) -> Option<(KeyView<'_>, ResultView<'_>)> {
    if decode_key(&mut record).ok()? != (ENTRY_FIELD, WireType::LengthDelimited) {
        return None;
    }
    let mut body = take_delimited(&mut record)?;
    let mut key = None;
    let mut result = None;
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => key = Some(parse_key(take_delimited(&mut body)?)?),
            (2, WireType::LengthDelimited) => {
                result = Some(parse_result(take_delimited(&mut body)?)?);
            }
            _ => return None,
        }
    }
    Some((key?, result?))
}

const EMPTY_KEY: KeyView<'static> = KeyView {
    namespace: "",
    op: "",
    device: "",
    problem: "",
    rank: None,
};
const EMPTY_RESULT: ResultView<'static> = ResultView {
    config: "",
    time_us: 0.0,
    tuned_by: "",
    tuned_at_unix_ms: 0,
};

// --- Stored entries ---------------------------------------------------------------------

/// One cache entry in wire form. Cloning it is a reference-count increment.
///
/// Equality and order are those of its key (the index's); `same_entry` also compares the
/// result.
#[derive(Clone)]
pub struct StoredEntry {
    /// The field-1 `Entry` record.
    record: Arc<[u8]>,
    vocab: Arc<Vocab>,
    /// Where the problem's bytes lie in `record`. Every entry is far below 4 GiB: key fields
    /// and configs are bounded by validation, journal frames by 16 MiB.
    problem_at: u32,
    problem_len: u32,
    rank: Option<u32>,
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
        let vocab = intern(key.namespace, key.op, key.device);
        let (record, problem_at) = SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            scratch.clear();
            let problem_at = put_record(key, result, &mut scratch);
            let record: Arc<[u8]> = Arc::from(scratch.as_slice());
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
        &self.record
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

    fn problem_bytes(&self) -> &[u8] {
        let at = self.problem_at as usize;
        &self.record[at..at + self.problem_len as usize]
    }

    fn parsed(&self) -> (KeyView<'_>, ResultView<'_>) {
        let parsed = parse_record(&self.record);
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
        Arc::ptr_eq(&self.record, &other.record) || self.record == other.record
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

// --- The index --------------------------------------------------------------------------

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

    /// The entries of `keys` the map holds, in the order asked (misses left out): a Lookup.
    /// Each run of keys with equal (namespace, op, device) is resolved to its interned
    /// vocabulary once, so the index compares those fields by pointer instead of by bytes (the
    /// comparisons were a third of a 1,000-key Lookup), and keys of a vocabulary no entry has
    /// are misses without a search.
    pub fn get_many<'k, I>(&self, keys: I) -> Vec<&StoredEntry>
    where
        I: Iterator<Item = KeyView<'k>> + Clone,
    {
        let runs = find_vocab_runs(keys.clone());
        let mut keys = keys;
        let mut found = Vec::with_capacity(keys.size_hint().0);
        for (vocab, len) in &runs {
            let run = keys.by_ref().take(*len);
            let Some(vocab) = vocab else {
                run.for_each(drop);
                continue;
            };
            for key in run {
                let probe = VocabKey {
                    vocab,
                    problem: key.problem,
                    rank: key.rank,
                };
                if let Some((entry, ())) = self.index.get_key_value(&probe) {
                    found.push(entry);
                }
            }
        }
        found
    }

    /// Whether the map holds this very entry (same key and result).
    pub fn contains(&self, entry: &StoredEntry) -> bool {
        self.index
            .get_key_value(entry)
            .is_some_and(|(held, ())| held.same_entry(entry))
    }

    /// Inserts `entry`, replacing the entry of the same key.
    pub fn insert(&mut self, entry: StoredEntry) {
        self.index.insert(entry, ());
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use tunecache_proto::v1;

    fn key(namespace: &str, op: &str, device: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: namespace.into(),
            op: op.into(),
            device: device.into(),
            problem: problem.into(),
            rank,
        }
    }

    fn result(config: &str, time_us: f64, tuned_by: &str, at: i64) -> TunedResult {
        TunedResult {
            config: config.into(),
            time_us,
            tuned_by: tuned_by.into(),
            tuned_at_unix_ms: at,
        }
    }

    /// Keys whose order is easy to get wrong: empty fields, prefixes, NUL bytes, non-ASCII
    /// (bytes above 0x7f), rank `None` against `Some(0)`.
    fn awkward_keys() -> Vec<CacheKey> {
        let strings = [
            "",
            "a",
            "a\0",
            "a\0b",
            "ab",
            "b",
            "\u{e9}",
            "\u{1f600}",
            "\u{7f}",
            "Z",
        ];
        let mut keys = Vec::new();
        for (i, a) in strings.iter().enumerate() {
            for (j, b) in strings.iter().enumerate() {
                let rank = [None, Some(0), Some(u32::MAX)][(i + j) % 3];
                keys.push(key(a, b, strings[(i * 3 + j) % strings.len()], b, rank));
                keys.push(key("ns", a, "dev", b, rank));
                keys.push(key("ns", "op", a, b, None));
                keys.push(key("ns", "op", "dev", &format!("{a}{b}"), rank));
            }
        }
        keys
    }

    #[test]
    fn round_trips_every_field() {
        let pairs = [
            (key("", "", "", "", None), result("", 0.0, "", 0)),
            (
                key("trtllm", "gemm", "H200|sm_90", "m=1\0\u{e9}", Some(0)),
                result("{\"t\":1}", 1e-9, "node-\u{1f600}", i64::MIN),
            ),
            (
                key("n", "o", "d", &"p".repeat(5000), Some(u32::MAX)),
                result(&"c".repeat(70_000), f64::MAX, "t", i64::MAX),
            ),
        ];
        for (key, result) in &pairs {
            let entry = StoredEntry::new(key, result);
            assert_eq!(&entry.to_pair(), &(key.clone(), result.clone()));
            assert_eq!(entry.key(), key.view());
            assert_eq!(entry.result(), result.view());
            assert_eq!(entry.namespace(), key.namespace);
            assert_eq!(entry.device(), key.device);
            assert_eq!(entry.rank(), key.rank);
            assert_eq!(
                entry.encoded_len_estimate(),
                key.encoded_len_estimate() + result.encoded_len_estimate()
            );
            // The record is the field-1 `Entry` prost writes.
            let expected = v1::ScanResponse {
                entries: vec![crate::model::entry::to_wire_entry(key, result)],
            };
            assert_eq!(entry.record(), expected.encode_to_vec().as_slice());
        }
    }

    #[test]
    fn orders_exactly_as_cache_key() {
        let keys = awkward_keys();
        let stored: Vec<StoredEntry> = keys
            .iter()
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        for (a, sa) in keys.iter().zip(&stored) {
            for (b, sb) in keys.iter().zip(&stored) {
                assert_eq!(sa.cmp(sb), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(b.view().compare(sa), b.cmp(a), "{b:?} vs {a:?}");
                assert_eq!(a.view().order(&b.view()), a.cmp(b));
            }
        }
        // The map iterates in CacheKey order and finds every key by a borrowed view.
        let map: EntryMap = stored.iter().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        let iterated: Vec<CacheKey> = map.iter().map(|e| e.to_pair().0).collect();
        assert_eq!(iterated, sorted);
        for key in &keys {
            assert_eq!(map.get(key).map(|e| e.to_pair().0).as_ref(), Some(key));
        }
        assert!(map.get(&key("ns", "op", "dev", "absent", None)).is_none());
        // A range from a namespace's start holds exactly that namespace and what follows.
        let from: Vec<CacheKey> = map
            .range_from(Bound::Included(KeyView::namespace_start("ns")))
            .map(|e| e.to_pair().0)
            .collect();
        let expected: Vec<CacheKey> = sorted
            .iter()
            .filter(|k| k.namespace.as_str() >= "ns")
            .cloned()
            .collect();
        assert_eq!(from, expected);
    }

    #[test]
    fn get_many_finds_what_get_finds_in_request_order() {
        let keys = awkward_keys();
        let map: EntryMap = keys
            .iter()
            .step_by(2)
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        // Held keys, keys of a held vocabulary but absent, keys of a vocabulary never
        // interned, repeated keys, in an order unlike the map's.
        let mut asked: Vec<CacheKey> = keys.iter().rev().cloned().collect();
        asked.push(key("never-interned-ns", "op", "dev", "a", None));
        asked.extend(keys.iter().take(7).cloned());
        asked.push(key("ns", "op", "dev", "absent", None));
        let expected: Vec<CacheKey> = asked
            .iter()
            .filter_map(|k| map.get(k))
            .map(|e| e.to_pair().0)
            .collect();
        let found: Vec<CacheKey> = map
            .get_many(asked.iter().map(CacheKey::view))
            .into_iter()
            .map(|e| e.to_pair().0)
            .collect();
        assert!(expected.len() > keys.len() / 4, "{}", expected.len());
        assert_eq!(found, expected);
    }

    #[test]
    fn vocab_keys_order_exactly_as_cache_key() {
        let keys = awkward_keys();
        let stored: Vec<StoredEntry> = keys
            .iter()
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        for a in &keys {
            let vocab = intern(&a.namespace, &a.op, &a.device);
            let probe = VocabKey {
                vocab: &vocab,
                problem: &a.problem,
                rank: a.rank,
            };
            for (b, sb) in keys.iter().zip(&stored) {
                assert_eq!(probe.compare(sb), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn insert_replaces_the_entry_of_the_same_key() {
        let k = key("ns", "op", "dev", "p", Some(1));
        let mut map = EntryMap::new();
        map.insert(StoredEntry::new(&k, &result("{}", 2.0, "a", 1)));
        let better = StoredEntry::new(&k, &result("{}", 1.0, "b", 2));
        assert!(!map.contains(&better));
        map.insert(better.clone());
        assert_eq!(map.len(), 1);
        assert!(map.contains(&better));
        assert_eq!(map.get(&k).map(|e| e.result().tuned_by), Some("b"));
    }

    #[test]
    fn equal_vocabularies_are_one_allocation() {
        let a = StoredEntry::new(
            &key("trtllm", "gemm", "H200", "m=1", None),
            &result("{}", 1.0, "", 0),
        );
        let b = StoredEntry::new(
            &key("trtllm", "gemm", "H200", "m=2", Some(3)),
            &result("[]", 2.0, "x", 5),
        );
        let c = StoredEntry::new(
            &key("trtllm", "gemm", "H100", "m=1", None),
            &result("{}", 1.0, "", 0),
        );
        assert!(Arc::ptr_eq(&a.vocab, &b.vocab));
        assert!(!Arc::ptr_eq(&a.vocab, &c.vocab));
        // Fields are not confused across positions ("ab","c" vs "a","bc").
        let d = intern("ab", "c", "");
        let e = intern("a", "bc", "");
        assert!(!Arc::ptr_eq(&d, &e));
        assert_eq!((d.namespace(), e.namespace()), ("ab", "a"));
    }

    #[test]
    fn unused_vocabulary_is_swept() {
        // Distinct values nothing keeps: the table sweeps them instead of growing.
        for i in 0..(4 * MIN_SWEEP_AT) {
            drop(intern(&format!("sweep-{i}"), "op", "dev"));
        }
        let kept = intern("sweep-kept", "op", "dev");
        let table = interner().lock().unwrap();
        let sweep_values = table
            .by_hash
            .values()
            .flatten()
            .filter(|v| v.namespace().starts_with("sweep-"))
            .count();
        assert!(sweep_values <= 2 * MIN_SWEEP_AT, "{sweep_values} kept");
        drop(table);
        assert!(Arc::ptr_eq(&kept, &intern("sweep-kept", "op", "dev")));
    }
}
