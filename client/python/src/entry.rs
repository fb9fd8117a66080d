//! Entry, one cached entry (a Key and a Result), as a Python object. A Scan returns entries by
//! the thousand, so an Entry makes its Key and Result objects only when they are read; once made
//! they are kept, so `entry.key.device = d` changes the entry, as with protobuf.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tunecache_client::proto as v1;

use crate::fields::Fields;
use crate::messages::{Key, TunedResult};

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
