//! Shared-filesystem snapshots against real daemons on real filesystems with real faults:
//! atomic publish and no I/O when nothing changed, node-to-node convergence through the
//! merge rule, start-up from the shared directory past damaged files, a hung FUSE mount
//! (bindfs SIGSTOPped) that must not stall ranks or shutdown, and ENOSPC / read-only
//! directories.
//!
//! Tests that read the daemon's log, signal it or time its shutdown start it as a process; the
//! others run it in-process. The fault tests need root and `bindfs` + `fuse3` (Debian:
//! `apt-get install bindfs fuse3`); they fail loudly, naming what is missing, rather than
//! passing without running.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tonic::Code;
use tunecache_client::{proto, Client};
use tunecache_integration::{
    entry, eventually, numbered, test_key, wait, DaemonOptions, Kind, TestDaemon, TestMount,
};

const SNAPSHOT_HEALTH_SERVICE: &str = "tunecache.v1.TuneCache/snapshots";

fn shared_args(shared: &Path, node: &str, interval_s: u64) -> Vec<String> {
    vec![
        "--shared-dir".into(),
        shared.display().to_string(),
        "--node-name".into(),
        node.into(),
        "--snapshot-interval".into(),
        interval_s.to_string(),
    ]
}

async fn start_node(
    kind: Kind,
    dir: &Path,
    shared: &Path,
    node: &str,
    interval_s: u64,
) -> TestDaemon {
    std::fs::create_dir_all(dir).unwrap();
    DaemonOptions::new(dir)
        .args(shared_args(shared, node, interval_s))
        .start(kind)
        .await
}

/// Waits until the file system's clock has moved past every mtime in `listing` (it stamps
/// files at the kernel's tick, not to the nanosecond): a file rewritten from now on shows a
/// newer mtime. `probe` is a file of the test's own on the same file system.
fn wait_past_mtimes(probe: &Path, listing: &[(String, u64, i64, i64)]) {
    let newest = listing
        .iter()
        .map(|(_, _, secs, nanos)| (*secs, *nanos))
        .max()
        .unwrap_or_default();
    wait(Duration::from_secs(10), "the file system's clock moving")
        .every(Duration::from_millis(1))
        .blocking(|| {
            std::fs::write(probe, b"tick").unwrap();
            let m = std::fs::metadata(probe).unwrap();
            (m.mtime(), m.mtime_nsec()) > newest
        });
}

async fn snapshot(client: &Client) -> Result<proto::SnapshotResponse, tonic::Status> {
    let mut request = tonic::Request::new(proto::SnapshotRequest {});
    request.set_timeout(Duration::from_secs(30));
    client
        .raw()
        .snapshot(request)
        .await
        .map(|response| response.into_inner())
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn hidden_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with('.'))
        .collect()
}

fn lines_containing(log: &str, needles: &[&str]) -> usize {
    log.lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_is_complete_json_and_nothing_new_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let daemon = start_node(
        Kind::InProcess,
        &dir.path().join("a"),
        &shared,
        "node-a",
        3600,
    )
    .await;
    let client = daemon.client().await;

    client.record(numbered("p", 0..10, "a")).await.unwrap();
    // The start-up pass may or may not have published already; either way it succeeds.
    snapshot(&client).await.unwrap();
    client.record(numbered("q", 0..5, "a")).await.unwrap();
    let written = snapshot(&client).await.unwrap();
    assert!(!written.skipped_unchanged);
    // 15 contributions published in all; the new segment holds just the 5 new ones.
    assert_eq!(written.entries, 15);
    let file = PathBuf::from(&written.path);
    assert_eq!(file.parent(), Some(shared.join("v2").as_path()));
    assert!(written.path.ends_with(".seg.json"), "{}", written.path);
    assert_eq!(written.bytes, std::fs::metadata(&file).unwrap().len());

    let document = read_json(&file);
    assert_eq!(document["format"], "tunecache-snapshot");
    assert_eq!(document["version"], 2);
    assert_eq!(document["node"], "node-a");
    assert_eq!(document["entry_count"], 5);
    assert_eq!(document["first_seq"], document["last_seq"]);
    let entries = document["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 5);
    let problems: Vec<&str> = entries
        .iter()
        .map(|e| e["problem"].as_str().unwrap())
        .collect();
    let mut sorted = problems.clone();
    sorted.sort();
    assert_eq!(problems, sorted, "entries are written in key order");
    assert_eq!(
        hidden_files(&shared.join("v2")),
        Vec::<String>::new(),
        "no temp file left"
    );

    let listing = |dir: &Path| -> Vec<(String, u64, i64, i64)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                let name = e.file_name().into_string().unwrap();
                (name, m.ino(), m.mtime(), m.mtime_nsec())
            })
            .collect();
        files.sort();
        files
    };
    let before = listing(&shared.join("v2"));
    wait_past_mtimes(&dir.path().join("clock-probe"), &before);
    let again = snapshot(&client).await.unwrap();
    assert!(again.skipped_unchanged);
    assert_eq!(again.entries, 15);
    assert_eq!(again.bytes, 0);
    assert_eq!(
        before,
        listing(&shared.join("v2")),
        "an unchanged state must not write a file"
    );
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.shared_dir, shared.display().to_string());
    assert!(stats.snapshots_written >= 1);
    assert!(stats.snapshots_skipped_unchanged >= 1);
    assert_eq!(stats.snapshot_errors, 0);
    assert!(stats.last_snapshot_unix_ms > 0);
    assert!(stats.stuck_operation.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_without_shared_dir_is_a_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let status = snapshot(&daemon.client().await).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("--shared-dir"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_converge_and_agree_on_a_contested_key() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = start_node(Kind::InProcess, &dir.path().join("a"), &shared, "node-a", 1).await;
    let b = start_node(Kind::InProcess, &dir.path().join("b"), &shared, "node-b", 1).await;
    let (client_a, client_b) = (a.client().await, b.client().await);

    let contested = test_key("gemm", "contested");
    client_a
        .record(numbered("from-a", 0..200, "a"))
        .await
        .unwrap();
    client_b
        .record(numbered("from-b", 0..300, "b"))
        .await
        .unwrap();
    client_a
        .record(vec![entry(
            contested.clone(),
            r#"{"t":"a"}"#,
            3.0,
            "node-a",
        )])
        .await
        .unwrap();
    client_b
        .record(vec![entry(
            contested.clone(),
            r#"{"t":"b"}"#,
            2.0,
            "node-b",
        )])
        .await
        .unwrap();

    for (name, client) in [("node-a", &client_a), ("node-b", &client_b)] {
        eventually(
            Duration::from_secs(20),
            &format!("{name} holds both nodes' entries"),
            || async { client.stats().await.unwrap().entries == 501 },
        )
        .await;
        let hit = client.lookup(vec![contested.clone()]).await.unwrap();
        let result = hit[0].result.as_ref().unwrap();
        assert_eq!(
            (result.time_us, result.tuned_by.as_str()),
            (2.0, "node-b"),
            "{name}: the lower time wins"
        );
    }
    // Each node published its own contributions only: 201 and 301 entries.
    for (node, own) in [("node-a", 201), ("node-b", 301)] {
        let published: usize = std::fs::read_dir(shared.join("v2"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with(&format!("{node}.")))
            .map(|name| {
                read_json(&shared.join("v2").join(name))["entries"]
                    .as_array()
                    .unwrap()
                    .len()
            })
            .sum();
        assert_eq!(published, own, "{node} publishes only what it contributed");
    }
    let stats = client_a.stats().await.unwrap();
    assert!(stats.peer_files_loaded >= 1);
    assert_eq!(stats.snapshot_errors, 0);
}

/// Deterministic bytes that are not JSON (the first one can never start a JSON value).
fn garbage(len: usize) -> Vec<u8> {
    let mut state: u32 = 0x9e37_79b9;
    let mut bytes = vec![0xff];
    bytes.extend((1..len).map(|_| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as u8
    }));
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_node_starts_from_the_shared_dir_past_damaged_files() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let mut a = start_node(
        Kind::Process,
        &dir.path().join("a"),
        &shared,
        "node-a",
        3600,
    )
    .await;
    let client = a.client().await;
    client.record(numbered("p", 0..100, "a")).await.unwrap();
    snapshot(&client).await.unwrap();
    a.terminate(Duration::from_secs(10));

    let segment = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".seg.json"))
        .expect("node-a published a segment");
    let good = std::fs::read(segment).unwrap();
    std::fs::write(shared.join("empty.tunecache.json"), b"").unwrap();
    std::fs::write(
        shared.join("truncated.tunecache.json"),
        &good[..good.len() / 2],
    )
    .unwrap();
    std::fs::write(shared.join("garbage.tunecache.json"), garbage(4096)).unwrap();
    std::fs::write(
        shared.join("future.tunecache.json"),
        br#"{"format":"tunecache-snapshot","version":99,"entries":{"new":"layout"}}"#,
    )
    .unwrap();
    // A crashed writer's temp file is ignored (and removed once it is an hour old).
    std::fs::write(shared.join(".node-x.tunecache.json.tmp.1.2"), b"{").unwrap();

    let fresh = start_node(Kind::Process, &dir.path().join("c"), &shared, "node-c", 1).await;
    let fresh_client = fresh.client().await;
    eventually(
        Duration::from_secs(20),
        "the fresh node loads node-a's entries",
        || async { fresh_client.stats().await.unwrap().entries == 100 },
    )
    .await;
    // Several more passes over the damaged files: each is still warned about once only.
    fresh.wait_for_snapshot_passes(3).await;
    let log = fresh.log();
    for name in ["empty", "truncated", "garbage", "future"] {
        let file = format!("{name}.tunecache.json");
        assert_eq!(
            lines_containing(&log, &[&file, "skipped until the file changes"]),
            1,
            "{file} warned exactly once; log:\n{log}"
        );
    }
    assert!(log.contains("unknown format version"), "log:\n{log}");
    let stats = fresh_client.stats().await.unwrap();
    assert_eq!(stats.peer_files_skipped, 4);
    assert!(stats.peer_files_loaded >= 1);
    assert!(!fresh_client
        .lookup(vec![test_key("gemm", "p-42")])
        .await
        .unwrap()
        .is_empty());

    // A damaged file that is replaced is read again, and warned about no more.
    std::fs::write(
        shared.join("empty.tunecache.json"),
        serde_json::to_vec(&serde_json::json!({
            "format": "tunecache-snapshot", "version": 1, "node": "empty",
            "entries": [{"namespace": "test", "op": "gemm", "device": "test-device",
                         "problem": "late", "config": "{}", "time_us": 1.0}]
        }))
        .unwrap(),
    )
    .unwrap();
    eventually(
        Duration::from_secs(20),
        "a fixed file is read again",
        || async { fresh_client.stats().await.unwrap().entries == 101 },
    )
    .await;

    // A node whose local disk was wiped starts from the file it published itself.
    std::fs::remove_dir_all(&a.state_dir).unwrap();
    a.restart().await;
    let client = a.client().await;
    eventually(
        Duration::from_secs(20),
        "a wiped node reloads its own snapshot",
        || async { client.stats().await.unwrap().entries >= 100 },
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// Fault injection: needs root (mounts) and FUSE.

fn require_root(test: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{test} needs root (it mounts filesystems); CI runs these tests as root"
    );
}

fn require_tools(test: &str, tools: &[&str]) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for tool in tools {
        assert!(
            std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()),
            "{test} needs `{tool}` on PATH: apt-get install bindfs fuse3"
        );
    }
    assert!(
        Path::new("/dev/fuse").exists() || !tools.contains(&"bindfs"),
        "{test} needs /dev/fuse (FUSE kernel support; in a container, --device /dev/fuse)"
    );
}

async fn health_of(daemon: &TestDaemon, service: &str) -> i32 {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = tunecache_client::connect_channel(&daemon.socket)
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_shared_filesystem_never_stalls_ranks_or_shutdown() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let test = "hung_shared_filesystem_never_stalls_ranks_or_shutdown";
    require_root(test);
    require_tools(test, &["bindfs", "fusermount3"]);

    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mount_point = dir.path().join("mnt");
    // Declared after `dir`: dropped (unmounted) before the temp dir is removed.
    let mut mount = TestMount::bindfs(&backing, &mount_point);

    let mut daemon = start_node(
        Kind::Process,
        &dir.path().join("h"),
        &mount_point,
        "node-h",
        1,
    )
    .await;
    let client = daemon.client().await.with_timeout(Duration::from_secs(1));
    let mut recorded = numbered("before", 0..50, "h");
    client.record(recorded.clone()).await.unwrap();
    snapshot(&client).await.unwrap();
    assert!(std::fs::read_dir(backing.join("v2")).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("node-h.")));

    mount.signal_server(Signal::SIGSTOP);
    // Something new to publish, so the next interval's I/O hits the stopped server.
    let mut round = 0;
    let stuck_deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let batch = numbered(&format!("hung-{round}"), 0..20, "h");
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(1), client.record(batch.clone()))
            .await
            .expect("Record answers within 1 s while the shared filesystem hangs")
            .unwrap();
        let keys: Vec<_> = batch.iter().map(|e| e.key.clone().unwrap()).collect();
        let hits = tokio::time::timeout(Duration::from_secs(1), client.lookup(keys))
            .await
            .expect("Lookup answers within 1 s while the shared filesystem hangs")
            .unwrap();
        assert_eq!(hits.len(), 20);
        assert!(started.elapsed() < Duration::from_secs(2));
        recorded.extend(batch);
        round += 1;

        let stats = client.stats().await.unwrap();
        if !stats.stuck_operation.is_empty() {
            break stats;
        }
        assert!(
            Instant::now() < stuck_deadline,
            "Stats never reported the stuck operation; log:\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(stats.stuck_since_unix_ms > 0);
    assert!(stats.stuck_since_unix_ms <= tunecache_now_ms());

    // The Snapshot RPC gives up at once (or within its bound) with the reason.
    let slow_client = daemon.client().await;
    let started = Instant::now();
    let status = snapshot(&slow_client).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert!(status.message().contains("shared directory"), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(12));

    // Ranks see the cache SERVING; the snapshot health name reports the trouble.
    eventually(
        Duration::from_secs(5),
        "snapshot health NOT_SERVING",
        || async {
            health_of(&daemon, SNAPSHOT_HEALTH_SERVICE).await == ServingStatus::NotServing as i32
        },
    )
    .await;
    assert_eq!(
        health_of(&daemon, "tunecache.v1.TuneCache").await,
        ServingStatus::Serving as i32
    );

    // The hung filesystem does not hold the shutdown: its last publish is bounded by 3 s
    // (nothing is in flight to drain), where a wait on the mount would never end.
    let (status, took) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(8),
        "SIGTERM took {took:?} on a hung shared directory"
    );

    mount.unmount();
    daemon.restart().await;
    let client = daemon.client().await;
    let keys: Vec<_> = recorded.iter().map(|e| e.key.clone().unwrap()).collect();
    let hits = client.lookup(keys).await.unwrap();
    assert_eq!(hits.len(), recorded.len(), "nothing recorded was lost");
    // The directory answers again (now a plain directory): the next snapshot lands.
    let written = snapshot(&client).await.unwrap();
    assert_eq!(written.entries as usize, recorded.len());
}

fn tunecache_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_and_read_only_shared_dirs_are_reported_and_serving_goes_on() {
    let test = "full_and_read_only_shared_dirs_are_reported_and_serving_goes_on";
    require_root(test);
    require_tools(test, &["mount", "umount"]);
    let dir = tempfile::tempdir().unwrap();

    // ENOSPC: a 64 KiB tmpfs cannot hold a snapshot of ~1 MB.
    let tiny = dir.path().join("tiny");
    let _tiny_mount = TestMount::plain(&tiny, &["-t", "tmpfs", "-o", "size=64k", "tmpfs"]);
    let full = start_node(
        Kind::Process,
        &dir.path().join("full"),
        &tiny,
        "node-full",
        1,
    )
    .await;
    let client = full.client().await;
    let big: Vec<proto::Entry> = (0..2000)
        .map(|i| {
            let config = format!(r#"{{"tactic":{i},"pad":"{}"}}"#, "x".repeat(400));
            entry(test_key("gemm", &format!("big-{i}")), &config, 1.0, "full")
        })
        .collect();
    client.record(big).await.unwrap();
    let status = snapshot(&client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("No space left"), "{status:?}");
    // A periodic pass fails the same way too: the failure is logged once for both.
    let stats = full
        .wait_for_stats("a second failed publish", |s| s.snapshot_errors >= 2)
        .await;
    assert!(stats.snapshot_errors >= 1);
    assert!(
        stats.last_snapshot_error.contains("No space left"),
        "{stats:?}"
    );
    assert_eq!(stats.entries, 2000, "local data is kept");
    assert_eq!(
        hidden_files(&tiny.join("v2")),
        Vec::<String>::new(),
        "the failed temp file is removed"
    );
    assert_eq!(
        lines_containing(&full.log(), &["No space left", "logged once"]),
        1,
        "log:\n{}",
        full.log()
    );
    let hits = client
        .lookup(vec![test_key("gemm", "big-7")])
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);

    // EROFS: a read-only bind mount; a peer's file there is still read.
    let source = dir.path().join("ro-source");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(
        source.join("peer.tunecache.json"),
        br#"{"format":"tunecache-snapshot","version":1,"node":"peer","entries":[
            {"namespace":"test","op":"gemm","device":"test-device","problem":"from-peer",
             "config":"{}","time_us":1.5,"tuned_by":"peer","tuned_at_unix_ms":1}]}"#,
    )
    .unwrap();
    let read_only = dir.path().join("ro");
    let ro_mount = TestMount::plain(&read_only, &["--bind", source.to_str().unwrap()]);
    ro_mount.remount("remount,ro,bind");
    let ro = start_node(
        Kind::Process,
        &dir.path().join("ro-node"),
        &read_only,
        "node-ro",
        1,
    )
    .await;
    let client = ro.client().await;
    eventually(
        Duration::from_secs(20),
        "the peer file is read from the read-only dir",
        || async {
            !client
                .lookup(vec![test_key("gemm", "from-peer")])
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    client.record(numbered("ro", 0..10, "ro")).await.unwrap();
    let status = snapshot(&client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("Read-only"), "{status:?}");
    let stats = ro
        .wait_for_stats("a second failed publish", |s| s.snapshot_errors >= 2)
        .await;
    assert!(stats.snapshot_errors >= 1);
    assert!(stats.last_snapshot_error.contains("Read-only"), "{stats:?}");
    assert_eq!(
        lines_containing(&ro.log(), &["Read-only", "logged once"]),
        1,
        "log:\n{}",
        ro.log()
    );
    assert_eq!(client.stats().await.unwrap().entries, 11);
}

/// End-to-end timing of a large snapshot: publish 1,000,000 entries, then a fresh node loads
/// them. Not a benchmark; run against release binaries:
/// `cargo build --release --bins && TUNECACHE_BIN_DIR=target/release cargo test -p
/// tunecache-integration --test tiers snapshot:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn timing_of_a_million_entry_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let writer = start_node(
        Kind::Process,
        &dir.path().join("w"),
        &shared,
        "node-w",
        3600,
    )
    .await;
    let client = writer.client().await.with_timeout(Duration::from_secs(60));
    for start in (0..1_000_000).step_by(10_000) {
        client
            .record(numbered("m", start..start + 10_000, "w"))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let written = snapshot(&client).await.unwrap();
    println!(
        "snapshot RPC: {} entries, {} MB in {:?} (daemon: {} ms)",
        written.entries,
        written.bytes / 1_000_000,
        started.elapsed(),
        written.duration_ms
    );
    let started = Instant::now();
    let reader = start_node(Kind::Process, &dir.path().join("r"), &shared, "node-r", 1).await;
    let reader_client = reader.client().await;
    eventually(
        Duration::from_secs(120),
        "the reader loads everything",
        || async { reader_client.stats().await.unwrap().entries == 1_000_000 },
    )
    .await;
    println!(
        "fresh node start to 1M entries loaded and merged: {:?}",
        started.elapsed()
    );
    for line in reader
        .log()
        .lines()
        .filter(|l| l.contains("merged a snapshot"))
    {
        println!("{line}");
    }
}
