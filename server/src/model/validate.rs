//! Checks every request before anything is applied. A violation refuses the whole batch
//! with an error naming the entry index and the field, so a bad batch changes nothing.

use std::borrow::Cow;

use tunecache_proto::tuner::problem;
use tunecache_proto::v1;

use crate::model::entry::{CacheKey, KeyView, TunedResult};
use crate::model::forget::{ForgetAsk, ForgetScope, RankScope, Tombstone};

pub use tunecache_proto::limits::{MAX_CONFIG_BYTES, MAX_KEY_FIELD_BYTES};
/// Most entries (Record) or keys (Lookup) in one request.
pub const MAX_BATCH: usize = tunecache_proto::limits::MAX_ENTRIES;

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
    pub(crate) fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidField {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// The refusal of a request with more than `MAX_BATCH` elements in `field`. Decoding stops
/// at the first element over, so how many more there were is not known.
pub fn too_many(field: &str) -> InvalidField {
    InvalidField::new(
        field,
        format!("more than {MAX_BATCH} items, at most {MAX_BATCH} per request"),
    )
}

fn check_batch_len(field: &str, len: usize) -> Result<(), InvalidField> {
    if len > MAX_BATCH {
        return Err(too_many(field));
    }
    Ok(())
}

/// Refuses an encoded message with more than `MAX_BATCH` elements of its repeated field
/// `field` (named `name` in the error) before anything of it is decoded: reads only the
/// message's top-level tags and lengths, allocates nothing, and stops at the first element
/// over the limit. A message it cannot read is left to prost, whose decode reports it.
///
/// prost decoding a repeated message field would build every element first: 64 MiB of empty
/// elements (`0a 00`, two bytes each) is 33.5 million of them, gigabytes of structs.
pub fn check_count(message: &[u8], field: u32, name: &str) -> Result<(), InvalidField> {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut buf = message;
    let mut count = 0usize;
    while !buf.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut buf) else {
            return Ok(());
        };
        if tag == field {
            count += 1;
            if count > MAX_BATCH {
                return Err(too_many(name));
            }
        }
        if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
            return Ok(());
        }
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
    check_artifacts(path, &result.artifacts)?;
    let mut result = TunedResult::from(result);
    // -0.0 passes the check above; store +0.0 so equal times compare and encode equal.
    if result.time_us == 0.0 {
        result.time_us = 0.0;
    }
    Ok(result)
}

/// The artifacts of one result: at most `artifact::MAX_PER_RESULT`, each a valid name and
/// digest, no name twice. Whether this node can serve them is the artifact store's check.
fn check_artifacts(path: &str, artifacts: &[v1::Artifact]) -> Result<(), InvalidField> {
    use tunecache_proto::artifact;
    if artifacts.len() > artifact::MAX_PER_RESULT {
        return Err(InvalidField::new(
            format!("{path}.artifacts"),
            format!(
                "{} artifacts, at most {}",
                artifacts.len(),
                artifact::MAX_PER_RESULT
            ),
        ));
    }
    for (index, item) in artifacts.iter().enumerate() {
        let at = |field: &str| format!("{path}.artifacts[{index}].{field}");
        artifact::check_name(&item.name)
            .map_err(|refusal| InvalidField::new(at("name"), refusal.to_string()))?;
        artifact::check_digest(&item.sha256)
            .map_err(|refusal| InvalidField::new(at("sha256"), refusal.to_string()))?;
        if let Some(first) = artifacts[..index].iter().position(|a| a.name == item.name) {
            return Err(InvalidField::new(
                at("name"),
                format!("\"{}\" is also artifacts[{first}]'s name", item.name),
            ));
        }
    }
    Ok(())
}

/// `result` for a result learned from another node (a shared-directory file, Redis): its
/// `forget_epoch` must be one a daemon's clock could have made (`forget::plausible`).
pub fn learned_result(path: &str, result: v1::Result) -> Result<TunedResult, InvalidField> {
    if !crate::model::forget::plausible(result.forget_epoch, crate::model::entry::unix_now_ms()) {
        return Err(InvalidField::new(
            format!("{path}.forget_epoch"),
            format!(
                "{} is ahead of this node's clock by more than a day",
                result.forget_epoch
            ),
        ));
    }
    self::result(path, Some(result))
}

/// A tombstone learned from another node (Redis, a segment), checked like the Forget that
/// made it: its scope must be what `forget` makes of a request with the same fields (the
/// same limits, a namespace, the canonical problem; a scope of the shared entry alone is an
/// exact key), and its stamp one a daemon's clock could have made (`forget::plausible`).
pub fn learned_tombstone(path: &str, tombstone: Tombstone) -> Result<Tombstone, InvalidField> {
    let scope = &tombstone.scope;
    let (rank, only_if) = match scope.rank {
        RankScope::Every => (None, None),
        RankScope::Rank(n) => (Some(n), None),
        // Only an exact-key Forget (`only_if`) leaves a tombstone of the shared entry alone.
        RankScope::Shared => (
            None,
            Some(v1::Result {
                config: "{}".to_owned(),
                ..Default::default()
            }),
        ),
    };
    let ask = forget(v1::ForgetRequest {
        namespace: scope.namespace.clone(),
        op: scope.op.clone(),
        device: scope.device.clone(),
        problem: scope.problem.clone(),
        rank,
        only_if,
    })
    .map_err(|error| InvalidField::new(format!("{path}.{}", error.path), error.reason))?;
    if ask.scope != tombstone.scope {
        return Err(InvalidField::new(
            path,
            "not a scope a Forget makes (a problem not in canonical form)",
        ));
    }
    if !crate::model::forget::plausible(tombstone.stamp, crate::model::entry::unix_now_ms()) {
        return Err(InvalidField::new(
            format!("{path}.stamp"),
            format!(
                "{} is ahead of this node's clock by more than a day",
                tombstone.stamp
            ),
        ));
    }
    Ok(tombstone)
}

/// Validates a Forget: a scope (the namespace required, other strings optional), or, with
/// `only_if`, one exact key (all four strings required) and the result it must still hold.
pub fn forget(request: v1::ForgetRequest) -> Result<ForgetAsk, InvalidField> {
    let v1::ForgetRequest {
        namespace,
        op,
        device,
        problem,
        rank,
        only_if,
    } = request;
    let mut key = CacheKey {
        namespace,
        op,
        device,
        problem,
        rank,
    };
    let Some(only_if) = only_if else {
        for (name, value) in [
            ("namespace", &key.namespace),
            ("op", &key.op),
            ("device", &key.device),
            ("problem", &key.problem),
        ] {
            if value.len() > MAX_KEY_FIELD_BYTES {
                return Err(InvalidField::new(
                    name,
                    format!("{} bytes, at most {MAX_KEY_FIELD_BYTES}", value.len()),
                ));
            }
        }
        if key.namespace.is_empty() {
            return Err(InvalidField::new("namespace", "must not be empty"));
        }
        if key.namespace == problem::NAMESPACE && !key.problem.is_empty() && !key.op.is_empty() {
            if let Some(canonical) = check_key(String::new, &key.view())? {
                key.problem = canonical;
            }
        }
        let rank = key.rank.map_or(RankScope::Every, RankScope::Rank);
        let scope = ForgetScope {
            rank,
            ..ForgetScope::exact(&key)
        };
        return Ok(ForgetAsk {
            scope,
            only_if: None,
        });
    };
    for (name, value) in [
        ("op", &key.op),
        ("device", &key.device),
        ("problem", &key.problem),
    ] {
        if value.is_empty() {
            return Err(InvalidField::new(
                name,
                "must not be empty: a Forget with only_if names one exact key",
            ));
        }
    }
    // Paths name the request's own fields (`namespace`, `only_if.time_us`).
    if let Some(canonical) = check_key(String::new, &key.view()).map_err(|mut error| {
        error.path = error.path.trim_start_matches('.').to_owned();
        error
    })? {
        key.problem = canonical;
    }
    let only_if = result("only_if", Some(only_if))?;
    Ok(ForgetAsk {
        scope: ForgetScope::exact(&key),
        only_if: Some((only_if.config, only_if.time_us)),
    })
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
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        }
    }

    #[test]
    fn artifacts_are_checked_and_kept_in_name_order() {
        let digest = |c: char| c.to_string().repeat(64);
        let artifact = |name: &str, c: char| v1::Artifact {
            name: name.into(),
            sha256: digest(c),
            size: 3,
        };
        let with = |artifacts: Vec<v1::Artifact>| {
            let mut entry = wire_entry("ns", "{}", 1.0);
            entry.result.as_mut().unwrap().artifacts = artifacts;
            vec![wire_entry("ns", "{}", 1.0), entry]
        };
        let refused = |artifacts: Vec<v1::Artifact>| {
            let error = entries(with(artifacts)).unwrap_err();
            (error.path, error.reason)
        };
        let long = "n".repeat(129);
        for (bad, field) in [
            ("../x", "name"),
            (long.as_str(), "name"),
            ("", "name"),
            ("..", "name"),
        ] {
            let (path, _) = refused(vec![artifact("ok", 'a'), artifact(bad, 'b')]);
            assert_eq!(
                path,
                format!("entries[1].result.artifacts[1].{field}"),
                "{bad:?}"
            );
        }
        let (path, reason) = refused(vec![artifact("a.so", 'a'), artifact("a.so", 'b')]);
        assert_eq!(path, "entries[1].result.artifacts[1].name");
        assert!(reason.contains("artifacts[0]"), "{reason}");
        let mut upper = artifact("a", 'a');
        upper.sha256 = "A".repeat(64);
        assert_eq!(
            refused(vec![upper]).0,
            "entries[1].result.artifacts[0].sha256"
        );
        let too_many = (0..65).map(|i| artifact(&format!("f{i}"), 'a')).collect();
        assert_eq!(refused(too_many).0, "entries[1].result.artifacts");

        let checked = entries(with(vec![artifact("z.so", 'a'), artifact("a.cu", 'b')])).unwrap();
        let names: Vec<&str> = checked[1]
            .1
            .artifacts
            .view()
            .iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["a.cu", "z.so"]);
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
    fn counting_stops_at_the_first_element_over_the_limit() {
        use prost::Message;
        // Empty elements, two bytes each: 64 MiB of them is refused at element 10,001.
        let empty = [0x0a, 0x00].repeat(32 << 20);
        let started = std::time::Instant::now();
        let error = check_count(&empty, 1, "entries").unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            error.to_string(),
            "entries: more than 10000 items, at most 10000 per request"
        );
        assert!(check_count(&empty[..2 * MAX_BATCH], 1, "entries").is_ok());
        assert!(check_count(&empty[..2 * MAX_BATCH + 2], 1, "entries").is_err());

        // Other fields (a lease id, an unknown field) are skipped, not counted.
        let request = v1::RecordRequest {
            entries: vec![wire_entry("ns", "{}", 1.0); MAX_BATCH],
            lease_id: "lease".into(),
        };
        let mut bytes = request.encode_to_vec();
        prost::encoding::encode_key(9, prost::encoding::WireType::Varint, &mut bytes);
        prost::encoding::encode_varint(5, &mut bytes);
        assert!(check_count(&bytes, 1, "entries").is_ok());
        bytes.extend_from_slice(&[0x0a, 0x00]);
        assert!(check_count(&bytes, 1, "entries").is_err());
        // Bytes it cannot read are prost's to report.
        assert!(check_count(&[0x0a, 0x05, 0x00], 1, "entries").is_ok());
        assert!(check_count(&[0xff; 11], 1, "entries").is_ok());
    }

    #[test]
    fn learned_tombstones_are_checked_like_the_forget_that_made_them() {
        let scope = |namespace: &str, problem: &str, rank| ForgetScope {
            namespace: namespace.into(),
            op: "op".into(),
            device: "dev".into(),
            problem: problem.into(),
            rank,
        };
        let stamp = (crate::model::entry::unix_now_ms() as u64) << 16;
        for rank in [RankScope::Every, RankScope::Shared, RankScope::Rank(3)] {
            let good = Tombstone {
                scope: scope("ns", "p", rank),
                stamp,
            };
            assert_eq!(learned_tombstone("t", good.clone()), Ok(good));
        }
        let refused = |scope: ForgetScope, stamp: u64| {
            learned_tombstone("t", Tombstone { scope, stamp })
                .unwrap_err()
                .path
        };
        assert_eq!(
            refused(scope("", "p", RankScope::Every), stamp),
            "t.namespace"
        );
        let huge = "n".repeat(MAX_KEY_FIELD_BYTES + 1);
        assert_eq!(
            refused(scope(&huge, "p", RankScope::Every), stamp),
            "t.namespace"
        );
        assert_eq!(
            refused(scope("ns", "", RankScope::Shared), stamp),
            "t.problem"
        );
        assert_eq!(
            refused(scope("ns", "p", RankScope::Every), u64::MAX),
            "t.stamp"
        );
    }

    #[test]
    fn negative_zero_is_normalised() {
        let (_, result) = entries(vec![wire_entry("ns", "{}", -0.0)])
            .unwrap()
            .remove(0);
        assert!(result.time_us.is_sign_positive());
    }
}
