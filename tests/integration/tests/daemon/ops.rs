//! Operator-facing surfaces against the real CLI: the Prometheus endpoint (a real HTTP GET),
//! `tunecache stats` as a summary, a table of every counter and JSON, and the TensorRT-LLM cache file round trip through the
//! CLI and the daemon. The daemon runs in-process except where its log is read.

use serde_json::Value;
use tunecache_client::key;
use tunecache_integration::{cli, entry, http_get, test_key, DaemonOptions, TestDaemon};

/// `GET path` over plain HTTP/1.1; returns status line and body.
/// The value of an unlabelled sample, e.g. `tunecache_hits_total 3`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_reports_the_daemons_counters() {
    let dir = tempfile::tempdir().unwrap();
    // A port of its own: an in-process daemon's log (where port 0's pick is named) is not
    // the test's to read.
    let addr = format!("127.0.0.1:{}", tunecache_integration::redis::free_port());
    let daemon = DaemonOptions::new(dir.path())
        .args(["--metrics-addr", addr.as_str()])
        .in_process()
        .await;

    let client = daemon.client().await;
    client
        .record(vec![
            entry(test_key("gemm", "a"), "{}", 1.0, "t"),
            entry(test_key("gemm", "b"), "{}", 1.0, "t"),
        ])
        .await
        .unwrap();
    let hits = client
        .lookup(vec![test_key("gemm", "a"), test_key("gemm", "absent")])
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);

    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    for (name, value) in [
        ("tunecache_lookups_total", 2.0),
        ("tunecache_hits_total", 1.0),
        ("tunecache_misses_total", 1.0),
        ("tunecache_records_total", 1.0),
        ("tunecache_entries_stored_total", 2.0),
        ("tunecache_entries", 2.0),
        ("tunecache_resolves_total", 0.0),
        ("tunecache_resolve_leases_granted_total", 0.0),
        ("tunecache_tuner_queue_depth", 0.0),
        ("tunecache_snapshot_errors_total", 0.0),
        ("tunecache_snapshot_age_seconds", -1.0),
    ] {
        assert_eq!(sample(&body, name), Some(value), "{name} in:\n{body}");
    }
    assert!(body.contains("# TYPE tunecache_hits counter"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");

    let (status, _) = http_get(&addr, "/other");
    assert!(status.contains("404"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_off_by_default_and_a_bare_port_is_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    assert!(!daemon.log().contains("metrics at"), "{}", daemon.log());
    drop(daemon);

    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--metrics-addr", "0"])
        .process()
        .await;
    assert!(
        daemon.log().contains("metrics at http://127.0.0.1:"),
        "{}",
        daemon.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_prints_a_summary_every_counter_and_raw_json() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    daemon
        .client()
        .await
        .record(vec![entry(test_key("gemm", "s"), "{}", 1.0, "t")])
        .await
        .unwrap();
    // A short summary first, health on top; every counter with --all.
    let summary = cli(&daemon.socket, &["stats"]);
    assert!(summary.status.success());
    let summary = String::from_utf8_lossy(&summary.stdout);
    let lines: Vec<&str> = summary.lines().collect();
    assert!(
        lines.len() <= 12 && lines[0].split_whitespace().collect::<Vec<_>>() == ["health", "OK"],
        "{summary}"
    );
    assert!(
        summary.contains("1 (lookups 0: 0 hits, 0 misses; 1 records)"),
        "{summary}"
    );
    let problems = cli(&daemon.socket, &["stats", "--problems"]);
    assert!(
        problems.status.success() && problems.stdout.is_empty(),
        "{problems:?}"
    );
    let table = cli(&daemon.socket, &["stats", "--all"]);
    assert!(table.status.success());
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["entries", "1"]),
        "{table}"
    );
    assert!(table.lines().count() > 100, "{table}");
    let json = cli(&daemon.socket, &["--json", "stats"]);
    let stats: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(stats["entries"], 1);
    assert_eq!(stats["records"], 1);
    assert_eq!(stats["tuner_queue_depth"], 0);
}

/// A TensorRT-LLM cache file as its writer lays it out, with two ranks, a shared section, and
/// values whose text must survive (`1e-3`, a tactic repr with quotes).
const TRTLLM_FILE: &str = r#"{
  "metadata": {
    "lib_version": "1.1.0",
    "creation_timestamp": 1718000000.5,
    "device_name": "NVIDIA H200",
    "device_capability": [
      9,
      0
    ]
  },
  "shared": {
    "('trtllm::attention', 'FmhaRunner', (8, 128))": {
      "runner_id": 1,
      "tactic": "{'tile': (64, 128), 'stages': 3}",
      "min_time": 0.25
    }
  },
  "rank_0": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "(128, 'tile \"a\"')",
      "min_time": 1e-3
    }
  },
  "rank_1": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "-1",
      "min_time": 7
    },
    "('trtllm::bad', 'R', ())": {
      "runner_id": 0,
      "tactic": "3",
      "min_time": -1
    }
  }
}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_cache_file_round_trips_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let input = dir.path().join("in.json");
    std::fs::write(&input, TRTLLM_FILE).unwrap();

    let imported = cli(
        &daemon.socket,
        &["import", "--format", "trtllm", input.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&imported.stdout);
    let stderr = String::from_utf8_lossy(&imported.stderr);
    assert!(imported.status.success(), "{stderr}");
    assert!(
        stdout.contains("imported 3 entries (3 stored, 0 unchanged), skipped 1"),
        "{stdout}"
    );
    assert!(
        stderr.contains("skipped [rank_1] ('trtllm::bad', 'R', ())"),
        "{stderr}"
    );

    // The daemon holds them under the documented mapping.
    let client = daemon.client().await;
    let entries = client.scan("trtllm", "").await.unwrap();
    assert_eq!(entries.len(), 3);
    let shared = key(
        "trtllm",
        "trtllm::attention",
        "NVIDIA H200|sm_90|trtllm 1.1.0",
        "('trtllm::attention', 'FmhaRunner', (8, 128))",
        None,
    );
    assert_eq!(client.lookup(vec![shared]).await.unwrap().len(), 1);

    let output = dir.path().join("out.json");
    let exported = cli(
        &daemon.socket,
        &[
            "export",
            "--format",
            "trtllm",
            "--world-size",
            "3",
            output.to_str().unwrap(),
        ],
    );
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    assert!(String::from_utf8_lossy(&exported.stdout).contains("exported 3 entries"));

    let mut expected: Value = serde_json::from_str(TRTLLM_FILE).unwrap();
    expected["rank_1"]
        .as_object_mut()
        .unwrap()
        .remove("('trtllm::bad', 'R', ())");
    expected["rank_2"] = serde_json::json!({});
    let written = std::fs::read_to_string(&output).unwrap();
    let actual: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(actual, expected, "{written}");
    // Numbers keep their text, not just their value.
    assert!(written.contains("\"min_time\": 1e-3"), "{written}");

    // Importing the export again changes nothing.
    let again = cli(
        &daemon.socket,
        &[
            "--json",
            "import",
            "--format",
            "trtllm",
            output.to_str().unwrap(),
        ],
    );
    let summary: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(summary["stored"], 0, "{summary}");
    assert_eq!(summary["unchanged"], 3, "{summary}");
}
