//! Reading a bundle as untrusted input: [`Bundle::open`] reads only the trailer, the manifest
//! and the signature, and checks them; the parts are read on demand, each by positioned reads
//! of its own byte range, streamed through zstd and hashed as they pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::format::{
    key_order, ArtifactPart, Manifest, Trailer, MAGIC, MAX_ENTRY_BYTES, SIGNATURE_LEN, TRAILER_LEN,
};
use crate::hashing::HashingReader;
use crate::keys::fingerprint;
use crate::{BundleError, Entry};

/// A bundle whose manifest has been read and checked; its parts are read on demand.
pub struct Bundle {
    path: PathBuf,
    file: File,
    manifest: Manifest,
    signer: Option<VerifyingKey>,
    /// Index into `manifest.artifacts` by digest.
    by_digest: BTreeMap<String, usize>,
}

/// What [`Bundle::verify_parts`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Parts checked: the entries part and every artifact.
    pub parts: u64,
    /// Their stored (compressed) bytes.
    pub stored_bytes: u64,
    /// Their content, decompressed.
    pub content_bytes: u64,
}

/// Reads `len` bytes at `offset` of `file`, every one of them or an error.
fn read_exact_at(file: &File, offset: u64, len: u64, part: &str) -> Result<Vec<u8>, BundleError> {
    // Callers bound `len` first; this is the allocation they bound.
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| BundleError::part(part, format!("reading {len} bytes at {offset}: {e}")))?;
    Ok(bytes)
}

/// Reads one byte range of a file by positioned reads, so that several readers may share the
/// file and none moves another's place.
struct RangeReader {
    file: File,
    position: u64,
    end: u64,
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.saturating_sub(self.position);
        let want = (buf.len() as u64).min(left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.position)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ends before the part does",
            ));
        }
        self.position += n as u64;
        Ok(n)
    }
}

/// An artifact's content as it is read, refused at the end (an error instead of the last
/// `Ok(0)`) unless it adds up to the size and hashes to the digest.
struct CheckedContent<R> {
    inner: HashingReader<R>,
    sha256: String,
    size: u64,
    part: String,
}

impl<R: Read> Read for CheckedContent<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let fail = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("part \"{}\": {what}", self.part),
            )
        };
        if self.inner.count > self.size {
            return Err(fail("content is longer than its size"));
        }
        if n == 0 && !buf.is_empty() {
            if self.inner.count != self.size {
                return Err(fail("content is shorter than its size"));
            }
            if self.inner.digest() != self.sha256 {
                return Err(fail("content does not match its SHA-256"));
            }
        }
        Ok(n)
    }
}

impl Bundle {
    /// Opens the bundle at `path`: reads the trailer and the manifest (their sizes bounded)
    /// and checks the manifest's digest, its structure (parts contiguous, in order, covering
    /// the file exactly) and, when signed, the signature by the key it carries. No part is
    /// read yet.
    pub fn open(path: &Path) -> Result<Bundle, BundleError> {
        let file = File::open(path).map_err(BundleError::io("opening the bundle"))?;
        let file_len = file
            .metadata()
            .map_err(BundleError::io("reading the bundle's size"))?
            .len();
        if file_len < MAGIC.len() as u64 + TRAILER_LEN {
            return Err(BundleError::part(
                "header",
                format!("{file_len} bytes is too short for a bundle"),
            ));
        }
        if read_exact_at(&file, 0, MAGIC.len() as u64, "header")? != MAGIC {
            return Err(BundleError::part(
                "header",
                "not a tunecache bundle (no magic)",
            ));
        }
        let trailer_bytes = read_exact_at(&file, file_len - TRAILER_LEN, TRAILER_LEN, "trailer")?;
        let mut fixed = [0u8; TRAILER_LEN as usize];
        fixed.copy_from_slice(&trailer_bytes);
        let trailer = Trailer::decode(&fixed, file_len)?;
        let manifest_bytes = read_exact_at(
            &file,
            trailer.manifest_offset,
            trailer.manifest_len,
            "manifest",
        )?;
        let digest: [u8; 32] = Sha256::digest(&manifest_bytes).into();
        if digest != trailer.manifest_sha256 {
            return Err(BundleError::part(
                "manifest",
                "bytes do not match the trailer's SHA-256",
            ));
        }
        let signer = match trailer.signature_len {
            SIGNATURE_LEN => {
                let block = read_exact_at(
                    &file,
                    trailer.manifest_offset + trailer.manifest_len,
                    SIGNATURE_LEN,
                    "signature",
                )?;
                Some(check_signature(&block, &manifest_bytes)?)
            }
            _ => None,
        };
        let manifest = Manifest::parse(&manifest_bytes, trailer.manifest_offset)?;
        let by_digest = manifest
            .artifacts
            .iter()
            .enumerate()
            .map(|(index, artifact)| (artifact.sha256.clone(), index))
            .collect();
        Ok(Bundle {
            path: path.to_path_buf(),
            file,
            manifest,
            signer,
            by_digest,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The key that signed the manifest (the signature is checked by `open`); `None`: unsigned.
    pub fn signer(&self) -> Option<&VerifyingKey> {
        self.signer.as_ref()
    }

    /// Whether the bundle may be used given the `trusted` keys: with none, any bundle (signed
    /// or not) may; otherwise only one signed by one of them.
    pub fn check_trust(&self, trusted: &[VerifyingKey]) -> Result<(), BundleError> {
        if trusted.is_empty() {
            return Ok(());
        }
        match &self.signer {
            None => Err(BundleError::part(
                "signature",
                "the bundle is unsigned, but trusted keys were given",
            )),
            Some(signer) if trusted.contains(signer) => Ok(()),
            Some(signer) => Err(BundleError::part(
                "signature",
                format!("signed by {}, not by a trusted key", fingerprint(signer)),
            )),
        }
    }

    /// A reader of `len` bytes of the file from `offset`, on a handle of its own.
    fn range(&self, offset: u64, len: u64, part: &str) -> Result<RangeReader, BundleError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| BundleError::part(part, format!("opening: {e}")))?;
        Ok(RangeReader {
            file,
            position: offset,
            end: offset.saturating_add(len),
        })
    }

    /// Streams one part: hashes its stored bytes, decompresses them into `content`, and checks
    /// both against the manifest. Answers the content's length.
    fn stream_part(
        &self,
        part: &str,
        offset: u64,
        stored_len: u64,
        stored_sha256: &str,
        content: &mut dyn FnMut(&mut dyn Read) -> Result<(), BundleError>,
    ) -> Result<(), BundleError> {
        let stored = HashingReader::new(self.range(offset, stored_len, part)?);
        let mut decoder = zstd::stream::read::Decoder::new(stored)
            .map_err(|e| BundleError::part(part, format!("starting zstd: {e}")))?;
        content(&mut decoder)?;
        // Whatever zstd left unread counts too: the stored digest covers every byte.
        let mut rest = decoder.finish();
        let drained = std::io::copy(&mut rest, &mut std::io::sink());
        drained.map_err(|e| BundleError::part(part, format!("reading: {e}")))?;
        let stored = rest.into_inner();
        if stored.count != stored_len || stored.digest() != stored_sha256 {
            return Err(BundleError::part(
                part,
                "stored bytes do not match their SHA-256",
            ));
        }
        Ok(())
    }

    /// Streams every part in bounded memory and checks it: the SHA-256 of its stored
    /// (compressed) bytes, then its decompressed content's size and SHA-256. With `open`, this
    /// catches any byte of the file that changed.
    pub fn verify_parts(&self) -> Result<Verified, BundleError> {
        let entries = &self.manifest.entries;
        let mut verified = Verified {
            parts: 0,
            stored_bytes: 0,
            content_bytes: 0,
        };
        let check = |part: &str, size: u64, sha256: &str| {
            let part = part.to_owned();
            let sha256 = sha256.to_owned();
            move |content: &mut dyn Read| -> Result<(), BundleError> {
                let mut hashed = HashingReader::new(content.take(size.saturating_add(1)));
                std::io::copy(&mut hashed, &mut std::io::sink())
                    .map_err(|e| BundleError::part(&part, format!("decompressing: {e}")))?;
                if hashed.count != size || hashed.digest() != sha256 {
                    return Err(BundleError::part(
                        &part,
                        "content does not match its SHA-256 and size",
                    ));
                }
                Ok(())
            }
        };
        let mut content = check("entries", entries.content_len, &entries.content_sha256);
        self.stream_part(
            "entries",
            entries.offset,
            entries.stored_len,
            &entries.stored_sha256,
            &mut content,
        )?;
        verified.parts += 1;
        verified.stored_bytes += entries.stored_len;
        verified.content_bytes += entries.content_len;
        for artifact in &self.manifest.artifacts {
            let part = artifact.part_name();
            let mut content = check(&part, artifact.size, &artifact.sha256);
            self.stream_part(
                &part,
                artifact.offset,
                artifact.stored_len,
                &artifact.stored_sha256,
                &mut content,
            )?;
            verified.parts += 1;
            verified.stored_bytes += artifact.stored_len;
            verified.content_bytes += artifact.size;
        }
        Ok(verified)
    }

    /// The entries, decoded and checked: stored bytes and content match their digests, each
    /// message decodes strictly (it encodes back to exactly its bytes: no unknown field, no
    /// other spelling), there are as many as the manifest says, in key order and each key
    /// once, and every artifact they name is in the manifest with the same size (and every
    /// artifact in the manifest is named). Their namespaces and devices are the manifest's.
    pub fn entries(&self) -> Result<Vec<Entry>, BundleError> {
        let part = "entries";
        let manifest = &self.manifest.entries;
        let mut entries = Vec::new();
        let mut decode = |content: &mut dyn Read| -> Result<(), BundleError> {
            let mut reader = BufReader::new(HashingReader::new(
                content.take(manifest.content_len.saturating_add(1)),
            ));
            while !reader
                .fill_buf()
                .map_err(|e| BundleError::part(part, format!("decompressing: {e}")))?
                .is_empty()
            {
                if entries.len() as u64 >= manifest.count {
                    return Err(BundleError::part(
                        part,
                        format!("more entries than the manifest's {}", manifest.count),
                    ));
                }
                entries.push(read_entry(&mut reader, entries.len())?);
            }
            let hashed = reader.into_inner();
            if hashed.count != manifest.content_len || hashed.digest() != manifest.content_sha256 {
                return Err(BundleError::part(
                    part,
                    "content does not match its SHA-256 and size",
                ));
            }
            Ok(())
        };
        self.stream_part(
            part,
            manifest.offset,
            manifest.stored_len,
            &manifest.stored_sha256,
            &mut decode,
        )?;
        self.check_entries(&entries)?;
        Ok(entries)
    }

    /// The structural checks of [`Bundle::entries`] on the decoded entries.
    fn check_entries(&self, entries: &[Entry]) -> Result<(), BundleError> {
        let fail = |reason: String| Err(BundleError::part("entries", reason));
        if entries.len() as u64 != self.manifest.entries.count {
            return fail(format!(
                "{} entries, the manifest says {}",
                entries.len(),
                self.manifest.entries.count
            ));
        }
        let mut named = BTreeSet::new();
        let (mut namespaces, mut devices) = (BTreeSet::new(), BTreeSet::new());
        let mut previous = None;
        for (index, entry) in entries.iter().enumerate() {
            let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
                return fail(format!("entry {index} has no key or no result"));
            };
            if previous.is_some_and(|previous| key_order(previous, key).is_ge()) {
                return fail(format!(
                    "entry {index} is out of key order or repeats a key"
                ));
            }
            previous = Some(key);
            namespaces.insert(key.namespace.as_str());
            devices.insert(key.device.as_str());
            for artifact in &result.artifacts {
                match self.artifact(&artifact.sha256) {
                    Some(part) if part.size == artifact.size => {
                        named.insert(artifact.sha256.as_str());
                    }
                    Some(part) => {
                        return fail(format!(
                            "entry {index} names artifact {} with size {}, the manifest's is {}",
                            artifact.sha256, artifact.size, part.size
                        ))
                    }
                    None => {
                        return fail(format!(
                            "entry {index} names artifact {:?}, which the bundle does not hold",
                            artifact.sha256
                        ))
                    }
                }
            }
        }
        if named.len() != self.manifest.artifacts.len() {
            return fail("the manifest holds artifacts no entry names".to_owned());
        }
        fn listed(list: &[String]) -> BTreeSet<&str> {
            list.iter().map(String::as_str).collect()
        }
        if namespaces != listed(&self.manifest.namespaces)
            || devices != listed(&self.manifest.devices)
        {
            return fail("the manifest's namespaces or devices are not the entries'".to_owned());
        }
        Ok(())
    }

    /// The artifact of digest `sha256` the bundle holds.
    pub fn artifact(&self, sha256: &str) -> Option<&ArtifactPart> {
        let index = *self.by_digest.get(sha256)?;
        self.manifest.artifacts.get(index)
    }

    /// A reader of one artifact's content, decompressed as it is read from the file
    /// (positioned reads of its byte range, on a handle of its own), so it may be used from a
    /// blocking thread while other readers run. Its last read fails instead of ending when the
    /// content does not add up to the artifact's size and digest.
    pub fn open_artifact(&self, sha256: &str) -> Result<Box<dyn Read + Send>, BundleError> {
        let artifact = self.artifact(sha256).ok_or_else(|| {
            BundleError::part(
                crate::format::artifact_part_name(sha256),
                "not in this bundle",
            )
        })?;
        let part = artifact.part_name();
        let stored = self.range(artifact.offset, artifact.stored_len, &part)?;
        let decoder = zstd::stream::read::Decoder::new(stored)
            .map_err(|e| BundleError::part(&part, format!("starting zstd: {e}")))?;
        Ok(Box::new(CheckedContent {
            inner: HashingReader::new(decoder.take(artifact.size.saturating_add(1))),
            sha256: artifact.sha256.clone(),
            size: artifact.size,
            part,
        }))
    }
}

/// The signer of a signature block: its key, once the signature of `manifest` by it checks.
fn check_signature(block: &[u8], manifest: &[u8]) -> Result<VerifyingKey, BundleError> {
    let fail = |reason: String| BundleError::part("signature", reason);
    let mut key = [0u8; 32];
    key.copy_from_slice(&block[..32]);
    let mut signature = [0u8; 64];
    signature.copy_from_slice(&block[32..96]);
    let key =
        VerifyingKey::from_bytes(&key).map_err(|e| fail(format!("not an Ed25519 key: {e}")))?;
    let signature = Signature::from_bytes(&signature);
    key.verify_strict(manifest, &signature).map_err(|_| {
        fail(format!(
            "the manifest's signature by {} does not verify",
            fingerprint(&key)
        ))
    })?;
    Ok(key)
}

/// Reads one length-delimited `Entry`: its length bounded by [`MAX_ENTRY_BYTES`], decoded
/// strictly (it must encode back to exactly the bytes read).
fn read_entry(reader: &mut impl BufRead, index: usize) -> Result<Entry, BundleError> {
    let fail = |reason: String| BundleError::part("entries", format!("entry {index}: {reason}"));
    let mut len = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8; 1];
        reader
            .read_exact(&mut byte)
            .map_err(|e| fail(format!("reading its length: {e}")))?;
        len |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            break;
        }
        if shift >= 56 {
            return Err(fail("its length is not a varint".to_owned()));
        }
    }
    if len > MAX_ENTRY_BYTES {
        return Err(fail(format!("{len} bytes is over {MAX_ENTRY_BYTES}")));
    }
    let mut bytes = vec![0u8; len as usize];
    reader
        .read_exact(&mut bytes)
        .map_err(|e| fail(format!("reading {len} bytes: {e}")))?;
    let entry = Entry::decode(bytes.as_slice()).map_err(|e| fail(format!("not an Entry: {e}")))?;
    if entry.encode_to_vec() != bytes {
        return Err(fail(
            "not in canonical encoding (unknown fields or another spelling)".to_owned(),
        ));
    }
    Ok(entry)
}
