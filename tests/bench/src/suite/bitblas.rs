//! Owns the `bitblas` subcommand: issue 37's benchmark. R rank processes load a BitBLAS operator
//! database of N operators (2 MiB of files each) through the drop-in, side by side in one run
//! with the same ranks loading it with stock BitBLAS from a local directory and from the slowfs
//! stand-in of a slow shared filesystem. The ranks, the database and the modes are
//! `tests/bench/python/bitblas_load.py`'s (its header says what each mode is); this module runs
//! it on the package's interpreter, summarises its runs per mode (medians), judges the issue's
//! goals and writes `bitblas.json` and `bitblas.md` (rendered into BENCHMARKS.md by `report`,
//! kind `bitblas`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use super::script_bench::{run_modes, write_outputs, Goal, ModeRuns};
use super::MachineInfo;

/// The drop-in's wall over stock's from a local directory, at most (issue 37).
pub const GOAL_LOCAL_AT_MOST: f64 = 1.5;

/// What `bitblas` was asked to do.
#[derive(Debug, Clone)]
pub struct BitblasOptions {
    pub out_dir: PathBuf,
    /// An interpreter with the package's wheel installed.
    pub python: PathBuf,
    pub ops: usize,
    pub file_mib: f64,
    pub ranks: usize,
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
    /// The median over runs of each run's median rank load.
    pub load_s_median: f64,
    /// The fewest runtime modules (`tvm_rt_mod.tar` loaded) any rank of any run ended with.
    pub with_rt_mod_min: u64,
    /// Runtime modules loaded over all ranks and runs, and how many there were to load.
    pub with_rt_mod_total: u64,
    pub rt_mods_wanted: u64,
    pub ranks_failed: u64,
    /// The daemon's artifact bytes served (Stats), the median over runs.
    pub daemon_bytes_served_median: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BitblasResults {
    pub command_line: String,
    pub machine: MachineInfo,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub ops: usize,
    pub file_mib: f64,
    pub ranks: usize,
    pub modes: Vec<ModeSummary>,
    pub goals: Vec<Goal>,
    /// The script's own output, every run of every mode.
    pub raw: Value,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/bitblas_load.py")
}

/// The runs of `mode` in the script's `results`, summarised; None if it has none.
pub fn summarise(raw: &Value, mode: &str) -> Option<ModeSummary> {
    let runs = ModeRuns::of(raw, mode)?;
    let (wall_s_median, wall_s_min, wall_s_max) = runs.walls();
    let ops = raw.get("ops").and_then(Value::as_u64).unwrap_or(0);
    let ranks = raw.get("ranks").and_then(Value::as_u64).unwrap_or(0);
    Some(ModeSummary {
        mode: mode.to_owned(),
        runs: runs.len(),
        wall_s_median,
        wall_s_min,
        wall_s_max,
        load_s_median: runs.median("load_s_median"),
        with_rt_mod_min: runs
            .counts("with_rt_mod_min")
            .into_iter()
            .min()
            .unwrap_or(0),
        with_rt_mod_total: runs.counts("with_rt_mod_total").into_iter().sum(),
        rt_mods_wanted: ops * ranks * runs.len() as u64,
        ranks_failed: runs.counts("ranks_failed").into_iter().sum(),
        daemon_bytes_served_median: runs.median("daemon_bytes_served"),
    })
}

/// The two goals, judged on the cold-node drop-in against stock's local directory and
/// the slow shared directory.
pub fn goals(modes: &[ModeSummary]) -> Vec<Goal> {
    let wall = |mode: &str| {
        modes
            .iter()
            .find(|summary| summary.mode == mode)
            .map(|summary| summary.wall_s_median)
    };
    let slow = modes
        .iter()
        .find(|summary| summary.mode.starts_with("slowfs"));
    [
        Goal::judge(
            "within 1.5x of stock BitBLAS from a local directory".to_owned(),
            wall("dropin"),
            wall("local"),
            GOAL_LOCAL_AT_MOST,
            false,
        ),
        slow.and_then(|slow| {
            Goal::judge(
                format!(
                    "faster than stock BitBLAS from the slow shared directory ({})",
                    slow.mode
                ),
                wall("dropin"),
                Some(slow.wall_s_median),
                1.0,
                true,
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Runs the benchmark and writes `bitblas.json` and `bitblas.md` into the out directory.
pub fn run(options: &BitblasOptions) -> Result<BitblasResults> {
    let run = run_modes(
        &options.out_dir,
        &options.python,
        &script(),
        &[
            ("--ops", options.ops.to_string()),
            ("--file-mib", options.file_mib.to_string()),
            ("--ranks", options.ranks.to_string()),
            ("--slowfs-ms", options.slowfs_ms.to_string()),
            ("--runs", options.runs.to_string()),
        ],
        &options.command_line,
        summarise,
    )?;
    let results = BitblasResults {
        command_line: options.command_line.clone(),
        machine: run.machine,
        load_average_start: run.load_average_start,
        load_average_end: run.load_average_end,
        ops: options.ops,
        file_mib: options.file_mib,
        ranks: options.ranks,
        goals: goals(&run.modes),
        modes: run.modes,
        raw: run.raw,
    };
    write_outputs(&options.out_dir, "bitblas", &results)?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw() -> Value {
        json!({"ops": 100, "ranks": 8, "results": [
            {"mode": "dropin", "wall_s": 12.0, "load_s_median": 11.0, "with_rt_mod_min": 100,
             "with_rt_mod_total": 800, "ranks_failed": 0, "daemon_bytes_served": 230},
            {"mode": "local", "wall_s": 10.0, "load_s_median": 9.0, "with_rt_mod_min": 60,
             "with_rt_mod_total": 500, "ranks_failed": 0, "daemon_bytes_served": 0},
            {"mode": "dropin", "wall_s": 16.0, "load_s_median": 15.0, "with_rt_mod_min": 100,
             "with_rt_mod_total": 800, "ranks_failed": 0, "daemon_bytes_served": 250},
            {"mode": "slowfs-5ms", "wall_s": 50.0, "load_s_median": 40.0, "with_rt_mod_min": 90,
             "with_rt_mod_total": 780, "ranks_failed": 1, "daemon_bytes_served": 0},
        ]})
    }

    #[test]
    fn a_mode_is_summarised_over_its_runs_only() {
        let dropin = summarise(&raw(), "dropin").unwrap();
        assert_eq!(dropin.runs, 2);
        assert_eq!(dropin.wall_s_median, 14.0);
        assert_eq!((dropin.wall_s_min, dropin.wall_s_max), (12.0, 16.0));
        assert_eq!(dropin.with_rt_mod_total, 1600);
        assert_eq!(dropin.rt_mods_wanted, 1600);
        assert_eq!(dropin.daemon_bytes_served_median, 240.0);
        assert!(summarise(&raw(), "local-copies").is_none());
    }

    #[test]
    fn the_goals_judge_the_cold_drop_in_against_both_floors() {
        let modes: Vec<_> = ["dropin", "local", "slowfs-5ms"]
            .into_iter()
            .filter_map(|mode| summarise(&raw(), mode))
            .collect();
        let goals = goals(&modes);
        assert_eq!(goals.len(), 2);
        assert!((goals[0].ratio - 1.4).abs() < 1e-9);
        assert!(goals[0].met);
        assert!((goals[1].ratio - 0.28).abs() < 1e-9);
        assert!(goals[1].met);
        let slower = vec![
            ModeSummary {
                wall_s_median: 16.0,
                ..modes[0].clone()
            },
            modes[1].clone(),
        ];
        assert!(!goals_met(&slower));
    }

    fn goals_met(modes: &[ModeSummary]) -> bool {
        goals(modes).iter().all(|goal| goal.met)
    }
}
