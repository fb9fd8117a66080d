//! Owns the `flashinfer` subcommand: issue 57's benchmark. R FlashInfer rank processes run
//! `autotune_v2()` over K keys whose stand-in profile takes P ms, through the drop-in (an empty
//! daemon, then a warm one), side by side in one run with one rank alone and stock FlashInfer on a
//! local directory (cold, then warm) and on slowfs. The ranks and modes are
//! `tests/bench/python/flashinfer_tune.py`'s (its header says what each mode is); this module runs
//! it on the package's interpreter, summarises its runs per mode (medians), judges the issue's
//! goals and writes `flashinfer.json` and `flashinfer.md` (rendered into BENCHMARKS.md by
//! `report`, kind `flashinfer`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use tunecache_bench::daemon::workspace_binary;

use super::{load_average, machine_info, median, MachineInfo};

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
pub struct Goal {
    pub what: String,
    pub ratio: f64,
    pub at_most: f64,
    pub met: bool,
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
    let runs: Vec<&Value> = raw
        .get("results")?
        .as_array()?
        .iter()
        .filter(|run| run.get("mode").and_then(Value::as_str) == Some(mode))
        .collect();
    if runs.is_empty() {
        return None;
    }
    let figures = |key: &str| -> Vec<f64> {
        runs.iter()
            .map(|run| run.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN))
            .collect()
    };
    let walls = figures("wall_s");
    Some(ModeSummary {
        mode: mode.to_owned(),
        runs: runs.len(),
        wall_s_median: median(&mut walls.clone()),
        wall_s_min: walls.iter().copied().fold(f64::INFINITY, f64::min),
        wall_s_max: walls.iter().copied().fold(0.0, f64::max),
        rank_s_median: median(&mut figures("rank_s_median")),
        profiles_median: median(&mut figures("profiles")),
        ranks_agreeing: runs
            .iter()
            .all(|run| run.get("ranks_agreeing").and_then(Value::as_bool) == Some(true)),
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
    let mut goals = Vec::new();
    let mut judge = |what: &str, ours: Option<f64>, floor: Option<f64>, at_most: f64| {
        if let (Some(ours), Some(floor)) = (ours, floor) {
            let ratio = ours / floor;
            goals.push(Goal {
                what: what.to_owned(),
                ratio,
                at_most,
                met: ratio <= at_most,
            });
        }
    };
    judge(
        "drop-in, cold: within 1.2x of one rank profiling alone",
        wall("dropin-cold"),
        wall("one-rank"),
        GOAL_COLD_AT_MOST,
    );
    judge(
        "drop-in, warm: within 1.5x of stock's warm start on a local disk",
        wall("dropin-warm"),
        wall("stock-warm"),
        GOAL_WARM_AT_MOST,
    );
    goals
}

/// Runs the benchmark and writes `flashinfer.json` and `flashinfer.md` into the out directory.
pub fn run(options: &FlashinferOptions) -> Result<FlashinferResults> {
    std::fs::create_dir_all(&options.out_dir)?;
    let daemon = workspace_binary("tunecached");
    let bin_dir = daemon
        .parent()
        .context("the daemon binary has no directory")?
        .to_owned();
    let load_average_start = load_average();
    let output = Command::new(&options.python)
        .arg(script())
        .args(["--ranks", &options.ranks.to_string()])
        .args(["--keys", &options.keys.to_string()])
        .args(["--profile-ms", &options.profile_ms.to_string()])
        .args(["--slowfs-ms", &options.slowfs_ms.to_string()])
        .args(["--runs", &options.runs.to_string()])
        .arg("--bin-dir")
        .arg(&bin_dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", options.python.display()))?;
    if !output.status.success() {
        bail!("flashinfer_tune.py failed ({})", output.status);
    }
    let raw: Value = serde_json::from_slice(&output.stdout).context("flashinfer_tune.py's JSON")?;
    let mut modes: Vec<ModeSummary> = Vec::new();
    for mode in raw
        .get("results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|run| run.get("mode").and_then(Value::as_str))
    {
        if !modes.iter().any(|summary| summary.mode == mode) {
            modes.extend(summarise(&raw, mode));
        }
    }
    let results = FlashinferResults {
        command_line: options.command_line.clone(),
        machine: machine_info(&options.command_line),
        load_average_start,
        load_average_end: load_average(),
        ranks: options.ranks,
        keys: options.keys,
        profile_ms: options.profile_ms,
        goals: goals(&modes),
        modes,
        raw,
    };
    let json = serde_json::to_value(&results)?;
    std::fs::write(
        options.out_dir.join("flashinfer.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let table = tunecache_bench::current::render("flashinfer", &json)?;
    std::fs::write(options.out_dir.join("flashinfer.md"), &table)?;
    println!("{table}");
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
