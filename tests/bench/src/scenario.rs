//! Owns the multi-rank scenario runner: it starts R rank processes of a system under test,
//! releases them together through a barrier, collects each rank's one-line JSON report and
//! summarizes wall time, per-rank cache time and bytes written.
//!
//! Systems plug in through [`SystemUnderTest`]: the file-lock peer ([`FileLockPeer`]) is one;
//! the tunecache daemon side of the comparison is meant to be another, sharing the barrier
//! and collection code here.
//!
//! Rank process protocol (what `rank_command` must start): set up, print the line `ready` on
//! stdout, wait for EOF on stdin (the barrier: the runner closes every rank's stdin at once),
//! do the cache work, print one [`RankReport`] JSON line on stdout, exit 0.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::filelock::{Variant, DEFAULT_LOCK_TIMEOUT};
use crate::workload::write_initial_cache;

/// The line a rank prints once it waits at the barrier.
pub const READY_LINE: &str = "ready";
/// Cache file name the file-lock peer uses inside the scenario directory.
pub const CACHE_FILE_NAME: &str = "autotuner_cache.json";

/// The rank side of the barrier: announce readiness, then wait for EOF on stdin, which the
/// runner sends every rank at once.
pub fn wait_at_barrier() -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY_LINE}")?;
    stdout.flush()?;
    drop(stdout);
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
    Ok(())
}

/// What one rank process reports: its JSON line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: u32,
    pub system: String,
    /// Time in the load call.
    pub load_ms: f64,
    /// Time in the save call.
    pub save_ms: f64,
    /// Total time in cache calls (load + save); tuning itself is free in the benchmark.
    pub cache_ms: f64,
    pub bytes_written: u64,
    pub entries_loaded: usize,
    /// How the save ended (system-specific, e.g. `written`, `nothing_new`, `lock_timeout`).
    pub save_outcome: String,
    pub warnings: usize,
}

/// The shape of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioSpec {
    /// Directory the system keeps its state in (the cache file for the file-lock peer).
    pub dir: PathBuf,
    pub ranks: u32,
    /// Entries in the cache before the ranks start.
    pub existing: usize,
    /// Entries each rank tunes.
    pub new_entries: usize,
    /// Fraction of each rank's new entries that are shared (identical on every rank).
    pub shared_fraction: f64,
}

impl ScenarioSpec {
    /// The flags every rank binary takes from the scenario: `--rank`, `--new-entries` and
    /// `--shared-fraction`.
    pub fn rank_args<'a>(&self, command: &'a mut Command, rank: u32) -> &'a mut Command {
        command
            .arg("--rank")
            .arg(rank.to_string())
            .arg("--new-entries")
            .arg(self.new_entries.to_string())
            .arg("--shared-fraction")
            .arg(self.shared_fraction.to_string())
    }
}

/// Summary of one scenario run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioResult {
    pub system: String,
    pub spec: ScenarioSpec,
    /// From barrier release until every rank process exited.
    pub wall_ms: f64,
    pub cache_ms_median: f64,
    pub cache_ms_worst: f64,
    pub load_ms_median: f64,
    pub save_ms_median: f64,
    /// Bytes written into the directory: every rank's report plus the system's own.
    pub bytes_written_total: u64,
    /// The part of `bytes_written_total` the system wrote itself (e.g. daemon snapshots).
    pub system_bytes_written: u64,
    /// The run hit its time limit: `wall_ms` is the limit, unfinished ranks were killed
    /// and are listed in `failures`.
    pub timed_out: bool,
    pub saves_by_outcome: std::collections::BTreeMap<String, u32>,
    /// One line per rank that exited non-zero or reported nothing parsable.
    pub failures: Vec<String>,
    pub ranks: Vec<RankReport>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("preparing the scenario: {0}")]
    Prepare(String),
    #[error("starting rank {rank}: {source}")]
    Spawn {
        rank: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("rank {rank} did not reach the barrier: {detail}")]
    Barrier { rank: u32, detail: String },
    #[error("waiting for rank {rank}: {source}")]
    Wait {
        rank: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Makes the scenario's directory (a system's `prepare` starts here).
pub fn create_scenario_dir(spec: &ScenarioSpec) -> Result<(), ScenarioError> {
    std::fs::create_dir_all(&spec.dir)
        .map_err(|err| ScenarioError::Prepare(format!("{}: {err}", spec.dir.display())))
}

/// A system whose ranks the runner can start: the file-lock peer, later the daemon.
pub trait SystemUnderTest {
    /// Label in reports, e.g. `filelock-before`.
    fn name(&self) -> String;
    /// Sets up shared state before any rank starts (initial cache file, a daemon, ...).
    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError>;
    /// The command that plays rank `rank`, following the rank process protocol.
    fn rank_command(&self, spec: &ScenarioSpec, rank: u32) -> Command;
    /// Tears down what `prepare` started, after every rank exited.
    fn finish(&mut self, _spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        Ok(())
    }
    /// Bytes the system itself (not its ranks) wrote into the scenario directory, known
    /// after `finish` (a daemon's snapshots).
    fn bytes_written_by_system(&self) -> u64 {
        0
    }
}

/// The file-lock peer: each rank is a `filelock-rank` process on `<dir>/autotuner_cache.json`.
#[derive(Debug, Clone)]
pub struct FileLockPeer {
    pub variant: Variant,
    pub rank_binary: PathBuf,
    pub lock_timeout: Duration,
}

impl FileLockPeer {
    pub fn new(variant: Variant, rank_binary: PathBuf) -> Self {
        Self {
            variant,
            rank_binary,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    pub fn cache_path(spec: &ScenarioSpec) -> PathBuf {
        spec.dir.join(CACHE_FILE_NAME)
    }
}

impl SystemUnderTest for FileLockPeer {
    fn name(&self) -> String {
        format!("filelock-{}", self.variant)
    }

    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        create_scenario_dir(spec)?;
        write_initial_cache(
            &Self::cache_path(spec),
            spec.ranks,
            spec.existing,
            spec.shared_fraction,
        )
        .map_err(|err| ScenarioError::Prepare(err.to_string()))?;
        Ok(())
    }

    fn rank_command(&self, spec: &ScenarioSpec, rank: u32) -> Command {
        let mut command = Command::new(&self.rank_binary);
        command
            .arg("--variant")
            .arg(self.variant.to_string())
            .arg("--cache")
            .arg(Self::cache_path(spec));
        spec.rank_args(&mut command, rank)
            .arg("--lock-timeout-s")
            .arg(self.lock_timeout.as_secs_f64().to_string())
            .arg("--barrier-stdin");
        command
    }
}

/// Where `filelock-rank` is: `$TUNECACHE_FILELOCK_RANK_BIN`, else beside the running
/// executable, else one directory up (test binaries live in `target/<profile>/deps`).
pub fn filelock_rank_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TUNECACHE_FILELOCK_RANK_BIN") {
        return PathBuf::from(path);
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let beside = exe_dir.join("filelock-rank");
    if beside.exists() {
        return beside;
    }
    exe_dir
        .parent()
        .map(|up| up.join("filelock-rank"))
        .filter(|up| up.exists())
        .unwrap_or(beside)
}

/// Runs the file-lock peer scenario: R `filelock-rank` processes of `variant` on a cache in
/// `dir` pre-filled with `existing` entries, each tuning `new_entries` (half shared).
pub fn run_peer_scenario(
    variant: Variant,
    dir: &Path,
    ranks: u32,
    existing: usize,
    new_entries: usize,
) -> Result<ScenarioResult, ScenarioError> {
    let spec = ScenarioSpec {
        dir: dir.to_path_buf(),
        ranks,
        existing,
        new_entries,
        shared_fraction: 0.5,
    };
    run_scenario(
        &mut FileLockPeer::new(variant, filelock_rank_binary()),
        &spec,
    )
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Kills and reaps every child; used when the scenario aborts before the barrier.
fn abandon(children: &mut [Child]) {
    for child in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Starts every rank, releases them together, and summarizes their reports.
pub fn run_scenario(
    system: &mut dyn SystemUnderTest,
    spec: &ScenarioSpec,
) -> Result<ScenarioResult, ScenarioError> {
    run_scenario_with_limit(system, spec, None)
}

/// Polling interval of a time-limited run: the resolution of its wall time.
const EXIT_POLL: Duration = Duration::from_millis(1);

/// Waits for every child; with a `limit`, kills those still running when it passes.
/// Returns each child's exit status (`None` for a killed one) and whether the limit hit.
fn wait_all(
    children: &mut [Child],
    released: Instant,
    limit: Option<Duration>,
) -> Result<(Vec<Option<std::process::ExitStatus>>, bool), ScenarioError> {
    let mut statuses: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let Some(limit) = limit else {
        for ((rank, child), status) in (0u32..).zip(children.iter_mut()).zip(&mut statuses) {
            *status = Some(
                child
                    .wait()
                    .map_err(|source| ScenarioError::Wait { rank, source })?,
            );
        }
        return Ok((statuses, false));
    };
    loop {
        let mut running = 0;
        for ((rank, child), status) in (0u32..).zip(children.iter_mut()).zip(&mut statuses) {
            if status.is_none() {
                *status = child
                    .try_wait()
                    .map_err(|source| ScenarioError::Wait { rank, source })?;
                running += usize::from(status.is_none());
            }
        }
        if running == 0 {
            return Ok((statuses, false));
        }
        if released.elapsed() >= limit {
            for (child, status) in children.iter_mut().zip(&statuses) {
                if status.is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            return Ok((statuses, true));
        }
        std::thread::sleep(EXIT_POLL);
    }
}

/// [`run_scenario`] with a time limit counted from the barrier release: ranks still running
/// when it passes are killed and the result says `timed_out` (wall time = the limit).
pub fn run_scenario_with_limit(
    system: &mut dyn SystemUnderTest,
    spec: &ScenarioSpec,
    limit: Option<Duration>,
) -> Result<ScenarioResult, ScenarioError> {
    system.prepare(spec)?;
    let mut children: Vec<Child> = Vec::with_capacity(spec.ranks as usize);
    for rank in 0..spec.ranks {
        let spawned = system
            .rank_command(spec, rank)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(source) => {
                abandon(&mut children);
                return Err(ScenarioError::Spawn { rank, source });
            }
        }
    }

    // Barrier, part 1: every rank has started and waits on its stdin.
    let mut stdout_readers = Vec::with_capacity(children.len());
    for (rank, child) in (0u32..).zip(children.iter_mut()) {
        let Some(stdout) = child.stdout.take() else {
            abandon(&mut children);
            return Err(ScenarioError::Barrier {
                rank,
                detail: "no stdout pipe".to_string(),
            });
        };
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        if !matches!(read, Ok(n) if n > 0) || line.trim() != READY_LINE {
            abandon(&mut children);
            return Err(ScenarioError::Barrier {
                rank,
                detail: format!("expected {READY_LINE:?}, got {line:?} ({read:?})"),
            });
        }
        stdout_readers.push(reader);
    }

    // Barrier, part 2: closing every stdin releases all ranks at once.
    let released = Instant::now();
    for child in children.iter_mut() {
        drop(child.stdin.take());
    }
    let (exit_statuses, timed_out) = wait_all(&mut children, released, limit)?;
    let wall = match limit {
        Some(limit) if timed_out => limit,
        _ => released.elapsed(),
    };
    system.finish(spec)?;

    let mut reports = Vec::with_capacity(children.len());
    let mut failures = Vec::new();
    for ((rank, mut reader), status) in (0u32..).zip(stdout_readers).zip(exit_statuses) {
        let mut rest = String::new();
        let _ = reader.read_to_string(&mut rest);
        let last_line = rest.lines().rev().find(|line| !line.trim().is_empty());
        match last_line.map(serde_json::from_str::<RankReport>) {
            _ if status.is_none() => {
                failures.push(format!("rank {rank}: killed at the time limit"));
            }
            Some(Ok(report)) if status.is_some_and(|status| status.success()) => {
                reports.push(report);
            }
            Some(Ok(_)) => failures.push(format!("rank {rank}: exited with {status:?}")),
            Some(Err(err)) => {
                failures.push(format!("rank {rank}: bad report ({err}), {status:?}"));
            }
            None => failures.push(format!("rank {rank}: no report, {status:?}")),
        }
    }

    let sorted = |pick: fn(&RankReport) -> f64| {
        let mut values: Vec<f64> = reports.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values
    };
    let cache_ms = sorted(|report| report.cache_ms);
    let mut saves_by_outcome = std::collections::BTreeMap::new();
    for report in &reports {
        *saves_by_outcome
            .entry(report.save_outcome.clone())
            .or_insert(0) += 1;
    }
    Ok(ScenarioResult {
        system: system.name(),
        spec: spec.clone(),
        wall_ms: wall.as_secs_f64() * 1e3,
        cache_ms_median: median(&cache_ms),
        cache_ms_worst: cache_ms.last().copied().unwrap_or(0.0),
        load_ms_median: median(&sorted(|report| report.load_ms)),
        save_ms_median: median(&sorted(|report| report.save_ms)),
        bytes_written_total: reports
            .iter()
            .map(|report| report.bytes_written)
            .sum::<u64>()
            + system.bytes_written_by_system(),
        system_bytes_written: system.bytes_written_by_system(),
        timed_out,
        saves_by_outcome,
        failures,
        ranks: reports,
    })
}
