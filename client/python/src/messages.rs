//! The package's one model of the contract's data messages as Python objects, Key, Artifact and
//! Result (Entry, which holds a Key and a Result, is [`crate::entry`]'s), with the attribute
//! names of the generated protobuf classes the package returned before (`entry.key.problem`,
//! `result.time_us`, `key.HasField("rank")`), and their conversion from and to `tunecache.v1`.
//! The generated `tunecache.v1` stubs (`tunecache/v1/`) are for grpcio users only: the package
//! never uses them, and takes their messages as arguments like any other object with these
//! fields ([`crate::fields`]).
//!
//! Key and Result are what a Scan returns by the thousand, so they are plain Rust structs
//! (strings are moved out of the decoded message, not copied, and become Python strings only
//! when read). A Result's `artifacts` (the files beside it) are [`Artifact`] objects, both ways:
//! read from every answer and sent with every Result a caller passes.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tunecache_client::proto as v1;

use crate::fields::Fields;

/// A string as a repr shows it.
pub fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// `(namespace, op, device, problem, rank)`; an unset rank is the entry shared by all ranks.
#[pyclass(module = "tunecache._native", name = "Key", eq)]
#[derive(Clone, Default, PartialEq)]
pub struct Key {
    #[pyo3(get, set)]
    pub namespace: String,
    #[pyo3(get, set)]
    pub op: String,
    #[pyo3(get, set)]
    pub device: String,
    #[pyo3(get, set)]
    pub problem: String,
    pub rank: Option<u32>,
}

#[pymethods]
impl Key {
    #[new]
    #[pyo3(signature = (*, namespace=String::new(), op=String::new(), device=String::new(), problem=String::new(), rank=None))]
    fn new(
        namespace: String,
        op: String,
        device: String,
        problem: String,
        rank: Option<u32>,
    ) -> Self {
        Key {
            namespace,
            op,
            device,
            problem,
            rank,
        }
    }

    /// As protobuf: an unset rank reads 0; `HasField("rank")` tells them apart.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank.unwrap_or(0)
    }

    /// An int sets the rank; None unsets it (the shared entry).
    #[setter]
    fn set_rank(&mut self, rank: Option<u32>) {
        self.rank = rank;
    }

    #[allow(non_snake_case)]
    fn HasField(&self, name: &str) -> PyResult<bool> {
        match name {
            "rank" => Ok(self.rank.is_some()),
            _ => Err(PyValueError::new_err(format!(
                "Key has no optional field {name:?}"
            ))),
        }
    }

    #[allow(non_snake_case)]
    fn ClearField(&mut self, name: &str) -> PyResult<()> {
        match name {
            "namespace" => self.namespace.clear(),
            "op" => self.op.clear(),
            "device" => self.device.clear(),
            "problem" => self.problem.clear(),
            "rank" => self.rank = None,
            _ => return Err(PyValueError::new_err(format!("Key has no field {name:?}"))),
        }
        Ok(())
    }

    pub fn __repr__(&self) -> String {
        let rank = self.rank.map(|r| format!(", rank={r}")).unwrap_or_default();
        format!(
            "Key(namespace={}, op={}, device={}, problem={}{rank})",
            quoted(&self.namespace),
            quoted(&self.op),
            quoted(&self.device),
            quoted(&self.problem)
        )
    }

    /// Pickling (multiprocessing): `__new__` takes the fields as keywords.
    fn __getnewargs_ex__(slf: &Bound<'_, Self>) -> PyResult<((), Py<PyDict>)> {
        let py = slf.py();
        let this = slf.borrow();
        let fields = PyDict::new(py);
        fields.set_item("namespace", &this.namespace)?;
        fields.set_item("op", &this.op)?;
        fields.set_item("device", &this.device)?;
        fields.set_item("problem", &this.problem)?;
        fields.set_item("rank", this.rank)?;
        Ok(((), fields.unbind()))
    }
}

impl Key {
    pub fn from_proto(key: v1::Key) -> Self {
        Key {
            namespace: key.namespace,
            op: key.op,
            device: key.device,
            problem: key.problem,
            rank: key.rank,
        }
    }

    pub fn to_proto(&self) -> v1::Key {
        v1::Key {
            namespace: self.namespace.clone(),
            op: self.op.clone(),
            device: self.device.clone(),
            problem: self.problem.clone(),
            rank: self.rank,
        }
    }

    /// A Key from this class, a mapping of its fields, or an object with its attributes.
    pub fn extract_any(value: &Bound<'_, PyAny>) -> PyResult<v1::Key> {
        if let Ok(key) = value.cast::<Key>() {
            return Ok(key.borrow().to_proto());
        }
        let fields = Fields::of(value, &["namespace", "op", "device", "problem", "rank"])?;
        Ok(v1::Key {
            namespace: fields.string("namespace")?,
            op: fields.string("op")?,
            device: fields.string("device")?,
            problem: fields.string("problem")?,
            rank: fields.optional("rank")?,
        })
    }
}

/// One file of a result: its name within the entry, and its content's digest and size.
#[pyclass(module = "tunecache._native", name = "Artifact", eq)]
#[derive(Clone, Default, PartialEq)]
pub struct Artifact {
    #[pyo3(get, set)]
    pub name: String,
    #[pyo3(get, set)]
    pub sha256: String,
    #[pyo3(get, set)]
    pub size: u64,
}

#[pymethods]
impl Artifact {
    #[new]
    #[pyo3(signature = (*, name=String::new(), sha256=String::new(), size=0))]
    fn new(name: String, sha256: String, size: u64) -> Self {
        Artifact { name, sha256, size }
    }

    pub fn __repr__(&self) -> String {
        format!(
            "Artifact(name={}, sha256={}, size={})",
            quoted(&self.name),
            quoted(&self.sha256),
            self.size
        )
    }

    /// Pickling (multiprocessing): `__new__` takes the fields as keywords.
    fn __getnewargs_ex__(slf: &Bound<'_, Self>) -> PyResult<((), Py<PyDict>)> {
        let py = slf.py();
        let this = slf.borrow();
        let fields = PyDict::new(py);
        fields.set_item("name", &this.name)?;
        fields.set_item("sha256", &this.sha256)?;
        fields.set_item("size", this.size)?;
        Ok(((), fields.unbind()))
    }
}

impl Artifact {
    pub fn from_proto(artifact: v1::Artifact) -> Self {
        Artifact {
            name: artifact.name,
            sha256: artifact.sha256,
            size: artifact.size,
        }
    }

    pub fn to_proto(&self) -> v1::Artifact {
        v1::Artifact {
            name: self.name.clone(),
            sha256: self.sha256.clone(),
            size: self.size,
        }
    }

    /// An Artifact from this class, a mapping of its fields, or an object with its attributes.
    pub fn extract_any(value: &Bound<'_, PyAny>) -> PyResult<v1::Artifact> {
        if let Ok(artifact) = value.cast::<Artifact>() {
            return Ok(artifact.borrow().to_proto());
        }
        let fields = Fields::of(value, &["name", "sha256", "size"])?;
        Ok(v1::Artifact {
            name: fields.string("name")?,
            sha256: fields.string("sha256")?,
            size: fields.optional("size")?.unwrap_or(0),
        })
    }

    /// Artifacts from any iterable of what [`Artifact::extract_any`] takes.
    pub fn extract_list(values: &Bound<'_, PyAny>) -> PyResult<Vec<v1::Artifact>> {
        values
            .try_iter()?
            .map(|artifact| Artifact::extract_any(&artifact?))
            .collect()
    }

    pub fn list_to_py(py: Python<'_>, artifacts: &[v1::Artifact]) -> PyResult<Py<PyList>> {
        let objects = artifacts
            .iter()
            .map(|artifact| Py::new(py, Artifact::from_proto(artifact.clone())))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, objects)?.unbind())
    }
}

/// A tuned result: its config (JSON text), measured time, provenance and the files beside it.
#[pyclass(module = "tunecache._native", name = "Result", eq)]
#[derive(Clone, Default, PartialEq)]
pub struct TunedResult {
    #[pyo3(get, set)]
    pub config: String,
    #[pyo3(get, set)]
    pub time_us: f64,
    #[pyo3(get, set)]
    pub tuned_by: String,
    #[pyo3(get, set)]
    pub tuned_at_unix_ms: i64,
    #[pyo3(get, set)]
    pub forget_epoch: u64,
    /// The files beside the result, as the contract's messages (a new list of Artifact objects
    /// on each read: assign a list to change them).
    pub artifacts: Vec<v1::Artifact>,
}

#[pymethods]
impl TunedResult {
    #[new]
    #[pyo3(signature = (*, config=String::new(), time_us=0.0, tuned_by=String::new(), tuned_at_unix_ms=0, forget_epoch=0, artifacts=None))]
    fn new(
        config: String,
        time_us: f64,
        tuned_by: String,
        tuned_at_unix_ms: i64,
        forget_epoch: u64,
        artifacts: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(TunedResult {
            config,
            time_us,
            tuned_by,
            tuned_at_unix_ms,
            forget_epoch,
            artifacts: match artifacts {
                Some(artifacts) => Artifact::extract_list(artifacts)?,
                None => Vec::new(),
            },
        })
    }

    /// The files beside the result: a list of Artifact (name, sha256, size), in name order as
    /// the daemon keeps them.
    #[getter]
    fn artifacts(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        Artifact::list_to_py(py, &self.artifacts)
    }

    /// Any iterable of Artifact, or of mappings or objects with its fields.
    #[setter]
    fn set_artifacts(&mut self, artifacts: &Bound<'_, PyAny>) -> PyResult<()> {
        self.artifacts = Artifact::extract_list(artifacts)?;
        Ok(())
    }

    pub fn __repr__(&self) -> String {
        let artifacts = if self.artifacts.is_empty() {
            String::new()
        } else {
            let listed: Vec<String> = self
                .artifacts
                .iter()
                .map(|artifact| Artifact::from_proto(artifact.clone()).__repr__())
                .collect();
            format!(", artifacts=[{}]", listed.join(", "))
        };
        format!(
            "Result(config={}, time_us={}, tuned_by={}, tuned_at_unix_ms={}, forget_epoch={}{artifacts})",
            quoted(&self.config),
            self.time_us,
            quoted(&self.tuned_by),
            self.tuned_at_unix_ms,
            self.forget_epoch
        )
    }

    /// Pickling (multiprocessing): `__new__` takes the fields as keywords.
    fn __getnewargs_ex__(slf: &Bound<'_, Self>) -> PyResult<((), Py<PyDict>)> {
        let py = slf.py();
        let this = slf.borrow();
        let fields = PyDict::new(py);
        fields.set_item("config", &this.config)?;
        fields.set_item("time_us", this.time_us)?;
        fields.set_item("tuned_by", &this.tuned_by)?;
        fields.set_item("tuned_at_unix_ms", this.tuned_at_unix_ms)?;
        fields.set_item("forget_epoch", this.forget_epoch)?;
        fields.set_item("artifacts", Artifact::list_to_py(py, &this.artifacts)?)?;
        Ok(((), fields.unbind()))
    }
}

impl TunedResult {
    pub fn from_proto(result: v1::Result) -> Self {
        TunedResult {
            config: result.config,
            time_us: result.time_us,
            tuned_by: result.tuned_by,
            tuned_at_unix_ms: result.tuned_at_unix_ms,
            forget_epoch: result.forget_epoch,
            artifacts: result.artifacts,
        }
    }

    pub fn to_proto(&self) -> v1::Result {
        v1::Result {
            config: self.config.clone(),
            time_us: self.time_us,
            tuned_by: self.tuned_by.clone(),
            tuned_at_unix_ms: self.tuned_at_unix_ms,
            forget_epoch: self.forget_epoch,
            artifacts: self.artifacts.clone(),
        }
    }

    /// A Result from this class, a mapping of its fields, or an object with its attributes.
    pub fn extract_any(value: &Bound<'_, PyAny>) -> PyResult<v1::Result> {
        if let Ok(result) = value.cast::<TunedResult>() {
            return Ok(result.borrow().to_proto());
        }
        let fields = Fields::of(
            value,
            &[
                "config",
                "time_us",
                "tuned_by",
                "tuned_at_unix_ms",
                "forget_epoch",
                "artifacts",
            ],
        )?;
        Ok(v1::Result {
            config: fields.string("config")?,
            time_us: fields.optional("time_us")?.unwrap_or(0.0),
            tuned_by: fields.string("tuned_by")?,
            tuned_at_unix_ms: fields.optional("tuned_at_unix_ms")?.unwrap_or(0),
            forget_epoch: fields.optional("forget_epoch")?.unwrap_or(0),
            artifacts: match fields.get("artifacts")? {
                Some(artifacts) => Artifact::extract_list(&artifacts)?,
                None => Vec::new(),
            },
        })
    }
}
