//! The Redis cluster tier against a real `redis-server` started here (a single server, and a
//! Redis Cluster of three masters), real daemons and real rank processes: one tuning per
//! problem per cluster, push within a second, takeover after a dead holder, a hung, killed
//! and flushed Redis, and one winner for a contested key everywhere. The node that is killed
//! and the one whose log is read are daemon processes; the others run in-process.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use tunecache_client::{proto, Client, Resolution, ResolveOptions};
use tunecache_integration::redis::{
    cluster_node as node, free_port, wait_connected, wait_for_hit, Redis, RedisCluster,
};
use tunecache_integration::{
    best_result, entry, eventually, eventually_sync, rank_command, result_at, run_ranks, test_key,
    wait, Lazy, TestDaemon,
};

/// Lines of the count file: one per tuning, "<problem> <pid>".
fn tunings(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join("tuned.txt"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let (problem, pid) = line.split_once(' ').unwrap();
            (problem.to_owned(), pid.to_owned())
        })
        .collect()
}

/// Every rank got every key, with the same config for a key on every rank.
fn assert_same_results(outputs: &[Vec<Value>], keys: usize) {
    let mut configs: HashMap<u64, HashSet<String>> = HashMap::new();
    for output in outputs {
        assert_eq!(output.len(), keys, "{output:?}");
        for line in output {
            let outcome = line["outcome"].as_str().unwrap();
            assert!(outcome == "tuned" || outcome == "cached", "{line}");
            configs
                .entry(line["key"].as_u64().unwrap())
                .or_default()
                .insert(line["config"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(configs.len(), keys);
    for (key, seen) in configs {
        assert_eq!(
            seen.len(),
            1,
            "key {key} ended with different results: {seen:?}"
        );
    }
}

/// Nodes with four rank processes each: each key is tuned once in the cluster.
async fn each_key_tuned_once_across_nodes(url: &str, dir: &Path, nodes: usize, keys: usize) {
    let mut daemons = Vec::new();
    // A Resolve that Redis does not answer within the cluster timeout falls back to
    // node-local tuning (a duplicate, by design). Twelve processes starting at once on a
    // two-core CI machine can exceed the 20 ms default, so this test, which is about the
    // single-flight, allows Redis more; the fallback itself is tested with a hung Redis.
    for n in 0..nodes {
        daemons.push(
            node(
                dir,
                &format!("node{n}"),
                url,
                &["--cluster-timeout-ms", "2000"],
            )
            .in_process()
            .await,
        );
    }
    for daemon in &daemons {
        wait_connected(daemon).await;
    }
    let mut commands = Vec::new();
    for (n, daemon) in daemons.iter().enumerate() {
        for r in 0..4 {
            let seed = (n * 4 + r + 1).to_string();
            let count = keys.to_string();
            commands.push(rank_command(
                daemon,
                dir,
                &[
                    "--key-count",
                    &count,
                    "--order-seed",
                    &seed,
                    "--tune-ms",
                    "300",
                    "--wait-ms",
                    "60000",
                ],
            ));
        }
    }
    let outputs = run_ranks(commands, dir).await;
    let mut fallbacks = Vec::new();
    for daemon in &daemons {
        let stats = daemon.client().await.stats().await.unwrap();
        fallbacks.push((
            stats.cluster_lease_fallbacks,
            stats.cluster_leases_acquired,
            stats.cluster_leases_held_elsewhere,
            stats.cluster_takeovers,
        ));
    }
    eprintln!("per node (fallbacks, acquired, held elsewhere, takeovers): {fallbacks:?}");
    assert!(fallbacks.iter().all(|f| f.0 == 0), "{fallbacks:?}");
    let tuned = tunings(dir);
    let distinct: HashSet<&String> = tuned.iter().map(|(p, _)| p).collect();
    assert_eq!(distinct.len(), keys, "{tuned:?}");
    assert_eq!(tuned.len(), keys, "some keys were tuned twice: {tuned:?}");
    assert_same_results(&outputs, keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_twelve_ranks_thirty_keys_thirty_tunings() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    each_key_tuned_once_across_nodes(&redis.url(), dir.path(), 3, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_one_node_is_a_hit_on_another_within_a_second() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The Redis is reached over its unix socket here (redis+unix://).
    let socket = dir.path().join("redis.sock");
    let socket_arg = socket.display().to_string();
    let redis = Redis::start(dir.path(), free_port(), &["--unixsocket", &socket_arg]);
    let url = format!("redis+unix://{}", socket.display());
    // Snapshots every hour: only the cluster tier can carry the result in time.
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let shared_arg = shared.display().to_string();
    let snapshot_flags = ["--shared-dir", &shared_arg, "--snapshot-interval", "3600"];
    let a = node(dir.path(), "a", &url, &snapshot_flags)
        .in_process()
        .await;
    let _b = node(dir.path(), "b", &url, &snapshot_flags)
        .in_process()
        .await;
    let c = node(dir.path(), "c", &url, &snapshot_flags)
        .in_process()
        .await;
    wait_connected(&a).await;
    wait_connected(&c).await;

    let k = test_key("gemm", "pushed");
    let e = entry(k.clone(), r#"{"tile":64}"#, 12.5, "node-a");
    a.client().await.record(vec![e.clone()]).await.unwrap();
    let took = wait_for_hit(&c, &k, e.result.as_ref(), Duration::from_secs(1)).await;
    eprintln!("record on a -> hit on c after {took:?}");
    assert!(redis.entry_name("gemm", "pushed").is_some());
    // Learned entries are not published back.
    let stats_c = c.client().await.stats().await.unwrap();
    assert_eq!(stats_c.cluster_received, 1);
    assert_eq!(stats_c.cluster_published, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_node_is_taken_over_after_its_cluster_lease_expires() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let lease = ["--cluster-lease-ms", "1500"];
    let mut a = node(dir.path(), "a", &redis.url(), &lease).process().await;
    let b = node(dir.path(), "b", &redis.url(), &lease)
        .in_process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;

    // A rank on node a takes the key and never finishes.
    let mut hung = rank_command(&a, dir.path(), &["--hang"]).spawn().unwrap();
    std::fs::write(dir.path().join("start"), b"go").unwrap();
    eventually_sync(Duration::from_secs(10), "the first rank tuning", || {
        !tunings(dir.path()).is_empty()
    })
    .await;
    // A rank on node b waits for it (node a holds the cluster lease)...
    let waiting = rank_command(&b, dir.path(), &["--tune-ms", "50", "--wait-ms", "30000"])
        .spawn()
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "node b seeing node a's lease",
        || async {
            let stats = b.client().await.stats().await.unwrap();
            stats.cluster_leases_held_elsewhere > 0
        },
    )
    .await;
    assert_eq!(
        tunings(dir.path()).len(),
        1,
        "node b tuned while node a held the lease"
    );
    // ...node a dies mid-tune; once its cluster lease runs out, node b tunes.
    a.kill();
    let _ = hung.kill();
    let _ = hung.wait();
    let output = tokio::task::spawn_blocking(move || waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let line: Value = serde_json::from_slice(&output.stdout).expect("rank output");
    assert_eq!(line["outcome"], "tuned", "{line}");
    let tuned = tunings(dir.path());
    assert_eq!(tuned.len(), 2, "{tuned:?}");
    let stats = b.client().await.stats().await.unwrap();
    assert_eq!(stats.cluster_takeovers, 1, "{stats:?}");
}

async fn cluster_health(daemon: &TestDaemon) -> i32 {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = tunecache_client::connect_channel(&daemon.socket)
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "tunecache.v1.TuneCache/cluster".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

fn percentile_99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() * 99 / 100]
}

/// p99 of Lookup and of Record on `client`, over `n` calls each.
async fn local_latency(client: &Client, tag: &str, n: usize) -> (Duration, Duration) {
    let mut lookups = Vec::new();
    let mut records = Vec::new();
    for i in 0..n {
        let k = test_key("lat", &format!("{tag}-{i}"));
        let started = Instant::now();
        client
            .record(vec![entry(k.clone(), "{}", 1.0 + i as f64, tag)])
            .await
            .unwrap();
        records.push(started.elapsed());
        let started = Instant::now();
        client.lookup(vec![k]).await.unwrap();
        lookups.push(started.elapsed());
    }
    (percentile_99(lookups), percentile_99(records))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_killed_or_flushed_redis_never_slows_the_nodes() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    // Redis is down when the first node starts: it serves anyway.
    let a = node(dir.path(), "a", &url, &[]).process().await;
    let client_a = a.client().await;
    let state = client_a.stats().await.unwrap().cluster_state;
    assert!(!state.starts_with("connected"), "{state}");
    client_a
        .record(vec![entry(
            test_key("gemm", "before-redis"),
            "{}",
            3.0,
            "a",
        )])
        .await
        .unwrap();
    let redis = Redis::start(dir.path(), port, &[]);
    let b = node(dir.path(), "b", &url, &[]).in_process().await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    // What node a had before Redis came up reaches node b (a fresh server is filled).
    wait_for_hit(
        &b,
        &test_key("gemm", "before-redis"),
        None,
        Duration::from_secs(10),
    )
    .await;

    let (lookup_base, record_base) = local_latency(&client_a, "base", 200).await;

    // Hung: SIGSTOP.
    redis.signal(Signal::SIGSTOP);
    let (lookup_hung, record_hung) = local_latency(&client_a, "hung", 200).await;
    eprintln!(
        "p99 lookup {lookup_base:?} -> {lookup_hung:?}, record {record_base:?} -> {record_hung:?}"
    );
    // A call that waited on the stopped server would hang for seconds (or the whole test), so
    // the slack here is for scheduling noise on a loaded 2-core machine, not for Redis: 20 ms
    // failed once in CI-like runs with a compiler running beside the test.
    let within_noise = |base: Duration, now: Duration| now <= base * 5 + Duration::from_millis(200);
    assert!(
        within_noise(lookup_base, lookup_hung),
        "lookup p99 {lookup_base:?} -> {lookup_hung:?}"
    );
    assert!(
        within_noise(record_base, record_hung),
        "record p99 {record_base:?} -> {record_hung:?}"
    );
    // Resolve falls back to node-local coordination within the cluster timeout (20 ms)
    // plus scheduling slack.
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let resolution = client_a
            .resolve(
                test_key("gemm", &format!("resolve-hung-{i}")),
                ResolveOptions {
                    wait: Duration::ZERO,
                    can_tune: true,
                    lease: Duration::from_secs(5),
                },
            )
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed());
        assert!(
            matches!(resolution, Resolution::TuneHere(_)),
            "{resolution:?}"
        );
    }
    eprintln!("slowest Resolve while redis is hung: {slowest:?}");
    assert!(slowest < Duration::from_millis(500), "{slowest:?}");
    let hung_key = test_key("gemm", "while-hung");
    let hung_entry = entry(hung_key.clone(), r#"{"x":1}"#, 2.0, "a");
    client_a.record(vec![hung_entry.clone()]).await.unwrap();
    // The node notices the hung server and says so, in Stats and (polled at its own period)
    // on the health service.
    eventually(Duration::from_secs(20), "cluster_state down", || async {
        let state = client_a.stats().await.unwrap().cluster_state;
        state.starts_with("down")
    })
    .await;
    use tonic_health::pb::health_check_response::ServingStatus;
    eventually(
        Duration::from_secs(10),
        "cluster health NOT_SERVING",
        || async { cluster_health(&a).await == ServingStatus::NotServing as i32 },
    )
    .await;

    // Back: node b catches up on what node a recorded meanwhile.
    redis.signal(Signal::SIGCONT);
    wait_for_hit(
        &b,
        &hung_key,
        hung_entry.result.as_ref(),
        Duration::from_secs(20),
    )
    .await;
    wait_connected(&a).await;
    eventually(
        Duration::from_secs(10),
        "cluster health SERVING",
        || async { cluster_health(&a).await == ServingStatus::Serving as i32 },
    )
    .await;

    // Flushed: the nodes refill it.
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    let stored = |redis: &Redis| redis.entry_name("gemm", "while-hung").is_some();
    let refilled = Lazy(|| format!("redis refilled; log:\n{}", a.log()));
    wait(Duration::from_secs(20), refilled)
        .every(Duration::from_millis(50))
        .until(|| stored(&redis))
        .await;
    // Both nodes notice the flush (whichever refilled the entry first).
    let republished = Lazy(|| format!("node a republishing; log:\n{}", a.log()));
    eventually(Duration::from_secs(10), republished, || async {
        client_a.stats().await.unwrap().cluster_republished > 0
    })
    .await;

    // Killed and restarted empty on the same port: the nodes reconnect and refill it.
    drop(redis);
    let redis = Redis::start(dir.path(), port, &[]);
    let refilled = Lazy(|| format!("restarted redis refilled; log:\n{}", a.log()));
    wait(Duration::from_secs(30), refilled)
        .every(Duration::from_millis(50))
        .until(|| stored(&redis))
        .await;
    // One log line per state change, not one per failed attempt.
    let log = a.log();
    let lost = log.matches("lost the connection to redis").count();
    assert!((1..=4).contains(&lost), "{lost} 'lost' lines:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contested_key_ends_with_one_winner_everywhere_and_in_redis() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Under a non-C collation Lua's string `<` would disagree with the byte order.
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let nodes = [
        node(dir.path(), "a", &redis.url(), &[]).in_process().await,
        node(dir.path(), "b", &redis.url(), &[]).in_process().await,
        node(dir.path(), "c", &redis.url(), &[]).in_process().await,
    ];
    for daemon in &nodes {
        wait_connected(daemon).await;
    }
    // Each contest: candidates differing only late in the merge order; byte order and
    // locale order disagree on several ("f" < "é", "B" < "a" in bytes).
    let contests: Vec<Vec<proto::Result>> = vec![
        vec![
            result_at(r#"{"a":"é"}"#, 1.0, "x", 1),
            result_at(r#"{"a":"f"}"#, 1.0, "x", 1),
            result_at(r#"{"a":"e"}"#, 1.5, "x", 1),
        ],
        vec![
            result_at("{}", 2.0, "a", 1),
            result_at("{}", 2.0, "B", 1),
            result_at("{}", 2.0, "b", 0),
        ],
        vec![
            result_at("{}", 0.1 + 0.2, "n", 5),
            result_at("{}", 0.3, "n", 9),
            result_at("{}", 0.30000000000000004, "n", 3),
        ],
        vec![
            result_at("{}", 7.0, "n", -5),
            result_at("{}", 7.0, "n", 5),
            result_at("{}", 7.0, "n", i64::MIN),
        ],
        vec![
            result_at(r#"{"k":"Z"}"#, 1e-9, "n", 1),
            result_at(r#"{"k":"z"}"#, 1e-9, "n", 1),
            result_at(r#"{"k":"ž"}"#, 1e-9, "n", 1),
        ],
    ];
    for round in 0..3 {
        for (index, candidates) in contests.iter().enumerate() {
            let k = test_key("contest", &format!("r{round}-k{index}"));
            // Every node records one candidate at once (rotated per round).
            let records = nodes.iter().enumerate().map(|(n, daemon)| {
                let e = proto::Entry {
                    key: Some(k.clone()),
                    result: Some(candidates[(n + round) % candidates.len()].clone()),
                };
                async move { daemon.client().await.record(vec![e]).await.unwrap() }
            });
            futures::future::join_all(records).await;
        }
    }
    for round in 0..3 {
        for (index, candidates) in contests.iter().enumerate() {
            let k = test_key("contest", &format!("r{round}-k{index}"));
            let winner = best_result(candidates);
            for daemon in &nodes {
                wait_for_hit(daemon, &k, Some(&winner), Duration::from_secs(10)).await;
            }
            let name = redis
                .entry_name("contest", &format!("r{round}-k{index}"))
                .expect("the contested key is in redis");
            assert_eq!(redis.cli(&["HGET", &name, "c"]), winner.config, "{name}");
            assert_eq!(redis.cli(&["HGET", &name, "b"]), winner.tuned_by, "{name}");
            // `t`: the forget epoch, inverted (no Forget here: all f), then the time.
            let t = redis.cli(&["HGET", &name, "t"]);
            let (epoch, time) = t.split_at(16);
            assert_eq!(epoch, "ffffffffffffffff", "{name}");
            let ordered = u64::from_str_radix(time, 16).unwrap();
            assert_eq!(
                f64::from_bits(ordered & !(1 << 63)),
                winner.time_us,
                "{name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_of_three_masters_works_like_one_server() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis_cluster = RedisCluster::start(dir.path());
    let servers = &redis_cluster.servers;
    let url = servers[0].url();

    // Single-flight across nodes.
    each_key_tuned_once_across_nodes(&url, dir.path(), 2, 12).await;

    // Push, and bootstrap across every master.
    let a = node(dir.path(), "pusher", &url, &[]).in_process().await;
    wait_connected(&a).await;
    let entries: Vec<proto::Entry> = (0..60)
        .map(|i| {
            entry(
                test_key("spread", &format!("k{i}")),
                "{}",
                1.0 + f64::from(i),
                "pusher",
            )
        })
        .collect();
    a.client().await.record(entries.clone()).await.unwrap();
    let late = node(dir.path(), "late", &url, &[]).in_process().await;
    wait_connected(&late).await;
    for e in &entries {
        wait_for_hit(
            &late,
            e.key.as_ref().unwrap(),
            e.result.as_ref(),
            Duration::from_secs(10),
        )
        .await;
    }
    let keys_per_master: Vec<usize> = servers
        .iter()
        .map(|s| s.cli(&["DBSIZE"]).parse().unwrap_or(0))
        .collect();
    assert!(
        keys_per_master.iter().all(|&n| n > 0),
        "{keys_per_master:?}"
    );
    let stats = late.client().await.stats().await.unwrap();
    assert!(
        stats.cluster_state.contains("cluster"),
        "{}",
        stats.cluster_state
    );
}
