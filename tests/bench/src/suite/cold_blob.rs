//! Owns the cold-blob benchmark (issue 49): what a rank pays for the first fetch of a blob
//! its node does not hold yet but another node published to the shared directory. Node A
//! uploads B blobs and Records entries naming them, then publishes; each round starts a fresh
//! node B on the same shared directory, which learns the entries, and one client on B takes
//! every blob by `get_artifact` (the descriptor handoff, falling back to a GetArtifact
//! stream), timed blob by blob. B's Stats say which way each blob came: handed
//! (`artifact_handoffs`) or streamed, and from which tier. Run it with each daemon build's
//! `TUNECACHE_BIN_DIR` to compare them: the client and the harness stay the same.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use serde::Serialize;
use tunecache_bench::daemon::{workspace_binary, DaemonConfig, DaemonProcess};
use tunecache_client::{proto, Client};

use super::{load_average, machine_info, median, MachineInfo};

/// What `cold-blob` is asked to measure.
pub struct ColdBlobOptions {
    pub blobs: usize,
    pub blob_kib: u64,
    pub rounds: usize,
    pub command_line: String,
}

/// One fresh node B taking every blob once.
#[derive(Debug, Serialize)]
pub struct ColdRound {
    /// All blobs, one after the other, ms.
    pub total_ms: f64,
    /// One blob's first fetch, ms: median and slowest.
    pub per_blob_p50_ms: f64,
    pub per_blob_max_ms: f64,
    /// B's Stats after the round: blobs handed as descriptors, fetched from the shared
    /// directory, and streamed by GetArtifact (the blobs served, less those handed).
    pub handoffs: u64,
    pub fetched_from_shared_dir: u64,
    pub streamed: u64,
}

#[derive(Debug, Serialize)]
pub struct ColdBlobResults {
    pub command_line: String,
    pub machine: MachineInfo,
    pub daemon: String,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub blobs: usize,
    pub blob_bytes: u64,
    pub rounds: Vec<ColdRound>,
    pub total_ms_median: f64,
    pub per_blob_p50_ms_median: f64,
}

fn node(binary: &Path, work_dir: &Path, shared: &Path, name: &str) -> Result<DaemonProcess> {
    Ok(DaemonProcess::spawn(&DaemonConfig {
        binary: binary.to_path_buf(),
        work_dir: work_dir.to_path_buf(),
        node_name: name.to_owned(),
        shared_dir: Some(shared.to_path_buf()),
        snapshot_interval_s: 3600,
        extra_args: Vec::new(),
    })?)
}

/// Uploads blob `index` (`bytes` of a pattern of its own) and Records the entry naming it.
async fn publish_blob(client: &Client, scratch: &Path, index: usize, bytes: u64) -> Result<()> {
    let path = scratch.join(format!("blob-{index}.bin"));
    let pattern: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(31) as usize ^ index) as u8)
        .collect();
    let mut content = Vec::with_capacity(bytes as usize);
    while (content.len() as u64) < bytes {
        content.extend_from_slice(&pattern);
        content.extend_from_slice(&(index as u64).to_le_bytes());
    }
    content.truncate(bytes as usize);
    std::fs::write(&path, &content)?;
    let stored = client.put_artifact(&path).await?;
    std::fs::remove_file(&path)?;
    let entry = proto::Entry {
        key: Some(proto::Key {
            namespace: "bench".into(),
            op: "cold_blob".into(),
            device: "bench-device".into(),
            problem: format!("blob-{index}"),
            rank: None,
        }),
        result: Some(proto::Result {
            config: "{}".into(),
            time_us: 1.0,
            tuned_by: "cold-blob bench".into(),
            tuned_at_unix_ms: 1,
            artifacts: vec![proto::Artifact {
                name: "kernel.bin".into(),
                sha256: stored.sha256,
                size: stored.size,
            }],
            ..Default::default()
        }),
    };
    client.record(vec![entry]).await?;
    Ok(())
}

/// A fresh node B on `shared`: learns A's entries, then takes each blob once.
async fn cold_round(
    binary: &Path,
    scratch: &Path,
    shared: &Path,
    round: usize,
    digests: &[String],
) -> Result<ColdRound> {
    let mut b = node(binary, &scratch.join(format!("b{round}")), shared, "node-b")?;
    let client = b.wait_ready().await?.with_timeout(Duration::from_secs(120));
    client.snapshot().await?;
    let stats = client.stats().await?;
    ensure!(
        stats.artifact_blobs_held == 0,
        "node B holds {} blobs before the round",
        stats.artifact_blobs_held
    );
    let mut times = Vec::with_capacity(digests.len());
    let started = Instant::now();
    for digest in digests {
        let one = Instant::now();
        let moved = client.get_artifact(digest, &mut tokio::io::sink()).await?;
        times.push(one.elapsed().as_secs_f64() * 1e3);
        ensure!(moved > 0, "blob {digest} came back empty");
    }
    let total_ms = started.elapsed().as_secs_f64() * 1e3;
    let stats = client.stats().await?;
    drop(client);
    b.stop();
    let per_blob_max_ms = times.iter().copied().fold(0.0, f64::max);
    Ok(ColdRound {
        total_ms,
        per_blob_p50_ms: median(&mut times),
        per_blob_max_ms,
        handoffs: stats.artifact_handoffs,
        fetched_from_shared_dir: stats.artifact_fetches_shared_dir,
        streamed: stats
            .artifact_fetches_local
            .saturating_sub(stats.artifact_handoffs),
    })
}

pub fn run(options: &ColdBlobOptions) -> Result<ColdBlobResults> {
    ensure!(
        options.blobs > 0 && options.rounds > 0,
        "--blobs and --rounds must be at least 1"
    );
    let load_average_start = load_average();
    let binary = workspace_binary("tunecached");
    ensure!(binary.exists(), "{} not found", binary.display());
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-cold-blob-")
        .tempdir()?;
    let shared = scratch.path().join("shared");
    std::fs::create_dir_all(&shared)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let bytes = options.blob_kib * 1024;
    let mut a = node(&binary, &scratch.path().join("a"), &shared, "node-a")?;
    let rounds = runtime.block_on(async {
        let client = a.wait_ready().await?.with_timeout(Duration::from_secs(120));
        let mut digests = Vec::with_capacity(options.blobs);
        for index in 0..options.blobs {
            publish_blob(&client, scratch.path(), index, bytes).await?;
        }
        for entry in client.scan("bench", "bench-device").await? {
            if let Some(artifact) = entry.result.and_then(|r| r.artifacts.into_iter().next()) {
                digests.push(artifact.sha256);
            }
        }
        ensure!(
            digests.len() == options.blobs,
            "A holds {} entries",
            digests.len()
        );
        client.snapshot().await?;
        let mut rounds = Vec::with_capacity(options.rounds);
        for round in 0..options.rounds {
            let result = cold_round(&binary, scratch.path(), &shared, round, &digests).await?;
            eprintln!(
                "cold-blob round {}: {:.1} ms for {} blobs (p50 {:.2} ms), {} handed, {} streamed",
                round + 1,
                result.total_ms,
                options.blobs,
                result.per_blob_p50_ms,
                result.handoffs,
                result.streamed
            );
            rounds.push(result);
        }
        anyhow::Ok(rounds)
    })?;
    a.stop();
    let mut totals: Vec<f64> = rounds.iter().map(|r| r.total_ms).collect();
    let mut p50s: Vec<f64> = rounds.iter().map(|r| r.per_blob_p50_ms).collect();
    Ok(ColdBlobResults {
        command_line: options.command_line.clone(),
        machine: machine_info(&options.command_line),
        daemon: binary.display().to_string(),
        load_average_start,
        load_average_end: load_average(),
        blobs: options.blobs,
        blob_bytes: bytes,
        total_ms_median: median(&mut totals),
        per_blob_p50_ms_median: median(&mut p50s),
        rounds,
    })
}
