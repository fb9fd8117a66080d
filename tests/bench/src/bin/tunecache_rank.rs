//! The `tunecache-rank` binary: plays ONE rank process against a running `tunecached`, as a
//! TensorRT-LLM rank would with the daemon instead of the JSON file. At the barrier release
//! it connects, "loads" its view of the cache (a Scan of the namespace filtered to the shared
//! and own-rank entries, as TensorRT-LLM's loader reads only those sections, and parses them), then Records its new entries, and prints one
//! [`RankReport`] JSON line: `load_ms` = connect + scan + parse, `save_ms` = the Record.
//! With `--scan-all` it Scans the whole namespace instead (every rank's entries, as a tool
//! that reads the whole cache would), and `entries_loaded` counts every entry received.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use tunecache_bench::scenario::{wait_at_barrier, RankReport};
use tunecache_bench::tunecache_system::{
    record_all, tuned_daemon_entries, RankView, DEVICE, NAMESPACE,
};
use tunecache_bench::workload::NEW_EPOCH;
use tunecache_client::Client;

/// Deadline of each call: far above any healthy answer, so a slow daemon shows in the
/// timings instead of failing the rank.
const CALL_DEADLINE: Duration = Duration::from_secs(120);

/// One rank using tunecached.
#[derive(Debug, Parser)]
#[command(name = "tunecache-rank", version)]
struct Args {
    /// The daemon's socket.
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    rank: u32,
    /// Entries this rank tunes (and then records).
    #[arg(long)]
    new_entries: usize,
    /// Fraction of the new entries that are shared (identical on every rank).
    #[arg(long, default_value_t = 0.5)]
    shared_fraction: f64,
    /// Print `ready`, then wait for EOF on stdin before starting (the scenario barrier).
    #[arg(long)]
    barrier_stdin: bool,
    /// Scan every entry of the namespace and device, not only the shared and own-rank ones.
    #[arg(long)]
    scan_all: bool,
}

fn millis(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let tuned = tuned_daemon_entries(args.rank, NEW_EPOCH, args.new_entries, args.shared_fraction);

    if args.barrier_stdin {
        wait_at_barrier().context("waiting at the barrier")?;
    }

    // The connection is part of the load: a real rank opens it when its cache starts.
    let load_started = Instant::now();
    let client = Client::connect(&args.socket)
        .await
        .context("connecting to tunecached")?
        .with_timeout(CALL_DEADLINE);
    let scanned = if args.scan_all {
        client.scan(NAMESPACE, DEVICE).await
    } else {
        client.scan_for_rank(NAMESPACE, DEVICE, args.rank).await
    }
    .context("scanning the cache")?;
    let view = RankView::from_scan(args.rank, &scanned).context("parsing the scan")?;
    let load_took = load_started.elapsed();

    let save_started = Instant::now();
    record_all(&client, tuned)
        .await
        .context("recording new entries")?;
    let save_took = save_started.elapsed();

    let report = RankReport {
        rank: args.rank,
        system: "tunecache".to_owned(),
        load_ms: millis(load_took),
        save_ms: millis(save_took),
        cache_ms: millis(load_took + save_took),
        // The rank writes nothing to the shared filesystem; the daemon's snapshot bytes are
        // counted once per scenario by the runner.
        bytes_written: 0,
        entries_loaded: if args.scan_all {
            scanned.len()
        } else {
            view.len()
        },
        save_outcome: "recorded".to_owned(),
        warnings: 0,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
