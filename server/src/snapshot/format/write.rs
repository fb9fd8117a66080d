//! Writing a segment (or, for tests and benchmarks, a version-1 snapshot): the cache map
//! streamed straight into the writer in its sorted order, so the same content always gives
//! the same bytes, and the MAC member last when the shared directory has a key.

use std::io::Write;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::mac::{MacWriter, SharedKey};
use super::{TombstoneJson, FORMAT_NAME, FORMAT_VERSION, FORMAT_VERSION_V1};
use crate::model::entry::{EntryViews, KeyView, ResultView};
use crate::model::forget::Tombstone;

/// Serialises the map's entries as a JSON array without collecting them first.
struct EntriesInOrder<'a, M: ?Sized>(&'a M);

impl<M: EntryViews + ?Sized> Serialize for EntriesInOrder<'_, M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.views().map(|(key, result)| EntryRef { key, result }))
    }
}

/// One entry as written: key and result fields side by side in one flat object.
struct EntryRef<'a> {
    key: KeyView<'a>,
    result: ResultView<'a>,
}

impl Serialize for EntryRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = 8
            + usize::from(self.key.rank.is_some())
            + usize::from(self.result.forget_epoch != 0)
            + usize::from(!self.result.artifacts.is_empty());
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
        object.end()
    }
}

#[derive(Serialize)]
#[serde(bound = "")]
struct DocumentOut<'a, M: EntryViews + ?Sized> {
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
    #[serde(skip_serializing_if = "<[TombstoneJson]>::is_empty")]
    forgets: &'a [TombstoneJson],
}

/// Writes `map` as one version-2 segment covering sequence numbers `first..=last` into `out`
/// (the caller buffers and flushes), ending with its MAC when `key` is given.
pub fn write_segment(
    out: impl Write,
    node: &str,
    seq: (u64, u64),
    written_at_unix_ms: i64,
    map: &(impl EntryViews + ?Sized),
    key: Option<&SharedKey>,
) -> serde_json::Result<()> {
    write_segment_with_forgets(out, node, seq, written_at_unix_ms, map, &[], key)
}

/// `write_segment`, carrying the tombstones of Forgets made by this node too.
pub fn write_segment_with_forgets(
    out: impl Write,
    node: &str,
    (first, last): (u64, u64),
    written_at_unix_ms: i64,
    map: &(impl EntryViews + ?Sized),
    tombstones: &[Tombstone],
    key: Option<&SharedKey>,
) -> serde_json::Result<()> {
    let forgets: Vec<TombstoneJson> = tombstones.iter().map(TombstoneJson::from).collect();
    let document = DocumentOut {
        format: FORMAT_NAME,
        version: FORMAT_VERSION,
        node,
        first_seq: Some(first),
        last_seq: Some(last),
        written_at_unix_ms,
        entry_count: map.entry_count(),
        entries: EntriesInOrder(map),
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
    map: &(impl EntryViews + ?Sized),
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
