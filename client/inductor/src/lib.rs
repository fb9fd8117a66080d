//! PyTorch Inductor's autotune cache files (torch 2.15.0, under `TORCHINDUCTOR_CACHE_DIR`)
//! mapped to tunecache entries and back: the one rule that the Python drop-in
//! (`tunecache.integrations.inductor`, through the binding `tunecache._native`) and the
//! `tunecache` CLI's `import inductor` / `export inductor` share, so that what one writes the
//! others read.
//!
//! Their files, under a cache directory:
//!
//! ```text
//! <dir>/cache/<system_hash>       json.dumps({"system": system, "cache": cache}, indent=4)
//!     cache = {op: {cache_key: {precision: {choice_hash: timing_ms}}}}
//! <dir>/<2 chars>/<hash>.best_config
//!     {"XBLOCK": 128, ..., "num_warps": 4, "num_stages": 1, "configs_hash": "...",
//!      "found_by_coordesc": false, "time_taken_ms": 12, "triton_cache_hash": null}
//! ```
//!
//! where `system` is `CacheBase.get_system()` (`hash`, and `device.name`, `version` when a GPU
//! was found) and the first file is what `PersistentCache` (the GEMM autotuner's
//! `select_algorithm` benchmarks) looks choices up in; a failed choice's timing is `inf`,
//! which Python's `json` writes as the bare token `Infinity` (`pyjson` reads and writes it).
//!
//! Mapping ([`key`], [`timings`]):
//!
//! | Key field | timing group `cache[op][cache_key][precision]` ([`NAMESPACE`]) | best config ([`BEST_CONFIG_NAMESPACE`]) |
//! |-----------|-----------------------------------------------------|------------------------------------------|
//! | `op`      | `op` (`mm`, `addmm`, ...)                           | [`BEST_CONFIG_OP`]                       |
//! | `device`  | `<device name>\|system <system hash>`                | empty                                    |
//! | `problem` | `<cache_key>\|precision <precision>\|choices <digest>` | `<dir>/<name>.best_config\|configs <configs_hash>` |
//! | `config`  | `{choice_hash: timing_ms}`, compact, sorted         | the file's object, compact               |
//! | `time_us` | the best finite timing, in µs                       | `time_taken_ms` * 1000                   |
//!
//! A best config's object keeps its members in the file's order (`json.dumps(data,
//! separators=(",", ":"))`). Its `time_taken_ms` is how long Inductor took to tune the kernel,
//! not how fast the kernel runs: the only time the file has, so among two configs for one key
//! the merge rule keeps the one found quicker; a file without one is recorded with 0.
//!
//! The digest is over the group's own choice hashes (sorted, deduplicated): Inductor serves a
//! lookup only when every choice it benchmarks has a timing in the group, so a group is one
//! problem per choice set. A file in which Inductor merged several lookups' choice lists under
//! one key (another backend list, a later run with more choices) holds their union, and is
//! imported as one entry keyed by the union; export merges entries of the same key into one
//! group again (ours win on the same choice hash), so the union is what every later lookup
//! finds.
//!
//! Modules: [`key`] (keys both ways), [`timings`] (a group's config and time), [`store`] (a
//! cache directory read, and what reading and writing share), [`export`] (one written),
//! `pyjson` (JSON as Python's `json` reads and writes it).

pub mod export;
pub mod key;
mod pyjson;
pub mod store;
pub mod timings;

pub use export::{export_cache_dir, ExportOutcome};
pub use key::{best_config_key, device, gemm_key, gemm_problem};
pub use store::{import_cache_dir, ImportOutcome, SkippedFile};
pub use timings::{timings_config, timings_of, timings_time_us};

/// `Key.namespace` of GEMM choice timings (`cache/<system_hash>`).
pub const NAMESPACE: &str = "inductor";
/// `Key.namespace` of kernels' best configs (`<2 chars>/<hash>.best_config`).
pub const BEST_CONFIG_NAMESPACE: &str = "inductor.best_config";
/// `Key.op` of every best config.
pub const BEST_CONFIG_OP: &str = "best_config";
