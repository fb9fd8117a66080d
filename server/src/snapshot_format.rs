//! The on-disk format of shared-directory snapshots (`<node>.tunecache.json`), documented in
//! `docs/snapshot-format.md`.
//!
//! Writing streams the cache map straight into the writer (no intermediate tree), in the
//! map's sorted order, so the same content always gives the same entry bytes. Reading parses
//! the whole file from memory and checks the format name and version; readers ignore fields
//! they do not know, so later minor additions stay readable. Nothing here touches the
//! filesystem: `snapshot` owns the I/O and calls these on its own thread.

use std::io::Write;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use tunecache_proto::v1;

use crate::entry::{CacheKey, TunedResult};
use crate::error::{Error, Result};
use crate::store::CacheMap;
use crate::validate;

/// The `format` field of every snapshot file.
pub const FORMAT_NAME: &str = "tunecache-snapshot";
/// The one format version this build writes and reads.
pub const FORMAT_VERSION: u64 = 1;
/// Suffix of snapshot files; everything else in the shared directory is ignored.
pub const SNAPSHOT_SUFFIX: &str = ".tunecache.json";

/// The file a node publishes: `<node>.tunecache.json`.
pub fn snapshot_file_name(node: &str) -> String {
    format!("{node}{SNAPSHOT_SUFFIX}")
}

/// Serialises the map's entries as a JSON array without collecting them first.
struct EntriesInOrder<'a>(&'a CacheMap);

impl Serialize for EntriesInOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|(key, result)| EntryRef { key, result }))
    }
}

/// One entry as written: key and result fields side by side in one flat object.
struct EntryRef<'a> {
    key: &'a CacheKey,
    result: &'a TunedResult,
}

impl Serialize for EntryRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.key.rank.is_some() { 9 } else { 8 };
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
        object.end()
    }
}

#[derive(Serialize)]
struct DocumentOut<'a> {
    format: &'static str,
    version: u64,
    node: &'a str,
    written_at_unix_ms: i64,
    entry_count: usize,
    entries: EntriesInOrder<'a>,
}

/// Writes `map` as one snapshot document into `out` (the caller buffers and flushes).
pub fn write_snapshot(
    out: impl Write,
    node: &str,
    written_at_unix_ms: i64,
    map: &CacheMap,
) -> serde_json::Result<()> {
    let document = DocumentOut {
        format: FORMAT_NAME,
        version: FORMAT_VERSION,
        node,
        written_at_unix_ms,
        entry_count: map.len(),
        entries: EntriesInOrder(map),
    };
    serde_json::to_writer(out, &document)
}

/// Just the fields that say what a document is; used to explain a file that did not parse.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u64>,
}

#[derive(Deserialize)]
struct DocumentIn {
    format: String,
    version: u64,
    #[serde(default)]
    node: String,
    #[serde(default)]
    written_at_unix_ms: i64,
    entries: Vec<EntryIn>,
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
}

/// A snapshot read back: who wrote it, when, and its valid entries.
#[derive(Debug)]
pub struct ParsedSnapshot {
    pub node: String,
    pub written_at_unix_ms: i64,
    pub entries: Vec<(CacheKey, TunedResult)>,
    /// Entries the daemon would refuse in a Record (bad JSON config, negative time, ...);
    /// dropped so a damaged peer cannot poison the cache.
    pub invalid_entries: usize,
}

/// Parses a whole snapshot file. Empty, truncated, unparsable and foreign or future-version
/// documents are `Error::SnapshotFormat` with a reason fit for one warning.
pub fn parse_snapshot(bytes: &[u8]) -> Result<ParsedSnapshot> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::SnapshotFormat("empty file".into()));
    }
    let document: DocumentIn = match serde_json::from_slice(bytes) {
        Ok(document) => document,
        Err(parse_error) => return Err(explain_unparsable(bytes, parse_error)),
    };
    check_format(Some(&document.format), Some(document.version))?;
    let mut entries = Vec::with_capacity(document.entries.len());
    let mut invalid_entries = 0;
    for entry in document.entries {
        match validated(entry) {
            Some(pair) => entries.push(pair),
            None => invalid_entries += 1,
        }
    }
    Ok(ParsedSnapshot {
        node: document.node,
        written_at_unix_ms: document.written_at_unix_ms,
        entries,
        invalid_entries,
    })
}

fn check_format(format: Option<&str>, version: Option<u64>) -> Result<()> {
    if format != Some(FORMAT_NAME) {
        return Err(Error::SnapshotFormat(format!(
            "not a {FORMAT_NAME} document (format {format:?})"
        )));
    }
    if version != Some(FORMAT_VERSION) {
        return Err(Error::SnapshotFormat(format!(
            "unknown format version {version:?}; this build reads version {FORMAT_VERSION}"
        )));
    }
    Ok(())
}

/// A document from a newer writer may fail to parse as version 1; say so rather than
/// calling it damaged.
fn explain_unparsable(bytes: &[u8], parse_error: serde_json::Error) -> Error {
    if let Ok(header) = serde_json::from_slice::<Header>(bytes) {
        if let Err(format_error) = check_format(header.format.as_deref(), header.version) {
            return format_error;
        }
    }
    let what = if parse_error.is_eof() {
        "truncated"
    } else {
        "unparsable"
    };
    Error::SnapshotFormat(format!("{what}: {parse_error}"))
}

/// Runs a loaded entry through the same checks a Record gets.
fn validated(entry: EntryIn) -> Option<(CacheKey, TunedResult)> {
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
    };
    let key = validate::key("snapshot entry key", Some(key)).ok()?;
    let result = validate::result("snapshot entry result", Some(result)).ok()?;
    Some((key, result))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

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
                };
                (key, result)
            })
            .collect()
    }

    fn written(map: &CacheMap, at: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_snapshot(&mut bytes, "node-a", at, map).unwrap();
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
        assert_eq!(parsed.entries, expected);
    }

    #[test]
    fn same_content_gives_same_bytes() {
        let map = sample_map(100);
        // Built in another insertion order: the sorted map iterates the same way.
        let reversed: CacheMap = map
            .iter()
            .rev()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(written(&map, 7), written(&reversed, 7));
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
        let future = br#"{"format":"tunecache-snapshot","version":2,"entries":{"new":"shape"}}"#;
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
            write_snapshot(&mut out, "node-a", 1, &map).unwrap();
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
}
