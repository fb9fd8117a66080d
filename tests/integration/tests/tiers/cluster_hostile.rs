//! What the cluster tier reads from Redis is trusted no more than a client (issue 39, findings
//! 7 to 9), against a real `redis-server`: values no client could send are refused from every
//! source, a key of the wrong type costs a log line and not a reconnect loop, every failure
//! path backs off, and tombstones in Redis are expired by Redis's clock, not a node's.

use std::time::Duration;

use tunecache_client::proto;
use tunecache_integration::redis::{
    cluster_node, free_port, wait_connected, wait_for_all, wait_for_hit, Redis,
};
use tunecache_integration::{entry, eventually_sync, test_key};

/// The shard of a key text, as the daemon computes it (FNV-1a, mod 16).
fn shard_of(text: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % 16) as usize
}

/// The `t` field of a result of epoch 0 taking `time_us` (docs/cluster.md).
fn t_field(time_us: f64) -> String {
    let bits = time_us.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    format!("{:016x}{ordered:016x}", u64::MAX)
}

/// The `a` field of `tuned_at_unix_ms`.
fn a_field(at: i64) -> String {
    format!("{:016x}", (at as u64) ^ (1 << 63))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A string field given as text, or made in Redis as `n` copies of `fill` (huge values never
/// pass through a command line).
enum Field {
    Text(&'static str),
    Repeat(char, usize),
}

impl Field {
    fn rust(&self) -> String {
        match self {
            Field::Text(text) => (*text).to_owned(),
            Field::Repeat(fill, n) => fill.to_string().repeat(*n),
        }
    }

    fn lua_args(&self) -> [String; 2] {
        match self {
            Field::Text(text) => [(*text).to_owned(), "0".to_owned()],
            Field::Repeat(fill, n) => [fill.to_string(), n.to_string()],
        }
    }
}

/// Writes into Redis, as a hostile neighbour with access to it would, an entry of key
/// (`namespace`, `op`, "test-device", `problem`, no rank): its hash, and its announcement on
/// its shard's stream with the shard's next sequence number.
fn plant_entry(redis: &Redis, namespace: Field, op: Field, problem: Field) {
    let text = serde_json::to_string(&(
        namespace.rust(),
        op.rust(),
        "test-device",
        problem.rust(),
        None::<u32>,
    ))
    .unwrap();
    let shard = shard_of(&text);
    let script = r#"
local function field(value, n)
  if tonumber(n) > 0 then return string.rep(value, tonumber(n)) end
  return value
end
local k = '["' .. field(ARGV[1], ARGV[2]) .. '","' .. field(ARGV[3], ARGV[4]) ..
  '","test-device","' .. field(ARGV[5], ARGV[6]) .. '",null]'
local seq = redis.call('HINCRBY', KEYS[2], 's', 1)
redis.call('HSET', ARGV[9] .. k, 't', ARGV[7], 'c', '{}', 'b', 'mallory', 'a', ARGV[8], 's', seq)
redis.call('XADD', KEYS[1], '*', 'k', k, 't', ARGV[7], 'c', '{}', 'b', 'mallory',
  'a', ARGV[8], 'n', 'mallory/0000000000000000', 's', seq)
return #k
"#;
    let log = format!("tunecache:log:{{s{shard:02}}}");
    let meta = format!("tunecache:m:{{s{shard:02}}}");
    let entry_prefix = format!("tunecache:e:{{s{shard:02}}}");
    let mut args = vec![
        "EVAL".to_owned(),
        script.to_owned(),
        "2".to_owned(),
        log,
        meta,
    ];
    for field in [namespace, op, problem] {
        args.extend(field.lua_args());
    }
    args.extend([t_field(2.0), a_field(1_700_000_000_000), entry_prefix]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let written = redis.cli(&args);
    assert_eq!(written, text.len().to_string(), "planting {}", &text[..60]);
}

/// Writes a tombstone of a scope whose namespace is `namespace_bytes` long into the
/// tombstone hash and announces it on the forget stream.
fn plant_tombstone(redis: &Redis, namespace_bytes: usize) {
    let stamp = format!("{:016x}", (now_ms() as u64) << 16);
    let script = r#"
local scope = '["' .. string.rep('n', tonumber(ARGV[1])) .. '","","","",null,true]'
redis.call('HSET', KEYS[1], scope, ARGV[2])
redis.call('XADD', KEYS[2], '*', 'f', ARGV[2] .. ' ' .. scope, 'n', 'mallory/0000000000000000')
return 1
"#;
    let n = namespace_bytes.to_string();
    let args = [
        "EVAL",
        script,
        "2",
        "tunecache:forgets:{f}",
        "tunecache:flog:{f}",
        n.as_str(),
        stamp.as_str(),
    ];
    assert_eq!(redis.cli(&args), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_values_a_client_could_not_send_are_refused_from_every_source() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &[])
        .process()
        .await;
    let mut follower = cluster_node(dir.path(), "a", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&writer).await;
    wait_connected(&follower).await;
    let legit = entry(test_key("hostile", "legit"), "{}", 1.0, "w");
    writer
        .client()
        .await
        .record(vec![legit.clone()])
        .await
        .unwrap();
    wait_for_hit(
        &follower,
        legit.key.as_ref().unwrap(),
        None,
        Duration::from_secs(5),
    )
    .await;

    // What no Record could carry, announced on the streams and stored as entries: an empty
    // namespace (no client could Lookup or Forget it), a 1 MiB problem, a 20 MiB op.
    plant_entry(
        &redis,
        Field::Text(""),
        Field::Text("gemm"),
        Field::Text("p"),
    );
    plant_entry(
        &redis,
        Field::Text("test"),
        Field::Text("gemm"),
        Field::Repeat('p', 1 << 20),
    );
    plant_entry(
        &redis,
        Field::Text("test"),
        Field::Repeat('o', 20 << 20),
        Field::Text("p"),
    );
    // And a tombstone whose scope names a 4 MiB namespace, in the hash and on the stream.
    plant_tombstone(&redis, 4 << 20);

    // A legitimate entry after them: once it arrives, the stream read that brought the
    // planted ones is done.
    let marker = entry(test_key("hostile", "marker"), "{}", 1.0, "w");
    writer
        .client()
        .await
        .record(vec![marker.clone()])
        .await
        .unwrap();
    wait_for_hit(
        &follower,
        marker.key.as_ref().unwrap(),
        None,
        Duration::from_secs(10),
    )
    .await;
    // A node that bootstraps now reads the planted entry hashes and the tombstone hash.
    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&fresh).await;
    wait_for_all(
        &fresh,
        &[legit.clone(), marker.clone()],
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    // Each refusal is counted where it was read: the follower refused the three
    // announcements and the tombstone on the forget stream; the fresh node the three entry
    // hashes (their names hold the keys) and the tombstone in the hash.
    follower
        .wait_for_stats("refusals", |s| {
            s.cluster_refused_stream >= 3 && s.cluster_refused_tombstones >= 1
        })
        .await;
    fresh
        .wait_for_stats("refusals", |s| {
            s.cluster_refused_entries >= 3 && s.cluster_refused_tombstones >= 1
        })
        .await;
    for (daemon, source) in [(&follower, "the streams"), (&fresh, "the entry hashes")] {
        let stats = daemon.stats().await;
        assert_eq!(
            stats.entries, 2,
            "a node learning from {source} kept entries no client could record: {stats:?}"
        );
        assert_eq!(
            stats.tombstones_held, 0,
            "a node kept a tombstone no client could make: {stats:?}"
        );
        assert!(
            stats.journal_bytes < 1 << 20,
            "the journal holds what was refused: {} bytes",
            stats.journal_bytes
        );
    }
    for daemon in [&follower, &fresh] {
        let log = daemon.log();
        assert_eq!(
            log.matches("refused a value read from redis").count(),
            2,
            "one line for each source that refused something:\n{log}"
        );
        assert!(log.len() < 1 << 20, "the log holds the refused values");
    }
    // Nothing of it in the journal either: the follower comes back with the same two.
    follower.kill();
    follower.restart().await;
    let stats = follower.stats().await;
    assert_eq!(stats.entries, 2, "{stats:?}");
    assert_eq!(stats.tombstones_held, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_key_is_named_once_and_the_rest_of_the_bootstrap_goes_on() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let mut writer = cluster_node(dir.path(), "w", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&writer).await;
    let recorded: Vec<proto::Entry> = (0..64)
        .map(|i| {
            entry(
                test_key("wrongtype", &format!("k{i}")),
                "{}",
                1.0 + f64::from(i),
                "w",
            )
        })
        .collect();
    writer
        .client()
        .await
        .record(recorded.clone())
        .await
        .unwrap();
    writer
        .wait_for_stats("published", |s| s.cluster_published >= 64)
        .await;
    writer.terminate(Duration::from_secs(10));
    // The tombstone hash and one entry replaced by strings.
    assert_eq!(
        redis.cli(&["SET", "tunecache:forgets:{f}", "not a hash"]),
        "OK"
    );
    let damaged = redis.entry_name("wrongtype", "k0").expect("k0 in redis");
    assert_eq!(redis.cli(&["SET", &damaged, "not a hash"]), "OK");

    let before = redis.info_number("stats", "total_connections_received");
    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    writer.restart().await;
    for daemon in [&fresh, &writer] {
        wait_connected(daemon).await;
    }
    // Every other entry arrives on the fresh node: the rest of the bootstrap went on.
    wait_for_all(&fresh, &recorded[1..], Duration::from_secs(10))
        .await
        .unwrap();
    // No reconnect loop: over five seconds, at most one new connection a second, both nodes.
    let settled = redis.info_number("stats", "total_connections_received");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = redis.info_number("stats", "total_connections_received");
    eprintln!(
        "connections: {} while starting, {} in the next 5 s",
        settled - before,
        after - settled
    );
    assert!(
        after - settled <= 5,
        "{} connections in 5 s; log:\n{}",
        after - settled,
        fresh.log()
    );
    for daemon in [&fresh, &writer] {
        let log = daemon.log();
        let named = log.matches("tunecache:forgets:{f}").count();
        assert_eq!(named, 1, "the damaged key is named once:\n{log}");
        let stats = daemon.stats().await;
        assert!(
            stats
                .cluster_wrong_type_keys
                .contains("tunecache:forgets:{f}"),
            "{}",
            stats.cluster_wrong_type_keys
        );
    }
    // The fresh node bootstrapped the damaged entry's name too: it is listed there as well.
    let stats = fresh.stats().await;
    assert!(
        stats.cluster_wrong_type_keys.contains(&damaged),
        "{}",
        stats.cluster_wrong_type_keys
    );
    // Repaired by hand: the next reading of the hash takes it off the list.
    assert_eq!(redis.cli(&["DEL", "tunecache:forgets:{f}"]), "1");
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    fresh
        .wait_for_stats("the repaired key off the list", |s| {
            !s.cluster_wrong_type_keys.contains("forgets")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_redis_refuses_backs_the_node_off() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    // An ACL user that may not XREAD: every stream read fails right after connecting.
    let acl = [
        "ACL",
        "SETUSER",
        "tunecache",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-xread",
    ];
    assert_eq!(redis.cli(&acl), "OK");
    let url = format!("redis://tunecache:pw@127.0.0.1:{}", redis.port);
    let node = cluster_node(dir.path(), "a", &url, &[]).process().await;
    node.wait_for_stats("bootstrapped", |s| s.cluster_bootstrapped)
        .await;
    // Ten seconds: the backoff reaches its longest waits (100 ms doubling to 5 s).
    let start = redis.info_number("stats", "total_connections_received");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let made = redis.info_number("stats", "total_connections_received") - start;
    eprintln!("connections in 10 s while every stream read is refused: {made}");
    assert!(
        made <= 10 * 3,
        "{made} connections in 10 s:\n{}",
        node.log()
    );
    assert!(node.log().contains("NOPERM"), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_clock_100_days_fast_deletes_no_tombstone() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let a = cluster_node(dir.path(), "a", &redis.url(), &[])
        .process()
        .await;
    let mut b = cluster_node(dir.path(), "b", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    let recorded: Vec<proto::Entry> = (0..20)
        .map(|i| entry(test_key("clock", &format!("k{i}")), "{}", 1.0, "a"))
        .collect();
    a.client().await.record(recorded.clone()).await.unwrap();
    wait_for_all(&b, &recorded, Duration::from_secs(10))
        .await
        .unwrap();
    // Node b is down while every one of them is forgotten.
    b.terminate(Duration::from_secs(10));
    let client = a.client().await;
    for e in &recorded {
        let key = e.key.clone().unwrap();
        let forgotten = client
            .forget(proto::ForgetRequest {
                namespace: key.namespace,
                op: key.op,
                device: key.device,
                problem: key.problem,
                rank: key.rank,
                only_if: e.result.clone(),
            })
            .await
            .unwrap();
        assert_eq!(forgotten, 1);
    }
    eventually_sync(
        Duration::from_secs(10),
        "the forgets reaching redis",
        || redis.cli(&["HLEN", "tunecache:forgets:{f}"]) == "20",
    )
    .await;
    // A node whose clock runs 100 days fast joins.
    let offset = (100i64 * 24 * 3600 * 1000).to_string();
    let fast = cluster_node(
        dir.path(),
        "fast",
        &redis.url(),
        &["--cluster-clock-offset-ms", &offset],
    )
    .process()
    .await;
    wait_connected(&fast).await;
    // It has read Redis's TIME and judged the skew: from here on it prunes nothing.
    fast.wait_for_stats("the skew judged", |s| s.cluster_prune_paused)
        .await;
    assert_eq!(
        redis.cli(&["HLEN", "tunecache:forgets:{f}"]),
        "20",
        "the node with a fast clock deleted tombstones; log:\n{}",
        fast.log()
    );
    let skewed = fast.stats().await;
    let day = 86_400_000i64;
    assert!(
        (99 * day..101 * day).contains(&skewed.cluster_clock_skew_ms),
        "{}",
        skewed.cluster_clock_skew_ms
    );
    assert!(skewed.cluster_prune_paused);
    // Nor does it expire entries: its days are as wrong as its clock (issue 51).
    assert!(
        skewed.expiry_paused.contains("clock"),
        "{:?}",
        skewed.expiry_paused
    );
    assert!(
        fast.log().contains("clock and redis's differ"),
        "{}",
        fast.log()
    );
    // A node whose clock agrees with Redis's pauses nothing.
    let fine = a.stats().await;
    assert!(!fine.cluster_prune_paused);
    assert!(fine.expiry_paused.is_empty(), "{:?}", fine.expiry_paused);
    assert!(
        fine.cluster_clock_skew_ms.abs() < 60_000,
        "{}",
        fine.cluster_clock_skew_ms
    );
    // Node b comes back and serves none of the forgotten entries.
    b.restart().await;
    wait_connected(&b).await;
    b.wait_for_stats("the forgets learned", |s| s.tombstones_held >= 20)
        .await;
    let keys: Vec<proto::Key> = recorded.iter().filter_map(|e| e.key.clone()).collect();
    let hits = b.client().await.lookup(keys).await.unwrap();
    let served = hits.iter().filter(|h| h.result.is_some()).count();
    assert_eq!(served, 0, "node b served forgotten entries");
}

/// A blob key of the wrong type (issue 50, finding 8): the node that fetches the blob and
/// the node that keeps it alive in Redis both list it in `cluster_wrong_type_keys` and name
/// it once in their logs; the keeping node takes it off the list once it reads as a blob
/// again, which it writes itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_blob_key_is_listed_and_named_once() {
    use tunecache_integration::blobs::{self, Content};
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    // Blob TTLs renewed every half second.
    let flags = ["--artifact-grace-secs", "1"];
    let a = cluster_node(dir.path(), "a", &redis.url(), &flags)
        .process()
        .await;
    let b = cluster_node(dir.path(), "b", &redis.url(), &flags)
        .process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    let content = Content::new(77, 100_000);
    let (ca, cb) = (a.client().await, b.client().await);
    blobs::put(&ca, content).await.unwrap();
    let mut named = entry(test_key("blobs", "wrong-type"), "{}", 1.0, "a");
    if let Some(result) = named.result.as_mut() {
        result.artifacts = vec![content.artifact("k.so")];
    }
    ca.record(vec![named.clone()]).await.unwrap();
    let key = named.key.clone().unwrap();
    wait_for_hit(&b, &key, None, Duration::from_secs(20)).await;
    let blob_keys = redis.keys_matching("tunecache:b:{s*");
    assert_eq!(blob_keys.len(), 1, "{blob_keys:?}");
    let blob = blob_keys[0].clone();
    // Replaced by a hash.
    redis.cli(&["DEL", &blob]);
    redis.cli(&["HSET", &blob, "not", "a blob"]);

    // b fetches it: refused, listed, named once.
    assert!(blobs::get_digest(&cb, &content.digest(), 0).await.is_err());
    // a keeps it alive: listed too.
    for node in [&a, &b] {
        node.wait_for_stats("the blob key listed", |s| {
            s.cluster_wrong_type_keys.contains(&blob)
        })
        .await;
    }
    assert!(blobs::get_digest(&cb, &content.digest(), 0).await.is_err());
    for node in [&a, &b] {
        let log = node.log();
        let named = log
            .lines()
            .filter(|line| line.contains("wrong type") && line.contains(&blob))
            .count();
        assert_eq!(named, 1, "named once:\n{log}");
    }
    // Deleted: a takes it off its list (it reads as nothing) and writes the blob again at its
    // next renewal; b then fetches it.
    redis.cli(&["DEL", &blob]);
    a.wait_for_stats("the blob key off the list", |s| {
        !s.cluster_wrong_type_keys.contains(&blob)
    })
    .await;
    eventually_sync(Duration::from_secs(10), "a writing the blob again", || {
        redis.cli(&["TYPE", &blob]) == "string"
    })
    .await;
    let got = blobs::get_digest(&cb, &content.digest(), 0).await.unwrap();
    assert_eq!(got, (content.digest(), content.size));
    b.wait_for_stats("the blob key off b's list", |s| {
        !s.cluster_wrong_type_keys.contains(&blob)
    })
    .await;
}
