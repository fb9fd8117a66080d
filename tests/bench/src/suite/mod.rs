//! Owns the `suite` subcommand: the whole benchmark in one run. It mounts the filesystems
//! under test (local disk, slowfs at each latency), runs the scenario matrix (before / after
//! / tunecache x R, and with `--python` the Python ranks: the file-lock peer and tunecache
//! through the Python client) on each, measures the parse floors and the daemon
//! micro-benchmarks (`micro`), and writes the JSON results, the Markdown tables and the plot
//! (`report`).

pub mod artifacts;
pub mod bitblas;
pub mod bundles;
pub mod cluster;
pub mod cold_blob;
pub mod flashinfer;
mod forget_flood;
pub mod inductor;
pub mod lifecycle;
mod lifecycle_real;
pub mod lookup_load;
mod micro;
mod profile;
pub mod python_client;
mod replay;
mod report;
pub mod scale;
mod script_bench;
mod slowfs;
pub mod startup;
mod transport;
mod views;
mod views_hostile;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tunecache_bench::cache_file::CacheDocument;
use tunecache_bench::daemon::workspace_binary;
use tunecache_bench::filelock::Variant;
use tunecache_bench::python_ranks::{
    measure_python_parse, PythonEnv, PythonFileLockPeer, PythonParse, PythonTunecacheSystem,
};
use tunecache_bench::scenario::{
    run_scenario_with_limit, FileLockPeer, ScenarioResult, ScenarioSpec, SystemUnderTest,
};
use tunecache_bench::tunecache_system::{SnapshotAccounting, TunecacheSystem};
use tunecache_bench::workload::write_initial_cache;

pub use micro::MicroResults;

/// What the `suite` subcommand was asked to do.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub out_dir: PathBuf,
    pub quick: bool,
    /// Time limit of one scenario run.
    pub run_limit: Duration,
    pub skip_matrix: bool,
    pub skip_micro: bool,
    /// `client/python` with its `.venv`.
    pub python_dir: PathBuf,
    /// Add the Python ranks (file-lock "before" peer and tunecache through the Python client)
    /// to the matrix, and the Python parse floor.
    pub python: bool,
    /// Run the matrix on these filesystems only (labels: local, slowfs-<N>ms).
    pub filesystems: Option<Vec<String>>,
    /// Override R of the matrix.
    pub ranks: Option<Vec<u32>>,
    /// Override E (entries each rank tunes).
    pub new_entries: Option<usize>,
    /// The command line, recorded in the results.
    pub command_line: String,
}

/// One filesystem the matrix runs on.
#[derive(Debug, Clone, Serialize)]
pub struct FilesystemSpec {
    pub label: String,
    /// slowfs latency per operation; `None` for the local disk.
    pub latency_ms: Option<u64>,
}

/// The shape of the run, recorded with the results.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteSettings {
    pub quick: bool,
    /// The systems of the matrix, in run order (see [`ALL_SYSTEMS`]).
    pub systems: Vec<String>,
    pub ranks: Vec<u32>,
    pub existing: usize,
    pub new_entries: usize,
    pub shared_fraction: f64,
    pub run_limit_s: f64,
    pub filesystems: Vec<FilesystemSpec>,
    pub slowfs_threads: usize,
    /// Filesystems that were asked for but could not be used, with why.
    pub filesystems_skipped: Vec<String>,
}

/// The machine the numbers come from.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gib: f64,
    pub kernel: String,
    pub build_profile: String,
    pub command: String,
}

/// One scenario run, flattened for tables.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioRow {
    pub system: String,
    pub filesystem: String,
    pub ranks: u32,
    pub wall_ms: f64,
    pub timed_out: bool,
    /// Ranks that finished (all of them unless the run timed out or a rank failed).
    pub ranks_done: usize,
    /// Fewest and most entries a rank loaded.
    pub entries_loaded_min: usize,
    pub entries_loaded_max: usize,
    /// Median over ranks of each rank's time in cache calls (load + save).
    pub cache_ms_median: f64,
    /// Worst rank's time in cache calls (among the ranks that finished).
    pub cache_ms_worst: f64,
    pub load_ms_median: f64,
    pub load_ms_worst: f64,
    pub save_ms_median: f64,
    pub save_ms_worst: f64,
    /// Bytes written to the filesystem under test by ranks and daemon together.
    pub bytes_written: u64,
    pub saves_by_outcome: std::collections::BTreeMap<String, u32>,
    pub failures: usize,
    pub failure_examples: Vec<String>,
    /// tunecache only: the daemon's snapshot work.
    pub snapshot: Option<SnapshotAccounting>,
}

/// The floor: each rank parsing the S entries it loads, spread over the cores.
#[derive(Debug, Clone, Serialize)]
pub struct ParseFloor {
    pub existing: usize,
    pub file_bytes: u64,
    /// Median time to parse the whole S-entry cache file once.
    pub parse_ms_median: f64,
    pub cores: usize,
    /// (R, parse_ms x R / cores).
    pub floor_ms_by_ranks: Vec<(u32, f64)>,
}

/// Everything one suite run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteResults {
    pub machine: MachineInfo,
    pub settings: SuiteSettings,
    pub started_unix_s: u64,
    pub duration_s: f64,
    pub scenarios: Vec<ScenarioRow>,
    pub floor: Option<ParseFloor>,
    /// With `--python`: what one Python rank parses at least, per R (see [`PythonFloor`]).
    pub python_floor: Option<PythonFloor>,
    pub micro: Option<MicroResults>,
}

/// The Python floor: each rank's own parse of what it loads, spread over the cores.
#[derive(Debug, Clone, Serialize)]
pub struct PythonFloor {
    pub cores: usize,
    /// One uncontended Python process's medians, per R.
    pub by_ranks: Vec<PythonParse>,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .unwrap_or_default()
}

fn machine_info(command: &str) -> MachineInfo {
    let cpuinfo = read_trimmed("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let mem_total_kib = read_trimmed("/proc/meminfo")
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .unwrap_or(0.0);
    MachineInfo {
        nproc: cores(),
        cpu_model,
        mem_total_gib: mem_total_kib / (1024.0 * 1024.0),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        build_profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .to_owned(),
        command: command.to_owned(),
    }
}

/// `/proc/loadavg`'s three figures (what ran beside a benchmark).
fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|figure| figure.parse().ok())
        .collect()
}

pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn worst(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

fn row_from(
    result: &ScenarioResult,
    filesystem: &str,
    snapshot: Option<SnapshotAccounting>,
) -> ScenarioRow {
    let pick = |field: fn(&tunecache_bench::RankReport) -> f64| -> Vec<f64> {
        result.ranks.iter().map(field).collect()
    };
    let (mut cache, mut load, mut save) = (
        pick(|r| r.cache_ms),
        pick(|r| r.load_ms),
        pick(|r| r.save_ms),
    );
    ScenarioRow {
        system: result.system.clone(),
        filesystem: filesystem.to_owned(),
        ranks: result.spec.ranks,
        wall_ms: result.wall_ms,
        timed_out: result.timed_out,
        ranks_done: result.ranks.len(),
        entries_loaded_min: result
            .ranks
            .iter()
            .map(|r| r.entries_loaded)
            .min()
            .unwrap_or(0),
        entries_loaded_max: result
            .ranks
            .iter()
            .map(|r| r.entries_loaded)
            .max()
            .unwrap_or(0),
        cache_ms_worst: worst(&cache),
        cache_ms_median: median(&mut cache),
        load_ms_worst: worst(&load),
        load_ms_median: median(&mut load),
        save_ms_worst: worst(&save),
        save_ms_median: median(&mut save),
        bytes_written: result.bytes_written_total,
        saves_by_outcome: result.saves_by_outcome.clone(),
        failures: result.failures.len(),
        failure_examples: result.failures.iter().take(3).cloned().collect(),
        snapshot,
    }
}

/// Times parsing the S-entry cache file (what every rank must do at least once).
fn measure_parse_floor(
    scratch: &Path,
    existing: usize,
    ranks: &[u32],
    iterations: usize,
) -> Result<ParseFloor> {
    let path = scratch.join("floor.json");
    let largest = ranks.iter().copied().max().unwrap_or(1);
    let file_bytes = write_initial_cache(&path, largest, existing, 0.5)?;
    let bytes = std::fs::read(&path).with_context(|| path.display().to_string())?;
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let document = CacheDocument::from_json(&path, &bytes)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            document.entry_count() == existing,
            "floor file holds {} entries, not {existing}",
            document.entry_count()
        );
    }
    let parse_ms_median = median(&mut times);
    let cores = cores();
    Ok(ParseFloor {
        existing,
        file_bytes,
        parse_ms_median,
        cores,
        floor_ms_by_ranks: ranks
            .iter()
            .map(|&r| (r, parse_ms_median * f64::from(r) / cores as f64))
            .collect(),
    })
}

/// The Python floor for every R of the matrix (one daemon per R, set up as the scenario's).
fn measure_python_floor(
    env: &PythonEnv,
    daemon: &mut TunecacheSystem,
    dir: &Path,
    settings: &SuiteSettings,
    iterations: usize,
) -> Result<PythonFloor> {
    let mut by_ranks = Vec::with_capacity(settings.ranks.len());
    for &ranks in &settings.ranks {
        let spec = ScenarioSpec {
            dir: dir.join(format!("r{ranks}")),
            ranks,
            existing: settings.existing,
            new_entries: settings.new_entries,
            shared_fraction: settings.shared_fraction,
        };
        let parse =
            measure_python_parse(env, daemon, &spec, iterations).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            parse.file_entries == settings.existing,
            "python floor: the file holds {} entries, not {}",
            parse.file_entries,
            settings.existing
        );
        by_ranks.push(parse);
    }
    Ok(PythonFloor {
        cores: cores(),
        by_ranks,
    })
}

/// How a measuring subcommand's results were made (see [`Setup::info`]).
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub command_line: String,
    pub machine: MachineInfo,
    pub daemon: String,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
}

/// What a measuring subcommand holds from its first round to its results: the daemon binary
/// (which must exist), its output directory (and profile directory) made, a scratch directory,
/// a two-thread runtime, and the load average when it started.
struct Setup {
    name: &'static str,
    out_dir: PathBuf,
    daemon: PathBuf,
    scratch: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    load_average_start: Vec<f64>,
}

impl Setup {
    fn new(out_dir: &Path, perf_dir: Option<&Path>, name: &'static str) -> Result<Self> {
        let load_average_start = load_average();
        let daemon = workspace_binary("tunecached");
        anyhow::ensure!(daemon.exists(), "{} not found", daemon.display());
        for dir in std::iter::once(out_dir).chain(perf_dir) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(Self {
            name,
            out_dir: out_dir.to_path_buf(),
            daemon,
            scratch: tempfile::Builder::new()
                .prefix(&format!("tunecache-{name}-"))
                .tempdir()?,
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
            load_average_start,
        })
    }

    /// What every result of this run records about it: the command, the machine, the daemon,
    /// and the load average when it started and now.
    fn info(&self, command_line: &str) -> RunInfo {
        RunInfo {
            command_line: command_line.to_owned(),
            machine: machine_info(command_line),
            daemon: self.daemon.display().to_string(),
            load_average_start: self.load_average_start.clone(),
            load_average_end: load_average(),
        }
    }

    /// Writes `<name>.json` and `<name>.md` into the output directory, and prints the table.
    fn write(&self, results: &impl Serialize, table: &str) -> Result<()> {
        let json = self.out_dir.join(format!("{}.json", self.name));
        std::fs::write(&json, serde_json::to_string_pretty(results)?)
            .with_context(|| json.display().to_string())?;
        std::fs::write(self.out_dir.join(format!("{}.md", self.name)), table)?;
        println!("{table}");
        Ok(())
    }
}

/// Progress on stderr; the results go to files.
fn progress(message: &str) {
    eprintln!("[suite] {message}");
}

/// The Rust systems of the matrix, in run order.
const RUST_SYSTEMS: [&str; 3] = ["before", "after", "tunecache"];
/// Every system the matrix knows, in run order: the file-lock peer "before" and "after"
/// (Rust ranks), "before" with Python ranks, tunecache with Rust ranks and with Python ranks.
pub const ALL_SYSTEMS: [&str; 5] = ["before", "after", "before-py", "tunecache", "tunecache-py"];

struct Matrix<'a> {
    settings: &'a SuiteSettings,
    filelock_rank: PathBuf,
    tunecache: TunecacheSystem,
    /// With `--python`: the Python ranks' systems.
    python: Option<(PythonFileLockPeer, PythonTunecacheSystem)>,
}

impl Matrix<'_> {
    fn run_one(
        &mut self,
        system: &str,
        fs_label: &str,
        fs_root: &Path,
        ranks: u32,
    ) -> Result<ScenarioRow> {
        let spec = ScenarioSpec {
            dir: fs_root.join(format!("{system}-r{ranks}")),
            ranks,
            existing: self.settings.existing,
            new_entries: self.settings.new_entries,
            shared_fraction: self.settings.shared_fraction,
        };
        let limit = Some(Duration::from_secs_f64(self.settings.run_limit_s));
        let (result, snapshot) = match (system, self.python.as_mut()) {
            ("tunecache", _) => {
                let result = run_scenario_with_limit(&mut self.tunecache, &spec, limit)?;
                (result, Some(self.tunecache.last_accounting.clone()))
            }
            ("tunecache-py", Some((_, tunecache_py))) => {
                let result = run_scenario_with_limit(tunecache_py, &spec, limit)?;
                (result, Some(tunecache_py.inner.last_accounting.clone()))
            }
            ("before-py", Some((filelock_py, _))) => {
                (run_scenario_with_limit(filelock_py, &spec, limit)?, None)
            }
            ("tunecache-py" | "before-py", None) => {
                anyhow::bail!("{system} needs the Python ranks (--python)")
            }
            (variant, _) => {
                let variant = if variant == "before" {
                    Variant::Before
                } else {
                    Variant::After
                };
                let mut peer: Box<dyn SystemUnderTest> =
                    Box::new(FileLockPeer::new(variant, self.filelock_rank.clone()));
                (run_scenario_with_limit(peer.as_mut(), &spec, limit)?, None)
            }
        };
        let row = row_from(&result, fs_label, snapshot);
        // The run's files are not needed afterwards; a failed removal only costs space.
        let _ = std::fs::remove_dir_all(&spec.dir);
        Ok(row)
    }
}

/// Runs only the named micro-benchmarks (see `micro::run_selected`), with the suite's daemon.
pub fn run_micro_only(
    only: &[String],
    quick: bool,
    python_dir: Option<PathBuf>,
) -> Result<serde_json::Value> {
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-micro-")
        .tempdir()
        .context("scratch directory")?;
    let daemon_binary = workspace_binary("tunecached");
    anyhow::ensure!(
        daemon_binary.exists(),
        "{} not found: build it with cargo build --release -p tunecache-server",
        daemon_binary.display()
    );
    micro::run_selected(
        &micro::MicroOptions {
            quick,
            daemon_binary,
            slowfs_binary: workspace_binary("slowfs"),
            scratch: scratch.path().to_path_buf(),
            python_dir: python_dir.unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../client/python")
            }),
            slowfs_threads: 256,
            slowfs_latency_ms: if quick { 1 } else { 50 },
        },
        only,
    )
}

/// Runs the suite and writes `results.json`, `results.md` and `wall_vs_ranks.svg`.
pub fn run_suite(options: &SuiteOptions) -> Result<SuiteResults> {
    let started = Instant::now();
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("creating {}", options.out_dir.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-suite-")
        .tempdir()
        .context("scratch directory")?;
    let slowfs_threads = 256;
    let mut settings = if options.quick {
        SuiteSettings {
            quick: true,
            systems: Vec::new(),
            ranks: vec![2, 4],
            existing: 200,
            new_entries: 10,
            shared_fraction: 0.5,
            run_limit_s: options.run_limit.as_secs_f64(),
            filesystems: vec![
                FilesystemSpec {
                    label: "local".into(),
                    latency_ms: None,
                },
                FilesystemSpec {
                    label: "slowfs-1ms".into(),
                    latency_ms: Some(1),
                },
            ],
            slowfs_threads,
            filesystems_skipped: Vec::new(),
        }
    } else {
        SuiteSettings {
            quick: false,
            systems: Vec::new(),
            ranks: vec![8, 32, 128],
            existing: 5_000,
            new_entries: 50,
            shared_fraction: 0.5,
            run_limit_s: options.run_limit.as_secs_f64(),
            filesystems: vec![
                FilesystemSpec {
                    label: "local".into(),
                    latency_ms: None,
                },
                FilesystemSpec {
                    label: "slowfs-5ms".into(),
                    latency_ms: Some(5),
                },
                FilesystemSpec {
                    label: "slowfs-50ms".into(),
                    latency_ms: Some(50),
                },
            ],
            slowfs_threads,
            filesystems_skipped: Vec::new(),
        }
    };
    if let Some(ranks) = &options.ranks {
        settings.ranks.clone_from(ranks);
    }
    if let Some(new_entries) = options.new_entries {
        settings.new_entries = new_entries;
    }
    if let Some(wanted) = &options.filesystems {
        let known: Vec<String> = settings
            .filesystems
            .iter()
            .map(|fs| fs.label.clone())
            .collect();
        let mut chosen = Vec::new();
        for label in wanted {
            let latency_ms = match label.as_str() {
                "local" => None,
                other => Some(
                    other
                        .strip_prefix("slowfs-")
                        .and_then(|rest| rest.strip_suffix("ms"))
                        .and_then(|ms| ms.parse::<u64>().ok())
                        .with_context(|| {
                            format!(
                                "unknown filesystem {other:?}: local or slowfs-<N>ms (the suite's: {})",
                                known.join(", ")
                            )
                        })?,
                ),
            };
            chosen.push(FilesystemSpec {
                label: label.clone(),
                latency_ms,
            });
        }
        settings.filesystems = chosen;
    }
    let python_env = if options.python {
        Some(PythonEnv::find(&options.python_dir).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    settings.systems = ALL_SYSTEMS
        .iter()
        .filter(|system| options.python || RUST_SYSTEMS.contains(system))
        .map(|system| (*system).to_owned())
        .collect();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    let mut results = SuiteResults {
        machine: machine_info(&options.command_line),
        settings: settings.clone(),
        started_unix_s,
        duration_s: 0.0,
        scenarios: Vec::new(),
        floor: None,
        python_floor: None,
        micro: None,
    };

    let daemon_binary = workspace_binary("tunecached");
    let slowfs_binary = workspace_binary("slowfs");
    anyhow::ensure!(
        daemon_binary.exists(),
        "{} not found: build it (cargo build [--release] -p tunecache-server)",
        daemon_binary.display()
    );

    if !options.skip_matrix {
        let new_tunecache = |dir: &str| {
            TunecacheSystem::new(
                daemon_binary.clone(),
                workspace_binary("tunecache-rank"),
                &scratch.path().join(dir),
            )
        };
        let python = match &python_env {
            Some(env) => Some((
                PythonFileLockPeer::new(env.clone(), &scratch.path().join("python-ranks")),
                PythonTunecacheSystem::new(
                    new_tunecache("daemons-py")?,
                    env.clone(),
                    &scratch.path().join("python-ranks"),
                ),
            )),
            None => None,
        };
        let mut matrix = Matrix {
            settings: &settings,
            filelock_rank: workspace_binary("filelock-rank"),
            tunecache: new_tunecache("daemons")?,
            python,
        };
        let mut skipped = Vec::new();
        for filesystem in settings.filesystems.clone() {
            let fs_root = scratch.path().join(format!("fs-{}", filesystem.label));
            let mount = match filesystem.latency_ms {
                None => None,
                Some(latency_ms) => {
                    match slowfs::SlowMount::mount(
                        &slowfs_binary,
                        &fs_root,
                        latency_ms,
                        slowfs_threads,
                    ) {
                        Ok(mount) => Some(mount),
                        Err(err) => {
                            progress(&format!("skipping {}: {err:#}", filesystem.label));
                            skipped.push(format!("{}: {err:#}", filesystem.label));
                            continue;
                        }
                    }
                }
            };
            let root = mount
                .as_ref()
                .map(|mount| mount.mountpoint().to_path_buf())
                .unwrap_or_else(|| fs_root.clone());
            std::fs::create_dir_all(&root)?;
            for &ranks in &settings.ranks {
                for system in settings.systems.clone() {
                    let system = system.as_str();
                    progress(&format!("{} R={ranks} {system} ...", filesystem.label));
                    let row = matrix.run_one(system, &filesystem.label, &root, ranks)?;
                    progress(&format!(
                        "  wall {:.1} ms{}, cache median {:.1} ms, worst {:.1} ms, {} bytes, {} failures",
                        row.wall_ms,
                        if row.timed_out { " (timed out)" } else { "" },
                        row.cache_ms_median,
                        row.cache_ms_worst,
                        row.bytes_written,
                        row.failures
                    ));
                    results.scenarios.push(row);
                    report::write_outputs(&options.out_dir, &results)?;
                }
            }
            drop(mount);
        }
        settings.filesystems_skipped = skipped;
        results.settings = settings.clone();
        let iterations = if options.quick { 3 } else { 21 };
        results.floor = Some(measure_parse_floor(
            scratch.path(),
            settings.existing,
            &settings.ranks,
            iterations,
        )?);
        if let Some(env) = &python_env {
            progress("python parse floor ...");
            results.python_floor = Some(measure_python_floor(
                env,
                &mut new_tunecache("daemons-floor")?,
                &scratch.path().join("python-floor"),
                &settings,
                iterations,
            )?);
        }
        report::write_outputs(&options.out_dir, &results)?;
    }

    if !options.skip_micro {
        results.micro = Some(micro::run_micro(&micro::MicroOptions {
            quick: options.quick,
            daemon_binary,
            slowfs_binary,
            scratch: scratch.path().to_path_buf(),
            python_dir: options.python_dir.clone(),
            slowfs_threads,
            slowfs_latency_ms: if options.quick { 1 } else { 50 },
        })?);
    }
    results.duration_s = started.elapsed().as_secs_f64();
    report::write_outputs(&options.out_dir, &results)?;
    Ok(results)
}
