//! FlashInfer's managed-store mapping of `tunecache-flashinfer` for the Python drop-in
//! (`tunecache.integrations.flashinfer`), so that the drop-in and the CLI's `import flashinfer`
//! / `export flashinfer` key, hash and spell entries by one implementation: a file_key's op and
//! op unit, the environment hash and device, the two entries of a published winner, and the
//! entry JSON a stored result holds.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tunecache_flashinfer::{entries_of, file_entry_of, FileKey, Manifest};

use crate::entry::Entry;

fn refused(reason: String) -> PyErr {
    PyValueError::new_err(format!("tunecache: {reason}"))
}

/// `(op, runner, unit)` of a file_key `str((custom_op, runner, nearest_profile, extras))`: the
/// custom op (`flashinfer` when the key does not parse), the runner (None then) and the op
/// unit, the key without its runner (the key itself then), which a tuning leases.
#[pyfunction]
pub fn flashinfer_key(file_key: &str) -> (String, Option<String>, String) {
    let FileKey { op, runner, unit } = FileKey::parse(file_key);
    (op, runner, unit)
}

/// `(env_hash, device)` of the manifest `manifest_json` (their `manifest` argument, as JSON):
/// the hash their `ManagedAutotuneCache` computes, and `Key.device`, `<gpu>|env <env_hash>`.
/// Raises ValueError for a manifest that is not a JSON object.
#[pyfunction]
pub fn flashinfer_env(manifest_json: &str) -> PyResult<(String, String)> {
    let manifest = Manifest::from_json(manifest_json).map_err(refused)?;
    Ok((manifest.env_hash(), manifest.device()))
}

/// `(entry, unit)`, the two entries to Record for one published winner: `entry_json` is the
/// entry object their `publish` writes, as JSON. Raises ValueError for one their `lookup` would
/// not serve.
#[pyfunction]
pub fn flashinfer_entries(
    py: Python<'_>,
    manifest_json: &str,
    entry_json: &str,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> PyResult<(Py<Entry>, Py<Entry>)> {
    let manifest = Manifest::from_json(manifest_json).map_err(refused)?;
    let (entry, unit) =
        entries_of(&manifest, entry_json, tuned_by, tuned_at_unix_ms).map_err(refused)?;
    Ok((Entry::from_proto(py, entry)?, Entry::from_proto(py, unit)?))
}

/// `(file_key, entry_json, file_name)` of a stored result: the entry object their store would
/// hold (what `json.load` of its file gives, as JSON) and the name of its file, by which their
/// `preload` orders entries. `problem`: the entry's key's problem, or None for
/// an op unit's result (which names its winner). Raises ValueError for a config no mapping
/// wrote.
#[pyfunction]
#[pyo3(signature = (problem, config))]
pub fn flashinfer_file_entry(
    problem: Option<&str>,
    config: &str,
) -> PyResult<(String, String, String)> {
    let entry = file_entry_of(problem, config).map_err(refused)?;
    Ok((entry.key, entry.entry_json, entry.file_name))
}
