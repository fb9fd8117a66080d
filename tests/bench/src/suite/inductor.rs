//! Owns the `inductor` subcommand: issue 58's benchmark. R PyTorch Inductor rank processes
//! compile the same S frozen `torch.nn.Linear`s with `torch.compile(mode="max-autotune")` on the
//! CPU, side by side in one run with one rank alone, stock Inductor on one shared cache directory,
//! stock with `distributed_max_autotune_gemm` in a gloo process group, and the drop-in on a fresh
//! daemon (cold) and on the same daemon again (warm). The ranks and modes are
//! `tests/bench/python/inductor_tune.py`'s (its header says what each mode is; the ranks are the
//! drop-in tests' `client/python/tests/inductor_rank.py`); this module runs it on the package's
//! interpreter, summarises its runs per mode (medians), judges the goals and writes
//! `inductor.json` and `inductor.md` (rendered into BENCHMARKS.md by `report`, kind `inductor`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use super::script_bench::{run_modes, write_outputs, ModeRuns};
use super::MachineInfo;

/// The drop-in, cold, over one rank compiling alone, at most (issue 58).
pub const GOAL_COLD_AT_MOST: f64 = 1.2;

/// The shapes of issue 58's benchmark: `[in_features, out_features, batch]`, six small Linears
/// whose C++ kernels build in seconds.
pub const DEFAULT_SHAPES: &str =
    "[[64,32,8],[96,48,8],[128,64,8],[160,80,8],[192,96,8],[224,112,8]]";

/// What `inductor` was asked to do.
#[derive(Debug, Clone)]
pub struct InductorOptions {
    pub out_dir: PathBuf,
    /// An interpreter with torch and the package's wheel installed.
    pub python: PathBuf,
    pub ranks: usize,
    /// JSON: `[[in_features, out_features, batch], ...]`.
    pub shapes: String,
    pub runs: usize,
    /// A directory holding numpy, on PYTHONPATH for `stock-distributed` only (torch.distributed's
    /// `all_gather_object` needs it; the package's interpreter may have none).
    pub numpy_dir: Option<PathBuf>,
    pub command_line: String,
}

/// One mode's runs, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct ModeSummary {
    pub mode: String,
    pub runs: usize,
    pub ranks: u64,
    pub wall_s_median: f64,
    pub wall_s_min: f64,
    pub wall_s_max: f64,
    /// The median over runs of each run's median rank time (its compiles, barrier to end).
    pub rank_s_median: f64,
    /// Benchmark rounds run over all ranks, the median over runs.
    pub rounds_median: f64,
    pub shapes: u64,
    /// The shapes on which every rank got the same winner, the least over runs.
    pub shapes_agreeing_min: u64,
    /// Whether every rank of every run got the same winner for every shape.
    pub ranks_agreeing: bool,
    /// Timing groups the directory's `cache/<system hash>` file kept at the end, the median over
    /// runs (stock keeps one per shape it did not lose to another rank's write).
    pub kept_groups_median: f64,
    /// Why the mode did not run as what it is named for, in some run (from what it measured).
    pub not_run: Option<String>,
}

/// One goal of issue 58, with the figure it is judged on.
#[derive(Debug, Clone, Serialize)]
pub struct InductorGoal {
    pub what: String,
    /// The figure judged: a ratio ("x") or a count of benchmark rounds ("rounds").
    pub measured: f64,
    pub unit: String,
    pub at_most: f64,
    pub met: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct InductorResults {
    pub command_line: String,
    pub machine: MachineInfo,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub ranks: usize,
    pub shapes: Value,
    /// The stock rank that built the shapes' C++ kernels before the modes, seconds.
    pub warm_up_s: f64,
    pub modes: Vec<ModeSummary>,
    pub goals: Vec<InductorGoal>,
    /// The script's own output, every run of every mode.
    pub raw: Value,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/inductor_tune.py")
}

/// The runs of `mode` in the script's `results`, summarised; None if it has none.
pub fn summarise(raw: &Value, mode: &str) -> Option<ModeSummary> {
    let runs = ModeRuns::of(raw, mode)?;
    let (wall_s_median, wall_s_min, wall_s_max) = runs.walls();
    let first = |key: &str| runs.counts(key).into_iter().max().unwrap_or(0);
    let not_run = raw
        .get("results")?
        .as_array()?
        .iter()
        .filter(|run| run.get("mode").and_then(Value::as_str) == Some(mode))
        .find(|run| run.get("ran").and_then(Value::as_bool) == Some(false))
        .map(|run| {
            run.get("reason")
                .and_then(Value::as_str)
                .unwrap_or("its ranks failed")
                .to_owned()
        });
    Some(ModeSummary {
        mode: mode.to_owned(),
        runs: runs.len(),
        ranks: first("ranks"),
        wall_s_median,
        wall_s_min,
        wall_s_max,
        rank_s_median: runs.median("rank_s_median"),
        rounds_median: runs.median("rounds"),
        shapes: first("shapes"),
        shapes_agreeing_min: runs
            .counts("shapes_agreeing")
            .into_iter()
            .min()
            .unwrap_or(0),
        ranks_agreeing: runs.all("ranks_agreeing"),
        kept_groups_median: runs.median("kept_groups"),
        not_run,
    })
}

/// The two goals: the drop-in cold against one rank compiling alone (wall), and the
/// drop-in warm running no benchmark round.
pub fn goals(modes: &[ModeSummary]) -> Vec<InductorGoal> {
    let find = |mode: &str| modes.iter().find(|summary| summary.mode == mode);
    let mut goals = Vec::new();
    if let (Some(cold), Some(alone)) = (find("dropin-cold"), find("alone")) {
        let ratio = cold.wall_s_median / alone.wall_s_median;
        goals.push(InductorGoal {
            what: "drop-in, cold: within 1.2x of one rank compiling alone".to_owned(),
            measured: ratio,
            unit: "x".to_owned(),
            at_most: GOAL_COLD_AT_MOST,
            met: ratio <= GOAL_COLD_AT_MOST,
        });
    }
    if let Some(warm) = find("dropin-warm") {
        goals.push(InductorGoal {
            what: "drop-in, warm: no benchmark round".to_owned(),
            measured: warm.rounds_median,
            unit: "rounds".to_owned(),
            at_most: 0.0,
            met: warm.rounds_median == 0.0,
        });
    }
    goals
}

/// Runs the benchmark and writes `inductor.json` and `inductor.md` into the out directory.
pub fn run(options: &InductorOptions) -> Result<InductorResults> {
    let shapes: Value = serde_json::from_str(&options.shapes)?;
    let mut args = vec![
        ("--ranks", options.ranks.to_string()),
        ("--shapes", shapes.to_string()),
        ("--runs", options.runs.to_string()),
    ];
    if let Some(numpy_dir) = &options.numpy_dir {
        args.push(("--numpy-dir", numpy_dir.display().to_string()));
    }
    let run = run_modes(
        &options.out_dir,
        &options.python,
        &script(),
        &args,
        &options.command_line,
        summarise,
    )?;
    let results = InductorResults {
        command_line: options.command_line.clone(),
        machine: run.machine,
        load_average_start: run.load_average_start,
        load_average_end: run.load_average_end,
        ranks: options.ranks,
        shapes,
        warm_up_s: run
            .raw
            .get("warm_up_s")
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN),
        goals: goals(&run.modes),
        modes: run.modes,
        raw: run.raw,
    };
    write_outputs(&options.out_dir, "inductor", &results)?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw() -> Value {
        json!({"ranks": 8, "shapes": [[64, 32, 8]], "warm_up_s": 50.0, "results": [
            {"mode": "alone", "ranks": 1, "shapes": 6, "wall_s": 10.0, "rank_s_median": 10.0, "rounds": 6,
             "shapes_agreeing": 6, "ranks_agreeing": true, "kept_groups": 6, "ran": true},
            {"mode": "stock", "ranks": 8, "shapes": 6, "wall_s": 40.0, "rank_s_median": 39.0, "rounds": 48,
             "shapes_agreeing": 2, "ranks_agreeing": false, "kept_groups": 3, "ran": true},
            {"mode": "stock-distributed", "ranks": 8, "shapes": 6, "wall_s": 41.0, "rounds": 48,
             "shapes_agreeing": 2, "kept_groups": 4, "ran": false, "reason": "distributed nothing"},
            {"mode": "dropin-cold", "ranks": 8, "shapes": 6, "wall_s": 11.0, "rank_s_median": 10.9, "rounds": 6,
             "shapes_agreeing": 6, "ranks_agreeing": true, "kept_groups": 0, "ran": true},
            {"mode": "dropin-cold", "ranks": 8, "shapes": 6, "wall_s": 13.0, "rank_s_median": 12.9, "rounds": 6,
             "shapes_agreeing": 5, "ranks_agreeing": false, "kept_groups": 0, "ran": true},
            {"mode": "dropin-warm", "ranks": 8, "shapes": 6, "wall_s": 8.0, "rank_s_median": 7.0, "rounds": 0,
             "shapes_agreeing": 6, "ranks_agreeing": true, "kept_groups": 0, "ran": true},
        ]})
    }

    #[test]
    fn a_mode_is_summarised_over_its_runs_only() {
        let cold = summarise(&raw(), "dropin-cold").unwrap();
        assert_eq!((cold.runs, cold.wall_s_median), (2, 12.0));
        assert_eq!((cold.wall_s_min, cold.wall_s_max), (11.0, 13.0));
        assert_eq!((cold.rounds_median, cold.shapes_agreeing_min), (6.0, 5));
        assert!(!cold.ranks_agreeing && cold.not_run.is_none());
        let stock = summarise(&raw(), "stock").unwrap();
        assert_eq!((stock.ranks, stock.kept_groups_median), (8, 3.0));
        assert!(summarise(&raw(), "slowfs").is_none());
    }

    #[test]
    fn a_mode_that_did_not_run_as_named_says_why() {
        let distributed = summarise(&raw(), "stock-distributed").unwrap();
        assert_eq!(distributed.not_run.as_deref(), Some("distributed nothing"));
        assert!(!distributed.ranks_agreeing);
    }

    #[test]
    fn the_goals_judge_cold_against_alone_and_warm_by_its_rounds() {
        let modes: Vec<_> = ["alone", "stock", "dropin-cold", "dropin-warm"]
            .into_iter()
            .filter_map(|mode| summarise(&raw(), mode))
            .collect();
        let judged = goals(&modes);
        assert_eq!(judged.len(), 2);
        assert!((judged[0].measured - 1.2).abs() < 1e-9 && judged[0].met);
        assert!(judged[1].measured == 0.0 && judged[1].met);
        let slower = vec![
            modes[0].clone(),
            ModeSummary {
                wall_s_median: 12.5,
                ..modes[2].clone()
            },
            ModeSummary {
                rounds_median: 1.0,
                ..modes[3].clone()
            },
        ];
        assert!(goals(&slower).iter().all(|goal| !goal.met));
    }
}
