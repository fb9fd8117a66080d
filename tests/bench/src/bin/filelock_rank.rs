//! The `filelock-rank` binary: plays ONE rank process of the file-lock peer. It loads the
//! cache file, "tunes" its deterministic new entries (free), saves, and prints one
//! [`RankReport`] JSON line with its timings on stdout; warnings go to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use tunecache_bench::filelock::{FileLockCache, SaveOutcome, Variant};
use tunecache_bench::scenario::{wait_at_barrier, RankReport};
use tunecache_bench::workload::{tuned_entries, NEW_EPOCH};

/// One rank of the file-lock autotuner cache.
#[derive(Debug, Parser)]
#[command(name = "filelock-rank", version)]
struct Args {
    #[arg(long, value_enum)]
    variant: Variant,
    /// The shared cache file.
    #[arg(long)]
    cache: PathBuf,
    #[arg(long)]
    rank: u32,
    /// Entries this rank tunes (and then saves).
    #[arg(long)]
    new_entries: usize,
    /// Fraction of the new entries that are shared (identical on every rank).
    #[arg(long, default_value_t = 0.5)]
    shared_fraction: f64,
    /// "after" variant: longest wait for the writer lock before the save is skipped.
    #[arg(long, default_value_t = 120.0)]
    lock_timeout_s: f64,
    /// Print `ready`, then wait for EOF on stdin before starting (the scenario barrier).
    #[arg(long)]
    barrier_stdin: bool,
}

fn millis(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e3
}

fn warn(rank: u32, message: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "filelock-rank {rank}: warning: {message}"
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    let lock_timeout = Duration::try_from_secs_f64(args.lock_timeout_s)
        .context("--lock-timeout-s must be a non-negative number of seconds")?;
    let mut cache = FileLockCache::new(args.variant, &args.cache, args.rank, lock_timeout);
    let tuned = tuned_entries(args.rank, NEW_EPOCH, args.new_entries, args.shared_fraction);

    if args.barrier_stdin {
        wait_at_barrier().context("waiting at the barrier")?;
    }

    let load_started = Instant::now();
    let load = cache.load().context("loading the cache")?;
    let load_took = load_started.elapsed();
    cache.insert_tuned(&tuned.shared, &tuned.own);
    let save_started = Instant::now();
    let save = cache.save().context("saving the cache")?;
    let save_took = save_started.elapsed();

    for warning in load.warnings.iter().chain(&save.warnings) {
        warn(args.rank, warning);
    }
    let report = RankReport {
        rank: args.rank,
        system: format!("filelock-{}", args.variant),
        load_ms: millis(load_took),
        save_ms: millis(save_took),
        cache_ms: millis(load_took + save_took),
        bytes_written: save.bytes_written,
        entries_loaded: load.entries_loaded,
        save_outcome: serde_json::to_value(save.outcome)
            .ok()
            .and_then(|value| value.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", save.outcome)),
        warnings: load.warnings.len() + save.warnings.len(),
    };
    println!("{}", serde_json::to_string(&report)?);
    if save.outcome == SaveOutcome::LockTimeout {
        // Not a failure: the PR's behaviour is to continue and re-tune next run.
        warn(args.rank, "save skipped after lock timeout");
    }
    Ok(())
}
