//! The daemon core: record/lookup/scan, the merge rule under concurrency, durability across
//! SIGTERM and SIGKILL, journal damage, validation, the socket's life cycle, health and
//! reflection. The signals, the journal warnings in the log and the second daemon's refusal
//! need the binary as a process; the rest runs the daemon in-process.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use tonic::Code;
use tunecache_client::{key, proto, Client};
use tunecache_integration::{bin, entry, test_key, wait, DaemonOptions, Lazy, TestDaemon};

fn problem(i: usize) -> String {
    format!("m={i},n=4096,k=4096,dtype=f16")
}

fn numbered_entries(range: std::ops::Range<usize>, namespace: &str) -> Vec<proto::Entry> {
    range
        .map(|i| {
            let k = key(
                namespace,
                "gemm",
                &format!("dev{}", i % 3),
                &problem(i),
                None,
            );
            entry(k, &format!(r#"{{"tactic":{i}}}"#), i as f64 + 0.5, "writer")
        })
        .collect()
}

async fn record_all(client: &Client, entries: Vec<proto::Entry>) {
    for chunk in entries.chunks(1000) {
        let response = client.record(chunk.to_vec()).await.expect("record");
        assert_eq!(response.stored as usize, chunk.len());
    }
}

async fn lookup_all(client: &Client, keys: Vec<proto::Key>) -> Vec<proto::Entry> {
    let mut hits = Vec::new();
    for chunk in keys.chunks(1000) {
        hits.extend(client.lookup(chunk.to_vec()).await.expect("lookup"));
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_then_lookup_and_scan_thousands() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;

    let alpha = numbered_entries(0..6000, "alpha");
    let beta = numbered_entries(0..1500, "beta");
    record_all(&client, alpha.clone()).await;
    record_all(&client, beta.clone()).await;

    // Hits only, in request order: ask for every alpha key in reverse with misses between.
    let mut keys = Vec::new();
    for e in alpha.iter().rev() {
        keys.push(e.key.clone().unwrap());
        keys.push(key("alpha", "gemm", "nowhere", "absent", None));
    }
    let hits = lookup_all(&client, keys).await;
    let expected: Vec<proto::Entry> = alpha.iter().rev().cloned().collect();
    assert_eq!(hits, expected);

    let everything = client.scan("", "").await.unwrap();
    assert_eq!(everything.len(), 7500);
    let only_alpha = client.scan("alpha", "").await.unwrap();
    assert_eq!(only_alpha.len(), 6000);
    assert!(only_alpha
        .iter()
        .all(|e| e.key.as_ref().unwrap().namespace == "alpha"));
    let beta_dev1 = client.scan("beta", "dev1").await.unwrap();
    assert_eq!(beta_dev1.len(), 500);

    // Scan streams chunks, not one message per entry.
    let mut raw = client.raw();
    let mut stream = raw
        .scan(proto::ScanRequest {
            namespace: "alpha".into(),
            device: String::new(),
            rank: None,
            view: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut messages = 0;
    let mut total = 0;
    while let Some(chunk) = stream.message().await.unwrap() {
        messages += 1;
        assert!(chunk.entries.len() <= 1024);
        total += chunk.entries.len();
    }
    assert_eq!(total, 6000);
    assert!(
        (6..=10).contains(&messages),
        "{messages} chunks for 6000 entries"
    );

    let stats = client.stats().await.unwrap();
    assert_eq!(stats.entries, 7500);
    assert_eq!(stats.lookups, 12000);
    assert_eq!(stats.hits, 6000);
    assert_eq!(stats.misses, 6000);
    assert_eq!(stats.entries_stored, 7500);
}

/// The winner under the documented rule, computed independently of the daemon.
fn expected_winner(candidates: &[proto::Result]) -> proto::Result {
    let mut best = candidates[0].clone();
    for c in &candidates[1..] {
        let better = (c.time_us, &c.config, &c.tuned_by, c.tuned_at_unix_ms).partial_cmp(&(
            best.time_us,
            &best.config,
            &best.tuned_by,
            best.tuned_at_unix_ms,
        )) == Some(std::cmp::Ordering::Less);
        if better {
            best = c.clone();
        }
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conflicting_records_end_as_the_sequential_merge() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    const CLIENTS: usize = 8;
    const KEYS: usize = 300;

    // Each client holds its own result per key; times collide often so ties matter.
    let result_of = |client: usize, k: usize| proto::Result {
        config: format!(r#"{{"client":{client},"key":{k}}}"#),
        time_us: ((client * 7 + k * 13) % 4) as f64,
        tuned_by: format!("rank{}", (client * 3 + k) % 5),
        tuned_at_unix_ms: ((client + k) % 3) as i64,
        forget_epoch: 0,
        artifacts: Default::default(),
    };
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = daemon.client().await;
        tasks.push(tokio::spawn(async move {
            // Every client walks the keys in its own order, in small batches.
            let mut order: Vec<usize> = (0..KEYS).collect();
            order.rotate_left(c * 37 % KEYS);
            if c % 2 == 1 {
                order.reverse();
            }
            for batch in order.chunks(25) {
                let entries = batch
                    .iter()
                    .map(|&k| proto::Entry {
                        key: Some(test_key("gemm", &problem(k))),
                        result: Some(result_of(c, k)),
                    })
                    .collect();
                client.record(entries).await.expect("record");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let client = daemon.client().await;
    let keys: Vec<proto::Key> = (0..KEYS).map(|k| test_key("gemm", &problem(k))).collect();
    let hits = client.lookup(keys).await.unwrap();
    assert_eq!(hits.len(), KEYS);
    for (k, hit) in hits.iter().enumerate() {
        let candidates: Vec<proto::Result> = (0..CLIENTS).map(|c| result_of(c, k)).collect();
        assert_eq!(
            hit.result.as_ref().unwrap(),
            &expected_winner(&candidates),
            "key {k}"
        );
    }
    let stats = client.stats().await.unwrap();
    assert_eq!(
        stats.entries_stored + stats.entries_unchanged,
        (CLIENTS * KEYS) as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_across_sigterm_and_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // `never` makes the point sharper: acknowledgement means written, not synced, and a
    // killed process loses nothing the kernel already has.
    let options = DaemonOptions::new(dir.path()).args(["--fsync", "never"]);
    let mut daemon = options.process().await;

    let first = numbered_entries(0..2000, "durable");
    record_all(&daemon.client().await, first.clone()).await;
    let (status, _) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "SIGTERM exit: {status}");
    assert_stopped_by_sigterm(&daemon);
    assert!(!daemon.socket.exists(), "socket removed on exit");

    daemon.restart().await;
    let client = daemon.client().await;
    let keys: Vec<proto::Key> = first.iter().map(|e| e.key.clone().unwrap()).collect();
    assert_eq!(lookup_all(&client, keys).await, first);

    // Many concurrent Records, then SIGKILL the moment the last one is acknowledged.
    let second = numbered_entries(2000..4000, "durable");
    let mut tasks = Vec::new();
    for chunk in second.chunks(100) {
        let client = client.clone();
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            client.record(chunk).await.expect("record")
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    daemon.kill();

    daemon.restart().await;
    let client = daemon.client().await;
    let all: Vec<proto::Entry> = first.iter().chain(second.iter()).cloned().collect();
    let keys: Vec<proto::Key> = all.iter().map(|e| e.key.clone().unwrap()).collect();
    assert_eq!(lookup_all(&client, keys).await, all);
}

/// Frame boundaries of a journal: (offset, total length) of each frame.
fn journal_frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut frames = Vec::new();
    let mut pos = 0;
    while pos + 12 <= bytes.len() {
        assert_eq!(&bytes[pos..pos + 4], b"TCJ1", "frame magic at {pos}");
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        frames.push((pos, 12 + len));
        pos += 12 + len;
    }
    frames
}

async fn daemon_with_three_frames(dir: &std::path::Path) -> (TestDaemon, Vec<Vec<proto::Entry>>) {
    let mut daemon = TestDaemon::process(dir).await;
    let client = daemon.client().await;
    let batches: Vec<Vec<proto::Entry>> = (0..3)
        .map(|b| numbered_entries(b * 100..(b + 1) * 100, "journal"))
        .collect();
    for batch in &batches {
        client.record(batch.clone()).await.unwrap();
    }
    daemon.terminate(Duration::from_secs(10));
    (daemon, batches)
}

async fn present(daemon: &TestDaemon, entries: &[proto::Entry]) -> usize {
    let keys = entries.iter().map(|e| e.key.clone().unwrap()).collect();
    let hits = daemon.client().await.lookup(keys).await.unwrap();
    for hit in &hits {
        assert!(
            entries.contains(hit),
            "a hit that was never recorded: {hit:?}"
        );
    }
    hits.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_journal_tail_is_truncated_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, batches) = daemon_with_three_frames(dir.path()).await;
    let journal = daemon.state_dir.join("journal");
    let bytes = std::fs::read(&journal).unwrap();
    let frames = journal_frames(&bytes);
    assert_eq!(frames.len(), 3);
    // Cut the last frame short, as a crash in the middle of a write would.
    std::fs::write(&journal, &bytes[..bytes.len() - 40]).unwrap();

    daemon.restart().await;
    assert_eq!(present(&daemon, &batches[0]).await, 100);
    assert_eq!(present(&daemon, &batches[1]).await, 100);
    assert_eq!(present(&daemon, &batches[2]).await, 0);
    let log = daemon.log();
    assert_eq!(log.matches("truncated a torn tail").count(), 1, "{log}");
    assert!(log.contains(&format!("offset={}", frames[2].0)), "{log}");
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len() as usize,
        frames[2].0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_inside_the_journal_is_skipped_and_intact_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, batches) = daemon_with_three_frames(dir.path()).await;
    let journal = daemon.state_dir.join("journal");
    let bytes = std::fs::read(&journal).unwrap();
    let frames = journal_frames(&bytes);

    // Garbage inserted between frames 0 and 1, and the payload of frame 1 overwritten.
    let garbage: Vec<u8> = (0..97u8).map(|i| i.wrapping_mul(31) ^ 0x5a).collect();
    let mut damaged = bytes[..frames[1].0].to_vec();
    damaged.extend_from_slice(&garbage);
    let mut frame1 = bytes[frames[1].0..frames[2].0].to_vec();
    for b in &mut frame1[20..60] {
        *b = 0xEE;
    }
    damaged.extend_from_slice(&frame1);
    damaged.extend_from_slice(&bytes[frames[2].0..]);
    std::fs::write(&journal, &damaged).unwrap();

    daemon.restart().await;
    assert_eq!(present(&daemon, &batches[0]).await, 100);
    assert_eq!(present(&daemon, &batches[1]).await, 0);
    assert_eq!(present(&daemon, &batches[2]).await, 100);
    let log = daemon.log();
    assert!(log.contains("skipped a damaged stretch"), "{log}");
    assert!(log.contains(&format!("offset={}", frames[1].0)), "{log}");
    let kept_copies = std::fs::read_dir(&daemon.state_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("journal.corrupt.")
        })
        .count();
    assert_eq!(kept_copies, 1);

    // The journal was rewritten clean: a second restart reports nothing.
    daemon.terminate(Duration::from_secs(10));
    let warnings_before = daemon.log().matches("damaged stretch").count();
    daemon.restart().await;
    assert_eq!(
        daemon.log().matches("damaged stretch").count(),
        warnings_before
    );
    assert_eq!(present(&daemon, &batches[2]).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_rule_refuses_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    let good = |i: usize| entry(test_key("gemm", &problem(i)), "{}", 1.0, "t");

    let long = "x".repeat(4097);
    let huge_config = format!("\"{}\"", "y".repeat(64 * 1024));
    let mut cases: Vec<(proto::Entry, &str)> = Vec::new();
    let mut with_key = |f: &dyn Fn(&mut proto::Key), path: &'static str| {
        let mut e = good(99);
        f(e.key.as_mut().unwrap());
        cases.push((e, path));
    };
    with_key(&|k| k.namespace.clear(), "entries[2].key.namespace");
    with_key(&|k| k.op.clear(), "entries[2].key.op");
    with_key(&|k| k.namespace = long.clone(), "entries[2].key.namespace");
    with_key(&|k| k.op = long.clone(), "entries[2].key.op");
    with_key(&|k| k.device = long.clone(), "entries[2].key.device");
    with_key(&|k| k.problem = long.clone(), "entries[2].key.problem");
    let mut with_result = |f: &dyn Fn(&mut proto::Result), path: &'static str| {
        let mut e = good(99);
        f(e.result.as_mut().unwrap());
        cases.push((e, path));
    };
    with_result(
        &|r| r.config = "{\"unterminated\": ".into(),
        "entries[2].result.config",
    );
    with_result(&|r| r.config = String::new(), "entries[2].result.config");
    with_result(
        &|r| r.config = huge_config.clone(),
        "entries[2].result.config",
    );
    with_result(&|r| r.time_us = f64::NAN, "entries[2].result.time_us");
    with_result(&|r| r.time_us = f64::INFINITY, "entries[2].result.time_us");
    with_result(&|r| r.time_us = -0.5, "entries[2].result.time_us");
    with_result(&|r| r.tuned_by = long.clone(), "entries[2].result.tuned_by");
    cases.push((
        proto::Entry {
            key: None,
            result: good(99).result,
        },
        "entries[2].key",
    ));
    cases.push((
        proto::Entry {
            key: good(99).key,
            result: None,
        },
        "entries[2].result",
    ));

    for (bad, path) in cases {
        let batch = vec![good(0), good(1), bad, good(3)];
        let error = client.record(batch).await.expect_err(path);
        let tunecache_client::ClientError::Rpc(status) = error else {
            panic!("{error}")
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{path}");
        assert!(
            status.message().starts_with(path),
            "{path}: {}",
            status.message()
        );
        // The same field path, structured: the google.rpc.BadRequest detail clients read.
        let violations = tonic_types::StatusExt::get_details_bad_request(&status)
            .unwrap_or_else(|| panic!("{path}: no BadRequest detail"))
            .field_violations;
        assert_eq!(violations.len(), 1, "{path}");
        assert_eq!(violations[0].field, path);
        assert_eq!(
            format!("{}: {}", violations[0].field, violations[0].description),
            status.message()
        );
        assert_eq!(
            tunecache_client::refused_entry_index(&status),
            Some(2),
            "{path}"
        );
    }
    let too_many: Vec<proto::Entry> = (0..10_001).map(good).collect();
    let error = client.record(too_many).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("entries: more than 10000 items, at most 10000 per request"),
        "{error}"
    );
    let mut keys: Vec<proto::Key> = (0..3).map(|i| test_key("gemm", &problem(i))).collect();
    keys[1].op.clear();
    let error = client.lookup(keys).await.unwrap_err();
    assert!(
        error.to_string().contains("keys[1].op: must not be empty"),
        "{error}"
    );

    // Nothing of any refused batch was applied.
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.entries, 0);
    assert_eq!(stats.journal_bytes, 0);
    let probe = client.lookup(vec![good(0).key.unwrap()]).await.unwrap();
    assert!(probe.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_life_cycle() {
    let dir = tempfile::tempdir().unwrap();
    // A stale socket from a crashed daemon: bound, then its listener gone.
    let socket = dir.path().join("tunecache.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let mut daemon = TestDaemon::process(dir.path()).await;
    let mode = std::fs::metadata(&daemon.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660);

    // A second daemon on a live socket refuses to start, and says why.
    let other_state = dir.path().join("other-state");
    let output = std::process::Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("--state-dir")
        .arg(&other_state)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already serving"), "{stderr}");
    assert!(
        daemon.client().await.stats().await.is_ok(),
        "first daemon unharmed"
    );

    let (status, _) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success());
    assert_stopped_by_sigterm(&daemon);
    assert!(!daemon.socket.exists());

    // A regular file where the socket should be is not ours to delete.
    std::fs::write(&socket, b"not a socket").unwrap();
    let output = std::process::Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(&other_state)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read(&socket).unwrap(), b"not a socket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_serving_and_reflection_in_v1_and_v1alpha() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let channel = tunecache_client::connect_channel(&daemon.socket)
        .await
        .unwrap();

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "tunecache.v1.TuneCache"] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            response.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }

    // v1 and v1alpha have the same shape in different modules; check both the same way.
    macro_rules! listed_services {
        ($pb:path) => {{
            use pb::server_reflection_request::MessageRequest;
            use pb::server_reflection_response::MessageResponse;
            use $pb as pb;
            let request = pb::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut reflection =
                pb::server_reflection_client::ServerReflectionClient::new(channel.clone());
            let mut responses = reflection
                .server_reflection_info(futures::stream::iter(vec![request]))
                .await
                .unwrap()
                .into_inner();
            let response = responses.message().await.unwrap().unwrap();
            let Some(MessageResponse::ListServicesResponse(list)) = response.message_response
            else {
                panic!("unexpected reflection response from {}", stringify!($pb));
            };
            list.service
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<String>>()
        }};
    }
    let v1 = listed_services!(tonic_reflection::pb::v1);
    assert!(v1.contains(&"tunecache.v1.TuneCache".to_owned()), "{v1:?}");
    let v1alpha = listed_services!(tonic_reflection::pb::v1alpha);
    assert!(
        v1alpha.contains(&"tunecache.v1.TuneCache".to_owned()),
        "{v1alpha:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_is_compacted_and_replays_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    // Ten rounds of improvements to the same 2,000 keys: the journal holds ten versions of
    // each entry until compaction rewrites it with the live ones only.
    let round = |r: usize| -> Vec<proto::Entry> {
        (0..2000)
            .map(|i| {
                entry(
                    test_key("gemm", &problem(i)),
                    &format!(r#"{{"round":{r},"pad":"{}"}}"#, "p".repeat(40)),
                    1000.0 - r as f64,
                    "t",
                )
            })
            .collect()
    };
    for r in 0..10 {
        record_all(&client, round(r)).await;
    }
    // Compaction runs right after a group is acknowledged; give the last one a moment.
    let (client, last) = (&client, &std::sync::Mutex::new(None));
    let compacted = Lazy(|| format!("compaction (last Stats {:?})", last.lock().unwrap()));
    let stats = wait(Duration::from_secs(10), compacted)
        .until_some_async(move || async move {
            let stats = client.stats().await.unwrap();
            if stats.journal_bytes <= (1 << 20).max(2 * stats.journal_live_bytes) {
                return Some(stats);
            }
            *last.lock().unwrap() = Some(stats);
            None
        })
        .await;
    assert!(stats.journal_compactions >= 1, "{stats:?}");
    assert_eq!(stats.entries, 2000);

    daemon.stop().await;
    daemon.restart().await;
    let last = round(9);
    let keys = last.iter().map(|e| e.key.clone().unwrap()).collect();
    assert_eq!(lookup_all(&daemon.client().await, keys).await, last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_scan_returns_the_shared_entries_and_that_ranks_own() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    // The same problem shared, and as the own entry of ranks 0..4; plus another namespace.
    let mut entries = Vec::new();
    for p in 0..10 {
        for rank in [None, Some(0), Some(1), Some(2), Some(3)] {
            let k = key("trtllm", "gemm", "dev", &problem(p), rank);
            entries.push(entry(k, "{}", 1.0, "t"));
        }
        entries.push(entry(
            key("other", "gemm", "dev", &problem(p), Some(2)),
            "{}",
            1.0,
            "t",
        ));
    }
    client.record(entries).await.unwrap();

    let for_rank_2 = client.scan_for_rank("trtllm", "", 2).await.unwrap();
    assert_eq!(for_rank_2.len(), 20);
    for e in &for_rank_2 {
        let k = e.key.as_ref().unwrap();
        assert_eq!(k.namespace, "trtllm");
        assert!(k.rank.is_none() || k.rank == Some(2), "{k:?}");
    }
    assert_eq!(client.scan_for_rank("", "", 3).await.unwrap().len(), 20);
    assert_eq!(client.scan_for_rank("", "", 9).await.unwrap().len(), 10);
    assert_eq!(client.scan("trtllm", "").await.unwrap().len(), 50);
}

/// The daemon went through its SIGTERM path to the end (drain, flush, socket removal), as
/// its log says, rather than merely exiting 0.
fn assert_stopped_by_sigterm(daemon: &TestDaemon) {
    let log = daemon.log();
    let received = log
        .find("SIGTERM received")
        .expect("no `SIGTERM received` in the log");
    let stopped = log
        .rfind("tunecached stopped")
        .expect("no `tunecached stopped` in the log");
    assert!(received < stopped, "stopped before SIGTERM arrived:\n{log}");
}
