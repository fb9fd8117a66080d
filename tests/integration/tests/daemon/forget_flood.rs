//! Forget floods against the real daemon (issue 39, finding 5):
//!
//! - exact-key (`only_if`) Forgets, open to every allowed caller, are held to a per-uid
//!   budget (`--max-exact-forgets-per-uid`): past it they are refused RESOURCE_EXHAUSTED
//!   naming the flag, and nothing of them reaches the cache;
//! - they are logged once per uid per minute, not once per key;
//! - exact-key tombstones, journalled one Forget at a time and then compacted into one
//!   rewrite, survive SIGKILL and restart, whole: the journal's replay accepts every frame
//!   its writer wrote, and no forgotten entry comes back. The first 4,500 have 4 KiB keys
//!   (about 18 MiB: one compaction frame of them was what replay refused); the count is
//!   `TUNECACHE_TEST_TOMBSTONES`, default 50,000. A million is one Forget RPC each: about
//!   12 minutes with a debug daemon on a loaded 2-core machine, so run it as
//!   `TUNECACHE_TEST_TOMBSTONES=1000000 TUNECACHE_BIN_DIR=target/release` (the report of
//!   issue 39 gives its time).

use std::time::Duration;

use futures::stream::{self, StreamExt};
use tunecache_client::proto;
use tunecache_integration::{entry, eventually, key_in, DaemonOptions, TestDaemon};

const DEFAULT_TOMBSTONES: usize = 50_000;
/// Tombstones of 4 KiB keys among them: more than one frame's worth.
const BIG_KEYS: usize = 4_500;
/// Forgets in flight at once: enough to keep the writer busy, few enough for one connection.
const IN_FLIGHT: usize = 64;
/// Entries recorded before the Forgets, forgotten with the rest: they must stay gone.
const RECORDED: usize = 100;
/// The config of the results that make the journal's dead half.
const DEAD_CONFIG_BYTES: usize = 60 * 1024;
/// For waits the test puts no bound on: long enough for a loaded 2-core machine.
const GENEROUS: Duration = Duration::from_secs(600);

/// The shared entry of a small key `i`, as a flooding job's would be.
fn flood_key(i: usize) -> proto::Key {
    key_in("flood", "gemm", &format!("m{i}_n4096_k4096"), None)
}

/// An exact-key Forget of `key` only if its winner is `config` at `time_us`.
fn only_if(key: &proto::Key, config: &str, time_us: f64) -> proto::ForgetRequest {
    proto::ForgetRequest {
        only_if: Some(proto::Result {
            config: config.to_owned(),
            time_us,
            ..Default::default()
        }),
        ..forget_of(key)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_forgets_past_the_per_uid_budget_are_refused_naming_the_flag() {
    const BUDGET: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let options = DaemonOptions::new(dir.path()).args(["--max-exact-forgets-per-uid", "5"]);
    let daemon = options.process().await;
    let client = daemon.client().await;
    let keys: Vec<proto::Key> = (0..2 * BUDGET).map(flood_key).collect();
    let config = r#"{"block":[1,1,1]}"#;
    let entries = keys
        .iter()
        .map(|k| entry(k.clone(), config, 1.0, "t"))
        .collect();
    client.record(entries).await.unwrap();
    for (i, key) in keys.iter().enumerate() {
        let outcome = client.forget(only_if(key, config, 1.0)).await;
        if i < BUDGET {
            assert_eq!(outcome.unwrap(), 1, "Forget {i} is within the budget");
            continue;
        }
        let status = match outcome {
            Err(tunecache_client::ClientError::Rpc(status)) => status,
            other => panic!("Forget {i}: a refusal, got {other:?}"),
        };
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("--max-exact-forgets-per-uid 5"),
            "{status:?}"
        );
    }
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.max_exact_forgets_per_uid, BUDGET as u64);
    assert_eq!(stats.exact_forgets_refused, BUDGET as u64);
    assert_eq!(stats.tombstones_held, BUDGET as u64);
    let hits = client.lookup(keys.clone()).await.unwrap();
    assert_eq!(hits.len(), BUDGET, "the refused Forgets removed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_forgets_are_logged_once_per_uid_per_minute_not_once_per_key() {
    const FORGETS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    let client = daemon.client().await;
    let keys: Vec<proto::Key> = (0..FORGETS).map(flood_key).collect();
    let config = r#"{"block":[1,1,1]}"#;
    let entries = keys
        .iter()
        .map(|k| entry(k.clone(), config, 1.0, "t"))
        .collect();
    client.record(entries).await.unwrap();
    let started = std::time::Instant::now();
    for key in &keys {
        assert_eq!(client.forget(only_if(key, config, 1.0)).await.unwrap(), 1);
    }
    let took = started.elapsed();
    let log = daemon.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("Forget of one key") || line.contains(&keys[1].problem))
        .collect();
    // One minute's line, or two if the Forgets straddled a minute of the uid's.
    let most = if took < Duration::from_secs(60) { 1 } else { 2 };
    assert!(
        !lines.is_empty() && lines.len() <= most,
        "{} lines for {FORGETS} Forgets in {took:?}:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        !log.contains(&keys[FORGETS - 1].problem),
        "no line names a later key"
    );
}

fn tombstone_count() -> usize {
    std::env::var("TUNECACHE_TEST_TOMBSTONES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_TOMBSTONES)
}

/// Rank 0's entry of problem `i`: the first `BIG_KEYS` with a 4,000-byte problem.
fn problem_key(i: usize) -> proto::Key {
    let problem = if i < BIG_KEYS {
        format!("{i:08}{}", "p".repeat(3_992))
    } else {
        format!("m{i}_n4096_k4096")
    };
    key_in("scale", "gemm", &problem, Some(0))
}

/// A Forget of one rank's entry with no `only_if`: a scope Forget that names one key (an
/// exact-key tombstone), which the daemon's own uid (this test's) may ask.
fn forget_of(key: &proto::Key) -> proto::ForgetRequest {
    proto::ForgetRequest {
        namespace: key.namespace.clone(),
        op: key.op.clone(),
        device: key.device.clone(),
        problem: key.problem.clone(),
        rank: key.rank,
        only_if: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_key_tombstones_beyond_a_frame_survive_sigkill_and_restart() {
    let count = tombstone_count();
    assert!(
        count >= BIG_KEYS,
        "TUNECACHE_TEST_TOMBSTONES below {BIG_KEYS}"
    );
    let dir = tempfile::tempdir().unwrap();
    let options = DaemonOptions::new(dir.path()).args(["--fsync", "never"]);
    let mut daemon = options.process().await;
    let client = daemon.client().await;
    let recorded: Vec<proto::Key> = (0..RECORDED).map(problem_key).collect();
    let entries = recorded
        .iter()
        .map(|k| entry(k.clone(), r#"{"block":[1,1,1]}"#, 1.0, "test"))
        .collect();
    client.record(entries).await.expect("Record");

    let started = std::time::Instant::now();
    let failures: Vec<String> = stream::iter(0..count)
        .map(|i| {
            let client = client.clone();
            async move { client.forget(forget_of(&problem_key(i))).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|outcome| std::future::ready(outcome.err().map(|e| e.to_string())))
        .collect()
        .await;
    assert!(
        failures.is_empty(),
        "{} Forgets failed, the first: {:?}",
        failures.len(),
        failures.first()
    );
    eprintln!("{count} Forgets in {:?}", started.elapsed());
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tombstones_held, count as u64);
    assert_eq!(stats.forget_entries_dropped, RECORDED as u64);

    // The tombstones are live data, so the journal is compacted only once it holds as much
    // again that is dead: one key recorded again and again, each result faster than the last,
    // leaves every earlier one behind. The rewrite then holds every tombstone at once.
    let compactions = stats.journal_compactions;
    let after = key_in("scale", "other-op", "p", None);
    let dead_config = format!(r#"{{"pad":"{}"}}"#, "x".repeat(DEAD_CONFIG_BYTES));
    let dead_records = stats.journal_bytes as usize * 5 / 4 / DEAD_CONFIG_BYTES + 1;
    for i in 0..dead_records {
        let time_us = 1e6 - i as f64;
        client
            .record(vec![entry(after.clone(), &dead_config, time_us, "test")])
            .await
            .expect("Record");
    }
    eventually(GENEROUS, "the journal compacted", || {
        let client = client.clone();
        async move { client.stats().await.unwrap().journal_compactions > compactions }
    })
    .await;
    // One more Forget after the compaction, appended behind it.
    client
        .forget(forget_of(&after))
        .await
        .expect("a Forget after compaction");

    daemon.kill();
    daemon.restart().await;
    let client = daemon.client().await;
    let stats = client.stats().await.unwrap();
    assert_eq!(
        stats.tombstones_held,
        count as u64 + 1,
        "every tombstone is back after SIGKILL; log:\n{}",
        tail(&daemon.log())
    );
    let log = daemon.log();
    assert!(
        !log.contains("skipped a damaged stretch"),
        "replay met no damage; log:\n{}",
        tail(&log)
    );
    let corrupt = std::fs::read_dir(dir.path().join("state"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
        .count();
    assert_eq!(corrupt, 0, "no journal set aside as damaged");
    let mut asked = recorded.clone();
    asked.push(after);
    let hits = client.lookup(asked).await.unwrap();
    assert!(hits.is_empty(), "forgotten entries came back: {hits:?}");
}

fn tail(log: &str) -> &str {
    &log[log.len().saturating_sub(4000)..]
}
