//! Owns the on-disk format of the TensorRT-LLM autotuner cache file that the file-lock peer
//! reads and writes: one JSON object with `"metadata"`, `"shared"` and one `"rank_<N>"`
//! section per rank, each section mapping a key (Python `str()` of the profiling tuple, first
//! element the custom op name) to `{"runner_id", "tactic", "min_time"}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Name of the section every rank of a tuning group holds alike.
pub const SHARED_SECTION: &str = "shared";
const METADATA_KEY: &str = "metadata";

/// Name of rank `rank`'s own section.
pub fn rank_section(rank: u32) -> String {
    format!("rank_{rank}")
}

/// One tuned result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    pub runner_id: i64,
    /// Python `repr()` of the chosen tactic.
    pub tactic: String,
    /// Best measured time in milliseconds.
    pub min_time: f64,
}

/// Key string -> entry.
pub type Section = BTreeMap<String, CacheEntry>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheMetadata {
    pub lib_version: String,
    pub creation_timestamp: f64,
    pub device_name: String,
    pub device_capability: (u32, u32),
}

impl CacheMetadata {
    /// Metadata a benchmark rank writes: fixed made-up device, current time.
    pub fn for_this_process() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs_f64())
            .unwrap_or(0.0);
        Self {
            lib_version: concat!("tunecache-bench-", env!("CARGO_PKG_VERSION")).to_string(),
            creation_timestamp: now,
            device_name: "NVIDIA H100 80GB HBM3".to_string(),
            device_capability: (9, 0),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid cache file: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: cache file is not a JSON object")]
    NotAnObject { path: PathBuf },
}

/// The whole cache file in memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheDocument {
    pub metadata: Option<CacheMetadata>,
    /// Section name (`shared`, `rank_<N>`) -> section.
    pub sections: BTreeMap<String, Section>,
}

impl CacheDocument {
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.get(name)
    }

    /// Merges `entries` into section `name`; `entries` win on a key both hold.
    pub fn merge_section(&mut self, name: &str, entries: &Section) {
        let section = self.sections.entry(name.to_string()).or_default();
        for (key, entry) in entries {
            section.insert(key.clone(), entry.clone());
        }
    }

    /// Whether section `name` already holds every one of `entries` with the same value.
    pub fn holds_all(&self, name: &str, entries: &Section) -> bool {
        let Some(section) = self.sections.get(name) else {
            return entries.is_empty();
        };
        entries
            .iter()
            .all(|(key, entry)| section.get(key) == Some(entry))
    }

    pub fn entry_count(&self) -> usize {
        self.sections.values().map(BTreeMap::len).sum()
    }

    /// Parses a cache file's bytes. Unknown top-level keys are sections.
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Self, CacheFileError> {
        let parse_error = |source| CacheFileError::Parse {
            path: path.to_path_buf(),
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(parse_error)?;
        let serde_json::Value::Object(object) = value else {
            return Err(CacheFileError::NotAnObject {
                path: path.to_path_buf(),
            });
        };
        let mut document = Self::default();
        for (name, body) in object {
            if name == METADATA_KEY {
                document.metadata = Some(serde_json::from_value(body).map_err(parse_error)?);
            } else {
                let section: Section = serde_json::from_value(body).map_err(parse_error)?;
                document.sections.insert(name, section);
            }
        }
        Ok(document)
    }

    /// Serializes as the autotuner does (`json.dump(..., indent=2)`-like layout).
    pub fn to_json(&self) -> Vec<u8> {
        let mut object = serde_json::Map::new();
        if let Some(metadata) = &self.metadata {
            object.insert(METADATA_KEY.to_string(), serde_json::json!(metadata));
        }
        for (name, section) in &self.sections {
            object.insert(name.clone(), serde_json::json!(section));
        }
        // Serializing a Value built from plain maps, strings and numbers cannot fail; fall
        // back to the compact form rather than panic if it ever did.
        serde_json::to_vec_pretty(&serde_json::Value::Object(object.clone()))
            .unwrap_or_else(|_| serde_json::Value::Object(object).to_string().into_bytes())
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, CacheFileError> {
        let bytes = std::fs::read(path).map_err(|source| CacheFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(path, &bytes)
    }
}
