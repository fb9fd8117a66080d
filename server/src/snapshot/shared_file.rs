//! Opening files that other users and other nodes can write: the shared directory.
//!
//! A name there may be a symlink to `/dev/zero`, a FIFO that never gets a writer, or a file
//! far larger than any cache. Every such file is opened with `O_NOFOLLOW | O_NONBLOCK |
//! O_CLOEXEC` (a symlink fails, a FIFO does not wait for a writer), checked with `fstat` on the
//! opened descriptor (only regular files pass, and only up to the size cap), and read through
//! a reader that stops at the cap even if the file grows while it is read. Readers also count
//! the bytes they take, for the per-pass byte counters.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Default for `--snapshot-max-file-bytes`: far above any real cache, far below a
/// machine's memory.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// Identity of one version of a file: replaced (new inode), rewritten in place (size or
/// mtime) or moved to another filesystem (dev) all count as new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVersion {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileVersion {
    pub fn of(metadata: &std::fs::Metadata) -> FileVersion {
        FileVersion {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
        }
    }
}

/// Why an opened name is not read. Each is reported once per file version.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("is a symbolic link; shared-directory files are never followed")]
    Symlink,
    #[error("is not a regular file ({0})")]
    NotRegular(&'static str),
    #[error("is {size} bytes, over the {cap}-byte cap (--snapshot-max-file-bytes)")]
    TooLarge { size: u64, cap: u64 },
}

/// The outcome of opening a shared-directory file.
#[derive(Debug)]
pub enum OpenError {
    /// The name exists but must not be read; the version is what was refused.
    Refused(Refusal, Option<FileVersion>),
    /// The filesystem failed (including ENOENT and ESTALE, which callers retry).
    Io(io::Error),
}

impl From<io::Error> for OpenError {
    fn from(error: io::Error) -> Self {
        OpenError::Io(error)
    }
}

/// A regular file opened safely, with its version as `fstat` saw it.
pub struct SharedFile {
    pub file: File,
    pub version: FileVersion,
    /// The owner uid `fstat` saw: who could have written it.
    pub owner: u32,
}

fn file_type_name(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// Opens `path` without following a symlink or blocking on a FIFO, and accepts only a
/// regular file of at most `max_bytes`.
pub fn open(path: &Path, max_bytes: u64) -> Result<SharedFile, OpenError> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
            let version = std::fs::symlink_metadata(path)
                .ok()
                .map(|m| FileVersion::of(&m));
            return Err(OpenError::Refused(Refusal::Symlink, version));
        }
        Err(error) => return Err(OpenError::Io(error)),
    };
    let metadata = file.metadata()?;
    let version = FileVersion::of(&metadata);
    if !metadata.file_type().is_file() {
        return Err(OpenError::Refused(
            Refusal::NotRegular(file_type_name(metadata.file_type())),
            Some(version),
        ));
    }
    if metadata.size() > max_bytes {
        return Err(OpenError::Refused(
            Refusal::TooLarge {
                size: metadata.size(),
                cap: max_bytes,
            },
            Some(version),
        ));
    }
    Ok(SharedFile {
        file,
        version,
        owner: metadata.uid(),
    })
}

/// The version a name has now without following it: what `open` would refuse or read.
pub fn version_of(path: &Path) -> io::Result<FileVersion> {
    std::fs::symlink_metadata(path).map(|m| FileVersion::of(&m))
}

impl SharedFile {
    /// A buffered reader that ends at `max_bytes` (a file growing past the cap while it is
    /// read then parses as truncated) and adds every byte it reads to `counter`.
    pub fn reader(self, max_bytes: u64, counter: Arc<AtomicU64>) -> impl Read {
        BufReader::with_capacity(
            64 * 1024,
            CountingReader {
                inner: self.file.take(max_bytes),
                counter,
            },
        )
    }
}

/// Adds the bytes that pass through to a shared counter.
struct CountingReader<R> {
    inner: R,
    counter: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.counter.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_symlinks_fifos_devices_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("zero.tunecache.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(matches!(
            open(&link, 1 << 20),
            Err(OpenError::Refused(Refusal::Symlink, Some(_)))
        ));

        let fifo = dir.path().join("fifo.tunecache.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        // Returns at once: O_NONBLOCK means no wait for a writer.
        assert!(matches!(
            open(&fifo, 1 << 20),
            Err(OpenError::Refused(Refusal::NotRegular("a FIFO"), Some(_)))
        ));
        assert!(matches!(
            open(Path::new("/dev/zero"), 1 << 20),
            Err(OpenError::Refused(Refusal::NotRegular(_), Some(_)))
        ));

        let big = dir.path().join("big.tunecache.json");
        std::fs::write(&big, vec![b' '; 2048]).unwrap();
        assert!(matches!(
            open(&big, 1024),
            Err(OpenError::Refused(
                Refusal::TooLarge {
                    size: 2048,
                    cap: 1024
                },
                Some(_)
            ))
        ));
        let counter = Arc::new(AtomicU64::new(0));
        let mut text = String::new();
        open(&big, 4096)
            .ok()
            .unwrap()
            .reader(100, Arc::clone(&counter))
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.len(), 100, "the reader stops at the cap");
        assert_eq!(counter.load(Ordering::Relaxed), 100);
    }
}
