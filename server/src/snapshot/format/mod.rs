//! The on-disk format of shared-directory files, documented in `docs/snapshot-format.md`:
//! version-2 segments (`v2/<node>.<first>-<last>.seg.json`, written) and version-1 whole-cache
//! snapshots (`<node>.tunecache.json`, only read, for migration). Both are one JSON object
//! with the same entry layout; version 2 adds the segment's sequence range.
//!
//! Writing streams the cache map straight into the writer (no intermediate tree), in the
//! map's sorted order, so the same content always gives the same entry bytes. Reading streams
//! from a reader, validates each entry as it is parsed and keeps only valid ones, and checks
//! the format name and version; readers ignore fields they do not know, so later minor
//! additions stay readable. An entry a Record would refuse (a time of `1e999` or `"fast"`)
//! is dropped alone and counted; the rest of the file still loads.
//!
//! With a shared key (`--shared-dir-key-file`) every file ends with a MAC member (`mac`: the
//! key, and how the member is written and checked while the file streams). Nothing here
//! touches the filesystem: `snapshot` owns the I/O and calls these on its own thread.

mod mac;

use std::io::{Read, Write};

use serde_json::value::RawValue;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use tunecache_proto::v1;

use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, EntryViews, KeyView, ResultView, TunedResult};
use crate::model::forget::{ForgetScope, RankScope, Tombstone};
use crate::model::validate;
use crate::wire::stored::StoredEntry;

pub use mac::SharedKey;
use mac::{MacCheck, MacWriter};

/// The `format` field of every snapshot file.
pub const FORMAT_NAME: &str = "tunecache-snapshot";
/// The format version this build writes (segments).
pub const FORMAT_VERSION: u64 = 2;
/// Version-1 whole-cache snapshots of older daemons: still read and merged, never written.
pub const FORMAT_VERSION_V1: u64 = 1;
/// Suffix of snapshot files; everything else in the shared directory is ignored.
pub const SNAPSHOT_SUFFIX: &str = ".tunecache.json";

/// The file a node publishes: `<node>.tunecache.json`.
pub fn snapshot_file_name(node: &str) -> String {
    format!("{node}{SNAPSHOT_SUFFIX}")
}

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

/// A tombstone as segments carry it (`model::forget`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TombstoneJson {
    namespace: String,
    #[serde(default)]
    op: String,
    #[serde(default)]
    device: String,
    #[serde(default)]
    problem: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rank: Option<u32>,
    #[serde(default)]
    every_rank: bool,
    stamp: u64,
}

impl From<&Tombstone> for TombstoneJson {
    fn from(tombstone: &Tombstone) -> Self {
        let scope = &tombstone.scope;
        let (rank, every_rank) = scope.rank.to_fields();
        TombstoneJson {
            namespace: scope.namespace.clone(),
            op: scope.op.clone(),
            device: scope.device.clone(),
            problem: scope.problem.clone(),
            rank,
            every_rank,
            stamp: tombstone.stamp,
        }
    }
}

impl TombstoneJson {
    /// The tombstone, unless its namespace is empty (a Forget needs one).
    fn into_tombstone(self) -> Option<Tombstone> {
        let rank = RankScope::from_fields(self.rank, self.every_rank);
        let plausible =
            crate::model::forget::plausible(self.stamp, crate::model::entry::unix_now_ms());
        (!self.namespace.is_empty() && plausible).then_some(Tombstone {
            scope: ForgetScope {
                namespace: self.namespace,
                op: self.op,
                device: self.device,
                problem: self.problem,
                rank,
            },
            stamp: self.stamp,
        })
    }
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

#[derive(Deserialize)]
struct ArtifactIn {
    name: String,
    sha256: String,
    size: u64,
}

#[derive(Deserialize)]
struct EntryIn {
    namespace: String,
    op: String,
    #[serde(default)]
    device: String,
    #[serde(default)]
    problem: String,
    #[serde(default)]
    rank: Option<u32>,
    config: String,
    time_us: f64,
    #[serde(default)]
    tuned_by: String,
    #[serde(default)]
    tuned_at_unix_ms: i64,
    #[serde(default)]
    forget_epoch: u64,
    #[serde(default)]
    artifacts: Vec<ArtifactIn>,
}

/// A snapshot read back: who wrote it, when, and its valid entries.
#[derive(Debug)]
pub struct ParsedSnapshot {
    pub node: String,
    /// 1 for a whole-cache snapshot, 2 for a segment.
    pub version: u64,
    /// The sequence range a segment says it covers (version 2); checked against its name.
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub written_at_unix_ms: i64,
    /// In stored form: the allocations the cache keeps, so a load never holds a decoded
    /// copy of every entry beside them.
    pub entries: Vec<StoredEntry>,
    /// Entries the daemon would refuse in a Record (bad JSON config, negative time, ...);
    /// dropped so a damaged peer cannot poison the cache.
    pub invalid_entries: usize,
    /// Tombstones of the writer's Forgets (version-2 segments since Forget existed).
    pub tombstones: Vec<Tombstone>,
}

impl ParsedSnapshot {
    /// The entries decoded into owned keys and results, for tests and tools.
    pub fn pairs(&self) -> Vec<(CacheKey, TunedResult)> {
        self.entries.iter().map(StoredEntry::to_pair).collect()
    }
}

/// Parses a whole snapshot held in memory. Same rules as `read_snapshot`.
pub fn parse_snapshot(bytes: &[u8]) -> Result<ParsedSnapshot> {
    read_snapshot(bytes)
}

/// Parses a snapshot document as it streams in: each entry is validated as soon as it is
/// parsed and only valid ones are kept, so peak memory is the entries kept plus one entry,
/// never the file. Empty, truncated, unparsable and foreign or future-version documents are
/// `Error::SnapshotFormat` with a reason fit for one warning.
/// Reads a file and, with a key, refuses it unless it ends with a MAC that verifies.
pub fn read_authenticated(reader: impl Read, key: Option<&SharedKey>) -> Result<ParsedSnapshot> {
    let Some(key) = key else {
        return read_snapshot(reader);
    };
    let mut checked = MacCheck::new(reader, key);
    let parsed = read_snapshot(&mut checked);
    // Drain what the parser left (nothing, for a well-formed file) before the verdict.
    let _ = std::io::copy(&mut checked, &mut std::io::sink());
    match checked.verdict() {
        Ok(()) => parsed,
        Err(why) => Err(Error::Unauthenticated(why.to_owned())),
    }
}

pub fn read_snapshot(reader: impl Read) -> Result<ParsedSnapshot> {
    let mut reader = NoticesContent {
        inner: reader,
        saw_content: false,
        saw_end: false,
    };
    let mut deserializer = serde_json::Deserializer::from_reader(&mut reader);
    let mut format_error = None;
    let seed = DocumentSeed {
        format_error: &mut format_error,
    };
    let parsed = seed
        .deserialize(&mut deserializer)
        .and_then(|parsed| deserializer.end().map(|()| parsed));
    match (parsed, format_error) {
        (_, Some(error)) => Err(error),
        (Ok(parsed), None) => Ok(parsed),
        (Err(_), None) if !reader.saw_content => Err(Error::SnapshotFormat("empty file".into())),
        // The parser asked for more and the file had none: it ends early. (An element taken
        // whole, as entries are, reports a number cut short as invalid rather than as EOF.)
        (Err(parse_error), None) if reader.saw_end && !parse_error.is_io() => {
            Err(Error::SnapshotFormat(format!("truncated: {parse_error}")))
        }
        (Err(parse_error), None) => Err(explain_unparsable(parse_error)),
    }
}

/// Notes whether anything but whitespace came through, to tell an empty file from a
/// damaged one.
struct NoticesContent<R> {
    inner: R,
    saw_content: bool,
    saw_end: bool,
}

impl<R: Read> Read for NoticesContent<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        if read == 0 && !buf.is_empty() {
            self.saw_end = true;
        }
        if !self.saw_content {
            self.saw_content = buf[..read].iter().any(|b| !b.is_ascii_whitespace());
        }
        Ok(read)
    }
}

/// Reads the top-level object field by field. The format and version are checked as soon
/// as they are known (writers put them first), so a foreign or future document is refused
/// before its entries are parsed; the refusal travels in `format_error`.
struct DocumentSeed<'a> {
    format_error: &'a mut Option<Error>,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = ParsedSnapshot;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = ParsedSnapshot;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a tunecache-snapshot object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut format: Option<String> = None;
        let mut version: Option<u64> = None;
        let mut node = String::new();
        let mut first_seq = None;
        let mut last_seq = None;
        let mut written_at_unix_ms = 0;
        let mut entries: Option<(Vec<StoredEntry>, usize)> = None;
        let mut tombstones = Vec::new();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "format" => format = Some(map.next_value()?),
                "version" => version = Some(map.next_value()?),
                "node" => node = map.next_value()?,
                "first_seq" => first_seq = Some(map.next_value()?),
                "last_seq" => last_seq = Some(map.next_value()?),
                "written_at_unix_ms" => written_at_unix_ms = map.next_value()?,
                "entries" => {
                    if format.is_some() || version.is_some() {
                        if let Err(error) = check_format(format.as_deref(), version) {
                            *self.format_error = Some(error);
                            return Err(de::Error::custom("refused"));
                        }
                    }
                    entries = Some(map.next_value_seed(EntriesSeed)?);
                }
                "forgets" => {
                    let forgets: Vec<TombstoneJson> = map.next_value()?;
                    tombstones = forgets
                        .into_iter()
                        .filter_map(TombstoneJson::into_tombstone)
                        .collect();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if let Err(error) = check_format(format.as_deref(), version) {
            *self.format_error = Some(error);
            return Err(de::Error::custom("refused"));
        }
        let (entries, invalid_entries) =
            entries.ok_or_else(|| de::Error::missing_field("entries"))?;
        Ok(ParsedSnapshot {
            node,
            version: version.unwrap_or(FORMAT_VERSION),
            first_seq,
            last_seq,
            written_at_unix_ms,
            entries,
            invalid_entries,
            tombstones,
        })
    }
}

/// The `entries` array: validated one by one, valid ones kept, invalid ones counted.
struct EntriesSeed;

impl<'de> DeserializeSeed<'de> for EntriesSeed {
    type Value = (Vec<StoredEntry>, usize);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EntriesSeed {
    type Value = (Vec<StoredEntry>, usize);

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("an array of entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        let mut invalid = 0;
        // Each element is taken whole first, so one that does not parse as an entry (a time
        // out of range, a string where a number goes) is dropped alone.
        while let Some(raw) = seq.next_element::<Box<RawValue>>()? {
            match serde_json::from_str::<EntryIn>(raw.get())
                .ok()
                .and_then(validated)
            {
                Some(entry) => entries.push(entry),
                None => invalid += 1,
            }
        }
        Ok((entries, invalid))
    }
}

fn check_format(format: Option<&str>, version: Option<u64>) -> Result<()> {
    if format != Some(FORMAT_NAME) {
        return Err(Error::SnapshotFormat(format!(
            "not a {FORMAT_NAME} document (format {format:?})"
        )));
    }
    if version != Some(FORMAT_VERSION) && version != Some(FORMAT_VERSION_V1) {
        return Err(Error::SnapshotFormat(format!(
            "unknown format version {version:?}; this build reads versions \
             {FORMAT_VERSION_V1} and {FORMAT_VERSION}"
        )));
    }
    Ok(())
}

fn explain_unparsable(parse_error: serde_json::Error) -> Error {
    if parse_error.is_io() {
        return Error::SnapshotFormat(format!("read failed: {parse_error}"));
    }
    let what = if parse_error.is_eof() {
        "truncated"
    } else {
        "unparsable"
    };
    Error::SnapshotFormat(format!("{what}: {parse_error}"))
}

/// Runs a loaded entry through the same checks a Record gets, then encodes it once into
/// the form the store keeps.
fn validated(entry: EntryIn) -> Option<StoredEntry> {
    let key = v1::Key {
        namespace: entry.namespace,
        op: entry.op,
        device: entry.device,
        problem: entry.problem,
        rank: entry.rank,
    };
    let result = v1::Result {
        config: entry.config,
        time_us: entry.time_us,
        tuned_by: entry.tuned_by,
        tuned_at_unix_ms: entry.tuned_at_unix_ms,
        forget_epoch: entry.forget_epoch,
        artifacts: entry
            .artifacts
            .into_iter()
            .map(|a| v1::Artifact {
                name: a.name,
                sha256: a.sha256,
                size: a.size,
            })
            .collect(),
    };
    let key = validate::key("snapshot entry key", Some(key)).ok()?;
    let result = validate::learned_result("snapshot entry result", result).ok()?;
    Some(StoredEntry::new(&key, &result))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::store::CacheMap;

    fn sample_map(n: usize) -> CacheMap {
        (0..n)
            .map(|i| {
                let key = CacheKey {
                    namespace: "trtllm".into(),
                    op: format!("trtllm::gemm_{}", i % 7),
                    device: "NVIDIA H200|sm_90|cuda 12.8".into(),
                    problem: format!("m={i},n=4096,k=4096,dtype=f16"),
                    rank: (i % 5 == 0).then_some((i % 8) as u32),
                };
                let result = TunedResult {
                    config: format!(r#"{{"tactic":{i},"tile":[128,128,64]}}"#),
                    time_us: i as f64 * 0.25 + 1.0,
                    tuned_by: "node-a/rank0".into(),
                    tuned_at_unix_ms: 1_700_000_000_000 + i as i64,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                };
                (key, result)
            })
            .collect()
    }

    fn written(map: &CacheMap, at: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_segment(&mut bytes, "node-a", (1, 1), at, map, None).unwrap();
        bytes
    }

    #[test]
    fn round_trip_keeps_every_entry_in_order() {
        let map = sample_map(500);
        let parsed = parse_snapshot(&written(&map, 42)).unwrap();
        assert_eq!(parsed.node, "node-a");
        assert_eq!(parsed.written_at_unix_ms, 42);
        assert_eq!(parsed.invalid_entries, 0);
        let expected: Vec<_> = map.into_iter().collect();
        assert_eq!(parsed.pairs(), expected);
    }

    #[test]
    fn version_1_snapshots_are_still_read() {
        let map = sample_map(50);
        let mut bytes = Vec::new();
        write_v1_snapshot(&mut bytes, "old-node", 3, &map).unwrap();
        let parsed = parse_snapshot(&bytes).unwrap();
        assert_eq!((parsed.version, parsed.node.as_str()), (1, "old-node"));
        assert_eq!(parsed.entries.len(), 50);
        let segment = parse_snapshot(&written(&map, 3)).unwrap();
        assert_eq!(segment.version, 2);
    }

    #[test]
    fn same_content_gives_same_bytes_in_key_order() {
        // Two nodes holding the same entries write the same file: the writer puts entries in
        // key order and adds nothing that varies between writes.
        let map = sample_map(100);
        let bytes = written(&map, 7);
        assert_eq!(bytes, written(&map, 7));
        let text = String::from_utf8(bytes).unwrap();
        let offsets: Vec<usize> = map
            .keys()
            .map(|key| {
                let quoted = format!("\"{}\"", key.problem);
                text.find(&quoted)
                    .unwrap_or_else(|| panic!("{quoted} not written"))
            })
            .collect();
        assert!(
            offsets.windows(2).all(|pair| pair[0] < pair[1]),
            "entries are not written in key order"
        );
        let mut sorted: Vec<&CacheKey> = map.keys().collect();
        sorted.sort();
        assert!(
            map.keys().eq(sorted),
            "the map does not iterate in key order"
        );
    }

    #[test]
    fn damaged_and_foreign_files_are_explained() {
        let bytes = written(&sample_map(10), 1);
        let reason = |bytes: &[u8]| match parse_snapshot(bytes) {
            Err(Error::SnapshotFormat(reason)) => reason,
            other => panic!("expected a format error, got {other:?}"),
        };
        assert_eq!(reason(b""), "empty file");
        assert!(reason(&bytes[..bytes.len() / 2]).starts_with("truncated"));
        assert!(reason(b"\x89PNG garbage").starts_with("unparsable"));
        let future = br#"{"format":"tunecache-snapshot","version":3,"entries":{"new":"shape"}}"#;
        assert!(reason(future).contains("unknown format version"));
        let foreign = br#"{"format":"something-else","version":1,"entries":[]}"#;
        assert!(reason(foreign).contains("not a tunecache-snapshot"));
    }

    #[test]
    fn unknown_fields_are_ignored_and_invalid_entries_dropped() {
        let text = r#"{"format":"tunecache-snapshot","version":1,"future":true,"entries":[
            {"namespace":"n","op":"o","config":"{}","time_us":1.0,"extra":[1,2]},
            {"namespace":"n","op":"p","config":"{not json","time_us":1.0},
            {"namespace":"n","op":"q","config":"{}","time_us":-3.0}]}"#;
        let parsed = parse_snapshot(text.as_bytes()).unwrap();
        assert_eq!(parsed.entries.len(), 1);
        assert_eq!(parsed.invalid_entries, 2);
    }

    /// Timing of a large snapshot; run in release:
    /// `cargo test --release -p tunecache-server snapshot_format -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing_of_large_snapshots() {
        for n in [100_000, 1_000_000] {
            let map = sample_map(n);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("node-a.tunecache.json");
            let started = Instant::now();
            let file = std::fs::File::create(&path).unwrap();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            write_segment(&mut out, "node-a", (1, 1), 1, &map, None).unwrap();
            out.flush().unwrap();
            let write_time = started.elapsed();
            let started = Instant::now();
            let bytes = std::fs::read(&path).unwrap();
            let parsed = parse_snapshot(&bytes).unwrap();
            let read_time = started.elapsed();
            assert_eq!(parsed.entries.len(), n);
            println!(
                "{n} entries, {} MB: write {write_time:?}, read+parse+validate {read_time:?}",
                bytes.len() / 1_000_000
            );
        }
    }

    #[test]
    fn a_key_authenticates_every_byte_and_nothing_else_passes() {
        let map = sample_map(40);
        let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
        let mut bytes = Vec::new();
        write_segment(&mut bytes, "node-a", (3, 4), 7, &map, Some(&key)).unwrap();
        // Still plain JSON, with the MAC as its last member.
        let document: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(document["mac"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:"));
        let parsed = read_authenticated(&bytes[..], Some(&key)).unwrap();
        assert_eq!((parsed.first_seq, parsed.last_seq), (Some(3), Some(4)));
        assert_eq!(parsed.entries.len(), 40);
        // Readers without a key read it as before.
        assert_eq!(
            read_authenticated(&bytes[..], None).unwrap().entries.len(),
            40
        );

        let refused = |bytes: &[u8], key: &SharedKey| match read_authenticated(bytes, Some(key)) {
            Err(Error::Unauthenticated(why)) => why,
            other => panic!("accepted: {other:?}"),
        };
        // Any byte changed, the MAC included.
        for at in [10, bytes.len() / 2, bytes.len() - 5] {
            let mut tampered = bytes.clone();
            tampered[at] ^= 0x01;
            assert!(
                read_authenticated(&tampered[..], Some(&key)).is_err(),
                "byte {at}"
            );
        }
        let other = SharedKey::new(b"another-key-of-16+bytes").unwrap();
        assert!(refused(&bytes, &other).contains("does not verify"));
        assert_eq!(refused(&written(&map, 7), &key), "carries no MAC");
        assert!(SharedKey::new(b"short").is_err());
    }

    #[test]
    fn an_invalid_entry_is_dropped_alone() {
        let good = r#"{"namespace":"n","op":"o","device":"d","problem":"p1","config":"{}","time_us":1.5,"tuned_by":"x","tuned_at_unix_ms":1}"#;
        let good2 = good.replace("p1", "p2");
        let huge = good.replace("1.5", "1e999").replace("p1", "p3");
        let text = good.replace("1.5", "\"fast\"").replace("p1", "p4");
        let document = format!(
            r#"{{"format":"tunecache-snapshot","version":2,"node":"a","first_seq":1,"last_seq":1,"entries":[{good},{huge},{text},{good2}]}}"#
        );
        let parsed = parse_snapshot(document.as_bytes()).unwrap();
        assert_eq!(parsed.entries.len(), 2);
        assert_eq!(parsed.invalid_entries, 2);
    }

    #[test]
    fn forgets_read_back_and_values_no_clock_made_are_refused() {
        let now_stamp = (crate::model::entry::unix_now_ms() as u64) << 16;
        let entry = |problem: &str, epoch: u64| {
            format!(
                r#"{{"namespace":"n","op":"o","device":"d","problem":"{problem}","config":"{{}}","time_us":1.5,"forget_epoch":{epoch}}}"#
            )
        };
        let forget = |stamp: u64| {
            format!(r#"{{"namespace":"n","op":"o","every_rank":true,"stamp":{stamp}}}"#)
        };
        let document = format!(
            r#"{{"format":"tunecache-snapshot","version":2,"node":"a","first_seq":1,"last_seq":1,"entries":[{},{}],"forgets":[{},{}]}}"#,
            entry("p1", now_stamp),
            entry("p2", u64::MAX),
            forget(now_stamp),
            forget(u64::MAX)
        );
        let parsed = parse_snapshot(document.as_bytes()).unwrap();
        assert_eq!(
            parsed.entries.len(),
            1,
            "an epoch from the far future is refused"
        );
        assert_eq!(parsed.entries[0].result().forget_epoch, now_stamp);
        assert_eq!(parsed.invalid_entries, 1);
        let stamps: Vec<u64> = parsed.tombstones.iter().map(|t| t.stamp).collect();
        assert_eq!(stamps, vec![now_stamp], "so is a stamp from the far future");
        assert_eq!(parsed.tombstones[0].scope.rank, RankScope::Every);
    }
}
