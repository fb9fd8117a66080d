//! Owns the lifecycle benchmark (issue 51): a simulated year of one node's cache, in
//! process, on the daemon's own store (`tunecache_server::store::Store`: its writer, journal,
//! compaction, last uses and sweeps) with a hand-set clock.
//!
//! Each week a new "library version" is tuned: `--per-version` entries in 4 namespaces, of
//! which `--with-artifacts` name a `--artifact-kib` KiB blob. Every day, ranks read the
//! current and the previous version; marked uses are journalled (as the daemon's flush does)
//! and a sweep runs (as at each day's start). Per week it reports the entries held, the bytes
//! of their records (memory), the journal's size, the artifact bytes they name (what the
//! artifact store keeps after its grace period), the hit rate of the reads, and the last-use
//! records written per day. What it does not simulate: the shared directory and Redis (their
//! own tests show that uses and expiry cross them), and blob bytes on disk.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{ensure, Result};
use serde::Serialize;
use tunecache_server::journal::FsyncPolicy;
use tunecache_server::model::artifacts::ArtifactList;
use tunecache_server::model::entry::{CacheKey, TunedResult};
use tunecache_server::model::lifecycle::{Clock, Retention, MS_PER_DAY};
use tunecache_server::store::{LifecycleSettings, Store};

use super::{progress, RunInfo, Setup};

const NAMESPACES: [&str; 4] = ["trtllm", "triton", "bitblas", "flashinfer"];

/// What `lifecycle` is asked to simulate (its command line).
#[derive(Debug, clap::Args)]
pub struct LifecycleOptions {
    #[arg(long = "out", default_value = "bench-out")]
    pub out_dir: PathBuf,
    #[arg(long, default_value_t = 52)]
    pub weeks: u32,
    #[arg(long, default_value_t = 5000)]
    pub per_version: usize,
    #[arg(long, default_value_t = 500)]
    pub with_artifacts: usize,
    #[arg(long, default_value_t = 256)]
    pub artifact_kib: u64,
    #[arg(long, default_value_t = 30)]
    pub retain_days: u32,
    /// Entries that expire at once in the Record-latency case (0: skip the case).
    #[arg(long, default_value_t = 1_000_000)]
    pub expiring: usize,
    /// Weeks of the real run: two daemon processes and a shared directory under libfaketime
    /// (0: skip it).
    #[arg(long, default_value_t = 12)]
    pub real_weeks: u32,
    /// Entries of each weekly version in the real run.
    #[arg(long, default_value_t = 1000)]
    pub real_per_version: usize,
    #[arg(skip)]
    pub command_line: String,
}

/// One-entry Record latency, with nothing else going on and while a sweep expires
/// `expiring` entries, side by side in one run.
#[derive(Debug, Serialize)]
pub struct RecordsWhileExpiring {
    pub expiring: usize,
    pub sweep_ms: f64,
    pub expired: u64,
    pub idle: Latencies,
    pub during_sweep: Latencies,
}

#[derive(Debug, Serialize)]
pub struct Latencies {
    pub records: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Latencies {
    fn of(mut micros: Vec<f64>) -> Latencies {
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
        Latencies {
            records: micros.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: micros.last().copied().unwrap_or(0.0),
        }
    }
}

/// One simulated week, measured at its end.
#[derive(Debug, Clone, Serialize)]
pub struct Week {
    pub week: u32,
    pub entries: u64,
    /// Versions held, in units of one version's entries.
    pub versions_held: f64,
    pub memory_bytes: u64,
    pub journal_bytes: u64,
    pub artifact_bytes: u64,
    /// Reads of the current and previous version that hit, over those made this week.
    pub hit_rate: f64,
    pub last_use_writes_per_day_max: u64,
    pub distinct_reads_per_day: u64,
    pub expired_total: u64,
}

#[derive(Debug, Serialize)]
pub struct LifecycleResults {
    pub info: RunInfo,
    pub retain_days: u32,
    pub per_version: usize,
    pub weeks: Vec<Week>,
    /// The issue's bound on versions held: retention / 7 + 2.
    pub versions_bound: f64,
    pub records_while_expiring: Option<RecordsWhileExpiring>,
    pub real: Vec<super::lifecycle_real::RealWeek>,
}

fn key(version: u32, i: usize) -> CacheKey {
    CacheKey {
        namespace: NAMESPACES[i % NAMESPACES.len()].to_owned(),
        op: format!("gemm_v{version}"),
        device: "NVIDIA H200|sm_90|cuda 12.8".to_owned(),
        problem: format!("m={i},n=4096,k=4096,lib=v{version}"),
        rank: None,
    }
}

/// Entry `i` of `version`'s result, naming an artifact of `artifact_bytes` when given.
fn result(version: u32, i: usize, artifact_bytes: Option<u64>, now_ms: i64) -> TunedResult {
    let artifacts = match artifact_bytes {
        Some(size) => ArtifactList::from_wire(vec![tunecache_client::proto::Artifact {
            name: "kernel.cubin".to_owned(),
            sha256: format!("{:064x}", u64::from(version) << 32 | i as u64),
            size,
        }]),
        None => ArtifactList::default(),
    };
    TunedResult {
        config: format!(r#"{{"tactic":{i},"tile":[128,128,64]}}"#),
        time_us: 10.0 + i as f64 * 0.01,
        tuned_by: "node-a/rank0".to_owned(),
        tuned_at_unix_ms: now_ms,
        forget_epoch: 0,
        artifacts,
    }
}

pub fn run(options: &LifecycleOptions) -> Result<LifecycleResults> {
    let setup = Setup::new(&options.out_dir, None, "lifecycle")?;
    let state = setup.scratch.path().join("state");
    let weeks = setup.runtime.block_on(simulate(options, &state))?;
    let records_while_expiring = if options.expiring > 0 {
        let state = setup.scratch.path().join("expiring");
        Some(
            setup
                .runtime
                .block_on(records_while_expiring(options, &state))?,
        )
    } else {
        None
    };
    let real = if options.real_weeks > 0 {
        let scratch = setup.scratch.path().join("real");
        std::fs::create_dir_all(&scratch)?;
        setup.runtime.block_on(super::lifecycle_real::run_real(
            &scratch,
            options.real_weeks,
            options.real_per_version,
            options.retain_days,
        ))?
    } else {
        Vec::new()
    };
    let results = LifecycleResults {
        info: setup.info(&options.command_line),
        retain_days: options.retain_days,
        per_version: options.per_version,
        weeks,
        versions_bound: f64::from(options.retain_days) / 7.0 + 2.0,
        records_while_expiring,
        real,
    };
    setup.write(&results, &table(&results))?;
    Ok(results)
}

async fn simulate(options: &LifecycleOptions, state: &std::path::Path) -> Result<Vec<Week>> {
    let (guard, _) = Store::open(state, FsyncPolicy::Never)?;
    let store = guard.store();
    // Midnight of a real day, so the journal's days are plausible on this machine too.
    let start = tunecache_server::model::entry::unix_now_ms() / MS_PER_DAY * MS_PER_DAY;
    let clock = Clock::manual(start);
    store.set_lifecycle(LifecycleSettings {
        retention: Retention::new(options.retain_days, []),
        max_entries: 0,
        clock: clock.clone(),
        ..LifecycleSettings::default()
    });
    let counters = store.counters();
    let written = || {
        counters
            .last_use_updates_written
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let mut weeks = Vec::new();
    for week in 0..options.weeks {
        let entries: Vec<(CacheKey, TunedResult)> = (0..options.per_version)
            .map(|i| {
                let artifact = (i < options.with_artifacts).then_some(options.artifact_kib * 1024);
                (key(week, i), result(week, i, artifact, clock.now_ms()))
            })
            .collect();
        for batch in entries.chunks(1000) {
            store.try_apply(batch.to_vec(), None).await?;
        }
        let read: Vec<CacheKey> = [week.checked_sub(1), Some(week)]
            .into_iter()
            .flatten()
            .flat_map(|version| (0..options.per_version).map(move |i| key(version, i)))
            .collect();
        let (mut asked, mut hits, mut writes_max) = (0u64, 0u64, 0u64);
        for _day in 0..7 {
            clock.advance_days(1);
            store.sweep().await?;
            let map = store.current();
            let found = map.get_many(read.iter().map(CacheKey::view));
            asked += read.len() as u64;
            hits += found.len() as u64;
            store.touch(found.iter().copied());
            let before = written();
            store.flush_uses().await?;
            writes_max = writes_max.max(written() - before);
        }
        let map = store.current();
        let mut digests = HashSet::new();
        let mut artifact_bytes = 0;
        for entry in map.iter() {
            for artifact in entry.result().artifacts.iter() {
                if digests.insert(artifact.sha256.to_owned()) {
                    artifact_bytes += artifact.size;
                }
            }
        }
        let row = Week {
            week: week + 1,
            entries: map.len() as u64,
            versions_held: map.len() as f64 / options.per_version as f64,
            memory_bytes: map.iter().map(|e| e.record().len() as u64).sum(),
            journal_bytes: counters
                .journal_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            artifact_bytes,
            hit_rate: hits as f64 / asked.max(1) as f64,
            last_use_writes_per_day_max: writes_max,
            distinct_reads_per_day: read.len() as u64,
            expired_total: counters
                .entries_expired
                .load(std::sync::atomic::Ordering::Relaxed),
        };
        progress(&format!(
            "lifecycle: week {}: {} entries, journal {} B",
            row.week, row.entries, row.journal_bytes
        ));
        weeks.push(row);
    }
    guard.shutdown();
    let bound = f64::from(options.retain_days) / 7.0 + 2.0;
    ensure!(
        weeks.iter().all(|w| w.hit_rate == 1.0),
        "a read of the current or previous version missed: something in use expired"
    );
    ensure!(
        weeks.iter().all(|w| w.versions_held <= bound),
        "more than {bound:.2} versions held"
    );
    Ok(weeks)
}

/// Records of one entry, one after the other, for as long as `busy` says (at least `least`).
async fn time_records(
    store: &Store,
    least: usize,
    busy: impl Fn() -> bool,
    first: usize,
) -> Result<Vec<f64>> {
    let mut micros = Vec::new();
    let mut i = first;
    while micros.len() < least || busy() {
        let entry = (key(9999, i), result(9999, i % 100, None, 0));
        let started = std::time::Instant::now();
        store.try_apply(vec![entry], None).await?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    Ok(micros)
}

/// `expiring` entries recorded on one day; Records timed alone; then, 31 days on, Records
/// timed while one sweep expires them all.
async fn records_while_expiring(
    options: &LifecycleOptions,
    state: &std::path::Path,
) -> Result<RecordsWhileExpiring> {
    let (guard, _) = Store::open(state, FsyncPolicy::Never)?;
    let store = guard.store();
    let start = tunecache_server::model::entry::unix_now_ms() / MS_PER_DAY * MS_PER_DAY;
    let clock = Clock::manual(start);
    store.set_lifecycle(LifecycleSettings {
        retention: Retention::new(30, []),
        max_entries: 0,
        clock: clock.clone(),
        ..LifecycleSettings::default()
    });
    progress(&format!(
        "lifecycle: recording {} entries",
        options.expiring
    ));
    for first in (0..options.expiring).step_by(1000) {
        let batch = (first..(first + 1000).min(options.expiring))
            .map(|i| (key(0, i), result(0, i % 100, None, clock.now_ms())))
            .collect();
        store.try_apply(batch, None).await?;
    }
    let idle = time_records(&store, 5000, || false, 0).await?;
    clock.advance_days(31);
    progress("lifecycle: sweeping while recording");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeping = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let expired = store.sweep().await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (expired, started.elapsed())
        })
    };
    let during = time_records(
        &store,
        1,
        || !done.load(std::sync::atomic::Ordering::Relaxed),
        1_000_000,
    )
    .await?;
    let (expired, took) = sweeping.await?;
    let expired = expired?;
    ensure!(
        expired as usize >= options.expiring,
        "the sweep expired {expired} of {} entries",
        options.expiring
    );
    guard.shutdown();
    Ok(RecordsWhileExpiring {
        expiring: options.expiring,
        sweep_ms: took.as_secs_f64() * 1e3,
        expired,
        idle: Latencies::of(idle),
        during_sweep: Latencies::of(during),
    })
}

fn table(results: &LifecycleResults) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| week | entries | versions held (bound {:.2}) | memory (records) | journal | artifacts named | hit rate | last-use writes/day (max) | distinct keys read/day | expired so far |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        results.versions_bound
    );
    for week in &results.weeks {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.1} MiB | {:.1} MiB | {:.0} MiB | {:.1}% | {} | {} | {} |",
            week.week,
            week.entries,
            week.versions_held,
            week.memory_bytes as f64 / 1048576.0,
            week.journal_bytes as f64 / 1048576.0,
            week.artifact_bytes as f64 / 1048576.0,
            week.hit_rate * 100.0,
            week.last_use_writes_per_day_max,
            week.distinct_reads_per_day,
            week.expired_total,
        );
    }
    if !results.real.is_empty() {
        let _ = writeln!(
            out,
            "\nThe real run: two daemon processes on one shared directory, their clocks moved a day at a time (libfaketime):\n\n| week | entries A | entries B | A's journal | shared dir | hit rate | last-use journal writes/day, both nodes (max) | uses put in segments/day, both nodes (max) | distinct keys read/day per node |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for week in &results.real {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} MiB | {:.2} MiB | {:.1}% | {} | {} | {} |",
                week.week,
                week.entries_a,
                week.entries_b,
                week.journal_bytes_a as f64 / 1048576.0,
                week.shared_dir_bytes as f64 / 1048576.0,
                week.hit_rate * 100.0,
                week.last_use_writes_per_day_max,
                week.segment_uses_per_day_max,
                week.distinct_reads_per_day,
            );
        }
    }
    if let Some(case) = &results.records_while_expiring {
        let _ = writeln!(
            out,
            "\nOne-entry Records, one after the other, while one sweep expires {} entries ({} expired in {:.0} ms):\n\n| Records | count | p50 | p99 | max |\n|---|---:|---:|---:|---:|",
            case.expiring, case.expired, case.sweep_ms
        );
        for (what, latencies) in [
            ("alone", &case.idle),
            ("during the sweep", &case.during_sweep),
        ] {
            let _ = writeln!(
                out,
                "| {what} | {} | {:.0} µs | {:.0} µs | {:.0} µs |",
                latencies.records, latencies.p50_us, latencies.p99_us, latencies.max_us
            );
        }
    }
    out
}
