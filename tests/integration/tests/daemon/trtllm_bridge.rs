//! The TensorRT-LLM file bridge through the real CLI and an in-process daemon: import keeps
//! every valid entry when the daemon refuses some, export takes the writers' `<file>.lock`,
//! keeps what ranks saved to the file, and never mixes devices or TensorRT-LLM releases.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tunecache_integration::{bin, cli, wait, TestDaemon};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn metadata(lib_version: &str) -> Value {
    json!({"lib_version": lib_version, "creation_timestamp": 1718000000.5,
           "device_name": "NVIDIA H200", "device_capability": [9, 0]})
}

fn cache_file(lib_version: &str, rank_0: Value) -> String {
    serde_json::to_string_pretty(&json!({"metadata": metadata(lib_version), "rank_0": rank_0}))
        .unwrap()
}

/// Writes a cache file holding `rank_0`, imports it through the CLI, returns its summary.
fn import_rank_0(daemon: &TestDaemon, dir: &Path, rank_0: serde_json::Map<String, Value>) -> Value {
    let file = dir.join("cache.json");
    std::fs::write(&file, cache_file("1.1.0", Value::Object(rank_0))).unwrap();
    let output = cli(
        &daemon.socket,
        &[
            "--json",
            "import",
            "--format",
            "trtllm",
            file.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn trtllm_entry(tactic: &str, min_time: f64) -> Value {
    json!({"runner_id": 0, "tactic": tactic, "min_time": min_time})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_stores_every_valid_entry_when_the_daemon_refuses_some() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    // 1,501 entries: one key over the daemon's 4,096 bytes and one config over its 64 KiB sit in
    // the first batch of 1,000, which the daemon refuses whole.
    let mut rank_0 = serde_json::Map::new();
    for i in 0..1501 {
        let key = if i == 10 {
            format!("('trtllm::long', '{}')", "x".repeat(5000))
        } else {
            format!("('trtllm::gemm', {i})")
        };
        let tactic = if i == 900 {
            format!("'{}'", "t".repeat(70_000))
        } else {
            format!("{i}")
        };
        rank_0.insert(key, trtllm_entry(&tactic, 0.5));
    }
    let summary = import_rank_0(&daemon, dir.path(), rank_0);
    assert_eq!(summary["stored"], 1499, "{summary}");
    let skipped = summary["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{summary}");
    let reasons: Vec<&str> = skipped
        .iter()
        .map(|s| s["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("key.problem") && r.contains("4096")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("config")), "{reasons:?}");
    let entries = daemon.client().await.scan("trtllm", "").await.unwrap();
    assert_eq!(entries.len(), 1499);

    // Nothing storable, or not a cache: non-zero, with the summary.
    let file = dir.path().join("cache.json");
    let mut all_bad = serde_json::Map::new();
    all_bad.insert(
        format!("('trtllm::long', '{}')", "y".repeat(5000)),
        trtllm_entry("1", 0.5),
    );
    std::fs::write(&file, cache_file("1.1.0", Value::Object(all_bad))).unwrap();
    let output = cli(
        &daemon.socket,
        &["import", "--format", "trtllm", file.to_str().unwrap()],
    );
    assert!(!output.status.success());
    assert!(
        text(&output.stdout).contains("skipped 1"),
        "{}",
        text(&output.stdout)
    );
    std::fs::write(&file, "[1, 2]").unwrap();
    let output = cli(
        &daemon.socket,
        &["import", "--format", "trtllm", file.to_str().unwrap()],
    );
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("not an object"),
        "{}",
        text(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_splits_batches_over_the_daemons_message_size() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = tunecache_integration::DaemonOptions::new(dir.path())
        .args(["--max-message-bytes", "65536"])
        .in_process()
        .await;
    // 1,000 entries of about 1 KB, one batch of 1 MB: sixteen times the daemon's limit. One
    // entry alone is over it.
    let mut rank_0 = serde_json::Map::new();
    for i in 0..1000 {
        let (key, tactic) = if i == 500 {
            // Valid (a 3 KB problem, a 63 KB config), but over 64 KiB as a message.
            let key = format!("('trtllm::gemm', '{}')", "p".repeat(3_000));
            (key, format!("'{}'", "t".repeat(63_000)))
        } else {
            (format!("('trtllm::gemm', {i})"), format!("'{i:01000}'"))
        };
        rank_0.insert(key, trtllm_entry(&tactic, 0.5));
    }
    let summary = import_rank_0(&daemon, dir.path(), rank_0);
    assert_eq!(summary["stored"], 999, "{summary}");
    let skipped = summary["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{summary}");
    let reason = skipped[0]["reason"].as_str().unwrap();
    assert!(reason.contains("--max-message-bytes 65536"), "{reason}");
}

/// Whether process `pid` has `path` open, from /proc/<pid>/fd.
fn holds_open(pid: u32, path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// Takes `<file>.lock` the way the newest TensorRT-LLM writers do: a POSIX lock
/// (`fcntl.lockf(fd, LOCK_EX)`), which an `flock` alone would not see.
fn hold_writer_lockf(cache: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("{}.lock", cache.display()))
        .unwrap();
    // SAFETY: lockf on a descriptor this function owns.
    assert_eq!(
        unsafe { libc::lockf(lock.as_raw_fd(), libc::F_TLOCK, 0) },
        0
    );
    lock
}

/// Takes `<file>.lock` the way earlier TensorRT-LLM writers (py-filelock) do.
fn hold_writer_lock(cache: &Path) -> nix::fcntl::Flock<std::fs::File> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("{}.lock", cache.display()))
        .unwrap();
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, errno)| errno)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_waits_for_the_writers_lock_and_keeps_what_ranks_saved() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let input = dir.path().join("in.json");
    std::fs::write(
        &input,
        cache_file(
            "1.1.0",
            json!({"('trtllm::gemm', 1)": trtllm_entry("1", 0.5)}),
        ),
    )
    .unwrap();
    let imported = cli(
        &daemon.socket,
        &["import", "--format", "trtllm", input.to_str().unwrap()],
    );
    assert!(imported.status.success(), "{}", text(&imported.stderr));

    // A rank saved an entry to the file after the import.
    let file = dir.path().join("cache.json");
    let saved_later = cache_file(
        "1.1.0",
        json!({"('trtllm::gemm', 2)": trtllm_entry("(2, 'b')", 0.25)}),
    );
    std::fs::write(&file, &saved_later).unwrap();

    // While a writer holds `<file>.lock`, export gives up after its timeout and writes nothing.
    let export_is_held_off = |writer: &str| {
        let refused = cli(
            &daemon.socket,
            &[
                "export",
                "--format",
                "trtllm",
                "--lock-timeout",
                "0.5",
                file.to_str().unwrap(),
            ],
        );
        assert!(
            !refused.status.success(),
            "export ignored a {writer} writer"
        );
        let stderr = text(&refused.stderr);
        assert!(
            stderr.contains("cache.json.lock") && stderr.contains("nothing written"),
            "{stderr}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), saved_later);
    };
    let lock = hold_writer_lock(&file);
    export_is_held_off("flock");
    drop(lock);
    // The newest writers' POSIX lock holds export off just the same.
    let posix_lock = hold_writer_lockf(&file);
    export_is_held_off("lockf");
    drop(posix_lock);
    let lock = hold_writer_lock(&file);

    // Released while export waits: it goes ahead.
    let mut waiting = Command::new(bin("tunecache"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["export", "--format", "trtllm", "--lock-timeout", "60"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It waits on the lock once it holds the lock file open (it tries it every 50 ms);
    // exiting first would be not waiting.
    let lock_file = std::fs::canonicalize(file.with_file_name("cache.json.lock")).unwrap();
    let exited = wait(Duration::from_secs(30), "export opening the lock file")
        .every(Duration::from_millis(10))
        .blocking_some(|| {
            if holds_open(waiting.id(), &lock_file) {
                return Some(None);
            }
            waiting.try_wait().unwrap().map(Some)
        });
    if let Some(status) = exited {
        let output = waiting.wait_with_output().unwrap();
        panic!(
            "export did not wait for the lock: it exited with {status}; {}",
            text(&output.stderr)
        );
    }
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "export did not wait for the lock"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), saved_later);
    drop(lock);
    let exported = waiting.wait_with_output().unwrap();
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    assert!(
        text(&exported.stdout).contains("(1 kept from the file)"),
        "{}",
        text(&exported.stdout)
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written["rank_0"]["('trtllm::gemm', 1)"]["tactic"], "1");
    assert_eq!(
        written["rank_0"]["('trtllm::gemm', 2)"]["tactic"],
        "(2, 'b')"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_never_mixes_devices_or_releases() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    // The older release measured a faster time for the same key and rank.
    for (version, tactic, min_time) in [("1.0.0", "7", 0.001), ("1.1.0", "3", 0.5)] {
        let input = dir.path().join(format!("in-{version}.json"));
        std::fs::write(
            &input,
            cache_file(
                version,
                json!({"('trtllm::gemm', 1)": trtllm_entry(tactic, min_time)}),
            ),
        )
        .unwrap();
        let output = cli(
            &daemon.socket,
            &["import", "--format", "trtllm", input.to_str().unwrap()],
        );
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert!(
            text(&output.stdout).contains("1 stored"),
            "{}",
            text(&output.stdout)
        );
    }
    let file = dir.path().join("out.json");
    let refused = cli(
        &daemon.socket,
        &["export", "--format", "trtllm", file.to_str().unwrap()],
    );
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("\"NVIDIA H200|sm_90|trtllm 1.0.0\"")
            && stderr.contains("\"NVIDIA H200|sm_90|trtllm 1.1.0\"")
            && stderr.contains("--device"),
        "{stderr}"
    );
    assert!(!file.exists());

    let exported = cli(
        &daemon.socket,
        &[
            "export",
            "--format",
            "trtllm",
            "--device",
            "NVIDIA H200|sm_90|trtllm 1.1.0",
            file.to_str().unwrap(),
        ],
    );
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written["metadata"]["lib_version"], "1.1.0");
    let entry = &written["rank_0"]["('trtllm::gemm', 1)"];
    assert_eq!(entry["tactic"], "3", "{written}");
    assert_eq!(entry["min_time"], 0.5);
}
