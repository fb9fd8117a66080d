//! The answers of the calls that are no data message: Resolve's (with its Lease and Miss, and
//! protobuf's `WhichOneof("outcome")`), Record's counts, and [`Message`], any other answer
//! (Stats, a Device, Snapshot's, a view's) as an object of its fields, which come from the
//! contract's own types (serde), not from a list kept here.

use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tunecache_client::Resolution;

use crate::messages::{quoted, TunedResult};

/// Resolve's lease: tune, then Record with `lease_id`.
#[pyclass(module = "tunecache._native", name = "Lease", frozen, get_all)]
#[derive(Clone, Default)]
pub struct Lease {
    pub lease_id: String,
    pub expires_in_ms: u32,
}

#[pymethods]
impl Lease {
    fn __repr__(&self) -> String {
        format!(
            "Lease(lease_id={}, expires_in_ms={})",
            quoted(&self.lease_id),
            self.expires_in_ms
        )
    }
}

/// Resolve's miss: nobody will have a result in time; the reason says why.
#[pyclass(module = "tunecache._native", name = "Miss", frozen, get_all)]
#[derive(Clone, Default)]
pub struct Miss {
    pub reason: String,
}

#[pymethods]
impl Miss {
    fn __repr__(&self) -> String {
        format!("Miss(reason={})", quoted(&self.reason))
    }
}

/// Resolve's answer: one of `hit`, `tune_here`, `miss` (`WhichOneof("outcome")` says which; the
/// others read as empty messages, as with protobuf).
#[pyclass(module = "tunecache._native", name = "ResolveResponse", frozen)]
pub struct ResolveResponse {
    hit: Option<Py<TunedResult>>,
    tune_here: Option<Py<Lease>>,
    miss: Option<Py<Miss>>,
}

#[pymethods]
impl ResolveResponse {
    #[getter]
    fn hit(&self, py: Python<'_>) -> PyResult<Py<TunedResult>> {
        match &self.hit {
            Some(hit) => Ok(hit.clone_ref(py)),
            None => Py::new(py, TunedResult::default()),
        }
    }

    #[getter]
    fn tune_here(&self, py: Python<'_>) -> PyResult<Py<Lease>> {
        match &self.tune_here {
            Some(lease) => Ok(lease.clone_ref(py)),
            None => Py::new(py, Lease::default()),
        }
    }

    #[getter]
    fn miss(&self, py: Python<'_>) -> PyResult<Py<Miss>> {
        match &self.miss {
            Some(miss) => Ok(miss.clone_ref(py)),
            None => Py::new(py, Miss::default()),
        }
    }

    #[allow(non_snake_case)]
    fn WhichOneof(&self, name: &str) -> PyResult<Option<&'static str>> {
        if name != "outcome" {
            return Err(PyValueError::new_err(format!(
                "ResolveResponse has no oneof {name:?}"
            )));
        }
        Ok(self.outcome())
    }

    #[allow(non_snake_case)]
    fn HasField(&self, name: &str) -> PyResult<bool> {
        match name {
            "hit" | "tune_here" | "miss" | "outcome" => {
                Ok(self.outcome() == Some(name) || (name == "outcome" && self.outcome().is_some()))
            }
            _ => Err(PyValueError::new_err(format!(
                "ResolveResponse has no field {name:?}"
            ))),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match (&self.hit, &self.tune_here, &self.miss) {
            (Some(hit), _, _) => format!("ResolveResponse(hit={})", hit.borrow(py).__repr__()),
            (_, Some(lease), _) => format!("ResolveResponse(tune_here={})", lease.get().__repr__()),
            (_, _, Some(miss)) => format!("ResolveResponse(miss={})", miss.get().__repr__()),
            _ => "ResolveResponse()".to_owned(),
        }
    }
}

impl ResolveResponse {
    fn outcome(&self) -> Option<&'static str> {
        if self.hit.is_some() {
            Some("hit")
        } else if self.tune_here.is_some() {
            Some("tune_here")
        } else if self.miss.is_some() {
            Some("miss")
        } else {
            None
        }
    }

    /// Resolve's answer as the Rust client read it.
    pub fn from_rust(py: Python<'_>, resolution: Resolution) -> PyResult<Self> {
        let mut answer = ResolveResponse {
            hit: None,
            tune_here: None,
            miss: None,
        };
        match resolution {
            Resolution::Hit(result) => {
                answer.hit = Some(Py::new(py, TunedResult::from_proto(result))?)
            }
            Resolution::TuneHere(lease) => {
                answer.tune_here = Some(Py::new(
                    py,
                    Lease {
                        lease_id: lease.lease_id,
                        expires_in_ms: lease.expires_in_ms,
                    },
                )?)
            }
            Resolution::Miss(reason) => answer.miss = Some(Py::new(py, Miss { reason })?),
        }
        Ok(answer)
    }
}

/// Record's answer.
#[pyclass(module = "tunecache._native", name = "RecordResponse", frozen, get_all)]
pub struct RecordResponse {
    /// Entries that were new or improved an existing entry.
    pub stored: u32,
    /// Entries that did not beat what the cache held.
    pub unchanged: u32,
}

#[pymethods]
impl RecordResponse {
    fn __repr__(&self) -> String {
        format!(
            "RecordResponse(stored={}, unchanged={})",
            self.stored, self.unchanged
        )
    }
}

/// Any other message (Stats, a Device, Snapshot's answer, a view): its fields as attributes.
#[pyclass(module = "tunecache._native", name = "Message", frozen)]
pub struct Message {
    name: &'static str,
    fields: Py<PyDict>,
}

#[pymethods]
impl Message {
    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        match self.fields.bind(py).get_item(name)? {
            Some(value) => Ok(value.unbind()),
            None => Err(PyAttributeError::new_err(format!(
                "{} has no field {name:?}",
                self.name
            ))),
        }
    }

    #[allow(non_snake_case)]
    fn HasField(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        Ok(self
            .fields
            .bind(py)
            .get_item(name)?
            .is_some_and(|value| !value.is_none()))
    }

    /// The fields as a new dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.fields.bind(py).copy()
    }

    fn __dir__(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.fields.bind(py).keys().extract()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("{}({})", self.name, self.fields.bind(py).repr()?))
    }
}

impl Message {
    pub fn new(name: &'static str, fields: Bound<'_, PyDict>) -> Self {
        Message {
            name,
            fields: fields.unbind(),
        }
    }

    /// The contract's message `message` (a `serde::Serialize` one: see proto/build.rs) as a
    /// Message named `name`, its fields those of the type.
    pub fn of(
        py: Python<'_>,
        name: &'static str,
        message: &impl serde::Serialize,
    ) -> PyResult<Self> {
        let fields = pythonize::pythonize(py, message)
            .map_err(|error| PyRuntimeError::new_err(format!("tunecache: {name}: {error}")))?;
        Ok(Message::new(name, fields.cast_into::<PyDict>()?))
    }

    /// Each of `messages` as [`Message::of`] makes it.
    pub fn list_of<T: serde::Serialize>(
        py: Python<'_>,
        name: &'static str,
        messages: &[T],
    ) -> PyResult<Vec<Self>> {
        messages
            .iter()
            .map(|message| Message::of(py, name, message))
            .collect()
    }
}
