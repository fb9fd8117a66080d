//! The cache's entries as they are kept in memory: each one in wire form, beside an ordered
//! index whose keys point into those bytes.
//!
//! A [`StoredEntry`] holds one `tunecache.v1.Entry`, encoded exactly as prost encodes it, as a
//! field-1 record (tag, length, message): the bytes a `LookupResponse` hit, a `ScanResponse`
//! entry and a `JournalBatch` own entry all are. Lookup, Scan and the journal copy them out;
//! nothing re-encodes them. Its namespace, op and device come from an interned [`Vocab`]
//! (a cache has a few dozen distinct values of each), its problem is found at an offset in the
//! record, and its rank is kept beside it: so the index orders entries without parsing them
//! or holding a separate allocation per field. One entry is one allocation (its bytes, shared
//! by every version of the map and by the own-contributions map that holds it).
//!
//! Decoded views ([`KeyView`], [`ResultView`], or owned `CacheKey`/`TunedResult`) are read from
//! the bytes on demand, for the merge rule, snapshots and the cluster tier.

mod codec;
mod entry;
mod index;
mod vocab;

pub(crate) use codec::{parse_entry_body, parse_key, take_delimited};
pub use entry::StoredEntry;
pub use index::EntryMap;
pub use vocab::RecentVocabs;

#[cfg(test)]
mod tests {
    use std::ops::Bound;
    use std::sync::Arc;

    use equivalent::Comparable;

    use super::entry::*;
    use super::index::*;
    use super::vocab::*;
    use crate::model::entry::{CacheKey, KeyView, TunedResult};
    use prost::Message;
    use tunecache_proto::v1;

    fn key(namespace: &str, op: &str, device: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: namespace.into(),
            op: op.into(),
            device: device.into(),
            problem: problem.into(),
            rank,
        }
    }

    fn result(config: &str, time_us: f64, tuned_by: &str, at: i64) -> TunedResult {
        TunedResult {
            config: config.into(),
            time_us,
            tuned_by: tuned_by.into(),
            tuned_at_unix_ms: at,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    /// Keys whose order is easy to get wrong: empty fields, prefixes, NUL bytes, non-ASCII
    /// (bytes above 0x7f), rank `None` against `Some(0)`.
    fn awkward_keys() -> Vec<CacheKey> {
        let strings = [
            "",
            "a",
            "a\0",
            "a\0b",
            "ab",
            "b",
            "\u{e9}",
            "\u{1f600}",
            "\u{7f}",
            "Z",
        ];
        let mut keys = Vec::new();
        for (i, a) in strings.iter().enumerate() {
            for (j, b) in strings.iter().enumerate() {
                let rank = [None, Some(0), Some(u32::MAX)][(i + j) % 3];
                keys.push(key(a, b, strings[(i * 3 + j) % strings.len()], b, rank));
                keys.push(key("ns", a, "dev", b, rank));
                keys.push(key("ns", "op", a, b, None));
                keys.push(key("ns", "op", "dev", &format!("{a}{b}"), rank));
            }
        }
        keys
    }

    #[test]
    fn round_trips_every_field() {
        let pairs = [
            (key("", "", "", "", None), result("", 0.0, "", 0)),
            (
                key("trtllm", "gemm", "H200|sm_90", "m=1\0\u{e9}", Some(0)),
                result("{\"t\":1}", 1e-9, "node-\u{1f600}", i64::MIN),
            ),
            (
                key("n", "o", "d", &"p".repeat(5000), Some(u32::MAX)),
                result(&"c".repeat(70_000), f64::MAX, "t", i64::MAX),
            ),
            (
                key("bitblas", "matmul", "H200|sm_90", "m=1", None),
                TunedResult {
                    forget_epoch: 9,
                    artifacts: crate::model::artifacts::ArtifactList::from_wire(vec![
                        v1::Artifact {
                            name: "wrapper_compiled.so".into(),
                            sha256: "ab".repeat(32),
                            size: 1 << 30,
                        },
                        v1::Artifact {
                            name: "source.cu".into(),
                            sha256: "cd".repeat(32),
                            size: 0,
                        },
                    ]),
                    ..result("{}", 2.0, "t", 1)
                },
            ),
        ];
        for (key, result) in &pairs {
            let entry = StoredEntry::new(key, result);
            assert_eq!(&entry.to_pair(), &(key.clone(), result.clone()));
            assert_eq!(entry.key(), key.view());
            assert_eq!(entry.result(), result.view());
            assert_eq!(entry.namespace(), key.namespace);
            assert_eq!(entry.device(), key.device);
            assert_eq!(entry.rank(), key.rank);
            assert_eq!(
                entry.encoded_len_estimate(),
                key.encoded_len_estimate() + result.encoded_len_estimate()
            );
            // The record is the field-1 `Entry` prost writes.
            let expected = v1::ScanResponse {
                entries: vec![crate::model::entry::to_wire_entry(key, result)],
            };
            assert_eq!(entry.record(), expected.encode_to_vec().as_slice());
        }
    }

    #[test]
    fn orders_exactly_as_cache_key() {
        let keys = awkward_keys();
        let stored: Vec<StoredEntry> = keys
            .iter()
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        for (a, sa) in keys.iter().zip(&stored) {
            for (b, sb) in keys.iter().zip(&stored) {
                assert_eq!(sa.cmp(sb), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(b.view().compare(sa), b.cmp(a), "{b:?} vs {a:?}");
                assert_eq!(a.view().order(&b.view()), a.cmp(b));
            }
        }
        // The map iterates in CacheKey order and finds every key by a borrowed view.
        let map: EntryMap = stored.iter().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        let iterated: Vec<CacheKey> = map.iter().map(|e| e.to_pair().0).collect();
        assert_eq!(iterated, sorted);
        for key in &keys {
            assert_eq!(map.get(key).map(|e| e.to_pair().0).as_ref(), Some(key));
        }
        assert!(map.get(&key("ns", "op", "dev", "absent", None)).is_none());
        // A range from a namespace's start holds exactly that namespace and what follows.
        let from: Vec<CacheKey> = map
            .range_from(Bound::Included(KeyView::namespace_start("ns")))
            .map(|e| e.to_pair().0)
            .collect();
        let expected: Vec<CacheKey> = sorted
            .iter()
            .filter(|k| k.namespace.as_str() >= "ns")
            .cloned()
            .collect();
        assert_eq!(from, expected);
    }

    #[test]
    fn get_many_finds_what_get_finds_in_request_order() {
        let keys = awkward_keys();
        let map: EntryMap = keys
            .iter()
            .step_by(2)
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        // Held keys, keys of a held vocabulary but absent, keys of a vocabulary never
        // interned, repeated keys, in an order unlike the map's.
        let mut asked: Vec<CacheKey> = keys.iter().rev().cloned().collect();
        asked.push(key("never-interned-ns", "op", "dev", "a", None));
        asked.extend(keys.iter().take(7).cloned());
        asked.push(key("ns", "op", "dev", "absent", None));
        let expected: Vec<CacheKey> = asked
            .iter()
            .filter_map(|k| map.get(k))
            .map(|e| e.to_pair().0)
            .collect();
        let found: Vec<CacheKey> = map
            .get_many(asked.iter().map(CacheKey::view))
            .into_iter()
            .map(|e| e.to_pair().0)
            .collect();
        assert!(expected.len() > keys.len() / 4, "{}", expected.len());
        assert_eq!(found, expected);
    }

    #[test]
    fn vocab_keys_order_exactly_as_cache_key() {
        let keys = awkward_keys();
        let stored: Vec<StoredEntry> = keys
            .iter()
            .map(|k| StoredEntry::new(k, &result("{}", 1.0, "t", 1)))
            .collect();
        for a in &keys {
            let vocab = intern(&a.namespace, &a.op, &a.device);
            let probe = VocabKey {
                vocab: &vocab,
                problem: &a.problem,
                rank: a.rank,
            };
            for (b, sb) in keys.iter().zip(&stored) {
                assert_eq!(probe.compare(sb), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn insert_replaces_the_entry_of_the_same_key() {
        let k = key("ns", "op", "dev", "p", Some(1));
        let mut map = EntryMap::new();
        map.insert(StoredEntry::new(&k, &result("{}", 2.0, "a", 1)));
        let better = StoredEntry::new(&k, &result("{}", 1.0, "b", 2));
        assert!(!map.contains(&better));
        map.insert(better.clone());
        assert_eq!(map.len(), 1);
        assert!(map.contains(&better));
        assert_eq!(map.get(&k).map(|e| e.result().tuned_by), Some("b"));
    }

    #[test]
    fn equal_vocabularies_are_one_allocation() {
        let a = StoredEntry::new(
            &key("trtllm", "gemm", "H200", "m=1", None),
            &result("{}", 1.0, "", 0),
        );
        let b = StoredEntry::new(
            &key("trtllm", "gemm", "H200", "m=2", Some(3)),
            &result("[]", 2.0, "x", 5),
        );
        let c = StoredEntry::new(
            &key("trtllm", "gemm", "H100", "m=1", None),
            &result("{}", 1.0, "", 0),
        );
        assert!(Arc::ptr_eq(&a.vocab, &b.vocab));
        assert!(!Arc::ptr_eq(&a.vocab, &c.vocab));
        // Fields are not confused across positions ("ab","c" vs "a","bc").
        let d = intern("ab", "c", "");
        let e = intern("a", "bc", "");
        assert!(!Arc::ptr_eq(&d, &e));
        assert_eq!((d.namespace(), e.namespace()), ("ab", "a"));
    }

    #[test]
    fn unused_vocabulary_is_swept() {
        // Distinct values nothing keeps: the table sweeps them instead of growing.
        for i in 0..(4 * MIN_SWEEP_AT) {
            drop(intern(&format!("sweep-{i}"), "op", "dev"));
        }
        let kept = intern("sweep-kept", "op", "dev");
        let table = interner().lock().unwrap();
        let sweep_values = table
            .by_hash
            .values()
            .flatten()
            .filter(|v| v.namespace().starts_with("sweep-"))
            .count();
        assert!(sweep_values <= 2 * MIN_SWEEP_AT, "{sweep_values} kept");
        drop(table);
        assert!(Arc::ptr_eq(&kept, &intern("sweep-kept", "op", "dev")));
    }
}
