//! Last use and expiry through Redis (issue 51), against a real `redis-server` and two daemon
//! processes: a use on one node reaches Redis's entry (`u`) and the other node, which keeps
//! the entry past the retention because of it; an entry nobody used within the retention is
//! deleted from Redis by the node that finds it expired. No clock is faked (a faked clock
//! would be off from Redis's `TIME`, and expiry pauses then): the old days are written into
//! Redis as a careless writer would, in the layout docs/cluster.md describes.

use std::time::Duration;

use tunecache_client::proto;
use tunecache_integration::redis::{cluster_node, free_port, wait_connected, Redis};
use tunecache_integration::{entry, eventually, eventually_sync, test_key, TestDaemon};

const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn today() -> i64 {
    now_ms() / DAY_MS
}

fn key_text(key: &proto::Key) -> String {
    serde_json::to_string(&(&key.namespace, &key.op, &key.device, &key.problem, key.rank)).unwrap()
}

/// The shard of a key text, as the daemon computes it (FNV-1a, mod 16).
fn shard_of(text: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % 16) as usize
}

/// The entry hash of `key` under the default prefix.
fn entry_name(key: &proto::Key) -> String {
    let text = key_text(key);
    format!("tunecache:e:{{s{:02}}}{text}", shard_of(&text))
}

/// Writes into Redis, as a careless writer with access to it would, an entry of `key` tuned
/// `tuned_days_ago` and last used `used_days_ago`, exactly as the store script leaves one:
/// its hash, the shard's count, digest and sequence number, and its announcement.
fn plant(redis: &Redis, key: &proto::Key, tuned_days_ago: i64, used_days_ago: i64) {
    let text = key_text(key);
    let shard = shard_of(&text);
    let t = format!("{:016x}{:016x}", u64::MAX, 2.0f64.to_bits() | 1 << 63);
    let a = format!(
        "{:016x}",
        ((now_ms() - tuned_days_ago * DAY_MS) as u64) ^ (1 << 63)
    );
    let u = (today() - used_days_ago).to_string();
    let script = r"
local h = redis.sha1hex(KEYS[1] .. '\0' .. ARGV[1] .. ARGV[4] .. #ARGV[2] .. ':' .. ARGV[2] .. ARGV[3])
local x = redis.call('HGET', KEYS[3], 'x') or '0000000000000000'
local hi = bit.bxor(tonumber(string.sub(x, 1, 8), 16), tonumber(string.sub(h, 1, 8), 16))
local lo = bit.bxor(tonumber(string.sub(x, 9, 16), 16), tonumber(string.sub(h, 9, 16), 16))
redis.call('HSET', KEYS[3], 'x', bit.tohex(hi, 8) .. bit.tohex(lo, 8))
redis.call('HINCRBY', KEYS[3], 'n', 1)
local seq = redis.call('HINCRBY', KEYS[3], 's', 1)
redis.call('HSET', KEYS[1], 't', ARGV[1], 'c', ARGV[2], 'b', ARGV[3], 'a', ARGV[4], 'u', ARGV[5], 's', seq)
redis.call('XADD', KEYS[2], '*', 'k', ARGV[6], 't', ARGV[1], 'c', ARGV[2], 'b', ARGV[3],
  'a', ARGV[4], 'u', ARGV[5], 'n', 'careless/0000000000000000', 's', seq)
return 1
";
    let name = entry_name(key);
    let log = format!("tunecache:log:{{s{shard:02}}}");
    let meta = format!("tunecache:m:{{s{shard:02}}}");
    let args = [
        "EVAL", script, "3", &name, &log, &meta, &t, "{}", "careless", &a, &u, &text,
    ];
    assert_eq!(redis.cli(&args), "1", "planting {text}");
}

/// The entry's `u` in Redis ("" when it has none or is gone).
fn redis_u(redis: &Redis, key: &proto::Key) -> String {
    redis.cli(&["HGET", &entry_name(key), "u"])
}

async fn node(dir: &std::path::Path, name: &str, url: &str, retain_days: &str) -> TestDaemon {
    cluster_node(
        dir,
        name,
        url,
        &["--retain-days", retain_days, "--lifecycle-flush-ms", "100"],
    )
    .process()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_crosses_redis_and_what_nobody_used_is_deleted_there() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    // Both tuned 100 days ago; k1 last used 40 days ago, old 100 days ago.
    let k1 = test_key("lifecycle", "k1");
    let old = test_key("lifecycle", "old");
    plant(&redis, &k1, 100, 40);
    plant(&redis, &old, 100, 100);
    // Nodes that keep everything, so both hold both.
    let mut a = node(dir.path(), "a", &redis.url(), "0").await;
    let b = node(dir.path(), "b", &redis.url(), "0").await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    for daemon in [&a, &b] {
        daemon
            .wait_for_stats("the planted entries learned", |s| s.entries == 2)
            .await;
    }
    // A Record is a use today: the store script writes its day with it, and B learns it.
    let k2 = test_key("lifecycle", "k2");
    a.client()
        .await
        .record(vec![entry(k2.clone(), "{}", 1.0, "a")])
        .await
        .unwrap();
    b.wait_for_stats("k2 learned", |s| s.entries == 3).await;
    assert_eq!(redis_u(&redis, &k2), today().to_string());
    assert_eq!(redis_u(&redis, &k1), (today() - 40).to_string());
    // A rank reads k1 on B only: B carries the use to Redis, and A learns (and journals) it.
    let a_uses_before = a.stats().await.last_use_updates_written;
    let hits = b.client().await.lookup(vec![k1.clone()]).await.unwrap();
    assert!(hits[0].result.is_some(), "{hits:?}");
    eventually_sync(Duration::from_secs(10), "k1's use in redis", || {
        redis_u(&redis, &k1) == today().to_string()
    })
    .await;
    let carried = b
        .wait_for_stats("the use carried", |s| s.cluster_last_use_commands > 0)
        .await;
    // One command for the one entry read, however often it is read afterwards.
    assert_eq!(carried.cluster_last_use_commands, 1, "{carried:?}");
    a.wait_for_stats("k1's use learned from redis", |s| {
        s.last_use_updates_written > a_uses_before
    })
    .await;
    assert_eq!(redis_u(&redis, &old), (today() - 100).to_string());
    // A starts again keeping 30 days: k1 stays (used today on B), `old` expires on A, and A
    // deletes it from Redis too. B, which keeps everything, deletes nothing.
    a.terminate(Duration::from_secs(10));
    drop(a);
    let a = node(dir.path(), "a", &redis.url(), "30").await;
    wait_connected(&a).await;
    let expired = a
        .wait_for_stats("old deleted from redis", |s| {
            s.cluster_entries_expired >= 1 && s.entries_expired >= 1
        })
        .await;
    assert_eq!(expired.cluster_entries_expired, 1, "{expired:?}");
    assert!(expired.expiry_paused.is_empty(), "{expired:?}");
    assert_eq!(
        redis.cli(&["EXISTS", &entry_name(&old)]),
        "0",
        "{}",
        a.log()
    );
    assert_eq!(redis.cli(&["EXISTS", &entry_name(&k1)]), "1");
    let shard = shard_of(&key_text(&old));
    let n = redis.cli(&["HGET", &format!("tunecache:m:{{s{shard:02}}}"), "n"]);
    let left = redis
        .cli(&["KEYS", &format!("tunecache:e:{{s{shard:02}}}*")])
        .lines()
        .filter(|line| !line.is_empty())
        .count();
    assert_eq!(
        n,
        left.to_string(),
        "the shard's count follows the deletion"
    );
    let hits = a.client().await.lookup(vec![k1, k2]).await.unwrap();
    assert!(
        hits.iter().all(|hit| hit.result.is_some()),
        "A dropped entries used today: {hits:?}"
    );
    assert_eq!(b.stats().await.cluster_entries_expired, 0);
}

/// Bytes Redis reports (`MEMORY USAGE`) for the deployment's entry hashes, and their number.
fn entry_memory(redis: &Redis) -> (u64, u64) {
    let script = r"
local bytes, count = 0, 0
for _, key in ipairs(redis.call('KEYS', 'tunecache:e:*')) do
  bytes = bytes + redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0)
  count = count + 1
end
return {bytes, count}
";
    let reply = redis.cli(&["EVAL", script, "0"]);
    let mut numbers = reply
        .lines()
        .map(|line| line.trim().parse::<u64>().unwrap());
    (numbers.next().unwrap(), numbers.next().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_cluster_max_mib_every_node_keeps_the_same_entries_within_the_bytes() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    // 2 MiB, less the streams' share at 10 messages each (35 KB): room for some 7,000
    // entries of these keys, fewer than the 10,000 recorded.
    let flags = [
        "--retain-days",
        "0",
        "--cluster-max-mib",
        "2",
        "--cluster-stream-max-len",
        "10",
        "--lifecycle-flush-ms",
        "100",
    ];
    let start = |name: &'static str| {
        let (dir, url) = (dir.path().to_owned(), redis.url());
        async move {
            let node = cluster_node(&dir, name, &url, &flags).process().await;
            wait_connected(&node).await;
            node
        }
    };
    let a = start("a").await;
    let b = start("b").await;
    let keys: Vec<proto::Key> = (0..10_000)
        .map(|i| test_key("bounded", &format!("m={i:05},n=4096,k=4096")))
        .collect();
    for chunk in keys.chunks(1000) {
        let entries = chunk
            .iter()
            .map(|key| entry(key.clone(), r#"{"tile":[128,128,64]}"#, 1.0, "a"))
            .collect();
        a.client().await.record(entries).await.unwrap();
    }
    // Past the bound, each node's next sweep cuts the same least recently used entries (the
    // first node to cut one deletes it from Redis), while the Records still come in.
    let (client_a, client_b) = (a.client().await, b.client().await);
    eventually(
        Duration::from_secs(60),
        "both nodes and Redis within the bound",
        || async {
            let (sa, sb) = (
                client_a.stats().await.unwrap(),
                client_b.stats().await.unwrap(),
            );
            let in_redis = entry_memory(&redis).1;
            sa.entries < 10_000 && sa.entries == sb.entries && in_redis == sa.entries
        },
    )
    .await;
    let (held_a, held_b) = (a.stats().await, b.stats().await);
    let held = held_a.entries;
    assert!(held > 5_000, "{held_a:?}");
    // What went was cut by the bound, by one node or both (a node may never have held an
    // entry the other cut and deleted from Redis first).
    assert!(
        held_a.entries_expired_by_bound + held_b.entries_expired_by_bound >= 10_000 - held,
        "{held_a:?} {held_b:?}"
    );
    assert!(held_a.cluster_entries_expired + held_b.cluster_entries_expired > 0);
    let (bytes, count) = entry_memory(&redis);
    assert!(
        bytes <= 2 * 1024 * 1024,
        "{count} entry hashes take {bytes} bytes in Redis, over --cluster-max-mib"
    );
    // The same entries on both nodes: the most recently recorded (all on one day, so the
    // last in key order).
    let a_keys = a.client().await.scan("test", "").await.unwrap();
    let b_keys = b.client().await.scan("test", "").await.unwrap();
    assert_eq!(a_keys.len() as u64, held);
    assert_eq!(a_keys, b_keys, "the same entries on both nodes");
    let first_kept = a_keys[0].key.as_ref().map(|key| key.problem.clone());
    let expected = format!("m={:05},n=4096,k=4096", 10_000 - held);
    assert_eq!(first_kept, Some(expected));
}
