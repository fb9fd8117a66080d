//! Owns the `cluster` subcommand: N real daemons on this machine sharing one directory (local
//! disk, or slowfs at a latency), S existing entries, and what the shared directory costs
//! for snapshot format 2 and, side by side, for a format-1 daemon of the last release:
//!
//! - bytes read and written by all daemons together for one new entry, until the cluster is
//!   quiet again (read from `/proc/<pid>/io`, `rchar` and `wchar`: every byte the processes
//!   read or wrote, so the node-local journal's append of that entry and the few Stats calls
//!   of the harness count too; the file bytes alone, from Stats, are reported for format 2);
//! - time until that entry is on every node;
//! - bytes read in an idle interval;
//! - time for a fresh node joining the N = `join_nodes` cluster to hold every entry.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::{workspace_binary, DaemonConfig, DaemonProcess};
use tunecache_client::{proto, Client};

use super::slowfs::SlowMount;

/// What the `cluster` subcommand was asked to do.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub out_dir: PathBuf,
    pub nodes: Vec<usize>,
    pub existing: usize,
    pub interval_s: u64,
    /// slowfs latencies to run on besides the local disk.
    pub latencies_ms: Vec<u64>,
    /// A format-1 `tunecached` (the last release); without it only format 2 runs.
    pub v1_binary: Option<PathBuf>,
    /// The cluster size a fresh node joins.
    pub join_nodes: usize,
    /// Give up waiting for the cluster to converge or settle after this long.
    pub limit: Duration,
}

/// One (format, filesystem, N) run.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRow {
    pub format: u32,
    pub filesystem: String,
    pub nodes: usize,
    pub existing: usize,
    /// All daemons, one idle interval.
    pub idle_bytes_read: u64,
    pub idle_bytes_written: u64,
    /// All daemons, from the Record of one new entry until the cluster is quiet.
    pub new_entry_bytes_read: u64,
    pub new_entry_bytes_written: u64,
    /// Format 2 only: shared-directory file bytes for that entry, from Stats.
    pub new_entry_file_bytes_read: Option<u64>,
    pub new_entry_file_bytes_written: Option<u64>,
    /// From the Record until the entry was on every node.
    pub propagation_ms: f64,
    /// From the Record until no daemon read or wrote any more.
    pub settle_ms: f64,
    /// A fresh node joining this cluster: spawn to holding every entry.
    pub join_ms: Option<f64>,
    pub converge_setup_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterResults {
    pub machine: super::MachineInfo,
    pub options: String,
    pub rows: Vec<ClusterRow>,
}

/// `rchar` and `wchar` of a process.
fn process_io(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .with_context(|| format!("/proc/{pid}/io"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((field("rchar:"), field("wchar:")))
}

struct Node {
    process: DaemonProcess,
    client: Client,
}

struct Cluster {
    nodes: Vec<Node>,
}

impl Cluster {
    fn io(&self) -> Result<(u64, u64)> {
        let mut total = (0, 0);
        for node in &self.nodes {
            let (read, written) = process_io(node.process.pid()?)?;
            total.0 += read;
            total.1 += written;
        }
        Ok(total)
    }

    /// Shared-directory file bytes from Stats (format 2 only).
    async fn file_bytes(&self) -> Result<(u64, u64)> {
        let mut total = (0, 0);
        for node in &self.nodes {
            let stats = node.client.stats().await?;
            total.0 += stats.snapshot_bytes_read;
            total.1 += stats.snapshot_bytes_written;
        }
        Ok(total)
    }

    async fn all_hold(&self, entries: u64, limit: Duration) -> Result<Duration> {
        let started = Instant::now();
        for node in &self.nodes {
            while node.client.stats().await?.entries < entries {
                if started.elapsed() > limit {
                    bail!("the cluster did not reach {entries} entries within {limit:?}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(started.elapsed())
    }

    /// Waits until the daemons are quiet for two intervals; returns when that began. Quiet
    /// allows `NOISE_PER_NODE` bytes per sample and daemon: the runtime's eventfd wake-ups
    /// (8 bytes each) count in `rchar`/`wchar` too.
    async fn settle(&self, interval: Duration, limit: Duration) -> Result<Instant> {
        let started = Instant::now();
        let sample = interval / 4;
        let noise = NOISE_PER_NODE * self.nodes.len() as u64;
        let mut last = self.io()?;
        let mut last_change = Instant::now();
        loop {
            tokio::time::sleep(sample).await;
            let now = self.io()?;
            let delta = (now.0 - last.0) + (now.1 - last.1);
            last = now;
            if delta > noise {
                last_change = Instant::now();
            } else if last_change.elapsed() >= interval * 2 {
                return Ok(last_change);
            }
            if started.elapsed() > limit {
                bail!("the cluster kept reading or writing for {limit:?}");
            }
        }
    }
}

/// Bytes per daemon and settle sample that still count as quiet (see `Cluster::settle`).
const NOISE_PER_NODE: u64 = 64;

fn key(problem: &str) -> proto::Key {
    tunecache_client::key("bench", "gemm", "bench-device", problem, None)
}

fn entry(problem: &str, time_us: f64, node: &str) -> proto::Entry {
    proto::Entry {
        key: Some(key(problem)),
        result: Some(proto::Result {
            config: format!(r#"{{"tactic":"{problem}","tile":[128,128,64],"stages":3}}"#),
            time_us,
            tuned_by: node.to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

async fn spawn_node(
    binary: &Path,
    root: &Path,
    shared: &Path,
    name: &str,
    interval_s: u64,
) -> Result<Node> {
    let config = DaemonConfig {
        binary: binary.to_path_buf(),
        work_dir: root.join(name),
        node_name: name.to_owned(),
        shared_dir: Some(shared.to_path_buf()),
        snapshot_interval_s: interval_s,
        extra_args: Vec::new(),
    };
    let mut process = DaemonProcess::spawn(&config)?;
    let client = process.wait_ready().await?;
    Ok(Node { process, client })
}

/// One run: N daemons of `binary` on `shared`.
async fn run_one(
    options: &ClusterOptions,
    binary: &Path,
    format: u32,
    filesystem: &str,
    shared: &Path,
    nodes: usize,
) -> Result<ClusterRow> {
    let scratch = tempfile::tempdir().context("scratch directory")?;
    let interval = Duration::from_secs(options.interval_s);
    let setup_started = Instant::now();
    let mut cluster = Cluster { nodes: Vec::new() };
    for i in 0..nodes {
        let name = format!("node-{i:03}");
        cluster
            .nodes
            .push(spawn_node(binary, scratch.path(), shared, &name, options.interval_s).await?);
    }
    // S existing entries, each node contributing its share; then the cluster converges.
    let share = options.existing.div_ceil(nodes);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let range = (i * share)..((i + 1) * share).min(options.existing);
        let batch: Vec<_> = range
            .map(|n| {
                entry(
                    &format!("existing-{n}"),
                    10.0 + n as f64,
                    &format!("node-{i:03}"),
                )
            })
            .collect();
        for chunk in batch.chunks(1000) {
            node.client.record(chunk.to_vec()).await?;
        }
    }
    let existing = options.existing as u64;
    cluster.all_hold(existing, options.limit).await?;
    cluster.settle(interval, options.limit).await?;
    let converge_setup_ms = setup_started.elapsed().as_secs_f64() * 1e3;

    // An idle interval.
    let before = cluster.io()?;
    tokio::time::sleep(interval).await;
    let after = cluster.io()?;
    let (idle_bytes_read, idle_bytes_written) = (after.0 - before.0, after.1 - before.1);

    // One new entry: bytes until the cluster is quiet (no polling meanwhile).
    let files_before = if format == 2 {
        Some(cluster.file_bytes().await?)
    } else {
        None
    };
    let before = cluster.io()?;
    let recorded_at = Instant::now();
    cluster.nodes[0]
        .client
        .record(vec![entry("new-for-bytes", 1.0, "node-000")])
        .await?;
    let quiet_since = cluster.settle(interval, options.limit).await?;
    let settle_ms = quiet_since.duration_since(recorded_at).as_secs_f64() * 1e3;
    let after = cluster.io()?;
    let (new_entry_file_bytes_read, new_entry_file_bytes_written) = match files_before {
        Some(before) => {
            let after = cluster.file_bytes().await?;
            (Some(after.0 - before.0), Some(after.1 - before.1))
        }
        None => (None, None),
    };

    // Another new entry: time until every node holds it.
    let recorded_at = Instant::now();
    let last = cluster.nodes.len() - 1;
    cluster.nodes[last]
        .client
        .record(vec![entry("new-for-time", 1.0, "last")])
        .await?;
    for node in &cluster.nodes {
        while node
            .client
            .lookup(vec![key("new-for-time")])
            .await?
            .is_empty()
        {
            if recorded_at.elapsed() > options.limit {
                bail!(
                    "the new entry did not reach every node within {:?}",
                    options.limit
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let propagation_ms = recorded_at.elapsed().as_secs_f64() * 1e3;

    let join_ms = if nodes == options.join_nodes {
        cluster.settle(interval, options.limit).await?;
        let started = Instant::now();
        let joined = spawn_node(
            binary,
            scratch.path(),
            shared,
            "node-joining",
            options.interval_s,
        )
        .await?;
        let everything = existing + 2;
        while joined.client.stats().await?.entries < everything {
            if started.elapsed() > options.limit {
                bail!(
                    "the joining node did not load everything within {:?}",
                    options.limit
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster.nodes.push(joined);
        Some(started.elapsed().as_secs_f64() * 1e3)
    } else {
        None
    };
    for node in &mut cluster.nodes {
        node.process.stop();
    }
    Ok(ClusterRow {
        format,
        filesystem: filesystem.to_owned(),
        nodes,
        existing: options.existing,
        idle_bytes_read,
        idle_bytes_written,
        new_entry_bytes_read: after.0 - before.0,
        new_entry_bytes_written: after.1 - before.1,
        new_entry_file_bytes_read,
        new_entry_file_bytes_written,
        propagation_ms,
        settle_ms,
        join_ms,
        converge_setup_ms,
    })
}

/// Runs every (filesystem, N, format) combination and writes `cluster.json` and
/// `cluster.md` into the output directory.
pub fn run_cluster(options: &ClusterOptions, command_line: &str) -> Result<()> {
    std::fs::create_dir_all(&options.out_dir)?;
    let v2_binary = workspace_binary("tunecached");
    let slowfs_binary = workspace_binary("slowfs");
    let mut formats = vec![(2, v2_binary)];
    if let Some(v1) = &options.v1_binary {
        formats.insert(0, (1, v1.clone()));
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut filesystems = vec![None];
    filesystems.extend(options.latencies_ms.iter().copied().map(Some));
    for latency in filesystems {
        for &nodes in &options.nodes {
            for (format, binary) in &formats {
                let root = tempfile::tempdir()?;
                let (label, _mount, shared) = match latency {
                    None => ("local".to_owned(), None, root.path().join("shared")),
                    Some(ms) => {
                        let mount = SlowMount::mount(&slowfs_binary, root.path(), ms, 256)?;
                        let shared = mount.mountpoint().join("shared");
                        (format!("slowfs-{ms}ms"), Some(mount), shared)
                    }
                };
                std::fs::create_dir_all(&shared)?;
                eprintln!("cluster: format {format}, {label}, N = {nodes} ...");
                let row =
                    runtime.block_on(run_one(options, binary, *format, &label, &shared, nodes));
                match row {
                    Ok(row) => {
                        eprintln!("{}", serde_json::to_string(&row)?);
                        rows.push(row);
                    }
                    Err(error) => eprintln!(
                        "cluster: format {format}, {label}, N = {nodes} failed: {error:#}"
                    ),
                }
            }
        }
    }
    let results = ClusterResults {
        machine: super::machine_info(command_line),
        options: format!("{options:?}"),
        rows,
    };
    std::fs::write(
        options.out_dir.join("cluster.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;
    std::fs::write(options.out_dir.join("cluster.md"), markdown(&results))?;
    Ok(())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 10 << 20 => format!("{:.0} MB", b as f64 / 1e6),
        b if b >= 1 << 20 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 10 << 10 => format!("{:.0} KB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

fn markdown(results: &ClusterResults) -> String {
    let mut out = String::from(
        "| format | filesystem | N | one new entry: read | written | file bytes read / written (Stats) | reaches every node | quiet after | idle interval: read | fresh node joins |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in &results.rows {
        let files = match (
            row.new_entry_file_bytes_read,
            row.new_entry_file_bytes_written,
        ) {
            (Some(read), Some(written)) => format!("{} / {}", human(read), human(written)),
            _ => "–".to_owned(),
        };
        out.push_str(&format!(
            "| v{} | {} | {} | {} | {} | {} | {:.2} s | {:.1} s | {} | {} |\n",
            row.format,
            row.filesystem,
            row.nodes,
            human(row.new_entry_bytes_read),
            human(row.new_entry_bytes_written),
            files,
            row.propagation_ms / 1e3,
            row.settle_ms / 1e3,
            human(row.idle_bytes_read),
            row.join_ms
                .map_or("–".to_owned(), |ms| format!("{:.2} s", ms / 1e3)),
        ));
    }
    out
}
