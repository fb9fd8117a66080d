//! Owns the `python-client` subcommand: issue 28's figures for Python ranks through the package,
//! the binding of the Rust client ("after") side by side with the grpcio package it replaced
//! ("before", from a source tree of its own) and the file-lock peers, in one run:
//!
//! - per process: CPU of `import tunecache` plus the first call, the threads it leaves and the
//!   memory it adds, over fresh processes, bare and with a framework's standard modules loaded;
//! - Scan: a 5,000-entry Scan through `Client.scan` against its floor, one round trip plus
//!   building the objects it returns from its very bytes;
//! - cold start: R Python ranks on local disk (the suite's scenario, E = 100), against the
//!   "before" file-lock peer (Rust and Python ranks) and each client's floor, R x (its parse of
//!   rank 0's Scan plus building the rank's cache) / cores.
//!
//! The results go to `python-client.json`, rendered into BENCHMARKS.md by `report`
//! (`python-process`, `python-scan`, `python-cold-start`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::workspace_binary;
use tunecache_bench::filelock::Variant;
use tunecache_bench::python_ranks::{
    measure_python_parse, PythonEnv, PythonFileLockPeer, PythonParse, PythonTunecacheSystem,
    PROCESS_COST_PY, SCAN_COST_PY,
};
use tunecache_bench::scenario::{
    run_scenario_with_limit, FileLockPeer, ScenarioSpec, SystemUnderTest,
};
use tunecache_bench::tunecache_system::{TunecacheSystem, DEVICE, NAMESPACE};

use super::{cores, machine_info, median, progress, row_from, MachineInfo, ScenarioRow};

/// What `python-client` was asked to do.
#[derive(Debug, Clone)]
pub struct PythonClientOptions {
    pub out_dir: PathBuf,
    /// `client/python`, whose `.venv` has the package's wheel installed.
    pub python_dir: PathBuf,
    /// The grpcio package before issue 28 (tests/bench/python/grpcio_before.sh).
    pub grpcio_dir: PathBuf,
    pub ranks: Vec<u32>,
    /// Fresh processes per client and mode for the per-process figures.
    pub processes: usize,
    /// Scans timed per client.
    pub scan_runs: usize,
    /// Cold-start runs per system and R (the median run is reported).
    pub cold_runs: usize,
    pub quick: bool,
    pub command_line: String,
}

/// One client's per-process cost, medians over fresh processes.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCost {
    pub client: String,
    /// "bare": a fresh interpreter; "preloaded": a framework's standard modules imported first.
    pub mode: String,
    pub processes: usize,
    pub import_cpu_ms: f64,
    pub first_call_cpu_ms: f64,
    pub cpu_ms: f64,
    /// The process's threads after the first call, the main thread included (the package's
    /// own are this minus one).
    pub threads: usize,
    pub rss_added_mib: f64,
}

/// One client's Scan against its floor.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ScanCost {
    pub client: String,
    pub entries: usize,
    pub wire_bytes: usize,
    pub runs: usize,
    pub scan_ms: f64,
    pub scan_min_ms: f64,
    pub scan_max_ms: f64,
    /// Building the objects the Scan returns from its bytes (the client's parse).
    pub build_ms: f64,
    /// One round trip through the client (an empty Lookup).
    pub echo_ms: f64,
    /// One bare health Check through a grpcio channel, for comparison.
    pub health_echo_ms: f64,
}

/// One cold-start cell: a system at one R.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    pub ranks: u32,
    /// Every run's row; `median` is the one with the median wall.
    pub runs: Vec<ScenarioRow>,
    pub median: ScenarioRow,
}

#[derive(Debug, Clone, Serialize)]
pub struct PythonClientResults {
    pub machine: MachineInfo,
    /// Load average (1, 5, 15 min) when the run started and ended.
    pub load_before: [f64; 3],
    pub load_after: [f64; 3],
    pub cores: usize,
    pub existing: usize,
    pub new_entries: usize,
    pub process: Vec<ProcessCost>,
    pub scan: Vec<ScanCost>,
    /// system -> cells, systems in run order.
    pub cold_start: Vec<(String, Vec<ColdStart>)>,
    /// Each tunecache client's parse floor per R (uncontended, medians).
    pub floors: Vec<(String, Vec<PythonParse>)>,
}

fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|field| field.parse::<f64>().unwrap_or(0.0));
    [
        fields.next().unwrap_or(0.0),
        fields.next().unwrap_or(0.0),
        fields.next().unwrap_or(0.0),
    ]
}

fn process_cost(
    env: &PythonEnv,
    socket: &Path,
    mode: &str,
    processes: usize,
) -> Result<ProcessCost> {
    #[derive(serde::Deserialize)]
    struct Sample {
        import_cpu_ms: f64,
        first_call_cpu_ms: f64,
        cpu_ms: f64,
        threads: usize,
        rss_added_kib: i64,
    }
    let mut samples = Vec::with_capacity(processes);
    for _ in 0..processes {
        let output = env
            .command(PROCESS_COST_PY)
            .arg(socket)
            .arg(mode)
            .output()
            .context("running process_cost.py")?;
        anyhow::ensure!(
            output.status.success(),
            "process_cost.py ({}) failed: {}",
            env.system,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        samples.push(serde_json::from_slice::<Sample>(&output.stdout).context("process_cost.py")?);
    }
    let pick =
        |field: fn(&Sample) -> f64| median(&mut samples.iter().map(field).collect::<Vec<_>>());
    let threads = samples.iter().map(|s| s.threads).max().unwrap_or(0);
    Ok(ProcessCost {
        client: env.system.to_owned(),
        mode: mode.to_owned(),
        processes,
        import_cpu_ms: pick(|s| s.import_cpu_ms),
        first_call_cpu_ms: pick(|s| s.first_call_cpu_ms),
        cpu_ms: pick(|s| s.cpu_ms),
        threads,
        rss_added_mib: pick(|s| s.rss_added_kib as f64) / 1024.0,
    })
}

fn scan_cost(env: &PythonEnv, socket: &Path, runs: usize) -> Result<ScanCost> {
    let output = env
        .command(SCAN_COST_PY)
        .arg(socket)
        .arg(NAMESPACE)
        .arg(DEVICE)
        .arg(runs.to_string())
        .output()
        .context("running scan_cost.py")?;
    anyhow::ensure!(
        output.status.success(),
        "scan_cost.py ({}) failed: {}",
        env.system,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let mut cost: ScanCost = serde_json::from_slice(&output.stdout).context("scan_cost.py")?;
    cost.client = env.system.to_owned();
    Ok(cost)
}

pub fn run(options: &PythonClientOptions) -> Result<PythonClientResults> {
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("creating {}", options.out_dir.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-pyclient-")
        .tempdir()
        .context("scratch directory")?;
    let binding = PythonEnv::find(&options.python_dir).map_err(anyhow::Error::msg)?;
    let grpcio = PythonEnv::find_grpcio(&options.grpcio_dir).map_err(anyhow::Error::msg)?;
    let envs = [binding.clone(), grpcio.clone()];
    let daemon_binary = workspace_binary("tunecached");
    anyhow::ensure!(
        daemon_binary.exists(),
        "{} not found: build it (cargo build --release -p tunecache-server)",
        daemon_binary.display()
    );
    let new_tunecache = |dir: &str| {
        TunecacheSystem::new(
            daemon_binary.clone(),
            workspace_binary("tunecache-rank"),
            &scratch.path().join(dir),
        )
    };
    let (existing, new_entries) = if options.quick {
        (200, 10)
    } else {
        (5_000, 100)
    };
    let mut results = PythonClientResults {
        machine: machine_info(&options.command_line),
        load_before: load_average(),
        load_after: [0.0; 3],
        cores: cores(),
        existing,
        new_entries,
        process: Vec::new(),
        scan: Vec::new(),
        cold_start: Vec::new(),
        floors: Vec::new(),
    };

    // Per process and Scan: one daemon holding the S existing entries of the scenario.
    let spec = |dir: &str, ranks: u32| ScenarioSpec {
        dir: scratch.path().join(dir),
        ranks,
        existing,
        new_entries,
        shared_fraction: 0.5,
    };
    let mut daemon = new_tunecache("daemon-calls")?;
    let calls = spec("calls", 8);
    daemon
        .prepare(&calls)
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    for mode in ["bare", "preloaded"] {
        for env in &envs {
            progress(&format!("per process: {} {mode} ...", env.system));
            results
                .process
                .push(process_cost(env, daemon.socket(), mode, options.processes)?);
        }
    }
    for env in &envs {
        progress(&format!("scan: {} ...", env.system));
        results
            .scan
            .push(scan_cost(env, daemon.socket(), options.scan_runs)?);
    }
    daemon
        .finish(&calls)
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    write(&options.out_dir, &results)?;

    // Cold start, local disk.
    let python_ranks = scratch.path().join("python-ranks");
    let mut filelock_py = PythonFileLockPeer::new(binding.clone(), &python_ranks);
    let mut binding_ranks =
        PythonTunecacheSystem::new(new_tunecache("daemons-py")?, binding.clone(), &python_ranks);
    let mut grpcio_ranks = PythonTunecacheSystem::new(
        new_tunecache("daemons-grpcio")?,
        grpcio.clone(),
        &python_ranks,
    );
    let mut before = FileLockPeer::new(Variant::Before, workspace_binary("filelock-rank"));
    let limit = Some(Duration::from_secs(120));
    let systems = ["before", "before-py", "tunecache-py-grpcio", "tunecache-py"];
    for system in systems {
        let mut cells = Vec::new();
        for &ranks in &options.ranks {
            let mut runs = Vec::new();
            for run in 0..options.cold_runs {
                progress(&format!(
                    "cold start: {system} R={ranks} run {} ...",
                    run + 1
                ));
                let spec = spec(&format!("{system}-r{ranks}-{run}"), ranks);
                let (result, snapshot) = match system {
                    "before" => (run_scenario_with_limit(&mut before, &spec, limit)?, None),
                    "before-py" => (
                        run_scenario_with_limit(&mut filelock_py, &spec, limit)?,
                        None,
                    ),
                    "tunecache-py-grpcio" => {
                        let result = run_scenario_with_limit(&mut grpcio_ranks, &spec, limit)?;
                        (result, Some(grpcio_ranks.inner.last_accounting.clone()))
                    }
                    _ => {
                        let result = run_scenario_with_limit(&mut binding_ranks, &spec, limit)?;
                        (result, Some(binding_ranks.inner.last_accounting.clone()))
                    }
                };
                let row = row_from(&result, "local", snapshot);
                progress(&format!(
                    "  wall {:.1} ms, {} failures",
                    row.wall_ms, row.failures
                ));
                runs.push(row);
                let _ = std::fs::remove_dir_all(&spec.dir);
            }
            let mut by_wall = runs.clone();
            by_wall.sort_by(|a, b| a.wall_ms.total_cmp(&b.wall_ms));
            let median_row = by_wall[by_wall.len() / 2].clone();
            cells.push(ColdStart {
                ranks,
                runs,
                median: median_row,
            });
        }
        results.cold_start.push((system.to_owned(), cells));
        write(&options.out_dir, &results)?;
    }
    let iterations = if options.quick { 3 } else { 21 };
    for env in &envs {
        progress(&format!("floor: {} ...", env.system));
        let mut floor_daemon = new_tunecache(&format!("daemon-floor-{}", env.system))?;
        let mut parses = Vec::new();
        for &ranks in &options.ranks {
            let spec = spec(&format!("floor-{}-r{ranks}", env.system), ranks);
            parses.push(
                measure_python_parse(env, &mut floor_daemon, &spec, iterations)
                    .map_err(anyhow::Error::msg)?,
            );
        }
        results.floors.push((env.system.to_owned(), parses));
    }
    results.load_after = load_average();
    write(&options.out_dir, &results)?;
    Ok(results)
}

fn write(out_dir: &Path, results: &PythonClientResults) -> Result<()> {
    let path = out_dir.join("python-client.json");
    let bytes = serde_json::to_vec_pretty(results)?;
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
}
