//! Snapshot passes over a shared directory crowded with segments: N version-2 segments of
//! one entry each, in three mixes of owners (all under the daemon's own name but not written
//! by it, all of one other node, spread over N/10 other nodes). For each mix and each daemon
//! binary given (e.g. the build before a change and the one after, side by side in one run),
//! it starts the real `tunecached` on that directory and times the first pass (which reads
//! every segment) and the passes after it (which only list), through the Snapshot RPC.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tunecache_client::proto as v1;

use crate::daemon::{DaemonConfig, DaemonProcess};

/// Who owns the segments of one run.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Mix {
    /// Every segment under the daemon's own name, none written by it.
    OwnName,
    /// Every segment of one other node.
    OneOtherNode,
    /// Ten segments each of N/10 other nodes.
    ManyNodes,
}

impl Mix {
    pub const ALL: [Mix; 3] = [Mix::OwnName, Mix::OneOtherNode, Mix::ManyNodes];

    fn owner(self, i: usize) -> (String, u64) {
        match self {
            Mix::OwnName => ("A".to_owned(), i as u64 + 1),
            Mix::OneOtherNode => ("B".to_owned(), i as u64 + 1),
            Mix::ManyNodes => (format!("n{}", i / 10), (i % 10) as u64 + 1),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct PassRow {
    pub binary: String,
    pub mix: Mix,
    pub segments: usize,
    /// From spawn until the first pass (reading every segment) was done.
    pub first_pass_s: f64,
    /// Later passes (listing only), each timed through the Snapshot RPC; `None` when it did
    /// not answer within its deadline.
    pub later_passes_s: Vec<Option<f64>>,
    pub segments_loaded: u64,
    pub entries: u64,
}

/// Writes `count` one-entry segments of `mix` into `shared/v2`.
pub fn write_segments(shared: &Path, mix: Mix, count: usize) -> Result<()> {
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2)?;
    for i in 0..count {
        let (node, seq) = mix.owner(i);
        let document = serde_json::json!({
            "format": "tunecache-snapshot", "version": 2, "node": node,
            "first_seq": seq, "last_seq": seq, "written_at_unix_ms": 0, "entry_count": 1,
            "entries": [{"namespace": "bench", "op": "gemm", "device": "bench-device",
                         "problem": format!("p{i}"), "config": "{}", "time_us": 1.0,
                         "tuned_by": node, "tuned_at_unix_ms": 1}]
        });
        let name = format!("{node}.{seq:016x}-{seq:016x}.seg.json");
        std::fs::write(v2.join(name), serde_json::to_vec(&document)?)?;
    }
    Ok(())
}

/// One binary on one mix: the first pass and `later` passes after it.
pub fn run_passes(binary: &Path, mix: Mix, count: usize, later: usize) -> Result<PassRow> {
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-segments-")
        .tempdir()?;
    let shared = scratch.path().join("shared");
    write_segments(&shared, mix, count)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let config = DaemonConfig {
            binary: binary.to_path_buf(),
            work_dir: scratch.path().join("node"),
            node_name: "A".to_owned(),
            shared_dir: Some(shared.clone()),
            snapshot_interval_s: 3600,
            extra_args: Vec::new(),
        };
        let started = Instant::now();
        let mut daemon = DaemonProcess::spawn(&config)?;
        let client = daemon.wait_ready().await?;
        // The background task's first pass runs at start; wait for it.
        let deadline = started + Duration::from_secs(600);
        loop {
            let stats = client.stats().await?;
            if stats.snapshot_passes >= 1 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "no first pass within 600 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first_pass_s = started.elapsed().as_secs_f64();
        let mut later_passes_s = Vec::new();
        for _ in 0..later {
            let mut request = tonic::Request::new(v1::SnapshotRequest {});
            request.set_timeout(Duration::from_secs(30));
            let timed = Instant::now();
            let answered = client.raw().snapshot(request).await.is_ok();
            later_passes_s.push(answered.then(|| timed.elapsed().as_secs_f64()));
        }
        let stats = client.stats().await?;
        daemon.stop();
        Ok(PassRow {
            binary: binary.display().to_string(),
            mix,
            segments: count,
            first_pass_s,
            later_passes_s,
            segments_loaded: stats.peer_segments_loaded,
            entries: stats.entries,
        })
    })
}

/// Every binary on every mix.
pub fn run_all(binaries: &[PathBuf], count: usize, later: usize) -> Result<Vec<PassRow>> {
    let mut rows = Vec::new();
    for mix in Mix::ALL {
        for binary in binaries {
            let row = run_passes(binary, mix, count, later)
                .with_context(|| format!("{} on {mix:?}", binary.display()))?;
            eprintln!("{row:?}");
            rows.push(row);
        }
    }
    Ok(rows)
}

pub fn markdown(rows: &[PassRow]) -> String {
    let mut out = String::from(
        "| binary | owners | segments | first pass (s) | later passes (s) | entries |\n|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let later: Vec<String> = row
            .later_passes_s
            .iter()
            .map(|p| p.map_or("no answer".to_owned(), |s| format!("{s:.3}")))
            .collect();
        out.push_str(&format!(
            "| {} | {:?} | {} | {:.2} | {} | {} |\n",
            row.binary,
            row.mix,
            row.segments,
            row.first_pass_s,
            later.join(", "),
            row.entries
        ));
    }
    out
}
