//! Job views against real daemons and a real `redis-server`: within a view the first answer
//! for a key is pinned on every node, while other views and requests without a view get the
//! better result recorded since; a Resolve miss in a view is tuned once and every waiter on
//! both nodes gets the same pinned result; a Forget drops pins; Redis SIGSTOPped costs a view
//! read at most the cluster timeout and a counted fallback; idle views end; the pin cap holds.
//!
//! The daemons run in-process: no test here needs a process boundary (Redis is the process
//! that is stopped). The requests are made with the raw gRPC client, so the `view` field on
//! the wire is what is tested (the client crate fills it from the environment; its own tests
//! cover that).

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tunecache_client::proto;
use tunecache_integration::redis::{cluster_node, free_port, wait_connected, Redis};
use tunecache_integration::{entry, eventually, test_key, DaemonOptions, TestDaemon};

const R1: &str = r#"{"tile":[128,128]}"#;
const R2: &str = r#"{"tile":[64,256]}"#;
/// For waits the issue puts no bound on: long enough for a loaded 2-core machine.
const GENEROUS: Duration = Duration::from_secs(60);

/// Lookup of `keys` in `view` on `daemon`: each hit's (problem, config).
async fn lookup_in(daemon: &TestDaemon, view: &str, keys: &[proto::Key]) -> Vec<(String, String)> {
    let request = proto::LookupRequest {
        keys: keys.to_vec(),
        view: view.to_owned(),
    };
    let hits = daemon
        .client()
        .await
        .raw()
        .lookup(request)
        .await
        .unwrap_or_else(|e| panic!("Lookup in {view:?}: {e}"))
        .into_inner()
        .hits;
    hits.into_iter().map(labelled).collect()
}

fn labelled(entry: proto::Entry) -> (String, String) {
    (
        entry.key.unwrap_or_default().problem,
        entry.result.unwrap_or_default().config,
    )
}

/// The config `view` answers for `key` on `daemon` (`None`: a miss).
async fn config_in(daemon: &TestDaemon, view: &str, key: &proto::Key) -> Option<String> {
    lookup_in(daemon, view, std::slice::from_ref(key))
        .await
        .pop()
        .map(|(_, config)| config)
}

/// Scan of namespace `test` in `view`: (problem, config), in key order.
async fn scan_in(daemon: &TestDaemon, view: &str) -> Vec<(String, String)> {
    let request = proto::ScanRequest {
        namespace: "test".to_owned(),
        view: view.to_owned(),
        ..Default::default()
    };
    let mut stream = daemon
        .client()
        .await
        .raw()
        .scan(request)
        .await
        .unwrap_or_else(|e| panic!("Scan in {view:?}: {e}"))
        .into_inner();
    let mut entries = Vec::new();
    while let Some(chunk) = stream.message().await.expect("Scan chunk") {
        entries.extend(chunk.entries.into_iter().map(labelled));
    }
    entries
}

async fn resolve_in(
    daemon: &TestDaemon,
    view: &str,
    key: &proto::Key,
    wait_ms: u32,
    can_tune: bool,
) -> proto::resolve_response::Outcome {
    let request = proto::ResolveRequest {
        key: Some(key.clone()),
        wait_ms,
        can_tune,
        view: view.to_owned(),
        ..Default::default()
    };
    daemon
        .client()
        .await
        .raw()
        .resolve(request)
        .await
        .unwrap_or_else(|e| panic!("Resolve in {view:?}: {e}"))
        .into_inner()
        .outcome
        .expect("an outcome")
}

async fn stats(daemon: &TestDaemon) -> proto::StatsResponse {
    daemon.client().await.stats().await.expect("Stats")
}

async fn record(daemon: &TestDaemon, key: &proto::Key, config: &str, time_us: f64) {
    daemon
        .client()
        .await
        .record(vec![entry(key.clone(), config, time_us, "test")])
        .await
        .expect("Record");
}

/// Waits until `daemon` answers `config` for `key` without a view.
async fn wait_winner(daemon: &TestDaemon, key: &proto::Key, config: &str) {
    eventually(
        GENEROUS,
        &format!("{} holds {config} for {key:?}", daemon.socket.display()),
        || async { config_in(daemon, "", key).await.as_deref() == Some(config) },
    )
    .await;
}

/// Two nodes on one real Redis, connected and bootstrapped; `None` (the test is skipped)
/// without redis-server outside CI.
async fn two_nodes(dir: &Path, extra: &[&str]) -> Option<(Redis, TestDaemon, TestDaemon)> {
    Redis::server()?;
    let redis = Redis::start(dir, free_port(), &[]);
    let a = cluster_node(dir, "a", &redis.url(), extra)
        .in_process()
        .await;
    let b = cluster_node(dir, "b", &redis.url(), extra)
        .in_process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    Some((redis, a, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_keeps_its_first_answer_on_both_nodes_while_others_get_the_better_one() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_redis, a, b)) = two_nodes(dir.path(), &[]).await else {
        return;
    };
    let key = test_key("gemm", "m=4096,n=4096");
    let other = test_key("gemm", "m=1,n=1");
    record(&a, &key, R1, 20.0).await;
    record(&a, &other, R1, 5.0).await;
    wait_winner(&b, &key, R1).await;

    // A rank on A reads K in job-1: r1, pinned (cluster-wide).
    assert_eq!(config_in(&a, "job-1", &key).await.as_deref(), Some(R1));
    // A better r2 is recorded on B and reaches A.
    record(&b, &key, R2, 10.0).await;
    wait_winner(&a, &key, R2).await;

    // B never read K in job-1, yet answers it with A's pin; so does a Scan in job-1 on A.
    assert_eq!(config_in(&b, "job-1", &key).await.as_deref(), Some(R1));
    let scan = scan_in(&a, "job-1").await;
    assert!(
        scan.contains(&(key.problem.clone(), R1.to_owned())),
        "Scan in job-1 on A: {scan:?}"
    );
    assert_eq!(scan.len(), 2, "both entries, each once: {scan:?}");
    let scan_b = scan_in(&b, "job-1").await;
    assert_eq!(scan, scan_b, "the same view answers the same on both nodes");
    // Another view and no view get r2, on both nodes.
    for node in [&a, &b] {
        assert_eq!(config_in(node, "job-2", &key).await.as_deref(), Some(R2));
        assert_eq!(config_in(node, "", &key).await.as_deref(), Some(R2));
    }
    let (sa, sb) = (stats(&a).await, stats(&b).await);
    assert!(sa.view_pin_conflicts >= 1, "A counted the conflict");
    assert!(sb.view_pins_from_cluster >= 1, "B took A's pin from Redis");
    assert_eq!(sa.view_pin_fallbacks + sb.view_pin_fallbacks, 0);
    assert_eq!(sa.views_active, 2, "job-1 and job-2 on A");

    // ListViews shows the view and its pins.
    let listed = a
        .client()
        .await
        .raw()
        .list_views(proto::ListViewsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .views;
    let job1 = listed
        .iter()
        .find(|v| v.name == "job-1")
        .expect("job-1 listed");
    assert_eq!(job1.pins, 2, "{listed:?}");

    // A bad view name is refused, naming the field; nothing is pinned.
    let long = "v".repeat(300);
    let status = a
        .client()
        .await
        .raw()
        .lookup(proto::LookupRequest {
            keys: vec![key.clone()],
            view: long,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("view:"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolve_miss_in_a_view_is_tuned_once_and_every_waiter_on_both_nodes_gets_the_pin() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_redis, a, b)) = two_nodes(dir.path(), &[]).await else {
        return;
    };
    let key = test_key("gemm", "m=8192,n=1024");
    use proto::resolve_response::Outcome;

    // The first rank gets the lease; ranks on both nodes wait in job-1.
    let Outcome::TuneHere(lease) = resolve_in(&a, "job-1", &key, 0, true).await else {
        panic!("the first Resolve of a miss hands out the lease");
    };
    let mut waiters = Vec::new();
    for node in [&a, &a, &b, &b] {
        let (socket, key) = (node.socket.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            let client = tunecache_client::Client::connect(&socket).await.unwrap();
            let request = proto::ResolveRequest {
                key: Some(key),
                wait_ms: 30_000,
                can_tune: true,
                view: "job-1".to_owned(),
                ..Default::default()
            };
            client
                .raw()
                .resolve(request)
                .await
                .unwrap()
                .into_inner()
                .outcome
        }));
    }
    // The Record comes only once every waiter waits, on each node: a waiter that arrived after
    // it would find a plain hit and prove nothing about waking the waiters with the pin.
    for node in [&a, &b] {
        node.wait_for_stats("two waiters in job-1", |s| {
            assert!(s.waiters <= 2, "{} waiters", s.waiters);
            s.waiters == 2
        })
        .await;
    }
    a.client()
        .await
        .record_with_lease(vec![entry(key.clone(), R1, 20.0, "rank-0")], lease.lease_id)
        .await
        .unwrap();
    for waiter in waiters {
        match waiter.await.unwrap() {
            Some(Outcome::Hit(hit)) => assert_eq!(hit.config, R1),
            other => panic!("a waiter got {other:?}, not the tuned result"),
        }
    }
    let (sa, sb) = (stats(&a).await, stats(&b).await);
    assert_eq!(
        sa.leases_granted + sb.leases_granted,
        1,
        "tuned once in the cluster"
    );

    // A better Record afterwards changes nothing for job-1, on either node, for any read.
    record(&b, &key, R2, 10.0).await;
    wait_winner(&a, &key, R2).await;
    for node in [&a, &b] {
        assert_eq!(config_in(node, "job-1", &key).await.as_deref(), Some(R1));
        match resolve_in(node, "job-1", &key, 0, true).await {
            Outcome::Hit(hit) => assert_eq!(hit.config, R1),
            other => panic!("Resolve in job-1: {other:?}"),
        }
        assert_eq!(config_in(node, "job-2", &key).await.as_deref(), Some(R2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_forget_drops_the_pin_and_the_next_read_in_the_view_is_resolved_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_redis, a, b)) = two_nodes(dir.path(), &[]).await else {
        return;
    };
    let key = test_key("gemm", "m=2048,n=2048");
    record(&a, &key, R1, 20.0).await;
    wait_winner(&b, &key, R1).await;
    assert_eq!(config_in(&a, "job-1", &key).await.as_deref(), Some(R1));
    assert_eq!(config_in(&b, "job-1", &key).await.as_deref(), Some(R1));

    let forgotten = a
        .client()
        .await
        .forget(proto::ForgetRequest {
            namespace: "test".to_owned(),
            op: "gemm".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(forgotten, 1);
    for node in [&a, &b] {
        eventually(
            GENEROUS,
            &format!("{}: job-1's pin is gone", node.socket.display()),
            || async { config_in(node, "job-1", &key).await.is_none() },
        )
        .await;
        assert!(stats(node).await.view_pins_forgotten >= 1);
    }
    // Resolved again: a lease, then the new result is job-1's pin on both nodes.
    use proto::resolve_response::Outcome;
    let Outcome::TuneHere(lease) = resolve_in(&b, "job-1", &key, 0, true).await else {
        panic!("after the Forget, a Resolve in job-1 tunes again");
    };
    b.client()
        .await
        .record_with_lease(vec![entry(key.clone(), R2, 30.0, "rank-1")], lease.lease_id)
        .await
        .unwrap();
    wait_winner(&a, &key, R2).await;
    for node in [&a, &b] {
        assert_eq!(config_in(node, "job-1", &key).await.as_deref(), Some(R2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigstopped_while_a_view_reads_costs_at_most_the_cluster_timeout_and_a_fallback() {
    const TIMEOUT_MS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let timeout = TIMEOUT_MS.to_string();
    let Some((redis, a, _b)) = two_nodes(dir.path(), &["--cluster-timeout-ms", &timeout]).await
    else {
        return;
    };
    let keys: Vec<proto::Key> = (0..20)
        .map(|i| test_key("gemm", &format!("p{i}")))
        .collect();
    for key in &keys {
        record(&a, key, R1, 20.0).await;
    }
    redis.signal(Signal::SIGSTOP);
    // Slack over the timeout for a loaded 2-core machine: the bound is what Redis may cost.
    let bound = Duration::from_millis(TIMEOUT_MS + 700);
    let mut slowest = Duration::ZERO;
    for (i, key) in keys.iter().enumerate() {
        let view = format!("job-{}", i % 3);
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), config_in(&a, &view, key))
            .await
            .expect("a view read hung while Redis was stopped");
        slowest = slowest.max(started.elapsed());
        assert_eq!(answer.as_deref(), Some(R1));
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(10), resolve_in(&a, &view, key, 0, true))
                .await
                .expect("a view Resolve hung while Redis was stopped");
        slowest = slowest.max(started.elapsed());
        assert!(matches!(outcome, proto::resolve_response::Outcome::Hit(_)));
    }
    let started = Instant::now();
    let scan = tokio::time::timeout(Duration::from_secs(10), scan_in(&a, "job-scan"))
        .await
        .expect("a view Scan hung while Redis was stopped");
    slowest = slowest.max(started.elapsed());
    assert_eq!(scan.len(), keys.len());
    eprintln!("MEASURED slowest view read with Redis SIGSTOPped: {slowest:?} (bound {bound:?})");
    assert!(slowest <= bound, "{slowest:?} over {bound:?}");
    let s = stats(&a).await;
    assert!(s.view_pin_fallbacks >= 1, "fallbacks counted: {s:?}");
    // The pins made while Redis was away still answer the same after it is back.
    redis.signal(Signal::SIGCONT);
    record(&a, &keys[0], R2, 1.0).await;
    assert_eq!(config_in(&a, "job-0", &keys[0]).await.as_deref(), Some(R1));
    assert_eq!(config_in(&a, "", &keys[0]).await.as_deref(), Some(R2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_view_ends_an_ended_view_pins_afresh_and_the_pin_cap_holds_under_100k_keys() {
    const CAP: u64 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let cap = CAP.to_string();
    let daemon = DaemonOptions::new(dir.path())
        .args([
            "--tuner",
            "off",
            "--view-idle-secs",
            "1",
            "--max-view-pins-per-uid",
            &cap,
        ])
        .in_process()
        .await;
    let client = daemon.client().await;
    let key = test_key("gemm", "idle");
    record(&daemon, &key, R1, 20.0).await;
    assert_eq!(
        config_in(&daemon, "job-idle", &key).await.as_deref(),
        Some(R1)
    );
    record(&daemon, &key, R2, 10.0).await;
    assert_eq!(
        config_in(&daemon, "job-idle", &key).await.as_deref(),
        Some(R1)
    );
    // Idle for longer than --view-idle-secs: gone from the list, and the next read pins r2.
    eventually(GENEROUS, "job-idle ends", || async {
        let views = client
            .raw()
            .list_views(proto::ListViewsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .views;
        views.iter().all(|v| v.name != "job-idle")
    })
    .await;
    assert!(stats(&daemon).await.views_ended_idle >= 1);
    assert_eq!(
        config_in(&daemon, "job-idle", &key).await.as_deref(),
        Some(R2)
    );

    // An operator ends a view: the next read pins afresh.
    record(&daemon, &key, R1, 5.0).await;
    let ended = client
        .raw()
        .end_view(proto::EndViewRequest {
            name: "job-idle".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ended.ended);
    assert_eq!(ended.pins_dropped, 1);
    assert_eq!(
        config_in(&daemon, "job-idle", &key).await.as_deref(),
        Some(R1)
    );

    // 100k distinct keys, read in views of this one uid: it never holds more than its cap.
    let keys: Vec<proto::Key> = (0..100_000)
        .map(|i| test_key("gemm", &format!("cap-{i}")))
        .collect();
    for batch in keys.chunks(10_000) {
        let entries = batch
            .iter()
            .map(|key| entry(key.clone(), R1, 3.0, "test"))
            .collect();
        client.record(entries).await.unwrap();
    }
    // One view alone Scans them all: it keeps the cap, and answers the rest unpinned.
    let scanned = scan_in(&daemon, "big").await;
    assert_eq!(scanned.len(), 100_001);
    let s = stats(&daemon).await;
    assert!(s.view_pins <= CAP, "{} pins", s.view_pins);
    assert!(s.view_pins_over_cap >= 90_000, "{}", s.view_pins_over_cap);
    // Other views read 5,000 keys each: the uid's view idle longest goes first.
    for (i, batch) in keys.chunks(5_000).take(6).enumerate() {
        let hits = lookup_in(&daemon, &format!("job-{i}"), batch).await;
        assert_eq!(hits.len(), batch.len());
        let s = stats(&daemon).await;
        assert!(s.view_pins <= CAP, "after job-{i}: {} pins", s.view_pins);
    }
    let s = stats(&daemon).await;
    assert!(s.view_pins_evicted > 0, "views were dropped for the cap");
    assert!(s.views_evicted > 0);
    assert_eq!(s.max_view_pins_per_uid, CAP);
    let views = client
        .raw()
        .list_views(proto::ListViewsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .views;
    assert!(
        views.iter().all(|v| v.name != "big"),
        "the view idle longest went first: {views:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holders_record_pins_what_it_produced_even_when_a_better_one_follows_at_once() {
    use proto::resolve_response::Outcome;
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--tuner", "off"])
        .in_process()
        .await;
    let key = test_key("gemm", "lease-in-view");
    let Outcome::TuneHere(lease) = resolve_in(&daemon, "job-1", &key, 0, true).await else {
        panic!("the first Resolve of a miss in job-1 hands out the lease");
    };
    let made_before = stats(&daemon).await.view_pins_made;
    // The holder's result, then at once a better one from a job without a view: job-1's pin
    // is what its holder produced, whenever the pin is made.
    let client = daemon.client().await;
    client
        .record_with_lease(vec![entry(key.clone(), R1, 20.0, "holder")], lease.lease_id)
        .await
        .expect("the holder's Record");
    record(&daemon, &key, R2, 10.0).await;
    eventually(GENEROUS, "the holder's result pinned in job-1", || async {
        stats(&daemon).await.view_pins_made > made_before
    })
    .await;
    assert_eq!(config_in(&daemon, "job-1", &key).await.as_deref(), Some(R1));
    assert_eq!(config_in(&daemon, "", &key).await.as_deref(), Some(R2));
    let views = client
        .raw()
        .list_views(proto::ListViewsRequest::default())
        .await
        .expect("ListViews")
        .into_inner()
        .views;
    assert_eq!(
        views
            .iter()
            .map(|v| (v.name.as_str(), v.pins))
            .collect::<Vec<_>>(),
        vec![("job-1", 1)]
    );
}
