//! The `tunecache-bench` binary: command-line front of the benchmark harness. `peer` runs a
//! multi-rank file-lock scenario and prints its JSON result; `generate` writes an initial
//! cache file.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tunecache_bench::filelock::Variant;
use tunecache_bench::scenario::{filelock_rank_binary, run_scenario, FileLockPeer, ScenarioSpec};
use tunecache_bench::workload::write_initial_cache;

#[derive(Debug, Parser)]
#[command(
    name = "tunecache-bench",
    version,
    about = "tunecache benchmark harness"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run R file-lock ranks together on one cache file; print the scenario result as JSON.
    Peer {
        #[arg(long, value_enum)]
        variant: Variant,
        #[arg(long)]
        ranks: u32,
        /// Entries in the cache before the ranks start.
        #[arg(long)]
        existing: usize,
        /// Entries each rank tunes.
        #[arg(long)]
        new: usize,
        /// Directory for the cache file (e.g. on a slowfs mount).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 0.5)]
        shared_fraction: f64,
        /// "after" variant's writer-lock timeout.
        #[arg(long, default_value_t = 120.0)]
        lock_timeout_s: f64,
        /// The rank binary (default: `filelock-rank` beside this executable).
        #[arg(long)]
        rank_binary: Option<PathBuf>,
    },
    /// Write an initial cache file with S existing entries.
    Generate {
        #[arg(long)]
        cache: PathBuf,
        #[arg(long)]
        ranks: u32,
        #[arg(long)]
        existing: usize,
        #[arg(long, default_value_t = 0.5)]
        shared_fraction: f64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Commands::Peer {
            variant,
            ranks,
            existing,
            new,
            dir,
            shared_fraction,
            lock_timeout_s,
            rank_binary,
        } => {
            let mut peer =
                FileLockPeer::new(variant, rank_binary.unwrap_or_else(filelock_rank_binary));
            peer.lock_timeout = Duration::try_from_secs_f64(lock_timeout_s)
                .context("--lock-timeout-s must be a non-negative number of seconds")?;
            let spec = ScenarioSpec {
                dir,
                ranks,
                existing,
                new_entries: new,
                shared_fraction,
            };
            let result = run_scenario(&mut peer, &spec)?;
            println!("{}", serde_json::to_string(&result)?);
        }
        Commands::Generate {
            cache,
            ranks,
            existing,
            shared_fraction,
        } => {
            let bytes = write_initial_cache(&cache, ranks, existing, shared_fraction)?;
            println!("{}", serde_json::json!({ "cache": cache, "bytes": bytes }));
        }
    }
    Ok(())
}
