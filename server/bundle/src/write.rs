//! Writing a bundle: the entries sorted and encoded, each artifact streamed from its source
//! through zstd (never held whole), hashed as it goes, then the manifest, the signature and
//! the trailer. The same entries and options give the same bytes.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use ed25519_dalek::{Signer, SigningKey};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::format::{
    artifact_part_name, key_order, ArtifactPart, EntriesPart, Manifest, Trailer, FORMAT_NAME,
    MAGIC, MAX_ENTRIES, MAX_ENTRIES_CONTENT_BYTES, MAX_ENTRY_BYTES, SIGNATURE_LEN, VERSION,
};
use crate::hashing::{HashingReader, HashingWriter};
use crate::{Artifact, BundleError, Entry};

/// How a bundle is written.
#[derive(Clone)]
pub struct WriteOptions {
    /// The manifest's `created_unix_s`.
    pub created_unix_s: u64,
    /// Signs the manifest when set.
    pub signing_key: Option<SigningKey>,
    /// zstd's level for every part.
    pub zstd_level: i32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            created_unix_s: 0,
            signing_key: None,
            zstd_level: 3,
        }
    }
}

/// What [`write_bundle`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub entries: u64,
    pub artifacts: u64,
    /// The artifacts' content, uncompressed.
    pub artifact_bytes: u64,
    /// The whole file.
    pub bytes: u64,
    pub manifest: Manifest,
}

/// Writes `entries` (sorted inside by key: namespace, op, device, problem, rank with the shared
/// entry first; a key given twice is refused) and every artifact they name: each digest once,
/// in digest order, obtained once through `open_artifact` and streamed, never held whole in
/// memory. Its bytes must hash to the artifact's digest and add up to its size, or the write
/// fails (and `out` holds a partial file the caller discards). The same entries and options
/// give byte-identical output.
pub fn write_bundle<W: Write>(
    out: W,
    mut entries: Vec<Entry>,
    open_artifact: &mut dyn FnMut(&Artifact) -> std::io::Result<Box<dyn Read>>,
    options: &WriteOptions,
) -> Result<Written, BundleError> {
    let artifacts = check_entries(&mut entries)?;
    let mut out = HashingWriter::new(out);
    let mut offset = 0u64;
    let write_error = BundleError::io("writing the bundle");
    out.write_all(MAGIC).map_err(write_error)?;
    offset += out.take_digest().1;

    // The entries part: length-delimited messages through one zstd frame.
    let mut encoder = zstd::stream::write::Encoder::new(&mut out, options.zstd_level)
        .map_err(BundleError::io("starting zstd"))?;
    let mut content = HashingWriter::new(&mut encoder);
    for entry in &entries {
        let encoded = entry.encode_length_delimited_to_vec();
        content
            .write_all(&encoded)
            .map_err(BundleError::io("writing the entries part"))?;
    }
    let (content_sha256, content_len) = content.take_digest();
    if entries.len() as u64 > MAX_ENTRIES || content_len > MAX_ENTRIES_CONTENT_BYTES {
        // A bundle no reader would open.
        return Err(BundleError::Input(format!(
            "{} entries of {content_len} bytes: over the bounds of {MAX_ENTRIES} entries and \
             {MAX_ENTRIES_CONTENT_BYTES} bytes",
            entries.len()
        )));
    }
    encoder
        .finish()
        .map_err(BundleError::io("writing the entries part"))?;
    let (stored_sha256, stored_len) = out.take_digest();
    let entries_part = EntriesPart {
        offset,
        stored_len,
        stored_sha256,
        content_len,
        content_sha256,
        count: entries.len() as u64,
    };
    offset += stored_len;

    let mut parts = Vec::with_capacity(artifacts.len());
    let mut artifact_bytes = 0u64;
    for artifact in artifacts.values() {
        let part = write_artifact(
            &mut out,
            artifact,
            open_artifact,
            options.zstd_level,
            offset,
        )?;
        offset += part.stored_len;
        artifact_bytes += part.size;
        parts.push(part);
    }

    let mut namespaces: Vec<String> = Vec::new();
    let mut devices: Vec<String> = Vec::new();
    for key in entries.iter().filter_map(|entry| entry.key.as_ref()) {
        namespaces.push(key.namespace.clone());
        devices.push(key.device.clone());
    }
    for list in [&mut namespaces, &mut devices] {
        list.sort();
        list.dedup();
    }
    let manifest = Manifest {
        format: FORMAT_NAME.to_owned(),
        version: VERSION,
        created_unix_s: options.created_unix_s,
        entries: entries_part,
        artifacts: parts,
        namespaces,
        devices,
    };
    let manifest_bytes = manifest.to_canonical_json();
    let write_error = BundleError::io("writing the manifest");
    out.write_all(&manifest_bytes).map_err(write_error)?;
    let signature_len = match &options.signing_key {
        Some(key) => {
            let signature = key.sign(&manifest_bytes);
            let mut block = key.verifying_key().to_bytes().to_vec();
            block.extend_from_slice(&signature.to_bytes());
            out.write_all(&block)
                .map_err(BundleError::io("writing the signature"))?;
            SIGNATURE_LEN
        }
        None => 0,
    };
    let trailer = Trailer {
        manifest_offset: offset,
        manifest_len: manifest_bytes.len() as u64,
        signature_len,
        manifest_sha256: Sha256::digest(&manifest_bytes).into(),
    };
    out.write_all(&trailer.encode())
        .map_err(BundleError::io("writing the trailer"))?;
    out.flush().map_err(BundleError::io("writing the bundle"))?;
    let bytes = offset + out.take_digest().1;
    Ok(Written {
        entries: entries.len() as u64,
        artifacts: manifest.artifacts.len() as u64,
        artifact_bytes,
        bytes,
        manifest,
    })
}

/// Sorts `entries` and checks them: each has a key and a result, no key twice, no encoded
/// entry over [`MAX_ENTRY_BYTES`], every artifact digest spelled right and named with one size.
/// Answers the artifacts to write, by digest.
fn check_entries(entries: &mut [Entry]) -> Result<BTreeMap<String, Artifact>, BundleError> {
    for (index, entry) in entries.iter().enumerate() {
        if entry.key.is_none() || entry.result.is_none() {
            return Err(BundleError::Input(format!(
                "entry {index} has no key or no result"
            )));
        }
        if entry.encoded_len() as u64 > MAX_ENTRY_BYTES {
            return Err(BundleError::Input(format!(
                "entry {index} is over {MAX_ENTRY_BYTES} bytes encoded"
            )));
        }
    }
    entries.sort_by(|a, b| match (&a.key, &b.key) {
        (Some(a), Some(b)) => key_order(a, b),
        _ => std::cmp::Ordering::Equal,
    });
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].key == pair[1].key) {
        return Err(BundleError::Input(format!(
            "key {:?} is given twice",
            pair[0].key
        )));
    }
    let mut artifacts: BTreeMap<String, Artifact> = BTreeMap::new();
    let named = entries
        .iter()
        .filter_map(|entry| entry.result.as_ref())
        .flat_map(|result| &result.artifacts);
    for artifact in named {
        if !crate::format::is_digest(&artifact.sha256) {
            return Err(BundleError::Input(format!(
                "artifact {:?} has digest {:?}, not SHA-256 hex",
                artifact.name, artifact.sha256
            )));
        }
        let first = artifacts
            .entry(artifact.sha256.clone())
            .or_insert_with(|| artifact.clone());
        if first.size != artifact.size {
            return Err(BundleError::Input(format!(
                "artifact {} is named with sizes {} and {}",
                artifact.sha256, first.size, artifact.size
            )));
        }
    }
    Ok(artifacts)
}

/// Streams one artifact from `open_artifact` through a zstd frame into `out`, checking its
/// bytes against its digest and size as they pass.
fn write_artifact<W: Write>(
    out: &mut HashingWriter<W>,
    artifact: &Artifact,
    open_artifact: &mut dyn FnMut(&Artifact) -> std::io::Result<Box<dyn Read>>,
    level: i32,
    offset: u64,
) -> Result<ArtifactPart, BundleError> {
    let name = artifact_part_name(&artifact.sha256);
    let source = open_artifact(artifact).map_err(BundleError::io(format!("opening {name}")))?;
    // One byte past the size is read, so that a longer source is caught without reading it all.
    let mut source = HashingReader::new(source.take(artifact.size.saturating_add(1)));
    let mut encoder = zstd::stream::write::Encoder::new(&mut *out, level)
        .map_err(BundleError::io("starting zstd"))?;
    std::io::copy(&mut source, &mut encoder).map_err(BundleError::io(format!("copying {name}")))?;
    encoder
        .finish()
        .map_err(BundleError::io(format!("writing {name}")))?;
    if source.count != artifact.size || source.digest() != artifact.sha256 {
        return Err(BundleError::Input(format!(
            "{name}: its source's bytes do not match its SHA-256 and size ({} bytes)",
            artifact.size
        )));
    }
    let (stored_sha256, stored_len) = out.take_digest();
    Ok(ArtifactPart {
        sha256: artifact.sha256.clone(),
        size: artifact.size,
        offset,
        stored_len,
        stored_sha256,
    })
}
