//! Owns the `startup` subcommand (issue 38): what N nodes joining at once, and N nodes
//! restarted on their state directories, cost a real `redis-server` holding E entries, for
//! each daemon binary given (this build and main's, in the same run): the time until the
//! last node holds every entry, and Redis's commands, CPU and bytes out, read from Redis's
//! own `INFO` before and after (less the idle traffic of the one writer node, measured just
//! before). A restart happens after 1,000 new entries were recorded while the nodes were
//! down. One node joining alone is the reference time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::{DaemonConfig, DaemonProcess};
use tunecache_bench::multinode::RedisServer;
use tunecache_client::{proto, Client};

#[derive(Debug, Clone)]
pub struct StartupOptions {
    pub out_dir: PathBuf,
    /// (label, tunecached) pairs; each is measured at every N.
    pub binaries: Vec<(String, PathBuf)>,
    pub nodes: Vec<usize>,
    pub entries: usize,
    /// Recorded while the nodes are down, before the restart.
    pub new_while_down: usize,
    pub limit: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct StartupRow {
    pub binary: String,
    pub kind: String,
    pub nodes: usize,
    pub entries: usize,
    pub warm_ms: f64,
    pub redis_commands: u64,
    pub redis_cpu_s: f64,
    pub redis_bytes_out: u64,
    /// Sums over the nodes' own Stats (this build only; 0 for main).
    pub checkpoints_loaded: u64,
    pub shards_reread: u64,
}

/// Redis's counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct RedisCounters {
    commands: u64,
    cpu_s: f64,
    bytes_out: u64,
}

fn redis_cli(port: u16, args: &[&str]) -> Result<String> {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .context("redis-cli")?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn redis_counters(port: u16) -> Result<RedisCounters> {
    let text = redis_cli(port, &["INFO", "all"])?;
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(RedisCounters {
        commands: field("total_commands_processed") as u64,
        cpu_s: field("used_cpu_user") + field("used_cpu_sys"),
        bytes_out: field("total_net_output_bytes") as u64,
    })
}

fn port_of(redis: &RedisServer) -> u16 {
    redis
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(6379)
}

fn entry(i: usize, tag: &str) -> proto::Entry {
    proto::Entry {
        key: Some(tunecache_client::key(
            "trtllm",
            &format!("trtllm::gemm_{}", i % 7),
            "NVIDIA H200|sm_90|cuda 12.8",
            &format!("{tag}:m={i},n=4096,k=4096,dtype=f16"),
            None,
        )),
        result: Some(proto::Result {
            config: format!(r#"{{"tactic":{},"tile":[128,128,64]}}"#, i % 97),
            time_us: 1.0 + (i % 1000) as f64 / 8.0,
            tuned_by: "writer/rank0".to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000 + i as i64,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

async fn spawn(
    binary: &Path,
    dir: &Path,
    name: &str,
    url: &str,
    extra: &[&str],
) -> Result<(DaemonProcess, Client)> {
    let mut args = vec!["--cluster-url".to_owned(), url.to_owned()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let mut daemon = DaemonProcess::spawn(&DaemonConfig {
        binary: binary.to_path_buf(),
        work_dir: dir.join(name),
        node_name: name.to_owned(),
        shared_dir: None,
        snapshot_interval_s: 3600,
        extra_args: args,
    })?;
    let client = daemon.wait_ready().await?;
    Ok((daemon, client))
}

/// Waits until every client is bootstrapped and holds `entries`; the time from `since`.
async fn wait_warm(
    clients: &[Client],
    entries: u64,
    since: Instant,
    limit: Duration,
) -> Result<Duration> {
    let deadline = since + limit;
    for client in clients {
        loop {
            let stats = client.stats().await?;
            if stats.cluster_bootstrapped && stats.entries >= entries {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "a node was not warm within {limit:?}: {} of {entries} entries, {}",
                    stats.entries,
                    stats.cluster_state
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(since.elapsed())
}

async fn node_sums(clients: &[Client]) -> Result<(u64, u64)> {
    let mut sums = (0, 0);
    for client in clients {
        let stats = client.stats().await?;
        sums.0 += stats.cluster_checkpoints_loaded;
        sums.1 += stats.cluster_shards_reread;
    }
    Ok(sums)
}

/// The writer's idle traffic per second, measured over two seconds.
async fn idle_rate(port: u16) -> Result<(f64, f64, f64)> {
    let before = redis_counters(port)?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = redis_counters(port)?;
    let secs = started.elapsed().as_secs_f64();
    Ok((
        (after.commands - before.commands).saturating_sub(2) as f64 / secs,
        (after.cpu_s - before.cpu_s).max(0.0) / secs,
        after.bytes_out.saturating_sub(before.bytes_out) as f64 / secs,
    ))
}

#[allow(clippy::too_many_arguments)]
fn row(
    binary: &str,
    kind: &str,
    nodes: usize,
    entries: usize,
    warm: Duration,
    before: RedisCounters,
    after: RedisCounters,
    idle: (f64, f64, f64),
    sums: (u64, u64),
) -> StartupRow {
    let secs = warm.as_secs_f64();
    StartupRow {
        binary: binary.to_owned(),
        kind: kind.to_owned(),
        nodes,
        entries,
        warm_ms: secs * 1000.0,
        redis_commands: (after.commands - before.commands)
            .saturating_sub(1 + (idle.0 * secs) as u64),
        redis_cpu_s: (after.cpu_s - before.cpu_s - idle.1 * secs).max(0.0),
        redis_bytes_out: after
            .bytes_out
            .saturating_sub(before.bytes_out)
            .saturating_sub((idle.2 * secs) as u64),
        checkpoints_loaded: sums.0,
        shards_reread: sums.1,
    }
}

/// One binary at one N: seed, a fresh join of N, then a restart of the N.
async fn run_one(
    options: &StartupOptions,
    label: &str,
    binary: &Path,
    nodes: usize,
) -> Result<Vec<StartupRow>> {
    let dir = tempfile::tempdir_in(&options.out_dir)?;
    let redis_binary = tunecache_bench::multinode::find_redis_server().context("redis-server")?;
    let redis = RedisServer::start(&redis_binary, &dir.path().join("redis"))?;
    let port = port_of(&redis);
    let url = redis.url();
    let is_main = label == "main";
    let writer_flags: Vec<&str> = if is_main {
        vec![]
    } else {
        vec!["--cluster-checkpoint-check-ms", "1000"]
    };
    let (_writer, writer) = spawn(binary, dir.path(), "writer", &url, &writer_flags).await?;
    let seeded: Vec<proto::Entry> = (0..options.entries).map(|i| entry(i, "seed")).collect();
    for chunk in seeded.chunks(1000) {
        writer.record(chunk.to_vec()).await?;
    }
    let deadline = Instant::now() + options.limit;
    while writer.stats().await?.cluster_published < options.entries as u64 {
        if Instant::now() > deadline {
            bail!("the writer did not publish the seed");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !is_main {
        // Every shard's checkpoint at its newest sequence number.
        loop {
            let current = (0..16).all(|s| {
                let cp = redis_cli(port, &["HGET", &format!("tunecache:cp:{{s{s:02}}}"), "seq"]);
                let meta = redis_cli(port, &["HGET", &format!("tunecache:m:{{s{s:02}}}"), "s"]);
                matches!((cp, meta), (Ok(cp), Ok(meta)) if !cp.is_empty() && cp == meta)
            });
            if current {
                break;
            }
            if Instant::now() > deadline {
                bail!("the checkpoints were never built");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut rows = Vec::new();
    // N fresh nodes at once.
    let idle = idle_rate(port).await?;
    let before = redis_counters(port)?;
    let started = Instant::now();
    let names: Vec<String> = (0..nodes).map(|n| format!("node{n}")).collect();
    let spawns = names
        .iter()
        .map(|name| spawn(binary, dir.path(), name, &url, &[]));
    let spawned = futures::future::try_join_all(spawns).await?;
    let (mut daemons, clients): (Vec<DaemonProcess>, Vec<Client>) = spawned.into_iter().unzip();
    let warm = wait_warm(&clients, options.entries as u64, started, options.limit).await?;
    let after = redis_counters(port)?;
    let fresh = row(
        label,
        "fresh",
        nodes,
        options.entries,
        warm,
        before,
        after,
        idle,
        node_sums(&clients).await?,
    );
    eprintln!("{fresh:?}");
    rows.push(fresh);
    // Stop them, record new entries, restart them on their state directories.
    for daemon in &mut daemons {
        daemon.stop();
    }
    drop(clients);
    let new: Vec<proto::Entry> = (0..options.new_while_down)
        .map(|i| entry(i, "new"))
        .collect();
    writer.record(new).await?;
    let total = (options.entries + options.new_while_down) as u64;
    while writer.stats().await?.cluster_published < total {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle = idle_rate(port).await?;
    let before = redis_counters(port)?;
    let started = Instant::now();
    let spawns = names
        .iter()
        .map(|name| spawn(binary, dir.path(), name, &url, &[]));
    let spawned = futures::future::try_join_all(spawns).await?;
    let (_daemons, clients): (Vec<DaemonProcess>, Vec<Client>) = spawned.into_iter().unzip();
    let warm = wait_warm(&clients, total, started, options.limit).await?;
    let after = redis_counters(port)?;
    let restarted = row(
        label,
        "restarted",
        nodes,
        options.entries,
        warm,
        before,
        after,
        idle,
        node_sums(&clients).await?,
    );
    eprintln!("{restarted:?}");
    rows.push(restarted);
    Ok(rows)
}

pub fn run_startup(options: &StartupOptions, command_line: &str) -> Result<()> {
    std::fs::create_dir_all(&options.out_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &nodes in &options.nodes {
        for (label, binary) in &options.binaries {
            rows.extend(runtime.block_on(run_one(options, label, binary, nodes))?);
        }
    }
    let json = serde_json::json!({ "command_line": command_line, "rows": rows });
    std::fs::write(
        options.out_dir.join("startup.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(options.out_dir.join("startup.md"), markdown(&rows))?;
    println!("{}", markdown(&rows));
    Ok(())
}

fn markdown(rows: &[StartupRow]) -> String {
    let mut out = String::from(
        "| binary | start | nodes | time until the last is warm | Redis commands (per node) | Redis CPU (per node) | Redis bytes out (per node) | checkpoints loaded | shards read again |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let n = r.nodes as f64;
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} s | {} ({:.0}) | {:.3} s ({:.1} ms) | {:.1} MB ({:.1} kB) | {} | {} |\n",
            r.binary,
            r.kind,
            r.nodes,
            r.warm_ms / 1000.0,
            r.redis_commands,
            r.redis_commands as f64 / n,
            r.redis_cpu_s,
            r.redis_cpu_s * 1000.0 / n,
            r.redis_bytes_out as f64 / 1e6,
            r.redis_bytes_out as f64 / 1e3 / n,
            r.checkpoints_loaded,
            r.shards_reread,
        ));
    }
    out
}
