//! Owns what the drop-in benchmarks that run a Python script (`bitblas`, `flashinfer`, `inductor`)
//! share: running the script on the package's interpreter with the workspace's binaries, reading
//! the runs of each mode out of its JSON (`results`, one object per run with its `mode`), the wall
//! times of a mode's runs, a goal judged as a ratio against a floor, and writing `<kind>.json` and
//! `<kind>.md`. Each benchmark keeps only what is its own: its arguments, its per-mode figures and
//! its goals.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use tunecache_bench::daemon::workspace_binary;

use super::{load_average, machine_info, median, MachineInfo};

/// One goal of an issue: our median wall over a floor's, at most `at_most`.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub what: String,
    pub ratio: f64,
    pub at_most: f64,
    pub met: bool,
}

impl Goal {
    /// The goal `what`, judged when both figures are there; `strictly` for "faster than".
    pub fn judge(
        what: String,
        ours: Option<f64>,
        floor: Option<f64>,
        at_most: f64,
        strictly: bool,
    ) -> Option<Goal> {
        let ratio = ours? / floor?;
        Some(Goal {
            what,
            ratio,
            at_most,
            met: if strictly {
                ratio < at_most
            } else {
                ratio <= at_most
            },
        })
    }
}

/// What one run of a script benchmark gives every benchmark: the script's JSON, each mode's
/// summary (in the order the modes first ran), the machine and its load around the run.
pub struct ScriptRun<M> {
    pub raw: Value,
    pub modes: Vec<M>,
    pub machine: MachineInfo,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
}

/// Makes `out_dir`, runs `script` (`run_script`) and summarises each of its modes with
/// `summarise` (a mode it cannot summarise is left out).
pub fn run_modes<M>(
    out_dir: &Path,
    python: &Path,
    script: &Path,
    args: &[(&str, String)],
    command_line: &str,
    summarise: impl Fn(&Value, &str) -> Option<M>,
) -> Result<ScriptRun<M>> {
    std::fs::create_dir_all(out_dir)?;
    let load_average_start = load_average();
    let raw = run_script(python, script, args)?;
    let modes = modes_of(&raw)
        .into_iter()
        .filter_map(|mode| summarise(&raw, mode))
        .collect();
    Ok(ScriptRun {
        modes,
        raw,
        machine: machine_info(command_line),
        load_average_start,
        load_average_end: load_average(),
    })
}

/// Runs `script` on `python` with `args` and `--bin-dir` (where the workspace's binaries
/// are); its standard output, as JSON.
fn run_script(python: &Path, script: &Path, args: &[(&str, String)]) -> Result<Value> {
    let daemon = workspace_binary("tunecached");
    let bin_dir = daemon
        .parent()
        .context("the daemon binary has no directory")?;
    let name = script.file_name().map_or_else(
        || script.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    let mut command = Command::new(python);
    command.arg(script);
    for (flag, value) in args {
        command.arg(flag).arg(value);
    }
    let output = command
        .arg("--bin-dir")
        .arg(bin_dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !output.status.success() {
        bail!("{name} failed ({})", output.status);
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("{name}'s JSON"))
}

/// The runs of one mode in a script's `results`.
pub struct ModeRuns<'a>(Vec<&'a Value>);

impl<'a> ModeRuns<'a> {
    /// The runs of `mode`; None if it has none.
    pub fn of(raw: &'a Value, mode: &str) -> Option<ModeRuns<'a>> {
        let runs: Vec<&Value> = raw
            .get("results")?
            .as_array()?
            .iter()
            .filter(|run| run.get("mode").and_then(Value::as_str) == Some(mode))
            .collect();
        (!runs.is_empty()).then_some(ModeRuns(runs))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Each run's number `key` (NaN where a run lacks it).
    pub fn figures(&self, key: &str) -> Vec<f64> {
        self.0
            .iter()
            .map(|run| run.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN))
            .collect()
    }

    /// The median over runs of `key`.
    pub fn median(&self, key: &str) -> f64 {
        median(&mut self.figures(key))
    }

    /// Each run's count `key` (0 where a run lacks it).
    pub fn counts(&self, key: &str) -> Vec<u64> {
        self.0
            .iter()
            .map(|run| run.get(key).and_then(Value::as_u64).unwrap_or(0))
            .collect()
    }

    /// Whether every run says true for `key`.
    pub fn all(&self, key: &str) -> bool {
        self.0
            .iter()
            .all(|run| run.get(key).and_then(Value::as_bool) == Some(true))
    }

    /// The runs' `wall_s`: median, least, most.
    pub fn walls(&self) -> (f64, f64, f64) {
        let walls = self.figures("wall_s");
        (
            median(&mut walls.clone()),
            walls.iter().copied().fold(f64::INFINITY, f64::min),
            walls.iter().copied().fold(0.0, f64::max),
        )
    }
}

/// The modes of a script's `results`, each once, in the order they first ran.
fn modes_of(raw: &Value) -> Vec<&str> {
    let mut modes: Vec<&str> = Vec::new();
    for mode in raw
        .get("results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|run| run.get("mode").and_then(Value::as_str))
    {
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    modes
}

/// Writes `results` as `<kind>.json` and its table (`current::render`) as `<kind>.md` into
/// `out_dir`, and prints the table.
pub fn write_outputs(out_dir: &Path, kind: &str, results: &impl Serialize) -> Result<()> {
    let json = serde_json::to_value(results)?;
    std::fs::write(
        out_dir.join(format!("{kind}.json")),
        serde_json::to_string_pretty(&json)?,
    )?;
    let table = tunecache_bench::current::render(kind, &json)?;
    std::fs::write(out_dir.join(format!("{kind}.md")), &table)?;
    println!("{table}");
    Ok(())
}
