//! The split lease and the batch Record of `tunecache-client` as Python objects: `begin_tune`'s
//! answer ([`TuneStart`]), the lease itself ([`TuneLease`], ended at most once), what
//! `finish_tune` did ([`TuneFinish`]) and what `record_keeping_valid` kept ([`KeptRecord`]). The
//! rules (when a lease is given up, how a refused batch is split) are the Rust client's
//! (`tunecache_client::tuning`, `tunecache_client::record`); this module only presents them.

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tunecache_client::{proto as v1, LeaseAfterFailure};

use crate::entry::Entry;
use crate::errors::{client_error, status_error};
use crate::messages::{Key, TunedResult};

/// A lease to tune one key under: end it once, with `Client.finish_tune` (Record the result) or
/// `Client.abandon` (give it up). `open` says whether it is still to be ended.
#[pyclass(module = "tunecache._native", name = "TuneLease", frozen)]
pub struct TuneLease {
    key: v1::Key,
    lease_id: String,
    expires_in_ms: u32,
    /// Taken by whichever ends it first.
    lease: Mutex<Option<tunecache_client::TuneLease>>,
}

#[pymethods]
impl TuneLease {
    #[getter]
    fn key(&self) -> Key {
        Key::from_proto(self.key.clone())
    }

    #[getter]
    fn lease_id(&self) -> String {
        self.lease_id.clone()
    }

    #[getter]
    fn expires_in_ms(&self) -> u32 {
        self.expires_in_ms
    }

    /// Whether neither finish_tune nor abandon has ended it yet.
    #[getter]
    fn open(&self) -> bool {
        self.lease.lock().is_ok_and(|slot| slot.is_some())
    }

    fn __repr__(&self) -> String {
        format!(
            "TuneLease(lease_id={:?}, expires_in_ms={}, open={})",
            self.lease_id,
            self.expires_in_ms,
            if self.open() { "True" } else { "False" }
        )
    }
}

impl TuneLease {
    pub fn new(lease: tunecache_client::TuneLease) -> Self {
        TuneLease {
            key: lease.key().clone(),
            lease_id: lease.lease_id().to_owned(),
            expires_in_ms: lease.expires_in_ms(),
            lease: Mutex::new(Some(lease)),
        }
    }

    /// The lease to end now; None when it was ended already.
    pub fn take(&self) -> PyResult<Option<tunecache_client::TuneLease>> {
        self.lease
            .lock()
            .map(|mut slot| slot.take())
            .map_err(|_| PyRuntimeError::new_err("tunecache: the lease's state is poisoned"))
    }
}

/// `begin_tune`'s answer: `kind` is "hit" (`result` is the cached one), "tune" (`lease` is this
/// caller's to tune under) or "miss" (`reason` says why nobody will have a result in time).
#[pyclass(module = "tunecache._native", name = "TuneStart", frozen, get_all)]
pub struct TuneStart {
    pub kind: &'static str,
    pub result: Option<Py<TunedResult>>,
    pub lease: Option<Py<TuneLease>>,
    pub reason: String,
}

#[pymethods]
impl TuneStart {
    fn __repr__(&self) -> String {
        format!("TuneStart(kind={:?})", self.kind)
    }
}

impl TuneStart {
    pub fn from_rust(py: Python<'_>, start: tunecache_client::TuneStart) -> PyResult<Self> {
        use tunecache_client::TuneStart as Start;
        Ok(match start {
            Start::Hit(result) => TuneStart {
                kind: "hit",
                result: Some(Py::new(py, TunedResult::from_proto(result))?),
                lease: None,
                reason: String::new(),
            },
            Start::Tune(lease) => TuneStart {
                kind: "tune",
                result: None,
                lease: Some(Py::new(py, TuneLease::new(lease))?),
                reason: String::new(),
            },
            Start::Miss(reason) => TuneStart {
                kind: "miss",
                result: None,
                lease: None,
                reason,
            },
        })
    }
}

/// What `finish_tune` did: `error` is None when the result was Recorded (`stored`, `unchanged`
/// as Record answers them); else the RpcError, `refused` whether the daemon refused the result
/// itself (INVALID_ARGUMENT: no rank will get it), and `lease` what became of the lease:
/// "completed", "given_up", "kept" (the Record ran past its deadline and may still land) or
/// "give_up_failed" (`give_up_error` says why).
#[pyclass(module = "tunecache._native", name = "TuneFinish", frozen, get_all)]
pub struct TuneFinish {
    pub stored: u32,
    pub unchanged: u32,
    pub error: Option<Py<PyAny>>,
    pub refused: bool,
    pub lease: &'static str,
    pub give_up_error: Option<Py<PyAny>>,
}

#[pymethods]
impl TuneFinish {
    fn __repr__(&self) -> String {
        format!(
            "TuneFinish(lease={:?}, refused={})",
            self.lease,
            if self.refused { "True" } else { "False" }
        )
    }
}

impl TuneFinish {
    pub fn from_rust(
        py: Python<'_>,
        finished: Result<v1::RecordResponse, tunecache_client::FinishFailed>,
    ) -> Self {
        match finished {
            Ok(response) => TuneFinish {
                stored: response.stored,
                unchanged: response.unchanged,
                error: None,
                refused: false,
                lease: "completed",
                give_up_error: None,
            },
            Err(failed) => {
                let refused = failed.refused();
                let (lease, give_up_error) = match failed.lease {
                    LeaseAfterFailure::GivenUp => ("given_up", None),
                    LeaseAfterFailure::Kept => ("kept", None),
                    LeaseAfterFailure::GiveUpFailed(error) => (
                        "give_up_failed",
                        Some(client_error(py, error).into_value(py).into_any()),
                    ),
                };
                TuneFinish {
                    stored: 0,
                    unchanged: 0,
                    error: Some(client_error(py, failed.error).into_value(py).into_any()),
                    refused,
                    lease,
                    give_up_error,
                }
            }
        }
    }
}

/// What `record_keeping_valid` kept: `stored` and `unchanged` as Record counts them, and
/// `refused`, a list of `(index, entry, error)` for each entry the daemon refused (its index in
/// the entries given, and the RpcError whose details say why).
#[pyclass(module = "tunecache._native", name = "KeptRecord", frozen, get_all)]
pub struct KeptRecord {
    pub stored: u64,
    pub unchanged: u64,
    pub refused: Py<PyList>,
}

#[pymethods]
impl KeptRecord {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "KeptRecord(stored={}, unchanged={}, refused={})",
            self.stored,
            self.unchanged,
            self.refused.bind(py).len()
        )
    }
}

impl KeptRecord {
    pub fn from_rust(py: Python<'_>, kept: tunecache_client::KeptRecord) -> PyResult<Self> {
        let refused = kept
            .refused
            .into_iter()
            .map(|refused| {
                Ok((
                    refused.index,
                    Entry::from_proto(py, refused.entry)?,
                    status_error(py, &refused.status).into_value(py),
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(KeptRecord {
            stored: kept.stored,
            unchanged: kept.unchanged,
            refused: PyList::new(py, refused)?.unbind(),
        })
    }
}

/// The lease of `lease` to end now, refusing one ended already (finish_tune takes it once).
pub fn lease_to_finish(lease: &TuneLease) -> PyResult<tunecache_client::TuneLease> {
    lease.take()?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "tunecache: lease {} was ended already (finish_tune or abandon)",
            lease.lease_id
        ))
    })
}
