//! The calls' arguments as the Rust client takes them, read from what Python callers pass: a
//! timeout in seconds, waits in whole milliseconds (as `int()` reads them), Resolve's options,
//! and keys, entries, digests and files from any iterable. The calls' defaults are here too, so
//! that the binding (and through it `tunecache.client`) declares each once.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyMapping};
use tunecache_client::{proto as v1, ResolveOptions};

use crate::entry::Entry;
use crate::messages::{Key, TunedResult};

/// How long Resolve waits for another caller that is tuning the same key, by default.
pub const DEFAULT_WAIT_MS: u64 = 60_000;
/// The daemon caps Resolve waits at 10 minutes; asking for more only stretches the deadline.
pub const MAX_WAIT_MS: u64 = 600_000;
/// A Scan's deadline, which covers the whole stream, by default.
pub const DEFAULT_SCAN_TIMEOUT_S: f64 = 60.0;

/// A timeout in seconds; refused when negative or not a number.
pub fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(seconds) => Duration::try_from_secs_f64(seconds)
            .map(Some)
            .map_err(|_| PyValueError::new_err(format!("timeout must be >= 0, got {seconds}"))),
    }
}

/// Milliseconds as `int(value)` reads them (a float is truncated), a negative count being 0.
#[derive(Clone, Copy)]
pub struct WholeMs(pub u64);

impl<'py> FromPyObject<'_, 'py> for WholeMs {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let whole: i128 = value.py().get_type::<PyInt>().call1((value,))?.extract()?;
        Ok(WholeMs(u64::try_from(whole.max(0)).unwrap_or(u64::MAX)))
    }
}

/// Resolve's key and options (the wait capped at [`MAX_WAIT_MS`]).
pub fn resolve_request(
    key: &Bound<'_, PyAny>,
    wait_ms: WholeMs,
    can_tune: bool,
    lease_ms: WholeMs,
) -> PyResult<(v1::Key, ResolveOptions)> {
    let options = ResolveOptions {
        wait: Duration::from_millis(wait_ms.0.min(MAX_WAIT_MS)),
        can_tune,
        lease: Duration::from_millis(lease_ms.0),
    };
    Ok((Key::extract_any(key)?, options))
}

/// Each item of an iterable, converted.
fn each<T>(
    values: &Bound<'_, PyAny>,
    convert: impl Fn(&Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    values.try_iter()?.map(|value| convert(&value?)).collect()
}

/// Keys: Key objects, mappings of their fields, or objects with their attributes.
pub fn keys(values: &Bound<'_, PyAny>) -> PyResult<Vec<v1::Key>> {
    each(values, Key::extract_any)
}

/// Entries: Entry objects, mappings `{"key": ..., "result": ...}`, or objects with those.
pub fn entries(values: &Bound<'_, PyAny>) -> PyResult<Vec<v1::Entry>> {
    each(values, Entry::extract_any)
}

/// Strings (digests) from any iterable of str.
pub fn strings(values: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    each(values, |value| value.extract())
}

/// `(name, path)` pairs from a mapping name -> path, or from an iterable of two-item iterables;
/// a path is a str or an `os.PathLike`.
pub fn named_paths(files: &Bound<'_, PyAny>) -> PyResult<Vec<(String, PathBuf)>> {
    let pairs = match files.cast::<PyMapping>() {
        Ok(mapping) => mapping.items()?.into_any(),
        Err(_) => files.clone(),
    };
    each(&pairs, |pair| {
        let items = pair.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        match items.as_slice() {
            [name, path] => Ok((name.extract()?, path.extract()?)),
            _ => Err(PyValueError::new_err(format!(
                "a file is a (name, path) pair, not {} items",
                items.len()
            ))),
        }
    })
}

/// The artifacts an Entry or a Result names (either as this package's objects, mappings of
/// their fields, or objects with their attributes).
pub fn artifacts_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<v1::Artifact>> {
    if let Ok(result) = value.cast::<TunedResult>() {
        return Ok(result.borrow().to_proto().artifacts);
    }
    let is_entry = match value.cast::<PyMapping>() {
        Ok(mapping) => mapping.contains("result")? || mapping.contains("key")?,
        Err(_) => value.cast::<Entry>().is_ok() || value.hasattr("result")?,
    };
    if is_entry {
        Ok(Entry::extract_any(value)?
            .result
            .map(|result| result.artifacts)
            .unwrap_or_default())
    } else {
        Ok(TunedResult::extract_any(value)?.artifacts)
    }
}
