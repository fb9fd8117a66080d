//! Reading one blob out of `v2/artifacts/` for the artifact store: where it is looked for (each
//! trusted writer's own directory, then their fallback directories, then the flat name older
//! daemons used) and which file is taken (`plan::blob_layout::judge_blob_file`, on what `fstat`
//! saw of the opened file). A file is opened with `O_NOFOLLOW | O_NONBLOCK`, so a symbolic link
//! is never followed and a FIFO never waited on, and nothing of a file is read unless it is a
//! trusted writer's regular file of the entry's size. A name held by an untrusted owner is
//! reported as squatting and passed over.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::artifacts::Partial;
use crate::snapshot::plan::blob_layout::{self, BlobFile, FileFacts, WriterDir};
use crate::snapshot::plan::trust::Writers;
use crate::sync::lock;

use super::dirs::{self, dir_facts};
use super::Squats;

/// The fallback directories of `v2/artifacts/` as last listed, kept while the directory's
/// change stamp is the same, so a reader lists it only when a name was added or removed there.
#[derive(Default)]
pub(super) struct FallbackListing {
    listed: Mutex<Option<(DirStamp, UidDirs)>>,
}

/// Directories, each with the uid it belongs to.
type UidDirs = Vec<(u32, PathBuf)>;

/// What changes when a name is added to or removed from a directory.
#[derive(Clone, Copy, PartialEq, Eq)]
struct DirStamp {
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FallbackListing {
    /// The usable fallback directories of the trusted writers.
    fn of(&self, blob_dir: &Path, writers: Writers<'_>) -> io::Result<Vec<PathBuf>> {
        let metadata = match fs::metadata(blob_dir) {
            Ok(metadata) if metadata.is_dir() => metadata,
            Ok(_) => return Ok(Vec::new()),
            Err(error) if absent(&error) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let stamp = DirStamp {
            ino: metadata.ino(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        };
        let mut listed = lock(&self.listed);
        let fresh = listed.as_ref().is_some_and(|(at, _)| *at == stamp);
        if !fresh {
            *listed = Some((stamp, dirs::fallback_dirs(blob_dir)?));
        }
        let all = listed
            .as_ref()
            .map(|(_, dirs)| dirs.as_slice())
            .unwrap_or_default();
        Ok(all
            .iter()
            .filter(|(uid, _)| writers.uids.contains(uid))
            .map(|(_, dir)| dir.clone())
            .collect())
    }
}

/// Copies blob `digest` of `size` bytes into `into` from the first place a trusted writer put
/// it; `None` when none did.
pub(super) fn read_blob(
    blob_dir: &Path,
    digest: &str,
    size: u64,
    writers: Writers<'_>,
    squats: &Squats,
    fallbacks: &FallbackListing,
    mut into: Partial,
) -> io::Result<Option<Partial>> {
    for &uid in writers.uids {
        let own = blob_dir.join(blob_layout::own_dir_name(uid));
        match fs::symlink_metadata(&own) {
            Ok(metadata) => match blob_layout::judge_writer_dir(dir_facts(&metadata), uid) {
                WriterDir::Usable => {
                    if take_file(&own.join(digest), size, writers, squats, &mut into)? {
                        return Ok(Some(into));
                    }
                }
                WriterDir::Squatted { owner } => squats.report(&own, owner),
                WriterDir::NotADirectory => {}
            },
            Err(error) if absent(&error) => {}
            Err(error) => return Err(error),
        }
    }
    for dir in fallbacks.of(blob_dir, writers)? {
        if take_file(&dir.join(digest), size, writers, squats, &mut into)? {
            return Ok(Some(into));
        }
    }
    // Where daemons before the per-uid directories linked blobs in.
    if take_file(&blob_dir.join(digest), size, writers, squats, &mut into)? {
        return Ok(Some(into));
    }
    Ok(None)
}

/// Copies the file at `path` into `into` when it is the blob (`judge_blob_file`); `false`
/// when there is none, or it is not the blob. Reads at most one byte past `size`, so a file
/// that grew is refused (by its digest) without being read further.
fn take_file(
    path: &Path,
    size: u64,
    writers: Writers<'_>,
    squats: &Squats,
    into: &mut Partial,
) -> io::Result<bool> {
    let file = match open_no_follow(path) {
        Ok(file) => file,
        Err(error) if absent(&error) => return Ok(false),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
            // A symbolic link: never followed. Whose it is says whether it is squatting.
            if let Ok(link) = fs::symlink_metadata(path) {
                let facts = FileFacts {
                    owner: link.uid(),
                    is_file: false,
                    len: link.len(),
                };
                if let BlobFile::Untrusted { owner } =
                    blob_layout::judge_blob_file(facts, size, writers)
                {
                    squats.report(path, owner);
                }
            }
            return Ok(false);
        }
        Err(error) => return Err(error),
    };
    let metadata = file.metadata()?;
    let facts = FileFacts {
        owner: metadata.uid(),
        is_file: metadata.is_file(),
        len: metadata.len(),
    };
    match blob_layout::judge_blob_file(facts, size, writers) {
        BlobFile::Take => {
            into.copy_from(&mut file.take(size.saturating_add(1)))?;
            Ok(true)
        }
        BlobFile::Untrusted { owner } => {
            squats.report(path, owner);
            Ok(false)
        }
        BlobFile::NotTheBlob => {
            tracing::debug!(path = ?path, ?facts, size, "a trusted writer's file is not the blob; passed over");
            Ok(false)
        }
    }
}

/// Nothing is at the path: the name, or a directory on the way to it, is missing (or is not a
/// directory).
fn absent(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENOTDIR)
}

fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_read_at_most_one_byte_past_its_size_and_never_through_a_link() {
        let state = tempfile::tempdir().unwrap();
        let (store, _) = crate::artifacts::BlobDir::open(state.path()).unwrap();
        let shared = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let writers = Writers {
            uids: &[me],
            keyed: false,
        };
        let squats = Squats::default();
        let blob = shared.path().join("blob");
        fs::write(&blob, vec![7u8; 10 << 20]).unwrap();
        let mut into = store.partial().unwrap();
        // Not the entry's size: nothing read.
        assert!(!take_file(&blob, 3, writers, &squats, &mut into).unwrap());
        assert_eq!(into.written, 0);
        // The entry's size, but the file grows while it is read: one byte past it at most.
        let mut grown = store.partial().unwrap();
        let file = open_no_follow(&blob).unwrap();
        grown.copy_from(&mut file.take(3 + 1)).unwrap();
        assert_eq!(grown.written, 4);
        assert!(!take_file(
            &shared.path().join("absent"),
            3,
            writers,
            &squats,
            &mut into
        )
        .unwrap());
        std::os::unix::fs::symlink(&blob, shared.path().join("link")).unwrap();
        assert!(!take_file(
            &shared.path().join("link"),
            10 << 20,
            writers,
            &squats,
            &mut into
        )
        .unwrap());
        assert_eq!(into.written, 0);
        // The process's own link is its own: no squatting.
        assert_eq!(squats.count(), 0);
        assert!(take_file(&blob, 10 << 20, writers, &squats, &mut into).unwrap());
        assert_eq!(into.written, 10 << 20);
    }

    #[test]
    fn a_blob_is_found_in_the_writers_directory_its_fallback_or_the_flat_name_of_old() {
        let state = tempfile::tempdir().unwrap();
        let (store, _) = crate::artifacts::BlobDir::open(state.path()).unwrap();
        let blob_dir = tempfile::tempdir().unwrap();
        let blob_dir = blob_dir.path();
        let me = nix::unistd::geteuid().as_raw();
        let writers = Writers {
            uids: &[me],
            keyed: false,
        };
        let (squats, fallbacks) = (Squats::default(), FallbackListing::default());
        let digest = "ab".repeat(32);
        let read = |fallbacks: &FallbackListing| {
            let into = store.partial().unwrap();
            read_blob(blob_dir, &digest, 3, writers, &squats, fallbacks, into)
                .unwrap()
                .map(|copied| copied.digest())
        };
        assert_eq!(read(&fallbacks), None);
        // The flat name older daemons used.
        fs::write(blob_dir.join(&digest), b"old").unwrap();
        let old = read(&fallbacks).expect("the flat blob");
        // A fallback directory, listed once the blob directory changed.
        let fallback = blob_dir.join(blob_layout::fallback_dir_name(me, 7));
        fs::create_dir(&fallback).unwrap();
        fs::write(fallback.join(&digest), b"new").unwrap();
        let new = read(&fallbacks).expect("the fallback's blob");
        assert_ne!(new, old);
        // The writer's own directory comes first.
        let own = blob_dir.join(blob_layout::own_dir_name(me));
        fs::create_dir(&own).unwrap();
        fs::write(own.join(&digest), b"own").unwrap();
        let first = read(&fallbacks).expect("the own directory's blob");
        assert!(first != new && first != old);
        assert_eq!(squats.count(), 0);
    }

    #[test]
    fn a_fifo_or_an_untrusted_owners_file_is_never_read_and_squatting_is_reported_once() {
        let state = tempfile::tempdir().unwrap();
        let (store, _) = crate::artifacts::BlobDir::open(state.path()).unwrap();
        let shared = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let squats = Squats::default();
        let fifo = shared.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let mut into = store.partial().unwrap();
        let trusting_me = Writers {
            uids: &[me],
            keyed: false,
        };
        // Opening never waits for a writer.
        assert!(!take_file(&fifo, 0, trusting_me, &squats, &mut into).unwrap());
        let file = shared.path().join("file");
        fs::write(&file, b"abc").unwrap();
        let trusting_another = Writers {
            uids: &[me.wrapping_add(1)],
            keyed: false,
        };
        for _ in 0..2 {
            assert!(!take_file(&file, 3, trusting_another, &squats, &mut into).unwrap());
        }
        assert_eq!((into.written, squats.count()), (0, 1));
    }
}
