//! The TensorRT-LLM entry mapping of `tunecache-trtllm` for the Python drop-in
//! (`tunecache.integrations.trtllm`), so that the drop-in, the CLI's import and its export accept
//! and refuse the same entries by one implementation (`tunecache_trtllm::entry`). The drop-in
//! hands over what TensorRT-LLM's writer would put in a file (the metadata, each key's `str()` and
//! the value's `json.dumps`) and gets entries to Record; for a load it hands over the Scan's
//! entries and gets, per entry, the value text TensorRT-LLM's loader would read from a file.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use tunecache_trtllm::{entry_from_file, file_value_of, EntryContext, TrtllmMetadata};

use crate::entry::Entry;

/// `(key_text, reason)` of each item or entry the mapping refused.
type Refused = Vec<(String, String)>;
/// `(problem, rank, value_json)` of each entry a file would hold.
type FileValues = Vec<(String, Option<u32>, String)>;

fn metadata(metadata_json: &str) -> PyResult<TrtllmMetadata> {
    TrtllmMetadata::from_json(metadata_json)
        .map_err(|error| PyValueError::new_err(format!("tunecache: {error}")))
}

/// `Key.device` of a cache whose metadata object is `metadata_json` (TensorRT-LLM's
/// `_serialize_metadata`, as JSON): `<device_name>|sm_<major><minor>|trtllm <lib_version>`.
/// Raises ValueError for metadata without a usable device.
#[pyfunction]
pub fn trtllm_device(metadata_json: &str) -> PyResult<String> {
    Ok(metadata(metadata_json)?.device_fingerprint())
}

/// The entries to Record for `items`, each `(key_text, value_json, rank)`: `str(key)`, the
/// value `{"runner_id", "tactic": repr(tactic), "min_time"}` as `json.dumps(..., default=str)`
/// writes it, and the section's rank (None: shared). Answers `(entries, refused)`, refused being
/// `(key_text, reason)` for each item the mapping does not accept.
#[pyfunction]
pub fn trtllm_entries<'py>(
    py: Python<'py>,
    metadata_json: &str,
    items: Vec<(String, String, Option<u32>)>,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> PyResult<(Bound<'py, PyList>, Refused)> {
    let metadata = metadata(metadata_json)?;
    let device = metadata.device_fingerprint();
    let context = EntryContext {
        device: &device,
        metadata_json: Some(metadata.raw_json()),
        tuned_by,
        tuned_at_unix_ms,
    };
    let mut entries = Vec::with_capacity(items.len());
    let mut refused = Vec::new();
    for (key, value_json, rank) in items {
        match entry_from_file(&key, &value_json, rank, &context) {
            Ok(entry) => entries.push(Entry::from_proto(py, entry)?),
            Err(reason) => refused.push((key, reason)),
        }
    }
    Ok((PyList::new(py, entries)?, refused))
}

/// What a file written from `entries` (a Scan's Entry objects) would hold, for the loader:
/// `(values, refused, metadata_json)`, values being `(problem, rank, value_json)` for each entry
/// export would write (`value_json` the `{"runner_id", "tactic", "min_time"}` object's text),
/// refused `(problem, reason)` for the others, and the metadata a file assembled from them
/// carries (the oldest stored; None when none is).
#[pyfunction]
pub fn trtllm_file_values(
    entries: Vec<Bound<'_, PyAny>>,
) -> PyResult<(FileValues, Refused, Option<String>)> {
    let entries = entries
        .iter()
        .map(Entry::extract_any)
        .collect::<PyResult<Vec<_>>>()?;
    let mut values = Vec::with_capacity(entries.len());
    let mut refused = Vec::new();
    for entry in &entries {
        let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
            continue;
        };
        match file_value_of(key, result) {
            Ok(value) => values.push((key.problem.clone(), key.rank, value.value_json())),
            Err(reason) => refused.push((key.problem.clone(), reason)),
        }
    }
    let metadata =
        TrtllmMetadata::from_entries(&entries).map(|metadata| metadata.raw_json().to_owned());
    Ok((values, refused, metadata))
}
