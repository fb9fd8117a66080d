//! What a daemon does at its edges, against the real binary: a state directory belongs to
//! one daemon (a second one on it refuses to start and names the first), and at SIGTERM the
//! daemon publishes what it has not published yet, so a short job's results are in the
//! shared directory when it ends; the next start reports how that went.

use std::time::Duration;

use tunecache_integration::{bin, numbered, shared_node, TestDaemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_one_state_directory_refuses_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let first = TestDaemon::process(dir.path()).await;
    let output = std::process::Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(dir.path().join("second.sock"))
        .arg("--state-dir")
        .arg(&first.state_dir)
        .env_remove("TUNECACHE_SOCKET")
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "a second daemon started on the state directory"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "the holder's pid is not named: {stderr}"
    );
    assert!(
        stderr.contains(&first.socket.display().to_string()),
        "the holder's socket is not named: {stderr}"
    );
    assert!(
        !dir.path().join("second.sock").exists(),
        "the refused daemon left its socket"
    );
    // The first one is unharmed.
    first.client().await.stats().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_publishes_what_was_not_published_yet() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // Hourly snapshots: only the publish at shutdown can carry these.
    let mut daemon = shared_node(&dir.path().join("a"), &shared, "A", 3600, &[])
        .process()
        .await;
    let client = daemon.client().await;
    // The first pass (at start) must be done before anything can be published.
    tunecache_integration::eventually(Duration::from_secs(10), "the first pass", || async {
        client.stats().await.is_ok_and(|s| s.snapshot_passes >= 1)
    })
    .await;
    client.record(numbered("job", 0..7, "A")).await.unwrap();
    let (status, took) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    eprintln!("SIGTERM to exit: {took:?}");
    let published: Vec<String> = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("A.") && n.ends_with(".seg.json"))
        .collect();
    assert_eq!(published.len(), 1, "{published:?}");
    let text = std::fs::read_to_string(shared.join("v2").join(&published[0])).unwrap();
    assert_eq!(text.matches("\"problem\":\"job-").count(), 7, "{text}");
    let log = daemon.log();
    assert!(log.contains("last publish at shutdown"), "{log}");
    // The next run says how the last one ended.
    daemon.restart().await;
    let stats = daemon.client().await.stats().await.unwrap();
    assert!(
        stats
            .previous_shutdown_publish
            .contains("shared directory: published"),
        "{:?}",
        stats.previous_shutdown_publish
    );
}
