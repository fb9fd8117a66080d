//! Bundles (issue 52, docs/bundles.md): one file holding the entries a filter selected, every
//! artifact (blob) they name, and a manifest of their digests, optionally signed with Ed25519.
//! A staging cluster exports one (`tunecache bundle export`); a production daemon loads it.
//!
//! The file is read as untrusted input: every size in it is bounded before anything is
//! allocated, every part is checked against the manifest's SHA-256 digests, and the manifest
//! against the trailer's digest and, when signed, its signature. The layout is
//! [`format`]'s; writing is [`write_bundle`]; reading is [`Bundle`]; [`diff`] compares two
//! sets of entries; [`keys`] reads the signing and trusted keys, private ones only through
//! [`private_file`].

mod error;
pub mod format;
mod hashing;
pub mod keys;
pub mod private_file;
mod read;
mod write;

pub mod diff;

pub use ed25519_dalek;
pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use error::BundleError;
pub use format::{ArtifactPart, EntriesPart, Manifest};
pub use keys::{fingerprint, read_signing_key, read_verifying_key};
pub use read::{Bundle, Verified};
pub use tunecache_proto::v1::{Artifact, Entry, Key, Result as TunedResult};
pub use write::{write_bundle, WriteOptions, Written};

#[cfg(test)]
mod tests;
