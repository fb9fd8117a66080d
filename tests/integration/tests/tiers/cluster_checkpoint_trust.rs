//! Checkpoints forged by a hostile Redis writer (issue 50, findings 5 and 6), against a real
//! `redis-server`: a part rewritten with its count, digest and CRC-32 recomputed (every
//! result at 0 µs; half the entries gone), a genuine older checkpoint whose header `id` was
//! moved to the newest message, a part of the wrong type, and, with `--cluster-key-file`, a
//! checkpoint rewritten whole (the shard's record too). A fresh node rejects every one and
//! serves exactly the entries Redis holds; the audit never publishes into Redis what it read
//! from a checkpoint it could not verify.

use std::time::Duration;

use tunecache_client::proto;
use tunecache_integration::redis::{
    cluster_node, free_port, holds_all, wait_checkpoints_current, wait_connected, Redis,
    BUILD_CHECKPOINTS_OFTEN,
};
use tunecache_integration::{numbered_op, TestDaemon};

const PREFIX: &str = "tunecache:";

async fn record_all(daemon: &TestDaemon, entries: &[proto::Entry]) {
    let client = daemon.client().await;
    for chunk in entries.chunks(500) {
        client.record(chunk.to_vec()).await.unwrap();
    }
}

/// One entry as a checkpoint part holds it: key text and the fields `t`, `c`, `b`, `a`.
type Encoded = (String, [String; 4]);

/// A shard's checkpoint as anyone who can read Redis sees it.
struct Checkpoint {
    shard: usize,
    header: serde_json::Value,
    parts: Vec<Vec<Encoded>>,
}

fn header_name(shard: usize) -> String {
    format!("{PREFIX}cp:{{s{shard:02}}}")
}

fn part_name(shard: usize, seq: u64, i: usize) -> String {
    format!("{PREFIX}cp:{{s{shard:02}}}:{seq}:{i}")
}

fn meta_name(shard: usize) -> String {
    format!("{PREFIX}m:{{s{shard:02}}}")
}

fn log_name(shard: usize) -> String {
    format!("{PREFIX}log:{{s{shard:02}}}")
}

fn take(raw: &mut &[u8]) -> String {
    let (len, rest) = raw.split_at(4);
    let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
    let (bytes, rest) = rest.split_at(len);
    *raw = rest;
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn decode_part(compressed: &[u8], raw_len: usize) -> Vec<Encoded> {
    let raw = zstd::bulk::decompress(compressed, raw_len).unwrap();
    let mut rest = raw.as_slice();
    let mut out = Vec::new();
    while !rest.is_empty() {
        let text = take(&mut rest);
        let fields = [
            take(&mut rest),
            take(&mut rest),
            take(&mut rest),
            take(&mut rest),
        ];
        out.push((text, fields));
    }
    out
}

fn encode_part(entries: &[Encoded]) -> Vec<u8> {
    let mut raw = Vec::new();
    for (text, fields) in entries {
        for field in std::iter::once(text).chain(fields) {
            raw.extend_from_slice(&(field.len() as u32).to_le_bytes());
            raw.extend_from_slice(field.as_bytes());
        }
    }
    raw
}

/// The shard digest as the merge script keeps it: the XOR of each entry's first 8 bytes of
/// SHA-1 over its name, `t`, `a`, the length of `c`, `:`, `c` and `b`.
fn digest_of(shard: usize, entries: impl Iterator<Item = Encoded>) -> (u64, String) {
    let mut count = 0;
    let mut digest = 0u64;
    for (text, [t, c, b, a]) in entries {
        let name = format!("{PREFIX}e:{{s{shard:02}}}{text}");
        let mut sha = sha1_smol::Sha1::new();
        for piece in [&name, "\0", &t, &a, &c.len().to_string(), ":", &c, &b] {
            sha.update(piece.as_bytes());
        }
        let bytes = sha.digest().bytes();
        digest ^= u64::from_be_bytes(bytes[..8].try_into().unwrap());
        count += 1;
    }
    (count, format!("{digest:016x}"))
}

impl Checkpoint {
    fn read(redis: &Redis, shard: usize) -> Checkpoint {
        let header: serde_json::Value =
            serde_json::from_str(&redis.cli(&["HGET", &header_name(shard), "h"])).unwrap();
        let seq = header["seq"].as_u64().unwrap();
        let parts = header["parts"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let bytes = redis.get_bytes(&part_name(shard, seq, i)).unwrap();
                decode_part(&bytes, info["raw"].as_u64().unwrap() as usize)
            })
            .collect();
        Checkpoint {
            shard,
            header,
            parts,
        }
    }

    fn seq(&self) -> u64 {
        self.header["seq"].as_u64().unwrap()
    }

    fn count(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }

    /// Writes `parts` in place of the checkpoint's, with the count, digest, lengths and
    /// CRC-32s recomputed in its header, as a writer of Redis without the key can. With
    /// `record`, also the shard's record of its checkpoint in its meta hash.
    fn forge(mut self, redis: &Redis, parts: Vec<Vec<Encoded>>, record: bool) {
        let (shard, seq) = (self.shard, self.seq());
        let (count, digest) = digest_of(shard, parts.iter().flatten().cloned());
        for (i, entries) in parts.iter().enumerate() {
            let raw = encode_part(entries);
            let compressed = zstd::bulk::compress(&raw, 3).unwrap();
            let info = &mut self.header["parts"][i];
            info["bytes"] = compressed.len().into();
            info["raw"] = raw.len().into();
            info["crc32"] = crc32fast::hash(&compressed).into();
            redis.set_bytes(&part_name(shard, seq, i), &compressed);
        }
        self.header["count"] = count.into();
        self.header["digest"] = digest.clone().into();
        let text = self.header.to_string();
        redis.cli(&["HSET", &header_name(shard), "h", &text]);
        if record {
            let (seq, count) = (seq.to_string(), count.to_string());
            redis.cli(&[
                "HSET",
                &meta_name(shard),
                "cs",
                &seq,
                "cn",
                &count,
                "cx",
                &digest,
            ]);
        }
    }
}

/// Every result of the entries at 0 µs (the epoch part of `t` kept).
fn at_zero(entries: &[Encoded]) -> Vec<Encoded> {
    entries
        .iter()
        .map(|(text, [t, c, b, a])| {
            let epoch = &t[..t.len() - 16];
            // f64 0.0 in the ordered encoding: its bits with the sign bit set.
            let zero = format!("{epoch}8000000000000000");
            (text.clone(), [zero, c.clone(), b.clone(), a.clone()])
        })
        .collect()
}

/// A genuine checkpoint set aside, with the shard's record of it, to be put back later.
struct SetAside {
    shard: usize,
    seq: u64,
    parts: usize,
    record: Vec<String>,
}

impl SetAside {
    fn take(redis: &Redis, shard: usize) -> SetAside {
        let checkpoint = Checkpoint::read(redis, shard);
        let seq = checkpoint.seq();
        let parts = checkpoint.parts.len();
        let aside = format!("aside:{}", header_name(shard));
        assert_eq!(redis.cli(&["COPY", &header_name(shard), &aside]), "1");
        for i in 0..parts {
            let to = format!("aside:{}", part_name(shard, seq, i));
            assert_eq!(redis.cli(&["COPY", &part_name(shard, seq, i), &to]), "1");
            redis.cli(&["PERSIST", &to]);
        }
        let record = redis.cli(&["HMGET", &meta_name(shard), "cs", "cn", "cx"]);
        SetAside {
            shard,
            seq,
            parts,
            record: record.lines().map(str::to_owned).collect(),
        }
    }

    /// Puts it back as the shard's checkpoint, its record too, with the header's `id` moved
    /// to the stream's newest message.
    fn put_back_moved(&self, redis: &Redis) {
        let shard = self.shard;
        let aside = format!("aside:{}", header_name(shard));
        assert_eq!(
            redis.cli(&["COPY", &aside, &header_name(shard), "REPLACE"]),
            "1"
        );
        for i in 0..self.parts {
            let from = format!("aside:{}", part_name(shard, self.seq, i));
            let to = part_name(shard, self.seq, i);
            assert_eq!(redis.cli(&["COPY", &from, &to, "REPLACE"]), "1");
        }
        if self.record.iter().all(|field| !field.is_empty()) && self.record.len() == 3 {
            redis.cli(&[
                "HSET",
                &meta_name(shard),
                "cs",
                &self.record[0],
                "cn",
                &self.record[1],
                "cx",
                &self.record[2],
            ]);
        }
        let newest = redis.cli(&["XREVRANGE", &log_name(shard), "+", "-", "COUNT", "1"]);
        let newest = newest.lines().next().unwrap().to_owned();
        let mut header: serde_json::Value =
            serde_json::from_str(&redis.cli(&["HGET", &header_name(shard), "h"])).unwrap();
        assert_ne!(header["id"], newest.as_str(), "the shard moved on since");
        header["id"] = newest.into();
        redis.cli(&["HSET", &header_name(shard), "h", &header.to_string()]);
    }
}

/// The results Redis holds now, as `t` fields per entry name (the genuine ones, for
/// comparing after the audit ran).
fn t_fields_of(redis: &Redis, shard: usize) -> Vec<(String, String)> {
    let mut names = redis.keys_matching(&format!("{PREFIX}e:{{s{shard:02}}}*"));
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let t = redis.cli(&["HGET", &name, "t"]);
            (name, t)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_checkpoints_are_rejected_and_a_fresh_node_serves_exactly_what_redis_holds() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let writer = cluster_node(dir.path(), "w", &redis.url(), &BUILD_CHECKPOINTS_OFTEN)
        .process()
        .await;
    wait_connected(&writer).await;
    let first = numbered_op("forged", "first", 0..1600, "w");
    record_all(&writer, &first).await;
    wait_checkpoints_current(&redis).await;
    // Shard 2's checkpoint now, to be put back once it is old.
    let old = SetAside::take(&redis, 2);
    let later = numbered_op("forged", "later", 0..800, "w");
    record_all(&writer, &later).await;
    wait_checkpoints_current(&redis).await;
    drop(writer);

    // Shard 0: every result at 0 µs; shard 1: half the entries gone. Count, digest, lengths
    // and CRC-32s recomputed.
    let zero = Checkpoint::read(&redis, 0);
    let forged: Vec<Vec<Encoded>> = zero.parts.iter().map(|p| at_zero(p)).collect();
    let zero_count = zero.count();
    zero.forge(&redis, forged, false);
    let half = Checkpoint::read(&redis, 1);
    let kept: Vec<Vec<Encoded>> = half
        .parts
        .iter()
        .map(|p| p[..p.len() / 2].to_vec())
        .collect();
    half.forge(&redis, kept, false);
    // Shard 2: the genuine older checkpoint, its header's id moved to the newest message.
    old.put_back_moved(&redis);
    // Shard 3: a part of the wrong type.
    let seq3: u64 = redis
        .cli(&["HGET", &header_name(3), "seq"])
        .parse()
        .unwrap();
    let part3 = part_name(3, seq3, 0);
    redis.cli(&["DEL", &part3]);
    redis.cli(&["HSET", &part3, "not", "a string"]);

    let fresh = cluster_node(dir.path(), "c", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&fresh).await;
    let stats = fresh.stats().await;
    eprintln!(
        "forged: {zero_count} entries at 0 us in shard 0; loaded {}, rejected {}, read again {}",
        stats.cluster_checkpoints_loaded,
        stats.cluster_checkpoints_rejected,
        stats.cluster_shards_reread
    );
    // Exactly what Redis holds: every result as recorded, nothing more.
    let all: Vec<proto::Entry> = first.iter().chain(&later).cloned().collect();
    holds_all(&fresh, &all).await;
    let stats = fresh.stats().await;
    assert_eq!(stats.entries, 2400);
    assert_eq!(stats.cluster_checkpoints_rejected, 4, "{stats:?}");
    assert_eq!(stats.cluster_checkpoints_loaded, 12, "{stats:?}");
    assert_eq!(stats.cluster_shards_reread, 4, "{stats:?}");
    assert_eq!(stats.cluster_audit_repaired, 0, "{stats:?}");
    let log = fresh.log();
    for line in log
        .lines()
        .filter(|l| l.contains("rejected a shard's checkpoint"))
    {
        eprintln!("{line}");
    }
    assert_eq!(
        log.matches("rejected a shard's checkpoint").count(),
        4,
        "{log}"
    );
    assert!(
        stats.cluster_wrong_type_keys.contains(&part3),
        "{}",
        stats.cluster_wrong_type_keys
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cluster_key_a_checkpoint_rewritten_whole_or_moved_is_rejected() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, "a-cluster-key-of-more-than-16-bytes\n").unwrap();
    let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
    std::fs::set_permissions(&key_file, private).unwrap();
    let key_arg = key_file.display().to_string();
    let keyed = ["--cluster-key-file", key_arg.as_str()];
    let writer_flags = [BUILD_CHECKPOINTS_OFTEN.as_slice(), &keyed].concat();
    let writer = cluster_node(dir.path(), "w", &redis.url(), &writer_flags)
        .process()
        .await;
    wait_connected(&writer).await;
    let first = numbered_op("forged", "first", 0..1600, "w");
    record_all(&writer, &first).await;
    wait_checkpoints_current(&redis).await;
    let old = SetAside::take(&redis, 2);
    let later = numbered_op("forged", "later", 0..800, "w");
    record_all(&writer, &later).await;
    wait_checkpoints_current(&redis).await;
    drop(writer);

    // Shard 0 rewritten whole: parts, header and the shard's record of it, all consistent;
    // only the key is missing. Shard 2: the older checkpoint with its record, id moved.
    let zero = Checkpoint::read(&redis, 0);
    let forged: Vec<Vec<Encoded>> = zero.parts.iter().map(|p| at_zero(p)).collect();
    zero.forge(&redis, forged, true);
    old.put_back_moved(&redis);

    let fresh = cluster_node(dir.path(), "c", &redis.url(), &keyed)
        .process()
        .await;
    wait_connected(&fresh).await;
    let all: Vec<proto::Entry> = first.iter().chain(&later).cloned().collect();
    holds_all(&fresh, &all).await;
    let stats = fresh.stats().await;
    assert_eq!(stats.entries, 2400);
    assert_eq!(stats.cluster_checkpoints_rejected, 2, "{stats:?}");
    assert_eq!(stats.cluster_checkpoints_loaded, 14, "{stats:?}");
    let log = fresh.log();
    assert_eq!(
        log.matches("does not verify under --cluster-key-file")
            .count(),
        2,
        "{log}"
    );
}

/// Without a key, a checkpoint rewritten whole (the shard's record of it too) cannot be told
/// from a genuine one while the shard has moved on since; the node's audit then finds the
/// shard differing from Redis, and publishes none of what came only from that checkpoint:
/// Redis's entries, and the node that wrote them, keep the genuine results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_publishes_nothing_it_read_from_a_checkpoint_it_could_not_verify() {
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let mut builder = cluster_node(dir.path(), "w", &redis.url(), &BUILD_CHECKPOINTS_OFTEN)
        .process()
        .await;
    wait_connected(&builder).await;
    let first = numbered_op("forged", "first", 0..800, "w");
    record_all(&builder, &first).await;
    wait_checkpoints_current(&redis).await;
    builder.terminate(Duration::from_secs(10));
    // The origin node, which builds no checkpoint soon, records into every shard: each
    // shard moves past its checkpoint.
    let origin = cluster_node(dir.path(), "o", &redis.url(), &[])
        .process()
        .await;
    wait_connected(&origin).await;
    let later = numbered_op("forged", "later", 0..200, "w");
    record_all(&origin, &later).await;
    origin
        .wait_for_stats("published", |s| s.cluster_published >= 200)
        .await;
    let genuine = t_fields_of(&redis, 0);

    let zero = Checkpoint::read(&redis, 0);
    let forged: Vec<Vec<Encoded>> = zero.parts.iter().map(|p| at_zero(p)).collect();
    zero.forge(&redis, forged, true);

    let fresh = cluster_node(
        dir.path(),
        "c",
        &redis.url(),
        &["--cluster-audit-secs", "1"],
    )
    .process()
    .await;
    wait_connected(&fresh).await;
    // Several audits, the first finding the forged shard differing from Redis.
    let audits = fresh.stats().await.cluster_audits;
    fresh
        .wait_for_stats("three audits, one differing", |s| {
            s.cluster_audits >= audits + 3 && s.cluster_audit_differing >= 1
        })
        .await;
    assert_eq!(
        t_fields_of(&redis, 0),
        genuine,
        "redis took a forged result"
    );
    let stats = fresh.stats().await;
    assert!(stats.cluster_checkpoint_results_withheld > 0, "{stats:?}");
    let all: Vec<proto::Entry> = first.iter().chain(&later).cloned().collect();
    holds_all(&origin, &all).await;
}
