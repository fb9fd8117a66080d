//! The environment of a FlashInfer store: its manifest (their `_collect_metadata()` plus the
//! measurement policy's fields and `cache_schema`), the hash that names its directory, computed
//! exactly as `ManagedAutotuneCache.__init__` does, the `Key.device` built from both, and the
//! `manifest.json` text their `_ensure_dirs` writes.

use sha2::{Digest, Sha256};
use tunecache_trtllm::pyjson::python_indent_2;

use crate::jsontext::{self, Members};
use crate::SCHEMA;

/// One environment's manifest, `cache_schema` included.
#[derive(Debug, Clone)]
pub struct Manifest {
    members: Members,
}

impl Manifest {
    /// The manifest of the JSON object `json` (their `manifest` argument, or a `manifest.json`),
    /// with `cache_schema` set to the schema, as their constructor sets it.
    pub fn from_json(json: &str) -> Result<Manifest, String> {
        let mut members = jsontext::members(json).map_err(|error| format!("manifest: {error}"))?;
        members.insert(
            "cache_schema".to_owned(),
            jsontext::raw(jsontext::string(SCHEMA))?,
        );
        Ok(Manifest { members })
    }

    /// `_canonical_json(manifest)`: compact, sorted, ASCII-only.
    pub fn canonical_json(&self) -> String {
        jsontext::object(&self.members)
    }

    /// Their `env_hash`: the first 16 hex digits of the canonical JSON's SHA-256.
    pub fn env_hash(&self) -> String {
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        hex(&digest)[..16].to_owned()
    }

    /// The manifest's `gpu`, or `unknown` (what their `_collect_metadata` writes without one).
    pub fn gpu(&self) -> String {
        jsontext::string_member(&self.members, "gpu").unwrap_or_else(|| "unknown".to_owned())
    }

    /// `Key.device`: `<gpu>|env <env_hash>`. The hash covers every field of the manifest, so
    /// entries of two environments never meet; the GPU is there for people reading keys.
    pub fn device(&self) -> String {
        format!("{}|env {}", self.gpu(), self.env_hash())
    }

    /// `manifest.json` as their `_atomic_write_json` writes it (`indent=2, sort_keys=True`).
    pub fn file_text(&self) -> String {
        python_indent_2(&self.canonical_json())
    }
}

/// The env hash a `Key.device` names (`...|env <hash>`), if any.
pub fn env_hash_of_device(device: &str) -> Option<&str> {
    device.rsplit_once("|env ").map(|(_, hash)| hash)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_theirs() {
        // hashlib.sha256(json.dumps({"gpu": "NVIDIA H100", "cache_schema": "v2"}, sort_keys=True,
        // separators=(",", ":")).encode()).hexdigest()[:16]
        let manifest = Manifest::from_json(r#"{"gpu": "NVIDIA H100"}"#).unwrap();
        assert_eq!(
            manifest.canonical_json(),
            r#"{"cache_schema":"v2","gpu":"NVIDIA H100"}"#
        );
        let expected = hex(&Sha256::digest(
            br#"{"cache_schema":"v2","gpu":"NVIDIA H100"}"#,
        ));
        assert_eq!(manifest.env_hash(), expected[..16]);
        assert_eq!(
            manifest.device(),
            format!("NVIDIA H100|env {}", &expected[..16])
        );
        assert_eq!(
            manifest.file_text(),
            "{\n  \"cache_schema\": \"v2\",\n  \"gpu\": \"NVIDIA H100\"\n}"
        );
        assert_eq!(
            env_hash_of_device(&manifest.device()),
            Some(&expected[..16])
        );
    }
}
