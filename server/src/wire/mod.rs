//! The wire form of cache entries: every hand-written protobuf byte, and nothing else.
//!
//! A Lookup or Scan response is a list of `tunecache.v1.Entry` messages. Building it as prost
//! messages would cost six `String` clones per entry, then an encode pass over them. The store
//! keeps every entry already encoded (`stored`), so a response is those records copied into
//! one buffer (`encoded`); the tonic codec then copies that buffer out as the message body.
//! The bytes are exactly what prost writes for the same `Entry` (same field order, defaults
//! skipped), so grpcurl, grpcio and the Rust client see the unchanged `tunecache.v1` contract.
//!
//! Lookup and Record requests are read in place from their bytes within the entry limit
//! (`lookup_request`, `record_request`): a request of more entries than allowed is refused at
//! the first one over, before prost builds any. The routes that hand them their bytes are
//! `rpc::routes`.

pub(crate) mod encoded;
pub(crate) mod lookup_request;
pub(crate) mod record_request;
pub(crate) mod stored;

#[cfg(test)]
mod tests {
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::wire::encoded::EncodedEntries;
    use crate::wire::stored::StoredEntry;
    use prost::Message;
    use tunecache_proto::v1;

    fn key(namespace: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: namespace.into(),
            op: "gemm".into(),
            device: "NVIDIA H200|sm_90".into(),
            problem: problem.into(),
            rank,
        }
    }

    fn result(config: &str, time_us: f64, tuned_at: i64) -> TunedResult {
        TunedResult {
            config: config.into(),
            time_us,
            tuned_by: "node-a/rank-3".into(),
            tuned_at_unix_ms: tuned_at,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    #[test]
    fn encoded_entries_are_the_bytes_prost_writes() {
        let long_problem = "m=4096,n=4096,k=4096;".repeat(20);
        let pairs = vec![
            (
                key("trtllm", "m=1", None),
                result("{\"tile\":128}", 12.5, 1_700_000_000_000),
            ),
            (key("", "", Some(0)), result("", 0.0, 0)),
            (
                key("bitblas", &long_problem, Some(127)),
                result("[]", 1e-9, -5),
            ),
            (
                key("ns", "p", Some(u32::MAX)),
                result("{}", f64::MAX, i64::MIN),
            ),
            (
                key("\u{e9}\0ns", "p\0\u{1f600}", None),
                result("\"\u{e9}\"", 3.5, 0),
            ),
        ];
        let mut encoded = EncodedEntries::default();
        for (key, result) in &pairs {
            encoded.push(&StoredEntry::new(key, result));
        }
        let expected = v1::ScanResponse {
            entries: pairs
                .iter()
                .map(|(key, result)| crate::model::entry::to_wire_entry(key, result))
                .collect(),
        };
        assert_eq!(encoded.len(), pairs.len());
        assert_eq!(encoded.encoded_len(), expected.encoded_len());
        let bytes = encoded.encode_to_vec();
        assert_eq!(bytes, expected.encode_to_vec());
        assert_eq!(
            v1::LookupResponse::decode(bytes.as_slice()).unwrap().hits,
            expected.entries
        );
    }
}
