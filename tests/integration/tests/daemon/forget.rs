//! Forget against real daemons, a real `redis-server` and a real shared directory: a bogus
//! winner (`time_us: 0`) is forgotten on every node, within 1 s with Redis and within two
//! snapshot intervals with the shared directory alone; no replica brings it back (journals
//! after SIGKILL, segments, Redis, a fresh node, a node that was down during the Forget); an
//! exact-key Forget drops only the winner it names; a scope Forget is an administrator's act.
//!
//! Every "within" figure is measured from the Forget's (or the Record's) reply to the first
//! observation of the outcome, printed, and checked against the bound the issue names. Other
//! waits ("eventually") get generous deadlines, for a loaded 2-core CI machine.
//!
//! Tests that SIGKILL or SIGTERM a node, act as another uid or read a log start daemon
//! processes; the others run the daemons in-process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tunecache_client::{proto, Client, Resolution, ResolveOptions};
use tunecache_integration::redis::{free_port, wait_connected, Redis};
use tunecache_integration::{
    bin, entry, eventually, eventually_some, key_in, require_root, require_tool, result,
    DaemonOptions, Kind, TestDaemon, TEST_DEVICE,
};

const GOOD: &str = r#"{"block":[128,64,1]}"#;
const BOGUS: &str = r#"{"block":[1,1,1],"bogus":true}"#;
/// Recorded after the Forget, slower than the first good result (41.5 µs): were that one
/// brought back, it would win over this and show.
const GOOD_AFTER: &str = r#"{"block":[64,64,1]}"#;
const GOOD_AFTER_TIME: f64 = 50.0;
/// For waits the issue puts no bound on: long enough for a loaded 2-core machine.
const GENEROUS: Duration = Duration::from_secs(60);

fn scope(namespace: &str, op: &str) -> proto::ForgetRequest {
    proto::ForgetRequest {
        namespace: namespace.to_owned(),
        op: op.to_owned(),
        ..Default::default()
    }
}

/// An exact-key Forget of `key`, only if its winner is `config` at `time_us`.
fn exact(key: &proto::Key, config: &str, time_us: f64) -> proto::ForgetRequest {
    proto::ForgetRequest {
        namespace: key.namespace.clone(),
        op: key.op.clone(),
        device: key.device.clone(),
        problem: key.problem.clone(),
        rank: key.rank,
        only_if: Some(result(config, time_us, "")),
    }
}

/// The winner of `key` on `client` now.
async fn winner(client: &Client, key: &proto::Key) -> Option<proto::Result> {
    let hits = client.lookup(vec![key.clone()]).await.expect("Lookup");
    hits.into_iter().next().and_then(|hit| hit.result)
}

/// The ones of `keys` that are hits on `daemon` now, with their configs.
async fn hits_among(daemon: &TestDaemon, keys: &[proto::Key]) -> Vec<(String, String)> {
    let hits = daemon
        .client()
        .await
        .lookup(keys.to_vec())
        .await
        .expect("Lookup");
    hits.into_iter()
        .map(|hit| {
            let key = hit.key.unwrap_or_default();
            let label = format!(
                "{}/{}/{}/{:?}",
                key.namespace, key.op, key.problem, key.rank
            );
            (label, hit.result.map(|r| r.config).unwrap_or_default())
        })
        .collect()
}

fn is(result: Option<&proto::Result>, config: &str, time_us: f64) -> bool {
    result.is_some_and(|r| r.config == config && r.time_us == time_us)
}

/// Polls (every 5 ms) until `done` holds; returns the time since `since`. Panics after
/// `limit` with what `state` says is still there.
async fn measure_until<T, Fut>(
    since: Instant,
    limit: Duration,
    mut state: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
    describe: impl Fn(&T) -> String,
) -> Duration
where
    Fut: std::future::Future<Output = T>,
{
    loop {
        let now = state().await;
        if done(&now) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "after {limit:?}: {}",
            describe(&now)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls until every one of `keys` is a miss on `daemon`; the time since `since`.
async fn wait_forgotten(
    daemon: &TestDaemon,
    keys: &[proto::Key],
    since: Instant,
    limit: Duration,
) -> Duration {
    measure_until(
        since,
        limit,
        || hits_among(daemon, keys),
        |left| left.is_empty(),
        |left| {
            format!(
                "{}: still hits after the Forget: {left:?}; {}",
                daemon.socket.display(),
                daemon.diagnostics()
            )
        },
    )
    .await
}

/// Polls until `key`'s winner on `daemon` is `config` at `time_us`; the time since `since`.
async fn wait_winner(
    daemon: &TestDaemon,
    key: &proto::Key,
    config: &str,
    time_us: f64,
    since: Instant,
    limit: Duration,
) -> Duration {
    let client = daemon.client().await;
    measure_until(
        since,
        limit,
        || winner(&client, key),
        |got| is(got.as_ref(), config, time_us),
        |got| {
            format!(
                "{}: {key:?} is {got:?}, not {config} at {time_us} µs; {}",
                daemon.socket.display(),
                daemon.diagnostics()
            )
        },
    )
    .await
}

/// Prints a measured figure and checks it against the issue's bound.
fn assert_within(what: &str, took: Duration, bound: Duration) {
    eprintln!("MEASURED {what}: {took:?} (bound {bound:?})");
    assert!(
        took <= bound,
        "{what} took {took:?}, over the bound of {bound:?}"
    );
}

async fn stats(daemon: &TestDaemon) -> proto::StatsResponse {
    daemon.client().await.stats().await.expect("Stats")
}

/// The Snapshot RPC: one full pass (read what is new, publish what is new) now.
async fn snapshot_pass(daemon: &TestDaemon) {
    let mut request = tonic::Request::new(proto::SnapshotRequest {});
    request.set_timeout(Duration::from_secs(30));
    daemon
        .client()
        .await
        .raw()
        .snapshot(request)
        .await
        .unwrap_or_else(|e| panic!("Snapshot on {}: {e}", daemon.socket.display()));
}

/// Waits until `daemon` has run `more` periodic passes beyond what it has run now.
async fn wait_passes(daemon: &TestDaemon, more: u64) {
    let before = stats(daemon).await.snapshot_passes;
    eventually(
        GENEROUS,
        &format!("{} runs {more} snapshot passes", daemon.socket.display()),
        || async { stats(daemon).await.snapshot_passes >= before + more },
    )
    .await;
}

/// Whether any file in the shared directory mentions `needle` (the bogus config is in a
/// segment: the directory is a replica that could bring it back).
fn shared_dir_mentions(shared: &Path, needle: &str) -> bool {
    fn walk(dir: &Path, needle: &str) -> bool {
        let Ok(listing) = std::fs::read_dir(dir) else {
            return false;
        };
        listing.filter_map(Result::ok).any(|e| {
            let path = e.path();
            if path.is_dir() {
                walk(&path, needle)
            } else {
                std::fs::read(&path)
                    .is_ok_and(|bytes| String::from_utf8_lossy(&bytes).contains(needle))
            }
        })
    }
    walk(shared, needle)
}

/// How results travel between the nodes of a test.
struct Tier {
    shared: PathBuf,
    /// The Redis tier's URL; `None`: the shared directory alone.
    redis_url: Option<String>,
    snapshot_interval_s: u64,
}

impl Tier {
    /// The issue's bound for a Forget (or a Record) to reach every node.
    fn bound(&self) -> Duration {
        match self.redis_url {
            Some(_) => Duration::from_secs(1),
            // Two snapshot intervals, plus 1 s of slack for passes that start late on a
            // loaded machine.
            None => Duration::from_secs(2 * self.snapshot_interval_s + 1),
        }
    }

    fn name(&self) -> &'static str {
        if self.redis_url.is_some() {
            "redis"
        } else {
            "shared dir"
        }
    }

    /// A node named `name` in `dir/name`, tuner off, on this tier; connected to Redis and
    /// bootstrapped when there is one.
    async fn node(&self, dir: &Path, name: &str) -> TestDaemon {
        let node_dir = dir.join(name);
        std::fs::create_dir_all(&node_dir).unwrap();
        let interval = self.snapshot_interval_s.to_string();
        let mut options = DaemonOptions::new(&node_dir).args([
            "--node-name",
            name,
            "--tuner",
            "off",
            "--shared-dir",
            self.shared.to_str().unwrap(),
            "--snapshot-interval",
            interval.as_str(),
        ]);
        if let Some(url) = &self.redis_url {
            options = options.args(["--cluster-url", url.as_str()]);
        }
        let daemon = options.process().await;
        self.wait_ready(&daemon).await;
        daemon
    }

    async fn wait_ready(&self, daemon: &TestDaemon) {
        if self.redis_url.is_some() {
            wait_connected(daemon).await;
        }
    }

    /// SIGKILL, then the same node again (journal, state dir and flags kept).
    async fn kill_and_restart(&self, daemon: &mut TestDaemon) {
        daemon.kill();
        daemon.restart().await;
        self.wait_ready(daemon).await;
    }

    /// Lets every node hear from every other: two rounds of Snapshot passes (the first
    /// publishes, the second reads what all published), and with Redis a marker recorded on
    /// each node that every other node must see.
    async fn exchange(&self, nodes: &[&TestDaemon], tag: &str) {
        for _ in 0..2 {
            for node in nodes {
                snapshot_pass(node).await;
            }
        }
        if self.redis_url.is_none() {
            return;
        }
        for (i, from) in nodes.iter().enumerate() {
            let marker = key_in("marker", "sync", &format!("{tag}-{i}"), None);
            from.client()
                .await
                .record(vec![entry(marker.clone(), "{}", 1.0, "marker")])
                .await
                .unwrap();
            for to in nodes {
                wait_winner(to, &marker, "{}", 1.0, Instant::now(), GENEROUS).await;
            }
        }
    }
}

/// What the scope tests record: a key whose good result is beaten by a bogus one, its
/// per-rank entries, another problem of the op, and entries outside the Forget's scope.
struct Scenario {
    main: proto::Key,
    /// Everything the Forget of (test, gemm) must drop: main, its ranks 0 and 1, p2.
    forgotten: Vec<proto::Key>,
    /// Outside the scope (another op, another namespace): must stay.
    kept: Vec<proto::Entry>,
}

fn scenario() -> Scenario {
    let main = key_in("test", "gemm", "p1", None);
    Scenario {
        forgotten: vec![
            main.clone(),
            key_in("test", "gemm", "p1", Some(0)),
            key_in("test", "gemm", "p1", Some(1)),
            key_in("test", "gemm", "p2", None),
        ],
        main,
        kept: vec![
            entry(key_in("test", "conv", "p1", None), GOOD, 3.0, "kept"),
            entry(key_in("other", "gemm", "p1", None), GOOD, 3.0, "kept"),
        ],
    }
}

impl Scenario {
    /// The good result, then the bogus ones that beat it, on `daemon`; waits until every one
    /// of `nodes` serves the bogus winners and the kept entries.
    async fn record_bogus(&self, daemon: &TestDaemon, by: &str, nodes: &[&TestDaemon]) {
        let client = daemon.client().await;
        client
            .record(vec![entry(self.main.clone(), GOOD, 41.5, by)])
            .await
            .unwrap();
        let bogus: Vec<proto::Entry> = self
            .forgotten
            .iter()
            .map(|key| entry(key.clone(), BOGUS, 0.0, by))
            .collect();
        let stored = client.record(bogus).await.unwrap().stored;
        assert_eq!(stored, 4, "the bogus results beat what was there");
        client.record(self.kept.clone()).await.unwrap();
        for node in nodes {
            for key in &self.forgotten {
                wait_winner(node, key, BOGUS, 0.0, Instant::now(), GENEROUS).await;
            }
            self.assert_kept(node).await;
        }
    }

    async fn assert_kept(&self, daemon: &TestDaemon) {
        let client = daemon.client().await;
        for kept in &self.kept {
            let key = kept.key.as_ref().unwrap();
            let got = winner(&client, key).await;
            assert!(
                is(got.as_ref(), GOOD, 3.0),
                "{}: {key:?} is outside the Forget's scope and must stay, got {got:?}",
                daemon.socket.display()
            );
        }
    }

    /// Waits (generously) until the kept entries are on `daemon`: it has loaded what the
    /// other nodes hold.
    async fn wait_kept(&self, daemon: &TestDaemon) {
        for kept in &self.kept {
            let key = kept.key.as_ref().unwrap();
            wait_winner(daemon, key, GOOD, 3.0, Instant::now(), GENEROUS).await;
        }
    }
}

/// The scope tests' whole story on one tier: bogus winners everywhere, a scope Forget on A
/// (namespace + op, rank unset), then misses on A, B and a fresh C within the bound, a Record
/// after the Forget live on A within the bound, and nothing back after SIGKILL and restart.
async fn scope_forget_reaches_every_node_and_stays(tier: &Tier, dir: &Path) {
    let mut a = tier.node(dir, "a").await;
    let mut b = tier.node(dir, "b").await;
    let s = scenario();
    s.record_bogus(&a, "a", &[&a, &b]).await;
    // The bogus results are in the shared directory too (a replica that could bring them back).
    snapshot_pass(&a).await;
    snapshot_pass(&b).await;
    assert!(
        shared_dir_mentions(&tier.shared, "bogus"),
        "the bogus results should be in a segment before the Forget"
    );

    let forgotten = a
        .client()
        .await
        .forget(scope("test", "gemm"))
        .await
        .unwrap();
    let replied = Instant::now();
    assert_eq!(
        forgotten, 4,
        "A drops p1 (shared, rank 0, rank 1) and p2 of (test, gemm)"
    );
    let left = hits_among(&a, &s.forgotten).await;
    assert!(
        left.is_empty(),
        "A still serves after its own Forget: {left:?}"
    );
    s.assert_kept(&a).await;
    let on_b = wait_forgotten(&b, &s.forgotten, replied, GENEROUS).await;
    assert_within(
        &format!("[{}] scope Forget on A -> miss on B", tier.name()),
        on_b,
        tier.bound(),
    );
    s.assert_kept(&b).await;

    let stats_a = stats(&a).await;
    assert!(stats_a.forgets_received >= 1, "A: {stats_a:?}");
    assert_eq!(
        stats_a.forget_entries_dropped,
        u64::from(forgotten),
        "A's forget_entries_dropped is what its Forget answered"
    );
    assert!(
        stats_a.tombstones_held >= 1,
        "A keeps the Forget: {stats_a:?}"
    );
    let stats_b = stats(&b).await;
    assert!(
        stats_b.forgets_received >= 1,
        "B learned the Forget: {stats_b:?}"
    );
    assert_eq!(
        stats_b.forget_entries_dropped, 4,
        "B dropped the same four entries"
    );

    // A fresh node on the same shared directory (which still holds the bogus segments) and
    // the same Redis.
    let c = tier.node(dir, "c").await;
    s.wait_kept(&c).await;
    eventually(GENEROUS, "C read the shared directory", || async {
        let stats_c = stats(&c).await;
        stats_c.snapshot_passes >= 1 && stats_c.peer_segments_loaded >= 1
    })
    .await;
    let c_ready = Instant::now();
    let on_c = wait_forgotten(&c, &s.forgotten, c_ready, GENEROUS).await;
    assert_within(
        &format!("[{}] fresh node C, from loaded to miss", tier.name()),
        on_c,
        tier.bound(),
    );

    // A result recorded after the Forget counts.
    b.client()
        .await
        .record(vec![entry(
            s.main.clone(),
            GOOD_AFTER,
            GOOD_AFTER_TIME,
            "b",
        )])
        .await
        .unwrap();
    let recorded = Instant::now();
    let on_a = wait_winner(&a, &s.main, GOOD_AFTER, GOOD_AFTER_TIME, recorded, GENEROUS).await;
    assert_within(
        &format!("[{}] Record on B after the Forget -> hit on A", tier.name()),
        on_a,
        tier.bound(),
    );

    // SIGKILL and restart: the journals hold the good and the bogus results and the Forget.
    tier.kill_and_restart(&mut a).await;
    tier.kill_and_restart(&mut b).await;
    tier.exchange(&[&a, &b, &c], "after-restart").await;
    let (gone, main_key) = (&s.forgotten[1..], &s.main);
    for node in [&a, &b, &c] {
        let left = hits_among(node, gone).await;
        assert!(
            left.is_empty(),
            "{} after A and B were SIGKILLed and restarted: forgotten entries are back: {left:?}",
            node.socket.display()
        );
        let got = winner(&node.client().await, main_key).await;
        assert!(
            is(got.as_ref(), GOOD_AFTER, GOOD_AFTER_TIME),
            "{}: {main_key:?} must be the result recorded after the Forget, not an older one \
             brought back; got {got:?}",
            node.socket.display()
        );
        s.assert_kept(node).await;
    }
    // And a node started after all that.
    let d = tier.node(dir, "d").await;
    s.wait_kept(&d).await;
    tier.exchange(&[&a, &b, &c, &d], "fresh-d").await;
    let left = hits_among(&d, gone).await;
    assert!(
        left.is_empty(),
        "fresh node D: forgotten entries are back: {left:?}"
    );
    let got = winner(&d.client().await, main_key).await;
    assert!(is(got.as_ref(), GOOD_AFTER, GOOD_AFTER_TIME), "D: {got:?}");
    assert_healthy(&[&a, &b, &c, &d]).await;
}

/// No node saw a shared-directory error, dropped an invalid entry it loaded, or found an
/// entry the Redis stream never announced.
async fn assert_healthy(nodes: &[&TestDaemon]) {
    for node in nodes {
        let stats = stats(node).await;
        assert_eq!(
            (
                stats.snapshot_errors,
                stats.snapshot_invalid_entries,
                stats.cluster_audit_repaired
            ),
            (0, 0, 0),
            "{}: snapshot errors, invalid entries loaded, audit repairs: {stats:?}",
            node.socket.display()
        );
    }
}

/// A Redis server and a shared directory with hourly snapshots: only Redis can carry the
/// Forget within a second. The shared directory holds the bogus results (written by Snapshot
/// RPCs), and must not bring them back.
fn redis_tier(dir: &Path) -> (Redis, Tier) {
    let redis = Redis::start(dir, free_port(), &[]);
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let tier = Tier {
        shared,
        redis_url: Some(redis.url()),
        snapshot_interval_s: 3600,
    };
    (redis, tier)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_forget_with_redis_reaches_every_node_within_a_second_and_stays() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_redis, tier) = redis_tier(dir.path());
    scope_forget_reaches_every_node_and_stays(&tier, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_forget_over_the_shared_directory_reaches_every_node_within_two_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let tier = Tier {
        shared,
        redis_url: None,
        snapshot_interval_s: 1,
    };
    scope_forget_reaches_every_node_and_stays(&tier, dir.path()).await;
}

/// One daemon of `kind`, tuner off.
async fn lone_daemon(kind: Kind, dir: &Path, extra: &[&str]) -> TestDaemon {
    DaemonOptions::new(dir)
        .args(["--tuner", "off"])
        .args(extra.iter().copied())
        .start(kind)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_key_forget_drops_only_the_winner_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = lone_daemon(Kind::Process, dir.path(), &[]).await;
    let client = daemon.client().await;

    // The winner named: dropped.
    let named = key_in("test", "gemm", "named", None);
    client
        .record(vec![entry(named.clone(), BOGUS, 0.0, "r")])
        .await
        .unwrap();
    let forgotten = client.forget(exact(&named, BOGUS, 0.0)).await.unwrap();
    assert_eq!(forgotten, 1, "only_if equal to the winner drops it");
    assert_eq!(
        winner(&client, &named).await,
        None,
        "the named winner is gone"
    );

    // A better result recorded since: nothing dropped.
    let moved = key_in("test", "gemm", "moved-on", None);
    client
        .record(vec![entry(moved.clone(), BOGUS, 20.0, "r")])
        .await
        .unwrap();
    client
        .record(vec![entry(moved.clone(), GOOD, 5.0, "r")])
        .await
        .unwrap();
    let forgotten = client.forget(exact(&moved, BOGUS, 20.0)).await.unwrap();
    assert_eq!(forgotten, 0, "the winner is no longer the one named");
    // The same config at another time, another config at the same time: nothing either.
    assert_eq!(client.forget(exact(&moved, GOOD, 6.0)).await.unwrap(), 0);
    assert_eq!(client.forget(exact(&moved, BOGUS, 5.0)).await.unwrap(), 0);
    let got = winner(&client, &moved).await;
    assert!(
        is(got.as_ref(), GOOD, 5.0),
        "the better result stays: {got:?}"
    );

    // A rank's entry and the shared one are different exact keys.
    let shared_key = key_in("test", "gemm", "ranked", None);
    let rank_key = key_in("test", "gemm", "ranked", Some(3));
    client
        .record(vec![
            entry(shared_key.clone(), BOGUS, 7.0, "r"),
            entry(rank_key.clone(), BOGUS, 7.0, "r"),
        ])
        .await
        .unwrap();
    assert_eq!(
        client.forget(exact(&rank_key, BOGUS, 7.0)).await.unwrap(),
        1
    );
    assert_eq!(
        winner(&client, &rank_key).await,
        None,
        "rank 3's entry is gone"
    );
    let got = winner(&client, &shared_key).await;
    assert!(
        is(got.as_ref(), BOGUS, 7.0),
        "the shared entry stays: {got:?}"
    );
    assert_eq!(
        client.forget(exact(&shared_key, BOGUS, 7.0)).await.unwrap(),
        1,
        "unset rank: the shared entry"
    );
    assert_eq!(winner(&client, &shared_key).await, None);

    // An exact Forget needs all four strings.
    let mut partial = exact(&moved, GOOD, 5.0);
    partial.problem.clear();
    let refused = client.forget(partial).await;
    assert!(
        refused.is_err(),
        "only_if without a problem is not an exact key: {refused:?}"
    );
    let got = winner(&client, &moved).await;
    assert!(is(got.as_ref(), GOOD, 5.0), "nothing dropped: {got:?}");

    // A result recorded after the Forget is live.
    client
        .record(vec![entry(named.clone(), GOOD, 9.0, "r")])
        .await
        .unwrap();
    let got = winner(&client, &named).await;
    assert!(
        is(got.as_ref(), GOOD, 9.0),
        "recorded after the Forget: {got:?}"
    );

    let stats = client.stats().await.unwrap();
    assert_eq!(stats.forget_entries_dropped, 3, "{stats:?}");
    assert_eq!(stats.forgets_refused, 0, "{stats:?}");

    // SIGKILL and restart: the journal, the only replica here, holds the forgotten results
    // and the Forgets; what was dropped stays dropped, what was not stays.
    daemon.kill();
    daemon.restart().await;
    let client = daemon.client().await;
    for key in [&rank_key, &shared_key] {
        let got = winner(&client, key).await;
        assert_eq!(got, None, "after SIGKILL and restart {key:?} is back");
    }
    let got = winner(&client, &named).await;
    assert!(
        is(got.as_ref(), GOOD, 9.0),
        "after restart, the result recorded after the Forget, not the forgotten one: {got:?}"
    );
    let got = winner(&client, &moved).await;
    assert!(is(got.as_ref(), GOOD, 5.0), "after restart: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_forget_stats_count_it_and_resolve_tunes_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = lone_daemon(Kind::Process, dir.path(), &[]).await;
    let client = daemon.client().await;
    let s = scenario();
    s.record_bogus(&daemon, "r", &[&daemon]).await;

    // A scope with a rank: only that rank's entries.
    let mut rank_one = scope("test", "gemm");
    rank_one.rank = Some(1);
    assert_eq!(
        client.forget(rank_one).await.unwrap(),
        1,
        "rank 1's entry of p1"
    );
    let got = winner(&client, &s.forgotten[2]).await;
    assert_eq!(got, None, "rank 1's entry is gone");
    for key in [&s.forgotten[0], &s.forgotten[1], &s.forgotten[3]] {
        let got = winner(&client, key).await;
        assert!(is(got.as_ref(), BOGUS, 0.0), "{key:?} stays: {got:?}");
    }
    // The namespace alone, rank unset: the shared and the per-rank entries.
    let rest = client.forget(scope("test", "")).await.unwrap();
    assert_eq!(rest, 4, "p1 shared, p1 rank 0, p2, and (test, conv, p1)");
    let left = hits_among(&daemon, &s.forgotten).await;
    assert!(left.is_empty(), "{left:?}");

    let stats = client.stats().await.unwrap();
    assert!(stats.forgets_received >= 2, "{stats:?}");
    assert_eq!(
        stats.forget_entries_dropped,
        u64::from(1 + rest),
        "forget_entries_dropped is what the Forgets answered: {stats:?}"
    );
    assert!(stats.tombstones_held >= 1, "{stats:?}");
    assert_eq!(stats.forgets_refused, 0, "{stats:?}");

    // The next Resolve of a forgotten key tunes again.
    let resolution = client
        .resolve(
            s.main.clone(),
            ResolveOptions {
                wait: Duration::ZERO,
                can_tune: true,
                lease: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    let Resolution::TuneHere(lease) = resolution else {
        panic!("a forgotten key must be tuned again, got {resolution:?}");
    };
    // The new result, recorded with the lease, is live; a client's forget_epoch is not
    // taken (the daemon sets it).
    let mut tuned = entry(s.main.clone(), GOOD, 12.0, "retuned");
    tuned.result.as_mut().unwrap().forget_epoch = u64::MAX;
    client
        .record_with_lease(vec![tuned], lease.lease_id.clone())
        .await
        .unwrap();
    let got = winner(&client, &s.main).await.expect("the retuned result");
    assert!(is(Some(&got), GOOD, 12.0), "{got:?}");
    assert!(
        got.forget_epoch > 0 && got.forget_epoch != u64::MAX,
        "recorded after a Forget of its key: the daemon's epoch, got {}",
        got.forget_epoch
    );
    // A key no Forget covered keeps epoch 0 whatever the client sent.
    let untouched = key_in("other", "gemm", "untouched", None);
    let mut e = entry(untouched.clone(), GOOD, 1.0, "r");
    e.result.as_mut().unwrap().forget_epoch = 999;
    client.record(vec![e]).await.unwrap();
    let got = winner(&client, &untouched).await.expect("recorded");
    assert_eq!(got.forget_epoch, 0, "no Forget covers {untouched:?}");

    // SIGKILL and restart: the journal alone brings nothing back, and the retuned result
    // stays the winner.
    daemon.kill();
    daemon.restart().await;
    let client = daemon.client().await;
    let left = hits_among(&daemon, &s.forgotten[1..]).await;
    assert!(left.is_empty(), "after SIGKILL and restart: {left:?}");
    let got = winner(&client, &s.main).await;
    assert!(
        is(got.as_ref(), GOOD, 12.0),
        "after restart the retuned result: {got:?}"
    );
    let stats = client.stats().await.unwrap();
    assert!(
        stats.tombstones_held >= 1,
        "the journal kept the Forgets: {stats:?}"
    );
}

// --- A caller that is not an administrator. ---

const NOBODY: &str = "65534";

/// `request` as uid/gid 65534 (no supplementary groups) on `socket`.
fn forget_as_nobody(setpriv: &Path, socket: &Path, request: &proto::ForgetRequest) -> Output {
    let mut command = Command::new(setpriv);
    command
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .arg(bin("tunecache"))
        .arg("--socket")
        .arg(socket)
        .args(["forget", "--namespace", &request.namespace]);
    for (flag, value) in [
        ("--op", &request.op),
        ("--device", &request.device),
        ("--problem", &request.problem),
    ] {
        if !value.is_empty() {
            command.args([flag, value]);
        }
    }
    if let Some(rank) = request.rank {
        command.args(["--rank", &rank.to_string()]);
    }
    if let Some(only_if) = &request.only_if {
        command
            .args(["--only-if-config", &only_if.config])
            .args(["--only-if-time-us", &only_if.time_us.to_string()]);
    }
    command.output().expect("run the Forget as uid 65534")
}

fn text(output: &Output) -> String {
    format!(
        "status {}; stdout: {}; stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Lets uid 65534 reach the socket through the file system.
fn open_to_everyone(dir: &Path, socket: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_forget_from_an_allowed_non_admin_is_refused_and_drops_nothing() {
    if !require_root("acting as uid 65534") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // uid 65534 may use the daemon (Record, Lookup, an exact Forget), but is no admin.
    let daemon = lone_daemon(Kind::Process, dir.path(), &["--allow-uid", NOBODY]).await;
    open_to_everyone(dir.path(), &daemon.socket);
    let s = scenario();
    s.record_bogus(&daemon, "r", &[&daemon]).await;

    let output = forget_as_nobody(&setpriv, &daemon.socket, &scope("test", ""));
    let said = text(&output);
    assert!(
        !output.status.success(),
        "a non-admin's scope Forget: {said}"
    );
    assert!(
        said.contains("PermissionDenied"),
        "PERMISSION_DENIED: {said}"
    );
    assert!(
        said.contains("--admin-uid"),
        "the refusal names the flag: {said}"
    );
    for key in &s.forgotten {
        let got = winner(&daemon.client().await, key).await;
        assert!(
            is(got.as_ref(), BOGUS, 0.0),
            "nothing dropped: {key:?} is {got:?}"
        );
    }
    s.assert_kept(&daemon).await;
    let stats = stats(&daemon).await;
    assert_eq!(stats.forget_entries_dropped, 0, "{stats:?}");
    assert_eq!(stats.forgets_refused, 1, "{stats:?}");
    assert_eq!(
        stats.forgets_received, 0,
        "a refused Forget is not applied: {stats:?}"
    );

    // An exact Forget is every allowed caller's: uid 65534 reports its broken config.
    let output = forget_as_nobody(
        &setpriv,
        &daemon.socket,
        &exact(&s.forgotten[3], BOGUS, 0.0),
    );
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(winner(&daemon.client().await, &s.forgotten[3]).await, None);
    let stats = self::stats(&daemon).await;
    assert_eq!(stats.forget_entries_dropped, 1, "{stats:?}");
    assert_eq!(stats.forgets_refused, 1, "{stats:?}");
    // Root (this test) is an admin by default.
    let dropped = daemon
        .client()
        .await
        .forget(scope("test", ""))
        .await
        .unwrap();
    assert_eq!(
        dropped, 4,
        "p1 shared, rank 0, rank 1, and (test, conv, p1)"
    );
    drop(daemon);

    // Made an admin with --admin-uid, the same caller's scope Forget is applied.
    let dir = tempfile::tempdir().unwrap();
    let daemon = lone_daemon(
        Kind::Process,
        dir.path(),
        &["--allow-uid", NOBODY, "--admin-uid", NOBODY],
    )
    .await;
    open_to_everyone(dir.path(), &daemon.socket);
    s.record_bogus(&daemon, "r", &[&daemon]).await;
    let output = forget_as_nobody(&setpriv, &daemon.socket, &scope("test", "gemm"));
    assert!(
        output.status.success(),
        "--admin-uid 65534: {}",
        text(&output)
    );
    let left = hits_among(&daemon, &s.forgotten).await;
    assert!(left.is_empty(), "{left:?}");
    let stats = self::stats(&daemon).await;
    assert_eq!(stats.forget_entries_dropped, 4, "{stats:?}");
    assert_eq!(stats.forgets_refused, 0, "{stats:?}");
}

// --- A node that was down during the Forget. ---

/// Nodes A, B, C; B records bogus results of its own (published by it: in its journal, its
/// segments, Redis), A records more; B is stopped with `stop`; A forgets; B starts again. B
/// must end without them, and so must A and C after B has published and they have read.
async fn a_node_down_during_the_forget_brings_nothing_back(
    tier: &Tier,
    dir: &Path,
    stop: fn(&mut TestDaemon),
) {
    let a = tier.node(dir, "a").await;
    let mut b = tier.node(dir, "b").await;
    let c = tier.node(dir, "c").await;
    let own_b = [
        key_in("test", "gemm", "b1", None),
        key_in("test", "gemm", "b1", Some(0)),
    ];
    let own_a = key_in("test", "gemm", "a1", None);
    let forgotten = [own_b[0].clone(), own_b[1].clone(), own_a.clone()];
    let kept = entry(key_in("test", "conv", "kept", None), GOOD, 3.0, "b");
    b.client()
        .await
        .record(vec![
            entry(own_b[0].clone(), BOGUS, 0.0, "b"),
            entry(own_b[1].clone(), BOGUS, 0.0, "b"),
            kept.clone(),
        ])
        .await
        .unwrap();
    a.client()
        .await
        .record(vec![entry(own_a.clone(), BOGUS, 0.0, "a")])
        .await
        .unwrap();
    for node in [&a, &b, &c] {
        for key in &forgotten {
            wait_winner(node, key, BOGUS, 0.0, Instant::now(), GENEROUS).await;
        }
    }
    snapshot_pass(&a).await;
    snapshot_pass(&b).await;
    assert!(shared_dir_mentions(&tier.shared, "bogus"));

    stop(&mut b);
    let forgotten_on_a = a
        .client()
        .await
        .forget(scope("test", "gemm"))
        .await
        .unwrap();
    let replied = Instant::now();
    assert_eq!(forgotten_on_a, 3, "b1 (shared and rank 0) and a1");
    let on_c = wait_forgotten(&c, &forgotten, replied, GENEROUS).await;
    assert_within(
        &format!("[{}] Forget on A while B is down -> miss on C", tier.name()),
        on_c,
        tier.bound(),
    );

    // B starts again with its journal (and its segments, and Redis) holding the results.
    let restarted = Instant::now();
    b.restart().await;
    tier.wait_ready(&b).await;
    let on_b = wait_forgotten(&b, &forgotten, restarted, GENEROUS).await;
    eprintln!(
        "MEASURED [{}] B down during the Forget: restart -> miss on B: {on_b:?}",
        tier.name()
    );
    let stats_b = stats(&b).await;
    assert!(
        stats_b.forgets_received >= 1,
        "B learned the Forget: {stats_b:?}"
    );
    // B has published and A and C have read (periodic passes, Snapshot passes, Redis markers).
    if tier.snapshot_interval_s <= 5 {
        wait_passes(&b, 2).await;
        wait_passes(&a, 2).await;
        wait_passes(&c, 2).await;
    }
    tier.exchange(&[&b, &a, &c], "after-b").await;
    for node in [&a, &b, &c] {
        let left = hits_among(node, &forgotten).await;
        assert!(
            left.is_empty(),
            "{}: B, down during the Forget, brought entries back: {left:?}; B's {}",
            node.socket.display(),
            b.diagnostics()
        );
        let got = winner(&node.client().await, kept.key.as_ref().unwrap()).await;
        assert!(is(got.as_ref(), GOOD, 3.0), "outside the scope: {got:?}");
    }
    assert_healthy(&[&a, &b, &c]).await;
}

fn sigkill(daemon: &mut TestDaemon) {
    daemon.kill();
}

fn sigterm(daemon: &mut TestDaemon) {
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM: {status}; log:\n{}",
        daemon.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_sigkilled_during_a_forget_with_redis_resurrects_nothing() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_redis, tier) = redis_tier(dir.path());
    a_node_down_during_the_forget_brings_nothing_back(&tier, dir.path(), sigkill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_sigtermed_during_a_forget_over_the_shared_directory_resurrects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let tier = Tier {
        shared,
        redis_url: None,
        snapshot_interval_s: 1,
    };
    // SIGTERM: B publishes what it holds on the way out, so its last segment has them.
    a_node_down_during_the_forget_brings_nothing_back(&tier, dir.path(), sigterm).await;
}

/// A version-1 whole-cache file, as a daemon before version 2 (and before Forget) writes it.
fn write_v1_file(shared: &Path, node: &str, written_at: i64, problems: &[&str]) {
    let entries: Vec<_> = problems
        .iter()
        .map(|problem| {
            serde_json::json!({"namespace": "test", "op": "gemm", "device": TEST_DEVICE,
                "problem": problem, "config": BOGUS, "time_us": 0.0,
                "tuned_by": node, "tuned_at_unix_ms": 1})
        })
        .collect();
    let document = serde_json::json!({"format": "tunecache-snapshot", "version": 1,
        "node": node, "written_at_unix_ms": written_at, "entry_count": entries.len(),
        "entries": entries});
    let path = shared.join(format!("{node}.tunecache.json"));
    let temp = shared.join(format!(".{node}.tmp"));
    std::fs::write(&temp, serde_json::to_vec(&document).unwrap()).unwrap();
    std::fs::rename(temp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_file_of_an_old_daemon_brings_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    write_v1_file(&shared, "old-node", 1, &["v1-a", "v1-b"]);
    for node in ["a", "b"] {
        std::fs::create_dir_all(dir.path().join(node)).unwrap();
    }
    let shared_arg = shared.to_str().unwrap().to_owned();
    let flags = ["--shared-dir", &shared_arg, "--snapshot-interval", "1"];
    let a = lone_daemon(Kind::InProcess, &dir.path().join("a"), &flags).await;
    let keys = [
        key_in("test", "gemm", "v1-a", None),
        key_in("test", "gemm", "v1-b", None),
    ];
    eventually(
        GENEROUS,
        "node a serves the version-1 file's entries",
        || async { hits_among(&a, &keys).await.len() == 2 },
    )
    .await;
    let forgotten = a
        .client()
        .await
        .forget(scope("test", "gemm"))
        .await
        .unwrap();
    assert_eq!(forgotten, 2);
    // The old daemon writes its file again (same entries, a new version): read again, and
    // still dropped, as is a fresh node's first read of it.
    let loaded = stats(&a).await.peer_files_loaded;
    write_v1_file(&shared, "old-node", 2, &["v1-a", "v1-b"]);
    eventually(
        GENEROUS,
        "node a reads the new version of the file",
        || async { stats(&a).await.peer_files_loaded > loaded },
    )
    .await;
    wait_passes(&a, 1).await;
    assert_eq!(hits_among(&a, &keys).await, vec![], "{}", a.diagnostics());
    let b = lone_daemon(Kind::InProcess, &dir.path().join("b"), &flags).await;
    wait_passes(&b, 2).await;
    assert!(stats(&b).await.peer_files_loaded >= 1);
    assert_eq!(hits_among(&b, &keys).await, vec![], "{}", b.diagnostics());
    // What is recorded after the Forget lives, on both.
    let after = key_in("test", "gemm", "v1-a", None);
    a.client()
        .await
        .record(vec![proto::Entry {
            key: Some(after.clone()),
            result: Some(result(GOOD_AFTER, GOOD_AFTER_TIME, "a")),
        }])
        .await
        .unwrap();
    wait_winner(
        &b,
        &after,
        GOOD_AFTER,
        GOOD_AFTER_TIME,
        Instant::now(),
        GENEROUS,
    )
    .await;
}

/// A result published to Redis after the Forget, by a node that had not heard of it yet
/// (here put back by hand, as that node's late publish would): the audit finds the shard
/// differing, deletes the entry from Redis, and no node serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_result_published_late_to_redis_is_deleted_by_the_audit() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let a = tunecache_integration::redis::cluster_node(
        dir.path(),
        "a",
        &redis.url(),
        &["--cluster-audit-secs", "1"],
    )
    .in_process()
    .await;
    wait_connected(&a).await;
    let late = key_in("test", "gemm", "late", None);
    a.client()
        .await
        .record(vec![proto::Entry {
            key: Some(late.clone()),
            result: Some(result(BOGUS, 0.0, "a")),
        }])
        .await
        .unwrap();
    let name = eventually_some(GENEROUS, "the late entry in redis", || {
        redis.entry_name("gemm", "late")
    })
    .await;
    let fields: Vec<String> = ["t", "c", "b", "a"]
        .iter()
        .map(|field| redis.cli(&["HGET", &name, field]))
        .collect();
    assert_eq!(
        a.client()
            .await
            .forget(scope("test", "gemm"))
            .await
            .unwrap(),
        1
    );
    eventually(
        GENEROUS,
        "the forgetting node deletes the entry from redis",
        || async { redis.entry_name("gemm", "late").is_none() },
    )
    .await;
    let differing = stats(&a).await.cluster_audit_differing;
    // What the merge script does for a result it stores: the entry, and the shard's count
    // and digest (server/src/cluster/scripts.rs).
    let shard = &name["tunecache:e:{s".len()..]["".len()..2];
    let meta = format!("tunecache:m:{{s{shard}}}");
    let store_as_merge_does = r"
local h = redis.sha1hex(KEYS[1] .. '\0' .. ARGV[1] .. ARGV[4] .. #ARGV[2] .. ':' .. ARGV[2] .. ARGV[3])
local x = redis.call('HGET', KEYS[2], 'x') or '0000000000000000'
local hi = bit.bxor(tonumber(string.sub(x, 1, 8), 16), tonumber(string.sub(h, 1, 8), 16))
local lo = bit.bxor(tonumber(string.sub(x, 9, 16), 16), tonumber(string.sub(h, 9, 16), 16))
redis.call('HSET', KEYS[2], 'x', bit.tohex(hi, 8) .. bit.tohex(lo, 8))
redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[1], 't', ARGV[1], 'c', ARGV[2], 'b', ARGV[3], 'a', ARGV[4], 's', 1)
return 1";
    let stored = redis.cli(&[
        "EVAL",
        store_as_merge_does,
        "2",
        &name,
        &meta,
        &fields[0],
        &fields[1],
        &fields[2],
        &fields[3],
    ]);
    assert_eq!(stored, "1", "the late publish");
    assert!(redis.entry_name("gemm", "late").is_some());
    eventually(
        GENEROUS,
        "an audit deletes the late entry from redis",
        || async { redis.entry_name("gemm", "late").is_none() },
    )
    .await;
    let stats = stats(&a).await;
    assert!(stats.cluster_audit_differing > differing, "{stats:?}");
    assert_eq!(stats.cluster_audit_repaired, 0, "{stats:?}");
    assert_eq!(hits_among(&a, &[late]).await, vec![], "{}", a.diagnostics());
}

/// Tombstones past `--forget-retention-days` leave Redis too: the hash a connecting node
/// reads stays bounded. (Retention 0: every tombstone is past it a millisecond later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_past_the_retention_is_deleted_from_redis() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let flags = ["--forget-retention-days", "0"];
    let a = tunecache_integration::redis::cluster_node(dir.path(), "a", &redis.url(), &flags)
        .process()
        .await;
    wait_connected(&a).await;
    a.client()
        .await
        .forget(scope("test", "gemm"))
        .await
        .unwrap();
    let hash = "tunecache:forgets:{f}";
    eventually(GENEROUS, "the tombstone is in redis", || async {
        redis.cli(&["HLEN", hash]) == "1"
    })
    .await;
    let b = tunecache_integration::redis::cluster_node(dir.path(), "b", &redis.url(), &flags)
        .process()
        .await;
    wait_connected(&b).await;
    eventually(
        GENEROUS,
        "the expired tombstone is deleted from redis",
        || async { redis.cli(&["HLEN", hash]) == "0" },
    )
    .await;
    assert!(
        b.log().contains("past --forget-retention-days"),
        "{}",
        b.log()
    );
}
