//! The layout of a bundle file, version 1 (docs/bundles.md, "The file format"):
//!
//! ```text
//! MAGIC                  8 bytes, "TCBUNDL1"
//! entries part           one zstd frame of length-delimited protobuf `Entry` messages, in key order
//! artifact parts         one zstd frame each, in digest order
//! manifest               canonical JSON (`Manifest`)
//! signature block        empty, or the 32-byte Ed25519 public key and the 64-byte signature of the manifest
//! trailer                TRAILER_LEN bytes: manifest offset, manifest length, signature length
//!                        (u64 little-endian each), the manifest's SHA-256, END_MAGIC
//! ```
//!
//! The parts are contiguous and cover the file exactly: the entries part starts right after
//! the magic, each part where the previous one ends, the manifest where the last one ends.
//! Every size read from the file is checked against these bounds before anything is
//! allocated for it.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::{BundleError, Key};

/// The first 8 bytes of every bundle.
pub const MAGIC: &[u8; 8] = b"TCBUNDL1";
/// The last 8 bytes of every bundle.
pub const END_MAGIC: &[u8; 8] = b"TCBEND01";
/// `Manifest::format`.
pub const FORMAT_NAME: &str = "tunecache-bundle";
/// `Manifest::version`: the only one this crate reads and writes.
pub const VERSION: u32 = 1;
/// The trailer: three u64 (manifest offset, manifest length, signature length), the
/// manifest's SHA-256, the end magic.
pub const TRAILER_LEN: u64 = 8 * 3 + 32 + 8;
/// Public key and signature.
pub const SIGNATURE_LEN: u64 = 32 + 64;
/// The largest manifest read: about 200 bytes an artifact, so room for some 300,000 of them.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// The largest single encoded `Entry` in the entries part. The daemon takes no request
/// message bigger than its `--max-message-bytes`, and no entry comes near this.
pub const MAX_ENTRY_BYTES: u64 = 4 * 1024 * 1024;
/// The most entries a bundle holds, and their most bytes once decompressed: a reader holds
/// them all in memory (a cache as big is one no node holds either), so a small file that
/// decompresses to more is refused before it is read.
pub const MAX_ENTRIES: u64 = 10_000_000;
pub const MAX_ENTRIES_CONTENT_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// The bundle's table of contents: what each part holds and the digests it must match.
/// Serialised as canonical JSON: these fields in this order, no whitespace; a manifest read
/// back must serialise to exactly its own bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT_NAME`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// When the bundle was made (`SOURCE_DATE_EPOCH` for reproducible bundles).
    pub created_unix_s: u64,
    pub entries: EntriesPart,
    /// In digest order, each digest once.
    pub artifacts: Vec<ArtifactPart>,
    /// Every `Key.namespace` of the entries, sorted, each once.
    pub namespaces: Vec<String>,
    /// Every `Key.device` of the entries, sorted, each once.
    pub devices: Vec<String>,
}

/// Where the entries are and what they hash to, compressed (stored) and not (content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntriesPart {
    pub offset: u64,
    pub stored_len: u64,
    pub stored_sha256: String,
    pub content_len: u64,
    pub content_sha256: String,
    pub count: u64,
}

/// One artifact: its content's digest and size (what entries name it by), and where its
/// compressed bytes are and what they hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactPart {
    pub sha256: String,
    pub size: u64,
    pub offset: u64,
    pub stored_len: u64,
    pub stored_sha256: String,
}

impl ArtifactPart {
    /// The part's name in errors: `artifact` and the digest's first 16 digits.
    pub fn part_name(&self) -> String {
        artifact_part_name(&self.sha256)
    }
}

/// `artifact 3f2a…`: how errors name an artifact's part.
pub(crate) fn artifact_part_name(sha256: &str) -> String {
    let short: String = sha256.chars().take(16).collect();
    format!("artifact {short}…")
}

/// The trailer's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trailer {
    pub(crate) manifest_offset: u64,
    pub(crate) manifest_len: u64,
    pub(crate) signature_len: u64,
    pub(crate) manifest_sha256: [u8; 32],
}

impl Trailer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(TRAILER_LEN as usize);
        bytes.extend_from_slice(&self.manifest_offset.to_le_bytes());
        bytes.extend_from_slice(&self.manifest_len.to_le_bytes());
        bytes.extend_from_slice(&self.signature_len.to_le_bytes());
        bytes.extend_from_slice(&self.manifest_sha256);
        bytes.extend_from_slice(END_MAGIC);
        bytes
    }

    /// The trailer of a file of `file_len` bytes, its fields checked against that length.
    pub(crate) fn decode(
        bytes: &[u8; TRAILER_LEN as usize],
        file_len: u64,
    ) -> Result<Trailer, BundleError> {
        let fail = |reason: String| BundleError::part("trailer", reason);
        let u64_at = |at: usize| {
            let mut field = [0u8; 8];
            field.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(field)
        };
        if &bytes[56..64] != END_MAGIC {
            return Err(fail(
                "no end magic: not a whole tunecache bundle".to_owned(),
            ));
        }
        let mut manifest_sha256 = [0u8; 32];
        manifest_sha256.copy_from_slice(&bytes[24..56]);
        let trailer = Trailer {
            manifest_offset: u64_at(0),
            manifest_len: u64_at(8),
            signature_len: u64_at(16),
            manifest_sha256,
        };
        if trailer.signature_len != 0 && trailer.signature_len != SIGNATURE_LEN {
            return Err(fail(format!(
                "signature length {} is neither 0 nor {SIGNATURE_LEN}",
                trailer.signature_len
            )));
        }
        if trailer.manifest_len == 0 || trailer.manifest_len > MAX_MANIFEST_BYTES {
            return Err(fail(format!(
                "manifest length {} is not within 1..={MAX_MANIFEST_BYTES}",
                trailer.manifest_len
            )));
        }
        let end = trailer
            .manifest_offset
            .checked_add(trailer.manifest_len)
            .and_then(|end| end.checked_add(trailer.signature_len))
            .and_then(|end| end.checked_add(TRAILER_LEN));
        if trailer.manifest_offset < MAGIC.len() as u64 || end != Some(file_len) {
            return Err(fail(format!(
                "manifest at {} ({} bytes) and signature ({} bytes) do not end where the trailer \
                 starts in a file of {file_len} bytes",
                trailer.manifest_offset, trailer.manifest_len, trailer.signature_len
            )));
        }
        Ok(trailer)
    }
}

/// The order of entries in a bundle: namespace, op, device, problem, then rank with the shared
/// entry (no rank) first.
pub fn key_order(a: &Key, b: &Key) -> Ordering {
    (&a.namespace, &a.op, &a.device, &a.problem, a.rank).cmp(&(
        &b.namespace,
        &b.op,
        &b.device,
        &b.problem,
        b.rank,
    ))
}

/// A digest as bundles spell it: 64 lowercase hex digits.
pub(crate) fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Manifest {
    /// The manifest's canonical bytes.
    pub fn to_canonical_json(&self) -> Vec<u8> {
        // A struct of strings and integers cannot fail to serialise.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses `bytes` and checks its structure: canonical form, format and version, digests
    /// spelled right, artifacts in digest order, namespaces and devices sorted, and every part
    /// contiguous from the magic up to `manifest_offset`.
    pub(crate) fn parse(bytes: &[u8], manifest_offset: u64) -> Result<Manifest, BundleError> {
        let fail = |reason: String| BundleError::part("manifest", reason);
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| fail(format!("not a manifest: {e}")))?;
        if manifest.format != FORMAT_NAME || manifest.version != VERSION {
            return Err(fail(format!(
                "format {:?} version {}; this reader knows {FORMAT_NAME:?} version {VERSION}",
                manifest.format, manifest.version
            )));
        }
        if manifest.to_canonical_json() != bytes {
            return Err(fail("not in canonical form".to_owned()));
        }
        let entries = &manifest.entries;
        if entries.count > MAX_ENTRIES || entries.content_len > MAX_ENTRIES_CONTENT_BYTES {
            return Err(fail(format!(
                "{} entries of {} bytes: over the bounds of {MAX_ENTRIES} entries and \
                 {MAX_ENTRIES_CONTENT_BYTES} bytes",
                entries.count, entries.content_len
            )));
        }
        if !is_digest(&entries.stored_sha256) || !is_digest(&entries.content_sha256) {
            return Err(fail(
                "the entries part's digests are not SHA-256 hex".to_owned(),
            ));
        }
        let mut next = MAGIC.len() as u64;
        let mut follow = |part: String, offset: u64, len: u64| {
            if offset != next {
                return Err(fail(format!(
                    "{part} starts at {offset}, not where the previous part ends ({next})"
                )));
            }
            next = offset
                .checked_add(len)
                .filter(|end| *end <= manifest_offset)
                .ok_or_else(|| fail(format!("{part} runs past the manifest")))?;
            Ok(())
        };
        follow(
            "the entries part".to_owned(),
            entries.offset,
            entries.stored_len,
        )?;
        let mut previous: Option<&str> = None;
        for artifact in &manifest.artifacts {
            if !is_digest(&artifact.sha256) || !is_digest(&artifact.stored_sha256) {
                return Err(fail(format!(
                    "artifact {:?}: a digest is not SHA-256 hex",
                    artifact.sha256
                )));
            }
            if previous.is_some_and(|previous| previous >= artifact.sha256.as_str()) {
                return Err(fail(
                    "artifacts are not in digest order, each once".to_owned(),
                ));
            }
            previous = Some(&artifact.sha256);
            follow(artifact.part_name(), artifact.offset, artifact.stored_len)?;
        }
        if next != manifest_offset {
            return Err(fail(format!(
                "the parts end at {next}, not where the manifest starts ({manifest_offset})"
            )));
        }
        for (field, list) in [
            ("namespaces", &manifest.namespaces),
            ("devices", &manifest.devices),
        ] {
            if list.windows(2).any(|pair| pair[0] >= pair[1]) {
                return Err(fail(format!("{field} are not sorted, each once")));
            }
        }
        Ok(manifest)
    }
}
