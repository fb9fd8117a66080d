//! `tunecache._native`, the native module of the `tunecache` Python package: a PyO3 binding
//! (stable ABI, CPython >= 3.10) of `tunecache-client` and `tunecache-trtllm`, so that socket
//! discovery and trust, auto-start, the split lease (begin_tune, finish_tune, abandon) and the
//! rank flow built on it, the batch Record that keeps every valid entry, artifacts (upload,
//! verified fetch, the name and digest rules), the TensorRT-LLM entry mapping and structured
//! error details exist once, in Rust. Each Python call and message class is declared here once,
//! with its documentation; `tunecache/_native.pyi` gives their types, and the Python modules of
//! the package (client.py, autotuning.py, integrations/) add only what is Python by nature.
//!
//! - [`runtime`]: the one background thread per process, waiting with the GIL released,
//!   Ctrl-C, fork;
//! - [`client`]: the `Client` class and its calls; [`args`]: their arguments and defaults;
//!   [`scan`]: a Scan's streamed chunks; [`scan_view`]: a lazy Scan's mapping;
//! - [`leases`]: the split lease's and the batch Record's answers;
//! - [`tuning`]: the rank flow with a Python `tune` callable;
//! - [`trtllm`]: the TensorRT-LLM entry mapping for the drop-in;
//! - [`flashinfer`]: FlashInfer's managed-store mapping for its drop-in;
//! - [`inductor`]: PyTorch Inductor's cache-file mapping for its drop-in;
//! - [`messages`] (Key, Result, Artifact), [`entry`] (Entry) and [`fields`] (arguments taken
//!   duck-typed): the contract's data messages as Python objects; [`answers`]: Resolve's and
//!   Record's answers and the other answers' [`answers::Message`];
//! - [`errors`]: Rust client errors as the package's Python exceptions; [`logs`]: the Rust
//!   client's warnings (replay's misses) as Python `logging` records.

use std::path::PathBuf;

use pyo3::prelude::*;

mod answers;
mod args;
mod client;
mod entry;
mod errors;
mod fields;
mod flashinfer;
mod inductor;
mod leases;
mod logs;
mod messages;
mod runtime;
mod scan;
mod scan_view;
mod trtllm;
mod tuning;

/// The socket the daemon and every client use by default: `$TUNECACHE_SOCKET`, else
/// `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, else `/tmp/tunecache-<uid>/tunecache.sock`.
#[pyfunction]
fn default_socket_path() -> PathBuf {
    tunecache_client::default_socket_path()
}

/// Refuses (UntrustedSocketError) a default socket another user could have planted.
#[pyfunction]
fn check_default_socket(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    tunecache_proto::socket_path::check_default_socket(&path)
        .map_err(|refused| errors::client_error(py, refused.into()))
}

/// The uid of the daemon answering on `path`, or None when nothing answers; refuses
/// (UntrustedDaemonError) one that runs as a uid the caller does not trust.
#[pyfunction]
fn check_daemon_uid(py: Python<'_>, path: PathBuf) -> PyResult<Option<u32>> {
    py.detach(|| tunecache_client::check_daemon_uid(&path))
        .map_err(|error| errors::client_error(py, error))
}

/// The view for a process whose environment is `environ` (a mapping), with `explicit` as the
/// last resort: the Rust client's rule (`tunecache_client::view`).
#[pyfunction]
#[pyo3(signature = (environ, explicit=None))]
fn resolve_view(environ: &Bound<'_, pyo3::types::PyMapping>, explicit: Option<String>) -> String {
    tunecache_client::view::resolve_view(
        |name| {
            environ
                .get_item(name)
                .ok()
                .and_then(|value| value.extract::<String>().ok())
        },
        explicit.as_deref(),
    )
}

/// `value` (a Key, a mapping of its fields, or an object with its attributes) as a Key.
#[pyfunction]
fn as_key(value: &Bound<'_, PyAny>) -> PyResult<messages::Key> {
    Ok(messages::Key::from_proto(messages::Key::extract_any(
        value,
    )?))
}

/// What a Scan does with its bytes once they arrived, alone: decodes `tunecache.v1.ScanResponse`
/// messages and builds the Entry objects a Scan returns, one list per message. Not part of the
/// package's API: the benchmarks time it as the Scan's floor (tests/bench, "Python ranks").
#[pyfunction]
fn _decode_scan_chunks<'py>(
    py: Python<'py>,
    chunks: Vec<Bound<'py, pyo3::types::PyBytes>>,
) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    let decoded = chunks
        .iter()
        .map(|chunk| {
            let entries = scan::decode_chunk(chunk.as_bytes())
                .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
            client::entries_to_py(py, entries)
        })
        .collect::<PyResult<Vec<_>>>()?;
    pyo3::types::PyList::new(py, decoded)
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    // Only the classes Python code names; the answers' classes (Lease, Miss, ResolveResponse,
    // RecordResponse, Message, Scan, RankOutcome, TuneStart, TuneLease, TuneFinish, KeptRecord)
    // are made on first use, so importing the package does not pay for them.
    module.add_class::<client::NativeClient>()?;
    module.add_class::<messages::Key>()?;
    module.add_class::<messages::TunedResult>()?;
    module.add_class::<entry::Entry>()?;
    module.add_class::<scan_view::ScanView>()?;
    module.add_class::<messages::Artifact>()?;
    module.add(
        "DEFAULT_TIMEOUT_S",
        tunecache_client::DEFAULT_TIMEOUT.as_secs_f64(),
    )?;
    module.add("DEFAULT_SCAN_TIMEOUT_S", args::DEFAULT_SCAN_TIMEOUT_S)?;
    module.add("DEFAULT_WAIT_MS", args::DEFAULT_WAIT_MS)?;
    module.add("MAX_WAIT_MS", args::MAX_WAIT_MS)?;
    module.add_function(wrap_pyfunction!(default_socket_path, module)?)?;
    module.add_function(wrap_pyfunction!(check_default_socket, module)?)?;
    module.add_function(wrap_pyfunction!(check_daemon_uid, module)?)?;
    module.add_function(wrap_pyfunction!(resolve_view, module)?)?;
    module.add_function(wrap_pyfunction!(as_key, module)?)?;
    module.add_function(wrap_pyfunction!(errors::refused_entry_index_of, module)?)?;
    module.add_function(wrap_pyfunction!(_decode_scan_chunks, module)?)?;
    module.add_function(wrap_pyfunction!(trtllm::trtllm_device, module)?)?;
    module.add_function(wrap_pyfunction!(trtllm::trtllm_entries, module)?)?;
    module.add_function(wrap_pyfunction!(trtllm::trtllm_file_values, module)?)?;
    module.add_function(wrap_pyfunction!(flashinfer::flashinfer_key, module)?)?;
    module.add_function(wrap_pyfunction!(flashinfer::flashinfer_env, module)?)?;
    module.add_function(wrap_pyfunction!(flashinfer::flashinfer_entries, module)?)?;
    module.add_function(wrap_pyfunction!(flashinfer::flashinfer_file_entry, module)?)?;
    module.add_function(wrap_pyfunction!(inductor::inductor_device, module)?)?;
    module.add_function(wrap_pyfunction!(inductor::inductor_gemm_key, module)?)?;
    module.add_function(wrap_pyfunction!(inductor::inductor_timings_config, module)?)?;
    module.add_function(wrap_pyfunction!(inductor::inductor_timings, module)?)?;
    module.add_function(wrap_pyfunction!(inductor::inductor_time_us, module)?)?;
    module.add_function(wrap_pyfunction!(
        inductor::inductor_best_config_key,
        module
    )?)?;
    Ok(())
}
