//! TensorRT-LLM autotuner cache interop: reads the JSON file that TensorRT-LLM's
//! `AutoTunerProfilingCache.save_cache` writes (the file at `TLLM_AUTOTUNER_CACHE_PATH`) into
//! tunecache entries, writes entries back out as a file its `load_cache` reads, and replaces such
//! a file under the writers' lock, for the `tunecache` CLI's import and export. The mapping of one
//! entry ([`entry`]) is also what the Python drop-in (`tunecache.integrations.trtllm`) uses,
//! through the binding `tunecache._native`: import, export and the drop-in accept and refuse the
//! same entries, by one implementation. The crate is not linked into the Rust client library.
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
//! Mapping of one file entry to a tunecache [`Entry`](tunecache_proto::v1::Entry) ([`entry`]
//! says which entries are accepted, and why):
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
//! (a tactic id may mean something else there).
//!
//! `Result.config` is a JSON object (see [`ImportedConfig`]) holding `runner_id`, `tactic` and
//! `min_time` exactly as the file spelled them, `min_time_text` (the same number as a string) and
//! `trtllm_metadata_json` (the file's metadata object, as a string), so that export restores every
//! value even after the daemon has stored the config. `Result.time_us` is `min_time * 1000`.
//!
//! Export lays the file out the way Python's `json.dump(..., indent=2)` does (TensorRT-LLM's own
//! writer), so every value (types and float bits included) survives a round trip; the order of
//! keys within a section is the cache's, not necessarily the original file's. Each exported entry
//! is checked by the same rule as an imported one ([`file_value_of`]).
//!
//! Modules:
//!
//! - [`entry`]: one entry's mapping both ways, and which entries are accepted;
//! - `format`: the file's layout: sections, the configs import writes and export reads, skips;
//! - `metadata`: the `"metadata"` object and the device fingerprint built from it;
//! - `import`: file text to entries;
//! - `export`: entries to file text, and the merge with the file being replaced;
//! - `lock`: the writers' lock on `<file>.lock`;
//! - `fileio`: reading the existing file and replacing it atomically;
//! - `rawjson`: JSON text kept as the file spelled it;
//! - [`pyjson`]: how Python's `json` reads and writes (duplicate names, `Infinity`, `indent=2`);
//! - [`pyliteral`]: the one parser of Python literals and string escapes.

pub mod entry;
mod error;
mod export;
mod fileio;
mod format;
mod import;
mod lock;
mod metadata;
pub mod pyjson;
pub mod pyliteral;
mod rawjson;
#[cfg(test)]
mod test_support;

pub use entry::{entry_from_file, file_value_of, EntryContext, FileValue};
pub use error::TrtllmError;
pub use export::{export, merge_file_entries, ExportOptions, ExportOutcome, FileMerge};
pub use fileio::{read_existing, write_atomically, MAX_CACHE_FILE_BYTES};
pub use format::{ImportedConfig, SkippedEntry, NAMESPACE};
pub use import::{import, import_with, ImportOptions, ImportOutcome};
pub use lock::{lock_path, WriterLock};
pub use metadata::TrtllmMetadata;
pub use rawjson::strip_json_whitespace;
