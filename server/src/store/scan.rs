//! Scan: streams the entries matching a filter in bounded chunks, without pinning a cache
//! version for the life of the stream.
//!
//! Each chunk is read from the version current when the chunk is taken, starting after the
//! last key the previous chunk looked at (a range query on the ordered map), and the version is
//! released before the chunk is sent. A client that stops reading therefore holds at most the
//! chunks queued for it (one in the channel, one being sent), never a whole version of the
//! cache, however long it stalls and however much the cache changes meanwhile.
//!
//! The price: a Scan is not a point-in-time snapshot. Each chunk is consistent; across chunks,
//! a key present for the whole Scan is returned exactly once (with its value when its chunk was
//! read), and keys added or removed while it runs may or may not appear.
//!
//! What is sent for a chunk is its reader's ([`ChunkReader`]): the plain Scan sends the chosen
//! entries as they are ([`AsStored`]); a Scan in a job view (`views`) answers its pins.

use std::future::Future;
use std::ops::Bound;

use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::model::entry::KeyView;
use crate::store::Store;
use crate::tasks::Tasks;
use crate::wire::encoded::EncodedEntries;
use crate::wire::stored::{EntryMap, StoredEntry};

/// Chunks hold at most this many entries...
pub const CHUNK_ENTRIES: usize = 1024;
/// ...or about this many bytes, whichever comes first.
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// Entries looked at per version before it is released even if few matched (a filter that
/// matches little must not hold one version for a walk over the whole cache).
const EXAMINED_PER_STEP: usize = 64 * CHUNK_ENTRIES;
/// Chunks queued for a client beyond the one being sent.
const QUEUED_CHUNKS: usize = 1;

/// Which entries a Scan returns; empty strings and `None` match everything.
#[derive(Clone, Debug, Default)]
pub struct ScanFilter {
    pub namespace: String,
    pub device: String,
    /// `Some(n)`: rank n's own entries and the shared ones.
    pub rank: Option<u32>,
}

impl ScanFilter {
    /// Whether the Scan returns `entry` (its device and rank), within its namespace.
    pub fn matches(&self, entry: &StoredEntry) -> bool {
        (self.device.is_empty() || entry.device() == self.device)
            && (self.rank.is_none() || entry.rank().is_none() || entry.rank() == self.rank)
    }

    /// Whether `entry` lies in the Scan's namespace, where the Scan stops.
    pub fn in_namespace(&self, entry: &StoredEntry) -> bool {
        self.namespace.is_empty() || entry.namespace() == self.namespace
    }
}

/// One step of a Scan over `map`: the matching entries after `after` (from the start of the
/// namespace when `None`), up to the chunk limits, and the last key looked at when there may
/// be more (`None` once the Scan is complete).
/// The entry is kept only as a cursor: one entry's bytes, not a version.
fn choose<'m>(
    map: &'m EntryMap,
    filter: &ScanFilter,
    after: Option<&StoredEntry>,
) -> (Vec<&'m StoredEntry>, Option<StoredEntry>) {
    let mut chosen = Vec::new();
    let mut chosen_bytes = 0;
    let mut examined = 0;
    for entry in map.range_from(start_of(filter, after)) {
        if !filter.in_namespace(entry) {
            return (chosen, None);
        }
        examined += 1;
        if filter.matches(entry) {
            chosen.push(entry);
            chosen_bytes += entry.record().len();
        }
        if chosen.len() >= CHUNK_ENTRIES
            || chosen_bytes >= CHUNK_BYTES
            || examined >= EXAMINED_PER_STEP
        {
            return (chosen, Some(entry.clone()));
        }
    }
    (chosen, None)
}

/// Where the chunk after `after` starts.
fn start_of<'a>(filter: &'a ScanFilter, after: Option<&'a StoredEntry>) -> Bound<KeyView<'a>> {
    match after {
        Some(entry) => Bound::Excluded(entry.key()),
        None => Bound::Included(KeyView::namespace_start(&filter.namespace)),
    }
}

/// The chunk after `after` in wire form (its entries copied once, into a body of their exact
/// size), and the cursor for the next.
#[cfg(test)]
fn next_chunk(
    map: &EntryMap,
    filter: &ScanFilter,
    after: Option<&StoredEntry>,
) -> (EncodedEntries, Option<StoredEntry>) {
    let (chosen, last) = choose(map, filter, after);
    (EncodedEntries::from_entries(&chosen), last)
}

/// One chunk's worth of a Scan, read from one version of the cache.
pub struct Step<'m> {
    pub filter: &'m ScanFilter,
    /// The matching entries of the chunk, in key order.
    pub chosen: &'m [&'m StoredEntry],
    /// Where the chunk starts (after the previous chunk's last key).
    pub start: Bound<KeyView<'m>>,
    /// The last key the chunk looked at, when the Scan goes on after it.
    pub last: Option<&'m StoredEntry>,
}

/// What a Scan sends for each chunk: `plan` runs while the chunk's version is held and must
/// not wait; `finish` may wait (a view's pins go through the cluster tier), with no version
/// held.
pub trait ChunkReader: Send + Sync + 'static {
    type Planned: Send;

    fn plan(&self, step: Step<'_>) -> Self::Planned;

    fn finish(&self, planned: Self::Planned) -> impl Future<Output = EncodedEntries> + Send;
}

/// The plain Scan: the chosen entries, as stored.
pub struct AsStored;

impl ChunkReader for AsStored {
    type Planned = EncodedEntries;

    fn plan(&self, step: Step<'_>) -> EncodedEntries {
        EncodedEntries::from_entries(step.chosen)
    }

    async fn finish(&self, planned: EncodedEntries) -> EncodedEntries {
        planned
    }
}

/// Starts a Scan of `store` and returns its stream of chunks, each already in wire form (see
/// `wire`), as `reader` makes them. The Scan stops when the stream is dropped (the client
/// went away or cancelled).
/// The Scan runs as one of the daemon's `tasks`, so it ends when the daemon stops.
pub fn spawn(
    store: Store,
    filter: ScanFilter,
    reader: impl ChunkReader,
    tasks: &Tasks,
) -> ReceiverStream<Result<EncodedEntries, Status>> {
    let (chunks, receiver) = tokio::sync::mpsc::channel(QUEUED_CHUNKS);
    tasks.spawn(async move {
        let mut after: Option<StoredEntry> = None;
        loop {
            let (planned, last) = {
                // The version is dropped before anything below can wait.
                let map = store.current();
                let (chosen, last) = choose(&map, &filter, after.as_ref());
                // What a Scan returns is used (`lifecycle`).
                store.touch(chosen.iter().copied());
                let step = Step {
                    filter: &filter,
                    chosen: &chosen,
                    start: start_of(&filter, after.as_ref()),
                    last: last.as_ref(),
                };
                (reader.plan(step), last)
            };
            let entries = reader.finish(planned).await;
            if !entries.is_empty() && chunks.send(Ok(entries)).await.is_err() {
                return; // the caller went away
            }
            match last {
                Some(key) => after = Some(key),
                None => return,
            }
            if chunks.is_closed() {
                return;
            }
        }
    });
    ReceiverStream::new(receiver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use prost::Message;
    use tunecache_proto::v1;

    fn key(namespace: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: namespace.to_owned(),
            op: "gemm".to_owned(),
            device: "d".to_owned(),
            problem: problem.to_owned(),
            rank,
        }
    }

    fn result(config: &str) -> TunedResult {
        TunedResult {
            config: config.to_owned(),
            time_us: 1.0,
            tuned_by: "t".to_owned(),
            tuned_at_unix_ms: 0,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    fn problems(entries: &[v1::Entry]) -> Vec<String> {
        entries
            .iter()
            .map(|entry| entry.key.as_ref().unwrap().problem.clone())
            .collect()
    }

    /// A map of stored entries, filled like a `BTreeMap`.
    #[derive(Default)]
    struct CacheMap(EntryMap);

    impl CacheMap {
        fn new() -> CacheMap {
            CacheMap::default()
        }

        fn insert(&mut self, key: CacheKey, result: TunedResult) {
            self.0.insert(StoredEntry::new(&key, &result));
        }
    }

    /// Runs `next_chunk` to completion, calling `between` on the map after each step.
    fn scan_all(
        mut map: CacheMap,
        filter: &ScanFilter,
        mut between: impl FnMut(&mut CacheMap),
    ) -> Vec<Vec<v1::Entry>> {
        let mut chunks = Vec::new();
        let mut after = None;
        loop {
            let (chunk, last) = next_chunk(&map.0, filter, after.as_ref());
            chunks.push(
                v1::ScanResponse::decode(chunk.into_bytes())
                    .unwrap()
                    .entries,
            );
            match last {
                Some(key) => after = Some(key),
                None => return chunks,
            }
            between(&mut map);
        }
    }

    #[test]
    fn chunks_cover_the_namespace_once_with_the_entry_limit() {
        let mut map = CacheMap::new();
        for i in 0..2500 {
            map.insert(key("a", &format!("{i:05}"), None), result("{}"));
            map.insert(key("b", &format!("{i:05}"), None), result("{}"));
        }
        map.insert(key("a", "ranked", Some(3)), result("{}"));
        let filter = ScanFilter {
            namespace: "a".into(),
            rank: Some(1),
            ..ScanFilter::default()
        };
        let chunks = scan_all(map, &filter, |_| {});
        let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1024, 1024, 452]);
        let all: Vec<String> = chunks.iter().flat_map(|c| problems(c)).collect();
        let expected: Vec<String> = (0..2500).map(|i| format!("{i:05}")).collect();
        assert_eq!(
            all, expected,
            "in order, once each, rank 3's entry filtered out"
        );
    }

    #[test]
    fn byte_limit_cuts_chunks_of_large_configs() {
        let mut map = CacheMap::new();
        let big = format!("\"{}\"", "x".repeat(100 * 1024));
        for i in 0..30 {
            map.insert(key("a", &format!("{i:02}"), None), result(&big));
        }
        let chunks = scan_all(map, &ScanFilter::default(), |_| {});
        assert!(chunks.len() >= 3, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|c| c.len() <= 11));
        assert_eq!(chunks.iter().map(Vec::len).sum::<usize>(), 30);
    }

    #[test]
    fn keys_present_throughout_are_returned_once_while_the_cache_changes() {
        let mut map = CacheMap::new();
        for i in 0..5000 {
            map.insert(key("a", &format!("{i:05}"), None), result("{}"));
        }
        let mut step = 0;
        let chunks = scan_all(map, &ScanFilter::default(), |map| {
            // Between chunks: new keys on both sides of the cursor, and updates.
            step += 1;
            map.insert(key("a", &format!("00000-new-{step}"), None), result("{}"));
            map.insert(key("a", &format!("04999-new-{step}"), None), result("{}"));
            map.insert(key("a", "04000", None), result(&format!("{step}")));
        });
        let all: Vec<String> = chunks.iter().flat_map(|c| problems(c)).collect();
        for i in 0..5000 {
            let problem = format!("{i:05}");
            assert_eq!(
                all.iter().filter(|p| **p == problem).count(),
                1,
                "{problem}"
            );
        }
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted, "returned in key order");
    }
}
