//! Owns the `flashinfer` subcommand: issue 57's benchmark. R FlashInfer rank processes run
//! `autotune_v2()` over K keys whose stand-in profile takes P ms, through the drop-in (an empty
//! daemon, then a warm one), side by side in one run with one rank alone and stock FlashInfer on a
//! local directory (cold, then warm) and on slowfs. The ranks and modes are
//! `tests/bench/python/flashinfer_tune.py`'s (its header says what each mode is); this module runs
//! it on the package's interpreter, summarises its runs per mode (medians), judges the issue's
//! goals and writes `flashinfer.json` and `flashinfer.md` (rendered into BENCHMARKS.md by
//! `report`, kind `flashinfer`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use super::script_bench::{run_modes, write_outputs, Goal, ModeRuns};
use super::MachineInfo;

/// The drop-in, cold, over one rank profiling alone, at most (issue 57).
pub const GOAL_COLD_AT_MOST: f64 = 1.2;
/// The drop-in, warm, over stock's warm start on a local disk, at most (issue 57).
pub const GOAL_WARM_AT_MOST: f64 = 1.5;

/// What `flashinfer` was asked to do.
#[derive(Debug, Clone)]
pub struct FlashinferOptions {
    pub out_dir: PathBuf,
    /// An interpreter with the package's wheel installed.
    pub python: PathBuf,
    pub ranks: usize,
    pub keys: usize,
    pub profile_ms: f64,
    /// slowfs latency; 0 for no slowfs mode.
    pub slowfs_ms: u64,
    pub runs: usize,
    pub command_line: String,
}

/// One mode's runs, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct ModeSummary {
    pub mode: String,
    pub runs: usize,
    pub wall_s_median: f64,
    pub wall_s_min: f64,
    pub wall_s_max: f64,
    /// The median over runs of each run's median rank time.
    pub rank_s_median: f64,
    /// Profiles run over all ranks, the median over runs.
    pub profiles_median: f64,
    /// Whether every rank of every run served the same tactics.
    pub ranks_agreeing: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlashinferResults {
    pub command_line: String,
    pub machine: MachineInfo,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub ranks: usize,
    pub keys: usize,
    pub profile_ms: f64,
    pub modes: Vec<ModeSummary>,
    pub goals: Vec<Goal>,
    /// The script's own output, every run of every mode.
    pub raw: Value,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/flashinfer_tune.py")
}

/// The runs of `mode` in the script's `results`, summarised; None if it has none.
pub fn summarise(raw: &Value, mode: &str) -> Option<ModeSummary> {
    let runs = ModeRuns::of(raw, mode)?;
    let (wall_s_median, wall_s_min, wall_s_max) = runs.walls();
    Some(ModeSummary {
        mode: mode.to_owned(),
        runs: runs.len(),
        wall_s_median,
        wall_s_min,
        wall_s_max,
        rank_s_median: runs.median("rank_s_median"),
        profiles_median: runs.median("profiles"),
        ranks_agreeing: runs.all("ranks_agreeing"),
    })
}

/// The two goals: the drop-in cold against one rank alone, warm against stock's warm
/// start on a local disk.
pub fn goals(modes: &[ModeSummary]) -> Vec<Goal> {
    let wall = |mode: &str| {
        modes
            .iter()
            .find(|summary| summary.mode == mode)
            .map(|summary| summary.wall_s_median)
    };
    [
        Goal::judge(
            "drop-in, cold: within 1.2x of one rank profiling alone".to_owned(),
            wall("dropin-cold"),
            wall("one-rank"),
            GOAL_COLD_AT_MOST,
            false,
        ),
        Goal::judge(
            "drop-in, warm: within 1.5x of stock's warm start on a local disk".to_owned(),
            wall("dropin-warm"),
            wall("stock-warm"),
            GOAL_WARM_AT_MOST,
            false,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Runs the benchmark and writes `flashinfer.json` and `flashinfer.md` into the out directory.
pub fn run(options: &FlashinferOptions) -> Result<FlashinferResults> {
    let run = run_modes(
        &options.out_dir,
        &options.python,
        &script(),
        &[
            ("--ranks", options.ranks.to_string()),
            ("--keys", options.keys.to_string()),
            ("--profile-ms", options.profile_ms.to_string()),
            ("--slowfs-ms", options.slowfs_ms.to_string()),
            ("--runs", options.runs.to_string()),
        ],
        &options.command_line,
        summarise,
    )?;
    let results = FlashinferResults {
        command_line: options.command_line.clone(),
        machine: run.machine,
        load_average_start: run.load_average_start,
        load_average_end: run.load_average_end,
        ranks: options.ranks,
        keys: options.keys,
        profile_ms: options.profile_ms,
        goals: goals(&run.modes),
        modes: run.modes,
        raw: run.raw,
    };
    write_outputs(&options.out_dir, "flashinfer", &results)?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw() -> Value {
        json!({"ranks": 8, "keys": 200, "results": [
            {"mode": "one-rank", "wall_s": 10.0, "rank_s_median": 10.0, "profiles": 200, "ranks_agreeing": true},
            {"mode": "stock-warm", "wall_s": 1.0, "rank_s_median": 0.8, "profiles": 0, "ranks_agreeing": true},
            {"mode": "dropin-cold", "wall_s": 11.0, "rank_s_median": 10.9, "profiles": 200, "ranks_agreeing": true},
            {"mode": "dropin-cold", "wall_s": 13.0, "rank_s_median": 12.9, "profiles": 200, "ranks_agreeing": false},
            {"mode": "dropin-warm", "wall_s": 1.4, "rank_s_median": 1.2, "profiles": 0, "ranks_agreeing": true},
        ]})
    }

    #[test]
    fn a_mode_is_summarised_over_its_runs_only() {
        let cold = summarise(&raw(), "dropin-cold").unwrap();
        assert_eq!((cold.runs, cold.wall_s_median), (2, 12.0));
        assert_eq!((cold.wall_s_min, cold.wall_s_max), (11.0, 13.0));
        assert_eq!(cold.profiles_median, 200.0);
        assert!(!cold.ranks_agreeing);
        assert!(summarise(&raw(), "slowfs-5ms").is_none());
    }

    #[test]
    fn the_goals_judge_cold_against_one_rank_and_warm_against_stock_warm() {
        let modes: Vec<_> = ["one-rank", "stock-warm", "dropin-cold", "dropin-warm"]
            .into_iter()
            .filter_map(|mode| summarise(&raw(), mode))
            .collect();
        let judged = goals(&modes);
        assert_eq!(judged.len(), 2);
        assert!((judged[0].ratio - 1.2).abs() < 1e-9 && judged[0].met);
        assert!((judged[1].ratio - 1.4).abs() < 1e-9 && judged[1].met);
        let slower = vec![
            modes[0].clone(),
            ModeSummary {
                wall_s_median: 12.5,
                ..modes[2].clone()
            },
        ];
        assert!(!goals(&slower)[0].met);
    }
}
