//! Who may speak in the shared directory, against real daemons: a forged segment name cannot
//! cut a node off or make it delete its data, a file from a uid that is not an allowed writer
//! (or without the shared key's MAC) is never served, a symlinked or world-writable `v2/` is
//! refused, two daemons given one name are reported, a bad entry is dropped alone, and a
//! node name that breaks the rule stops the start. A daemon whose log is read runs as a
//! process; the others run in-process.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tunecache_client::Client;
use tunecache_integration::{
    bin, eventually, numbered, require_root, shared_node, test_key, TestDaemon,
};

/// A version-2 segment of `node` covering `first..=last` with one entry `problem`, written
/// as a stranger would write it (no MAC).
fn forge_segment(
    shared: &Path,
    node: &str,
    first: u64,
    last: u64,
    problem: &str,
) -> std::path::PathBuf {
    let document = serde_json::json!({
        "format": "tunecache-snapshot", "version": 2, "node": node,
        "first_seq": first, "last_seq": last, "written_at_unix_ms": 0, "entry_count": 1,
        "entries": [{"namespace": "test", "op": "gemm", "device": "test-device",
                     "problem": problem, "config": "{\"forged\":1}", "time_us": 0.0,
                     "tuned_by": format!("{node}/rank0"), "tuned_at_unix_ms": 1}]
    });
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    let path = v2.join(format!("{node}.{first:016x}-{last:016x}.seg.json"));
    std::fs::write(&path, serde_json::to_vec(&document).unwrap()).unwrap();
    path
}

async fn holds(client: &Client, problem: &str) -> bool {
    client
        .lookup(vec![test_key("gemm", problem)])
        .await
        .is_ok_and(|hits| !hits.is_empty())
}

async fn record(daemon: &TestDaemon, entries: Vec<tunecache_client::proto::Entry>) {
    daemon.client().await.record(entries).await.unwrap();
}

/// Records `entries` on `daemon` and waits until a periodic pass has published them: one
/// segment of their own.
async fn record_and_publish(daemon: &TestDaemon, entries: Vec<tunecache_client::proto::Entry>) {
    let written = daemon.stats().await.snapshots_written;
    record(daemon, entries).await;
    daemon
        .wait_for_stats("a periodic pass publishes the new entries", |s| {
            s.snapshots_written > written
        })
        .await;
}

fn own_segments(shared: &Path, node: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{node}.")) && n.ends_with(".seg.json"))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_segment_ranges_neither_cut_a_node_off_nor_make_it_delete_its_data() {
    for (variant, (first, last)) in [(1u64, u64::MAX), (1 << 32, 1 << 32)]
        .into_iter()
        .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir_all(&shared).unwrap();
        let mut a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
            .in_process()
            .await;
        let b = shared_node(&dir.path().join("b"), &shared, "B", 1, &[])
            .in_process()
            .await;
        record(&a, numbered("before", 0..3, "A")).await;
        let client_b = b.client().await;
        eventually(
            Duration::from_secs(10),
            "B learns A's first results",
            || async { holds(&client_b, "before-2").await },
        )
        .await;
        let real = own_segments(&shared, "A");
        forge_segment(&shared, "A", first, last, "forged");
        // A's later results still reach B, one segment at a time.
        for i in 0..4 {
            record(&a, numbered(&format!("after{i}"), 0..1, "A")).await;
            eventually(
                Duration::from_secs(10),
                "B learns A's next result",
                || async { holds(&client_b, &format!("after{i}-0")).await },
            )
            .await;
        }
        for name in &real {
            assert!(
                own_segments(&shared, "A").contains(name),
                "variant {variant}: A removed {name}"
            );
        }
        assert!(
            !holds(&client_b, "forged").await,
            "variant {variant}: B served the forged entry"
        );
        // A fresh node gets everything of A's, and nothing forged.
        let c = shared_node(&dir.path().join("c"), &shared, "C", 1, &[])
            .in_process()
            .await;
        let client_c = c.client().await;
        eventually(Duration::from_secs(10), "C learns all of A", || async {
            holds(&client_c, "before-0").await && holds(&client_c, "after3-0").await
        })
        .await;
        // After a restart A neither adopts the forged entry nor wraps its numbering.
        a.stop().await;
        a.restart().await;
        record(&a, numbered("restarted", 0..1, "A")).await;
        eventually(
            Duration::from_secs(10),
            "B learns A's result after its restart",
            || async { holds(&client_b, "restarted-0").await },
        )
        .await;
        assert!(
            !holds(&a.client().await, "forged").await,
            "A adopted the forged entry"
        );
        assert!(
            !own_segments(&shared, "A")
                .iter()
                .any(|n| n.starts_with("A.0000000000000000")),
            "{:?}",
            own_segments(&shared, "A")
        );
    }
}

/// Makes `path` belong to uid and gid 65534 (nobody), as if that user had written it.
fn give_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_a_uid_that_is_not_an_allowed_writer_is_never_served() {
    if !require_root("chown to another uid") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(shared.join("v2")).unwrap();
    std::fs::set_permissions(shared.join("v2"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .process()
        .await;
    let b = shared_node(&dir.path().join("b"), &shared, "B", 1, &[])
        .in_process()
        .await;
    let forged = forge_segment(&shared, "Z", 1, 1, "from-nobody");
    give_to_nobody(&forged);
    record(&b, numbered("honest", 0..1, "B")).await;
    let client_a = a.client().await;
    eventually(
        Duration::from_secs(10),
        "A learns B's honest result",
        || async { holds(&client_a, "honest-0").await },
    )
    .await;
    // A has met the stranger's file and refused it, not merely not reached it yet.
    a.wait_for_stats("A refuses the file of uid 65534", |s| {
        s.snapshot_untrusted_files >= 1
    })
    .await;
    assert!(
        !holds(&client_a, "from-nobody").await,
        "A served a file uid 65534 wrote"
    );
    let stats = client_a.stats().await.unwrap();
    assert!(stats.snapshot_untrusted_files >= 1, "{stats:?}");
    assert!(a.log().contains("not an allowed writer"), "{}", a.log());
    // Listing that uid as a writer lets its file count.
    let c = shared_node(
        &dir.path().join("c"),
        &shared,
        "C",
        1,
        &["--shared-dir-writer-uid", "0,65534"],
    )
    .in_process()
    .await;
    let client_c = c.client().await;
    eventually(
        Duration::from_secs(10),
        "C, trusting 65534, reads its file",
        || async { holds(&client_c, "from-nobody").await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_writable_v2_is_refused_without_a_key_and_a_key_admits_only_its_macs() {
    if !require_root("chown to another uid") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::set_permissions(&v2, std::fs::Permissions::from_mode(0o777)).unwrap();
    let forged = forge_segment(&shared, "A", 1, 1, "planted");
    give_to_nobody(&forged);

    // No key: the daemon refuses a v2/ anyone can write, naming path, owner and mode.
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .in_process()
        .await;
    let client_a = a.client().await;
    eventually(
        Duration::from_secs(10),
        "A reports the unsafe v2/",
        || async {
            client_a
                .stats()
                .await
                .is_ok_and(|s| s.last_snapshot_error.contains("refusing to use"))
        },
    )
    .await;
    let error = client_a.stats().await.unwrap().last_snapshot_error;
    assert!(
        error.contains("0777") && error.contains("owner uid 0"),
        "{error}"
    );
    assert!(!holds(&client_a, "planted").await);
    drop(a);

    // With a key, group- or world-writable is allowed, and only MACed files count.
    let key = dir.path().join("cluster.key");
    std::fs::write(&key, "a-cluster-secret-of-32-bytes-0123\n").unwrap();
    // Private, as a key must be (a key others can read is refused at start).
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key_arg = key.to_str().unwrap().to_owned();
    let flags = ["--shared-dir-key-file", key_arg.as_str()];
    let b = shared_node(&dir.path().join("b"), &shared, "B", 1, &flags)
        .in_process()
        .await;
    let c = shared_node(&dir.path().join("c"), &shared, "C", 1, &flags)
        .in_process()
        .await;
    record(&b, numbered("keyed", 0..2, "B")).await;
    let client_c = c.client().await;
    eventually(
        Duration::from_secs(10),
        "C learns B's MACed segment",
        || async { holds(&client_c, "keyed-1").await },
    )
    .await;
    assert!(
        !holds(&client_c, "planted").await,
        "C served a file without a MAC"
    );
    let stats = client_c.stats().await.unwrap();
    assert!(stats.snapshot_untrusted_files >= 1, "{stats:?}");
    // A node without the key cannot read... it can (the MAC is a plain JSON member), but a
    // node with another key refuses everything.
    let other_key = dir.path().join("other.key");
    std::fs::write(&other_key, "another-secret-of-enough-bytes!!\n").unwrap();
    std::fs::set_permissions(&other_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let other_arg = other_key.to_str().unwrap().to_owned();
    let d = shared_node(
        &dir.path().join("d"),
        &shared,
        "D",
        1,
        &["--shared-dir-key-file", other_arg.as_str()],
    )
    .in_process()
    .await;
    // Two whole passes: D has listed and judged every file, B's segments included.
    d.wait_for_snapshot_passes(2).await;
    assert!(
        !holds(&d.client().await, "keyed-0").await,
        "D accepted another key's MAC"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_v2_is_refused_and_nothing_is_written_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::create_dir_all(&target).unwrap();
    std::os::unix::fs::symlink(&target, shared.join("v2")).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .in_process()
        .await;
    record(&a, numbered("own", 0..2, "A")).await;
    let client_a = a.client().await;
    eventually(
        Duration::from_secs(10),
        "A reports the symlinked v2/",
        || async {
            client_a
                .stats()
                .await
                .is_ok_and(|s| s.last_snapshot_error.contains("symbolic link"))
        },
    )
    .await;
    // More passes, each with A's own entries to publish: none goes through the link.
    a.wait_for_snapshot_passes(2).await;
    let written: Vec<_> = std::fs::read_dir(&target).unwrap().collect();
    assert!(
        written.is_empty(),
        "wrote into the symlink's target: {written:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_given_one_name_are_reported_within_an_interval() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let first = shared_node(&dir.path().join("one"), &shared, "same", 1, &[])
        .process()
        .await;
    let second = shared_node(&dir.path().join("two"), &shared, "same", 1, &[])
        .process()
        .await;
    record(&first, numbered("one", 0..1, "same")).await;
    record(&second, numbered("two", 0..1, "same")).await;
    for (daemon, other) in [(&first, "two-0"), (&second, "one-0")] {
        let client = daemon.client().await;
        eventually(
            Duration::from_secs(10),
            "each reports the other",
            || async {
                client
                    .stats()
                    .await
                    .is_ok_and(|s| s.snapshot_name_conflicts >= 1)
            },
        )
        .await;
        // Neither loses the other's result: each reads the other's segments as a peer's.
        eventually(
            Duration::from_secs(10),
            "each learns the other's result",
            || async { holds(&client, other).await },
        )
        .await;
        assert!(
            daemon.log().contains("same --node-name"),
            "{}",
            daemon.log()
        );
    }
    // A third node gets both.
    let third = shared_node(&dir.path().join("three"), &shared, "third", 1, &[])
        .in_process()
        .await;
    let client = third.client().await;
    eventually(
        Duration::from_secs(10),
        "a third node gets both",
        || async { holds(&client, "one-0").await && holds(&client, "two-0").await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_with_an_impossible_time_is_dropped_alone() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::set_permissions(&v2, std::fs::Permissions::from_mode(0o755)).unwrap();
    let good = |problem: &str| {
        format!(
            r#"{{"namespace":"test","op":"gemm","device":"test-device","problem":"{problem}","config":"{{}}","time_us":2.5,"tuned_by":"P","tuned_at_unix_ms":1}}"#
        )
    };
    let huge = good("huge").replace("2.5", "1e999");
    let text = good("text").replace("2.5", "\"fast\"");
    let document = format!(
        r#"{{"format":"tunecache-snapshot","version":2,"node":"P","first_seq":1,"last_seq":1,"written_at_unix_ms":0,"entry_count":4,"entries":[{},{huge},{text},{}]}}"#,
        good("good-1"),
        good("good-2")
    );
    std::fs::write(
        v2.join("P.0000000000000001-0000000000000001.seg.json"),
        document,
    )
    .unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .in_process()
        .await;
    let client = a.client().await;
    eventually(Duration::from_secs(10), "the good entries load", || async {
        holds(&client, "good-1").await && holds(&client, "good-2").await
    })
    .await;
    assert!(!holds(&client, "huge").await && !holds(&client, "text").await);
    assert_eq!(client.stats().await.unwrap().snapshot_invalid_entries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_that_breaks_the_rule_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let long = "n".repeat(240);
    for bad in [long.as_str(), "bad\nname", ".hidden"] {
        let output = std::process::Command::new(bin("tunecached"))
            .arg("--socket")
            .arg(dir.path().join("t.sock"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--node-name", bad])
            .env_remove("TUNECACHE_SOCKET")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{bad:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("1 to 64"), "{bad:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_v2_is_refilled_by_the_running_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .process()
        .await;
    record(&a, numbered("early", 0..3, "A")).await;
    let a_client = a.client().await;
    eventually(Duration::from_secs(10), "A publishes", || async {
        a_client
            .stats()
            .await
            .is_ok_and(|s| s.own_entries_published == 3)
    })
    .await;
    std::fs::remove_dir_all(shared.join("v2")).unwrap();
    record(&a, numbered("late", 0..1, "A")).await;
    // A node that joins after the removal still gets all four of A's results.
    let c = shared_node(&dir.path().join("c"), &shared, "C", 1, &[])
        .in_process()
        .await;
    let client_c = c.client().await;
    eventually(
        Duration::from_secs(15),
        "C gets all of A's results",
        || async {
            holds(&client_c, "early-0").await
                && holds(&client_c, "early-2").await
                && holds(&client_c, "late-0").await
        },
    )
    .await;
    assert!(
        a.log().contains("gone from the shared directory"),
        "{}",
        a.log()
    );
}

/// Arbitrary names and contents, as a buggy or hostile writer of the shared directory would
/// leave them, beside two honest nodes: the honest nodes still converge and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_files_in_v2_never_cost_the_honest_nodes_an_entry() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    // Anyone may write here; the shared key is what tells the honest nodes' files apart.
    std::fs::set_permissions(&v2, std::fs::Permissions::from_mode(0o777)).unwrap();
    let key = dir.path().join("cluster.key");
    std::fs::write(&key, "the-honest-nodes-share-this-key\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key_arg = key.to_str().unwrap().to_owned();
    let flags = ["--shared-dir-key-file", key_arg.as_str()];
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &flags)
        .in_process()
        .await;
    let b = shared_node(&dir.path().join("b"), &shared, "B", 1, &flags)
        .in_process()
        .await;

    // Names: honest nodes' names with any range, other names, junk; contents: valid
    // segments that lie about node or range, truncated JSON, random bytes.
    let node = prop_oneof![Just("A".to_owned()), Just("B".to_owned()), "[a-zA-Z.]{1,8}"];
    let range = prop_oneof![
        (1u64..8).prop_map(|n| (n, n)),
        (1u64..8, 0u64..8).prop_map(|(f, l)| (f, f + l)),
        Just((1, u64::MAX)),
        Just((1 << 32, 1 << 32)),
    ];
    let content = prop_oneof![
        (node.clone(), range.clone()).prop_map(|(n, (f, l))| serde_json::json!({
            "format": "tunecache-snapshot", "version": 2, "node": n, "first_seq": f,
            "last_seq": l, "entries": [{"namespace": "test", "op": "gemm",
            "device": "test-device", "problem": "honest-0", "config": "{\"evil\":1}",
            "time_us": 0.0, "tuned_by": "evil", "tuned_at_unix_ms": 0}]
        })
        .to_string()),
        "\\PC{0,64}",
        Just("{\"format\":\"tunecache-snapshot\",\"version\":2,\"entries\":[".to_owned()),
    ];
    let file = (node, range, content);
    let mut runner = TestRunner::deterministic();
    let mut written = 0;
    for round in 0..4 {
        for _ in 0..8 {
            let (node, (first, last), content) = file.new_tree(&mut runner).unwrap().current();
            let name = format!("{node}.{first:016x}-{last:016x}.seg.json");
            // Written without the key's MAC, as anyone but the honest nodes would.
            if std::fs::write(v2.join(&name), content).is_ok() {
                written += 1;
            }
        }
        record(&a, numbered(&format!("a{round}"), 0..5, "A")).await;
        record(&b, numbered(&format!("b{round}"), 0..5, "B")).await;
    }
    eprintln!("{written} arbitrary files written beside two honest nodes");
    for daemon in [&a, &b] {
        let client = daemon.client().await;
        eventually(
            Duration::from_secs(20),
            "every honest entry everywhere",
            || async {
                let mut all = true;
                for round in 0..4 {
                    for who in ["a", "b"] {
                        for i in 0..5 {
                            all &= holds(&client, &format!("{who}{round}-{i}")).await;
                        }
                    }
                }
                all
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_name_with_a_newline_cannot_fake_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::set_permissions(&v2, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = "ERROR tunecache_server: the cache is corrupt, delete it";
    let name = format!("x\n{fake}.0000000000000001-0000000000000001.seg.json");
    std::fs::write(v2.join(&name), b"not json").unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "A", 1, &[])
        .process()
        .await;
    let client = a.client().await;
    eventually(
        Duration::from_secs(10),
        "the file is warned about",
        || async {
            client
                .stats()
                .await
                .is_ok_and(|s| s.peer_files_skipped >= 1)
        },
    )
    .await;
    let log = a.log();
    assert!(
        !log.lines().any(|line| line.starts_with(fake)),
        "a file name wrote a log line of its own:\n{log}"
    );
    assert!(
        log.contains("x\\nERROR"),
        "the name is logged escaped:\n{log}"
    );
}

/// An upgrade from a daemon that kept no record of its segments: the old ones are read like a
/// peer's, and the node still compacts what it writes from then on (they lie before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_record_of_its_old_segments_still_compacts_its_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let compact = ["--snapshot-compact-segments", "2"];
    let mut a = shared_node(&dir.path().join("a"), &shared, "A", 1, &compact)
        .in_process()
        .await;
    for i in 0..2 {
        record_and_publish(&a, numbered(&format!("old{i}"), 0..1, "A")).await;
    }
    let old = own_segments(&shared, "A");
    a.stop().await;
    std::fs::remove_file(a.state_dir.join("shared-segments.json")).unwrap();
    a.restart().await;
    for i in 0..5 {
        record_and_publish(&a, numbered(&format!("new{i}"), 0..1, "A")).await;
    }
    let now = own_segments(&shared, "A");
    let new: Vec<_> = now.iter().filter(|n| !old.contains(n)).collect();
    assert!(
        old.iter().all(|n| now.contains(n)),
        "old segments removed: {old:?} -> {now:?}"
    );
    assert!(
        new.len() <= 3,
        "the new segments were never compacted: {new:?}"
    );
    let stats = a.client().await.stats().await.unwrap();
    assert!(stats.segment_compactions >= 1, "{stats:?}");
}

/// Of the entries `problems` names, how many `client` serves.
async fn served(client: &Client, problems: &[String]) -> usize {
    let keys = problems.iter().map(|p| test_key("gemm", p)).collect();
    client.lookup(keys).await.unwrap().len()
}

/// Issue 39 finding 10b: B published 10 entries, A forgot them with a scope Forget, and
/// A's only segment, holding that one tombstone, was deleted. A must publish the tombstone
/// again, under a name a fresh reader takes at once: a node that starts afterwards serves
/// none of the forgotten entries, from its first pass on (B's segment still holds them).
/// Passes are driven by Snapshot calls; the hourly interval adds only each node's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_only_segment_vanished_publishes_its_forget_again() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // A's log is read: a process.
    let a = shared_node(&dir.path().join("a"), &shared, "A", 3600, &[])
        .process()
        .await;
    let b = shared_node(&dir.path().join("b"), &shared, "B", 3600, &[])
        .in_process()
        .await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    let problems: Vec<String> = (0..10).map(|i| format!("forgotten-{i}")).collect();
    record(&b, numbered("forgotten", 0..10, "B")).await;
    client_b.snapshot().await.unwrap();
    client_a.snapshot().await.unwrap();
    assert_eq!(
        served(&client_a, &problems).await,
        10,
        "A learned B's entries"
    );

    let forget = tunecache_client::proto::ForgetRequest {
        namespace: "test".into(),
        op: "gemm".into(),
        ..Default::default()
    };
    client_a.forget(forget).await.unwrap();
    assert_eq!(served(&client_a, &problems).await, 0);
    client_a.snapshot().await.unwrap();
    let only = own_segments(&shared, "A");
    assert_eq!(only.len(), 1, "A's one segment, its Forget: {only:?}");
    client_b.snapshot().await.unwrap();
    assert_eq!(
        served(&client_b, &problems).await,
        0,
        "B learned the Forget"
    );
    assert_eq!(
        own_segments(&shared, "B").len(),
        1,
        "B's segment still holds the entries"
    );

    std::fs::remove_file(shared.join("v2").join(&only[0])).unwrap();
    client_a.snapshot().await.unwrap();
    assert!(
        a.log().contains("gone from the shared directory"),
        "A did not notice: {}",
        a.log()
    );
    let republished = own_segments(&shared, "A");

    let c = shared_node(&dir.path().join("c"), &shared, "C", 3600, &[])
        .in_process()
        .await;
    let client_c = c.client().await;
    eventually(Duration::from_secs(10), "C's first pass", || async {
        client_c.stats().await.is_ok_and(|s| s.snapshot_passes >= 1)
    })
    .await;
    let stats = client_c.stats().await.unwrap();
    assert!(stats.peer_segments_loaded >= 1, "C read nothing: {stats:?}");
    let forgotten = served(&client_c, &problems).await;
    assert_eq!(
        forgotten, 0,
        "a fresh node served {forgotten} of 10 forgotten entries after its first pass \
         (A's segments: {republished:?})"
    );
    assert_eq!(republished.len(), 1, "A's segment, its Forget again");
    client_c.snapshot().await.unwrap();
    assert_eq!(served(&client_c, &problems).await, 0);
}
