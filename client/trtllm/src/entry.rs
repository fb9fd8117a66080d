//! Owns the mapping of one TensorRT-LLM cache entry to a tunecache entry and back: the one rule
//! that import ([`entry_from_file`] for each key of a file), export ([`file_value_of`] for each
//! entry of the cache) and the Python drop-in (`tunecache.integrations.trtllm`, which calls both
//! through the binding `tunecache._native`) share, so that all three accept and refuse the same
//! entries.
//!
//! An entry is what TensorRT-LLM's `_serialize_cache_data` and `json.dump(..., indent=2,
//! default=str)` write for one cache item `key -> (runner_id, tactic, min_time)`: the key text
//! `str(key)` and the value `{"runner_id": ..., "tactic": repr(tactic), "min_time": ...}`. It is
//! accepted only when TensorRT-LLM itself could have written it and its loader reads it back
//! (`tensorrt_llm/_torch/autotuner.py`, `AutoTuner._profile_runners` and
//! `AutoTunerProfilingCache._deserialize_cache_data`):
//!
//! | field | accepted | why |
//! |---|---|---|
//! | key | Python's `str()` of a tuple whose first element is a non-empty `str`, the custom op | the cache key is `(custom_op, runner class, runner id, shapes)`; the loader `literal_eval`s it and takes `key[0]` as the op; `Key.op` is that string, and a key of another shape has no op to file it under |
//! | `runner_id` | a JSON integer, `0 <= runner_id <= i64::MAX` (not a bool, not a float, not text) | it is `enumerate(runners)`'s index, used as `runners[runner_id]` |
//! | `tactic` | a JSON string holding a Python literal (`repr(tactic)`, an enum saved as its value) | the loader `literal_eval`s it and skips the entry when that fails |
//! | `min_time` | a finite, non-negative JSON number of milliseconds | an entry enters TensorRT-LLM's cache only when its measured average beat `inf`, and ranks merge by the lower `min_time` (`_merge_cache_data`), as the daemon merges by `time_us`: an infinite, NaN or negative time was never written by TensorRT-LLM, and the merge could not order it |
//!
//! Everything else is refused with the reason, and the caller skips that entry (import and
//! export list it; the drop-in logs it at debug, as TensorRT-LLM's loader logs what it skips).
//!
//! The tunecache entry: `Key { namespace: "trtllm", op, device, problem: <key text>, rank }`
//! and `Result.config` = [`ImportedConfig`] (the value's three fields as the file spelled them,
//! `min_time_text`, `trtllm_metadata_json`), `Result.time_us` = `min_time * 1000`. Because
//! `runner_id` is an integer its JSON text is exact through any re-serialisation, so it has no
//! text twin; `min_time` has one (`min_time_text`), since a re-serialising store may re-spell a
//! float (`1e-3` as `0.001`).

use serde_json::value::RawValue;
use tunecache_proto::v1::{Entry, Key, Result as TuneResult};

use crate::format::{ImportedConfig, StoredConfig, NAMESPACE};
use crate::pyjson::quote_python_nonfinite_literals;
use crate::pyliteral;
use crate::rawjson::{json_kind, json_number, OrderedRawObject};

/// What every entry of one import or save shares.
#[derive(Debug, Clone, Copy)]
pub struct EntryContext<'a> {
    /// `Key.device`: the metadata's fingerprint ([`TrtllmMetadata::device_fingerprint`](crate::TrtllmMetadata::device_fingerprint)) or the one the caller names.
    pub device: &'a str,
    /// The metadata object's text, kept in each config so that export can restore it.
    pub metadata_json: Option<&'a str>,
    pub tuned_by: &'a str,
    pub tuned_at_unix_ms: i64,
}

/// The tunecache entry of one file entry: `key` is the key text, `value_json` the value's JSON
/// text as Python's `json.dump` writes it (a bare `Infinity` or `NaN` included), `rank` the
/// section's rank (`None`: the shared section). `Err` says why the entry is refused.
pub fn entry_from_file(
    key: &str,
    value_json: &str,
    rank: Option<u32>,
    context: &EntryContext<'_>,
) -> Result<Entry, String> {
    // json.dump writes an infinite or NaN min_time bare, which is no JSON: quoted, the value
    // parses and its min_time is refused with a reason.
    let value_json = quote_python_nonfinite_literals(value_json);
    let fields = serde_json::from_str::<OrderedRawObject>(&value_json)
        .map_err(|_| format!("value is a JSON {}, not an object", json_kind(&value_json)))?;
    // A repeated field: the last one wins, as with Python's json.load.
    let field = |name: &str| {
        fields
            .0
            .iter()
            .rev()
            .find(|(field_name, _)| field_name == name)
            .map(|(_, raw)| raw.as_ref())
            .ok_or_else(|| format!("no {name:?} field"))
    };
    let op = check_key(key)?;
    let runner_id = field("runner_id")?;
    check_runner_id(runner_id)?;
    let tactic = field("tactic")?;
    check_tactic(tactic)?;
    let min_time = field("min_time")?;
    let min_time_ms = check_min_time(min_time.get())?;
    let config = serde_json::to_string(&ImportedConfig {
        runner_id,
        tactic,
        min_time,
        min_time_text: min_time.get(),
        trtllm_metadata_json: context.metadata_json,
    })
    .map_err(|err| format!("could not build the config: {err}"))?;
    Ok(Entry {
        key: Some(Key {
            namespace: NAMESPACE.to_owned(),
            op,
            device: context.device.to_owned(),
            problem: key.to_owned(),
            rank,
        }),
        result: Some(TuneResult {
            config,
            time_us: min_time_ms * 1000.0,
            tuned_by: context.tuned_by.to_owned(),
            tuned_at_unix_ms: context.tuned_at_unix_ms,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    })
}

/// A cache entry's value as it goes into a file: the JSON texts of `runner_id`, `tactic` and
/// `min_time`, as the file first spelled them.
#[derive(Debug)]
pub struct FileValue {
    pub(crate) runner_id: Box<RawValue>,
    pub(crate) tactic: Box<RawValue>,
    pub(crate) min_time: Box<RawValue>,
}

impl FileValue {
    /// The value object's JSON text, `{"runner_id": ..., "tactic": ..., "min_time": ...}`: what
    /// TensorRT-LLM's loader reads back for the entry's key (the drop-in hands it to Python's
    /// `json.loads`, then `ast.literal_eval`s the tactic, as that loader does).
    pub fn value_json(&self) -> String {
        format!(
            r#"{{"runner_id": {}, "tactic": {}, "min_time": {}}}"#,
            self.runner_id.get(),
            self.tactic.get(),
            self.min_time.get()
        )
    }
}

/// The file value of a stored `trtllm` entry (key and result as the daemon answers them), or why
/// it cannot go into a file: the same checks as [`entry_from_file`]. `min_time` is the config's
/// exact text first, then its number (possibly re-spelled by whoever stored the config), then,
/// for a config recorded without one (tuned natively), `time_us / 1000`.
pub fn file_value_of(key: &Key, result: &TuneResult) -> Result<FileValue, String> {
    let config: StoredConfig = serde_json::from_str(&result.config)
        .map_err(|err| format!("config is not a TensorRT-LLM config (runner_id, tactic): {err}"))?;
    check_key(&key.problem)?;
    check_runner_id(&config.runner_id)?;
    check_tactic(&config.tactic)?;
    let min_time = match (config.min_time_text, config.min_time) {
        (Some(text), _) => {
            check_min_time(&text)?;
            RawValue::from_string(text).map_err(|err| format!("min_time_text: {err}"))?
        }
        (None, Some(number)) => {
            check_min_time(number.get())?;
            number
        }
        (None, None) => {
            let ms = result.time_us / 1000.0;
            check_min_time_ms(ms, &ms.to_string())?;
            serde_json::value::to_raw_value(&ms)
                .map_err(|err| format!("could not write min_time: {err}"))?
        }
    };
    Ok(FileValue {
        runner_id: config.runner_id,
        tactic: config.tactic,
        min_time,
    })
}

/// The custom op of an accepted key text: a Python tuple literal whose first element is a
/// non-empty str.
fn check_key(key: &str) -> Result<String, String> {
    match pyliteral::parse(key) {
        Ok(pyliteral::LiteralKind::Tuple { first_is_str: true }) => {}
        Ok(_) => {
            return Err(
                "key is not a Python tuple whose first element is the op name, so the loader \
                 cannot index it"
                    .to_owned(),
            )
        }
        Err(reason) => return Err(format!("key is not a Python literal: {reason}")),
    }
    custom_op_from_key(key)
}

/// The custom op name: the first element of the key, Python's `str()` of a tuple, whose string
/// elements are quoted with `'` (or `"` when the text holds a `'` and no `"`). Only that first
/// string is decoded (by [`pyliteral::repr_str`]); [`check_key`] checks the whole key.
pub(crate) fn custom_op_from_key(key: &str) -> Result<String, String> {
    let after_paren = key
        .trim_start()
        .strip_prefix('(')
        .ok_or("key is not a Python tuple: it does not start with '('")?;
    let first = after_paren.trim_start();
    if !first.starts_with(['\'', '"']) {
        return Err("the key tuple's first element is not a quoted string".to_owned());
    }
    let (op, rest) = pyliteral::repr_str(first)
        .map_err(|reason| format!("the key tuple's first string: {reason}"))?;
    let rest = rest.trim_start();
    if !rest.starts_with(',') && !rest.starts_with(')') {
        return Err(
            "the key tuple's first string is followed by something other than ',' or ')'"
                .to_owned(),
        );
    }
    if op.is_empty() {
        return Err("the custom op name in the key is empty".to_owned());
    }
    Ok(op)
}

fn check_runner_id(runner_id: &RawValue) -> Result<(), String> {
    match serde_json::from_str::<i64>(runner_id.get()) {
        Ok(index) if index >= 0 => Ok(()),
        _ => Err(format!(
            "runner_id {} is not a non-negative integer (it indexes the op's runners)",
            runner_id.get()
        )),
    }
}

fn check_tactic(tactic: &RawValue) -> Result<(), String> {
    let tactic_repr: String = serde_json::from_str(tactic.get()).map_err(|_| {
        format!(
            "tactic is a JSON {}, not the string holding repr(tactic) that the loader reads",
            json_kind(tactic.get())
        )
    })?;
    pyliteral::parse(&tactic_repr)
        .map_err(|reason| format!("tactic {tactic_repr:?} is not a Python literal: {reason}"))?;
    Ok(())
}

/// The milliseconds of an accepted `min_time` text.
fn check_min_time(min_time: &str) -> Result<f64, String> {
    if let Ok(text) = serde_json::from_str::<String>(min_time) {
        if ["Infinity", "-Infinity", "NaN"].contains(&text.as_str()) {
            return Err(format!(
                "min_time {text} is not a finite, non-negative time: TensorRT-LLM stores only a \
                 measured one"
            ));
        }
    }
    let ms = json_number(min_time).ok_or_else(|| format!("min_time {min_time} is not a number"))?;
    check_min_time_ms(ms, min_time)
}

fn check_min_time_ms(ms: f64, text: &str) -> Result<f64, String> {
    if ms.is_finite() && ms >= 0.0 && (ms * 1000.0).is_finite() {
        Ok(ms)
    } else {
        Err(format!(
            "min_time {text} is not a finite, non-negative time: TensorRT-LLM stores only a \
             measured one"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTEXT: EntryContext<'static> = EntryContext {
        device: "NVIDIA H200|sm_90|trtllm 1.1.0",
        metadata_json: None,
        tuned_by: "test",
        tuned_at_unix_ms: 7,
    };

    /// One file entry as TensorRT-LLM's writer spells it, and whether the rule accepts it. The
    /// Python tests run the same kinds of entries through the drop-in and the CLI
    /// (client/python/tests/test_trtllm_mapping.py).
    const CASES: &[(&str, &str, &str, bool)] = &[
        // (what, key text, value JSON text, accepted)
        (
            "plain",
            "('op::a', 'R', '1', ((1, 2),))",
            r#"{"runner_id": 0, "tactic": "5", "min_time": 0.1}"#,
            true,
        ),
        (
            "int min_time",
            "('op::a', 1)",
            r#"{"runner_id": 2, "tactic": "-1", "min_time": 7}"#,
            true,
        ),
        (
            "zero min_time",
            "('op::a', 2)",
            r#"{"runner_id": 0, "tactic": "None", "min_time": 0.0}"#,
            true,
        ),
        (
            "subnormal min_time",
            "('op::a', 3)",
            r#"{"runner_id": 0, "tactic": "(128, 'x')", "min_time": 5e-324}"#,
            true,
        ),
        (
            "dict tactic",
            "('op::a', 4)",
            r#"{"runner_id": 0, "tactic": "{'tile': (64, 128)}", "min_time": 1e-3}"#,
            true,
        ),
        (
            "infinite min_time",
            "('op::b', 1)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": Infinity}"#,
            false,
        ),
        (
            "-infinite min_time",
            "('op::b', 2)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": -Infinity}"#,
            false,
        ),
        (
            "NaN min_time",
            "('op::b', 3)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": NaN}"#,
            false,
        ),
        (
            "negative min_time",
            "('op::b', 4)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": -0.5}"#,
            false,
        ),
        (
            "min_time beyond f64",
            "('op::b', 5)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1e400}"#,
            false,
        ),
        (
            "min_time as text",
            "('op::b', 6)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": "0.5"}"#,
            false,
        ),
        (
            "null min_time",
            "('op::b', 7)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": null}"#,
            false,
        ),
        (
            "float runner_id",
            "('op::c', 1)",
            r#"{"runner_id": 0.5, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "integral float runner_id",
            "('op::c', 2)",
            r#"{"runner_id": 1.0, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "bool runner_id",
            "('op::c', 3)",
            r#"{"runner_id": true, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "text runner_id",
            "('op::c', 4)",
            r#"{"runner_id": "0", "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "negative runner_id",
            "('op::c', 5)",
            r#"{"runner_id": -1, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "huge runner_id",
            "('op::c', 6)",
            r#"{"runner_id": 1180591620717411303424, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "non-string op",
            "(42, 'op')",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "empty op",
            "('', 1)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "key not a tuple",
            "'op::d'",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "key not a literal",
            "('op::d', inf)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#,
            false,
        ),
        (
            "tactic not a literal",
            "('op::e', 1)",
            r#"{"runner_id": 0, "tactic": "Opaque(tile=64)", "min_time": 1}"#,
            false,
        ),
        (
            "nan tactic",
            "('op::e', 2)",
            r#"{"runner_id": 0, "tactic": "nan", "min_time": 1}"#,
            false,
        ),
        (
            "tactic not text",
            "('op::e', 3)",
            r#"{"runner_id": 0, "tactic": 4, "min_time": 1}"#,
            false,
        ),
        (
            "no tactic",
            "('op::e', 4)",
            r#"{"runner_id": 0, "min_time": 1}"#,
            false,
        ),
        (
            "value not an object",
            "('op::e', 5)",
            r#"[0, "4", 1]"#,
            false,
        ),
    ];

    #[test]
    fn the_rule_accepts_what_tensorrt_llm_writes_and_nothing_else() {
        for (what, key, value, accepted) in CASES {
            let outcome = entry_from_file(key, value, Some(0), &CONTEXT);
            assert_eq!(outcome.is_ok(), *accepted, "{what}: {outcome:?}");
        }
    }

    #[test]
    fn export_gives_back_the_value_import_took_and_refuses_the_same() {
        for (what, key, value, accepted) in CASES.iter().filter(|case| case.3) {
            let entry = entry_from_file(key, value, None, &CONTEXT).expect("accepted");
            let result = entry.result.as_ref().expect("result");
            let back = file_value_of(entry.key.as_ref().expect("key"), result).expect(what);
            let again: serde_json::Value = serde_json::from_str(&back.value_json()).expect(what);
            let first: serde_json::Value = serde_json::from_str(value).expect(what);
            assert_eq!(again, first, "{what}");
            assert!(*accepted);
        }
        // A stored config export cannot write: the same reasons.
        let key = |problem: &str| Key {
            namespace: NAMESPACE.to_owned(),
            op: "op".to_owned(),
            device: CONTEXT.device.to_owned(),
            problem: problem.to_owned(),
            rank: Some(0),
        };
        let stored = |config: &str, time_us: f64| TuneResult {
            config: config.to_owned(),
            time_us,
            ..TuneResult::default()
        };
        let refused = [
            // What the drop-in stored before this rule: an inf min_time as text.
            (
                r#"{"runner_id": 0, "tactic": "4", "min_time": null, "min_time_text": "Infinity"}"#,
                "('op', 1)",
            ),
            (
                r#"{"runner_id": 1.5, "tactic": "4", "min_time": 1}"#,
                "('op', 1)",
            ),
            (
                r#"{"runner_id": 0, "tactic": 4, "min_time": 1}"#,
                "('op', 1)",
            ),
            (
                r#"{"runner_id": 0, "tactic": "4", "min_time": -1}"#,
                "('op', 1)",
            ),
            (
                r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#,
                "(42, 'op')",
            ),
        ];
        for (config, problem) in refused {
            assert!(
                file_value_of(&key(problem), &stored(config, 1000.0)).is_err(),
                "{config} {problem}"
            );
        }
        // A config recorded natively, without min_time: time_us / 1000.
        let native = file_value_of(
            &key("('op', 1)"),
            &stored(r#"{"runner_id": 0, "tactic": "4"}"#, 250.0),
        )
        .expect("native config");
        assert_eq!(native.min_time.get(), "0.25");
        // The drop-in's runner_id_text of before is ignored: runner_id itself is exact.
        let older = file_value_of(
            &key("('op', 1)"),
            &stored(r#"{"runner_id": 3, "runner_id_text": "3", "tactic": "4", "min_time": 0.5, "min_time_text": "5e-1"}"#, 500.0),
        )
        .expect("older drop-in config");
        assert_eq!(
            older.value_json(),
            r#"{"runner_id": 3, "tactic": "4", "min_time": 5e-1}"#
        );
    }

    #[test]
    fn refusals_say_why() {
        let reason = |key: &str, value: &str| {
            entry_from_file(key, value, None, &CONTEXT).expect_err("refused")
        };
        assert!(reason(
            "('op', 1)",
            r#"{"runner_id": 0, "tactic": "4", "min_time": Infinity}"#
        )
        .contains("Infinity"));
        assert!(reason(
            "('op', 1)",
            r#"{"runner_id": -1, "tactic": "4", "min_time": 1}"#
        )
        .contains("runner_id -1 is not a non-negative integer"));
        assert!(reason(
            "(42, 'op')",
            r#"{"runner_id": 0, "tactic": "4", "min_time": 1}"#
        )
        .contains("op name"));
        assert!(reason(
            "('op', 1)",
            r#"{"runner_id": 0, "tactic": "Tactic(3)", "min_time": 1}"#
        )
        .contains("not a Python literal"));
    }

    #[test]
    fn custom_op_parsing_follows_python_repr() {
        assert_eq!(custom_op_from_key("('a::b', 1)").as_deref(), Ok("a::b"));
        assert_eq!(custom_op_from_key("(\"it's\",)").as_deref(), Ok("it's"));
        assert_eq!(
            custom_op_from_key(r#"('it\'s \"x\"', 1)"#).as_deref(),
            Ok("it's \"x\"")
        );
        assert_eq!(
            custom_op_from_key(r"('tab\there\x41\u00e9',)").as_deref(),
            Ok("tab\thereA\u{e9}")
        );
        assert_eq!(custom_op_from_key("('only')").as_deref(), Ok("only"));
        assert!(custom_op_from_key("('unterminated, 1)").is_err());
        assert!(custom_op_from_key("('', 1)").is_err());
        assert!(custom_op_from_key("('a'b', 1)").is_err());
        assert!(custom_op_from_key(r"('bad\q',)").is_err());
        assert!(custom_op_from_key("[ 'a' ]").is_err());
    }
}
