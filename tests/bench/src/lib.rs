//! Benchmark harness for tunecache. Owns the file-lock peer the daemon is compared against
//! (a re-implementation of the TensorRT-LLM autotuner cache file, before and after PR 22173),
//! its made-up tuning workload, the multi-rank scenario runner that any system under test
//! plugs into, the tunecache daemon as one such system, and the tables of BENCHMARKS.md
//! rendered from the runs' raw output (`current`).

pub mod cache_file;
pub mod current;
pub mod daemon;
pub mod filelock;
pub mod multinode;
pub mod python_ranks;
pub mod scenario;
pub mod segments;
pub mod tunecache_system;
pub mod workload;

pub use filelock::{FileLockCache, Variant};
pub use scenario::{
    run_peer_scenario, run_scenario, run_scenario_with_limit, FileLockPeer, RankReport,
    ScenarioResult, ScenarioSpec, SystemUnderTest,
};
