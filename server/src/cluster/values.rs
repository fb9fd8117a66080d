//! Everything the tier reads from Redis, checked exactly like a client's request before any
//! of it is used (`model::validate`, one validation for every source): entries announced on
//! the shard streams, entries read from their hashes (bootstrap, reading a shard again,
//! script replies), tombstones from the tombstone hash and the forget stream. Whoever can
//! write to Redis is trusted no more than a rank: a value a Record or a Forget could not
//! carry (an empty namespace, a 1 MiB problem, a 20 MiB op, a forged `t`, a 4 MiB scope) is
//! refused, dropped alone, counted per source in Stats and logged once per source; it is
//! never stored or journaled (`refusals` counts and logs what is refused).

use std::collections::HashMap;

use redis::Value;
use tunecache_proto::v1;

use super::keys::{decode_at_artifacts, decode_day, decode_epoch_time, decode_stamp, Layout};
use crate::error::{TierError, TierResult};
use crate::model::artifacts::ArtifactsView;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::forget::{ForgetScope, RankScope, Tombstone};
use crate::model::lifecycle::Day;
use crate::model::validate::{self, MAX_KEY_FIELD_BYTES};

/// The longest key text that can hold a valid key: four fields at their limit, each escaped
/// at worst into `\uXXXX` (6 bytes a byte), plus the array's punctuation and a rank. Longer
/// texts are refused before they are parsed.
const MAX_KEY_TEXT_BYTES: usize = 4 * (6 * MAX_KEY_FIELD_BYTES + 3) + 16;
/// The longest scope text (four fields, a rank, a flag).
const MAX_SCOPE_TEXT_BYTES: usize = MAX_KEY_TEXT_BYTES + 8;
/// A Redis value's bytes, if it is a string.
pub fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

fn text<'a>(value: Option<&'a Value>, field: &str) -> TierResult<&'a str> {
    let value = value.ok_or_else(|| TierError::refused(format!("no {field} field")))?;
    let bytes = bytes(value).ok_or_else(|| TierError::refused(format!("{field}: not a string")))?;
    std::str::from_utf8(bytes).map_err(|_| TierError::refused(format!("{field}: not UTF-8")))
}

/// A key text (a JSON array: namespace, op, device, problem, rank), checked as a Lookup's key
/// is; it must also be in the form a daemon writes (the canonical problem where its namespace
/// has one), so that it names the entry it came from.
pub fn key_text(text: &str) -> TierResult<CacheKey> {
    if text.len() > MAX_KEY_TEXT_BYTES {
        return Err(TierError::refused(format!(
            "key text of {} bytes: no valid key is that long",
            text.len()
        )));
    }
    let (namespace, op, device, problem, rank): (String, String, String, String, Option<u32>) =
        serde_json::from_str(text).map_err(|e| TierError::refused(format!("key text: {e}")))?;
    let parsed = CacheKey {
        namespace,
        op,
        device,
        problem,
        rank,
    };
    let key =
        validate::key("key", Some(v1::Key::from(parsed.clone()))).map_err(TierError::refused_by)?;
    if key != parsed {
        return Err(TierError::refused("key.problem: not in canonical form"));
    }
    Ok(key)
}

/// The cache key of an entry name found by SCAN, checked as a client's key is
/// (`key_text`), and its shard; why not for anything else (`Layout::entry_key_text`).
pub fn key_of_entry(layout: &Layout, name: &str) -> TierResult<(CacheKey, usize)> {
    let (text, shard) = layout.entry_key_text(name)?;
    Ok((key_text(text)?, shard))
}

/// A result's four fields as Redis holds them (`keys::encode_result`), checked as a learned
/// Record's result is.
pub fn result(t: &str, c: &str, b: &str, a: &str) -> TierResult<TunedResult> {
    let (forget_epoch, time_us) =
        decode_epoch_time(t).ok_or_else(|| TierError::refused("t: not 16 or 32 hex digits"))?;
    let (tuned_at_unix_ms, artifact_bytes) = decode_at_artifacts(a).ok_or_else(|| {
        TierError::refused("a: not 16 hex digits, then an even run of lowercase hex")
    })?;
    let artifacts = ArtifactsView::parse(&artifact_bytes).ok_or_else(|| {
        TierError::refused("a: the artifacts after the time are not Artifact records")
    })?;
    let result = v1::Result {
        time_us,
        config: c.to_owned(),
        tuned_by: b.to_owned(),
        tuned_at_unix_ms,
        forget_epoch,
        artifacts: artifacts.to_wire(),
    };
    let result = validate::learned_result("result", result).map_err(TierError::refused_by)?;
    // One spelling per result: bytes that are not the canonical form would sit elsewhere in
    // Redis's order than the rule puts the result.
    if result.artifacts.view().encoded() != artifact_bytes.as_slice() {
        return Err(TierError::refused(
            "a: the artifacts are not in their canonical form (name order)",
        ));
    }
    Ok(result)
}

/// A result from four Redis values (a script's reply, an entry hash's fields).
pub fn result_of_values(values: &[Value]) -> TierResult<TunedResult> {
    let field = |i: usize, name: &str| text(values.get(i), name);
    result(
        field(0, "t")?,
        field(1, "c")?,
        field(2, "b")?,
        field(3, "a")?,
    )
}

/// A shard stream's message: the key (`k`) and the result (`t`, `c`, `b`, `a`).
pub fn stream_entry(fields: &HashMap<String, Value>) -> TierResult<(CacheKey, TunedResult)> {
    let field = |name: &str| text(fields.get(name), name);
    let key = key_text(field("k")?)?;
    let result = result(field("t")?, field("c")?, field("b")?, field("a")?)?;
    Ok((key, result))
}

/// A `u` field (`keys::encode_day`): 0 (none known) when absent, nil or empty, as daemons
/// from before lifecycle left it; anything but a day in the form written is refused, with
/// the entry it came with. A day after today is the store's to judge (`plausible_day`).
pub fn day(value: Option<&Value>) -> TierResult<Day> {
    match value {
        None | Some(Value::Nil) => Ok(0),
        Some(value) => {
            let text = text(Some(value), "u")?;
            if text.is_empty() {
                return Ok(0);
            }
            decode_day(text).ok_or_else(|| TierError::refused("u: not a day in decimal"))
        }
    }
}

/// A stream message's last use (`u`; 0 in messages of daemons from before lifecycle).
pub fn stream_day(fields: &HashMap<String, Value>) -> TierResult<Day> {
    day(fields.get("u"))
}

/// An entry hash's `HMGET t c b a s u` reply: the result, the sequence number it was
/// written at (0 when absent), and its last use (`day`).
pub fn entry_fields(values: &[Value]) -> TierResult<(TunedResult, u64, Day)> {
    if values.len() != 6 {
        return Err(TierError::refused(format!(
            "{} fields, not 6",
            values.len()
        )));
    }
    let result = result_of_values(&values[..4])?;
    let seq = match &values[4] {
        Value::Nil => 0,
        value => text(Some(value), "s")?
            .parse()
            .map_err(|_| TierError::refused("s: not a sequence number"))?,
    };
    Ok((result, seq, day(values.get(5))?))
}

/// A scope as the tombstone hash names it: a JSON array of its fields and its rank.
pub fn scope_text(text: &str) -> TierResult<ForgetScope> {
    if text.len() > MAX_SCOPE_TEXT_BYTES {
        return Err(TierError::refused(format!(
            "scope text of {} bytes: no Forget makes one that long",
            text.len()
        )));
    }
    type Fields = (String, String, String, String, Option<u32>, bool);
    let (namespace, op, device, problem, rank, every_rank): Fields =
        serde_json::from_str(text).map_err(|e| TierError::refused(format!("scope text: {e}")))?;
    Ok(ForgetScope {
        namespace,
        op,
        device,
        problem,
        rank: RankScope::from_fields(rank, every_rank),
    })
}

/// A tombstone from its scope text and stamp text, checked like the Forget that made it.
pub fn tombstone(scope: &str, stamp: &str) -> TierResult<Tombstone> {
    let scope = scope_text(scope)?;
    let stamp =
        decode_stamp(stamp).ok_or_else(|| TierError::refused("stamp: not 16 hex digits"))?;
    validate::learned_tombstone("tombstone", Tombstone { scope, stamp })
        .map_err(TierError::refused_by)
}

/// A tombstone as the forget stream carries it: the stamp, a space, the scope text.
pub fn tombstone_message(text: &str) -> TierResult<Tombstone> {
    let (stamp, scope) = text
        .split_once(' ')
        .ok_or_else(|| TierError::refused("not a stamp and a scope"))?;
    tombstone(scope, stamp)
}

/// A forget stream message's `f` field, as text.
pub fn forget_field(fields: &HashMap<String, Value>) -> TierResult<&str> {
    text(fields.get("f"), "f")
}

/// One stream message as read: its id and fields (a field whose name is not UTF-8 is left
/// out, so the message is refused for lacking it rather than failing the whole read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message {
    pub id: String,
    pub fields: HashMap<String, Value>,
}

impl Message {
    pub fn text(&self, name: &str) -> Option<&str> {
        std::str::from_utf8(bytes(self.fields.get(name)?)?).ok()
    }
}

fn pairs(value: &Value) -> Vec<(&Value, &Value)> {
    match value {
        Value::Array(items) => items
            .chunks_exact(2)
            .map(|pair| (&pair[0], &pair[1]))
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    }
}

fn utf8(value: &Value) -> Option<String> {
    Some(std::str::from_utf8(bytes(value)?).ok()?.to_owned())
}

/// An `XREAD` or `XRANGE`-shaped reply read by hand, tolerant of anything a hostile writer
/// put in a message: the stream's messages, or for `XREAD` each stream's. What cannot be a
/// message (a wrong shape, an id that is not text) is skipped.
pub fn stream_read(reply: &Value) -> Vec<(String, Vec<Message>)> {
    let streams: Vec<(&Value, &Value)> = match reply {
        Value::Nil => Vec::new(),
        Value::Array(items) => items
            .iter()
            .filter_map(|item| match item {
                Value::Array(pair) if pair.len() == 2 => Some((&pair[0], &pair[1])),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    };
    streams
        .into_iter()
        .filter_map(|(name, messages)| Some((utf8(name)?, messages_of(messages))))
        .collect()
}

/// The messages of one stream's reply (`XRANGE`, or one stream of `XREAD`).
pub fn messages_of(value: &Value) -> Vec<Message> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(parts) = item else {
                return None;
            };
            let [id, fields] = parts.as_slice() else {
                return None;
            };
            let fields = pairs(fields)
                .into_iter()
                .filter_map(|(name, value)| Some((utf8(name)?, value.clone())))
                .collect();
            Some(Message {
                id: utf8(id)?,
                fields,
            })
        })
        .collect()
}

/// An `HGETALL` reply as text pairs; a pair not UTF-8 is handed back as `Err` with what can
/// be shown of it, so that it is refused alone.
pub fn hash_pairs(reply: &Value) -> Vec<TierResult<(String, String)>> {
    pairs(reply)
        .into_iter()
        .map(|(field, value)| match (utf8(field), utf8(value)) {
            (Some(field), Some(value)) => Ok((field, value)),
            _ => Err(TierError::refused(
                "a field or value that is not UTF-8 text",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cluster::keys::{encode_result, encode_stamp, SHARDS};

    fn good_result() -> TunedResult {
        TunedResult {
            config: r#"{"tile":8}"#.into(),
            time_us: 2.5,
            tuned_by: "node-a".into(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    fn good_key() -> CacheKey {
        CacheKey {
            namespace: "trtllm".into(),
            op: "gemm".into(),
            device: "H200".into(),
            problem: "m=1".into(),
            rank: None,
        }
    }

    fn bulk(text: impl Into<Vec<u8>>) -> Value {
        Value::BulkString(text.into())
    }

    fn message(k: &str, fields: [String; 4]) -> HashMap<String, Value> {
        let [t, c, b, a] = fields;
        [("k", k.to_owned()), ("t", t), ("c", c), ("b", b), ("a", a)]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), bulk(value)))
            .collect()
    }

    #[test]
    fn what_a_daemon_writes_reads_back() {
        let key = good_key();
        let result = good_result();
        let text = Layout::key_text(&key);
        let read = stream_entry(&message(&text, encode_result(&result))).unwrap();
        assert_eq!(read, (key, result.clone()));
        let mut fields: Vec<Value> = encode_result(&result).into_iter().map(bulk).collect();
        fields.push(bulk("7"));
        fields.push(bulk("20000"));
        assert_eq!(entry_fields(&fields).unwrap(), (result.clone(), 7, 20_000));
        // An entry written before lifecycle has no `u`: no day known.
        fields[5] = Value::Nil;
        assert_eq!(entry_fields(&fields).unwrap(), (result.clone(), 7, 0));
        // A `u` no daemon writes refuses the entry, as any other field would.
        for bad in ["-1", "1e3", "020000", "x", "99999999999"] {
            fields[5] = bulk(bad);
            assert!(entry_fields(&fields).is_err(), "{bad}");
        }
        let mut message = message(&text, encode_result(&result));
        assert_eq!(stream_day(&message), Ok(0));
        message.insert("u".into(), bulk("19999"));
        assert_eq!(stream_day(&message), Ok(19_999));
        message.insert("u".into(), Value::Int(5));
        assert!(stream_day(&message).is_err());
    }

    #[test]
    fn the_values_of_finding_7_are_refused() {
        let result = encode_result(&good_result());
        let text = |namespace: &str, op: &str, problem: &str| {
            serde_json::to_string(&(namespace, op, "dev", problem, None::<u32>)).unwrap()
        };
        for (what, k) in [
            ("empty namespace", text("", "gemm", "p")),
            ("1 MiB problem", text("ns", "gemm", &"p".repeat(1 << 20))),
            ("20 MiB op", text("ns", &"o".repeat(20 << 20), "p")),
            ("empty op", text("ns", "", "p")),
        ] {
            assert!(
                stream_entry(&message(&k, result.clone())).is_err(),
                "{what} was accepted"
            );
        }
        let scope = format!(r#"["{}","","","",null,true]"#, "n".repeat(4 << 20));
        let stamp = encode_stamp((crate::model::entry::unix_now_ms() as u64) << 16);
        assert!(tombstone(&scope, &stamp).is_err());
        assert!(tombstone(r#"["ns","","","",null,true]"#, &stamp).is_ok());
        // A forged `t`: an epoch no daemon's clock made yet.
        let far = ((crate::model::entry::unix_now_ms() as u64) + 10 * 86_400_000) << 16;
        let mut forged = result.clone();
        forged[0] = crate::cluster::keys::encode_epoch_time(far, 1.0);
        assert!(stream_entry(&message(&text("ns", "op", "p"), forged)).is_err());
    }

    /// A Redis value of any shape, with the strings a hostile writer would try.
    fn hostile_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::BulkString),
            hostile_text().prop_map(|t| Value::BulkString(t.into_bytes())),
            hostile_text().prop_map(Value::SimpleString),
            Just(Value::Okay),
            any::<f64>().prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
        ];
        leaf.prop_recursive(2, 12, 4, |inner| {
            prop::collection::vec(inner, 0..5).prop_map(Value::Array)
        })
    }

    /// Texts near the valid ones: key and scope arrays with empty, huge or odd fields, `t`
    /// and `a` fields of the wrong length or forged epochs, plain junk.
    fn hostile_text() -> impl Strategy<Value = String> {
        let field = prop_oneof![
            Just(String::new()),
            Just("ns".to_owned()),
            Just("x".repeat(MAX_KEY_FIELD_BYTES)),
            Just("x".repeat(MAX_KEY_FIELD_BYTES + 1)),
            Just("\u{0}\"\\\u{2028}".to_owned()),
            "[a-z{}\\[\\]\",:]{0,12}",
        ];
        let rank = prop_oneof![
            Just("null".to_owned()),
            Just("3".to_owned()),
            Just("-1".to_owned()),
            Just("4294967296".to_owned()),
            Just("\"r\"".to_owned()),
        ];
        prop_oneof![
            (
                field.clone(),
                field.clone(),
                field.clone(),
                field.clone(),
                rank.clone()
            )
                .prop_map(|(n, o, d, p, r)| {
                    let q = |s: &str| serde_json::to_string(s).unwrap();
                    format!("[{},{},{},{},{r}]", q(&n), q(&o), q(&d), q(&p))
                }),
            (field.clone(), field, rank, any::<bool>()).prop_map(|(n, o, r, every)| {
                let q = |s: &str| serde_json::to_string(s).unwrap();
                format!("[{},{},\"\",\"\",{r},{every}]", q(&n), q(&o))
            }),
            any::<u64>().prop_map(|epoch| crate::cluster::keys::encode_epoch_time(epoch, 1.0)),
            any::<u64>().prop_map(encode_stamp),
            any::<i64>().prop_map(crate::cluster::keys::encode_at),
            "[0-9a-fA-F]{0,40}",
            ".{0,24}",
        ]
    }

    fn hostile_fields() -> impl Strategy<Value = HashMap<String, Value>> {
        let name = prop_oneof![
            Just("k"),
            Just("t"),
            Just("c"),
            Just("b"),
            Just("a"),
            Just("s"),
            Just("f"),
            Just("n"),
        ];
        prop::collection::hash_map(name.prop_map(str::to_owned), hostile_value(), 0..8)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Whatever Redis hands back, a decoder either refuses it or returns what a client's
        /// request could have carried, unchanged by being checked again: no panic, and (each
        /// decoder is a bounded pass over its input) no loop.
        #[test]
        fn hostile_redis_values_are_never_accepted_invalid(
            fields in hostile_fields(),
            values in prop::collection::vec(hostile_value(), 0..7),
            scope in hostile_text(),
            stamp in hostile_text(),
        ) {
            if let Ok((key, result)) = stream_entry(&fields) {
                let again = validate::key("k", Some(v1::Key::from(key.clone()))).unwrap();
                prop_assert_eq!(again, key);
                prop_assert!(validate::learned_result("r", result.into()).is_ok());
            }
            if let Ok((result, _, _)) = entry_fields(&values) {
                prop_assert!(validate::learned_result("r", result.into()).is_ok());
            }
            if let Ok(result) = result_of_values(&values) {
                prop_assert!(validate::learned_result("r", result.into()).is_ok());
            }
            for tombstone in [tombstone(&scope, &stamp), tombstone_message(&format!("{stamp} {scope}"))]
                .into_iter()
                .flatten()
            {
                prop_assert!(!tombstone.scope.namespace.is_empty());
                prop_assert_eq!(
                    validate::learned_tombstone("t", tombstone.clone()),
                    Ok(tombstone)
                );
            }
            if let Ok(text) = forget_field(&fields) {
                let _ = tombstone_message(text);
            }
            for value in &values {
                for (_, messages) in stream_read(value) {
                    for message in messages {
                        let _ = stream_entry(&message.fields);
                    }
                }
                let _ = hash_pairs(value);
            }
        }

        /// Every valid entry a daemon writes is read back exactly, whatever its strings.
        #[test]
        fn valid_entries_read_back_exactly(
            namespace in "[a-z]{1,8}",
            op in ".{1,12}",
            device in ".{0,12}",
            problem in ".{0,16}",
            rank in prop::option::of(any::<u32>()),
            time_us in 0.0f64..1e9,
            tuned_by in ".{0,12}",
        ) {
            let key = CacheKey { namespace, op, device, problem, rank };
            let result = TunedResult { time_us, tuned_by, ..good_result() };
            let read = stream_entry(&message(&Layout::key_text(&key), encode_result(&result)));
            prop_assert_eq!(read, Ok((key, result)));
        }
    }

    #[test]
    fn key_text_is_the_json_array_older_daemons_wrote() {
        for rank in [None, Some(0), Some(u32::MAX)] {
            let key = CacheKey {
                namespace: "n\"s".into(),
                op: "op\\/\u{e9}".into(),
                device: "NVIDIA H200|sm_90".into(),
                problem: "m=1,\n\u{1f600}\0".into(),
                rank,
            };
            let older =
                serde_json::json!([key.namespace, key.op, key.device, key.problem, key.rank])
                    .to_string();
            assert_eq!(Layout::key_text(&key), older);
            assert_eq!(key_text(&older), Ok(key));
        }
    }

    #[test]
    fn entry_names_give_back_their_checked_key() {
        let layout = Layout::new("tc:");
        let key = CacheKey {
            namespace: "ns".into(),
            op: "op}{".into(),
            device: "d\"ev".into(),
            problem: "{\"m\":1}".into(),
            rank: Some(3),
        };
        let shard = Layout::shard_of(&key);
        assert_eq!(
            key_of_entry(&layout, &layout.entry(&key)),
            Ok((key.clone(), shard))
        );
        assert!(key_of_entry(&layout, &layout.lease(&key)).is_err());
        // A name whose shard tag was altered is not taken for the key.
        let forged = layout.entry(&key).replacen(
            &format!("{{s{shard:02}}}"),
            &format!("{{s{:02}}}", (shard + 1) % SHARDS),
            1,
        );
        assert!(key_of_entry(&layout, &forged).is_err());
    }
}
