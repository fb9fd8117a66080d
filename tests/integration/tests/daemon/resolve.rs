//! Coordinated tuning against the daemon (in-process: the processes that die here are ranks,
//! not the daemon) and real rank processes: one tuner per problem per node, lease hand-over on
//! holder death, expiry and give-up, bounded waits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::Value;
use tunecache_client::{proto, Client, Resolution, ResolveOptions};
use tunecache_integration::{
    eventually, eventually_sync, rank_command, run_ranks, test_key, Lazy, TestDaemon,
};

/// How many times each problem was tuned, from the count file.
fn tune_counts(dir: &Path) -> HashMap<String, usize> {
    let text = std::fs::read_to_string(dir.join("tuned.txt")).unwrap_or_default();
    let mut counts = HashMap::new();
    for line in text.lines() {
        let problem = line.split_whitespace().next().unwrap().to_owned();
        *counts.entry(problem).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_one_fresh_key_exactly_one_tunes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    // The rank that gets the lease holds its result until the gate opens, and the gate opens
    // only once the seven others wait on the lease: each of them is then woken by the
    // result (a wait satisfied), none can arrive late and find a plain hit.
    let gate = dir.path().join("gate");
    let gate_arg = gate.to_str().unwrap().to_owned();
    let commands = (0..8)
        .map(|_| rank_command(&daemon, dir.path(), &["--tune-gate", &gate_arg]))
        .collect();
    let ranks = tokio::spawn({
        let dir = dir.path().to_path_buf();
        async move { run_ranks(commands, &dir).await }
    });
    let client = daemon.client().await;
    eventually(
        Duration::from_secs(30),
        "one rank tuning, seven waiting",
        || {
            let client = client.clone();
            let dir = dir.path().to_path_buf();
            async move {
                let stats = client.stats().await.unwrap();
                assert!(stats.waiters <= 7, "{} waiters", stats.waiters);
                tune_counts(&dir).get("p0") == Some(&1) && stats.waiters == 7
            }
        },
    )
    .await;
    std::fs::write(&gate, b"open").unwrap();
    let outputs = ranks.await.unwrap();

    assert_eq!(tune_counts(dir.path()).get("p0"), Some(&1));
    let outcomes: Vec<&str> = outputs
        .iter()
        .map(|o| o[0]["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == "tuned").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == "cached").count(),
        7,
        "{outcomes:?}"
    );
    let configs: Vec<&Value> = outputs.iter().map(|o| &o[0]["config"]).collect();
    assert!(configs.iter().all(|c| *c == configs[0]), "{configs:?}");

    let stats = client.stats().await.unwrap();
    assert_eq!(stats.leases_granted, 1);
    assert_eq!(stats.waits_satisfied, 7);
    assert_eq!(stats.waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_500_keys_each_tuned_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let commands = (0..16)
        .map(|rank| {
            let seed = (rank + 1).to_string();
            rank_command(
                &daemon,
                dir.path(),
                &[
                    "--key-count",
                    "500",
                    "--order-seed",
                    &seed,
                    "--tune-ms",
                    "1",
                ],
            )
        })
        .collect();
    let outputs = run_ranks(commands, dir.path()).await;

    let counts = tune_counts(dir.path());
    assert_eq!(counts.len(), 500);
    let tuned_twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        tuned_twice.is_empty(),
        "tuned more than once: {tuned_twice:?}"
    );

    // Every rank ended every key with the one recorded config.
    let mut config_of: HashMap<u64, Value> = HashMap::new();
    for lines in &outputs {
        assert_eq!(lines.len(), 500);
        for line in lines {
            assert_ne!(line["outcome"], "fallback", "{line}");
            let k = line["key"].as_u64().unwrap();
            let config = config_of.entry(k).or_insert_with(|| line["config"].clone());
            assert_eq!(*config, line["config"], "key {k}");
        }
    }
    let stats = daemon.client().await.stats().await.unwrap();
    assert_eq!(stats.entries, 500);
    assert_eq!(stats.leases_granted, 500);
}

async fn wait_for_count(dir: &Path, problem: &str, n: usize) {
    let what = format!("{problem} starting to tune");
    eventually_sync(Duration::from_secs(20), what, || {
        tune_counts(dir).get(problem).copied().unwrap_or(0) >= n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_holder_hands_the_lease_to_a_waiter_long_before_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    std::fs::write(dir.path().join("start"), b"go").unwrap();
    let mut holder = rank_command(&daemon, dir.path(), &["--hang", "--lease-ms", "120000"])
        .spawn()
        .unwrap();
    wait_for_count(dir.path(), "p0", 1).await;

    let client = daemon.client().await;
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            let options = ResolveOptions {
                wait: Duration::from_secs(60),
                can_tune: true,
                lease: Duration::ZERO,
            };
            let resolution = client.resolve(test_key("gemm", "p0"), options).await;
            (resolution, Instant::now())
        }
    });
    wait_for_waiters(&client, 1).await;

    holder.kill().unwrap(); // SIGKILL, mid-tune
    let killed_at = Instant::now();
    let (resolution, handed_at) = waiter.await.unwrap();
    assert!(matches!(resolution.unwrap(), Resolution::TuneHere(_)));
    let took = handed_at - killed_at;
    // The lease had two minutes left: a hand-over within seconds can only be the death watch.
    assert!(took < Duration::from_secs(5), "hand-over took {took:?}");
    let _ = holder.wait();
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.leases_released_dead, 1);
    assert_eq!(stats.leases_expired, 0);
}

/// Waits (at most 20 s) until exactly `n` callers wait on the daemon; more is a failure.
async fn wait_for_waiters(client: &Client, n: u64) {
    let what = format!("{n} waiters");
    eventually(Duration::from_secs(20), &what, || async {
        let waiters = client.stats().await.unwrap().waiters;
        assert!(waiters <= n, "{waiters} waiters, expected {n}");
        waiters == n
    })
    .await;
}

fn options(wait_ms: u64, can_tune: bool, lease_ms: u64) -> ResolveOptions {
    ResolveOptions {
        wait: Duration::from_millis(wait_ms),
        can_tune,
        lease: Duration::from_millis(lease_ms),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_timeout_and_give_up() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;

    // Expiry: a 300 ms lease nobody completes passes to the next caller that can tune.
    let Resolution::TuneHere(first) = client
        .resolve(test_key("gemm", "expiry"), options(0, true, 300))
        .await
        .unwrap()
    else {
        panic!("first caller should get the lease");
    };
    let second = client
        .resolve(test_key("gemm", "expiry"), options(10_000, true, 60_000))
        .await
        .unwrap();
    let Resolution::TuneHere(second) = second else {
        panic!("expected hand-over, got {second:?}")
    };
    assert_ne!(first.lease_id, second.lease_id);
    assert_eq!(client.stats().await.unwrap().leases_expired, 1);

    // A wait that times out is a miss whose reason names who is tuning and since when.
    let miss = client
        .resolve(test_key("gemm", "expiry"), options(200, false, 0))
        .await
        .unwrap();
    let Resolution::Miss(reason) = miss else {
        panic!("expected a miss, got {miss:?}")
    };
    assert!(reason.contains("no result within 200 ms"), "{reason}");
    assert!(reason.contains(&second.lease_id), "{reason}");
    assert!(
        reason.contains(&format!("pid {}", std::process::id())),
        "{reason}"
    );
    assert!(reason.contains("since unix ms"), "{reason}");
    assert_eq!(client.stats().await.unwrap().waits_timed_out, 1);

    // Give-up: an empty Record with the lease passes it to the waiter that can tune.
    let Resolution::TuneHere(lease) = client
        .resolve(test_key("gemm", "give-up"), options(0, true, 60_000))
        .await
        .unwrap()
    else {
        panic!("expected the lease");
    };
    let waiter = tokio::spawn({
        let client = client.clone();
        let key = test_key("gemm", "give-up");
        async move { client.resolve(key, options(10_000, true, 60_000)).await }
    });
    wait_for_waiters(&client, 1).await;
    client
        .record_with_lease(vec![], lease.lease_id)
        .await
        .unwrap();
    let handed = waiter.await.unwrap().unwrap();
    assert!(matches!(handed, Resolution::TuneHere(_)), "{handed:?}");
    assert_eq!(client.stats().await.unwrap().leases_given_up, 1);

    // Completing that lease with a result wakes a waiter with the recorded result.
    let Resolution::TuneHere(lease) = handed else {
        unreachable!()
    };
    let waiter = tokio::spawn({
        let client = client.clone();
        let key = test_key("gemm", "give-up");
        async move { client.resolve(key, options(10_000, false, 0)).await }
    });
    wait_for_waiters(&client, 1).await;
    let result = proto::Result {
        config: r#"{"tile":64}"#.into(),
        time_us: 3.5,
        tuned_by: "me".into(),
        tuned_at_unix_ms: 1,
        forget_epoch: 0,
        artifacts: Default::default(),
    };
    let entry = proto::Entry {
        key: Some(test_key("gemm", "give-up")),
        result: Some(result.clone()),
    };
    client
        .record_with_lease(vec![entry], lease.lease_id)
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), Resolution::Hit(result));
    let stats = client.stats().await.unwrap();
    assert_eq!(
        (stats.waiters, stats.leases_active),
        (0, 1),
        "only the expiry key's lease remains"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_disconnects_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    let k = test_key("gemm", "leak");
    let Resolution::TuneHere(_) = client
        .resolve(k.clone(), options(0, true, 60_000))
        .await
        .unwrap()
    else {
        panic!("expected the lease");
    };

    // 50 waiters on their own connections; then every connection goes away.
    let mut waiters = Vec::new();
    for _ in 0..50 {
        let own = Client::connect(&daemon.socket).await.unwrap();
        let k = k.clone();
        waiters.push(tokio::spawn(async move {
            own.resolve(k, options(60_000, true, 0)).await
        }));
    }
    eventually(
        Duration::from_secs(10),
        "the waiters registering",
        || async { client.stats().await.unwrap().waiters >= 50 },
    )
    .await;
    for waiter in &waiters {
        waiter.abort();
    }
    let (client, left) = (&client, &AtomicU64::new(0));
    let leaked = Lazy(|| format!("no waiter left ({} leaked)", left.load(Relaxed)));
    eventually(Duration::from_secs(10), leaked, move || async move {
        let waiters = client.stats().await.unwrap().waiters;
        left.store(waiters, Relaxed);
        waiters == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bitblas_scenario_ranks_share_one_tuning_per_matmul() {
    // Tensor parallelism hands every rank the same op configs; each rank used to tune
    // them and overwrite the others' database entries. Here 4 ranks ask for the same 3
    // matmul configs (namespace "bitblas") in different orders.
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let commands = (0..4)
        .map(|rank| {
            let seed = (rank + 11).to_string();
            rank_command(
                &daemon,
                dir.path(),
                &[
                    "--namespace",
                    "bitblas",
                    "--op",
                    "matmul",
                    "--key-count",
                    "3",
                    "--order-seed",
                    &seed,
                    "--tune-ms",
                    "100",
                ],
            )
        })
        .collect();
    let outputs = run_ranks(commands, dir.path()).await;
    let counts = tune_counts(dir.path());
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![1, 1, 1]);
    for k in 0..3u64 {
        let configs: Vec<&Value> = outputs
            .iter()
            .flat_map(|lines| lines.iter().filter(|l| l["key"] == k).map(|l| &l["config"]))
            .collect();
        assert_eq!(configs.len(), 4);
        assert!(configs.iter().all(|c| *c == configs[0]));
    }
    let client = daemon.client().await;
    assert_eq!(client.scan("bitblas", "").await.unwrap().len(), 3);
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.entries_stored, 3, "nothing was overwritten");
}

/// The Rust client's whole rank flow: a tuned result the daemon refuses (a NaN time) still
/// gives the lease up at once, so a rank waiting on the key tunes it instead of waiting out
/// the 120 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_gives_the_lease_up_so_a_waiter_tunes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let holder = daemon.client().await;
    let waiter = daemon.client().await;
    let observer = daemon.client().await;
    let problem = test_key("gemm", "refused");
    let holding = {
        let problem = problem.clone();
        let observer = observer.clone();
        tokio::spawn(async move {
            let options = ResolveOptions {
                wait: Duration::ZERO,
                can_tune: true,
                lease: Duration::from_secs(120),
            };
            holder
                .get_or_tune(problem, options, || async {
                    // The result comes once the waiter waits on the lease.
                    wait_for_waiters(&observer, 1).await;
                    Ok::<_, String>(proto::Result {
                        config: "{}".into(),
                        time_us: f64::NAN,
                        tuned_by: "holder".into(),
                        tuned_at_unix_ms: 1,
                        forget_epoch: 0,
                        artifacts: Default::default(),
                    })
                })
                .await
        })
    };
    // The holder has the lease before the waiter asks.
    eventually(Duration::from_secs(20), "the holder's lease", || async {
        observer.stats().await.unwrap().leases_active == 1
    })
    .await;
    let started = Instant::now();
    let resolution = waiter
        .resolve(
            problem,
            ResolveOptions {
                wait: Duration::from_secs(30),
                can_tune: true,
                lease: Duration::from_secs(5),
            },
        )
        .await
        .unwrap();
    let waited = started.elapsed();
    eprintln!("the waiter got {resolution:?} after {waited:?}");
    assert!(
        matches!(resolution, Resolution::TuneHere(_)),
        "{resolution:?}"
    );
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    holding.await.unwrap();
    let stats = daemon.client().await.stats().await.unwrap();
    assert_eq!(stats.leases_given_up, 1, "{stats:?}");
}
