//! `tunecache-test-rank`: plays one rank process for the coordinated-tuning tests.
//!
//! It waits for a start file (so many ranks begin together), then runs the client's rank
//! flow (`get_or_tune`) for each of its keys in a seeded order. "Tuning" appends the
//! problem to a count file (one `write` with O_APPEND, so lines from many processes never
//! interleave), sleeps, and returns a result naming this pid. One JSON line per key on
//! stdout says how that key ended.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use tunecache_client::{key, proto, Client, RankOutcome, ResolveOptions};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, default_value = "test")]
    namespace: String,
    #[arg(long, default_value = "gemm")]
    op: String,
    /// Keys are problems `p0` .. `p<count-1>`.
    #[arg(long, default_value_t = 1)]
    key_count: usize,
    /// 0 keeps the natural order; anything else shuffles with this seed.
    #[arg(long, default_value_t = 0)]
    order_seed: u64,
    #[arg(long, default_value_t = 0)]
    tune_ms: u64,
    /// Tuning never finishes (the test kills this process).
    #[arg(long)]
    hang: bool,
    /// Tuning waits until this file exists (after counting itself), so a test can hold the
    /// tuner until the other ranks are waiting on its lease.
    #[arg(long)]
    tune_gate: Option<PathBuf>,
    #[arg(long)]
    count_file: PathBuf,
    #[arg(long)]
    start_file: Option<PathBuf>,
    #[arg(long, default_value_t = 30_000)]
    wait_ms: u64,
    #[arg(long, default_value_t = 0)]
    lease_ms: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(start) = &args.start_file {
        while !start.exists() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let client = Client::connect(&args.socket).await?;
    let pid = std::process::id();
    let options = ResolveOptions {
        wait: Duration::from_millis(args.wait_ms),
        can_tune: true,
        lease: Duration::from_millis(args.lease_ms),
    };
    let stdout = std::io::stdout();
    for index in tunecache_integration::rank_order(args.key_count, args.order_seed) {
        let problem = format!("p{index}");
        let k = key(&args.namespace, &args.op, "test-device", &problem, None);
        let count_file = args.count_file.clone();
        let outcome = client
            .get_or_tune(k, options, || async {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&count_file)?;
                file.write_all(format!("{problem} {pid}\n").as_bytes())?;
                if args.hang {
                    std::future::pending::<()>().await;
                }
                if let Some(gate) = &args.tune_gate {
                    while !gate.exists() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(args.tune_ms)).await;
                Ok::<_, std::io::Error>(proto::Result {
                    config: json!({"tile": index % 7, "tuned_by_pid": pid}).to_string(),
                    time_us: 10.0 + index as f64,
                    tuned_by: format!("rank-pid-{pid}"),
                    tuned_at_unix_ms: 0,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                })
            })
            .await;
        let line = match &outcome {
            RankOutcome::Cached(r) => {
                json!({"key": index, "outcome": "cached", "config": r.config})
            }
            RankOutcome::Tuned(r) => json!({"key": index, "outcome": "tuned", "config": r.config}),
            RankOutcome::Fallback(reason) => {
                json!({"key": index, "outcome": "fallback", "reason": reason})
            }
        };
        writeln!(stdout.lock(), "{line}")?;
    }
    Ok(())
}
