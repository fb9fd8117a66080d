//! Owns the multi-node tuning scenario: N daemons (one per simulated node) on this machine,
//! R ranks each, P problems that every rank needs, every tuning costing T ms of simulated
//! GPU time (a sleep: the point is who tunes, not the tuning). All ranks are released
//! together. It compares three set-ups by the total number of tunings and the wall time
//! until every rank holds every result: no sharing, the shared directory (snapshots every
//! second), and the Redis cluster tier (against a real `redis-server` started here).
//! A single node tuning the P problems alone is the reference wall time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tunecache_client::{key, proto, Client, ResolveOptions};

use crate::daemon::{DaemonConfig, DaemonProcess};

/// What to run.
#[derive(Debug, Clone)]
pub struct MultiNodeOptions {
    pub daemon_binary: PathBuf,
    /// `redis-server`; the Redis set-up is skipped (and says so) without it.
    pub redis_server: Option<PathBuf>,
    pub scratch: PathBuf,
    pub node_counts: Vec<usize>,
    pub ranks_per_node: usize,
    pub problems: usize,
    pub tune_ms: u64,
    /// Longest one set-up may run.
    pub limit: Duration,
}

/// How the nodes share results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    None,
    SharedDir,
    Redis,
}

impl Sharing {
    pub fn label(self) -> &'static str {
        match self {
            Sharing::None => "no sharing",
            Sharing::SharedDir => "shared directory, 1 s",
            Sharing::Redis => "redis tier",
        }
    }
}

/// One set-up's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MultiNodeRow {
    pub setup: String,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub problems: usize,
    pub tune_ms: u64,
    /// Tunings run by all ranks together.
    pub tunings: u64,
    /// From the release of the ranks until the last one holds all P results.
    pub wall_ms: f64,
    /// Every rank ended with every result (no fallback, no time-out).
    pub complete: bool,
    /// Resolves that fell back to node-local coordination (Redis tier only).
    pub cluster_lease_fallbacks: u64,
}

/// All rows of one run, with the reference.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MultiNodeResults {
    pub reference_single_node: MultiNodeRow,
    pub rows: Vec<MultiNodeRow>,
    pub skipped: Vec<String>,
}

/// A `redis-server` for the Redis set-up (and the views benchmark's), killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `binary` on a free loopback port, without persistence, its files in `dir`, and
    /// waits until it listens.
    pub fn start(binary: &Path, dir: &Path) -> Result<RedisServer> {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.local_addr()?.port()
        };
        std::fs::create_dir_all(dir)?;
        let log = std::fs::File::create(dir.join("redis.log"))?;
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not listen on port {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// What `--cluster-url` names it by.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Waits until every one of `clients` is connected to Redis and has finished its initial
/// load from it.
pub async fn wait_connected(clients: &[Client], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    for client in clients {
        loop {
            let stats = client.stats().await?;
            if stats.cluster_state.starts_with("connected") && stats.cluster_bootstrapped {
                break;
            }
            if Instant::now() > deadline {
                bail!("a node did not connect to redis: {}", stats.cluster_state);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(())
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one rank; returns how many results it holds at the end.
async fn run_rank(
    client: Client,
    order: Vec<usize>,
    tune_ms: u64,
    tuned_by: String,
    tunings: Arc<AtomicU64>,
) -> usize {
    let options = ResolveOptions {
        wait: Duration::from_secs(120),
        can_tune: true,
        lease: Duration::from_secs(30),
    };
    let mut held = 0;
    for problem in order {
        let k = key(
            "bench-multinode",
            "gemm",
            "sim-gpu",
            &format!("p{problem}"),
            None,
        );
        let tunings = &tunings;
        let tuned_by = &tuned_by;
        let outcome = client
            .get_or_tune(k, options, || async move {
                tunings.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(tune_ms)).await;
                Ok::<_, std::convert::Infallible>(proto::Result {
                    config: format!("{{\"tile\":{}}}", problem % 7),
                    time_us: 10.0 + problem as f64,
                    tuned_by: tuned_by.clone(),
                    tuned_at_unix_ms: 0,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                })
            })
            .await;
        if outcome.result().is_some() {
            held += 1;
        }
    }
    held
}

/// Runs one set-up with `nodes` daemons.
pub async fn run_setup(
    options: &MultiNodeOptions,
    nodes: usize,
    sharing: Sharing,
    redis_url: Option<&str>,
    run_dir: &Path,
) -> Result<MultiNodeRow> {
    let shared_dir = run_dir.join("shared");
    std::fs::create_dir_all(&shared_dir)?;
    let prefix = format!(
        "bench-{}:",
        run_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("run")
    );
    let mut daemons = Vec::new();
    for n in 0..nodes {
        let mut extra_args = Vec::new();
        if sharing == Sharing::Redis {
            let url = redis_url.context("the redis set-up needs a server")?;
            extra_args = vec![
                "--cluster-url".to_owned(),
                url.to_owned(),
                "--cluster-prefix".to_owned(),
                prefix.clone(),
            ];
        }
        let config = DaemonConfig {
            binary: options.daemon_binary.clone(),
            work_dir: run_dir.join(format!("node{n}")),
            node_name: format!("node{n}"),
            shared_dir: (sharing == Sharing::SharedDir).then(|| shared_dir.clone()),
            snapshot_interval_s: if sharing == Sharing::SharedDir { 1 } else { 30 },
            extra_args,
        };
        daemons.push(DaemonProcess::spawn(&config)?);
    }
    let mut node_clients = Vec::new();
    for daemon in &mut daemons {
        node_clients.push(daemon.wait_ready().await?);
    }
    if sharing == Sharing::Redis {
        wait_connected(&node_clients, Duration::from_secs(30)).await?;
    }
    // One connection per rank, all made before the release.
    let mut ranks = Vec::new();
    for (n, daemon) in daemons.iter().enumerate() {
        for r in 0..options.ranks_per_node {
            let client = Client::connect(&daemon.socket)
                .await?
                .with_timeout(Duration::from_secs(150));
            ranks.push((n, r, client));
        }
    }
    let tunings = Arc::new(AtomicU64::new(0));
    let released = Instant::now();
    let tasks: Vec<_> = ranks
        .into_iter()
        .map(|(n, r, client)| {
            // Each rank walks the problems in its own order (seeds from 1: seed 0 is no shuffle).
            let rank = (n * options.ranks_per_node + r) as u64;
            let order = tunecache_integration::rank_order(options.problems, rank + 1);
            tokio::spawn(run_rank(
                client,
                order,
                options.tune_ms,
                format!("node{n}-rank{r}"),
                Arc::clone(&tunings),
            ))
        })
        .collect();
    let all = futures::future::join_all(tasks);
    let held = tokio::time::timeout(options.limit, all)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{} with {nodes} nodes ran past {:?}",
                sharing.label(),
                options.limit
            )
        })?;
    let wall_ms = released.elapsed().as_secs_f64() * 1000.0;
    let complete = held
        .iter()
        .all(|h| matches!(h, Ok(n) if *n == options.problems));
    let mut fallbacks = 0;
    for client in &node_clients {
        fallbacks += client
            .stats()
            .await
            .map_or(0, |s| s.cluster_lease_fallbacks);
    }
    for daemon in &mut daemons {
        daemon.stop();
    }
    Ok(MultiNodeRow {
        setup: sharing.label().to_owned(),
        nodes,
        ranks_per_node: options.ranks_per_node,
        problems: options.problems,
        tune_ms: options.tune_ms,
        tunings: tunings.load(Ordering::Relaxed),
        wall_ms,
        complete,
        cluster_lease_fallbacks: fallbacks,
    })
}

fn progress(row: &MultiNodeRow) {
    eprintln!(
        "[multinode] N={} {}: {} tunings, wall {:.0} ms{}",
        row.nodes,
        row.setup,
        row.tunings,
        row.wall_ms,
        if row.complete { "" } else { " (INCOMPLETE)" }
    );
}

/// Runs the reference and every (N, set-up) pair.
pub fn run_multinode(options: &MultiNodeOptions) -> Result<MultiNodeResults> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut skipped = Vec::new();
        let redis = match &options.redis_server {
            Some(binary) => Some(RedisServer::start(binary, &options.scratch.join("redis"))?),
            None => {
                skipped.push(
                    "redis tier: redis-server not found (set $REDIS_SERVER or install it)"
                        .to_owned(),
                );
                None
            }
        };
        let redis_url = redis.as_ref().map(RedisServer::url);
        let mut run = 0;
        let mut next_dir = || {
            run += 1;
            options.scratch.join(format!("run{run}"))
        };
        let reference = run_setup(options, 1, Sharing::None, None, &next_dir()).await?;
        progress(&reference);
        let mut rows = Vec::new();
        for &nodes in &options.node_counts {
            for sharing in [Sharing::None, Sharing::SharedDir, Sharing::Redis] {
                if sharing == Sharing::Redis && redis_url.is_none() {
                    continue;
                }
                let row =
                    run_setup(options, nodes, sharing, redis_url.as_deref(), &next_dir()).await?;
                progress(&row);
                rows.push(row);
            }
        }
        Ok(MultiNodeResults {
            reference_single_node: reference,
            rows,
            skipped,
        })
    })
}

/// The Markdown table of a run.
pub fn markdown(results: &MultiNodeResults) -> String {
    let reference = &results.reference_single_node;
    let mut text = format!(
        "Multi-node tuning: {} ranks per node, P = {} problems, {} ms simulated tuning each, all ranks released together. \
         Reference: one node alone tunes P problems in {:.0} ms ({} tunings).\n\n\
         | nodes | set-up | tunings | N x P | wall (ms) | wall / one node alone | complete |\n\
         |---:|---|---:|---:|---:|---:|---|\n",
        reference.ranks_per_node, reference.problems, reference.tune_ms, reference.wall_ms, reference.tunings
    );
    for row in &results.rows {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} |\n",
            row.nodes,
            row.setup,
            row.tunings,
            row.nodes * row.problems,
            row.wall_ms,
            row.wall_ms / reference.wall_ms.max(1.0),
            if row.complete { "yes" } else { "no" }
        ));
    }
    for skipped in &results.skipped {
        text.push_str(&format!("\nSkipped: {skipped}\n"));
    }
    text
}

/// `redis-server` from `$REDIS_SERVER` or PATH.
pub fn find_redis_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("REDIS_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("redis-server"))
            .find(|candidate| candidate.is_file())
    })
}
