//! TensorRT-LLM autotuner cache file interop, for the `tunecache` CLI's import and export: reads
//! the JSON file that TensorRT-LLM's `AutoTunerProfilingCache.save_cache` writes (the file at
//! `TLLM_AUTOTUNER_CACHE_PATH`) into tunecache entries, writes entries back out as a file its
//! `load_cache` reads, and replaces such a file under the writers' lock. Ranks that use the
//! daemon directly (the Python drop-in) never touch these files; this crate is not linked into
//! the rank-facing client library.
//!
//! The file is one JSON object:
//!
//! ```text
//! {
//!   "metadata": {"lib_version": ..., "creation_timestamp": ..., "device_name": ..., "device_capability": [9, 0]},
//!   "shared":   {"<key>": {"runner_id": 0, "tactic": "<repr>", "min_time": 0.0123}, ...},
//!   "rank_0":   {"<key>": {...}, ...},
//!   ...
//! }
//! ```
//!
//! where `<key>` is Python's `str()` of a tuple whose first element is the custom op name, e.g.
//! `"('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)"`, `tactic` is Python's `repr()` of
//! the tactic (the loader reads both back with `ast.literal_eval`), and `min_time` is
//! milliseconds.
//!
//! Mapping of one file entry to a tunecache [`Entry`]:
//!
//! | Key field   | value                                                                     |
//! |-------------|---------------------------------------------------------------------------|
//! | `namespace` | `"trtllm"` ([`NAMESPACE`])                                                 |
//! | `op`        | the custom op: the first element of the key tuple, unquoted                |
//! | `problem`   | the key string, verbatim                                                   |
//! | `rank`      | `N` for section `rank_<N>`, unset for section `shared`                     |
//! | `device`    | `<device_name>|sm_<major><minor>|trtllm <lib_version>` from the metadata, e.g. `NVIDIA H200|sm_90|trtllm 1.1.0` |
//!
//! The release is part of the device so that one release's tactics never win over another's
//! (a tactic id may mean something else there). The Python drop-in
//! (`tunecache.integrations.trtllm`) builds the same keys.
//!
//! `Result.config` is a JSON object (see [`ImportedConfig`]) holding `runner_id`, `tactic` and
//! `min_time` exactly as the file spelled them, `min_time_text` (the same number as a string) and
//! `trtllm_metadata_json` (the file's metadata object, as a string), so that export restores every
//! value even after the daemon has stored the config. `Result.time_us` is `min_time * 1000`.
//!
//! Export lays the file out the way Python's `json.dump(..., indent=2)` does (TensorRT-LLM's own
//! writer), so every value (types and float bits included) survives a round trip; the order of
//! keys within a section is the cache's, not necessarily the original file's. Each exported entry
//! is checked the way the loader will read it ([`pyliteral`]): the key must be a tuple literal
//! and the tactic a string holding a Python literal.

pub mod pyliteral;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tunecache_proto::v1::{Entry, Key, Result as TuneResult};

/// The `Key.namespace` of every entry this module imports or exports.
pub const NAMESPACE: &str = "trtllm";

const METADATA_SECTION: &str = "metadata";
const SHARED_SECTION: &str = "shared";
const RANK_SECTION_PREFIX: &str = "rank_";
/// `Result.tuned_by` of imported entries.
const IMPORTED_BY: &str = "trtllm cache import";
/// Marks the TensorRT-LLM release in a device fingerprint: `...|trtllm 1.1.0`.
const LIB_VERSION_PREFIX: &str = "trtllm ";
/// `lib_version` written when the metadata had to be made up from a device fingerprint; the
/// loader only stores it.
const UNKNOWN_LIB_VERSION: &str = "unknown (written by tunecache)";

#[derive(Debug, thiserror::Error)]
pub enum TrtllmError {
    #[error("the TensorRT-LLM cache file is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the TensorRT-LLM cache file holds a JSON {found}, not an object")]
    NotAnObject { found: &'static str },
    #[error(
        "the TensorRT-LLM cache file has no \"metadata\" section, so its device is unknown; \
         name the device explicitly"
    )]
    MissingMetadata,
    #[error("the TensorRT-LLM cache metadata is unusable: {0}")]
    BadMetadata(String),
    #[error("device fingerprint {0:?} is not of the form `<device name>|sm_<major><minor>[|...]`")]
    BadDeviceFingerprint(String),
    #[error("could not serialize the TensorRT-LLM cache: {0}")]
    Serialize(serde_json::Error),
    #[error("could not take the writers' lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "another writer held {path} for {waited:?}; gave up (nothing written). Retry when the \
         TensorRT-LLM ranks have saved, or raise --lock-timeout"
    )]
    LockTimeout {
        path: PathBuf,
        waited: std::time::Duration,
    },
    #[error("could not read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("could not write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One file entry (or whole section) that import or export left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEntry {
    /// `"rank_3"`, `"shared"`, ...; for export, the section the entry would have gone to, if known.
    pub section: String,
    /// The key string; empty when a whole section was skipped.
    pub key: String,
    pub reason: String,
}

/// The `"metadata"` object of a TensorRT-LLM cache file.
#[derive(Debug, Clone, PartialEq)]
pub struct TrtllmMetadata {
    /// The object as the file spelled it, with the whitespace outside strings removed, so export
    /// writes back the same values (a float `creation_timestamp` included).
    raw_json: String,
    pub device_name: String,
    pub device_capability: (u32, u32),
    /// `lib_version` when it is a non-empty string (TensorRT-LLM's `__version__`).
    pub lib_version: Option<String>,
    /// `creation_timestamp` (Unix seconds, float) in milliseconds, when it is a number.
    pub creation_unix_ms: Option<i64>,
}

impl TrtllmMetadata {
    /// Parses a metadata object; it must hold `device_name` (a string) and `device_capability`
    /// (`[major, minor]`, as Python's `json.dump` writes the tuple, or a `"major.minor"` string).
    pub fn from_json(metadata_json: &str) -> Result<Self, TrtllmError> {
        #[derive(Deserialize)]
        struct Fields {
            device_name: Option<serde_json::Value>,
            device_capability: Option<serde_json::Value>,
            creation_timestamp: Option<serde_json::Value>,
            lib_version: Option<serde_json::Value>,
        }
        let fields: Fields = serde_json::from_str(metadata_json)
            .map_err(|err| TrtllmError::BadMetadata(format!("not an object: {err}")))?;
        let device_name = match fields.device_name {
            Some(serde_json::Value::String(name)) if !name.is_empty() => name,
            other => {
                return Err(TrtllmError::BadMetadata(format!(
                    "device_name must be a non-empty string, found {}",
                    describe_optional(&other)
                )))
            }
        };
        let device_capability = parse_device_capability(fields.device_capability.as_ref())
            .ok_or_else(|| {
                TrtllmError::BadMetadata(format!(
                    "device_capability must be [major, minor] or \"major.minor\", found {}",
                    describe_optional(&fields.device_capability)
                ))
            })?;
        let creation_unix_ms = fields
            .creation_timestamp
            .as_ref()
            .and_then(serde_json::Value::as_f64)
            .filter(|seconds| seconds.is_finite())
            .map(|seconds| (seconds * 1000.0).round() as i64);
        let lib_version = match fields.lib_version {
            Some(serde_json::Value::String(version)) if !version.is_empty() => Some(version),
            _ => None,
        };
        Ok(TrtllmMetadata {
            raw_json: strip_json_whitespace(metadata_json),
            device_name,
            device_capability,
            lib_version,
            creation_unix_ms,
        })
    }

    /// Makes up the metadata for a device fingerprint `<device name>|sm_<major><minor>[|...]`,
    /// for an export whose entries carry no imported metadata. `lib_version` is a placeholder and
    /// `creation_timestamp` is now.
    pub fn for_device(device_fingerprint: &str) -> Result<Self, TrtllmError> {
        #[derive(Serialize)]
        struct Synthesized<'a> {
            lib_version: &'a str,
            creation_timestamp: f64,
            device_name: &'a str,
            device_capability: [u32; 2],
        }
        let bad = || TrtllmError::BadDeviceFingerprint(device_fingerprint.to_owned());
        let mut parts = device_fingerprint.split('|');
        let device_name = parts
            .next()
            .filter(|name| !name.is_empty())
            .ok_or_else(bad)?;
        let sm_digits = parts
            .next()
            .and_then(|part| part.strip_prefix("sm_"))
            .filter(|digits| digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(bad)?;
        // sm_90 is 9.0 and sm_100 is 10.0: the last digit is the minor version.
        let (major_digits, minor_digit) = sm_digits.split_at(sm_digits.len() - 1);
        let major: u32 = major_digits.parse().map_err(|_| bad())?;
        let minor: u32 = minor_digit.parse().map_err(|_| bad())?;
        let named_version = parts
            .find_map(|part| part.strip_prefix(LIB_VERSION_PREFIX))
            .filter(|version| !version.is_empty());
        let now_seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs_f64())
            .unwrap_or(0.0);
        let raw_json = serde_json::to_string(&Synthesized {
            lib_version: named_version.unwrap_or(UNKNOWN_LIB_VERSION),
            creation_timestamp: now_seconds,
            device_name,
            device_capability: [major, minor],
        })
        .map_err(TrtllmError::Serialize)?;
        let mut metadata = Self::from_json(&raw_json)?;
        // The placeholder release is written to the file but is no part of the device.
        metadata.lib_version = named_version.map(str::to_owned);
        Ok(metadata)
    }

    /// The metadata that an earlier [`import`] stored in these entries' configs: that of the
    /// first `trtllm` entry carrying one. `None` when no entry does (they were tuned natively).
    pub fn from_entries(entries: &[Entry]) -> Option<Self> {
        entries
            .iter()
            .filter(|entry| entry.key.as_ref().map(|key| key.namespace.as_str()) == Some(NAMESPACE))
            .filter_map(|entry| entry.result.as_ref())
            .filter_map(|result| serde_json::from_str::<StoredConfig>(&result.config).ok())
            .filter_map(|config| config.trtllm_metadata_json)
            .find_map(|metadata_json| Self::from_json(&metadata_json).ok())
    }

    /// The `Key.device` of entries imported with this metadata:
    /// `<device_name>|sm_<major><minor>|trtllm <lib_version>`, e.g. `NVIDIA H200|sm_90|trtllm 1.1.0`
    /// for device_capability `[9, 0]`; without a `lib_version`, the last part is left out.
    pub fn device_fingerprint(&self) -> String {
        let (major, minor) = self.device_capability;
        match &self.lib_version {
            Some(version) => format!(
                "{}|sm_{major}{minor}|{LIB_VERSION_PREFIX}{version}",
                self.device_name
            ),
            None => format!("{}|sm_{major}{minor}", self.device_name),
        }
    }

    /// The metadata object as the file spelled it (whitespace outside strings removed).
    pub fn raw_json(&self) -> &str {
        &self.raw_json
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// `Key.device` for every entry instead of the fingerprint built from the metadata; needed for
    /// a file without metadata, or to file the entries under the daemon's own fingerprint (which
    /// also names the CUDA version, which the file does not record).
    pub device: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ImportOutcome {
    /// In file order: sections, then keys within each section.
    pub entries: Vec<Entry>,
    /// `None` only when the file had no metadata and [`ImportOptions::device`] was given.
    pub metadata: Option<TrtllmMetadata>,
    pub skipped: Vec<SkippedEntry>,
}

/// The `Result.config` of an imported entry, as [`import`] writes it and [`export`] reads it.
/// The raw fields hold the file's own JSON text, so no value is re-formatted.
#[derive(Serialize)]
pub struct ImportedConfig<'a> {
    pub runner_id: &'a RawValue,
    pub tactic: &'a RawValue,
    pub min_time: &'a RawValue,
    /// `min_time`'s text again, as a string: whoever re-serializes the config as a plain JSON
    /// value may re-format the number (`1e-3` becomes `0.001`), but never a string.
    pub min_time_text: &'a str,
    /// The file's metadata object as text, so an export from the daemon can restore it; a string
    /// for the same reason as `min_time_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trtllm_metadata_json: Option<&'a str>,
}

/// What [`export`] reads back from a config; `min_time*` are absent in configs recorded natively,
/// and then `time_us / 1000` stands in.
#[derive(Deserialize)]
struct StoredConfig {
    runner_id: Box<RawValue>,
    tactic: Box<RawValue>,
    #[serde(default)]
    min_time: Option<Box<RawValue>>,
    #[serde(default)]
    min_time_text: Option<String>,
    #[serde(default)]
    trtllm_metadata_json: Option<String>,
}

/// Reads a TensorRT-LLM cache file. Entries that cannot be mapped are skipped and listed with the
/// reason; only a file that is not a JSON object, or has no usable metadata, is an error.
pub fn import(json_text: &str) -> Result<ImportOutcome, TrtllmError> {
    import_with(json_text, &ImportOptions::default())
}

/// [`import`] with options (an explicit device fingerprint).
pub fn import_with(json_text: &str, options: &ImportOptions) -> Result<ImportOutcome, TrtllmError> {
    // Python's json.dump writes an infinite min_time as a bare `Infinity`, which is not JSON;
    // quoting it lets the rest of the file load and that entry be skipped with a reason.
    let json_text = quote_python_nonfinite_literals(json_text);
    let document: &RawValue = serde_json::from_str(&json_text).map_err(TrtllmError::NotJson)?;
    if !document.get().starts_with('{') {
        return Err(TrtllmError::NotAnObject {
            found: json_kind(document.get()),
        });
    }
    let sections = keep_last_duplicate(
        serde_json::from_str::<OrderedRawObject>(document.get())
            .map_err(TrtllmError::NotJson)?
            .0,
    );

    let metadata = match sections
        .kept
        .iter()
        .find(|(name, _)| name == METADATA_SECTION)
    {
        Some((_, raw)) => Some(TrtllmMetadata::from_json(raw.get())?),
        None => None,
    };
    let device = match (&options.device, &metadata) {
        (Some(device), _) => device.clone(),
        (None, Some(metadata)) => metadata.device_fingerprint(),
        (None, None) => return Err(TrtllmError::MissingMetadata),
    };
    let context = ImportContext {
        device: &device,
        metadata_json: metadata.as_ref().map(|metadata| metadata.raw_json.as_str()),
        tuned_at_unix_ms: metadata
            .as_ref()
            .and_then(|metadata| metadata.creation_unix_ms)
            .unwrap_or(0),
    };

    let mut skipped: Vec<SkippedEntry> = sections
        .dropped
        .into_iter()
        .map(|section| SkippedEntry {
            section,
            key: String::new(),
            reason: "duplicate section; the last one wins, as with Python's json.load".to_owned(),
        })
        .collect();
    let mut entries = Vec::new();
    for (section, raw_section) in &sections.kept {
        if section == METADATA_SECTION {
            continue;
        }
        let Some(rank) = section_rank(section) else {
            skipped.push(SkippedEntry {
                section: section.clone(),
                key: String::new(),
                reason: "unknown section; expected \"metadata\", \"shared\" or \"rank_<N>\""
                    .to_owned(),
            });
            continue;
        };
        let section_entries = match serde_json::from_str::<OrderedRawObject>(raw_section.get()) {
            Ok(object) => keep_last_duplicate(object.0),
            Err(_) => {
                skipped.push(SkippedEntry {
                    section: section.clone(),
                    key: String::new(),
                    reason: format!(
                        "section is a JSON {}, not an object",
                        json_kind(raw_section.get())
                    ),
                });
                continue;
            }
        };
        skipped.extend(section_entries.dropped.into_iter().map(|key| SkippedEntry {
            section: section.clone(),
            key,
            reason: "duplicate key; the last one wins, as with Python's json.load".to_owned(),
        }));
        for (key, raw_value) in &section_entries.kept {
            match import_entry(key, raw_value, rank, &context) {
                Ok(entry) => entries.push(entry),
                Err(reason) => skipped.push(SkippedEntry {
                    section: section.clone(),
                    key: key.clone(),
                    reason,
                }),
            }
        }
    }
    Ok(ImportOutcome {
        entries,
        metadata,
        skipped,
    })
}

struct ImportContext<'a> {
    device: &'a str,
    metadata_json: Option<&'a str>,
    tuned_at_unix_ms: i64,
}

fn import_entry(
    key: &str,
    raw_value: &RawValue,
    rank: SectionRank,
    context: &ImportContext<'_>,
) -> Result<Entry, String> {
    let op = custom_op_from_key(key)?;
    let fields = serde_json::from_str::<OrderedRawObject>(raw_value.get()).map_err(|_| {
        format!(
            "value is a JSON {}, not an object",
            json_kind(raw_value.get())
        )
    })?;
    // A repeated field: the last one wins, as with Python's json.load.
    let field = |name: &str| {
        fields
            .0
            .iter()
            .rev()
            .find(|(field_name, _)| field_name == name)
            .map(|(_, raw)| raw.as_ref())
            .ok_or_else(|| format!("no {name:?} field"))
    };
    let runner_id = field("runner_id")?;
    if serde_json::from_str::<i64>(runner_id.get()).is_err() {
        return Err(format!("runner_id {} is not an integer", runner_id.get()));
    }
    let tactic = field("tactic")?;
    let min_time = field("min_time")?;
    let min_time_ms = json_number(min_time.get())
        .ok_or_else(|| format!("min_time {} is not a number", min_time.get()))?;
    let time_us = min_time_ms * 1000.0;
    if !time_us.is_finite() || time_us < 0.0 {
        return Err(format!(
            "min_time {} is not a finite, non-negative time",
            min_time.get()
        ));
    }
    let config = serde_json::to_string(&ImportedConfig {
        runner_id,
        tactic,
        min_time,
        min_time_text: min_time.get(),
        trtllm_metadata_json: context.metadata_json,
    })
    .map_err(|err| format!("could not build the config: {err}"))?;
    Ok(Entry {
        key: Some(Key {
            namespace: NAMESPACE.to_owned(),
            op,
            device: context.device.to_owned(),
            problem: key.to_owned(),
            rank: rank.0,
        }),
        result: Some(TuneResult {
            config,
            time_us,
            tuned_by: IMPORTED_BY.to_owned(),
            tuned_at_unix_ms: context.tuned_at_unix_ms,
        }),
    })
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Ranks whose `rank_<N>` section is written even when no entry belongs to it: TensorRT-LLM's
    /// `load_cache` fails for a rank whose section is missing.
    pub empty_rank_sections: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct ExportOutcome {
    /// The file text, formatted as Python's `json.dump(..., indent=2)` formats it.
    pub json_text: String,
    pub exported: usize,
    pub skipped: Vec<SkippedEntry>,
}

/// Writes `trtllm` entries as a TensorRT-LLM cache file. Sections come in the order their first
/// entry appears (after `metadata`), keys in entry order; two entries for the same section and
/// key (e.g. from two device fingerprints) keep the lower `time_us`, the cache's merge rule.
/// Entries of other namespaces, or whose config this module cannot read, are skipped and listed.
pub fn export(
    entries: &[Entry],
    metadata: &TrtllmMetadata,
    options: &ExportOptions,
) -> Result<ExportOutcome, TrtllmError> {
    let mut sections: Vec<(String, Vec<ExportedEntry>)> = Vec::new();
    let mut section_index: HashMap<String, usize> = HashMap::new();
    let mut entry_index: HashMap<(usize, String), usize> = HashMap::new();
    let mut skipped = Vec::new();

    for entry in entries {
        let (key, result) = match (&entry.key, &entry.result) {
            (Some(key), Some(result)) => (key, result),
            _ => {
                skipped.push(SkippedEntry {
                    section: String::new(),
                    key: entry
                        .key
                        .as_ref()
                        .map(|key| key.problem.clone())
                        .unwrap_or_default(),
                    reason: "entry has no key or no result".to_owned(),
                });
                continue;
            }
        };
        let section = match key.rank {
            Some(rank) => format!("{RANK_SECTION_PREFIX}{rank}"),
            None => SHARED_SECTION.to_owned(),
        };
        let exported = if key.namespace != NAMESPACE {
            Err(format!(
                "namespace {:?} is not {NAMESPACE:?}",
                key.namespace
            ))
        } else {
            exported_entry(key, result)
        };
        let exported = match exported {
            Ok(exported) => exported,
            Err(reason) => {
                skipped.push(SkippedEntry {
                    section,
                    key: key.problem.clone(),
                    reason,
                });
                continue;
            }
        };
        let section_position = *section_index.entry(section.clone()).or_insert_with(|| {
            sections.push((section.clone(), Vec::new()));
            sections.len() - 1
        });
        let section_entries = &mut sections[section_position].1;
        match entry_index.get(&(section_position, key.problem.clone())) {
            Some(&existing) => {
                let loser = if exported.time_us < section_entries[existing].time_us {
                    std::mem::replace(&mut section_entries[existing], exported)
                } else {
                    exported
                };
                skipped.push(SkippedEntry {
                    section,
                    key: key.problem.clone(),
                    reason: format!(
                        "another entry for this key has a lower time_us than {} (device {:?})",
                        loser.time_us, loser.device
                    ),
                });
            }
            None => {
                entry_index.insert(
                    (section_position, key.problem.clone()),
                    section_entries.len(),
                );
                section_entries.push(exported);
            }
        }
    }
    for rank in &options.empty_rank_sections {
        let section = format!("{RANK_SECTION_PREFIX}{rank}");
        if !section_index.contains_key(&section) {
            section_index.insert(section.clone(), sections.len());
            sections.push((section, Vec::new()));
        }
    }

    let metadata_json =
        RawValue::from_string(metadata.raw_json.clone()).map_err(TrtllmError::Serialize)?;
    let exported = sections.iter().map(|(_, entries)| entries.len()).sum();
    let compact = serde_json::to_string(&DocumentOut {
        metadata: &metadata_json,
        sections: &sections,
    })
    .map_err(TrtllmError::Serialize)?;
    Ok(ExportOutcome {
        json_text: python_indent_2(&compact),
        exported,
        skipped,
    })
}

/// One key of the exported file, with what deduplication needs.
struct ExportedEntry {
    problem: String,
    device: String,
    time_us: f64,
    runner_id: Box<RawValue>,
    tactic: Box<RawValue>,
    min_time: Box<RawValue>,
}

fn exported_entry(key: &Key, result: &TuneResult) -> Result<ExportedEntry, String> {
    let config: StoredConfig = serde_json::from_str(&result.config)
        .map_err(|err| format!("config is not a TensorRT-LLM config (runner_id, tactic): {err}"))?;
    check_loadable(&key.problem, &config)?;
    // Exact text first; then the number (possibly re-formatted by whoever stored the config);
    // then the cache's own time for configs that never carried min_time.
    let from_text = config
        .min_time_text
        .filter(|text| json_number(text).is_some())
        .and_then(|text| RawValue::from_string(text).ok());
    let min_time = match (from_text, config.min_time) {
        (Some(exact), _) => exact,
        (None, Some(number)) if json_number(number.get()).is_some() => number,
        _ if result.time_us.is_finite() && result.time_us >= 0.0 => {
            serde_json::value::to_raw_value(&(result.time_us / 1000.0))
                .map_err(|err| format!("could not write min_time: {err}"))?
        }
        _ => {
            return Err(format!(
                "time_us {} is not a finite, non-negative time",
                result.time_us
            ))
        }
    };
    Ok(ExportedEntry {
        problem: key.problem.clone(),
        device: key.device.clone(),
        time_us: result.time_us,
        runner_id: config.runner_id,
        tactic: config.tactic,
        min_time,
    })
}

/// Refuses what TensorRT-LLM's `load_cache` cannot read back: it indexes `ast.literal_eval(key)`
/// as a tuple, passes the `tactic` field (which must be a string) to `ast.literal_eval`, and
/// takes `runner_id` as an index.
fn check_loadable(problem: &str, config: &StoredConfig) -> Result<(), String> {
    match pyliteral::parse(problem) {
        Ok(pyliteral::LiteralKind::Tuple { first_is_str: true }) => {}
        Ok(_) => {
            return Err(
                "key is not a Python tuple whose first element is the op name, so the loader \
                 cannot index it"
                    .to_owned(),
            )
        }
        Err(reason) => return Err(format!("key is not a Python literal: {reason}")),
    }
    if serde_json::from_str::<i64>(config.runner_id.get()).is_err() {
        return Err(format!(
            "runner_id {} is not an integer",
            config.runner_id.get()
        ));
    }
    let tactic_repr: String = serde_json::from_str(config.tactic.get()).map_err(|_| {
        format!(
            "tactic is a JSON {}, not the string holding repr(tactic) that the loader reads",
            json_kind(config.tactic.get())
        )
    })?;
    pyliteral::parse(&tactic_repr)
        .map_err(|reason| format!("tactic {tactic_repr:?} is not a Python literal: {reason}"))?;
    Ok(())
}

struct DocumentOut<'a> {
    metadata: &'a RawValue,
    sections: &'a [(String, Vec<ExportedEntry>)],
}

impl Serialize for DocumentOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.sections.len() + 1))?;
        map.serialize_entry(METADATA_SECTION, self.metadata)?;
        for (section, entries) in self.sections {
            map.serialize_entry(section, &SectionOut(entries))?;
        }
        map.end()
    }
}

struct SectionOut<'a>(&'a [ExportedEntry]);

impl Serialize for SectionOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct EntryOut<'a> {
            runner_id: &'a RawValue,
            tactic: &'a RawValue,
            min_time: &'a RawValue,
        }
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for entry in self.0 {
            map.serialize_entry(
                &entry.problem,
                &EntryOut {
                    runner_id: &entry.runner_id,
                    tactic: &entry.tactic,
                    min_time: &entry.min_time,
                },
            )?;
        }
        map.end()
    }
}

/// `<file>.lock`: the lock TensorRT-LLM's writers take around their read-merge-rename of
/// the cache file: a POSIX lock (`fcntl.lockf`) in the newest versions, `flock(LOCK_EX)`
/// (py-filelock) in earlier ones. On Linux the two kinds do not exclude each other, so
/// [`WriterLock`] takes both.
pub fn lock_path(cache_path: &Path) -> PathBuf {
    let mut name = cache_path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The writers' lock on a cache file, held until dropped (closing the descriptor releases it).
#[derive(Debug)]
pub struct WriterLock {
    _file: fs::File,
}

/// How often a blocked [`WriterLock::acquire`] tries again.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl WriterLock {
    /// Takes `<cache_path>.lock` exclusively (both kinds of lock, see [`lock_path`]), waiting
    /// at most `timeout` for the writer that holds it. The lock file is created if missing (0644) and never followed if it is a
    /// symlink: the cache may sit in a directory other users can write.
    pub fn acquire(cache_path: &Path, timeout: std::time::Duration) -> Result<Self, TrtllmError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let path = lock_path(cache_path);
        let lock_error = |source| TrtllmError::Lock {
            path: path.clone(),
            source,
        };
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(lock_error)?;
        let metadata = file.metadata().map_err(lock_error)?;
        if !metadata.is_file() {
            return Err(lock_error(std::io::Error::other("not a regular file")));
        }
        let started = std::time::Instant::now();
        let busy = |error: &std::io::Error| {
            matches!(
                error.raw_os_error(),
                Some(libc::EWOULDBLOCK | libc::EACCES | libc::EINTR)
            )
        };
        loop {
            let fd = file.as_raw_fd();
            // SAFETY: flock and lockf on a descriptor this function owns.
            let error = if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                std::io::Error::last_os_error()
            } else if unsafe { libc::lockf(fd, libc::F_TLOCK, 0) } == 0 {
                // Both held; closing the descriptor releases both.
                return Ok(WriterLock { _file: file });
            } else {
                let error = std::io::Error::last_os_error();
                // SAFETY: as above; never hold one lock while waiting for the other.
                unsafe { libc::flock(fd, libc::LOCK_UN) };
                error
            };
            if !busy(&error) {
                return Err(lock_error(error));
            }
            if started.elapsed() >= timeout {
                return Err(TrtllmError::LockTimeout {
                    path,
                    waited: timeout,
                });
            }
            std::thread::sleep(LOCK_POLL);
        }
    }
}

/// Most bytes [`read_existing`] reads of a cache file.
pub const MAX_CACHE_FILE_BYTES: u64 = 1 << 30;

/// The text of the cache file at `path`, `None` when there is none. Not followed if it is a
/// symlink, refused unless it is a regular file of at most [`MAX_CACHE_FILE_BYTES`].
pub fn read_existing(path: &Path) -> Result<Option<String>, TrtllmError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_error = |source| TrtllmError::Read {
        path: path.to_owned(),
        source,
    };
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    };
    let metadata = file.metadata().map_err(read_error)?;
    if !metadata.is_file() {
        return Err(read_error(std::io::Error::other("not a regular file")));
    }
    if metadata.len() > MAX_CACHE_FILE_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "{} bytes, more than the {MAX_CACHE_FILE_BYTES} read",
            metadata.len()
        ))));
    }
    let mut text = String::new();
    file.take(MAX_CACHE_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    Ok(Some(text))
}

/// Replaces the file at `path` with `bytes` so that readers see the old file or the new one,
/// never a part: a temporary file in the same directory, synced, then renamed over `path`, as
/// TensorRT-LLM's current writers do. The new file keeps the old one's permissions (0644 when
/// there was none). Hold the [`WriterLock`] around reading, merging and this call.
///
/// Older TensorRT-LLM writers rewrote the file in place under `flock` on the file itself; one of
/// those still running would write to the replaced inode, so do not export while they run.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TrtllmError> {
    let write_error = |source| TrtllmError::Write {
        path: path.to_owned(),
        source,
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut temporary = tempfile::Builder::new()
        .prefix(".tunecache-trtllm-")
        .suffix(".tmp")
        .tempfile_in(directory)
        .map_err(write_error)?;
    temporary.write_all(bytes).map_err(write_error)?;
    // NamedTempFile creates the file 0600; a cache file other users' ranks read needs more.
    let permissions = match fs::metadata(path) {
        Ok(existing) => Some(existing.permissions()),
        Err(_) => default_file_permissions(),
    };
    if let Some(permissions) = permissions {
        temporary
            .as_file()
            .set_permissions(permissions)
            .map_err(write_error)?;
    }
    temporary.as_file().sync_all().map_err(write_error)?;
    temporary
        .persist(path)
        .map_err(|persist_error| write_error(persist_error.error))?;
    // The rename is only durable once the directory is synced.
    fs::File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(write_error)?;
    Ok(())
}

#[cfg(unix)]
fn default_file_permissions() -> Option<fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    Some(fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn default_file_permissions() -> Option<fs::Permissions> {
    None
}

/// `Some(rank)` inside: the section's `Key.rank`; `None` inside: the shared section.
#[derive(Debug, Clone, Copy)]
struct SectionRank(Option<u32>);

/// The rank of a section name, `None` for a name that is not an entry section. Leading zeros are
/// refused, since export would write `rank_01` back as `rank_1`.
fn section_rank(section: &str) -> Option<SectionRank> {
    if section == SHARED_SECTION {
        return Some(SectionRank(None));
    }
    let digits = section.strip_prefix(RANK_SECTION_PREFIX)?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return None;
    }
    digits.parse().ok().map(|rank| SectionRank(Some(rank)))
}

/// The custom op name: the first element of the key, Python's `str()` of a tuple, whose string
/// elements are quoted with `'` (or `"` when the text holds a `'` and no `"`).
fn custom_op_from_key(key: &str) -> Result<String, String> {
    let after_paren = key
        .trim_start()
        .strip_prefix('(')
        .ok_or("key is not a Python tuple: it does not start with '('")?;
    let mut chars = after_paren.trim_start().chars();
    let quote = match chars.next() {
        Some(quote @ ('\'' | '"')) => quote,
        _ => return Err("the key tuple's first element is not a quoted string".to_owned()),
    };
    let mut op = String::new();
    loop {
        match chars.next() {
            None => return Err("the key tuple's first string is not terminated".to_owned()),
            Some(c) if c == quote => break,
            Some('\\') => op.push(python_escape(&mut chars)?),
            Some(c) => op.push(c),
        }
    }
    let rest = chars.as_str().trim_start();
    if !rest.starts_with(',') && !rest.starts_with(')') {
        return Err(
            "the key tuple's first string is followed by something other than ',' or ')'"
                .to_owned(),
        );
    }
    if op.is_empty() {
        return Err("the custom op name in the key is empty".to_owned());
    }
    Ok(op)
}

/// Decodes the escape after a backslash in a Python string repr.
fn python_escape(chars: &mut std::str::Chars<'_>) -> Result<char, String> {
    fn hex(chars: &mut std::str::Chars<'_>, digits: usize) -> Result<char, String> {
        let text: String = chars.by_ref().take(digits).collect();
        if text.len() != digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "bad \\x/\\u/\\U escape in the custom op name: {text:?}"
            ));
        }
        u32::from_str_radix(&text, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| format!("escape \\{text} in the custom op name is not a character"))
    }
    match chars.next() {
        Some('\\') => Ok('\\'),
        Some('\'') => Ok('\''),
        Some('"') => Ok('"'),
        Some('n') => Ok('\n'),
        Some('r') => Ok('\r'),
        Some('t') => Ok('\t'),
        Some('x') => hex(chars, 2),
        Some('u') => hex(chars, 4),
        Some('U') => hex(chars, 8),
        Some(other) => Err(format!(
            "unsupported escape \\{other} in the custom op name"
        )),
        None => Err("the key ends inside an escape".to_owned()),
    }
}

/// The value of JSON number text; `None` for any other JSON.
fn json_number(json: &str) -> Option<f64> {
    // Rust's parser also takes "inf" and "NaN", which JSON numbers never spell.
    let looks_numeric = json.starts_with(|c: char| c == '-' || c.is_ascii_digit());
    if !looks_numeric || serde_json::from_str::<&RawValue>(json).is_err() {
        return None;
    }
    // std's parser rounds correctly; serde_json's default one may be off by an ulp.
    json.parse::<f64>().ok()
}

fn json_kind(json: &str) -> &'static str {
    match json.trim_start().chars().next() {
        Some('{') => "object",
        Some('[') => "array",
        Some('"') => "string",
        Some('t' | 'f') => "boolean",
        Some('n') => "null",
        _ => "number",
    }
}

fn describe_optional(value: &Option<serde_json::Value>) -> String {
    match value {
        None => "nothing".to_owned(),
        Some(value) => value.to_string(),
    }
}

fn parse_device_capability(value: Option<&serde_json::Value>) -> Option<(u32, u32)> {
    let as_u32 = |value: &serde_json::Value| value.as_u64().and_then(|n| u32::try_from(n).ok());
    match value? {
        serde_json::Value::Array(parts) if parts.len() == 2 => {
            Some((as_u32(&parts[0])?, as_u32(&parts[1])?))
        }
        serde_json::Value::String(text) => {
            let (major, minor) = text.split_once('.')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        }
        _ => None,
    }
}

/// A JSON object's members in file order, values as their raw text. serde_json's own map sorts
/// keys (unless the workspace-wide `preserve_order` feature is on), and the file order is what
/// export restores.
struct OrderedRawObject(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for OrderedRawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = OrderedRawObject;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = access.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(OrderedRawObject(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

struct Deduplicated<T> {
    kept: Vec<(String, T)>,
    /// Names of the members that a later one with the same name replaced.
    dropped: Vec<String>,
}

/// Python's json.load semantics for repeated names: the position of the first, the value of the
/// last.
fn keep_last_duplicate<T>(members: Vec<(String, T)>) -> Deduplicated<T> {
    let mut kept: Vec<(String, T)> = Vec::with_capacity(members.len());
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut dropped = Vec::new();
    for (name, value) in members {
        match position.get(&name) {
            Some(&existing) => {
                kept[existing].1 = value;
                dropped.push(name);
            }
            None => {
                position.insert(name.clone(), kept.len());
                kept.push((name, value));
            }
        }
    }
    Deduplicated { kept, dropped }
}

/// Quotes the bare `NaN`, `Infinity` and `-Infinity` that Python's json.dump writes for
/// non-finite floats, outside strings, so that serde_json parses the file. Those letters never
/// occur outside strings in valid JSON, so nothing valid is changed.
fn quote_python_nonfinite_literals(text: &str) -> Cow<'_, str> {
    const LITERALS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    let bytes = text.as_bytes();
    let mut rewritten: Option<String> = None;
    let mut copied_up_to = 0;
    let mut in_string = false;
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if in_string {
            match byte {
                b'\\' => index += 1,
                b'"' => in_string = false,
                _ => {}
            }
            index += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            index += 1;
            continue;
        }
        if let Some(literal) = LITERALS
            .iter()
            .find(|literal| bytes[index..].starts_with(literal.as_bytes()))
        {
            // `index` sits on an ASCII byte, so it is a char boundary.
            let out = rewritten.get_or_insert_with(|| String::with_capacity(text.len() + 16));
            out.push_str(&text[copied_up_to..index]);
            out.push('"');
            out.push_str(literal);
            out.push('"');
            index += literal.len();
            copied_up_to = index;
            continue;
        }
        index += 1;
    }
    match rewritten {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied_up_to..]);
            Cow::Owned(out)
        }
    }
}

/// Removes the whitespace outside strings, so that metadata stored in a config is one line.
fn strip_json_whitespace(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

/// Lays out valid JSON text as Python's `json.dump(obj, f, indent=2)` does (TensorRT-LLM's writer):
/// two-space indent, `": "` after keys, empty containers as `{}` / `[]`, and, as with Python's
/// default `ensure_ascii=True`, every non-ASCII character (and DEL) in strings as `\uXXXX`.
/// Scalars, escapes included, are copied as they are.
fn python_indent_2(json: &str) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            if escaped {
                escaped = false;
                out.push(c);
            } else if c == '\\' {
                escaped = true;
                out.push(c);
            } else if c == '"' {
                in_string = false;
                out.push(c);
            } else if c.is_ascii() && c != '\u{7f}' {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.peek().is_some_and(|next| next.is_ascii_whitespace()) {
                    chars.next();
                }
                out.push(c);
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as TensorRT-LLM writes it (json.dump, indent=2), with odd tactic reprs and float
    /// min_times; `1e-3` is not how Python spells 0.001, which checks that text is kept as is.
    const PYTHON_WRITTEN_FILE: &str = r#"{
  "metadata": {
    "lib_version": "1.1.0rc2",
    "creation_timestamp": 1718000000.1234567,
    "device_name": "NVIDIA H200",
    "device_capability": [
      9,
      0
    ]
  },
  "rank_0": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "(128, 'tile \"(a)\"', ('x', 2))",
      "min_time": 0.1
    },
    "('trtllm::fp8_gemm', 'Fp8Runner', '-123', ((8, 4096), (4096, 4096)))": {
      "runner_id": 2,
      "tactic": "17",
      "min_time": 1e-3
    }
  },
  "shared": {
    "(\"it's::op\", 'R', ())": {
      "runner_id": 1,
      "tactic": "{'tile': (64, 128), 'stages': 3}",
      "min_time": 12.345678901234567
    }
  },
  "rank_1": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "-1",
      "min_time": 7
    },
    "('caf\u00e9::op',)": {
      "runner_id": 3,
      "tactic": "None",
      "min_time": 2.5e-05
    }
  },
  "rank_2": {}
}"#;

    fn entry_for<'a>(entries: &'a [Entry], problem: &str, rank: Option<u32>) -> &'a Entry {
        entries
            .iter()
            .find(|entry| {
                let key = entry.key.as_ref().expect("key");
                key.problem == problem && key.rank == rank
            })
            .unwrap_or_else(|| panic!("no entry for {problem} rank {rank:?}"))
    }

    #[test]
    fn import_maps_every_entry() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        assert!(outcome.skipped.is_empty(), "{:?}", outcome.skipped);
        assert_eq!(outcome.entries.len(), 5);
        let metadata = outcome.metadata.expect("metadata");
        assert_eq!(
            metadata.device_fingerprint(),
            "NVIDIA H200|sm_90|trtllm 1.1.0rc2"
        );
        assert_eq!(metadata.creation_unix_ms, Some(1_718_000_000_123));

        let gemm = entry_for(
            &outcome.entries,
            "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)",
            Some(0),
        );
        let key = gemm.key.as_ref().expect("key");
        assert_eq!(key.namespace, "trtllm");
        assert_eq!(key.op, "trtllm::fused_moe::gemm1");
        assert_eq!(key.device, "NVIDIA H200|sm_90|trtllm 1.1.0rc2");
        let result = gemm.result.as_ref().expect("result");
        assert_eq!(result.time_us, 100.0);
        assert_eq!(result.tuned_at_unix_ms, 1_718_000_000_123);
        let config: serde_json::Value = serde_json::from_str(&result.config).expect("config json");
        assert_eq!(config["runner_id"], 0);
        assert_eq!(config["tactic"], "(128, 'tile \"(a)\"', ('x', 2))");
        assert_eq!(config["min_time_text"], "0.1");
        let stored_metadata: serde_json::Value = serde_json::from_str(
            config["trtllm_metadata_json"]
                .as_str()
                .expect("metadata text"),
        )
        .expect("metadata json");
        assert_eq!(stored_metadata["device_name"], "NVIDIA H200");

        let shared = entry_for(&outcome.entries, "(\"it's::op\", 'R', ())", None);
        assert_eq!(shared.key.as_ref().expect("key").op, "it's::op");
        let milli = entry_for(
            &outcome.entries,
            "('trtllm::fp8_gemm', 'Fp8Runner', '-123', ((8, 4096), (4096, 4096)))",
            Some(0),
        );
        assert_eq!(milli.result.as_ref().expect("result").time_us, 1.0);
        let unicode = entry_for(&outcome.entries, "('caf\u{e9}::op',)", Some(1));
        assert_eq!(unicode.key.as_ref().expect("key").op, "caf\u{e9}::op");
    }

    #[test]
    fn export_of_import_gives_back_the_same_bytes() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        let metadata = outcome.metadata.expect("metadata");
        let options = ExportOptions {
            empty_rank_sections: vec![2],
        };
        let exported = export(&outcome.entries, &metadata, &options).expect("export");
        assert!(exported.skipped.is_empty(), "{:?}", exported.skipped);
        assert_eq!(exported.exported, 5);
        assert_eq!(exported.json_text, PYTHON_WRITTEN_FILE);
    }

    /// The daemon may store a config re-serialized through a plain JSON value, which sorts keys
    /// and re-formats numbers; the export must still restore the file's exact values.
    #[test]
    fn export_restores_exact_values_after_config_is_reserialized() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        let mut stored = outcome.entries.clone();
        for entry in &mut stored {
            let result = entry.result.as_mut().expect("result");
            let value: serde_json::Value = serde_json::from_str(&result.config).expect("json");
            result.config = value.to_string();
        }
        let metadata = TrtllmMetadata::from_entries(&stored).expect("metadata in configs");
        assert_eq!(
            metadata.device_fingerprint(),
            "NVIDIA H200|sm_90|trtllm 1.1.0rc2"
        );
        let exported = export(
            &stored,
            &metadata,
            &ExportOptions {
                empty_rank_sections: vec![2],
            },
        )
        .expect("export");
        let reimported = import(&exported.json_text).expect("reimport");
        assert_eq!(reimported.entries.len(), 5);
        assert!(exported.json_text.contains("\"min_time\": 1e-3"));
        assert!(exported
            .json_text
            .contains("\"min_time\": 12.345678901234567"));
        assert!(exported.json_text.contains("\"min_time\": 2.5e-05"));
        assert!(exported
            .json_text
            .contains("\"creation_timestamp\": 1718000000.1234567"));
    }

    #[test]
    fn bad_entries_are_skipped_and_counted() {
        let file = r#"{
          "metadata": {"lib_version": "x", "creation_timestamp": 1.0,
                       "device_name": "NVIDIA A100-SXM4-80GB", "device_capability": [8, 0]},
          "rank_0": {
            "('good::op', 1)": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "not a tuple": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "(42, 'op')": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "('no_runner',)": {"tactic": "1", "min_time": 0.5},
            "('float_runner',)": {"runner_id": 0.5, "tactic": "1", "min_time": 0.5},
            "('no_tactic',)": {"runner_id": 0, "min_time": 0.5},
            "('string_time',)": {"runner_id": 0, "tactic": "1", "min_time": "0.5"},
            "('negative_time',)": {"runner_id": 0, "tactic": "1", "min_time": -0.5},
            "('infinite_time',)": {"runner_id": 0, "tactic": "-1", "min_time": Infinity},
            "('not_object',)": [0, "1", 0.5],
            "('dup::op',)": {"runner_id": 0, "tactic": "1", "min_time": 9.0},
            "('dup::op',)": {"runner_id": 1, "tactic": "2", "min_time": 3.0}
          },
          "rank_x": {},
          "rank_07": {},
          "shared": "not an object"
        }"#;
        let outcome = import(file).expect("import");
        let mut skipped_keys: Vec<&str> = outcome
            .skipped
            .iter()
            .map(|skipped| {
                if skipped.key.is_empty() {
                    skipped.section.as_str()
                } else {
                    skipped.key.as_str()
                }
            })
            .collect();
        skipped_keys.sort_unstable();
        assert_eq!(
            skipped_keys,
            vec![
                "('dup::op',)",
                "('float_runner',)",
                "('infinite_time',)",
                "('negative_time',)",
                "('no_runner',)",
                "('no_tactic',)",
                "('not_object',)",
                "('string_time',)",
                "(42, 'op')",
                "not a tuple",
                "rank_07",
                "rank_x",
                "shared",
            ],
            "{:#?}",
            outcome.skipped
        );
        assert!(outcome
            .skipped
            .iter()
            .all(|skipped| !skipped.reason.is_empty()));
        let infinite = outcome
            .skipped
            .iter()
            .find(|skipped| skipped.key == "('infinite_time',)")
            .expect("infinite");
        assert!(infinite.reason.contains("Infinity"), "{}", infinite.reason);

        assert_eq!(outcome.entries.len(), 2);
        let dup = entry_for(&outcome.entries, "('dup::op',)", Some(0));
        assert_eq!(dup.result.as_ref().expect("result").time_us, 3000.0);
        let good = entry_for(&outcome.entries, "('good::op', 1)", Some(0));
        assert_eq!(
            good.key.as_ref().expect("key").device,
            "NVIDIA A100-SXM4-80GB|sm_80|trtllm x"
        );
    }

    #[test]
    fn file_that_is_not_a_json_object_is_an_error() {
        assert!(matches!(
            import("{\"metadata\": "),
            Err(TrtllmError::NotJson(_))
        ));
        assert!(matches!(
            import("not json at all"),
            Err(TrtllmError::NotJson(_))
        ));
        assert!(matches!(import(""), Err(TrtllmError::NotJson(_))));
        assert!(matches!(
            import("[1, 2]"),
            Err(TrtllmError::NotAnObject { found: "array" })
        ));
        assert!(matches!(
            import("\"text\""),
            Err(TrtllmError::NotAnObject { found: "string" })
        ));
        let message = import("[]").map(|_| ()).expect_err("array").to_string();
        assert!(message.contains("not an object"), "{message}");
    }

    #[test]
    fn metadata_is_required_unless_a_device_is_given() {
        let file = r#"{"rank_0": {"('op',)": {"runner_id": 0, "tactic": "1", "min_time": 1}}}"#;
        assert!(matches!(import(file), Err(TrtllmError::MissingMetadata)));
        let options = ImportOptions {
            device: Some("NVIDIA H200|sm_90|cuda 12.8".to_owned()),
        };
        let outcome = import_with(file, &options).expect("import with device");
        assert!(outcome.metadata.is_none());
        assert_eq!(
            outcome.entries[0].key.as_ref().expect("key").device,
            "NVIDIA H200|sm_90|cuda 12.8"
        );
        let bad_metadata = r#"{"metadata": {"device_name": "X"}}"#;
        assert!(matches!(
            import(bad_metadata),
            Err(TrtllmError::BadMetadata(_))
        ));
    }

    fn native_entry(
        namespace: &str,
        problem: &str,
        device: &str,
        config: &str,
        time_us: f64,
    ) -> Entry {
        Entry {
            key: Some(Key {
                namespace: namespace.to_owned(),
                op: "trtllm::op".to_owned(),
                device: device.to_owned(),
                problem: problem.to_owned(),
                rank: Some(0),
            }),
            result: Some(TuneResult {
                config: config.to_owned(),
                time_us,
                tuned_by: "rank 0".to_owned(),
                tuned_at_unix_ms: 0,
            }),
        }
    }

    #[test]
    fn export_skips_foreign_entries_and_keeps_the_fastest_duplicate() {
        let entries = vec![
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                "GPU|sm_90|cuda 12.8",
                r#"{"runner_id": 1, "tactic": "5"}"#,
                250.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                "GPU|sm_90",
                r#"{"runner_id": 0, "tactic": "7"}"#,
                100.0,
            ),
            native_entry(
                "bitblas",
                "('trtllm::op', 2)",
                "GPU|sm_90",
                r#"{"runner_id": 0, "tactic": "7"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 3)",
                "GPU|sm_90",
                r#"{"block": 128}"#,
                1.0,
            ),
        ];
        let metadata = TrtllmMetadata::for_device("GPU|sm_90|cuda 12.8").expect("metadata");
        assert_eq!(metadata.device_capability, (9, 0));
        assert!(TrtllmMetadata::from_entries(&entries).is_none());
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert_eq!(exported.exported, 1);
        assert_eq!(exported.skipped.len(), 3, "{:?}", exported.skipped);
        let file: serde_json::Value = serde_json::from_str(&exported.json_text).expect("json");
        let winner = &file["rank_0"]["('trtllm::op', 1)"];
        assert_eq!(winner["runner_id"], 0);
        assert_eq!(winner["tactic"], "7");
        // No min_time in a natively recorded config: time_us / 1000.
        assert_eq!(winner["min_time"], 0.1);
        assert_eq!(file["metadata"]["device_name"], "GPU");
        assert_eq!(
            file["metadata"]["device_capability"],
            serde_json::json!([9, 0])
        );
        assert!(file["metadata"]["lib_version"].is_string());
        assert!(file["metadata"]["creation_timestamp"].is_f64());
    }

    /// Each of these once reached the file and broke TensorRT-LLM's loader at start-up.
    #[test]
    fn export_skips_entries_the_loader_cannot_read_back() {
        let device = "GPU|sm_90|trtllm 1.0";
        let entries = vec![
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                device,
                r#"{"runner_id": 0, "tactic": [1, 2]}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 2)",
                device,
                r#"{"runner_id": 0, "tactic": {"a": 1}}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "42",
                device,
                r#"{"runner_id": 0, "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 3)",
                device,
                r#"{"runner_id": 0, "tactic": 7}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 4)",
                device,
                r#"{"runner_id": 0, "tactic": "Tactic(3)"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 5",
                device,
                r#"{"runner_id": 0, "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 6)",
                device,
                r#"{"runner_id": "0", "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 7)",
                device,
                r#"{"runner_id": 0, "tactic": "{'tile': (64, 128)}"}"#,
                1.0,
            ),
        ];
        let metadata = TrtllmMetadata::for_device(device).expect("metadata");
        assert_eq!(metadata.device_fingerprint(), device);
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert_eq!(exported.exported, 1, "{:#?}", exported.skipped);
        let reasons: Vec<(&str, &str)> = exported
            .skipped
            .iter()
            .map(|skipped| (skipped.key.as_str(), skipped.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 7, "{reasons:#?}");
        for (key, expected) in [
            ("('trtllm::op', 1)", "JSON array"),
            ("('trtllm::op', 2)", "JSON object"),
            ("42", "not a Python tuple"),
            ("('trtllm::op', 3)", "JSON number"),
            ("('trtllm::op', 4)", "not a Python literal"),
            ("('trtllm::op', 5", "key is not a Python literal"),
            ("('trtllm::op', 6)", "runner_id"),
        ] {
            let reason = reasons
                .iter()
                .find(|(skipped_key, _)| *skipped_key == key)
                .map(|(_, reason)| *reason)
                .unwrap_or_else(|| panic!("{key} not skipped: {reasons:#?}"));
            assert!(reason.contains(expected), "{key}: {reason}");
        }
        let file: serde_json::Value = serde_json::from_str(&exported.json_text).expect("json");
        assert_eq!(
            file["rank_0"]["('trtllm::op', 7)"]["tactic"],
            "{'tile': (64, 128)}"
        );
        assert_eq!(file["metadata"]["lib_version"], "1.0");
    }

    #[test]
    fn writer_lock_waits_for_the_holder_and_times_out_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache.json");
        let held = WriterLock::acquire(&cache, std::time::Duration::ZERO).expect("first lock");
        assert!(lock_path(&cache).is_file());
        let started = std::time::Instant::now();
        let error = WriterLock::acquire(&cache, std::time::Duration::from_millis(300))
            .expect_err("held elsewhere");
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));
        assert!(matches!(error, TrtllmError::LockTimeout { .. }), "{error}");
        assert!(error.to_string().contains("cache.json.lock"), "{error}");
        let waiter = std::thread::spawn({
            let cache = cache.clone();
            move || WriterLock::acquire(&cache, std::time::Duration::from_secs(30)).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
        waiter
            .join()
            .expect("join")
            .expect("acquired once released");
        // A symlink planted at the lock path is not followed.
        let other = dir.path().join("other.json");
        std::os::unix::fs::symlink(dir.path().join("target"), lock_path(&other)).expect("symlink");
        assert!(matches!(
            WriterLock::acquire(&other, std::time::Duration::ZERO),
            Err(TrtllmError::Lock { .. })
        ));
        assert!(!dir.path().join("target").exists());
    }

    #[test]
    fn device_fingerprints_map_to_capabilities() {
        let blackwell = TrtllmMetadata::for_device("NVIDIA B200|sm_100").expect("sm_100");
        assert_eq!(blackwell.device_capability, (10, 0));
        assert_eq!(blackwell.device_fingerprint(), "NVIDIA B200|sm_100");
        for bad in [
            "",
            "NVIDIA H200",
            "NVIDIA H200|90",
            "NVIDIA H200|sm_9",
            "|sm_90",
        ] {
            assert!(
                matches!(
                    TrtllmMetadata::for_device(bad),
                    Err(TrtllmError::BadDeviceFingerprint(_))
                ),
                "{bad:?}"
            );
        }
        let string_capability = TrtllmMetadata::from_json(
            r#"{"device_name": "NVIDIA L4", "device_capability": "8.9"}"#,
        )
        .expect("string capability");
        assert_eq!(string_capability.device_fingerprint(), "NVIDIA L4|sm_89");
    }

    #[test]
    fn non_ascii_keys_are_written_as_python_escapes() {
        let entries = vec![native_entry(
            "trtllm",
            "('caf\u{e9}::op', '\u{1f600}')",
            "GPU|sm_90",
            r#"{"runner_id": 0, "tactic": "1", "min_time": 0.5}"#,
            500.0,
        )];
        let metadata = TrtllmMetadata::for_device("GPU|sm_90").expect("metadata");
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert!(
            exported
                .json_text
                .contains(r#""('caf\u00e9::op', '\ud83d\ude00')": {"#),
            "{}",
            exported.json_text
        );
        let reimported = import(&exported.json_text).expect("reimport");
        assert_eq!(
            reimported.entries[0].key.as_ref().expect("key").problem,
            "('caf\u{e9}::op', '\u{1f600}')"
        );
    }

    #[test]
    fn custom_op_parsing_follows_python_repr() {
        assert_eq!(custom_op_from_key("('a::b', 1)").as_deref(), Ok("a::b"));
        assert_eq!(custom_op_from_key("(\"it's\",)").as_deref(), Ok("it's"));
        assert_eq!(
            custom_op_from_key(r#"('it\'s \"x\"', 1)"#).as_deref(),
            Ok("it's \"x\"")
        );
        assert_eq!(
            custom_op_from_key(r"('tab\there\x41\u00e9',)").as_deref(),
            Ok("tab\thereA\u{e9}")
        );
        assert_eq!(custom_op_from_key("('only')").as_deref(), Ok("only"));
        assert!(custom_op_from_key("('unterminated, 1)").is_err());
        assert!(custom_op_from_key("('', 1)").is_err());
        assert!(custom_op_from_key("('a'b', 1)").is_err());
        assert!(custom_op_from_key(r"('bad\q',)").is_err());
        assert!(custom_op_from_key("[ 'a' ]").is_err());
    }

    #[test]
    fn python_indent_matches_json_dump_layout() {
        assert_eq!(python_indent_2("{}"), "{}");
        assert_eq!(python_indent_2(r#"{"a":[],"b":{ },"c":[1,{"d":"x, y: {z}"}]}"#),
            "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1,\n    {\n      \"d\": \"x, y: {z}\"\n    }\n  ]\n}");
        assert_eq!(
            python_indent_2(r#"["q\"\\",1]"#),
            "[\n  \"q\\\"\\\\\",\n  1\n]"
        );
    }

    #[test]
    fn nonfinite_literals_are_quoted_only_outside_strings() {
        assert_eq!(
            quote_python_nonfinite_literals(
                r#"{"NaN": [NaN, -Infinity, Infinity], "s": "Infinity\"NaN"}"#
            ),
            r#"{"NaN": ["NaN", "-Infinity", "Infinity"], "s": "Infinity\"NaN"}"#
        );
        assert!(matches!(
            quote_python_nonfinite_literals("{\"a\": 1}"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn write_atomically_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("autotuner_cache.json");
        write_atomically(&path, b"{\"old\": 1}").expect("first write");
        write_atomically(&path, b"{\"new\": 2}").expect("second write");
        assert_eq!(fs::read(&path).expect("read"), b"{\"new\": 2}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("autotuner_cache.json")]
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
        }
        let missing_dir = dir.path().join("missing").join("cache.json");
        assert!(matches!(
            write_atomically(&missing_dir, b"{}"),
            Err(TrtllmError::Write { .. })
        ));
    }
}
