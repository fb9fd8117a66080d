//! The Python objects of the contract's messages, with the attribute names of the generated
//! protobuf classes the package returned before (`entry.key.problem`, `result.time_us`,
//! `key.HasField("rank")`, `response.WhichOneof("outcome")`), and their conversion from and to
//! `tunecache.v1`.
//!
//! Key, Result and Entry are what a Scan returns by the thousand, so they are plain Rust structs
//! (strings are moved out of the decoded message, not copied, and become Python strings only
//! when read), and an Entry makes its Key and Result objects only when they are read; once
//! made they are kept, so `entry.key.device = d` changes the entry, as with protobuf. Rarely used messages (Stats, Devices, Snapshot) are a
//! generic [`Message`] over a dict.
//!
//! A Result's `artifacts` (the files beside it) are [`Artifact`] objects, both ways: read from
//! every answer and sent with every Result a caller passes.
//!
//! Arguments are taken duck-typed: these classes, a mapping of their fields, or anything with
//! those attributes (a generated `tunecache.v1` message from the `[grpc]` extra included).

use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyString};
use tunecache_client::proto as v1;

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// `(namespace, op, device, problem, rank)`; an unset rank is the entry shared by all ranks.
#[pyclass(module = "tunecache._native", name = "Key")]
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

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .extract::<PyRef<Key>>()
            .is_ok_and(|other| *self == *other)
    }

    fn __repr__(&self) -> String {
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
#[pyclass(module = "tunecache._native", name = "Artifact")]
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

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .extract::<PyRef<Artifact>>()
            .is_ok_and(|other| *self == *other)
    }

    fn __repr__(&self) -> String {
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

    pub fn list_to_py(
        py: Python<'_>,
        artifacts: &[v1::Artifact],
    ) -> PyResult<Py<pyo3::types::PyList>> {
        let objects = artifacts
            .iter()
            .map(|artifact| Py::new(py, Artifact::from_proto(artifact.clone())))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(pyo3::types::PyList::new(py, objects)?.unbind())
    }
}

/// A tuned result: its config (JSON text), measured time, provenance and the files beside it.
#[pyclass(module = "tunecache._native", name = "Result")]
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
    fn artifacts(&self, py: Python<'_>) -> PyResult<Py<pyo3::types::PyList>> {
        Artifact::list_to_py(py, &self.artifacts)
    }

    /// Any iterable of Artifact, or of mappings or objects with its fields.
    #[setter]
    fn set_artifacts(&mut self, artifacts: &Bound<'_, PyAny>) -> PyResult<()> {
        self.artifacts = Artifact::extract_list(artifacts)?;
        Ok(())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .extract::<PyRef<TunedResult>>()
            .is_ok_and(|other| *self == *other)
    }

    fn __repr__(&self) -> String {
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

/// A message field of an Entry: the decoded message until Python first reads it, then its
/// Python object, kept, so a change through it sticks (`entry.key.device = d`), as with
/// protobuf. A Scan builds one object per entry, not three; the Key and Result are made when
/// (and if) they are read.
enum Slot<T: pyo3::PyClass, P> {
    Decoded(P),
    Object(Py<T>),
}

/// A pyclass that mirrors a `tunecache.v1` message.
trait ProtoBacked<P>: pyo3::PyClass + Into<pyo3::PyClassInitializer<Self>> {
    fn from_proto(message: P) -> Self;
    fn to_proto(&self) -> P;
}

impl ProtoBacked<v1::Key> for Key {
    fn from_proto(message: v1::Key) -> Self {
        Key::from_proto(message)
    }
    fn to_proto(&self) -> v1::Key {
        Key::to_proto(self)
    }
}

impl ProtoBacked<v1::Result> for TunedResult {
    fn from_proto(message: v1::Result) -> Self {
        TunedResult::from_proto(message)
    }
    fn to_proto(&self) -> v1::Result {
        TunedResult::to_proto(self)
    }
}

impl<T, P> Slot<T, P>
where
    T: ProtoBacked<P> + pyo3::PyClass<Frozen = pyo3::pyclass::boolean_struct::False>,
    P: Default + Clone,
{
    /// The field's object, made from the decoded message on first use.
    fn object(&mut self, py: Python<'_>) -> PyResult<Py<T>> {
        match self {
            Slot::Object(object) => Ok(object.clone_ref(py)),
            Slot::Decoded(message) => {
                let object = Py::new(py, T::from_proto(std::mem::take(message)))?;
                *self = Slot::Object(object.clone_ref(py));
                Ok(object)
            }
        }
    }

    fn proto(&self, py: Python<'_>) -> P {
        match self {
            Slot::Decoded(message) => message.clone(),
            Slot::Object(object) => object.borrow(py).to_proto(),
        }
    }
}

/// One cached entry: its key and its result.
#[pyclass(module = "tunecache._native", name = "Entry")]
pub struct Entry {
    key: Slot<Key, v1::Key>,
    result: Slot<TunedResult, v1::Result>,
}

#[pymethods]
impl Entry {
    #[new]
    #[pyo3(signature = (*, key=None, result=None))]
    fn new(
        py: Python<'_>,
        key: Option<&Bound<'_, PyAny>>,
        result: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let key = match key {
            Some(key) => match key.cast::<Key>() {
                Ok(key) => Slot::Object(key.clone().unbind()),
                Err(_) => Slot::Object(Py::new(py, Key::from_proto(Key::extract_any(key)?))?),
            },
            None => Slot::Decoded(v1::Key::default()),
        };
        let result = match result {
            Some(result) => match result.cast::<TunedResult>() {
                Ok(result) => Slot::Object(result.clone().unbind()),
                Err(_) => Slot::Object(Py::new(
                    py,
                    TunedResult::from_proto(TunedResult::extract_any(result)?),
                )?),
            },
            None => Slot::Decoded(v1::Result::default()),
        };
        Ok(Entry { key, result })
    }

    #[getter]
    fn key(&mut self, py: Python<'_>) -> PyResult<Py<Key>> {
        self.key.object(py)
    }

    #[setter]
    fn set_key(&mut self, key: Py<Key>) {
        self.key = Slot::Object(key);
    }

    #[getter]
    fn result(&mut self, py: Python<'_>) -> PyResult<Py<TunedResult>> {
        self.result.object(py)
    }

    #[setter]
    fn set_result(&mut self, result: Py<TunedResult>) {
        self.result = Slot::Object(result);
    }

    #[allow(non_snake_case)]
    fn HasField(&self, name: &str) -> PyResult<bool> {
        match name {
            "key" | "result" => Ok(true),
            _ => Err(PyValueError::new_err(format!(
                "Entry has no optional field {name:?}"
            ))),
        }
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> bool {
        let Ok(other) = other.extract::<PyRef<Entry>>() else {
            return false;
        };
        self.key.proto(py) == other.key.proto(py) && self.result.proto(py) == other.result.proto(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Entry(key={}, result={})",
            Key::from_proto(self.key.proto(py)).__repr__(),
            TunedResult::from_proto(self.result.proto(py)).__repr__()
        )
    }

    /// Pickling (multiprocessing): `__new__` takes the fields as keywords.
    fn __getnewargs_ex__(&mut self, py: Python<'_>) -> PyResult<((), Py<PyDict>)> {
        let fields = PyDict::new(py);
        fields.set_item("key", self.key.object(py)?)?;
        fields.set_item("result", self.result.object(py)?)?;
        Ok(((), fields.unbind()))
    }
}

impl Entry {
    /// The Python object of a decoded entry: its messages are moved in, not copied.
    pub fn from_proto(py: Python<'_>, entry: v1::Entry) -> PyResult<Py<Entry>> {
        Py::new(
            py,
            Entry {
                key: Slot::Decoded(entry.key.unwrap_or_default()),
                result: Slot::Decoded(entry.result.unwrap_or_default()),
            },
        )
    }

    /// An Entry from this class, a mapping `{"key": ..., "result": ...}`, or an object with
    /// those attributes.
    pub fn extract_any(value: &Bound<'_, PyAny>) -> PyResult<v1::Entry> {
        let py = value.py();
        if let Ok(entry) = value.cast::<Entry>() {
            let entry = entry.borrow();
            return Ok(v1::Entry {
                key: Some(entry.key.proto(py)),
                result: Some(entry.result.proto(py)),
            });
        }
        let fields = Fields::of(value, &["key", "result"])?;
        Ok(v1::Entry {
            key: Some(match fields.get("key")? {
                Some(key) => Key::extract_any(&key)?,
                None => v1::Key::default(),
            }),
            result: Some(match fields.get("result")? {
                Some(result) => TunedResult::extract_any(&result)?,
                None => v1::Result::default(),
            }),
        })
    }
}

/// The fields of a duck-typed argument: a mapping's items, or attributes (with protobuf's
/// `HasField` for optional ones). Unknown mapping keys are refused, as protobuf refuses them.
struct Fields<'py> {
    value: Bound<'py, PyAny>,
    mapping: Option<Bound<'py, PyMapping>>,
}

impl<'py> Fields<'py> {
    fn of(value: &Bound<'py, PyAny>, known: &[&str]) -> PyResult<Self> {
        let mapping = value.cast::<PyMapping>().ok().cloned();
        if let Some(mapping) = &mapping {
            for name in mapping.keys()?.iter() {
                let name: String = name.extract()?;
                if !known.contains(&name.as_str()) {
                    return Err(PyValueError::new_err(format!(
                        "unknown field {name:?} (fields: {})",
                        known.join(", ")
                    )));
                }
            }
        }
        Ok(Fields {
            value: value.clone(),
            mapping,
        })
    }

    /// The field's value; None when absent (or, for an optional protobuf field, unset).
    fn get(&self, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.value.py();
        if let Some(mapping) = &self.mapping {
            let name = PyString::new(py, name);
            if !mapping.contains(&name)? {
                return Ok(None);
            }
            let item = mapping.get_item(&name)?;
            return Ok((!item.is_none()).then_some(item));
        }
        if let Ok(has_field) = self.value.getattr("HasField") {
            // A generated message: `rank` unset must stay unset, not become rank 0.
            if let Ok(false) = has_field
                .call1((name,))
                .and_then(|set| set.extract::<bool>())
            {
                return Ok(None);
            }
        }
        match self.value.getattr(name) {
            Ok(item) => Ok((!item.is_none()).then_some(item)),
            Err(error) if error.is_instance_of::<PyAttributeError>(py) => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn string(&self, name: &str) -> PyResult<String> {
        match self.get(name)? {
            Some(value) => value.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{name} must be a str, not {}",
                    value
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            }),
            None => Ok(String::new()),
        }
    }

    fn optional<T: for<'a> FromPyObject<'a, 'py>>(&self, name: &str) -> PyResult<Option<T>> {
        match self.get(name)? {
            Some(value) => value
                .extract()
                .map(Some)
                .map_err(|_| PyTypeError::new_err(format!("{name} has the wrong type"))),
            None => Ok(None),
        }
    }
}

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

    pub fn from_proto(py: Python<'_>, response: v1::ResolveResponse) -> PyResult<Self> {
        use v1::resolve_response::Outcome;
        let mut answer = ResolveResponse {
            hit: None,
            tune_here: None,
            miss: None,
        };
        match response.outcome {
            Some(Outcome::Hit(result)) => {
                answer.hit = Some(Py::new(py, TunedResult::from_proto(result))?)
            }
            Some(Outcome::TuneHere(lease)) => {
                answer.tune_here = Some(Py::new(
                    py,
                    Lease {
                        lease_id: lease.lease_id,
                        expires_in_ms: lease.expires_in_ms,
                    },
                )?)
            }
            Some(Outcome::Miss(miss)) => {
                answer.miss = Some(Py::new(
                    py,
                    Miss {
                        reason: miss.reason,
                    },
                )?)
            }
            None => {}
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
}
