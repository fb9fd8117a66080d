//! Last uses across the shared directory (docs/lifecycle.md, docs/snapshot-format.md): a key
//! read only on node B is kept on node A too, because B's use travels in B's next segment,
//! and a key read on neither expires on both.
//!
//! The days have to differ, so the daemons run under `faketime` (libfaketime) with their
//! clocks moved on: day 0 A records, day 20 B's rank reads one key, day 40 both judge with
//! `--retain-days 30`. Without the use from B, A's copy would have expired by its own record
//! date. libfaketime (the `faketime` package) is required: a missing one fails the test, which
//! cannot run without it. It is preloaded into the daemon itself (`LD_PRELOAD`, `FAKETIME`)
//! rather than run through the `faketime` command, which forks and would not pass signals on.
//!
//! Past `--max-entries`, both nodes keep exactly the entries used last (uses on one node
//! count on the other). And a node back after 200 days, its state directory kept, serves none of what expired
//! meanwhile, republishes none of it, and a fresh node learns none of it from the old
//! segments.

use std::path::Path;
use std::time::Duration;

use tunecache_client::proto;
use tunecache_integration::{entry, eventually, test_key, DaemonOptions, Faketime, TestDaemon};

const LIMIT: Duration = Duration::from_secs(30);

/// Node `name` (state in `root/name`) on `shared`, its clock `days_ahead` days on, keeping
/// 30 days, serving.
async fn node(root: &Path, shared: &Path, name: &str, days_ahead: u32) -> TestDaemon {
    node_with(root, shared, name, days_ahead, &["--retain-days", "30"]).await
}

/// `node`, with `flags` for its lifecycle.
async fn node_with(
    root: &Path,
    shared: &Path,
    name: &str,
    days_ahead: u32,
    flags: &[&str],
) -> TestDaemon {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    DaemonOptions::new(&dir)
        .arg("--shared-dir")
        .arg(shared.to_str().unwrap())
        .args(["--node-name", name, "--snapshot-interval", "1"])
        .args(["--lifecycle-flush-ms", "100"])
        .args(flags.iter().copied())
        .faketime(Faketime::offset(&format!("+{days_ahead}d")))
        .process()
        .await
}

/// Reads what is new in the shared directory and publishes, now.
async fn snapshot(node: &TestDaemon) {
    let mut request = tonic::Request::new(proto::SnapshotRequest {});
    request.set_timeout(LIMIT);
    let client = node.client().await;
    let answered = client.raw().snapshot(request).await;
    answered.unwrap_or_else(|e| panic!("Snapshot RPC: {e}; log:\n{}", node.log()));
}

/// The problems of `keys` `node` holds (a Lookup: a use).
async fn holds(node: &TestDaemon, keys: &[proto::Key]) -> Vec<String> {
    let hits = node.client().await.lookup(keys.to_vec()).await.unwrap();
    let mut problems: Vec<String> = hits
        .into_iter()
        .filter_map(|hit| Some(hit.key?.problem))
        .collect();
    problems.sort();
    problems
}

/// The names of `node`'s segments in `shared`.
fn segments_of(shared: &Path, node: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&format!("{node}.")) && name.ends_with(".seg.json"))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_on_one_node_is_kept_on_every_node_and_one_read_nowhere_expires_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let read_on_b = test_key("gemm", "read-on-b");
    let read_nowhere = test_key("gemm", "read-nowhere");
    let keys = [read_on_b.clone(), read_nowhere.clone()];

    // Day 0: A records both keys; B learns them from A's segment.
    let mut a = node(root.path(), &shared, "node-a", 0).await;
    let mut b = node(root.path(), &shared, "node-b", 0).await;
    a.client()
        .await
        .record(vec![
            entry(read_on_b.clone(), r#"{"tile":1}"#, 1.0, "node-a"),
            entry(read_nowhere.clone(), r#"{"tile":2}"#, 1.0, "node-a"),
        ])
        .await
        .unwrap();
    snapshot(&a).await;
    eventually(LIMIT, "B learns both keys", || async {
        b.stats().await.entries == 2
    })
    .await;
    let both = vec!["read-nowhere".to_owned(), "read-on-b".to_owned()];
    assert_eq!(holds(&a, &keys).await, both);
    a.stop().await;
    b.stop().await;

    // Day 20: a rank reads one key on B only; B's next segment carries the use, and A,
    // which holds the key, takes the later day.
    let mut a = node(root.path(), &shared, "node-a", 20).await;
    let mut b = node(root.path(), &shared, "node-b", 20).await;
    assert_eq!(holds(&b, &keys[..1]).await, vec!["read-on-b".to_owned()]);
    let published = b.client().await;
    eventually(LIMIT, "B publishes its use", || async {
        published
            .stats()
            .await
            .is_ok_and(|stats| stats.snapshot_last_uses_published >= 1)
    })
    .await;
    eventually(LIMIT, "A reads B's segment", || async {
        a.stats().await.peer_segments_loaded >= 1
    })
    .await;
    // A pass that began after the read has finished merging it (and journalled the day).
    snapshot(&a).await;
    let segments = segments_of(&shared, "node-b");
    assert_eq!(segments.len(), 1, "B published only its use: {segments:?}");
    let document: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared.join("v2").join(&segments[0])).unwrap())
            .unwrap();
    assert_eq!(document["entries"].as_array().map(Vec::len), Some(0));
    let used = document["used"].as_array().expect("a used list");
    assert_eq!(used.len(), 1, "{document}");
    assert_eq!(used[0]["problem"], "read-on-b");
    assert_eq!(used[0]["tuned_by"], "node-a", "the full entry travels");
    assert!(used[0]["last_used_day"].as_u64().is_some(), "{document}");
    a.stop().await;
    b.stop().await;

    // Day 40, retention 30 days: the key B read on day 20 lives on both nodes; the one
    // nobody read since day 0 is gone from both, and A's own segments, read back at start,
    // do not bring it back.
    let mut a = node(root.path(), &shared, "node-a", 40).await;
    let mut b = node(root.path(), &shared, "node-b", 40).await;
    for (name, node) in [("A", &a), ("B", &b)] {
        eventually(LIMIT, format!("{name} finishes a pass"), || async {
            node.stats().await.snapshot_passes >= 1
        })
        .await;
        snapshot(node).await;
    }
    for (name, node) in [("A", &a), ("B", &b)] {
        assert_eq!(
            holds(node, &keys).await,
            vec!["read-on-b".to_owned()],
            "{name} on day 40; log:\n{}",
            node.log()
        );
        assert_eq!(node.stats().await.entries, 1, "{name}");
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_after_200_days_serves_and_republishes_none_of_what_expired() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let keys: Vec<proto::Key> = (0..3)
        .map(|i| test_key("gemm", &format!("old-{i}")))
        .collect();

    // Day 0: A records and publishes; then it is away.
    let mut a = node(root.path(), &shared, "node-a", 0).await;
    let entries = keys
        .iter()
        .map(|key| entry(key.clone(), "{}", 1.0, "node-a"))
        .collect();
    a.client().await.record(entries).await.unwrap();
    snapshot(&a).await;
    let published = segments_of(&shared, "node-a");
    assert!(!published.is_empty());
    a.stop().await;

    // Day 200: its state directory kept, A serves none of them (expired before serving) and
    // its own segments, read back, bring none back.
    let mut a = node(root.path(), &shared, "node-a", 200).await;
    let stats = a.stats().await;
    assert_eq!(stats.entries, 0, "log:\n{}", a.log());
    assert_eq!(stats.entries_expired, 3);
    snapshot(&a).await;
    snapshot(&a).await;
    assert!(holds(&a, &keys).await.is_empty());
    // Nothing it publishes from now on names them.
    for name in segments_of(&shared, "node-a") {
        if published.contains(&name) {
            continue;
        }
        let text = std::fs::read_to_string(shared.join("v2").join(&name)).unwrap();
        assert!(
            !text.contains("old-"),
            "{name} republishes an expired entry: {text}"
        );
    }

    // A fresh node that day reads A's old segments and keeps none of them.
    let c = node(root.path(), &shared, "node-c", 200).await;
    eventually(LIMIT, "C reads A's segments", || async {
        c.stats().await.peer_segments_loaded >= 1
    })
    .await;
    snapshot(&c).await;
    let stats = c.stats().await;
    assert_eq!(stats.entries, 0, "log:\n{}", c.log());
    assert!(stats.entries_expired_on_arrival >= 3, "{stats:?}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_entries_both_nodes_keep_exactly_the_most_recently_used() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let keys: Vec<proto::Key> = (0..5000)
        .map(|i| test_key("gemm", &format!("m={i:05}")))
        .collect();
    let unbounded = ["--retain-days", "0", "--max-entries", "0"];

    // Day 0: A records 5,000 entries; B learns them.
    let mut a = node_with(root.path(), &shared, "node-a", 0, &unbounded).await;
    let mut b = node_with(root.path(), &shared, "node-b", 0, &unbounded).await;
    for chunk in keys.chunks(1000) {
        let entries = chunk
            .iter()
            .map(|key| entry(key.clone(), "{}", 1.0, "node-a"))
            .collect();
        a.client().await.record(entries).await.unwrap();
    }
    snapshot(&a).await;
    snapshot(&b).await;
    assert_eq!(b.stats().await.entries, 5000);
    a.stop().await;
    b.stop().await;

    // Day 1: ranks on B read every fifth key (spread over the key order); A learns the uses
    // from B's segment.
    let read: Vec<proto::Key> = keys.iter().step_by(5).cloned().collect();
    let mut a = node_with(root.path(), &shared, "node-a", 1, &unbounded).await;
    let mut b = node_with(root.path(), &shared, "node-b", 1, &unbounded).await;
    let hits = b.client().await.lookup(read.clone()).await.unwrap();
    assert_eq!(hits.len(), 1000);
    b.wait_for_stats("B publishes the uses", |s| {
        s.snapshot_last_uses_published >= 1000
    })
    .await;
    let before = a.stats().await.last_use_updates_written;
    snapshot(&a).await;
    a.wait_for_stats("A journals the uses", |s| {
        s.last_use_updates_written >= before + 1000
    })
    .await;
    a.stop().await;
    b.stop().await;

    // Day 2, --max-entries 1000 on both: each keeps exactly the 1,000 B's ranks read.
    let bounded = ["--retain-days", "0", "--max-entries", "1000"];
    let mut a = node_with(root.path(), &shared, "node-a", 2, &bounded).await;
    let mut b = node_with(root.path(), &shared, "node-b", 2, &bounded).await;
    for (name, node) in [("A", &a), ("B", &b)] {
        // What a pass brings back from the directory after the sweep at start (the segments
        // hold all 5,000) is cut again by the next sweep.
        node.wait_for_snapshot_passes(2).await;
        let stats = node
            .wait_for_stats(&format!("{name} within the bound"), |s| s.entries == 1000)
            .await;
        assert!(stats.entries_expired_by_bound >= 4000, "{name}: {stats:?}");
        let held = node.client().await.lookup(read.clone()).await.unwrap();
        assert_eq!(held.len(), 1000, "{name} keeps every key read on day 1");
    }
    a.stop().await;
    b.stop().await;
}
