//! The checkpoint format's rules, tested without Redis: what reads back, and what a writer
//! of Redis without the key cannot make a reader accept.

use super::*;
use crate::cluster::keys::encode_result;

fn entries_of(shard: usize, n: usize) -> Vec<(String, [String; 4])> {
    (0..)
        .map(|i| CacheKey {
            namespace: "trtllm".into(),
            op: format!("gemm_{}", i % 7),
            device: "H200".into(),
            problem: format!("m={i},n=4096"),
            rank: None,
        })
        .map(|key| Layout::key_text(&key))
        .filter(|text| Layout::shard_of_text(text) == shard)
        .take(n)
        .map(|text| {
            let result = TunedResult {
                config: format!(r#"{{"tile":{}}}"#, text.len()),
                time_us: 1.5,
                tuned_by: "a".into(),
                tuned_at_unix_ms: 1_700_000_000_000,
                forget_epoch: 0,
                artifacts: Default::default(),
            };
            (text, encode_result(&result))
        })
        .collect()
}

fn origin(shard: usize, seq: u64) -> Origin<'static> {
    Origin {
        prefix: "tc:",
        shard,
        epoch: "e1",
        seq,
        id: "5-0",
        built_by: "a",
    }
}

#[test]
fn a_checkpoint_reads_back_and_rejects_any_damage_or_another_prefix() {
    let layout = Layout::new("tc:");
    let entries = entries_of(3, 500);
    let built = build(&layout, &origin(3, 42), None, &entries).unwrap();
    let json = serde_json::to_vec(&built.header).unwrap();
    let header = parse_header(&json, "tc:", 3, Some("e1"), None).unwrap();
    let read = verify(&layout, &header, &built.parts, None).unwrap();
    assert_eq!(read.entries.len(), 500);
    assert_eq!(read.digests.len(), 500);
    assert!(parse_header(&json, "other:", 3, Some("e1"), None).is_err());
    assert!(parse_header(&json, "tc:", 4, Some("e1"), None).is_err());
    assert!(parse_header(&json, "tc:", 3, Some("e2"), None).is_err());
    // A byte flipped anywhere in a part.
    let mut damaged = built.parts.clone();
    let middle = damaged[0].len() / 2;
    damaged[0][middle] ^= 1;
    assert!(verify(&layout, &header, &damaged, None).is_err());
    // The same bytes under another prefix: their digest is another prefix's.
    let mut foreign = header.clone();
    foreign.prefix = "other:".into();
    assert!(verify(&Layout::new("other:"), &foreign, &built.parts, None).is_err());
    // A header that claims another count.
    let mut lying = header;
    lying.count += 1;
    assert!(verify(&layout, &lying, &built.parts, None).is_err());
}

/// What a writer of Redis without the key can do: rewrite a part and recompute the
/// header's count, digest, length and CRC-32, or move the header's id.
#[test]
fn with_a_key_a_rewritten_part_or_a_moved_header_does_not_verify() {
    let layout = Layout::new("tc:");
    let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
    let entries = entries_of(3, 200);
    let built = build(&layout, &origin(3, 42), Some(&key), &entries).unwrap();
    let json = serde_json::to_vec(&built.header).unwrap();
    let header = parse_header(&json, "tc:", 3, Some("e1"), Some(&key)).unwrap();
    assert_eq!(
        verify(&layout, &header, &built.parts, Some(&key))
            .unwrap()
            .entries
            .len(),
        200
    );
    // A node without the key reads it as before.
    let plain = parse_header(&json, "tc:", 3, Some("e1"), None).unwrap();
    assert!(verify(&layout, &plain, &built.parts, None).is_ok());

    // Half the entries, everything recomputed but the MACs.
    let forged = build(&layout, &origin(3, 42), None, &entries[..100]).unwrap();
    let mut header_forged = forged.header.clone();
    header_forged.mac = header.mac.clone();
    let text = serde_json::to_vec(&header_forged).unwrap();
    assert!(parse_header(&text, "tc:", 3, Some("e1"), Some(&key))
        .unwrap_err()
        .to_string()
        .contains("MAC"));
    assert!(parse_header(&text, "tc:", 3, Some("e1"), None).is_ok());
    // The genuine header over forged parts: the part's MAC (and CRC) fail.
    let mut parts = forged.parts.clone();
    let mut genuine = header.clone();
    genuine.parts[0].bytes = parts[0].len() as u64;
    genuine.parts[0].crc32 = crc32fast::hash(&parts[0]);
    assert!(verify(&layout, &genuine, &parts, Some(&key))
        .unwrap_err()
        .to_string()
        .contains("MAC"));
    parts[0] = built.parts[0].clone();
    assert!(verify(&layout, &header, &parts, Some(&key)).is_ok());
    // The id moved to a later message.
    let mut moved = header.clone();
    moved.id = "9-0".into();
    let text = serde_json::to_vec(&moved).unwrap();
    assert!(parse_header(&text, "tc:", 3, Some("e1"), Some(&key)).is_err());
    // No MAC at all, or another key.
    let unsigned = build(&layout, &origin(3, 42), None, &entries).unwrap();
    let text = serde_json::to_vec(&unsigned.header).unwrap();
    assert!(parse_header(&text, "tc:", 3, Some("e1"), Some(&key))
        .unwrap_err()
        .to_string()
        .contains("no MAC"));
    let other = SharedKey::new(b"another-key-of-16+bytes").unwrap();
    assert!(parse_header(&json, "tc:", 3, Some("e1"), Some(&other)).is_err());
    // A genuine part of another checkpoint (another sequence number) in its place.
    let elsewhere = build(&layout, &origin(3, 41), Some(&key), &entries).unwrap();
    let mut swapped = header.clone();
    swapped.parts = elsewhere.header.parts.clone();
    let tag = key.sign(&[HEADER_DOMAIN, &swapped.signed_bytes()]);
    swapped.mac = Some(tag);
    assert!(verify(&layout, &swapped, &elsewhere.parts, Some(&key)).is_err());
}

#[test]
fn a_header_must_be_the_shards_record_of_it_and_sit_at_its_message() {
    let layout = Layout::new("tc:");
    let built = build(&layout, &origin(3, 42), None, &entries_of(3, 10)).unwrap();
    let header = built.header;
    let record = ShardRecord {
        header_seq: Some(42),
        live: (50, 12, "ffff".into()),
        checkpoint: Some((42, 10, header.digest.clone())),
    };
    assert_eq!(check_record(&header, &record), Ok(()));
    let refused = |change: &dyn Fn(&mut ShardRecord)| {
        let mut record = record.clone();
        change(&mut record);
        check_record(&header, &record).unwrap_err().to_string()
    };
    assert!(refused(&|r| r.checkpoint = None).contains("no record"));
    assert!(refused(&|r| r.checkpoint = Some((41, 10, header.digest.clone()))).contains("record"));
    assert!(refused(&|r| r.checkpoint = Some((42, 11, header.digest.clone()))).contains("record"));
    assert!(refused(&|r| r.checkpoint = Some((42, 10, "0".into()))).contains("record"));
    assert!(refused(&|r| r.header_seq = Some(43)).contains("seq"));
    assert!(refused(&|r| r.live.0 = 41).contains("newer"));
    // Still at its sequence number: the live count and digest must be its own.
    assert!(refused(&|r| r.live.0 = 42).contains("holds"));
    let mut quiet = record.clone();
    quiet.live = (42, 10, header.digest.clone());
    assert_eq!(check_record(&header, &quiet), Ok(()));

    let message = |id: &str, s: Option<&str>| Message {
        id: id.into(),
        fields: s
            .map(|s| [("s".to_owned(), redis::Value::BulkString(s.into()))].into())
            .unwrap_or_default(),
    };
    assert_eq!(check_place(&header, &[message("5-0", Some("42"))]), Ok(()));
    assert!(check_place(&header, &[message("5-0", Some("50"))]).is_err());
    assert!(check_place(&header, &[message("5-0", None)]).is_err());
    assert!(check_place(&header, &[message("6-0", Some("42"))]).is_err());
    assert!(check_place(&header, &[]).is_err());
    for id in ["5-0", "1700000000000-17"] {
        assert!(is_message_id(id), "{id}");
    }
    for id in [
        "",
        "5",
        "-0",
        "5-",
        "5-0-1",
        "a-0",
        "0x5-0",
        &"9".repeat(60),
    ] {
        assert!(!is_message_id(id), "{id}");
    }
}

#[test]
fn a_large_shard_splits_into_parts_of_a_few_mib() {
    let layout = Layout::new("tc:");
    let mut entries = entries_of(0, 3000);
    for (_, fields) in &mut entries {
        fields[1] = format!("\"{}\"", "x".repeat(3000));
    }
    let built = build(&layout, &origin(0, 1), None, &entries).unwrap();
    assert!(built.header.parts.len() >= 2, "{:?}", built.header.parts);
    assert!(built
        .header
        .parts
        .iter()
        .all(|p| p.raw <= PART_RAW_BYTES as u64));
    let read = verify(&layout, &built.header, &built.parts, None).unwrap();
    assert_eq!(read.entries.len(), 3000);
}
