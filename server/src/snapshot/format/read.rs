//! Reading a segment or a version-1 snapshot: streamed from a reader, the format name and
//! version checked, each entry validated as it is parsed (one a Record would refuse is
//! dropped alone and counted), fields it does not know ignored, and the MAC checked while the
//! file streams when the shared directory has a key.

use std::io::Read;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use tunecache_proto::v1;

use super::mac::{MacCheck, SharedKey};
use super::{TombstoneJson, FORMAT_NAME, FORMAT_VERSION, FORMAT_VERSION_V1};
use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::forget::Tombstone;
use crate::model::validate;
use crate::wire::stored::StoredEntry;

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
    /// The day the writer last knew the key used (`model::lifecycle::Day`); absent: none
    /// known. Anything but a `u32` makes the entry invalid; the store takes a day after
    /// today as today.
    #[serde(default)]
    last_used_day: u32,
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
    /// Uses the writer made of keys (`used`), each a full entry with its day, validated like
    /// `entries` (invalid ones counted in `invalid_entries` too): merged as learned entries.
    pub used: Vec<StoredEntry>,
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
        let mut used: (Vec<StoredEntry>, usize) = (Vec::new(), 0);
        let mut tombstones = Vec::new();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "format" => format = Some(map.next_value()?),
                "version" => version = Some(map.next_value()?),
                "node" => node = map.next_value()?,
                "first_seq" => first_seq = Some(map.next_value()?),
                "last_seq" => last_seq = Some(map.next_value()?),
                "written_at_unix_ms" => written_at_unix_ms = map.next_value()?,
                "entries" | "used" => {
                    if format.is_some() || version.is_some() {
                        if let Err(error) = check_format(format.as_deref(), version) {
                            *self.format_error = Some(error);
                            return Err(de::Error::custom("refused"));
                        }
                    }
                    let read = map.next_value_seed(EntriesSeed)?;
                    if field == "used" {
                        used = read;
                    } else {
                        entries = Some(read);
                    }
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
        let (used, invalid_used) = used;
        Ok(ParsedSnapshot {
            node,
            version: version.unwrap_or(FORMAT_VERSION),
            first_seq,
            last_seq,
            written_at_unix_ms,
            entries,
            invalid_entries: invalid_entries + invalid_used,
            tombstones,
            used,
        })
    }
}

/// The `entries` array (and `used`, laid out alike): validated one by one, valid ones kept,
/// invalid ones counted.
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
    Some(StoredEntry::new(&key, &result).with_last_use(entry.last_used_day))
}
