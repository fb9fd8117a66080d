//! Start-up at scale (issue 38), against a real `redis-server`: a restarted node reads only
//! what is new since it stopped (its saved stream places), a fresh node loads the shards'
//! checkpoints and the streams' tails, and nothing is missed or resurrected on the way: not
//! with trimmed streams, a flushed Redis, writes during the join, damaged or foreign
//! checkpoints, two builders at once, or a Forget after a checkpoint was built.

use std::time::{Duration, Instant};

use tunecache_client::proto;
use tunecache_integration::redis::{
    cluster_node, free_port, holds_all, wait_checkpoints_current, wait_connected, Redis,
    BUILD_CHECKPOINTS_OFTEN,
};
use tunecache_integration::{eventually_sync, numbered_op, shared_node, wait, Lazy, TestDaemon};

/// The shard of a key text, as the daemon computes it (FNV-1a, mod 16).
fn shard_of(key: &proto::Key) -> usize {
    let text =
        serde_json::to_string(&(&key.namespace, &key.op, &key.device, &key.problem, key.rank))
            .unwrap();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % 16) as usize
}

async fn record_all(daemon: &TestDaemon, entries: &[proto::Entry]) {
    let client = daemon.client().await;
    for chunk in entries.chunks(1000) {
        client.record(chunk.to_vec()).await.unwrap();
    }
}

/// The sum of the shards' sequence numbers in Redis.
fn redis_seq_total(redis: &Redis) -> u64 {
    (0..16)
        .map(|s| {
            redis
                .cli(&["HGET", &format!("tunecache:m:{{s{s:02}}}"), "s"])
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// Waits until `daemon` saved places through everything Redis announced.
async fn wait_places_saved(daemon: &TestDaemon, redis: &Redis) {
    let path = daemon.state_dir.join("cluster-places.json");
    let saved = || -> u64 {
        std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|v| {
                v["shards"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|p| p["seq"].as_u64()).sum())
            })
            .unwrap_or(0)
    };
    wait(
        Duration::from_secs(20),
        Lazy(|| format!("places saved (saved {})", saved())),
    )
    .every(Duration::from_millis(50))
    .until(|| {
        let saved = saved();
        saved == redis_seq_total(redis) && saved > 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_reads_only_what_was_recorded_while_it_was_down() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &[])
        .process()
        .await;
    let mut node = cluster_node(dir.path(), "a", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&writer).await;
    wait_connected(&node).await;
    let before = numbered_op("startup", "before", 0..20_000, "w");
    record_all(&writer, &before).await;
    node.wait_for_stats("all 20,000 learned", |s| s.entries == 20_000)
        .await;
    wait_places_saved(&node, &redis).await;
    node.terminate(Duration::from_secs(10));
    let during = numbered_op("startup", "during", 0..500, "w");
    record_all(&writer, &during).await;
    writer
        .wait_for_stats("published", |s| s.cluster_published >= 20_500)
        .await;
    node.restart().await;
    wait_connected(&node).await;
    let stats = node.stats().await;
    eprintln!(
        "restart: places restored {}, shards resumed {}, read again {}, learned {}, \
         bootstrap entries {}, redis commands {}, bytes {}, {} ms",
        stats.cluster_places_restored,
        stats.cluster_shards_resumed,
        stats.cluster_shards_reread,
        stats.cluster_received,
        stats.cluster_bootstrap_entries,
        stats.cluster_startup_commands,
        stats.cluster_startup_bytes,
        stats.cluster_startup_ms
    );
    assert_eq!(stats.cluster_places_restored, 16);
    assert_eq!(stats.cluster_shards_resumed, 16);
    assert_eq!(stats.cluster_shards_reread, 0);
    assert_eq!(stats.cluster_bootstrap_entries, 0, "it read entries again");
    // It read the 500 new ones, and nothing of the 20,000 it had.
    assert_eq!(stats.cluster_received, 500);
    assert!(
        stats.cluster_startup_commands <= 100,
        "{} commands",
        stats.cluster_startup_commands
    );
    assert!(
        stats.cluster_startup_bytes < 500 * 400 + 64 * 1024,
        "{} bytes",
        stats.cluster_startup_bytes
    );
    assert_eq!(stats.entries, 20_500);
    holds_all(&node, &during).await;
    holds_all(&node, &before[..1000]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_behind_trimmed_streams_reads_only_those_shards_again() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Small stream nodes, so MAXLEN ~ trims streams this short.
    let redis = Redis::start(dir.path(), free_port(), &["--stream-node-max-entries", "4"]);
    let flags = ["--cluster-stream-max-len", "8"];
    let writer = cluster_node(dir.path(), "w", &redis.url(), &flags)
        .process()
        .await;
    let mut node = cluster_node(dir.path(), "a", &redis.url(), &flags)
        .process()
        .await;
    wait_connected(&writer).await;
    wait_connected(&node).await;
    let first = numbered_op("startup", "first", 0..160, "w");
    record_all(&writer, &first).await;
    node.wait_for_stats("learned", |s| s.entries == 160).await;
    wait_places_saved(&node, &redis).await;
    node.terminate(Duration::from_secs(10));
    // While it is down: 40 results in each of shards 0 to 3 only, far past their streams'
    // length; the other twelve shards take nothing.
    let trimmed: Vec<proto::Entry> = numbered_op("startup", "trim", 0..2000, "w")
        .into_iter()
        .filter(|e| shard_of(e.key.as_ref().unwrap()) < 4)
        .take(160)
        .collect();
    record_all(&writer, &trimmed).await;
    writer
        .wait_for_stats("published", |s| s.cluster_published >= 320)
        .await;
    node.restart().await;
    wait_connected(&node).await;
    let stats = node.stats().await;
    eprintln!(
        "trimmed: resumed {}, read again {}, gaps {}",
        stats.cluster_shards_resumed, stats.cluster_shards_reread, stats.cluster_stream_gaps
    );
    assert_eq!(stats.cluster_shards_reread, 4, "only the trimmed shards");
    assert_eq!(stats.cluster_shards_resumed, 12);
    holds_all(&node, &trimmed).await;
    holds_all(&node, &first).await;
    assert_eq!(stats.cluster_audit_repaired, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_redis_was_flushed_republishes_and_loses_nothing() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let mut node = cluster_node(dir.path(), "a", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&node).await;
    let recorded = numbered_op("startup", "flushed", 0..300, "w");
    record_all(&node, &recorded).await;
    wait_places_saved(&node, &redis).await;
    node.terminate(Duration::from_secs(10));
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    node.restart().await;
    wait_connected(&node).await;
    let stats = node
        .wait_for_stats("republished", |s| s.cluster_republished >= 300)
        .await;
    assert_eq!(stats.cluster_places_restored, 0, "the places were believed");
    assert_eq!(stats.entries, 300);
    // Redis holds them all again: a fresh node gets every one.
    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&fresh).await;
    holds_all(&fresh, &recorded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_joining_while_another_writes_1000_records_holds_them_all() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &BUILD_CHECKPOINTS_OFTEN)
        .process()
        .await;
    wait_connected(&writer).await;
    let existing = numbered_op("startup", "existing", 0..5000, "w");
    record_all(&writer, &existing).await;
    wait_checkpoints_current(&redis).await;
    // A fresh node joins while the writer records 1,000 more, ten at a time.
    let during = numbered_op("startup", "join", 0..1000, "w");
    // The join starts once the writer is 100 Records in, so the writes straddle it.
    let (writes_begun, begun) = tokio::sync::oneshot::channel::<()>();
    let writing = async {
        let client = writer.client().await;
        let mut writes_begun = Some(writes_begun);
        for (i, chunk) in during.chunks(10).enumerate() {
            client.record(chunk.to_vec()).await.unwrap();
            if i == 9 {
                writes_begun.take().map(|tx| tx.send(()));
            }
            // Pacing, not waiting for anything: the writes are spread over the join.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let joining = async {
        begun.await.expect("the writer began");
        let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
            .process()
            .await;
        wait_connected(&fresh).await;
        fresh
    };
    let ((), fresh) = tokio::join!(writing, joining);
    let stats = fresh.stats().await;
    eprintln!(
        "fresh node: checkpoints loaded {}, rejected {}, shards read again {}, commands {}, bytes {}, {} ms",
        stats.cluster_checkpoints_loaded,
        stats.cluster_checkpoints_rejected,
        stats.cluster_shards_reread,
        stats.cluster_startup_commands,
        stats.cluster_startup_bytes,
        stats.cluster_startup_ms
    );
    assert_eq!(stats.cluster_checkpoints_loaded, 16);
    assert_eq!(stats.cluster_checkpoints_rejected, 0);
    holds_all(&fresh, &during).await;
    holds_all(&fresh, &existing).await;
    let stats = fresh.stats().await;
    assert_eq!(stats.entries, 6000);
    assert_eq!(stats.cluster_audit_repaired, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_foreign_checkpoint_is_rejected_and_its_shard_read_from_its_entries() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &BUILD_CHECKPOINTS_OFTEN)
        .process()
        .await;
    // Another deployment on the same server, with its own prefix and entries.
    let other_flags = [
        BUILD_CHECKPOINTS_OFTEN.as_slice(),
        &["--cluster-prefix", "other:"],
    ]
    .concat();
    let other = cluster_node(dir.path(), "x", &redis.url(), &other_flags)
        .process()
        .await;
    wait_connected(&writer).await;
    wait_connected(&other).await;
    let recorded = numbered_op("startup", "mine", 0..2000, "w");
    record_all(&writer, &recorded).await;
    record_all(&other, &numbered_op("startup", "theirs", 0..2000, "w")).await;
    wait_checkpoints_current(&redis).await;
    wait(
        Duration::from_secs(30),
        "a checkpoint under the other prefix",
    )
    .every(Duration::from_millis(50))
    .until(|| !redis.cli(&["HGET", "other:cp:{s05}", "seq"]).is_empty())
    .await;
    drop(writer);
    drop(other);
    // Shard 3's first part damaged by hand: one byte changed.
    let seq3 = redis.cli(&["HGET", "tunecache:cp:{s03}", "seq"]);
    let part3 = format!("tunecache:cp:{{s03}}:{seq3}:0");
    assert!(!redis.cli(&["SETRANGE", &part3, "20", "X"]).is_empty());
    // Shard 5's checkpoint replaced by the other prefix's, parts and all.
    let seq5 = redis.cli(&["HGET", "other:cp:{s05}", "seq"]);
    let n5 = redis.cli(&["HGET", "other:cp:{s05}", "n"]);
    let header5 = redis.cli(&["HGET", "other:cp:{s05}", "h"]);
    for i in 0..n5.parse::<usize>().unwrap() {
        let from = format!("other:cp:{{s05}}:{seq5}:{i}");
        let to = format!("tunecache:cp:{{s05}}:{seq5}:{i}");
        assert_eq!(redis.cli(&["COPY", &from, &to, "REPLACE"]), "1");
    }
    redis.cli(&[
        "HSET",
        "tunecache:cp:{s05}",
        "seq",
        &seq5,
        "n",
        &n5,
        "h",
        &header5,
    ]);
    // The header under our prefix now (a hand edit), so only the digest can tell.
    let forged = header5.replace("\"prefix\":\"other:\"", "\"prefix\":\"tunecache:\"");
    redis.cli(&["HSET", "tunecache:cp:{s05}", "h", &forged]);

    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&fresh).await;
    let stats = fresh.stats().await;
    eprintln!(
        "damaged and foreign: loaded {}, rejected {}, read again {}",
        stats.cluster_checkpoints_loaded,
        stats.cluster_checkpoints_rejected,
        stats.cluster_shards_reread
    );
    assert_eq!(stats.cluster_checkpoints_rejected, 2);
    assert_eq!(stats.cluster_checkpoints_loaded, 14);
    assert_eq!(stats.cluster_shards_reread, 2);
    // The same result as reading every entry: exactly this prefix's 2,000.
    holds_all(&fresh, &recorded).await;
    assert_eq!(fresh.stats().await.entries, 2000);
    assert_eq!(
        fresh.log().matches("rejected a shard's checkpoint").count(),
        2,
        "{}",
        fresh.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_builders_of_one_shard_never_replace_a_newer_checkpoint_with_an_older() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let flags = [
        "--cluster-checkpoint-every",
        "1",
        "--cluster-checkpoint-check-ms",
        "50",
    ];
    let a = cluster_node(dir.path(), "a", &redis.url(), &flags)
        .process()
        .await;
    let b = cluster_node(dir.path(), "b", &redis.url(), &flags)
        .process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    // Both record into every shard for four seconds; both keep rebuilding every shard.
    let mut highest = [0u64; 16];
    let mut observations = 0;
    let started = Instant::now();
    let mut i = 0;
    let (ca, cb) = (a.client().await, b.client().await);
    while started.elapsed() < Duration::from_secs(4) {
        let batch = numbered_op("startup", "race", i * 20..i * 20 + 20, "w");
        let (left, right) = batch.split_at(10);
        ca.record(left.to_vec()).await.unwrap();
        cb.record(right.to_vec()).await.unwrap();
        i += 1;
        for (s, high) in highest.iter_mut().enumerate() {
            let seq = redis.cli(&["HGET", &format!("tunecache:cp:{{s{s:02}}}"), "seq"]);
            if let Ok(seq) = seq.parse::<u64>() {
                assert!(seq >= *high, "shard {s}: checkpoint {seq} replaced {high}");
                *high = seq;
                observations += 1;
            }
        }
    }
    wait_checkpoints_current(&redis).await;
    let (sa, sb) = (a.stats().await, b.stats().await);
    eprintln!(
        "two builders: {} and {} checkpoints built, {observations} observations",
        sa.cluster_checkpoints_built, sb.cluster_checkpoints_built
    );
    assert!(sa.cluster_checkpoints_built + sb.cluster_checkpoints_built >= 16);
    // A stale builder is refused: a checkpoint at the shard's newest sequence number stays
    // when a node offers one as new (its lease taken, its build older).
    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&fresh).await;
    let s = fresh.stats().await;
    assert_eq!(s.cluster_checkpoints_loaded, 16);
    assert_eq!(s.cluster_checkpoints_rejected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_after_a_checkpoint_is_never_served_by_a_node_that_loads_it() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &BUILD_CHECKPOINTS_OFTEN)
        .process()
        .await;
    wait_connected(&writer).await;
    let recorded = numbered_op("startup", "forget", 0..400, "w");
    record_all(&writer, &recorded).await;
    wait_checkpoints_current(&redis).await;
    // The checkpoints hold them all; now one of them is forgotten.
    let doomed = recorded[7].clone();
    let key = doomed.key.clone().unwrap();
    let forgotten = writer
        .client()
        .await
        .forget(proto::ForgetRequest {
            namespace: key.namespace.clone(),
            op: key.op.clone(),
            device: key.device.clone(),
            problem: key.problem.clone(),
            rank: key.rank,
            only_if: doomed.result.clone(),
        })
        .await
        .unwrap();
    assert_eq!(forgotten, 1);
    eventually_sync(Duration::from_secs(10), "the forget reaching redis", || {
        redis.entry_name("startup", "forget-7").is_none()
            && redis.cli(&["HLEN", "tunecache:forgets:{f}"]) == "1"
    })
    .await;
    let shard = shard_of(&key);
    let cp_seq = redis.cli(&["HGET", &format!("tunecache:cp:{{s{shard:02}}}"), "seq"]);
    let meta_seq = redis.cli(&["HGET", &format!("tunecache:m:{{s{shard:02}}}"), "s"]);
    assert_eq!(cp_seq, meta_seq, "the checkpoint is from before the Forget");
    // A fresh node, watched from its first answer: the forgotten entry is never a hit.
    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    let client = fresh.client().await;
    let mut lookups = 0;
    loop {
        let hits = client.lookup(vec![key.clone()]).await.unwrap();
        lookups += 1;
        assert!(
            hits.iter().all(|h| h.result.is_none()),
            "lookup {lookups}: the forgotten entry was served"
        );
        let stats = client.stats().await.unwrap();
        if stats.cluster_bootstrapped {
            assert!(stats.cluster_checkpoints_loaded >= 1, "{stats:?}");
            break;
        }
    }
    for _ in 0..50 {
        let hits = client.lookup(vec![key.clone()]).await.unwrap();
        assert!(hits.iter().all(|h| h.result.is_none()));
    }
    holds_all(&fresh, &recorded[8..]).await;
    eprintln!("{lookups} lookups during the join: none served the forgotten entry");
}

/// Issue 38: a node restarted on its state directory reads no segment it had merged (its
/// state directory records, after the journal sync, the place in each other node's segments
/// it merged through: `shared-merged.json`). Before that record it read the writer's one
/// segment again: 1 segment, 86,818 bytes for 500 entries. A damaged record counts for
/// nothing: the next restart reads the segment again, and loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_its_state_directory_reads_no_segment_it_had_merged() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let writer = shared_node(&dir.path().join("w"), &shared, "w", 1, &[])
        .process()
        .await;
    let mut node = shared_node(&dir.path().join("a"), &shared, "a", 1, &[])
        .process()
        .await;
    let recorded = numbered_op("startup", "segments", 0..500, "w");
    record_all(&writer, &recorded).await;
    holds_all(&node, &recorded).await;
    // The pass that merged them ends (and so has recorded them) before the next one ends.
    let merged = node.wait_for_snapshot_passes(1).await;
    assert!(merged.peer_segments_loaded >= 1, "{merged:?}");
    // The writer is quiet from here on: two more of its passes write nothing.
    let written = writer
        .wait_for_stats("the writer's segment", |s| s.snapshots_written >= 1)
        .await
        .snapshots_written;
    let quiet = writer.wait_for_snapshot_passes(2).await;
    assert_eq!(quiet.snapshots_written, written, "the writer wrote again");
    let merged = node.stats().await;
    // Killed, not stopped: the record is written by the pass that merged, not only at a
    // clean shutdown.
    node.kill();
    node.restart().await;
    // Two passes of the restarted node: it lists the directory, reads nothing it merged.
    let after = node
        .wait_for_stats("two passes", |s| s.snapshot_passes >= 2)
        .await;
    eprintln!(
        "restarted on its state directory: {} segments read, {} bytes read in {} passes, {} nodes read on from the record",
        after.peer_segments_loaded, after.snapshot_bytes_read, after.snapshot_passes, after.peer_nodes_resumed
    );
    eprintln!(
        "before the restart it had read {} segments, {} bytes; the writer wrote {written}, compacted {}",
        merged.peer_segments_loaded, merged.snapshot_bytes_read, quiet.segment_compactions
    );
    assert_eq!(writer.stats().await.snapshots_written, written);
    assert_eq!(
        after.peer_segments_loaded, 0,
        "it read a merged segment again"
    );
    assert_eq!(after.snapshot_bytes_read, 0);
    assert_eq!(after.peer_nodes_resumed, 1);
    assert_eq!(after.entries, 500);

    // A damaged record: ignored, the segment is read again, nothing is lost.
    node.terminate(Duration::from_secs(10));
    let record = node.state_dir.join("shared-merged.json");
    let mut damaged = std::fs::read(&record).expect("the record of merged segments");
    damaged.truncate(damaged.len() / 2);
    std::fs::write(&record, damaged).unwrap();
    node.restart().await;
    let again = node
        .wait_for_stats("the segment read again", |s| {
            s.peer_segments_loaded >= 1 && s.snapshot_passes >= 1
        })
        .await;
    eprintln!(
        "with a damaged record: {} segments read, {} bytes read",
        again.peer_segments_loaded, again.snapshot_bytes_read
    );
    assert_eq!(again.peer_segments_loaded, merged.peer_segments_loaded);
    assert_eq!(again.peer_nodes_resumed, 0);
    assert!(node
        .log()
        .contains("the record of merged segments is damaged"));
    holds_all(&node, &recorded).await;

    // The journal gone, the record kept: it claims what the store no longer holds; ignored.
    let recorded_again = node.wait_for_snapshot_passes(1).await;
    assert_eq!(
        recorded_again.peer_segments_loaded,
        again.peer_segments_loaded
    );
    node.terminate(Duration::from_secs(10));
    assert!(record.exists());
    std::fs::remove_file(node.state_dir.join("journal")).unwrap();
    node.restart().await;
    let wiped = node
        .wait_for_stats("the segment read again", |s| {
            s.peer_segments_loaded >= 1 && s.snapshot_passes >= 1
        })
        .await;
    assert_eq!(wiped.peer_segments_loaded, merged.peer_segments_loaded);
    assert_eq!(wiped.peer_nodes_resumed, 0);
    assert!(node
        .log()
        .contains("the store is empty, so the record of merged segments"));
    holds_all(&node, &recorded).await;
    drop(writer);
}
