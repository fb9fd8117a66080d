//! Owns the memory and start-up benchmark at scale (issue 54): for each size N (100,000,
//! 1,000,000 and 10,000,000 entries by default), a fresh daemon on local disk with no shared
//! directory is filled with N entries (the data set of `micro`'s memory figure: half shared,
//! half spread over 64 ranks, made entry by entry so that the harness never holds them all),
//! Recorded in batches of the daemon's most entries per request with a few Records in flight.
//! Then:
//!
//! - **bytes per entry**: the daemon's RSS after the Records (read after 1 s idle) less its RSS
//!   when empty (read the same way), over N, against the mean encoded size of one `Entry`;
//! - **start-up from the journal**: the daemon is stopped (SIGTERM) and a new one spawned on the
//!   same state directory; the time from its spawn until Stats answers with N entries, its
//!   peak RSS (VmHWM) then, and its RSS after 1 s idle;
//! - **Lookup**: on the restarted daemon, one-key Lookups of held keys picked across the whole
//!   key space, one after the other on one connection, their p50 and p99.
//!
//! Sizes below 5,000,000 run `--rounds` rounds, larger ones `--large-rounds`. With
//! `--perf-dir` the largest size's start-ups are profiled (`profile`) from just after the spawn
//! (perf attaches meanwhile, so the first moments may be missing). Writes `scale.json`
//! and `scale.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use futures::StreamExt;
use serde::Serialize;
use tunecache_bench::daemon::{workspace_binary, DaemonConfig, DaemonProcess};
use tunecache_bench::tunecache_system::{daemon_entry, RECORD_BATCH};
use tunecache_bench::workload::{rank_entry, rank_key, shared_entry, shared_key, EXISTING_EPOCH};
use tunecache_client::{proto as v1, Client};

use super::lookup_load::Spread;
use super::micro::{key_of, latency_of, Latency};
use super::{profile, RunInfo, Setup};

/// Sizes from this many entries on run `--large-rounds` rounds.
const LARGE: usize = 5_000_000;
/// Ranks the rank-specific half of the data set is spread over (as `micro`'s memory figure).
const RANKS: usize = 64;
/// How long a daemon is left idle before its steady-state memory is read.
const SETTLE: Duration = Duration::from_secs(1);
/// One-key Lookups made untimed before the timed ones.
const WARM_UP: usize = 1_000;
/// Longest a start-up from the journal may take before the run gives up.
const STARTUP_LIMIT: Duration = Duration::from_secs(600);
const KIB: f64 = 1024.0;

/// What `scale` is asked to measure (its command line).
#[derive(Debug, clap::Args)]
pub struct ScaleOptions {
    #[arg(long = "out", default_value = "bench-out")]
    pub out_dir: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,10000000")]
    pub sizes: Vec<usize>,
    /// Rounds of each size under 5,000,000 entries.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Rounds of each size of 5,000,000 entries or more.
    #[arg(long, default_value_t = 1)]
    pub large_rounds: usize,
    /// Timed one-key Lookups after each start-up.
    #[arg(long, default_value_t = 20_000)]
    pub lookups: usize,
    /// Records (of 10,000 entries) in flight while a daemon is filled.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
    /// Profile the start-ups of the largest size with `perf record`, into this directory.
    #[arg(long)]
    pub perf_dir: Option<PathBuf>,
    #[arg(skip)]
    pub command_line: String,
}

/// One fill, restart and Lookup series at one size.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRound {
    pub entries: usize,
    /// Recording every entry, from the first Record to the last answer.
    pub record_s: f64,
    pub entry_encoded_bytes: f64,
    pub rss_empty_kib: u64,
    pub rss_loaded_kib: u64,
    /// (loaded - empty) / entries.
    pub rss_bytes_per_entry: f64,
    pub rss_per_entry_over_encoded: f64,
    pub journal_bytes: u64,
    /// Spawn of the restarted daemon until Stats answers with every entry.
    pub startup_ms: f64,
    pub startup_peak_rss_kib: u64,
    pub startup_rss_kib: u64,
    /// (restarted RSS - empty) / entries.
    pub restarted_bytes_per_entry: f64,
    pub lookup: Latency,
}

/// One size over its rounds.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleSummary {
    pub entries: usize,
    pub rounds: usize,
    pub record_s: Spread,
    pub entry_encoded_bytes: f64,
    pub rss_bytes_per_entry: Spread,
    pub rss_per_entry_over_encoded: Spread,
    pub restarted_bytes_per_entry: Spread,
    pub journal_bytes: Spread,
    pub startup_ms: Spread,
    pub startup_peak_rss_mib: Spread,
    pub lookup_p50_us: Spread,
    pub lookup_p99_us: Spread,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleResults {
    #[serde(flatten)]
    pub run: RunInfo,
    pub profiled: bool,
    pub rounds: Vec<ScaleRound>,
    pub summary: Vec<ScaleSummary>,
}

/// Entry `index` of the `total`-entry data set: the first half shared, the rest rank-specific
/// entries dealt round-robin over `RANKS` ranks.
fn entry_at(index: usize, total: usize) -> v1::Entry {
    let shared = total / 2;
    if index < shared {
        return daemon_entry(
            &shared_key(EXISTING_EPOCH, index),
            &shared_entry(EXISTING_EPOCH, index),
            None,
        );
    }
    let own = index - shared;
    let rank = (own % RANKS) as u32;
    let slot = own / RANKS;
    daemon_entry(
        &rank_key(EXISTING_EPOCH, slot),
        &rank_entry(rank, EXISTING_EPOCH, slot),
        Some(rank),
    )
}

/// Records the whole data set; returns the mean encoded entry size.
async fn fill(client: &Client, total: usize, in_flight: usize) -> Result<f64> {
    let mut encoded = 0usize;
    {
        let batches = futures::stream::iter((0..total).step_by(RECORD_BATCH))
            .map(|first| {
                let batch: Vec<v1::Entry> = (first..(first + RECORD_BATCH).min(total))
                    .map(|index| entry_at(index, total))
                    .collect();
                encoded += batch.iter().map(prost::Message::encoded_len).sum::<usize>();
                let client = client.clone();
                async move { client.record(batch).await }
            })
            .buffer_unordered(in_flight.max(1));
        futures::pin_mut!(batches);
        while let Some(recorded) = batches.next().await {
            recorded?;
        }
    }
    Ok(encoded as f64 / total as f64)
}

fn directory_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}

/// Spawns the daemon of `config` and waits until Stats answers with `entries`.
async fn start_until_loaded(
    config: &DaemonConfig,
    entries: usize,
    perf: Option<&Path>,
    name: &str,
) -> Result<(DaemonProcess, Client, Duration)> {
    let mut daemon = DaemonProcess::spawn(config)?;
    let recording = profile::record_if(perf, daemon.pid()?, name)?;
    let client = daemon.wait_ready().await?;
    loop {
        let held = client.stats().await?.entries as usize;
        if held >= entries {
            break;
        }
        if daemon.spawned_at.elapsed() > STARTUP_LIMIT {
            bail!("the daemon held {held} of {entries} entries after {STARTUP_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = daemon.spawned_at.elapsed();
    profile::stop(recording)?;
    Ok((daemon, client, took))
}

async fn lookups(client: &Client, total: usize, calls: usize) -> Result<Latency> {
    // A multiplicative hash spreads the keys over the whole data set.
    let key = |call: usize| key_of(&entry_at((call.wrapping_mul(2_654_435_761)) % total, total));
    for call in 0..WARM_UP {
        client.lookup(vec![key(call + calls)]).await?;
    }
    let mut micros = Vec::with_capacity(calls);
    for call in 0..calls {
        let wanted = key(call);
        let started = Instant::now();
        let hits = client.lookup(vec![wanted]).await?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        ensure!(hits.len() == 1, "a one-key Lookup of a held key missed");
    }
    Ok(latency_of(micros))
}

async fn round(
    options: &ScaleOptions,
    scratch: &Path,
    entries: usize,
    index: usize,
    profiled: bool,
) -> Result<ScaleRound> {
    let config = DaemonConfig {
        binary: workspace_binary("tunecached"),
        work_dir: scratch.join(format!("scale-{entries}-{index}")),
        node_name: format!("scale-{index}"),
        shared_dir: None,
        snapshot_interval_s: 3_600,
        extra_args: Vec::new(),
    };
    let mut daemon = DaemonProcess::spawn(&config)?;
    let client = daemon
        .wait_ready()
        .await?
        .with_timeout(Duration::from_secs(300));
    tokio::time::sleep(SETTLE).await;
    let empty = daemon.memory()?;
    let started = Instant::now();
    let entry_encoded_bytes = fill(&client, entries, options.in_flight).await?;
    let record_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let loaded = daemon.memory()?;
    let held = client.stats().await?.entries as usize;
    ensure!(
        held == entries,
        "the daemon holds {held} of {entries} entries"
    );
    drop(client);
    daemon.stop();
    let journal_bytes = directory_bytes(&config.work_dir.join("state"));

    let perf = options.perf_dir.as_deref().filter(|_| profiled);
    let name = format!("startup-{entries}-r{index}");
    let (mut restarted, client, took) = start_until_loaded(&config, entries, perf, &name).await?;
    let startup_peak = restarted.memory()?.hwm_kib;
    tokio::time::sleep(SETTLE).await;
    let startup_rss = restarted.memory()?.rss_kib;
    let lookup = lookups(&client, entries, options.lookups).await?;
    drop(client);
    restarted.stop();
    let _ = std::fs::remove_dir_all(&config.work_dir);

    let per_entry = |rss_kib: u64| (rss_kib as f64 - empty.rss_kib as f64) * KIB / entries as f64;
    let rss_bytes_per_entry = per_entry(loaded.rss_kib);
    Ok(ScaleRound {
        entries,
        record_s,
        entry_encoded_bytes,
        rss_empty_kib: empty.rss_kib,
        rss_loaded_kib: loaded.rss_kib,
        rss_bytes_per_entry,
        rss_per_entry_over_encoded: rss_bytes_per_entry / entry_encoded_bytes,
        journal_bytes,
        startup_ms: took.as_secs_f64() * 1e3,
        startup_peak_rss_kib: startup_peak,
        startup_rss_kib: startup_rss,
        restarted_bytes_per_entry: per_entry(startup_rss),
        lookup,
    })
}

fn summarize(rounds: &[ScaleRound], sizes: &[usize]) -> Vec<ScaleSummary> {
    sizes
        .iter()
        .map(|&entries| {
            let of_size: Vec<&ScaleRound> =
                rounds.iter().filter(|r| r.entries == entries).collect();
            let of = |pick: fn(&ScaleRound) -> f64| Spread::of(of_size.iter().map(|r| pick(r)));
            ScaleSummary {
                entries,
                rounds: of_size.len(),
                record_s: of(|r| r.record_s),
                entry_encoded_bytes: of_size.first().map_or(0.0, |r| r.entry_encoded_bytes),
                rss_bytes_per_entry: of(|r| r.rss_bytes_per_entry),
                rss_per_entry_over_encoded: of(|r| r.rss_per_entry_over_encoded),
                restarted_bytes_per_entry: of(|r| r.restarted_bytes_per_entry),
                journal_bytes: of(|r| r.journal_bytes as f64),
                startup_ms: of(|r| r.startup_ms),
                startup_peak_rss_mib: of(|r| r.startup_peak_rss_kib as f64 / KIB),
                lookup_p50_us: of(|r| r.lookup.p50_us),
                lookup_p99_us: of(|r| r.lookup.p99_us),
            }
        })
        .collect()
}

fn spread(spread: &Spread, scale: f64, digits: usize) -> String {
    format!(
        "{:.*} ({:.*} to {:.*})",
        digits,
        spread.median / scale,
        digits,
        spread.min / scale,
        digits,
        spread.max / scale
    )
}

/// The summary as a Markdown table: median (range) over each size's rounds.
pub fn markdown(results: &ScaleResults) -> String {
    let mut out = String::from(
        "| entries | rounds | RSS per entry (B) | encoded entry (B) | RSS / encoded | target <= 2.5x | after restart (B per entry) | journal | start-up from the journal (s) | target < 20 s | start-up peak RSS (MiB) | Lookup p50 (µs) | Lookup p99 (µs) | Record of all entries (s) |\n\
         |---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|\n",
    );
    for size in &results.summary {
        let verdict = |met: bool| if met { "met" } else { "missed" };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.0} MiB | {} | {} | {} | {} | {} | {} |\n",
            size.entries,
            size.rounds,
            spread(&size.rss_bytes_per_entry, 1.0, 0),
            size.entry_encoded_bytes,
            spread(&size.rss_per_entry_over_encoded, 1.0, 2),
            verdict(size.rss_per_entry_over_encoded.max <= 2.5),
            spread(&size.restarted_bytes_per_entry, 1.0, 0),
            size.journal_bytes.median / (KIB * KIB),
            spread(&size.startup_ms, 1e3, 2),
            verdict(size.startup_ms.max < 20_000.0),
            spread(&size.startup_peak_rss_mib, 1.0, 0),
            spread(&size.lookup_p50_us, 1.0, 0),
            spread(&size.lookup_p99_us, 1.0, 0),
            spread(&size.record_s, 1.0, 1),
        ));
    }
    out
}

pub fn run(options: &ScaleOptions) -> Result<ScaleResults> {
    ensure!(
        !options.sizes.is_empty() && options.sizes.iter().all(|&n| n >= 2),
        "--sizes needs at least one size of 2 entries or more"
    );
    let setup = Setup::new(&options.out_dir, options.perf_dir.as_deref(), "scale")?;
    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    let mut rounds = Vec::new();
    for &entries in &options.sizes {
        let count = if entries >= LARGE {
            options.large_rounds
        } else {
            options.rounds
        };
        for index in 0..count {
            let profiled = entries == largest;
            let measured = setup.runtime.block_on(round(
                options,
                setup.scratch.path(),
                entries,
                index,
                profiled,
            ))?;
            eprintln!(
                "scale {entries} round {}: {:.0} B/entry ({:.2}x of {:.0} B encoded), record {:.1} s, start-up {:.0} ms, lookup p50 {:.0} µs p99 {:.0} µs",
                index + 1,
                measured.rss_bytes_per_entry,
                measured.rss_per_entry_over_encoded,
                measured.entry_encoded_bytes,
                measured.record_s,
                measured.startup_ms,
                measured.lookup.p50_us,
                measured.lookup.p99_us
            );
            rounds.push(measured);
        }
    }
    let results = ScaleResults {
        run: setup.info(&options.command_line),
        profiled: options.perf_dir.is_some(),
        summary: summarize(&rounds, &options.sizes),
        rounds,
    };
    setup.write(&results, &markdown(&results))?;
    Ok(results)
}
