//! The real run of the lifecycle benchmark (issue 51): two `tunecached` processes sharing one
//! shared directory, their wall clocks moved on a day at a time by libfaketime, both
//! following one offset file. Node A tunes a new library version each week; every day the
//! ranks on both nodes read the current and the previous version. Per week: entries on each
//! node, A's journal, the shared directory's bytes, the hit rate, and the last-use writes per
//! day (journal records, and uses put in segments). No artifacts: blobs cross the tiers as
//! before, and what expiry does to them is counted in the in-process run.
//!
//! Not Redis: redis-server does not start under libfaketime (its allocator's start-up calls
//! the clock before the library is ready), and a node whose clock is days off Redis's
//! rightly expires nothing. The Redis tier's uses and expiry are shown by its tests.

use std::path::Path;

use anyhow::{ensure, Result};
use serde::Serialize;
use tunecache_client::{proto, Client};
use tunecache_integration::{entry, key_in, DaemonOptions, Faketime, TestDaemon};

use super::progress;

const DAY_MS: i64 = 86_400_000;
const NAMESPACES: [&str; 4] = ["trtllm", "triton", "bitblas", "flashinfer"];

/// One simulated week of the real run, measured at its end.
#[derive(Debug, Clone, Serialize)]
pub struct RealWeek {
    pub week: u32,
    pub entries_a: u64,
    pub entries_b: u64,
    pub journal_bytes_a: u64,
    pub shared_dir_bytes: u64,
    pub hit_rate: f64,
    /// Last uses journalled per day, both nodes together (the most of the week's days).
    pub last_use_writes_per_day_max: u64,
    /// Last uses put in shared-directory segments per day, both nodes together.
    pub segment_uses_per_day_max: u64,
    /// Distinct keys the ranks of one node read per day.
    pub distinct_reads_per_day: u64,
}

fn key(version: u32, i: usize) -> proto::Key {
    key_in(
        NAMESPACES[i % NAMESPACES.len()],
        &format!("gemm_v{version}"),
        &format!("m={i},n=4096,k=4096,lib=v{version}"),
        None,
    )
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The day (days since the epoch) of a clock `days` days ahead of the real one.
fn fake_day(days: u32) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    (now + i64::from(days) * DAY_MS) / DAY_MS
}

/// Waits until `node` has swept on `day` (its per-namespace usage counted that day).
async fn swept_on(node: &TestDaemon, day: i64) {
    node.wait_for_stats("the day's sweep", |s| {
        s.namespace_usage_at_unix_ms / DAY_MS >= day
    })
    .await;
}

pub async fn run_real(
    scratch: &Path,
    weeks: u32,
    per_version: usize,
    retain_days: u32,
) -> Result<Vec<RealWeek>> {
    let clock_file = scratch.join("faketime");
    let clock = Faketime::following(&clock_file);
    let shared = scratch.join("shared");
    std::fs::create_dir_all(&shared)?;
    let shared_arg = shared.display().to_string();
    let retain = retain_days.to_string();
    let flags = [
        "--tuner",
        "off",
        "--shared-dir",
        &shared_arg,
        "--snapshot-interval",
        "1",
        "--retain-days",
        &retain,
        "--lifecycle-flush-ms",
        "200",
    ];
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let dir = scratch.join(name);
        std::fs::create_dir_all(&dir)?;
        let node = DaemonOptions::new(&dir)
            .args(["--node-name", name])
            .args(flags)
            .faketime(clock.clone())
            .process()
            .await;
        nodes.push(node);
    }
    let clients: Vec<Client> =
        futures::future::join_all(nodes.iter().map(TestDaemon::client)).await;
    let mut weeks_out = Vec::new();
    let mut day = 0u32;
    for week in 0..weeks {
        let entries: Vec<proto::Entry> = (0..per_version)
            .map(|i| {
                entry(
                    key(week, i),
                    &format!(r#"{{"tactic":{i}}}"#),
                    10.0,
                    "node-a/rank0",
                )
            })
            .collect();
        for chunk in entries.chunks(1000) {
            clients[0].record(chunk.to_vec()).await?;
        }
        // B learns the new version from A's next segment before the ranks read it.
        let held = clients[0].stats().await?.entries;
        nodes[1]
            .wait_for_stats("B learns the new version", |s| s.entries >= held)
            .await;
        let read: Vec<proto::Key> = [week.checked_sub(1), Some(week)]
            .into_iter()
            .flatten()
            .flat_map(|version| (0..per_version).map(move |i| key(version, i)))
            .collect();
        let (mut asked, mut hits) = (0u64, 0u64);
        let (mut writes_max, mut segment_uses_max) = (0u64, 0u64);
        for _ in 0..7 {
            day += 1;
            Faketime::set(&clock_file, day);
            for node in &nodes {
                swept_on(node, fake_day(day)).await;
            }
            let before: Vec<proto::StatsResponse> =
                futures::future::join_all(clients.iter().map(|c| async { c.stats().await }))
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()?;
            for ((client, node), before) in clients.iter().zip(&nodes).zip(&before) {
                let found = client.lookup(read.clone()).await?;
                asked += read.len() as u64;
                hits += found.len() as u64;
                let want = before.last_use_updates_written + found.len() as u64;
                node.wait_for_stats("the day's uses journalled", |s| {
                    s.last_use_updates_written >= want
                })
                .await;
            }
            // The uses reach the segments in each node's next pass (every second).
            for node in &nodes {
                node.wait_for_snapshot_passes(2).await;
            }
            let mut writes = 0;
            let mut in_segments = 0;
            for (client, before) in clients.iter().zip(&before) {
                let now = client.stats().await?;
                writes += now.last_use_updates_written - before.last_use_updates_written;
                in_segments +=
                    now.snapshot_last_uses_published - before.snapshot_last_uses_published;
            }
            writes_max = writes_max.max(writes);
            segment_uses_max = segment_uses_max.max(in_segments);
        }
        let (a, b) = (clients[0].stats().await?, clients[1].stats().await?);
        let row = RealWeek {
            week: week + 1,
            entries_a: a.entries,
            entries_b: b.entries,
            journal_bytes_a: a.journal_bytes,
            shared_dir_bytes: dir_bytes(&shared),
            hit_rate: hits as f64 / asked.max(1) as f64,
            last_use_writes_per_day_max: writes_max,
            segment_uses_per_day_max: segment_uses_max,
            distinct_reads_per_day: read.len() as u64,
        };
        progress(&format!(
            "lifecycle real: week {}: A {} B {} entries, shared dir {} B",
            row.week, row.entries_a, row.entries_b, row.shared_dir_bytes
        ));
        weeks_out.push(row);
    }
    for mut node in nodes {
        node.stop().await;
    }
    ensure!(
        weeks_out.iter().all(|w| w.hit_rate == 1.0),
        "a read of the current or previous version missed in the real run"
    );
    Ok(weeks_out)
}
