//! The JSON reader both ops validate with: a problem's objects, fields and identifiers,
//! each error naming the JSON path of the field to blame (`candidates[2].block`).

use serde_json::{Map, Value};

use super::ProblemError;

pub(super) fn parse_object(problem: &str) -> Result<Value, ProblemError> {
    serde_json::from_str(problem).map_err(|e| ProblemError::NotJson(e.to_string()))
}

pub(super) fn check_identifier(field: &str, text: &str) -> Result<(), ProblemError> {
    let mut chars = text.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || text.len() > 128 {
        return Err(ProblemError::invalid(
            field,
            format!("{text:?} is not a C identifier"),
        ));
    }
    Ok(())
}

/// A JSON object being validated, remembering its path for error messages.
pub(super) struct Fields<'a> {
    pub(super) map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    pub(super) fn new(value: &'a Value, path: &str) -> Result<Self, ProblemError> {
        match value {
            Value::Object(map) => Ok(Fields {
                map,
                prefix: if path.is_empty() {
                    String::new()
                } else {
                    format!("{path}.")
                },
            }),
            _ => Err(if path.is_empty() {
                ProblemError::NotJson("the problem must be a JSON object".to_string())
            } else {
                ProblemError::invalid(path, "must be a JSON object")
            }),
        }
    }

    pub(super) fn path(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub(super) fn only(&self, allowed: &[&str]) -> Result<(), ProblemError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(unknown) => Err(ProblemError::UnknownField {
                field: self.path(unknown),
            }),
            None => Ok(()),
        }
    }

    pub(super) fn get(&self, name: &str) -> Result<&'a Value, ProblemError> {
        self.map.get(name).ok_or_else(|| ProblemError::Missing {
            field: self.path(name),
        })
    }

    pub(super) fn string(&self, name: &str) -> Result<&'a str, ProblemError> {
        self.get(name)?
            .as_str()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be a string"))
    }

    pub(super) fn optional_string(&self, name: &str) -> Result<Option<&'a str>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.string(name).map(Some),
        }
    }

    pub(super) fn uint(&self, name: &str, min: u64, max: u64) -> Result<u64, ProblemError> {
        let value = self.get(name)?;
        let number = value.as_u64().ok_or_else(|| {
            ProblemError::invalid(self.path(name), "must be a non-negative integer")
        })?;
        if number < min || number > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("{number} is outside {min}..={max}"),
            ));
        }
        Ok(number)
    }

    pub(super) fn optional_uint(
        &self,
        name: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.uint(name, min, max).map(Some),
        }
    }

    pub(super) fn int(&self, name: &str, min: i64, max: i64) -> Result<i64, ProblemError> {
        let number = self
            .get(name)?
            .as_i64()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be an integer"))?;
        if number < min || number > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("{number} is outside {min}..={max}"),
            ));
        }
        Ok(number)
    }

    pub(super) fn float(&self, name: &str) -> Result<f64, ProblemError> {
        let number = self
            .get(name)?
            .as_f64()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be a number"))?;
        if !number.is_finite() {
            return Err(ProblemError::invalid(self.path(name), "must be finite"));
        }
        Ok(number)
    }

    pub(super) fn optional_float(&self, name: &str) -> Result<Option<f64>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.float(name).map(Some),
        }
    }

    pub(super) fn float32(&self, name: &str) -> Result<f32, ProblemError> {
        let number = self.float(name)?;
        let narrowed = number as f32;
        if !narrowed.is_finite() {
            return Err(ProblemError::invalid(
                self.path(name),
                "does not fit in an f32",
            ));
        }
        Ok(narrowed)
    }

    pub(super) fn array(
        &self,
        name: &str,
        min: usize,
        max: usize,
    ) -> Result<&'a Vec<Value>, ProblemError> {
        let items = self
            .get(name)?
            .as_array()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be an array"))?;
        if items.len() < min || items.len() > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("has {} entries (allowed {min}..={max})", items.len()),
            ));
        }
        Ok(items)
    }

    /// 1 to 3 positive launch dimensions, padded with 1s.
    pub(super) fn dims(&self, name: &str, max: [u32; 3]) -> Result<[u32; 3], ProblemError> {
        let items = self.array(name, 1, 3)?;
        let mut dims = [1u32; 3];
        for (i, item) in items.iter().enumerate() {
            let value = item.as_u64().filter(|v| *v >= 1 && *v <= u64::from(max[i]));
            dims[i] = value.ok_or_else(|| {
                ProblemError::invalid(
                    self.path(name),
                    format!("entry {i} must be an integer in 1..={}", max[i]),
                )
            })? as u32;
        }
        Ok(dims)
    }
}
