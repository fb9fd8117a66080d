//! Arguments taken duck-typed: this package's message objects, a mapping of their fields, or
//! anything with those attributes (a generated `tunecache.v1` message of a grpcio user
//! included). Unknown mapping keys are refused, as protobuf refuses them.

use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyMapping, PyString};

/// The fields of a duck-typed argument: a mapping's items, or attributes (with protobuf's
/// `HasField` for optional ones). Unknown mapping keys are refused, as protobuf refuses them.
pub struct Fields<'py> {
    value: Bound<'py, PyAny>,
    mapping: Option<Bound<'py, PyMapping>>,
}

impl<'py> Fields<'py> {
    pub fn of(value: &Bound<'py, PyAny>, known: &[&str]) -> PyResult<Self> {
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
    pub fn get(&self, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
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

    pub fn string(&self, name: &str) -> PyResult<String> {
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

    pub fn optional<T: for<'a> FromPyObject<'a, 'py>>(&self, name: &str) -> PyResult<Option<T>> {
        match self.get(name)? {
            Some(value) => value
                .extract()
                .map(Some)
                .map_err(|_| PyTypeError::new_err(format!("{name} has the wrong type"))),
            None => Ok(None),
        }
    }
}
