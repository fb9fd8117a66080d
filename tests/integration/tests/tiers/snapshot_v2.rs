//! Snapshot format version 2 against real daemons sharing one temporary directory: nodes
//! publish only their own contributions as segments, converge on the faster result, read
//! nothing when nothing is new, survive a compaction racing a SIGSTOPped reader, get their
//! own contributions back after a wipe, and still merge version-1 files of older daemons.
//! The SIGSTOPped reader and the wiped node (whose log is read) are daemon processes; the other
//! nodes run in-process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use tunecache_client::{proto, Client};
use tunecache_integration::{entry, eventually, numbered, test_key, Kind, TestDaemon};

async fn snapshot(client: &Client) -> proto::SnapshotResponse {
    let mut request = tonic::Request::new(proto::SnapshotRequest {});
    request.set_timeout(Duration::from_secs(30));
    client
        .raw()
        .snapshot(request)
        .await
        .expect("Snapshot RPC")
        .into_inner()
}

async fn entries(client: &Client) -> u64 {
    client.stats().await.map_or(0, |stats| stats.entries)
}

/// Segment files of `node` in the shared directory.
fn segments_of(shared: &Path, node: &str) -> Vec<PathBuf> {
    let prefix = format!("{node}.");
    let mut found: Vec<PathBuf> = std::fs::read_dir(shared.join("v2"))
        .map(|listing| {
            listing
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(&prefix) && name.ends_with(".seg.json"))
                .map(|name| shared.join("v2").join(name))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The `problem` and `tuned_by` of every entry in `node`'s segments.
fn published_by(shared: &Path, node: &str) -> Vec<(String, String)> {
    let mut published = Vec::new();
    for path in segments_of(shared, node) {
        let document: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(document["format"], "tunecache-snapshot");
        assert_eq!(document["version"], 2);
        assert_eq!(document["node"], node);
        for entry in document["entries"].as_array().unwrap() {
            published.push((
                entry["problem"].as_str().unwrap().to_owned(),
                entry["tuned_by"].as_str().unwrap().to_owned(),
            ));
        }
    }
    published
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_nodes_converge_on_the_faster_result_and_publish_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let names = ["node-a", "node-b", "node-c", "node-d"];
    let mut nodes = Vec::new();
    for name in names {
        nodes.push(start_node(Kind::InProcess, &dir.path().join(name), &shared, name, &[]).await);
    }
    let mut clients = Vec::new();
    for node in &nodes {
        clients.push(node.client().await);
    }
    // Each node contributes 50 keys of its own and its own time for two contested keys;
    // node-c is fastest on the first, node-a on the second.
    let contested = [
        test_key("gemm", "contested-1"),
        test_key("gemm", "contested-2"),
    ];
    let times = [[4.0, 1.5], [3.0, 2.5], [1.0, 3.5], [2.0, 4.5]];
    for (i, client) in clients.iter().enumerate() {
        client
            .record(numbered(&format!("from-{}", names[i]), 0..50, names[i]))
            .await
            .unwrap();
        for (key, time) in contested.iter().zip(times[i]) {
            let config = format!(r#"{{"by":"{}"}}"#, names[i]);
            client
                .record(vec![entry(key.clone(), &config, time, names[i])])
                .await
                .unwrap();
        }
    }
    for (name, client) in names.iter().zip(&clients) {
        eventually(
            Duration::from_secs(60),
            &format!("{name} holds every node's entries"),
            || async { entries(client).await == 4 * 50 + 2 },
        )
        .await;
        let hits = client.lookup(contested.to_vec()).await.unwrap();
        let winners: Vec<_> = hits
            .iter()
            .map(|hit| {
                let result = hit.result.as_ref().unwrap();
                (result.time_us, result.tuned_by.clone())
            })
            .collect();
        assert_eq!(
            winners,
            vec![(1.0, "node-c".to_owned()), (1.5, "node-a".to_owned())],
            "{name}: the faster result wins"
        );
    }
    // Every node published its own contributions and nothing it learned.
    for name in names {
        eventually(
            Duration::from_secs(20),
            &format!("{name} published its 52 contributions"),
            || async { published_by(&shared, name).len() >= 52 },
        )
        .await;
        let foreign: Vec<_> = published_by(&shared, name)
            .into_iter()
            .filter(|(_, tuned_by)| tuned_by != name)
            .collect();
        assert!(foreign.is_empty(), "{name} republished {foreign:?}");
    }
    let stats = clients[0].stats().await.unwrap();
    assert_eq!(stats.snapshot_format_version, 2);
    assert!(stats.peer_segments_loaded >= 3, "{stats:?}");
    assert_eq!(stats.snapshot_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pass_reads_and_writes_no_file_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = start_node(
        Kind::InProcess,
        &dir.path().join("a"),
        &shared,
        "node-a",
        &[],
    )
    .await;
    let b = start_node(
        Kind::InProcess,
        &dir.path().join("b"),
        &shared,
        "node-b",
        &[],
    )
    .await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    client_a.record(numbered("a", 0..200, "a")).await.unwrap();
    client_b.record(numbered("b", 0..200, "b")).await.unwrap();
    for client in [&client_a, &client_b] {
        eventually(Duration::from_secs(30), "both converge", || async {
            entries(client).await == 400
        })
        .await;
    }
    let before = client_a.stats().await.unwrap();
    assert!(before.snapshot_bytes_read > 0, "{before:?}");
    // Several idle intervals: passes run, no file byte is read or written.
    let after = a.wait_for_snapshot_passes(3).await;
    assert!(
        after.snapshot_passes >= before.snapshot_passes + 2,
        "{after:?}"
    );
    assert_eq!(after.snapshot_pass_bytes_read, 0, "{after:?}");
    assert_eq!(after.snapshot_pass_bytes_written, 0, "{after:?}");
    assert_eq!(after.snapshot_bytes_read, before.snapshot_bytes_read);
    assert_eq!(after.snapshot_bytes_written, before.snapshot_bytes_written);

    // One new entry on node-b: node-a reads one small segment, not node-b's cache.
    let read_before = after.snapshot_bytes_read;
    client_b.record(numbered("late", 0..1, "b")).await.unwrap();
    eventually(Duration::from_secs(20), "the new entry arrives", || async {
        entries(&client_a).await == 401
    })
    .await;
    let read = client_a.stats().await.unwrap().snapshot_bytes_read - read_before;
    assert!(
        read > 0 && read < 1024,
        "one new entry cost node-a {read} bytes of reads"
    );
}

/// Publishes `batch` on `client` now and returns when its segment is in place (written by
/// this Snapshot call, or by a periodic pass that got there first: the call waits for it).
async fn publish(client: &Client, batch: Vec<proto::Entry>) {
    let before = snapshot(client).await.entries;
    let new = batch.len() as u64;
    client.record(batch).await.unwrap();
    let written = snapshot(client).await;
    assert_eq!(written.entries, before + new, "{written:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_racing_a_stopped_reader_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // Compact as soon as there are more than 2 segments: nearly every publish compacts.
    let writer = start_node(
        Kind::InProcess,
        &dir.path().join("w"),
        &shared,
        "node-w",
        &["--snapshot-compact-segments", "2"],
    )
    .await;
    let reader = start_node(Kind::Process, &dir.path().join("r"), &shared, "node-r", &[]).await;
    let (w, r) = (writer.client().await, reader.client().await);
    let mut expected = 0;

    publish(&w, numbered("first", 0..20, "w")).await;
    expected += 20;
    eventually(
        Duration::from_secs(20),
        "the reader has the first batch",
        || async { entries(&r).await == expected },
    )
    .await;

    // Stopped between passes: every segment it would read next is compacted away.
    kill(reader.pid(), Signal::SIGSTOP).unwrap();
    for round in 0..6 {
        publish(&w, numbered(&format!("stopped-{round}"), 0..10, "w")).await;
        expected += 10;
    }
    let stats = w.stats().await.unwrap();
    assert!(stats.segment_compactions >= 2, "{stats:?}");
    assert!(segments_of(&shared, "node-w").len() <= 3);
    kill(reader.pid(), Signal::SIGCONT).unwrap();
    eventually(
        Duration::from_secs(30),
        "the resumed reader has everything",
        || async { entries(&r).await == expected },
    )
    .await;

    // Stopped and resumed at arbitrary points of its passes while the writer publishes and
    // compacts: whatever it was reading when the old segments went, it must miss nothing.
    let pid = reader.pid();
    let toggler = std::thread::spawn(move || {
        let mut state: u32 = 0x2545_f491;
        let deadline = Instant::now() + Duration::from_secs(12);
        while Instant::now() < deadline {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            kill(pid, Signal::SIGSTOP).unwrap();
            std::thread::sleep(Duration::from_millis(50 + u64::from(state % 400)));
            kill(pid, Signal::SIGCONT).unwrap();
            std::thread::sleep(Duration::from_millis(20 + u64::from(state % 300)));
        }
    });
    let mut round = 0;
    while !toggler.is_finished() {
        publish(&w, numbered(&format!("racing-{round}"), 0..5, "w")).await;
        expected += 5;
        round += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    toggler.join().unwrap();
    kill(reader.pid(), Signal::SIGCONT).unwrap();
    eventually(
        Duration::from_secs(30),
        "the reader has every entry published while it was stopped and resumed",
        || async { entries(&r).await == expected },
    )
    .await;
    let stats = w.stats().await.unwrap();
    assert!(stats.segment_compactions >= 5, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_gets_its_entries_back_but_never_adopts_segments_it_cannot_prove_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // Every publish compacts, so the next segment after the wipe shows what node-a owns.
    let mut a = start_node(
        Kind::Process,
        &dir.path().join("a"),
        &shared,
        "node-a",
        &["--snapshot-compact-segments", "1"],
    )
    .await;
    let b = start_node(
        Kind::InProcess,
        &dir.path().join("b"),
        &shared,
        "node-b",
        &[],
    )
    .await;
    let client_a = a.client().await;
    publish(&client_a, numbered("own", 0..100, "node-a")).await;
    publish(&b.client().await, numbered("peer", 0..50, "node-b")).await;
    eventually(
        Duration::from_secs(30),
        "node-a learns node-b's entries",
        || async { entries(&client_a).await == 150 },
    )
    .await;
    let before_wipe = segments_of(&shared, "node-a");

    a.terminate(Duration::from_secs(10));
    std::fs::remove_dir_all(&a.state_dir).unwrap();
    a.restart().await;
    let client_a = a.client().await;
    eventually(
        Duration::from_secs(30),
        "the wiped node has everything back",
        || async { entries(&client_a).await == 150 },
    )
    .await;
    // A node believes only what its own state directory says it wrote: the old segments
    // carry its name but the wiped node has no record of them, so it reads them like
    // another node's, says so, and never compacts, deletes or renumbers from them. Its next
    // contribution goes into a new segment after them, holding only what is new.
    let stats = client_a.stats().await.unwrap();
    assert!(stats.snapshot_name_conflicts >= 1, "{stats:?}");
    publish(&client_a, numbered("after-wipe", 0..1, "node-a")).await;
    let segments = segments_of(&shared, "node-a");
    for old in &before_wipe {
        assert!(segments.contains(old), "{old:?} was removed: {segments:?}");
    }
    let new: Vec<_> = segments
        .iter()
        .filter(|s| !before_wipe.contains(s))
        .collect();
    assert_eq!(new.len(), 1, "{segments:?}");
    let document: serde_json::Value =
        serde_json::from_slice(&std::fs::read(new[0]).unwrap()).unwrap();
    let problems: Vec<&str> = document["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["problem"].as_str().unwrap())
        .collect();
    assert_eq!(problems, vec!["after-wipe-0"]);
    assert!(a.log().contains("did not write"), "{}", a.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_file_is_merged_and_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let old_entries: Vec<_> = (0..30)
        .map(|i| {
            serde_json::json!({"namespace": "test", "op": "gemm", "device": "test-device",
                "problem": format!("old-{i}"), "config": "{}", "time_us": 2.0,
                "tuned_by": "old-node", "tuned_at_unix_ms": 1})
        })
        .collect();
    let document = serde_json::json!({"format": "tunecache-snapshot", "version": 1,
        "node": "old-node", "written_at_unix_ms": 1, "entry_count": 30, "entries": old_entries});
    std::fs::write(
        shared.join("old-node.tunecache.json"),
        serde_json::to_vec(&document).unwrap(),
    )
    .unwrap();
    let node = start_node(
        Kind::InProcess,
        &dir.path().join("n"),
        &shared,
        "node-n",
        &[],
    )
    .await;
    let client = node.client().await;
    eventually(Duration::from_secs(20), "the v1 file is merged", || async {
        entries(&client).await == 30
    })
    .await;
    publish(&client, numbered("mine", 0..3, "node-n")).await;
    // The version-1 file is learned, not republished; no version-1 file is written.
    let published = published_by(&shared, "node-n");
    assert_eq!(published.len(), 3, "{published:?}");
    assert!(!shared.join("node-n.tunecache.json").exists());
    let stats = client.stats().await.unwrap();
    assert!(stats.peer_files_loaded >= 1, "{stats:?}");
}

async fn start_node(
    kind: Kind,
    dir: &Path,
    shared: &Path,
    node: &str,
    extra: &[&str],
) -> TestDaemon {
    tunecache_integration::shared_node(dir, shared, node, 1, extra)
        .start(kind)
        .await
}
