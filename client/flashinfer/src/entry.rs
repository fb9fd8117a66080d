//! One entry of their store both ways: the entry JSON their `publish` writes (`{"key", "runner",
//! "tactic", "profiling_policy"?, "key_fields"?}`) to the two tunecache entries that hold it (the
//! entry under its `file_key`, and the op unit naming it the winner; see the crate doc), and a
//! stored result back to that entry JSON, its file name and the file text their `publish` would
//! have written, byte for byte.

use sha2::{Digest, Sha256};
use tunecache_proto::v1;
use tunecache_trtllm::pyjson::python_indent_2;

use crate::jsontext;
use crate::manifest::hex;
use crate::{FileKey, Manifest, FIXED_TIME_US, NAMESPACE, OP_NAMESPACE};

const KEY: &str = "key";
const MANIFEST: &str = "manifest";

/// The two entries of one published winner: `(entry, op unit)`. `entry_json` is their entry
/// object (their `publish`'s `entry`, or an entry file's text); refused, with the reason, when
/// their `lookup` would not serve it (no string `key` or `runner`, no `tactic`).
pub fn entries_of(
    manifest: &Manifest,
    entry_json: &str,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> Result<(v1::Entry, v1::Entry), String> {
    let mut members = jsontext::members(entry_json)?;
    let file_key = jsontext::string_member(&members, KEY).ok_or("no string \"key\"")?;
    jsontext::string_member(&members, "runner").ok_or("no string \"runner\"")?;
    if !members.contains_key("tactic") {
        return Err("no \"tactic\"".to_owned());
    }
    let parts = FileKey::parse(&file_key);
    let device = manifest.device();
    members.remove(KEY);
    members.insert(
        MANIFEST.to_owned(),
        jsontext::raw(manifest.canonical_json())?,
    );
    let result = |config: String| v1::Result {
        config,
        time_us: FIXED_TIME_US,
        tuned_by: tuned_by.to_owned(),
        tuned_at_unix_ms,
        ..Default::default()
    };
    let key = |namespace: &str, problem: String| v1::Key {
        namespace: namespace.to_owned(),
        op: parts.op.clone(),
        device: device.clone(),
        problem,
        rank: None,
    };
    let entry = v1::Entry {
        key: Some(key(NAMESPACE, file_key.clone())),
        result: Some(result(jsontext::object(&members))),
    };
    members.insert(KEY.to_owned(), jsontext::raw(jsontext::string(&file_key))?);
    let unit = v1::Entry {
        key: Some(key(OP_NAMESPACE, parts.unit)),
        result: Some(result(jsontext::object(&members))),
    };
    Ok((entry, unit))
}

/// A stored result as their store holds it.
#[derive(Debug, Clone)]
pub struct FileEntry {
    /// The entry's `file_key`.
    pub key: String,
    /// Its environment.
    pub manifest: Manifest,
    /// Their entry object, compact: what `json.load` of the file gives.
    pub entry_json: String,
    /// `<sha256(file_key)[:24]>.json`, the name their `_entry_path` gives it.
    pub file_name: String,
}

impl FileEntry {
    /// The file's text as their `publish` writes it (`json.dump(entry, indent=2,
    /// sort_keys=True)`).
    pub fn file_text(&self) -> String {
        python_indent_2(&self.entry_json)
    }
}

/// The entry a result holds: `problem` is the entry's `file_key`; None for an op unit's result,
/// which names its winner's. Refused, with the reason, for a config that no mapping wrote.
pub fn file_entry_of(problem: Option<&str>, config: &str) -> Result<FileEntry, String> {
    let mut members = jsontext::members(config).map_err(|error| format!("config: {error}"))?;
    let manifest = members
        .remove(MANIFEST)
        .ok_or("config: no manifest (not written by the FlashInfer mapping)")?;
    let manifest = Manifest::from_json(manifest.get())?;
    let key = match problem {
        Some(problem) => problem.to_owned(),
        None => jsontext::string_member(&members, KEY).ok_or("op unit: no winner \"key\"")?,
    };
    if jsontext::string_member(&members, "runner").is_none() || !members.contains_key("tactic") {
        return Err("config: no runner or tactic".to_owned());
    }
    members.insert(KEY.to_owned(), jsontext::raw(jsontext::string(&key))?);
    let file_name = format!("{}.json", &hex(&Sha256::digest(key.as_bytes()))[..24]);
    Ok(FileEntry {
        key,
        manifest,
        entry_json: jsontext::object(&members),
        file_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = r#"{"key":"('gemm', 'R', ((8, 16),), ())","key_fields":{"__tuple__":["gemm","R",{"__tuple__":[{"__tuple__":[8,16]}]},{"__tuple__":[]}]},"profiling_policy":["cuda_graph_profile_replays",null,"l2_cache_policy","hot"],"runner":"R","tactic":[3,1e-05]}"#;

    #[test]
    fn an_entry_comes_back_as_their_file() {
        let manifest =
            Manifest::from_json(r#"{"gpu":"G","flashinfer_version":"0.7.2.post1"}"#).unwrap();
        let (entry, unit) = entries_of(&manifest, ENTRY, "test", 1).unwrap();
        let key = entry.key.clone().unwrap();
        assert_eq!(
            (key.namespace.as_str(), key.op.as_str()),
            (NAMESPACE, "gemm")
        );
        assert_eq!(key.device, manifest.device());
        assert_eq!(
            unit.key.clone().unwrap().problem,
            "('gemm', ((8, 16),), ())"
        );
        let back = file_entry_of(Some(&key.problem), &entry.result.unwrap().config).unwrap();
        assert_eq!(back.entry_json, ENTRY);
        let from_unit = file_entry_of(None, &unit.result.unwrap().config).unwrap();
        assert_eq!(from_unit.entry_json, ENTRY);
        assert_eq!(from_unit.manifest.env_hash(), manifest.env_hash());
        assert!(back.file_text().starts_with("{\n  \"key\": \"('gemm', 'R', ((8, 16),), ())\",\n  \"key_fields\": {\n    \"__tuple__\": ["));
        assert_eq!(back.file_name.len(), 29);
    }

    #[test]
    fn entries_their_lookup_would_not_serve_are_refused() {
        let manifest = Manifest::from_json("{}").unwrap();
        for bad in [
            r#"{"runner":"R","tactic":1}"#,
            r#"{"key":"k","tactic":1}"#,
            r#"{"key":"k","runner":"R"}"#,
            "[]",
            "{\"key\": NaN}",
        ] {
            assert!(entries_of(&manifest, bad, "t", 0).is_err(), "{bad}");
        }
        assert!(file_entry_of(Some("k"), r#"{"runner":"R","tactic":1}"#).is_err());
    }
}
