//! The blob store's files, blocking (callers run these on the blocking pool): one file per
//! digest under `<state-dir>/artifacts/blobs/`, each written as a temporary file under
//! `tmp/`, fsynced, then renamed in and the directory fsynced, so a SIGKILL at any point
//! leaves either the whole verified blob or nothing under its name. A blob is mode 0444
//! (`BLOB_MODE`), owned by the daemon: no uid but the daemon's (and root) may change its mode,
//! and no descriptor of it handed to a rank can be reopened writable while it has that mode.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fsx::atomic::{self, Durability, TempFile};

use super::index::FileStamp;

/// Bytes read at a time when hashing a file.
const READ_BYTES: usize = 1024 * 1024;

/// A blob's mode: readable, and writable by nobody.
pub const BLOB_MODE: u32 = 0o444;

/// The store's directories.
#[derive(Clone, Debug)]
pub struct BlobDir {
    blobs: PathBuf,
    tmp: PathBuf,
}

/// A blob being written: its temporary file, its hash so far and its length so far. Dropped
/// without `finish`, its file is removed.
pub struct Partial {
    temp: TempFile,
    hasher: Sha256,
    pub written: u64,
}

impl BlobDir {
    /// Makes the directories (private to the daemon's uid) and removes what a killed upload
    /// left in `tmp/`. Returns the blobs found, each `(digest, size)`, each made `BLOB_MODE`
    /// (an older daemon wrote them 0600); a file whose name is not a digest is removed.
    pub fn open(state_dir: &Path) -> std::io::Result<(BlobDir, Vec<(String, u64)>)> {
        use std::os::unix::fs::DirBuilderExt;
        let root = state_dir.join("artifacts");
        let dir = BlobDir {
            blobs: root.join("blobs"),
            tmp: root.join("tmp"),
        };
        for path in [&root, &dir.blobs, &dir.tmp] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)?;
        }
        for entry in std::fs::read_dir(&dir.tmp)? {
            let entry = entry?;
            let _ = std::fs::remove_file(entry.path());
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir.blobs)? {
            let entry = entry?;
            let name = entry.file_name();
            let digest = name.to_str().unwrap_or_default();
            let metadata = entry.metadata()?;
            if tunecache_proto::artifact::check_digest(digest).is_err() || !metadata.is_file() {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if !has_blob_mode(&metadata) {
                use std::os::unix::fs::PermissionsExt;
                let read_only = std::fs::Permissions::from_mode(BLOB_MODE);
                std::fs::set_permissions(entry.path(), read_only)?;
            }
            found.push((digest.to_owned(), metadata.len()));
        }
        Ok((dir, found))
    }

    pub fn path_of(&self, digest: &str) -> PathBuf {
        self.blobs.join(digest)
    }

    /// A new temporary file for a blob on its way in.
    pub fn partial(&self) -> std::io::Result<Partial> {
        let file = tempfile::Builder::new()
            .prefix("blob-")
            .suffix(".part")
            .tempfile_in(&self.tmp)?;
        let (file, path) = file.keep().map_err(|e| e.error)?;
        Ok(Partial {
            temp: TempFile::adopt(path, file),
            hasher: Sha256::new(),
            written: 0,
        })
    }

    /// Removes a blob (collected, or its bytes failed their digest).
    pub fn remove(&self, digest: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path_of(digest)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    fn sync_blobs_dir(&self) -> std::io::Result<()> {
        atomic::sync_dir(&self.blobs)
    }
}

impl Partial {
    pub fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.temp.file().write_all(data)?;
        self.hasher.update(data);
        self.written += data.len() as u64;
        Ok(())
    }

    /// Copies everything `reader` yields into the blob (a tier's fetch).
    pub fn copy_from(&mut self, reader: &mut impl Read) -> std::io::Result<()> {
        let mut buf = vec![0; READ_BYTES];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            self.write(&buf[..n])?;
        }
    }

    /// The hex digest of what was written.
    pub fn digest(&self) -> String {
        hex(self.hasher.clone().finalize().as_slice())
    }

    /// Makes the blob durable under `digest`, `BLOB_MODE` (fsync, rename, fsync of the
    /// directory).
    pub fn finish(mut self, dir: &BlobDir, digest: &str) -> std::io::Result<()> {
        self.temp.set_mode(BLOB_MODE)?;
        self.temp.sync(Durability::All)?;
        self.temp.rename_over(&dir.path_of(digest))?;
        dir.sync_blobs_dir()
    }
}

/// The hex SHA-256 of a file's bytes and their count.
pub fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    hash_open(&mut File::open(path)?)
}

/// The hex SHA-256 of the bytes left in an open file, and their count.
pub fn hash_open(file: &mut File) -> std::io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0; READ_BYTES];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((hex(hasher.finalize().as_slice()), len));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

/// Whether a blob's file has `BLOB_MODE` and nothing more (no write bit, no set-id bit).
pub fn has_blob_mode(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.permissions().mode() & 0o7777 == BLOB_MODE
}

/// The identity of an open file's bytes, for `Index::must_hash`.
pub fn stamp_of(metadata: &std::fs::Metadata) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    FileStamp {
        dev: metadata.dev(),
        ino: metadata.ino(),
        len: metadata.len(),
        mtime_ns: i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec()),
        ctime_ns: i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec()),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_whole_under_its_digest_or_absent() {
        let state = tempfile::tempdir().unwrap();
        let (dir, found) = BlobDir::open(state.path()).unwrap();
        assert!(found.is_empty());
        let mut partial = dir.partial().unwrap();
        partial.write(b"hello ").unwrap();
        partial.write(b"world").unwrap();
        let digest = partial.digest();
        assert_eq!(
            digest,
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        partial.finish(&dir, &digest).unwrap();
        assert_eq!(
            hash_file(&dir.path_of(&digest)).unwrap(),
            (digest.clone(), 11)
        );
        // Writable by nobody; one an older daemon left writable is made so at open.
        let metadata = || std::fs::metadata(dir.path_of(&digest)).unwrap();
        assert!(has_blob_mode(&metadata()));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path_of(&digest), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        assert!(!has_blob_mode(&metadata()));
        // An upload dropped half-way leaves nothing.
        let mut dropped = dir.partial().unwrap();
        dropped.write(b"half").unwrap();
        drop(dropped);
        // A killed one leaves its temporary file, and a stray name: both go at open.
        std::fs::write(state.path().join("artifacts/tmp/blob-x.part"), b"x").unwrap();
        std::fs::write(state.path().join("artifacts/blobs/not-a-digest"), b"x").unwrap();
        let (_, found) = BlobDir::open(state.path()).unwrap();
        assert_eq!(found, vec![(digest.clone(), 11)]);
        assert!(has_blob_mode(&metadata()));
        assert_eq!(
            std::fs::read_dir(state.path().join("artifacts/tmp"))
                .unwrap()
                .count(),
            0
        );
        assert!(!state.path().join("artifacts/blobs/not-a-digest").exists());
    }
}
