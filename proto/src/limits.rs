//! Limits the daemon and its clients must agree on: what one request may hold (the entry
//! limits, which the daemon validates and documents in README "Validation"), and how large a
//! message either side may send.

/// Most entries (Record) or keys (Lookup) in one request.
pub const MAX_ENTRIES: usize = 10_000;
/// Longest accepted key field (namespace, op, device, problem) and `tuned_by`, in bytes.
pub const MAX_KEY_FIELD_BYTES: usize = 4 * 1024;
/// Longest accepted config JSON text, in bytes.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;

/// Bytes of a protobuf varint holding `value`.
const fn varint_len(value: usize) -> usize {
    let mut len = 1;
    let mut rest = value >> 7;
    while rest > 0 {
        len += 1;
        rest >>= 7;
    }
    len
}

/// Bytes of a length-delimited field (one-byte tag, length, body) of `body` bytes.
const fn delimited_len(body: usize) -> usize {
    1 + varint_len(body) + body
}

/// The largest `Key` the entry limits allow, encoded as one element of a repeated field: four
/// string fields at `MAX_KEY_FIELD_BYTES` and a rank (tag and a five-byte varint).
pub const MAX_ENCODED_KEY_BYTES: usize =
    delimited_len(4 * delimited_len(MAX_KEY_FIELD_BYTES) + 1 + 5);

/// The largest `Artifact` a result may name, as one element of its repeated field: a name
/// of `artifact::MAX_NAME_BYTES`, a hex digest and a ten-byte size varint.
pub const MAX_ENCODED_ARTIFACT_BYTES: usize = delimited_len(
    delimited_len(crate::artifact::MAX_NAME_BYTES)
        + delimited_len(crate::artifact::DIGEST_HEX_LEN)
        + (1 + 10),
);

/// The largest `Entry` the entry limits allow, encoded as one element of a repeated field:
/// the largest key and a result with a `MAX_CONFIG_BYTES` config, a `MAX_KEY_FIELD_BYTES`
/// `tuned_by`, a double, a ten-byte varint and `artifact::MAX_PER_RESULT` of the largest
/// artifacts.
pub const MAX_ENCODED_ENTRY_BYTES: usize = delimited_len(
    MAX_ENCODED_KEY_BYTES
        + delimited_len(
            delimited_len(MAX_CONFIG_BYTES)
                + (1 + 8)
                + delimited_len(MAX_KEY_FIELD_BYTES)
                + (1 + 10)
                + crate::artifact::MAX_PER_RESULT * MAX_ENCODED_ARTIFACT_BYTES,
        ),
);

/// gRPC's framing of one message: a compression flag and a four-byte length.
pub const GRPC_FRAME_HEADER_BYTES: usize = 5;

/// The default largest request message the daemon reads (`--max-message-bytes`). Every
/// request is refused from its gRPC header when larger, before any of it is buffered.
///
/// What the entry limits allow at most is far more than one request should make the daemon
/// hold: `MAX_ENTRIES` of the largest keys is a Lookup of `MAX_LOOKUP_REQUEST_BYTES`
/// (164 MB), of the largest entries a Record of `MAX_RECORD_REQUEST_BYTES` (861 MB), both
/// above the 256 MiB the daemon accepted before. The default is 64 MiB: a full batch of
/// `MAX_ENTRIES` entries averaging 6.7 KB each encoded (a key at its 4 KiB field limit plus a
/// 2 KiB config, say), ten times what the benchmarks and TensorRT-LLM imports send. A batch
/// of larger entries is split by the client, or the flag raised.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// A Lookup of `MAX_ENTRIES` keys, each the largest the entry limits allow.
pub const MAX_LOOKUP_REQUEST_BYTES: usize = MAX_ENTRIES * MAX_ENCODED_KEY_BYTES;
/// A Record of `MAX_ENTRIES` entries, each the largest the entry limits allow (and the
/// longest lease id a Resolve hands out, well under one key field).
pub const MAX_RECORD_REQUEST_BYTES: usize =
    MAX_ENTRIES * MAX_ENCODED_ENTRY_BYTES + delimited_len(MAX_KEY_FIELD_BYTES);

/// Largest gRPC response message the daemon sends and its clients accept (a Lookup answer of
/// `MAX_ENTRIES` hits at the entry limits would be larger; Scan sends at most about 1 MiB a
/// message), and the largest request the Rust client sends: the daemon decides, refusing a
/// request over its `--max-message-bytes` (`DEFAULT_MAX_REQUEST_BYTES` unless raised).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// `google.rpc.ErrorInfo.domain` of the structured details the daemon's refusals carry.
pub const ERROR_DOMAIN: &str = "tunecache.v1";
/// `ErrorInfo.reason` of a request refused for its size (`RESOURCE_EXHAUSTED`, from its gRPC
/// header): the message is over the daemon's `--max-message-bytes`. A smaller batch may pass;
/// clients split on this reason, never on the message's text.
pub const MESSAGE_TOO_LARGE_REASON: &str = "MESSAGE_TOO_LARGE";
/// The flag that sets that limit: `ErrorInfo.metadata["flag"]` and the subject of the
/// `google.rpc.QuotaFailure` violation the same refusal carries.
pub const MAX_MESSAGE_BYTES_FLAG: &str = "--max-message-bytes";
/// `ErrorInfo.metadata` keys of that refusal: the limit and the refused message's size, in bytes.
pub const LIMIT_BYTES_KEY: &str = "limit_bytes";
pub const MESSAGE_BYTES_KEY: &str = "message_bytes";
/// `ErrorInfo.metadata` key naming the flag a refusal's limit comes from.
pub const FLAG_KEY: &str = "flag";

// What the default's comment says: the entry limits' worst cases are larger still.
const _: () = assert!(DEFAULT_MAX_REQUEST_BYTES < MAX_LOOKUP_REQUEST_BYTES);
const _: () = assert!(MAX_MESSAGE_BYTES < MAX_RECORD_REQUEST_BYTES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_entries_are_what_prost_encodes() {
        use prost::Message;

        use crate::v1;
        let field = "x".repeat(MAX_KEY_FIELD_BYTES);
        let key = v1::Key {
            namespace: field.clone(),
            op: field.clone(),
            device: field.clone(),
            problem: field.clone(),
            rank: Some(u32::MAX),
        };
        let entry = v1::Entry {
            key: Some(key.clone()),
            result: Some(v1::Result {
                config: "y".repeat(MAX_CONFIG_BYTES),
                time_us: 1.0,
                tuned_by: field,
                tuned_at_unix_ms: i64::MIN,
                forget_epoch: 0,
                artifacts: vec![
                    v1::Artifact {
                        name: "n".repeat(crate::artifact::MAX_NAME_BYTES),
                        sha256: "f".repeat(crate::artifact::DIGEST_HEX_LEN),
                        size: u64::MAX,
                    };
                    crate::artifact::MAX_PER_RESULT
                ],
            }),
        };
        let lookup = v1::LookupRequest {
            keys: vec![key; 3],
            view: String::new(),
        };
        let record = v1::RecordRequest {
            entries: vec![entry; 3],
            lease_id: String::new(),
        };
        assert_eq!(lookup.encoded_len(), 3 * MAX_ENCODED_KEY_BYTES);
        assert_eq!(record.encoded_len(), 3 * MAX_ENCODED_ENTRY_BYTES);
        assert_eq!(MAX_ENCODED_KEY_BYTES, 16_406);
        assert_eq!(MAX_ENCODED_ARTIFACT_BYTES, 211);
        assert_eq!(MAX_ENCODED_ENTRY_BYTES, 99_577);
    }
}
