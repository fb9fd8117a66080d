//! Export: tunecache entries to the text of a cache file ([`export`]), laid out as Python's
//! `json.dump(..., indent=2)` lays it out, each entry's value from
//! [`file_value_of`](crate::file_value_of) (the rule import and the drop-in share), so that every
//! entry TensorRT-LLM's loader could not read back is left out with the reason; and the merge with the file being replaced
//! ([`merge_file_entries`]), which keeps what ranks saved there that the cache lacks.

use std::collections::{HashMap, HashSet};

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use tunecache_proto::v1::{Entry, Key, Result as TuneResult};

use crate::entry::{file_value_of, FileValue};
use crate::format::{
    SkippedEntry, METADATA_SECTION, NAMESPACE, RANK_SECTION_PREFIX, SHARED_SECTION,
};
use crate::pyjson::python_indent_2;
use crate::{ImportOutcome, TrtllmError, TrtllmMetadata};

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Ranks whose `rank_<N>` section is written even when no entry belongs to it: TensorRT-LLM's
    /// `load_cache` fails for a rank whose section is missing.
    pub empty_rank_sections: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct ExportOutcome {
    /// The file text, formatted as Python's `json.dump(..., indent=2)` formats it.
    pub json_text: String,
    pub exported: usize,
    pub skipped: Vec<SkippedEntry>,
}

/// Writes `trtllm` entries as a TensorRT-LLM cache file. Sections come in the order their first
/// entry appears (after `metadata`), keys in entry order; two entries for the same section and
/// key (e.g. from two device fingerprints) keep the lower `time_us`, the cache's merge rule.
/// Entries of other namespaces, or whose config this module cannot read, are skipped and listed.
pub fn export(
    entries: &[Entry],
    metadata: &TrtllmMetadata,
    options: &ExportOptions,
) -> Result<ExportOutcome, TrtllmError> {
    let mut sections: Vec<(String, Vec<ExportedEntry>)> = Vec::new();
    let mut section_index: HashMap<String, usize> = HashMap::new();
    let mut entry_index: HashMap<(usize, String), usize> = HashMap::new();
    let mut skipped = Vec::new();

    for entry in entries {
        let (key, result) = match (&entry.key, &entry.result) {
            (Some(key), Some(result)) => (key, result),
            _ => {
                skipped.push(SkippedEntry {
                    section: String::new(),
                    key: entry
                        .key
                        .as_ref()
                        .map(|key| key.problem.clone())
                        .unwrap_or_default(),
                    reason: "entry has no key or no result".to_owned(),
                });
                continue;
            }
        };
        let section = match key.rank {
            Some(rank) => format!("{RANK_SECTION_PREFIX}{rank}"),
            None => SHARED_SECTION.to_owned(),
        };
        let exported = if key.namespace != NAMESPACE {
            Err(format!(
                "namespace {:?} is not {NAMESPACE:?}",
                key.namespace
            ))
        } else {
            exported_entry(key, result)
        };
        let exported = match exported {
            Ok(exported) => exported,
            Err(reason) => {
                skipped.push(SkippedEntry {
                    section,
                    key: key.problem.clone(),
                    reason,
                });
                continue;
            }
        };
        let section_position = *section_index.entry(section.clone()).or_insert_with(|| {
            sections.push((section.clone(), Vec::new()));
            sections.len() - 1
        });
        let section_entries = &mut sections[section_position].1;
        match entry_index.get(&(section_position, key.problem.clone())) {
            Some(&existing) => {
                let loser = if exported.time_us < section_entries[existing].time_us {
                    std::mem::replace(&mut section_entries[existing], exported)
                } else {
                    exported
                };
                skipped.push(SkippedEntry {
                    section,
                    key: key.problem.clone(),
                    reason: format!(
                        "another entry for this key has a lower time_us than {} (device {:?})",
                        loser.time_us, loser.device
                    ),
                });
            }
            None => {
                entry_index.insert(
                    (section_position, key.problem.clone()),
                    section_entries.len(),
                );
                section_entries.push(exported);
            }
        }
    }
    for rank in &options.empty_rank_sections {
        let section = format!("{RANK_SECTION_PREFIX}{rank}");
        if !section_index.contains_key(&section) {
            section_index.insert(section.clone(), sections.len());
            sections.push((section, Vec::new()));
        }
    }

    let metadata_json =
        RawValue::from_string(metadata.raw_json().to_owned()).map_err(TrtllmError::Serialize)?;
    let exported = sections.iter().map(|(_, entries)| entries.len()).sum();
    let compact = serde_json::to_string(&DocumentOut {
        metadata: &metadata_json,
        sections: &sections,
    })
    .map_err(TrtllmError::Serialize)?;
    Ok(ExportOutcome {
        json_text: python_indent_2(&compact),
        exported,
        skipped,
    })
}

/// One key of the exported file, with what deduplication needs.
struct ExportedEntry {
    problem: String,
    device: String,
    time_us: f64,
    runner_id: Box<RawValue>,
    tactic: Box<RawValue>,
    min_time: Box<RawValue>,
}

fn exported_entry(key: &Key, result: &TuneResult) -> Result<ExportedEntry, String> {
    let FileValue {
        runner_id,
        tactic,
        min_time,
    } = file_value_of(key, result)?;
    Ok(ExportedEntry {
        problem: key.problem.clone(),
        device: key.device.clone(),
        time_us: result.time_us,
        runner_id,
        tactic,
        min_time,
    })
}

struct DocumentOut<'a> {
    metadata: &'a RawValue,
    sections: &'a [(String, Vec<ExportedEntry>)],
}

impl Serialize for DocumentOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.sections.len() + 1))?;
        map.serialize_entry(METADATA_SECTION, self.metadata)?;
        for (section, entries) in self.sections {
            map.serialize_entry(section, &SectionOut(entries))?;
        }
        map.end()
    }
}

struct SectionOut<'a>(&'a [ExportedEntry]);

impl Serialize for SectionOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct EntryOut<'a> {
            runner_id: &'a RawValue,
            tactic: &'a RawValue,
            min_time: &'a RawValue,
        }
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for entry in self.0 {
            map.serialize_entry(
                &entry.problem,
                &EntryOut {
                    runner_id: &entry.runner_id,
                    tactic: &entry.tactic,
                    min_time: &entry.min_time,
                },
            )?;
        }
        map.end()
    }
}

/// What [`merge_file_entries`] did with the entries of the file about to be replaced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileMerge {
    /// The file's entries that the cache lacked, now added to the export.
    pub kept_from_file: usize,
    /// The file's device, when it is not the export's: then none of its entries are kept and the
    /// file is replaced whole.
    pub replaced_device: Option<String>,
}

/// Adds to `entries` the entries of `existing` (the file about to be replaced, as imported) whose
/// rank and key none of `entries` has, so that what ranks saved since the cache last saw the file
/// survives the export; the cache's entries win otherwise. Only a file of `export_device` (its
/// metadata's fingerprint) is merged; another device's file is replaced, and its device returned.
/// Run it, the export and [`write_atomically`](crate::write_atomically) under the
/// [`WriterLock`](crate::WriterLock).
pub fn merge_file_entries(
    entries: &mut Vec<Entry>,
    existing: ImportOutcome,
    export_device: &str,
) -> FileMerge {
    let file_device = existing
        .metadata
        .as_ref()
        .map(TrtllmMetadata::device_fingerprint);
    if file_device.as_deref() != Some(export_device) {
        return FileMerge {
            kept_from_file: 0,
            replaced_device: file_device,
        };
    }
    let held: HashSet<(Option<u32>, String)> = entries
        .iter()
        .filter_map(|entry| entry.key.as_ref())
        .map(|key| (key.rank, key.problem.clone()))
        .collect();
    let mut kept_from_file = 0;
    for entry in existing.entries {
        let Some(key) = entry.key.as_ref() else {
            continue;
        };
        if !held.contains(&(key.rank, key.problem.clone())) {
            kept_from_file += 1;
            entries.push(entry);
        }
    }
    FileMerge {
        kept_from_file,
        replaced_device: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import;
    use crate::test_support::{native_entry, PYTHON_WRITTEN_FILE};

    #[test]
    fn export_of_import_gives_back_the_same_bytes() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        let metadata = outcome.metadata.expect("metadata");
        let options = ExportOptions {
            empty_rank_sections: vec![2],
        };
        let exported = export(&outcome.entries, &metadata, &options).expect("export");
        assert!(exported.skipped.is_empty(), "{:?}", exported.skipped);
        assert_eq!(exported.exported, 5);
        assert_eq!(exported.json_text, PYTHON_WRITTEN_FILE);
    }

    /// The daemon may store a config re-serialized through a plain JSON value, which sorts keys
    /// and re-formats numbers; the export must still restore the file's exact values.
    #[test]
    fn export_restores_exact_values_after_config_is_reserialized() {
        let outcome = import(PYTHON_WRITTEN_FILE).expect("import");
        let mut stored = outcome.entries.clone();
        for entry in &mut stored {
            let result = entry.result.as_mut().expect("result");
            let value: serde_json::Value = serde_json::from_str(&result.config).expect("json");
            result.config = value.to_string();
        }
        let metadata = TrtllmMetadata::from_entries(&stored).expect("metadata in configs");
        assert_eq!(
            metadata.device_fingerprint(),
            "NVIDIA H200|sm_90|trtllm 1.1.0rc2"
        );
        let exported = export(
            &stored,
            &metadata,
            &ExportOptions {
                empty_rank_sections: vec![2],
            },
        )
        .expect("export");
        let reimported = import(&exported.json_text).expect("reimport");
        assert_eq!(reimported.entries.len(), 5);
        assert!(exported.json_text.contains("\"min_time\": 1e-3"));
        assert!(exported
            .json_text
            .contains("\"min_time\": 12.345678901234567"));
        assert!(exported.json_text.contains("\"min_time\": 2.5e-05"));
        assert!(exported
            .json_text
            .contains("\"creation_timestamp\": 1718000000.1234567"));
    }

    #[test]
    fn export_skips_foreign_entries_and_keeps_the_fastest_duplicate() {
        let entries = vec![
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                "GPU|sm_90|cuda 12.8",
                r#"{"runner_id": 1, "tactic": "5"}"#,
                250.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                "GPU|sm_90",
                r#"{"runner_id": 0, "tactic": "7"}"#,
                100.0,
            ),
            native_entry(
                "bitblas",
                "('trtllm::op', 2)",
                "GPU|sm_90",
                r#"{"runner_id": 0, "tactic": "7"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 3)",
                "GPU|sm_90",
                r#"{"block": 128}"#,
                1.0,
            ),
        ];
        let metadata = TrtllmMetadata::for_device("GPU|sm_90|cuda 12.8").expect("metadata");
        assert_eq!(metadata.device_capability, (9, 0));
        assert!(TrtllmMetadata::from_entries(&entries).is_none());
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert_eq!(exported.exported, 1);
        assert_eq!(exported.skipped.len(), 3, "{:?}", exported.skipped);
        let file: serde_json::Value = serde_json::from_str(&exported.json_text).expect("json");
        let winner = &file["rank_0"]["('trtllm::op', 1)"];
        assert_eq!(winner["runner_id"], 0);
        assert_eq!(winner["tactic"], "7");
        // No min_time in a natively recorded config: time_us / 1000.
        assert_eq!(winner["min_time"], 0.1);
        assert_eq!(file["metadata"]["device_name"], "GPU");
        assert_eq!(
            file["metadata"]["device_capability"],
            serde_json::json!([9, 0])
        );
        assert!(file["metadata"]["lib_version"].is_string());
        assert!(file["metadata"]["creation_timestamp"].is_f64());
    }

    /// Each of these once reached the file and broke TensorRT-LLM's loader at start-up.
    #[test]
    fn export_skips_entries_the_loader_cannot_read_back() {
        let device = "GPU|sm_90|trtllm 1.0";
        let entries = vec![
            native_entry(
                "trtllm",
                "('trtllm::op', 1)",
                device,
                r#"{"runner_id": 0, "tactic": [1, 2]}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 2)",
                device,
                r#"{"runner_id": 0, "tactic": {"a": 1}}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "42",
                device,
                r#"{"runner_id": 0, "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 3)",
                device,
                r#"{"runner_id": 0, "tactic": 7}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 4)",
                device,
                r#"{"runner_id": 0, "tactic": "Tactic(3)"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 5",
                device,
                r#"{"runner_id": 0, "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 6)",
                device,
                r#"{"runner_id": "0", "tactic": "1"}"#,
                1.0,
            ),
            native_entry(
                "trtllm",
                "('trtllm::op', 7)",
                device,
                r#"{"runner_id": 0, "tactic": "{'tile': (64, 128)}"}"#,
                1.0,
            ),
        ];
        let metadata = TrtllmMetadata::for_device(device).expect("metadata");
        assert_eq!(metadata.device_fingerprint(), device);
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert_eq!(exported.exported, 1, "{:#?}", exported.skipped);
        let reasons: Vec<(&str, &str)> = exported
            .skipped
            .iter()
            .map(|skipped| (skipped.key.as_str(), skipped.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 7, "{reasons:#?}");
        for (key, expected) in [
            ("('trtllm::op', 1)", "JSON array"),
            ("('trtllm::op', 2)", "JSON object"),
            ("42", "not a Python tuple"),
            ("('trtllm::op', 3)", "JSON number"),
            ("('trtllm::op', 4)", "not a Python literal"),
            ("('trtllm::op', 5", "key is not a Python literal"),
            ("('trtllm::op', 6)", "runner_id"),
        ] {
            let reason = reasons
                .iter()
                .find(|(skipped_key, _)| *skipped_key == key)
                .map(|(_, reason)| *reason)
                .unwrap_or_else(|| panic!("{key} not skipped: {reasons:#?}"));
            assert!(reason.contains(expected), "{key}: {reason}");
        }
        let file: serde_json::Value = serde_json::from_str(&exported.json_text).expect("json");
        assert_eq!(
            file["rank_0"]["('trtllm::op', 7)"]["tactic"],
            "{'tile': (64, 128)}"
        );
        assert_eq!(file["metadata"]["lib_version"], "1.0");
    }

    #[test]
    fn non_ascii_keys_are_written_as_python_escapes() {
        let entries = vec![native_entry(
            "trtllm",
            "('caf\u{e9}::op', '\u{1f600}')",
            "GPU|sm_90",
            r#"{"runner_id": 0, "tactic": "1", "min_time": 0.5}"#,
            500.0,
        )];
        let metadata = TrtllmMetadata::for_device("GPU|sm_90").expect("metadata");
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        assert!(
            exported
                .json_text
                .contains(r#""('caf\u00e9::op', '\ud83d\ude00')": {"#),
            "{}",
            exported.json_text
        );
        let reimported = import(&exported.json_text).expect("reimport");
        assert_eq!(
            reimported.entries[0].key.as_ref().expect("key").problem,
            "('caf\u{e9}::op', '\u{1f600}')"
        );
    }

    fn imported_file(device: &str, keys: &[&str]) -> ImportOutcome {
        let entries: Vec<Entry> = keys
            .iter()
            .map(|key| {
                native_entry(
                    "trtllm",
                    key,
                    device,
                    r#"{"runner_id": 0, "tactic": "1"}"#,
                    1.0,
                )
            })
            .collect();
        let metadata = TrtllmMetadata::for_device(device).expect("metadata");
        let exported = export(&entries, &metadata, &ExportOptions::default()).expect("export");
        import(&exported.json_text).expect("import")
    }

    #[test]
    fn merge_keeps_the_file_entries_the_cache_lacks() {
        let device = "GPU|sm_90|trtllm 1.0";
        let existing = imported_file(device, &["('trtllm::op', 1)", "('trtllm::op', 2)"]);
        let mut entries = vec![native_entry(
            "trtllm",
            "('trtllm::op', 1)",
            device,
            r#"{"runner_id": 3, "tactic": "9"}"#,
            5.0,
        )];
        let merge = merge_file_entries(&mut entries, existing, device);
        assert_eq!(
            merge,
            FileMerge {
                kept_from_file: 1,
                replaced_device: None
            }
        );
        let problems: Vec<&str> = entries
            .iter()
            .map(|entry| entry.key.as_ref().expect("key").problem.as_str())
            .collect();
        assert_eq!(problems, ["('trtllm::op', 1)", "('trtllm::op', 2)"]);
        // The cache's entry for a key both hold wins.
        assert!(entries[0]
            .result
            .as_ref()
            .expect("result")
            .config
            .contains("\"runner_id\": 3"));
    }

    #[test]
    fn merge_replaces_another_devices_file() {
        let existing = imported_file("GPU|sm_80|trtllm 1.0", &["('trtllm::op', 2)"]);
        let mut entries = Vec::new();
        let merge = merge_file_entries(&mut entries, existing, "GPU|sm_90|trtllm 1.0");
        assert_eq!(
            merge,
            FileMerge {
                kept_from_file: 0,
                replaced_device: Some("GPU|sm_80|trtllm 1.0".to_owned())
            }
        );
        assert!(entries.is_empty());
    }
}
