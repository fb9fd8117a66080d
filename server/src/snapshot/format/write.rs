//! Writing a segment (or, for tests and benchmarks, a version-1 snapshot): the cache map
//! streamed straight into the writer in its sorted order, so the same content always gives
//! the same bytes, each entry with its last use, then the uses this node made of keys it
//! publishes no entry of now (`used`), and the MAC member last when the shared directory has
//! a key.

use std::io::Write;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::mac::{MacWriter, SharedKey};
use super::{TombstoneJson, FORMAT_NAME, FORMAT_VERSION, FORMAT_VERSION_V1};
use crate::model::entry::{KeyView, ResultView};
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;
use crate::wire::stored::EntryMap;

/// What a segment's entries are written from: entries in key order, each with the day its
/// key was last used (0: none known). The store's `EntryMap` carries the days; the decoded
/// maps tests build carry none.
pub trait SegmentEntries {
    fn entry_count(&self) -> usize;
    /// The entries in key order, each with its last use.
    fn dated_views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>, Day)> + '_>;
}

impl SegmentEntries for EntryMap {
    fn entry_count(&self) -> usize {
        self.len()
    }

    fn dated_views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>, Day)> + '_> {
        Box::new(self.iter().map(|entry| {
            let (key, result) = entry.views();
            (key, result, entry.last_use())
        }))
    }
}

/// For tests, which build entry maps from decoded entries (no last use known).
#[cfg(any(test, feature = "test-support"))]
impl SegmentEntries for crate::store::CacheMap {
    fn entry_count(&self) -> usize {
        self.len()
    }

    fn dated_views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>, Day)> + '_> {
        Box::new(
            self.iter()
                .map(|(key, result)| (key.view(), result.view(), 0)),
        )
    }
}

/// Serialises the map's entries as a JSON array without collecting them first.
struct EntriesInOrder<'a, M: ?Sized>(&'a M);

impl<M: SegmentEntries + ?Sized> Serialize for EntriesInOrder<'_, M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .dated_views()
                .map(|(key, result, last_used_day)| EntryRef {
                    key,
                    result,
                    last_used_day,
                }),
        )
    }
}

/// One entry as written: key and result fields side by side in one flat object.
struct EntryRef<'a> {
    key: KeyView<'a>,
    result: ResultView<'a>,
    last_used_day: Day,
}

impl Serialize for EntryRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = 8
            + usize::from(self.key.rank.is_some())
            + usize::from(self.result.forget_epoch != 0)
            + usize::from(!self.result.artifacts.is_empty())
            + usize::from(self.last_used_day != 0);
        let mut object = serializer.serialize_map(Some(fields))?;
        object.serialize_entry("namespace", &self.key.namespace)?;
        object.serialize_entry("op", &self.key.op)?;
        object.serialize_entry("device", &self.key.device)?;
        object.serialize_entry("problem", &self.key.problem)?;
        if let Some(rank) = self.key.rank {
            object.serialize_entry("rank", &rank)?;
        }
        object.serialize_entry("config", &self.result.config)?;
        object.serialize_entry("time_us", &self.result.time_us)?;
        object.serialize_entry("tuned_by", &self.result.tuned_by)?;
        object.serialize_entry("tuned_at_unix_ms", &self.result.tuned_at_unix_ms)?;
        // Written only once a Forget happened: files of caches that never forgot are the
        // bytes they always were.
        if self.result.forget_epoch != 0 {
            object.serialize_entry("forget_epoch", &self.result.forget_epoch)?;
        }
        // Likewise only for results that name files: `[{"name","sha256","size"}]`, in the
        // canonical (name) order.
        if !self.result.artifacts.is_empty() {
            let artifacts: Vec<ArtifactJson<'_>> = self
                .result
                .artifacts
                .iter()
                .map(|a| ArtifactJson {
                    name: a.name,
                    sha256: a.sha256,
                    size: a.size,
                })
                .collect();
            object.serialize_entry("artifacts", &artifacts)?;
        }
        // Likewise only once a use is known: the day travels with the entry, so a reader
        // that learns the entry learns how recently it was used in the same step.
        if self.last_used_day != 0 {
            object.serialize_entry("last_used_day", &self.last_used_day)?;
        }
        object.end()
    }
}

#[derive(Serialize)]
#[serde(bound = "")]
struct DocumentOut<'a, M: SegmentEntries + ?Sized> {
    format: &'static str,
    version: u64,
    node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seq: Option<u64>,
    written_at_unix_ms: i64,
    entry_count: usize,
    entries: EntriesInOrder<'a, M>,
    /// Uses this node made of keys since its last segment, as full entries with their day:
    /// transient facts, never carried into a compaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<EntriesInOrder<'a, EntryMap>>,
    #[serde(skip_serializing_if = "<[TombstoneJson]>::is_empty")]
    forgets: &'a [TombstoneJson],
}

/// What a segment carries beside its entries.
#[derive(Clone, Copy, Default)]
pub struct SegmentExtras<'a> {
    /// Uses of keys this node made since its last segment (`used`), each entry with its day.
    pub used: Option<&'a EntryMap>,
    /// Tombstones of Forgets made by this node (`forgets`).
    pub tombstones: &'a [Tombstone],
}

/// Writes `map` as one version-2 segment covering sequence numbers `first..=last` into `out`
/// (the caller buffers and flushes), ending with its MAC when `key` is given.
pub fn write_segment(
    out: impl Write,
    node: &str,
    seq: (u64, u64),
    written_at_unix_ms: i64,
    map: &(impl SegmentEntries + ?Sized),
    key: Option<&SharedKey>,
) -> serde_json::Result<()> {
    let extras = SegmentExtras::default();
    write_segment_with(out, node, seq, written_at_unix_ms, map, extras, key)
}

/// `write_segment`, carrying this node's uses and the tombstones of its Forgets too.
pub fn write_segment_with(
    out: impl Write,
    node: &str,
    (first, last): (u64, u64),
    written_at_unix_ms: i64,
    map: &(impl SegmentEntries + ?Sized),
    extras: SegmentExtras<'_>,
    key: Option<&SharedKey>,
) -> serde_json::Result<()> {
    let forgets: Vec<TombstoneJson> = extras.tombstones.iter().map(TombstoneJson::from).collect();
    let document = DocumentOut {
        format: FORMAT_NAME,
        version: FORMAT_VERSION,
        node,
        first_seq: Some(first),
        last_seq: Some(last),
        written_at_unix_ms,
        entry_count: map.entry_count(),
        entries: EntriesInOrder(map),
        // An empty list is left out: a segment without uses is the bytes it always was.
        used: extras
            .used
            .filter(|used| !used.is_empty())
            .map(EntriesInOrder),
        forgets: &forgets,
    };
    let Some(key) = key else {
        return serde_json::to_writer(out, &document);
    };
    let mut writer = MacWriter::new(out, key);
    serde_json::to_writer(&mut writer, &document)?;
    writer.finish().map_err(serde_json::Error::io)
}

/// Writes `map` as a version-1 whole-cache snapshot, as daemons before version 2 did. The
/// daemon never calls this; tests and benchmarks use it to stand in for an older node.
pub fn write_v1_snapshot(
    out: impl Write,
    node: &str,
    written_at_unix_ms: i64,
    map: &(impl SegmentEntries + ?Sized),
) -> serde_json::Result<()> {
    let document = DocumentOut {
        format: FORMAT_NAME,
        version: FORMAT_VERSION_V1,
        node,
        first_seq: None,
        last_seq: None,
        written_at_unix_ms,
        entry_count: map.entry_count(),
        entries: EntriesInOrder(map),
        used: None,
        forgets: &[],
    };
    serde_json::to_writer(out, &document)
}

/// One artifact of an entry, as a segment holds it (written from a view, read owned).
#[derive(Serialize)]
struct ArtifactJson<'a> {
    name: &'a str,
    sha256: &'a str,
    size: u64,
}
