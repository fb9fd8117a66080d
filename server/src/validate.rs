//! Checks every request before anything is applied. A violation refuses the whole batch
//! with an error naming the entry index and the field, so a bad batch changes nothing.

use std::borrow::Cow;

use tunecache_proto::tuner::problem;
use tunecache_proto::v1;

use crate::entry::{CacheKey, KeyView, TunedResult};

/// Longest accepted key field (namespace, op, device, problem) and `tuned_by`.
pub const MAX_KEY_FIELD_BYTES: usize = 4 * 1024;
/// Longest accepted config JSON text.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Most entries (Record) or keys (Lookup) in one request.
pub const MAX_BATCH: usize = 10_000;

/// A rejected request: which element, which field, and why. Becomes INVALID_ARGUMENT
/// (`Error::InvalidField`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct InvalidField {
    /// e.g. `entries[3].key.op`
    pub path: String,
    pub reason: String,
}

impl InvalidField {
    fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidField {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

fn check_batch_len(field: &str, len: usize) -> Result<(), InvalidField> {
    if len > MAX_BATCH {
        return Err(InvalidField::new(
            field,
            format!("{len} items, at most {MAX_BATCH} per request"),
        ));
    }
    Ok(())
}

/// Validates one key; `path` names it in errors (e.g. `keys[2]` or `entries[2].key`).
pub fn key(path: &str, key: Option<v1::Key>) -> Result<CacheKey, InvalidField> {
    key_at(|| path.to_owned(), key)
}

/// `key`, with the path made only for an error: a 1,000-key Lookup would otherwise format
/// 1,000 paths it never uses.
fn key_at(path: impl Fn() -> String, key: Option<v1::Key>) -> Result<CacheKey, InvalidField> {
    let mut key = CacheKey::from(key.ok_or_else(|| InvalidField::new(path(), "missing"))?);
    if let Some(problem) = check_key(&path, &key.view())? {
        key.problem = problem;
    }
    Ok(key)
}

/// The rules every request key obeys, whether it arrived as a prost `v1::Key` or as a view
/// into the request's bytes (Lookup): one rule set, so both give the same errors. Returns the
/// canonical problem where the key's namespace has one (`None`: the problem stands as sent).
fn check_key(path: impl Fn() -> String, key: &KeyView<'_>) -> Result<Option<String>, InvalidField> {
    for (name, value, required) in [
        ("namespace", key.namespace, true),
        ("op", key.op, true),
        ("device", key.device, false),
        ("problem", key.problem, false),
    ] {
        if required && value.is_empty() {
            return Err(InvalidField::new(
                format!("{}.{name}", path()),
                "must not be empty",
            ));
        }
        if value.len() > MAX_KEY_FIELD_BYTES {
            return Err(InvalidField::new(
                format!("{}.{name}", path()),
                format!("{} bytes, at most {MAX_KEY_FIELD_BYTES}", value.len()),
            ));
        }
    }
    if key.namespace != problem::NAMESPACE {
        return Ok(None);
    }
    // The node tuner's own namespace: problems are canonicalised so equal problems give equal
    // keys, whichever way a rank spelled the JSON. This is the only place a problem is
    // canonicalised; the tuner takes the text as it is.
    problem::canonicalize(key.op, key.problem)
        .map(Some)
        .map_err(|error| InvalidField::new(format!("{}.problem", path()), error.to_string()))
}

/// A Lookup key that passed `check_key`, borrowed from the request: only a canonicalised
/// problem is owned.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedKey<'a> {
    namespace: &'a str,
    op: &'a str,
    device: &'a str,
    problem: Cow<'a, str>,
    rank: Option<u32>,
}

impl CheckedKey<'_> {
    /// The key as the map looks it up (with the canonical problem).
    pub fn view(&self) -> KeyView<'_> {
        KeyView {
            namespace: self.namespace,
            op: self.op,
            device: self.device,
            problem: &self.problem,
            rank: self.rank,
        }
    }
}

/// Validates a Lookup's keys read in place: the same rules, paths and order as `keys`.
pub fn key_views<'a>(
    keys: impl ExactSizeIterator<Item = KeyView<'a>>,
) -> Result<Vec<CheckedKey<'a>>, InvalidField> {
    check_batch_len("keys", keys.len())?;
    keys.enumerate()
        .map(|(index, key)| {
            let canonical_problem = check_key(|| format!("keys[{index}]"), &key)?;
            Ok(CheckedKey {
                namespace: key.namespace,
                op: key.op,
                device: key.device,
                problem: canonical_problem.map_or(Cow::Borrowed(key.problem), Cow::Owned),
                rank: key.rank,
            })
        })
        .collect()
}

/// Validates one result; `path` names it in errors (e.g. `entries[2].result`).
pub fn result(path: &str, result: Option<v1::Result>) -> Result<TunedResult, InvalidField> {
    let result = result.ok_or_else(|| InvalidField::new(path, "missing"))?;
    if result.config.len() > MAX_CONFIG_BYTES {
        return Err(InvalidField::new(
            format!("{path}.config"),
            format!("{} bytes, at most {MAX_CONFIG_BYTES}", result.config.len()),
        ));
    }
    if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&result.config) {
        return Err(InvalidField::new(
            format!("{path}.config"),
            format!("not valid JSON: {error}"),
        ));
    }
    if !result.time_us.is_finite() || result.time_us < 0.0 {
        return Err(InvalidField::new(
            format!("{path}.time_us"),
            format!("{} is not a finite, non-negative time", result.time_us),
        ));
    }
    if result.tuned_by.len() > MAX_KEY_FIELD_BYTES {
        return Err(InvalidField::new(
            format!("{path}.tuned_by"),
            format!(
                "{} bytes, at most {MAX_KEY_FIELD_BYTES}",
                result.tuned_by.len()
            ),
        ));
    }
    let mut result = TunedResult::from(result);
    // -0.0 passes the check above; store +0.0 so equal times compare and encode equal.
    if result.time_us == 0.0 {
        result.time_us = 0.0;
    }
    Ok(result)
}

/// Validates a Record batch. All or nothing: the first violation refuses the batch.
pub fn entries(entries: Vec<v1::Entry>) -> Result<Vec<(CacheKey, TunedResult)>, InvalidField> {
    check_batch_len("entries", entries.len())?;
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let key = key(&format!("entries[{index}].key"), entry.key)?;
            let result = result(&format!("entries[{index}].result"), entry.result)?;
            Ok((key, result))
        })
        .collect()
}

/// Validates a Lookup's keys.
pub fn keys(keys: Vec<v1::Key>) -> Result<Vec<CacheKey>, InvalidField> {
    check_batch_len("keys", keys.len())?;
    keys.into_iter()
        .enumerate()
        .map(|(index, k)| key_at(|| format!("keys[{index}]"), Some(k)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_entry(namespace: &str, config: &str, time_us: f64) -> v1::Entry {
        v1::Entry {
            key: Some(v1::Key {
                namespace: namespace.into(),
                op: "op".into(),
                device: "dev".into(),
                problem: "p".into(),
                rank: None,
            }),
            result: Some(v1::Result {
                config: config.into(),
                time_us,
                tuned_by: "t".into(),
                tuned_at_unix_ms: 1,
            }),
        }
    }

    #[test]
    fn names_index_and_field() {
        let batch = vec![wire_entry("ns", "{}", 1.0), wire_entry("", "{}", 1.0)];
        let error = entries(batch).unwrap_err();
        assert_eq!(error.path, "entries[1].key.namespace");

        let batch = vec![wire_entry("ns", "{not json", 1.0)];
        assert_eq!(entries(batch).unwrap_err().path, "entries[0].result.config");

        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let batch = vec![wire_entry("ns", "{}", 1.0), wire_entry("ns", "{}", bad)];
            assert_eq!(
                entries(batch).unwrap_err().path,
                "entries[1].result.time_us"
            );
        }
    }

    #[test]
    fn lookup_keys_name_their_index() {
        let good = wire_entry("ns", "{}", 1.0).key.unwrap();
        let mut bad = good.clone();
        bad.op.clear();
        let error = keys(vec![good.clone(), good, bad]).unwrap_err();
        assert_eq!(error.path, "keys[2].op");
        assert_eq!(key("key", None).unwrap_err().path, "key");
    }

    #[test]
    fn negative_zero_is_normalised() {
        let (_, result) = entries(vec![wire_entry("ns", "{}", -0.0)])
            .unwrap()
            .remove(0);
        assert!(result.time_us.is_sign_positive());
    }
}
