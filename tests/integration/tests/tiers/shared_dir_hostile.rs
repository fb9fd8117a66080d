//! A hostile or broken shared directory against the real daemon: a symlink to `/dev/zero`, a
//! FIFO that never gets a writer and a file over the size cap, each named like a snapshot.
//! Each must be skipped with one warning while the other peers' files still load, without
//! growing memory or leaving the load pass stuck.
//!
//! The memory test caps the daemon's address space with `prlimit` (util-linux), so a daemon
//! that does read `/dev/zero` dies instead of taking the machine with it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tunecache_client::Client;
use tunecache_integration::{eventually, require_tool, test_key, Lazy, TestDaemon};

/// A valid snapshot file of `node` holding one entry with problem `problem`.
fn write_peer_file(shared: &Path, node: &str, problem: &str) {
    let document = serde_json::json!({
        "format": "tunecache-snapshot", "version": 1, "node": node,
        "entries": [{"namespace": "test", "op": "gemm", "device": "test-device",
                     "problem": problem, "config": "{}", "time_us": 1.0,
                     "tuned_by": node, "tuned_at_unix_ms": 1}]
    });
    let path = shared.join(format!("{node}.tunecache.json"));
    std::fs::write(path, serde_json::to_vec(&document).unwrap()).unwrap();
}

async fn holds(client: &Client, problem: &str) -> bool {
    client
        .lookup(vec![test_key("gemm", problem)])
        .await
        .is_ok_and(|hits| !hits.is_empty())
}

async fn wait_until_loaded(daemon: &TestDaemon, client: &Client, problem: &str) {
    let loaded = Lazy(|| {
        format!(
            "{problem} loaded from the shared directory; log:\n{}",
            daemon.log()
        )
    });
    eventually(Duration::from_secs(30), loaded, || holds(client, problem)).await;
}

fn warnings_about(log: &str, name: &str) -> usize {
    log.lines()
        .filter(|line| line.contains(name) && line.contains("skipped until the file changes"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_to_dev_zero_is_skipped_without_growing_memory() {
    let Some(prlimit) = require_tool("prlimit", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let daemon = start_node(&dir.path().join("a"), &shared, "node-a", &[]).await;
    let client = daemon.client().await;
    // 2 GiB of address space: plenty for the daemon, and a reader of /dev/zero dies quickly
    // instead of exhausting the machine.
    let limited = Command::new(prlimit)
        .arg(format!("--pid={}", daemon.pid()))
        .arg("--as=2147483648")
        .status()
        .unwrap();
    assert!(limited.success(), "prlimit failed");
    let rss_before = daemon.rss_bytes();

    std::os::unix::fs::symlink("/dev/zero", shared.join("x.tunecache.json")).unwrap();
    write_peer_file(&shared, "node-b", "from-b");
    wait_until_loaded(&daemon, &client, "from-b").await;
    // More passes over the same link: still one warning, still no growth.
    let stats = daemon.wait_for_snapshot_passes(3).await;
    assert!(stats.peer_files_skipped >= 1, "{stats:?}");
    let rss_after = daemon.rss_bytes();
    assert!(
        rss_after < rss_before + (64 << 20),
        "RSS grew from {rss_before} to {rss_after} bytes"
    );
    let log = daemon.log();
    assert_eq!(warnings_about(&log, "x.tunecache.json"), 1, "log:\n{log}");
    assert!(log.contains("symbolic link"), "log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_named_like_a_snapshot_does_not_stick_the_load_pass() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    nix::unistd::mkfifo(
        &shared.join("x.tunecache.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let daemon = start_node(&dir.path().join("a"), &shared, "node-a", &[]).await;
    let client = daemon.client().await;
    write_peer_file(&shared, "node-b", "from-b");
    wait_until_loaded(&daemon, &client, "from-b").await;
    // Passes go on past the 5 s after which a hung operation is reported as stuck (six more
    // at one a second take longer than that), and none is reported stuck meanwhile.
    let passes = client.stats().await.unwrap().snapshot_passes;
    daemon
        .wait_for_stats("six more passes, none stuck", |s| {
            assert_eq!(s.stuck_operation, "", "{s:?}");
            s.snapshot_passes >= passes + 6
        })
        .await;
    write_peer_file(&shared, "node-c", "from-c");
    wait_until_loaded(&daemon, &client, "from-c").await;
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.stuck_operation, "", "{stats:?}");
    let log = daemon.log();
    assert_eq!(warnings_about(&log, "x.tunecache.json"), 1, "log:\n{log}");
    assert!(log.contains("a FIFO"), "log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_over_the_size_cap_is_skipped_with_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // A valid document of about 20 KB, over a 4 KiB cap.
    let entries: Vec<_> = (0..200)
        .map(|i| {
            serde_json::json!({"namespace": "test", "op": "gemm", "device": "test-device",
                               "problem": format!("big-{i}"), "config": "{}", "time_us": 1.0})
        })
        .collect();
    let document = serde_json::json!({
        "format": "tunecache-snapshot", "version": 1, "node": "big", "entries": entries
    });
    std::fs::write(
        shared.join("big.tunecache.json"),
        serde_json::to_vec(&document).unwrap(),
    )
    .unwrap();
    write_peer_file(&shared, "node-b", "from-b");
    let daemon = start_node(
        &dir.path().join("a"),
        &shared,
        "node-a",
        &["--snapshot-max-file-bytes", "4096"],
    )
    .await;
    let client = daemon.client().await;
    wait_until_loaded(&daemon, &client, "from-b").await;
    // More passes over the over-cap file.
    daemon.wait_for_snapshot_passes(2).await;
    assert!(!holds(&client, "big-7").await, "the over-cap file was read");
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.peer_files_skipped, 1, "{stats:?}");
    let log = daemon.log();
    assert_eq!(warnings_about(&log, "big.tunecache.json"), 1, "log:\n{log}");
    assert!(log.contains("over the 4096-byte cap"), "log:\n{log}");
}

async fn start_node(dir: &Path, shared: &Path, node: &str, extra: &[&str]) -> TestDaemon {
    tunecache_integration::shared_node(dir, shared, node, 1, extra)
        .process()
        .await
}
