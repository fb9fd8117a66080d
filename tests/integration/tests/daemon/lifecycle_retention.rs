//! Lifecycle on one node (docs/lifecycle.md), with the daemon's wall clock moved by
//! libfaketime between restarts: what ranks keep reading survives any number of retention
//! periods; what nobody reads expires, stays expired across SIGKILL and restart, and a Record
//! brings it back; past `--max-entries` exactly the most recently used stay.
//!
//! Every daemon here is a process (libfaketime works through LD_PRELOAD); its monotonic
//! clock stays real, so its timers behave. Tests wait on facts in Stats, never on sleeps.

use std::path::Path;

use tunecache_client::{proto, Client};
use tunecache_integration::faketime::Faketime;
use tunecache_integration::{entry, key_in, DaemonOptions, TestDaemon};

const NS: &str = "lifecycle";

fn key(problem: &str) -> proto::Key {
    key_in(NS, "gemm", problem, None)
}

/// A daemon process in `dir` (its state kept across calls), `days` from now by its clock.
async fn daemon_on_day(dir: &Path, days: i64, flags: &[&str]) -> TestDaemon {
    DaemonOptions::new(dir)
        .args(["--lifecycle-flush-ms", "100"])
        .args(flags.iter().copied())
        .faketime(Faketime::offset(&format!("{days:+}d")))
        .process()
        .await
}

async fn hit(client: &Client, key: &proto::Key) -> bool {
    !client
        .lookup(vec![key.clone()])
        .await
        .expect("Lookup")
        .is_empty()
}

/// Reads `keys` (each a hit, each read for the first time that day) and waits until the daemon
/// journalled their last uses.
async fn read_and_journal(daemon: &TestDaemon, keys: &[proto::Key]) {
    let before = daemon.stats().await.last_use_updates_written;
    let client = daemon.client().await;
    let hits = client.lookup(keys.to_vec()).await.expect("Lookup");
    assert_eq!(hits.len(), keys.len(), "every key read is a hit");
    let want = before + keys.len() as u64;
    daemon
        .wait_for_stats("the reads' last uses journalled", |s| {
            s.last_use_updates_written >= want
        })
        .await;
}

#[tokio::test]
async fn what_ranks_read_outlives_retention_and_what_nobody_reads_expires_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let retain = ["--retain-days", "30"];
    let (used, unused) = (key("used"), key("unused"));
    let mut daemon = daemon_on_day(dir.path(), 0, &retain).await;
    let client = daemon.client().await;
    client
        .record(vec![
            entry(used.clone(), r#"{"tile":1}"#, 5.0, "rank0"),
            entry(unused.clone(), r#"{"tile":2}"#, 5.0, "rank0"),
        ])
        .await
        .expect("Record");
    daemon.stop().await;

    // Every 20 days a job reads `used`, for 120 days: four retention periods.
    for day in (20..=120).step_by(20) {
        let mut daemon = daemon_on_day(dir.path(), day, &retain).await;
        // The day's first read, so it is the one whose last use is journalled (a second read
        // the same day changes nothing, and a wait for it would wait for ever); a hit.
        read_and_journal(&daemon, std::slice::from_ref(&used)).await;
        // Looking `unused` up would be a use: Stats tell whether it is held.
        let stats = daemon.stats().await;
        assert_eq!(
            stats.entries,
            if day <= 30 { 2 } else { 1 },
            "day {day}: `unused`, never read, expires once 30 days old"
        );
        if day == 40 {
            assert_eq!(stats.entries_expired, 1, "expired at start, before serving");
        }
        // SIGKILL at some restarts: what expired stays expired, what was read stays read.
        if day % 40 == 0 {
            daemon.kill();
        } else {
            daemon.stop().await;
        }
    }

    // A Record is a use: it brings the expired key back, for good.
    let mut daemon = daemon_on_day(dir.path(), 121, &retain).await;
    let client = daemon.client().await;
    assert!(!hit(&client, &unused).await);
    client
        .record(vec![entry(unused.clone(), r#"{"tile":3}"#, 6.0, "rank1")])
        .await
        .expect("Record");
    daemon.kill();
    let daemon = daemon_on_day(dir.path(), 140, &retain).await;
    let client = daemon.client().await;
    assert!(hit(&client, &unused).await, "revived by its Record");
    assert!(hit(&client, &used).await, "last read on day 120: kept");
}

#[tokio::test]
async fn past_max_entries_exactly_the_most_recently_used_stay() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<proto::Key> = (0..5000).map(|i| key(&format!("m={i:05}"))).collect();
    let unbounded = ["--max-entries", "0"];
    let mut daemon = daemon_on_day(dir.path(), 0, &unbounded).await;
    let client = daemon.client().await;
    for chunk in keys.chunks(1000) {
        let entries = chunk
            .iter()
            .map(|key| entry(key.clone(), "{}", 1.0, "rank0"))
            .collect();
        client.record(entries).await.expect("Record");
    }
    daemon.stop().await;

    // The next day a job reads every fifth key: spread over the key order, so the bound
    // cannot keep them by key order alone.
    let read: Vec<proto::Key> = keys.iter().step_by(5).cloned().collect();
    let mut daemon = daemon_on_day(dir.path(), 1, &unbounded).await;
    read_and_journal(&daemon, &read).await;
    daemon.stop().await;

    let daemon = daemon_on_day(dir.path(), 2, &["--max-entries", "1000"]).await;
    let stats = daemon.stats().await;
    assert_eq!(stats.entries, 1000);
    assert_eq!(stats.entries_expired_by_bound, 4000);
    let client = daemon.client().await;
    let held = client.lookup(read.clone()).await.expect("Lookup");
    assert_eq!(held.len(), read.len(), "every key read on day 1 stays");
    assert!(
        daemon.log().contains("--max-entries"),
        "the bound is logged when hit"
    );
}
