//! Fuzz target for the TensorRT-LLM cache file parser (`trtllm::import`), which reads a file
//! that any rank's TensorRT-LLM process may have written, half-written or mangled.
//!
//! proptest rather than cargo-fuzz, so that it runs on stable inside `cargo test`; see the
//! same note in server/tests/fuzz_targets.rs. Documents are generated the way TensorRT-LLM
//! writes them (sections, Python tuple keys, `Infinity`, duplicate names) with adversarial
//! values, plus token soup and raw bytes. `PROPTEST_CASES=N` runs longer (docs/ci.md).
//!
//! Properties: import never panics; every entry it returns is one the daemon accepts; and a
//! successful import round-trips: import and export share one rule for what an entry may be
//! (`tunecache_trtllm::entry`), so exporting what was imported writes every entry and skips
//! none, importing the export gives the same entries, and exporting those again gives the same
//! bytes.

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use tunecache_proto::v1::Entry;
use tunecache_trtllm::{export, import, ExportOptions, NAMESPACE};

fn pick(items: &[&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(items.to_vec()).prop_map(str::to_owned)
}

/// Mostly a value TensorRT-LLM could have written, so that most documents get through import
/// and export; now and then one it could not.
fn mostly(valid: &[&'static str], invalid: &[&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![12 => pick(valid), 1 => pick(invalid)]
}

fn metadata() -> impl Strategy<Value = String> {
    (
        mostly(
            &[
                r#""NVIDIA H200""#,
                r#""NVIDIA \"B200\" \\ é""#,
                r#""\ud83d\ude00""#,
            ],
            &[r#""""#, "7"],
        ),
        mostly(
            &["[9, 0]", "[10,0]", r#""9.0""#],
            &[r#""9.x""#, "[9]", "[4294967296, 0]", "[-1, 0]", "[9.0, 0]"],
        ),
        pick(&[
            "1700000000.123456",
            "1.7e9",
            "0",
            "-1e300",
            "1e300",
            r#""yesterday""#,
            "NaN",
        ]),
        prop::bool::ANY,
    )
        .prop_map(|(name, capability, timestamp, extra)| {
            format!(
                r#"{{"lib_version": "0.20.0", "creation_timestamp": {timestamp}, "device_name": {name}, "device_capability": {capability}{}}}"#,
                if extra { r#", "future": {"x": [1, 2]}"# } else { "" }
            )
        })
}

/// Python's `str()` of a key tuple, with the quoting and escapes it may hold.
fn key() -> impl Strategy<Value = String> {
    let op = mostly(
        &[
            "'trtllm::fused_moe::gemm1'",
            "'trtllm::gemm'",
            r#""it's""#,
            r"'a\'b'",
            r"'\x41\u00e9\U0001F600'",
        ],
        &[r"'\ud800'", r"'\q'", "''", "'unterminated", r"'trailing\"],
    );
    let rest = mostly(
        &[
            ", 'MoERunner', (1, 4096), 0",
            "",
            ",",
            ", 0x1_0, -1.5e3, None, (), [1], {'a': b'x'}",
        ],
        &[" x", ", (1,", "))"],
    );
    prop_oneof![
        20 => (op, rest).prop_map(|(op, rest)| format!("({op}{rest})")),
        1 => "[ -~]{0,12}",
    ]
    // A Python repr is a JSON string here: escape it as json.dump would.
    .prop_map(|key| serde_json::to_string(&key).expect("a string is JSON"))
}

fn min_time() -> impl Strategy<Value = String> {
    prop_oneof![
        mostly(
            &[
                "0.0123",
                "1e-3",
                "1E+2",
                "0",
                "-0.0",
                "5e-324",
                "1e-320",
                "0.30000000000000004",
                "123456789012345678901234567890",
            ],
            &[
                "-1",
                "1e308",
                "Infinity",
                "-Infinity",
                "NaN",
                r#""0.1""#,
                "null"
            ],
        ),
        (0.0f64..100.0).prop_map(|ms| format!("{ms}")),
        any::<u64>().prop_map(|bits| format!("{:?}", f64::from_bits(bits))),
    ]
}

fn entry_value() -> impl Strategy<Value = String> {
    let runner_id = mostly(
        &["0", "3", "9223372036854775807"],
        &["-1", "1.5", r#""0""#, "9223372036854775808", "true"],
    );
    // TensorRT-LLM writes repr(tactic) as a string; anything else its loader cannot read.
    let tactic = mostly(
        &[
            r#""7""#,
            r#""'tile_128x128'""#,
            r#""(128, 128, 64)""#,
            r#""{'stages': 3, 'split_k': True}""#,
        ],
        &[
            r#""<tactic 7>""#,
            "7",
            r#"{"tile": [128, 128], "s": "\u0000"}"#,
            "[]",
            "null",
            "-0.0",
            "1e-7",
        ],
    );
    prop_oneof![
        20 => (runner_id, tactic, min_time(), 0usize..12).prop_map(|(runner_id, tactic, min_time, shape)| {
            match shape {
                // A field missing, repeated, or in another order.
                0 => format!(r#"{{"runner_id": {runner_id}, "tactic": {tactic}}}"#),
                1 => format!(r#"{{"min_time": 1, "runner_id": {runner_id}, "tactic": {tactic}, "min_time": {min_time}}}"#),
                2 => format!(r#"{{"tactic": {tactic}, "min_time": {min_time}, "runner_id": {runner_id}, "extra": true}}"#),
                _ => format!(r#"{{"runner_id": {runner_id}, "tactic": {tactic}, "min_time": {min_time}}}"#),
            }
        }),
        1 => pick(&["[]", "1", r#""x""#, "null"]),
    ]
}

fn section() -> impl Strategy<Value = String> {
    let name = mostly(
        &["shared", "rank_0", "rank_1", "rank_7", "rank_4294967295"],
        &["rank_01", "rank_", "rank_4294967296", "other"],
    );
    let body = prop_oneof![
        9 => prop::collection::vec((key(), entry_value()), 0..5).prop_map(|members| {
            let members: Vec<String> =
                members.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("{{{}}}", members.join(", "))
        }),
        1 => pick(&["[]", "null", "3"]),
    ];
    (name, body).prop_map(|(name, body)| format!(r#""{name}": {body}"#))
}

fn document() -> impl Strategy<Value = String> {
    (
        prop::option::weighted(0.9, metadata()),
        prop::collection::vec(section(), 0..5),
        prop::bool::ANY,
    )
        .prop_map(|(metadata, sections, indented)| {
            let mut members = Vec::new();
            if let Some(metadata) = metadata {
                members.push(format!(r#""metadata": {metadata}"#));
            }
            members.extend(sections);
            let separator = if indented { ",\n  " } else { "," };
            format!("{{{}}}", members.join(separator))
        })
}

/// What import must never produce: an entry the daemon would refuse.
fn check_entry(entry: &Entry) -> Result<(), TestCaseError> {
    let key = entry.key.as_ref().expect("import sets the key");
    let result = entry.result.as_ref().expect("import sets the result");
    prop_assert_eq!(&key.namespace, NAMESPACE);
    prop_assert!(!key.op.is_empty());
    prop_assert!(
        result.time_us.is_finite() && result.time_us >= 0.0,
        "{result:?}"
    );
    prop_assert!(serde_json::from_str::<serde_json::Value>(&result.config).is_ok());
    Ok(())
}

/// The parts of an entry a round trip must keep. The config is compared as a JSON value, and
/// so is the metadata text inside it: export writes both the way Python's `json.dump` does
/// (indented, non-ASCII as `\u` escapes), so only their spelling may change.
fn comparable(entry: &Entry) -> impl PartialEq + std::fmt::Debug {
    let key = entry.key.clone().expect("key");
    let result = entry.result.clone().expect("result");
    let mut config: serde_json::Value = serde_json::from_str(&result.config).expect("JSON config");
    if let Some(metadata) = config.get_mut("trtllm_metadata_json") {
        let text = metadata.as_str().expect("metadata is stored as text");
        *metadata = serde_json::from_str(text).expect("stored metadata is JSON");
    }
    (
        key,
        config,
        result.time_us.to_bits(),
        result.tuned_by,
        result.tuned_at_unix_ms,
    )
}

/// Checks the properties on what `text` imports to; `Ok(false)` when it does not import.
fn check_import(text: &str) -> Result<bool, TestCaseError> {
    let Ok(imported) = import(text) else {
        return Ok(false);
    };
    for entry in &imported.entries {
        check_entry(entry)?;
    }
    let metadata = imported
        .metadata
        .expect("import without a device needs metadata");
    let first = export(&imported.entries, &metadata, &ExportOptions::default())
        .expect("exporting what was imported");
    // One rule both ways: what import accepted, export writes.
    prop_assert!(first.skipped.is_empty(), "{:?}", first.skipped);
    prop_assert_eq!(first.exported, imported.entries.len());
    let exported: Vec<&Entry> = imported.entries.iter().collect();

    let again = import(&first.json_text).expect("an export imports");
    prop_assert!(again.skipped.is_empty(), "{:?}", again.skipped);
    let before: Vec<_> = exported.into_iter().map(comparable).collect();
    let after: Vec<_> = again.entries.iter().map(comparable).collect();
    prop_assert_eq!(before, after);

    let metadata = again.metadata.expect("an export has metadata");
    let second = export(&again.entries, &metadata, &ExportOptions::default())
        .expect("exporting the re-import");
    prop_assert!(second.skipped.is_empty(), "{:?}", second.skipped);
    prop_assert_eq!(&first.json_text, &second.json_text);
    Ok(true)
}

/// Documents made the way TensorRT-LLM writes them import and round-trip; and most of them
/// import (an entry TensorRT-LLM's loader would reject is skipped, not the document), so an
/// importer that refused every document cannot pass.
#[test]
fn trtllm_documents_import_to_valid_entries_and_round_trip() {
    let (cases, imported) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::default());
    let outcome = runner.run(&document(), |text| {
        cases.fetch_add(1, Ordering::Relaxed);
        if check_import(&text)? {
            imported.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let (cases, imported) = (cases.into_inner(), imported.into_inner());
    assert!(
        imported * 2 >= cases,
        "only {imported} of {cases} generated documents imported"
    );
}

proptest! {

    #[test]
    fn damaged_trtllm_documents_never_panic(
        text in document(),
        cut in any::<prop::sample::Index>(),
        insert in pick(&["{", "}", "\"", ",", "\\", "NaN", ":", "\u{0}", "]"]),
    ) {
        let mut bytes = text.into_bytes();
        let at = cut.index(bytes.len() + 1);
        let truncated = String::from_utf8_lossy(&bytes[..at]).into_owned();
        check_import(&truncated)?;
        bytes.splice(at..at, insert.bytes());
        check_import(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn trtllm_parser_survives_token_soup(
        text in r#"(\{|\}|\[|\]|:|,|"metadata"|"shared"|"rank_0"|"device_name"|"device_capability"|"runner_id"|"tactic"|"min_time"|"\('op', 1\)"|"NVIDIA"|[0-9.eE+-]{1,4}|NaN|-?Infinity|null|"[^"\\]{0,4}"| ){0,48}"#
    ) {
        check_import(&text)?;
    }

    #[test]
    fn trtllm_parser_survives_any_text(text in "\\PC{0,200}") {
        check_import(&text)?;
    }
}
