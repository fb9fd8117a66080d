//! Import: the text of a cache file to tunecache entries ([`import`], [`import_with`]), one entry
//! per key of each `shared` and `rank_<N>` section, each mapped by
//! [`entry_from_file`](crate::entry_from_file) (the rule the drop-in and export share), with what
//! could not be mapped listed as skipped.

use serde_json::value::RawValue;
use tunecache_proto::v1::Entry;

use crate::entry::{entry_from_file, EntryContext};
use crate::format::{section_rank, SkippedEntry, METADATA_SECTION};
use crate::pyjson::{keep_last_duplicate, quote_python_nonfinite_literals};
use crate::rawjson::{json_kind, OrderedRawObject};
use crate::{TrtllmError, TrtllmMetadata};

/// `Result.tuned_by` of imported entries.
const IMPORTED_BY: &str = "trtllm cache import";

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// `Key.device` for every entry instead of the fingerprint built from the metadata; needed for
    /// a file without metadata, or to file the entries under the daemon's own fingerprint (which
    /// also names the CUDA version, which the file does not record).
    pub device: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ImportOutcome {
    /// In file order: sections, then keys within each section.
    pub entries: Vec<Entry>,
    /// `None` only when the file had no metadata and [`ImportOptions::device`] was given.
    pub metadata: Option<TrtllmMetadata>,
    pub skipped: Vec<SkippedEntry>,
}

/// Reads a TensorRT-LLM cache file. Entries that cannot be mapped are skipped and listed with the
/// reason; only a file that is not a JSON object, or has no usable metadata, is an error.
pub fn import(json_text: &str) -> Result<ImportOutcome, TrtllmError> {
    import_with(json_text, &ImportOptions::default())
}

/// [`import`] with options (an explicit device fingerprint).
pub fn import_with(json_text: &str, options: &ImportOptions) -> Result<ImportOutcome, TrtllmError> {
    // Python's json.dump writes an infinite min_time as a bare `Infinity`, which is not JSON;
    // quoting it lets the rest of the file load and that entry be skipped with a reason.
    let json_text = quote_python_nonfinite_literals(json_text);
    let document: &RawValue = serde_json::from_str(&json_text).map_err(TrtllmError::NotJson)?;
    if !document.get().starts_with('{') {
        return Err(TrtllmError::NotAnObject {
            found: json_kind(document.get()),
        });
    }
    let sections = keep_last_duplicate(
        serde_json::from_str::<OrderedRawObject>(document.get())
            .map_err(TrtllmError::NotJson)?
            .0,
    );

    let metadata = match sections
        .kept
        .iter()
        .find(|(name, _)| name == METADATA_SECTION)
    {
        Some((_, raw)) => Some(TrtllmMetadata::from_json(raw.get())?),
        None => None,
    };
    let device = match (&options.device, &metadata) {
        (Some(device), _) => device.clone(),
        (None, Some(metadata)) => metadata.device_fingerprint(),
        (None, None) => return Err(TrtllmError::MissingMetadata),
    };
    let context = EntryContext {
        device: &device,
        metadata_json: metadata.as_ref().map(|metadata| metadata.raw_json()),
        tuned_by: IMPORTED_BY,
        tuned_at_unix_ms: metadata
            .as_ref()
            .and_then(|metadata| metadata.creation_unix_ms)
            .unwrap_or(0),
    };

    let mut skipped: Vec<SkippedEntry> = sections
        .dropped
        .into_iter()
        .map(|section| SkippedEntry {
            section,
            key: String::new(),
            reason: "duplicate section; the last one wins, as with Python's json.load".to_owned(),
        })
        .collect();
    let mut entries = Vec::new();
    for (section, raw_section) in &sections.kept {
        if section == METADATA_SECTION {
            continue;
        }
        let Some(rank) = section_rank(section) else {
            skipped.push(SkippedEntry {
                section: section.clone(),
                key: String::new(),
                reason: "unknown section; expected \"metadata\", \"shared\" or \"rank_<N>\""
                    .to_owned(),
            });
            continue;
        };
        let section_entries = match serde_json::from_str::<OrderedRawObject>(raw_section.get()) {
            Ok(object) => keep_last_duplicate(object.0),
            Err(_) => {
                skipped.push(SkippedEntry {
                    section: section.clone(),
                    key: String::new(),
                    reason: format!(
                        "section is a JSON {}, not an object",
                        json_kind(raw_section.get())
                    ),
                });
                continue;
            }
        };
        skipped.extend(section_entries.dropped.into_iter().map(|key| SkippedEntry {
            section: section.clone(),
            key,
            reason: "duplicate key; the last one wins, as with Python's json.load".to_owned(),
        }));
        for (key, raw_value) in &section_entries.kept {
            match entry_from_file(key, raw_value.get(), rank.0, &context) {
                Ok(entry) => entries.push(entry),
                Err(reason) => skipped.push(SkippedEntry {
                    section: section.clone(),
                    key: key.clone(),
                    reason,
                }),
            }
        }
    }
    Ok(ImportOutcome {
        entries,
        metadata,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{entry_for, PYTHON_WRITTEN_FILE};

    #[test]
    fn import_maps_every_entry() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        assert!(outcome.skipped.is_empty(), "{:?}", outcome.skipped);
        assert_eq!(outcome.entries.len(), 5);
        let metadata = outcome.metadata.expect("metadata");
        assert_eq!(
            metadata.device_fingerprint(),
            "NVIDIA H200|sm_90|trtllm 1.1.0rc2"
        );
        assert_eq!(metadata.creation_unix_ms, Some(1_718_000_000_123));

        let gemm = entry_for(
            &outcome.entries,
            "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)",
            Some(0),
        );
        let key = gemm.key.as_ref().expect("key");
        assert_eq!(key.namespace, "trtllm");
        assert_eq!(key.op, "trtllm::fused_moe::gemm1");
        assert_eq!(key.device, "NVIDIA H200|sm_90|trtllm 1.1.0rc2");
        let result = gemm.result.as_ref().expect("result");
        assert_eq!(result.time_us, 100.0);
        assert_eq!(result.tuned_at_unix_ms, 1_718_000_000_123);
        let config: serde_json::Value = serde_json::from_str(&result.config).expect("config json");
        assert_eq!(config["runner_id"], 0);
        assert_eq!(config["tactic"], "(128, 'tile \"(a)\"', ('x', 2))");
        assert_eq!(config["min_time_text"], "0.1");
        let stored_metadata: serde_json::Value = serde_json::from_str(
            config["trtllm_metadata_json"]
                .as_str()
                .expect("metadata text"),
        )
        .expect("metadata json");
        assert_eq!(stored_metadata["device_name"], "NVIDIA H200");

        let shared = entry_for(&outcome.entries, "(\"it's::op\", 'R', ())", None);
        assert_eq!(shared.key.as_ref().expect("key").op, "it's::op");
        let milli = entry_for(
            &outcome.entries,
            "('trtllm::fp8_gemm', 'Fp8Runner', '-123', ((8, 4096), (4096, 4096)))",
            Some(0),
        );
        assert_eq!(milli.result.as_ref().expect("result").time_us, 1.0);
        let unicode = entry_for(&outcome.entries, "('caf\u{e9}::op',)", Some(1));
        assert_eq!(unicode.key.as_ref().expect("key").op, "caf\u{e9}::op");
    }

    #[test]
    fn bad_entries_are_skipped_and_counted() {
        let file = r#"{
          "metadata": {"lib_version": "x", "creation_timestamp": 1.0,
                       "device_name": "NVIDIA A100-SXM4-80GB", "device_capability": [8, 0]},
          "rank_0": {
            "('good::op', 1)": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "not a tuple": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "(42, 'op')": {"runner_id": 0, "tactic": "1", "min_time": 0.5},
            "('no_runner',)": {"tactic": "1", "min_time": 0.5},
            "('float_runner',)": {"runner_id": 0.5, "tactic": "1", "min_time": 0.5},
            "('no_tactic',)": {"runner_id": 0, "min_time": 0.5},
            "('string_time',)": {"runner_id": 0, "tactic": "1", "min_time": "0.5"},
            "('negative_time',)": {"runner_id": 0, "tactic": "1", "min_time": -0.5},
            "('infinite_time',)": {"runner_id": 0, "tactic": "-1", "min_time": Infinity},
            "('not_object',)": [0, "1", 0.5],
            "('dup::op',)": {"runner_id": 0, "tactic": "1", "min_time": 9.0},
            "('dup::op',)": {"runner_id": 1, "tactic": "2", "min_time": 3.0}
          },
          "rank_x": {},
          "rank_07": {},
          "shared": "not an object"
        }"#;
        let outcome = import(file).expect("import");
        let mut skipped_keys: Vec<&str> = outcome
            .skipped
            .iter()
            .map(|skipped| {
                if skipped.key.is_empty() {
                    skipped.section.as_str()
                } else {
                    skipped.key.as_str()
                }
            })
            .collect();
        skipped_keys.sort_unstable();
        assert_eq!(
            skipped_keys,
            vec![
                "('dup::op',)",
                "('float_runner',)",
                "('infinite_time',)",
                "('negative_time',)",
                "('no_runner',)",
                "('no_tactic',)",
                "('not_object',)",
                "('string_time',)",
                "(42, 'op')",
                "not a tuple",
                "rank_07",
                "rank_x",
                "shared",
            ],
            "{:#?}",
            outcome.skipped
        );
        assert!(outcome
            .skipped
            .iter()
            .all(|skipped| !skipped.reason.is_empty()));
        let infinite = outcome
            .skipped
            .iter()
            .find(|skipped| skipped.key == "('infinite_time',)")
            .expect("infinite");
        assert!(infinite.reason.contains("Infinity"), "{}", infinite.reason);

        assert_eq!(outcome.entries.len(), 2);
        let dup = entry_for(&outcome.entries, "('dup::op',)", Some(0));
        assert_eq!(dup.result.as_ref().expect("result").time_us, 3000.0);
        let good = entry_for(&outcome.entries, "('good::op', 1)", Some(0));
        assert_eq!(
            good.key.as_ref().expect("key").device,
            "NVIDIA A100-SXM4-80GB|sm_80|trtllm x"
        );
    }

    #[test]
    fn file_that_is_not_a_json_object_is_an_error() {
        assert!(matches!(
            import("{\"metadata\": "),
            Err(TrtllmError::NotJson(_))
        ));
        assert!(matches!(
            import("not json at all"),
            Err(TrtllmError::NotJson(_))
        ));
        assert!(matches!(import(""), Err(TrtllmError::NotJson(_))));
        assert!(matches!(
            import("[1, 2]"),
            Err(TrtllmError::NotAnObject { found: "array" })
        ));
        assert!(matches!(
            import("\"text\""),
            Err(TrtllmError::NotAnObject { found: "string" })
        ));
        let message = import("[]").map(|_| ()).expect_err("array").to_string();
        assert!(message.contains("not an object"), "{message}");
    }

    #[test]
    fn metadata_is_required_unless_a_device_is_given() {
        let file = r#"{"rank_0": {"('op',)": {"runner_id": 0, "tactic": "1", "min_time": 1}}}"#;
        assert!(matches!(import(file), Err(TrtllmError::MissingMetadata)));
        let options = ImportOptions {
            device: Some("NVIDIA H200|sm_90|cuda 12.8".to_owned()),
        };
        let outcome = import_with(file, &options).expect("import with device");
        assert!(outcome.metadata.is_none());
        assert_eq!(
            outcome.entries[0].key.as_ref().expect("key").device,
            "NVIDIA H200|sm_90|cuda 12.8"
        );
        let bad_metadata = r#"{"metadata": {"device_name": "X"}}"#;
        assert!(matches!(
            import(bad_metadata),
            Err(TrtllmError::BadMetadata(_))
        ));
    }
}
