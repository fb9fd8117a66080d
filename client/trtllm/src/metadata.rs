//! [`TrtllmMetadata`]: the file's `"metadata"` object, read from a file, made up for a device, or
//! found in the configs of imported entries, and the device fingerprint (`Key.device`) built from
//! it.

use serde::{Deserialize, Serialize};
use tunecache_proto::v1::Entry;

use crate::format::{StoredConfig, NAMESPACE};
use crate::rawjson::strip_json_whitespace;
use crate::TrtllmError;

/// Marks the TensorRT-LLM release in a device fingerprint: `...|trtllm 1.1.0`.
const LIB_VERSION_PREFIX: &str = "trtllm ";
/// `lib_version` written when the metadata had to be made up from a device fingerprint; the
/// loader only stores it.
const UNKNOWN_LIB_VERSION: &str = "unknown (written by tunecache)";

/// The `"metadata"` object of a TensorRT-LLM cache file.
#[derive(Debug, Clone, PartialEq)]
pub struct TrtllmMetadata {
    /// The object as the file spelled it, with the whitespace outside strings removed, so export
    /// writes back the same values (a float `creation_timestamp` included).
    raw_json: String,
    pub device_name: String,
    pub device_capability: (u32, u32),
    /// `lib_version` when it is a non-empty string (TensorRT-LLM's `__version__`).
    pub lib_version: Option<String>,
    /// `creation_timestamp` (Unix seconds, float) in milliseconds, when it is a number.
    pub creation_unix_ms: Option<i64>,
}

impl TrtllmMetadata {
    /// Parses a metadata object; it must hold `device_name` (a string) and `device_capability`
    /// (`[major, minor]`, as Python's `json.dump` writes the tuple, or a `"major.minor"` string).
    pub fn from_json(metadata_json: &str) -> Result<Self, TrtllmError> {
        #[derive(Deserialize)]
        struct Fields {
            device_name: Option<serde_json::Value>,
            device_capability: Option<serde_json::Value>,
            creation_timestamp: Option<serde_json::Value>,
            lib_version: Option<serde_json::Value>,
        }
        let fields: Fields = serde_json::from_str(metadata_json)
            .map_err(|err| TrtllmError::BadMetadata(format!("not an object: {err}")))?;
        let device_name = match fields.device_name {
            Some(serde_json::Value::String(name)) if !name.is_empty() => name,
            other => {
                return Err(TrtllmError::BadMetadata(format!(
                    "device_name must be a non-empty string, found {}",
                    describe_optional(&other)
                )))
            }
        };
        let device_capability = parse_device_capability(fields.device_capability.as_ref())
            .ok_or_else(|| {
                TrtllmError::BadMetadata(format!(
                    "device_capability must be [major, minor] or \"major.minor\", found {}",
                    describe_optional(&fields.device_capability)
                ))
            })?;
        let creation_unix_ms = fields
            .creation_timestamp
            .as_ref()
            .and_then(serde_json::Value::as_f64)
            .filter(|seconds| seconds.is_finite())
            .map(|seconds| (seconds * 1000.0).round() as i64);
        let lib_version = match fields.lib_version {
            Some(serde_json::Value::String(version)) if !version.is_empty() => Some(version),
            _ => None,
        };
        Ok(TrtllmMetadata {
            raw_json: strip_json_whitespace(metadata_json),
            device_name,
            device_capability,
            lib_version,
            creation_unix_ms,
        })
    }

    /// Makes up the metadata for a device fingerprint `<device name>|sm_<major><minor>[|...]`,
    /// for an export whose entries carry no imported metadata. `lib_version` is a placeholder and
    /// `creation_timestamp` is now.
    pub fn for_device(device_fingerprint: &str) -> Result<Self, TrtllmError> {
        #[derive(Serialize)]
        struct Synthesized<'a> {
            lib_version: &'a str,
            creation_timestamp: f64,
            device_name: &'a str,
            device_capability: [u32; 2],
        }
        let bad = || TrtllmError::BadDeviceFingerprint(device_fingerprint.to_owned());
        let mut parts = device_fingerprint.split('|');
        let device_name = parts
            .next()
            .filter(|name| !name.is_empty())
            .ok_or_else(bad)?;
        let sm_digits = parts
            .next()
            .and_then(|part| part.strip_prefix("sm_"))
            .filter(|digits| digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(bad)?;
        // sm_90 is 9.0 and sm_100 is 10.0: the last digit is the minor version.
        let (major_digits, minor_digit) = sm_digits.split_at(sm_digits.len() - 1);
        let major: u32 = major_digits.parse().map_err(|_| bad())?;
        let minor: u32 = minor_digit.parse().map_err(|_| bad())?;
        let named_version = parts
            .find_map(|part| part.strip_prefix(LIB_VERSION_PREFIX))
            .filter(|version| !version.is_empty());
        let now_seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs_f64())
            .unwrap_or(0.0);
        let raw_json = serde_json::to_string(&Synthesized {
            lib_version: named_version.unwrap_or(UNKNOWN_LIB_VERSION),
            creation_timestamp: now_seconds,
            device_name,
            device_capability: [major, minor],
        })
        .map_err(TrtllmError::Serialize)?;
        let mut metadata = Self::from_json(&raw_json)?;
        // The placeholder release is written to the file but is no part of the device.
        metadata.lib_version = named_version.map(str::to_owned);
        Ok(metadata)
    }

    /// The metadata an earlier import or drop-in save stored in these entries' configs: the
    /// oldest (least `creation_timestamp`; one without a time counts as newest, the first of
    /// equals wins), as a file keeps the metadata of the rank that created it and later savers
    /// leave it. `None` when no `trtllm` entry carries any (they were tuned natively). Export
    /// writes it; the drop-in's load sets it, as TensorRT-LLM's loader sets a file's.
    pub fn from_entries(entries: &[Entry]) -> Option<Self> {
        entries
            .iter()
            .filter(|entry| entry.key.as_ref().map(|key| key.namespace.as_str()) == Some(NAMESPACE))
            .filter_map(|entry| entry.result.as_ref())
            .filter_map(|result| serde_json::from_str::<StoredConfig>(&result.config).ok())
            .filter_map(|config| config.trtllm_metadata_json)
            .filter_map(|metadata_json| Self::from_json(&metadata_json).ok())
            .fold(None, |oldest: Option<Self>, metadata| match &oldest {
                Some(kept) if !older(&metadata, kept) => oldest,
                _ => Some(metadata),
            })
    }

    /// The `Key.device` of entries imported with this metadata:
    /// `<device_name>|sm_<major><minor>|trtllm <lib_version>`, e.g. `NVIDIA H200|sm_90|trtllm 1.1.0`
    /// for device_capability `[9, 0]`; without a `lib_version`, the last part is left out.
    pub fn device_fingerprint(&self) -> String {
        let (major, minor) = self.device_capability;
        match &self.lib_version {
            Some(version) => format!(
                "{}|sm_{major}{minor}|{LIB_VERSION_PREFIX}{version}",
                self.device_name
            ),
            None => format!("{}|sm_{major}{minor}", self.device_name),
        }
    }

    /// The metadata object as the file spelled it (whitespace outside strings removed).
    pub fn raw_json(&self) -> &str {
        &self.raw_json
    }
}

/// Whether `metadata` was created before `than` (a missing time is the newest).
fn older(metadata: &TrtllmMetadata, than: &TrtllmMetadata) -> bool {
    match (metadata.creation_unix_ms, than.creation_unix_ms) {
        (Some(time), Some(other)) => time < other,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

fn describe_optional(value: &Option<serde_json::Value>) -> String {
    match value {
        None => "nothing".to_owned(),
        Some(value) => value.to_string(),
    }
}

fn parse_device_capability(value: Option<&serde_json::Value>) -> Option<(u32, u32)> {
    let as_u32 = |value: &serde_json::Value| value.as_u64().and_then(|n| u32::try_from(n).ok());
    match value? {
        serde_json::Value::Array(parts) if parts.len() == 2 => {
            Some((as_u32(&parts[0])?, as_u32(&parts[1])?))
        }
        serde_json::Value::String(text) => {
            let (major, minor) = text.split_once('.')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_fingerprints_map_to_capabilities() {
        let blackwell = TrtllmMetadata::for_device("NVIDIA B200|sm_100").expect("sm_100");
        assert_eq!(blackwell.device_capability, (10, 0));
        assert_eq!(blackwell.device_fingerprint(), "NVIDIA B200|sm_100");
        for bad in [
            "",
            "NVIDIA H200",
            "NVIDIA H200|90",
            "NVIDIA H200|sm_9",
            "|sm_90",
        ] {
            assert!(
                matches!(
                    TrtllmMetadata::for_device(bad),
                    Err(TrtllmError::BadDeviceFingerprint(_))
                ),
                "{bad:?}"
            );
        }
        let string_capability = TrtllmMetadata::from_json(
            r#"{"device_name": "NVIDIA L4", "device_capability": "8.9"}"#,
        )
        .expect("string capability");
        assert_eq!(string_capability.device_fingerprint(), "NVIDIA L4|sm_89");
    }

    #[test]
    fn the_oldest_stored_metadata_is_the_files() {
        let entry = |metadata: &str| {
            let config = serde_json::json!({"runner_id": 0, "tactic": "1", "min_time": 1,
                                            "trtllm_metadata_json": metadata});
            Entry {
                key: Some(tunecache_proto::v1::Key {
                    namespace: NAMESPACE.to_owned(),
                    ..Default::default()
                }),
                result: Some(tunecache_proto::v1::Result {
                    config: config.to_string(),
                    ..Default::default()
                }),
            }
        };
        let made = |name: &str, timestamp: &str| {
            format!(
                r#"{{"lib_version": "1.0", "creation_timestamp": {timestamp}, "device_name": "{name}", "device_capability": [9, 0]}}"#
            )
        };
        let entries = [
            entry(&made("second", "1718000002.0")),
            entry(&made("none", "null")),
            entry(&made("first", "1718000001.0")),
            entry(&made("also first", "1718000001.0")),
            entry(&made("third", "1718000003.0")),
        ];
        let oldest = TrtllmMetadata::from_entries(&entries).expect("metadata");
        assert_eq!(oldest.device_name, "first");
        let untimed = TrtllmMetadata::from_entries(&entries[1..2]).expect("metadata");
        assert_eq!(untimed.device_name, "none");
        assert!(TrtllmMetadata::from_entries(&[]).is_none());
    }
}
