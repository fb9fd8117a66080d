//! Owns the Lookup-under-load benchmark (issue 54): the p50 and p99 of a one-key Lookup of a key
//! that hits, through the Rust client on one long-lived connection, sampled at a steady pace
//! the whole round while the daemon (holding `--entries` entries) goes through four phases:
//!
//! - **idle**: nothing else runs (the baseline);
//! - **scans**: R `tunecache-rank --scan-all` processes are started together, wait at the
//!   scenario barrier, and on its release each connects and Scans the whole cache;
//! - **writer**: a writer merges a batch of `--batch` entries (the cache's own keys with a better
//!   time each pass, so every entry is replaced), as Records of the daemon's most entries per
//!   request (10,000) back to back, `--writer-passes` times;
//! - **both**: the scans phase again while the writer merges batches until the ranks are done.
//!
//! Each round starts a fresh daemon. Each sample is a Lookup followed by a bare health Check on a
//! second connection (the echo: the transport and the scheduler with no cache work, so a phase's
//! Lookup tail can be told from the machine's); each phase also records the daemon's CPU time
//! (`/proc/<pid>/stat`). A sample belongs to the phase its Lookup started in. The sampler waits
//! `--interval-us` after each sample, so a stalled call delays the next one instead of being
//! followed by a burst: a stall counts once (see `max_us`), and the fewer samples a phase has
//! against its length, the more of it was stalled. With `--perf-dir`
//! the daemon is profiled (`profile`) during each loaded phase, one file per phase and round;
//! profiled rounds' latencies carry perf's cost. Writes `lookup-load.json` and `lookup-load.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use tunecache_bench::daemon::{workspace_binary, DaemonConfig, DaemonProcess};
use tunecache_bench::scenario::{
    create_scenario_dir, run_scenario_with_limit, ScenarioError, ScenarioSpec, SystemUnderTest,
};
use tunecache_bench::tunecache_system::{existing_entries, rank_command, record_all, RECORD_BATCH};
use tunecache_client::{proto as v1, Client};

use super::micro::{key_of, latency_of, process_cpu_s, Latency};
use super::{median, profile, RunInfo, Setup};

/// The target for a one-key Lookup under load.
const P99_GOAL_US: f64 = 5_000.0;
const P99_OVER_P50_GOAL: f64 = 10.0;
/// One-key Lookups made untimed on the sampler's connection before the first phase.
const WARM_UP: usize = 1_000;
/// Longest the rank processes of one scans phase may take.
const STORM_LIMIT: Duration = Duration::from_secs(300);
const PHASES: [&str; 4] = ["idle", "scans", "writer", "both"];

/// What `lookup-load` is asked to measure (its command line).
#[derive(Debug, clap::Args)]
pub struct LookupLoadOptions {
    #[arg(long = "out", default_value = "bench-out")]
    pub out_dir: PathBuf,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Entries the daemon holds.
    #[arg(long, default_value_t = 100_000)]
    pub entries: usize,
    /// Rank processes of the scans phase.
    #[arg(long, default_value_t = 128)]
    pub ranks: u32,
    /// Entries of the writer's batch.
    #[arg(long, default_value_t = 100_000)]
    pub batch: usize,
    /// Merges of the batch in the writer phase.
    #[arg(long, default_value_t = 10)]
    pub writer_passes: usize,
    /// Length of the idle phase, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub idle_s: f64,
    /// Pause between two timed Lookups, µs.
    #[arg(long, default_value_t = 1000)]
    pub interval_us: u64,
    /// Profile the daemon with `perf record` during each loaded phase, into this directory.
    #[arg(long)]
    pub perf_dir: Option<PathBuf>,
    #[arg(skip)]
    pub command_line: String,
}

/// The one-key Lookups whose call started in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseLatency {
    pub phase: String,
    pub seconds: f64,
    pub latency: Latency,
    pub p99_over_p50: f64,
    /// The health Check made right after each Lookup.
    pub echo: Latency,
    /// The daemon's CPU time (user and system) over the phase, in cores.
    pub daemon_cpu_cores: f64,
}

/// The R rank processes of a scans phase.
#[derive(Debug, Clone, Serialize)]
pub struct StormSummary {
    /// From the barrier's release until the last rank exited.
    pub wall_ms: f64,
    /// Each rank's connect + whole Scan + parse: median and slowest.
    pub rank_load_ms_median: f64,
    pub rank_load_ms_worst: f64,
    pub entries_per_rank_min: usize,
    pub failures: Vec<String>,
}

/// The writer's merges of one phase.
#[derive(Debug, Clone, Serialize)]
pub struct WriterSummary {
    pub passes: usize,
    /// One pass (every Record of the batch), median and slowest.
    pub pass_ms_median: f64,
    pub pass_ms_max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadRound {
    pub phases: Vec<PhaseLatency>,
    pub scans: StormSummary,
    pub writer: WriterSummary,
    pub both_scans: StormSummary,
    pub both_writer: WriterSummary,
}

/// Median and range of one figure over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut values: Vec<f64> = values.into_iter().collect();
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Self {
            median: median(&mut values),
            min,
            max,
        }
    }
}

/// One phase over the rounds, and the verdict on it.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseSummary {
    pub phase: String,
    pub p50_us: Spread,
    pub p99_us: Spread,
    pub max_us: Spread,
    pub p99_over_p50: Spread,
    pub echo_p50_us: Spread,
    pub echo_p99_us: Spread,
    pub daemon_cpu_cores: Spread,
    pub samples: Spread,
    /// Rounds in which p99 <= 5 ms and p99 <= 10x p50.
    pub rounds_meeting_target: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct LookupLoadResults {
    #[serde(flatten)]
    pub run: RunInfo,
    pub entries: usize,
    pub ranks: u32,
    pub batch: usize,
    pub interval_us: u64,
    pub profiled: bool,
    pub rounds: Vec<LoadRound>,
    pub summary: Vec<PhaseSummary>,
}

/// The scans phase's ranks against an already running daemon: nothing to prepare or finish.
struct ScanStorm {
    rank_binary: PathBuf,
    socket: PathBuf,
}

impl SystemUnderTest for ScanStorm {
    fn name(&self) -> String {
        "tunecache-scan-all".to_owned()
    }

    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        create_scenario_dir(spec)
    }

    fn rank_command(&self, spec: &ScenarioSpec, rank: u32) -> Command {
        let mut command = rank_command(&self.rank_binary, &self.socket, spec, rank);
        command.arg("--scan-all");
        command
    }
}

fn run_storm(
    storm: &mut ScanStorm,
    dir: &Path,
    ranks: u32,
    entries: usize,
) -> Result<StormSummary> {
    let spec = ScenarioSpec {
        dir: dir.to_path_buf(),
        ranks,
        existing: entries,
        new_entries: 0,
        shared_fraction: 0.5,
    };
    let result = run_scenario_with_limit(storm, &spec, Some(STORM_LIMIT))?;
    let mut loads: Vec<f64> = result.ranks.iter().map(|r| r.load_ms).collect();
    let worst = loads.iter().copied().fold(0.0, f64::max);
    Ok(StormSummary {
        wall_ms: result.wall_ms,
        rank_load_ms_median: median(&mut loads),
        rank_load_ms_worst: worst,
        entries_per_rank_min: result
            .ranks
            .iter()
            .map(|r| r.entries_loaded)
            .min()
            .unwrap_or(0),
        failures: result.failures,
    })
}

/// One timed one-key Lookup and the echo after it.
struct Sample {
    /// When the Lookup started, since the round's origin.
    at: Duration,
    lookup_us: f64,
    echo_us: f64,
}

/// Timed one-key Lookups (and echoes) on their own thread and connections.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<Vec<Sample>>>,
}

impl Sampler {
    /// Connects, warms up, and returns once timing has begun.
    fn start(
        socket: &Path,
        keys: Vec<v1::Key>,
        interval: Duration,
        origin: Instant,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let (socket, flag) = (socket.to_path_buf(), stop.clone());
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let prepared: Result<_> = async {
                    let client = Client::connect(&socket).await?;
                    let mut health =
                        HealthClient::new(tunecache_client::connect_channel(&socket).await?);
                    for key in keys.iter().cycle().take(WARM_UP) {
                        client.lookup(vec![key.clone()]).await?;
                        health.check(HealthCheckRequest::default()).await?;
                    }
                    Ok((client, health))
                }
                .await;
                let (client, mut health) = match prepared {
                    Ok(connected) => {
                        let _ = ready_tx.send(Ok(()));
                        connected
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(anyhow::anyhow!("{err:#}")));
                        return Err(err);
                    }
                };
                let mut samples = Vec::with_capacity(1 << 20);
                let mut call = 0usize;
                while !flag.load(Ordering::Relaxed) {
                    let key = keys[(call * 7919) % keys.len()].clone();
                    let started = Instant::now();
                    let hits = client.lookup(vec![key]).await?;
                    let lookup_us = started.elapsed().as_secs_f64() * 1e6;
                    ensure!(hits.len() == 1, "a one-key Lookup of a held key missed");
                    let echoed = Instant::now();
                    health.check(HealthCheckRequest::default()).await?;
                    samples.push(Sample {
                        at: started - origin,
                        lookup_us,
                        echo_us: echoed.elapsed().as_secs_f64() * 1e6,
                    });
                    call += 1;
                    tokio::time::sleep(interval).await;
                }
                Ok(samples)
            })
        });
        ready_rx
            .recv()
            .context("the sampler thread ended before it was ready")??;
        Ok(Self { stop, handle })
    }

    fn finish(self) -> Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?
    }
}

/// Merges the batch `passes` times, each pass with every time 10% better than the last.
async fn merge_passes(
    client: &Client,
    batch: &mut [v1::Entry],
    passes: usize,
    until: Option<&AtomicBool>,
) -> Result<WriterSummary> {
    let mut times = Vec::new();
    while until.map_or(times.len() < passes, |done| !done.load(Ordering::Relaxed)) {
        for entry in batch.iter_mut() {
            if let Some(result) = entry.result.as_mut() {
                result.time_us *= 0.9;
            }
        }
        let started = Instant::now();
        for chunk in batch.chunks(RECORD_BATCH) {
            client.record(chunk.to_vec()).await?;
        }
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let max = times.iter().copied().fold(0.0, f64::max);
    Ok(WriterSummary {
        passes: times.len(),
        pass_ms_median: median(&mut times),
        pass_ms_max: max,
    })
}

/// A profile of the phase about to start, once perf has attached.
fn record(dir: Option<&Path>, pid: u32, name: &str) -> Result<Option<profile::PerfRecording>> {
    let recording = profile::record_if(dir, pid, name)?;
    if recording.is_some() {
        std::thread::sleep(profile::ATTACH);
    }
    Ok(recording)
}

fn round(
    options: &LookupLoadOptions,
    runtime: &tokio::runtime::Runtime,
    scratch: &Path,
    index: usize,
) -> Result<LoadRound> {
    let mut daemon = DaemonProcess::spawn(&DaemonConfig {
        binary: workspace_binary("tunecached"),
        work_dir: scratch.join(format!("daemon-{index}")),
        node_name: format!("lookup-load-{index}"),
        shared_dir: None,
        snapshot_interval_s: 3_600,
        extra_args: Vec::new(),
    })?;
    let entries = existing_entries(8, options.entries, 0.5);
    let keys: Vec<v1::Key> = entries.iter().map(key_of).collect();
    let client = runtime.block_on(async {
        let client = daemon
            .wait_ready()
            .await?
            .with_timeout(Duration::from_secs(300));
        record_all(&client, entries.clone()).await?;
        anyhow::Ok(client)
    })?;
    let mut batch: Vec<v1::Entry> = entries.into_iter().cycle().take(options.batch).collect();
    let pid = daemon.pid()?;
    let perf_dir = options.perf_dir.as_deref();
    let mut storm = ScanStorm {
        rank_binary: workspace_binary("tunecache-rank"),
        socket: daemon.socket.clone(),
    };
    let origin = Instant::now();
    let sampler = Sampler::start(
        &daemon.socket,
        keys,
        Duration::from_micros(options.interval_us),
        origin,
    )?;
    // Each phase's start and end since `origin`, and the daemon's CPU seconds over it.
    let mut windows: Vec<(Duration, Duration, f64)> = Vec::new();

    let (begin, cpu) = (origin.elapsed(), process_cpu_s(pid)?);
    std::thread::sleep(Duration::from_secs_f64(options.idle_s));
    windows.push((begin, origin.elapsed(), process_cpu_s(pid)? - cpu));

    let recording = record(perf_dir, pid, &format!("scans-r{index}"))?;
    let (begin, cpu) = (origin.elapsed(), process_cpu_s(pid)?);
    let scans = run_storm(
        &mut storm,
        &scratch.join("scans"),
        options.ranks,
        options.entries,
    )?;
    windows.push((begin, origin.elapsed(), process_cpu_s(pid)? - cpu));
    profile::stop(recording)?;

    let recording = record(perf_dir, pid, &format!("writer-r{index}"))?;
    let (begin, cpu) = (origin.elapsed(), process_cpu_s(pid)?);
    let writer = runtime.block_on(merge_passes(
        &client,
        &mut batch,
        options.writer_passes,
        None,
    ))?;
    windows.push((begin, origin.elapsed(), process_cpu_s(pid)? - cpu));
    profile::stop(recording)?;

    let recording = record(perf_dir, pid, &format!("both-r{index}"))?;
    let done = AtomicBool::new(false);
    let (begin, cpu) = (origin.elapsed(), process_cpu_s(pid)?);
    let (both_scans, both_writer) = std::thread::scope(|scope| {
        let writer =
            scope.spawn(|| runtime.block_on(merge_passes(&client, &mut batch, 1, Some(&done))));
        let scans = run_storm(
            &mut storm,
            &scratch.join("both"),
            options.ranks,
            options.entries,
        );
        done.store(true, Ordering::Relaxed);
        let writer = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?;
        anyhow::Ok((scans?, writer?))
    })?;
    windows.push((begin, origin.elapsed(), process_cpu_s(pid)? - cpu));
    profile::stop(recording)?;

    let samples = sampler.finish()?;
    drop(client);
    daemon.stop();
    let phases = PHASES
        .iter()
        .zip(&windows)
        .map(|(phase, (begin, end, cpu_s))| {
            let within: Vec<&Sample> = samples
                .iter()
                .filter(|sample| sample.at >= *begin && sample.at < *end)
                .collect();
            let latency = latency_of(within.iter().map(|s| s.lookup_us).collect());
            let seconds = (*end - *begin).as_secs_f64();
            PhaseLatency {
                phase: (*phase).to_owned(),
                seconds,
                p99_over_p50: latency.p99_us / latency.p50_us.max(f64::MIN_POSITIVE),
                latency,
                echo: latency_of(within.iter().map(|s| s.echo_us).collect()),
                daemon_cpu_cores: cpu_s / seconds,
            }
        })
        .collect();
    for storm in [&scans, &both_scans] {
        if !storm.failures.is_empty() {
            bail!("scan ranks failed: {:?}", storm.failures);
        }
        ensure!(
            storm.entries_per_rank_min >= options.entries,
            "a rank scanned {} of {} entries",
            storm.entries_per_rank_min,
            options.entries
        );
    }
    Ok(LoadRound {
        phases,
        scans,
        writer,
        both_scans,
        both_writer,
    })
}

fn meets_target(phase: &PhaseLatency) -> bool {
    phase.latency.p99_us <= P99_GOAL_US && phase.p99_over_p50 <= P99_OVER_P50_GOAL
}

fn summarize(rounds: &[LoadRound]) -> Vec<PhaseSummary> {
    PHASES
        .iter()
        .enumerate()
        .map(|(index, phase)| {
            let of = |pick: fn(&PhaseLatency) -> f64| {
                Spread::of(rounds.iter().map(|round| pick(&round.phases[index])))
            };
            PhaseSummary {
                phase: (*phase).to_owned(),
                p50_us: of(|p| p.latency.p50_us),
                p99_us: of(|p| p.latency.p99_us),
                max_us: of(|p| p.latency.max_us),
                p99_over_p50: of(|p| p.p99_over_p50),
                echo_p50_us: of(|p| p.echo.p50_us),
                echo_p99_us: of(|p| p.echo.p99_us),
                daemon_cpu_cores: of(|p| p.daemon_cpu_cores),
                samples: of(|p| p.latency.samples as f64),
                rounds_meeting_target: rounds
                    .iter()
                    .filter(|round| meets_target(&round.phases[index]))
                    .count(),
            }
        })
        .collect()
}

fn ms(spread: &Spread) -> String {
    format!(
        "{:.2} ms ({:.2} to {:.2})",
        spread.median / 1e3,
        spread.min / 1e3,
        spread.max / 1e3
    )
}

/// The summary as a Markdown table.
pub fn markdown(results: &LookupLoadResults) -> String {
    let mut out = String::from(
        "| phase | rounds | samples (median) | p50 | p99 | max | p99 / p50 | target: p99 <= 5 ms and <= 10x p50 | echo p50 | echo p99 | daemon CPU (cores) |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    let rounds = results.rounds.len();
    for phase in &results.summary {
        let verdict = match phase.rounds_meeting_target {
            met if met == rounds => "met in every round".to_owned(),
            0 => "missed in every round".to_owned(),
            met => format!("met in {met} of {rounds} rounds"),
        };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {:.1}x ({:.1} to {:.1}) | {} | {} | {} | {:.2} ({:.2} to {:.2}) |\n",
            phase.phase,
            rounds,
            phase.samples.median,
            ms(&phase.p50_us),
            ms(&phase.p99_us),
            ms(&phase.max_us),
            phase.p99_over_p50.median,
            phase.p99_over_p50.min,
            phase.p99_over_p50.max,
            verdict,
            ms(&phase.echo_p50_us),
            ms(&phase.echo_p99_us),
            phase.daemon_cpu_cores.median,
            phase.daemon_cpu_cores.min,
            phase.daemon_cpu_cores.max,
        ));
    }
    let storm = Spread::of(results.rounds.iter().map(|r| r.scans.wall_ms));
    let load = Spread::of(results.rounds.iter().map(|r| r.scans.rank_load_ms_median));
    let pass = Spread::of(results.rounds.iter().map(|r| r.writer.pass_ms_median));
    out.push_str(&format!(
        "\nLoad: {} ranks' whole Scans of {} entries took {:.1} s (wall, median; {:.1} to {:.1}), \
         a rank's connect + Scan + parse {:.0} ms at the median rank; the writer's merge of \
         {} entries took {:.0} ms a pass (median; {:.0} to {:.0}).\n",
        results.ranks,
        results.entries,
        storm.median / 1e3,
        storm.min / 1e3,
        storm.max / 1e3,
        load.median,
        results.batch,
        pass.median,
        pass.min,
        pass.max
    ));
    out
}

pub fn run(options: &LookupLoadOptions) -> Result<LookupLoadResults> {
    ensure!(
        options.rounds > 0 && options.entries > 0 && options.batch > 0,
        "--rounds, --entries and --batch must be at least 1"
    );
    let setup = Setup::new(&options.out_dir, options.perf_dir.as_deref(), "lookup-load")?;
    let mut rounds = Vec::with_capacity(options.rounds);
    for index in 0..options.rounds {
        let measured = round(options, &setup.runtime, setup.scratch.path(), index)?;
        for phase in &measured.phases {
            eprintln!(
                "lookup-load round {}: {:>6}: {} samples, p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs; echo p50 {:.0} µs, p99 {:.0} µs; daemon {:.2} cores",
                index + 1,
                phase.phase,
                phase.latency.samples,
                phase.latency.p50_us,
                phase.latency.p99_us,
                phase.latency.max_us,
                phase.echo.p50_us,
                phase.echo.p99_us,
                phase.daemon_cpu_cores
            );
        }
        rounds.push(measured);
    }
    let results = LookupLoadResults {
        run: setup.info(&options.command_line),
        entries: options.entries,
        ranks: options.ranks,
        batch: options.batch,
        interval_us: options.interval_us,
        profiled: options.perf_dir.is_some(),
        summary: summarize(&rounds),
        rounds,
    };
    setup.write(&results, &markdown(&results))?;
    Ok(results)
}
