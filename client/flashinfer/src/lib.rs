//! FlashInfer's managed autotune store (`flashinfer.autotune_cache.ManagedAutotuneCache`,
//! flashinfer-python 0.7.2.post1, `autotune_v2()`) mapped to tunecache entries and back: the one
//! rule that the Python drop-in (`tunecache.integrations.flashinfer`, through the binding
//! `tunecache._native`) and the `tunecache` CLI's `import flashinfer` / `export flashinfer`
//! share, so that what one writes the others read.
//!
//! Their store, under a root directory:
//!
//! ```text
//! <root>/v2/<env_hash>/manifest.json            json.dump(manifest, indent=2, sort_keys=True)
//! <root>/v2/<env_hash>/entries/<sha256(file_key)[:24]>.json
//!     {"key": file_key, "key_fields": ..., "profiling_policy": [...], "runner": ..., "tactic": ...}
//! ```
//!
//! where `env_hash` is the first 16 hex digits of the SHA-256 of the manifest (their
//! `_collect_metadata()` plus the measurement policy's fields, plus `"cache_schema": "v2"`) as
//! compact, key-sorted, ASCII-only JSON, and `file_key` is `str((custom_op, runner_class_name,
//! nearest_profile, extras))`.
//!
//! Mapping ([`entry`]):
//!
//! | Key field   | entry of their store (namespace [`NAMESPACE`])  | op unit (namespace [`OP_NAMESPACE`]) |
//! |-------------|--------------------------------------------------|--------------------------------------|
//! | `op`        | the key's `custom_op`, else `flashinfer`         | the same                             |
//! | `device`    | `<manifest gpu>|env <env_hash>`                  | the same                             |
//! | `problem`   | `file_key`, verbatim                             | `str((custom_op, nearest_profile, extras))` |
//!
//! `Result.config` holds their entry's members but `key` (`runner`, `tactic`, `key_fields`,
//! `profiling_policy`, each spelled as their `json.dump` spelled it) and `manifest` (the
//! manifest object, so that export can write `manifest.json`); an op unit's config also holds
//! `key`, the winner's `file_key`. The op unit is what a tuning takes its lease on: FlashInfer's
//! `choose_one` looks every runner's key up, profiles all runners and publishes only the
//! winner's, so the one problem tuned at a time is the op at one profile, whichever runner wins.
//!
//! Modules: [`key`] (a file_key's parts), [`manifest`] (the environment hash, device and
//! manifest file), [`entry`] (one entry both ways), [`store`] (a store directory read and
//! written), `jsontext` (JSON text as Python's `json` spells it).

pub mod entry;
mod jsontext;
pub mod key;
pub mod manifest;
pub mod store;

pub use entry::{entries_of, file_entry_of, FileEntry};
pub use key::FileKey;
pub use manifest::Manifest;
pub use store::{export_store, import_store, ExportOutcome, ImportOutcome, SkippedFile};

/// `Key.namespace` of their store's entries.
pub const NAMESPACE: &str = "flashinfer";
/// `Key.namespace` of the op units a tuning leases (see the crate doc).
pub const OP_NAMESPACE: &str = "flashinfer.op";
/// `Key.op` of an entry whose file_key names no custom op.
pub const DEFAULT_OP: &str = "flashinfer";
/// Their store's schema directory (`_SCHEMA`).
pub const SCHEMA: &str = "v2";
/// Their publish carries no timing: every result is recorded with this time, so the first
/// result recorded for a key stands against a later equal one (the merge rule's tie-break
/// decides between two at once).
pub const FIXED_TIME_US: f64 = 1.0;
