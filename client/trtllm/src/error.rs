//! [`TrtllmError`]: every way reading, writing or locking a cache file fails as a whole (single
//! entries that cannot be mapped are skipped instead, see [`SkippedEntry`](crate::SkippedEntry)).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrtllmError {
    #[error("the TensorRT-LLM cache file is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the TensorRT-LLM cache file holds a JSON {found}, not an object")]
    NotAnObject { found: &'static str },
    #[error(
        "the TensorRT-LLM cache file has no \"metadata\" section, so its device is unknown; \
         name the device explicitly"
    )]
    MissingMetadata,
    #[error("the TensorRT-LLM cache metadata is unusable: {0}")]
    BadMetadata(String),
    #[error("device fingerprint {0:?} is not of the form `<device name>|sm_<major><minor>[|...]`")]
    BadDeviceFingerprint(String),
    #[error("could not serialize the TensorRT-LLM cache: {0}")]
    Serialize(serde_json::Error),
    #[error("could not take the writers' lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "another writer held {path} for {waited:?}; gave up (nothing written). Retry when the \
         TensorRT-LLM ranks have saved, or raise --lock-timeout"
    )]
    LockTimeout {
        path: PathBuf,
        waited: std::time::Duration,
    },
    #[error("could not read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("could not write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}
