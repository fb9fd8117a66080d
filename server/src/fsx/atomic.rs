//! Putting a file in place whole, or not at all: written under a temporary name in the target's
//! own directory, synced, renamed (or linked) over the target, the directory synced. A crash
//! or a failed step at any point leaves the old file (or none) under the target's name, never
//! a part of the new one; a `TempFile` dropped before it is placed removes its temporary file.
//!
//! Every such write of the daemon goes through here: the journal's replacement, the shared
//! directory's segments and blobs, the resume points of the two tiers, this node's blob store.
//! The temporary names stay the callers' own (readers skip them by name: `.seg.tmp.`, blob
//! temps, `journal.compacting`).

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How a temporary file's contents are made durable before it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Not synced (the caller's fsync setting is off).
    None,
    /// `fdatasync`: the data and the length.
    Data,
    /// `fsync`: data and metadata.
    All,
}

/// How a temporary file is created.
#[derive(Clone, Copy, Debug, Default)]
pub struct TempOptions {
    /// The mode it is created with (under the umask); `None`, 0666 under the umask.
    pub mode: Option<u32>,
    /// Whether `mode` is then set exactly, whatever the umask.
    pub exact_mode: bool,
    /// Refuse to open a symbolic link at the temporary name (`O_NOFOLLOW`).
    pub nofollow: bool,
    /// Open for appending (a handle that goes on being written after it is placed).
    pub append: bool,
    /// Remove whatever a killed writer left at the temporary name first.
    pub replace_stale: bool,
}

/// A temporary file on its way to its name; removed when dropped before it is placed.
#[derive(Debug)]
pub struct TempFile {
    file: File,
    name: TempName,
}

/// The temporary name, removed on drop unless the file was placed (or handed over).
#[derive(Debug)]
struct TempName {
    /// Empty once placed: nothing to remove.
    path: PathBuf,
}

impl Drop for TempName {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl TempFile {
    /// Creates `path`, which must not exist (unless `replace_stale`), as `options` says.
    pub fn create(path: &Path, options: TempOptions) -> io::Result<TempFile> {
        if options.replace_stale {
            match std::fs::remove_file(path) {
                Err(error) if error.kind() != ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        let mut open = OpenOptions::new();
        open.create_new(true).mode(options.mode.unwrap_or(0o666));
        if options.append {
            open.append(true);
        } else {
            open.write(true);
        }
        if options.nofollow {
            open.custom_flags(libc::O_NOFOLLOW);
        }
        let file = open.open(path)?;
        let temp = TempFile::adopt(path.to_owned(), file);
        if let (true, Some(mode)) = (options.exact_mode, options.mode) {
            temp.set_mode(mode)?;
        }
        Ok(temp)
    }

    /// Takes over a temporary file made elsewhere (a unique name from `tempfile`).
    pub fn adopt(path: PathBuf, file: File) -> TempFile {
        TempFile {
            file,
            name: TempName { path },
        }
    }

    /// The file, to write its contents.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Sets exactly `mode`, whatever the umask.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode))
    }

    /// Makes what was written durable, as `durability` says.
    pub fn sync(&self, durability: Durability) -> io::Result<()> {
        match durability {
            Durability::None => Ok(()),
            Durability::Data => self.file.sync_data(),
            Durability::All => self.file.sync_all(),
        }
    }

    /// Renames it over `target` (replacing what is there). On success it is placed: nothing
    /// is removed on drop and its handle stays usable (`into_file`); on failure it is still
    /// temporary.
    pub fn rename_over(&mut self, target: &Path) -> io::Result<()> {
        std::fs::rename(&self.name.path, target)?;
        self.name.path = PathBuf::new();
        Ok(())
    }

    /// Links it in as `target`, which must not exist (`AlreadyExists` if it does: unlike a
    /// rename, a link never replaces another writer's file), then removes the temporary name.
    pub fn link_as(&mut self, target: &Path) -> io::Result<()> {
        std::fs::hard_link(&self.name.path, target)?;
        let _ = std::fs::remove_file(&self.name.path);
        self.name.path = PathBuf::new();
        Ok(())
    }

    /// The open handle; a temporary name not placed is left where it is.
    pub fn into_file(self) -> File {
        let TempFile { file, mut name } = self;
        name.path = PathBuf::new();
        file
    }
}

/// Syncs a directory, so the names in it (a rename, a link) are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// How `write_whole` writes.
#[derive(Clone, Copy, Debug)]
pub struct WholeFile<'a> {
    /// The temporary name, in the target's directory.
    pub temp: &'a Path,
    pub options: TempOptions,
    pub durability: Durability,
    /// Whether the directory is synced after the rename.
    pub sync_dir: bool,
}

/// Writes `bytes` as `target`, whole: to `how.temp`, synced, renamed over `target`, the
/// directory synced. On any failure the temporary file is gone and `target` is as it was.
pub fn write_whole(target: &Path, bytes: &[u8], how: WholeFile<'_>) -> io::Result<()> {
    let mut temp = TempFile::create(how.temp, how.options)?;
    temp.file().write_all(bytes)?;
    temp.sync(how.durability)?;
    temp.rename_over(target)?;
    if how.sync_dir {
        if let Some(dir) = target.parent() {
            sync_dir(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })?;
        }
    }
    Ok(())
}

/// A tier's resume point (its state-directory record of how far it got): `temp` replaced if
/// a killed writer left it, default mode, data synced and the directory synced when `sync`.
pub fn resume_point(temp: &Path, sync: bool) -> WholeFile<'_> {
    WholeFile {
        temp,
        options: TempOptions {
            replace_stale: true,
            ..TempOptions::default()
        },
        durability: if sync {
            Durability::Data
        } else {
            Durability::None
        },
        sync_dir: sync,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn whole<'a>(temp: &'a Path, mode: Option<u32>) -> WholeFile<'a> {
        WholeFile {
            temp,
            options: TempOptions {
                mode,
                exact_mode: mode.is_some(),
                replace_stale: true,
                ..TempOptions::default()
            },
            durability: Durability::All,
            sync_dir: true,
        }
    }

    #[test]
    fn a_whole_write_replaces_the_file_with_the_mode_asked_for_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let (target, temp) = (dir.path().join("f"), dir.path().join("f.tmp"));
        std::fs::write(&target, b"old").unwrap();
        write_whole(&target, b"new", whole(&temp, Some(0o640))).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o640);
        assert_eq!(names(dir.path()), ["f"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_whole_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let (target, temp) = (dir.path().join("f"), dir.path().join("f.tmp"));
        std::fs::write(&target, b"old").unwrap();
        // A crash-equivalent: the write fails after the temporary file has bytes in it.
        let failed = (|| -> io::Result<()> {
            let mut file = TempFile::create(&temp, whole(&temp, None).options)?;
            file.file().write_all(b"half of the n")?;
            Err(io::Error::other("the disk filled up"))
        })();
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["f"]);
        // A rename that fails (the target is a non-empty directory) also leaves no temp.
        let blocked = dir.path().join("d");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"x").unwrap();
        assert!(write_whole(&blocked, b"new", whole(&temp, None)).is_err());
        assert_eq!(names(dir.path()), ["d", "f"]);
    }

    #[test]
    fn a_stale_temp_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join("t");
        std::fs::write(&temp, b"stale").unwrap();
        let error = TempFile::create(&temp, TempOptions::default()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::AlreadyExists);
        let options = TempOptions {
            replace_stale: true,
            ..TempOptions::default()
        };
        let _file = TempFile::create(&temp, options).unwrap();
        assert_eq!(std::fs::metadata(&temp).unwrap().len(), 0);
    }

    #[test]
    fn a_link_never_replaces_and_a_placed_handle_stays_open() {
        let dir = tempfile::tempdir().unwrap();
        let (target, temp) = (dir.path().join("seg"), dir.path().join(".seg.tmp"));
        std::fs::write(&target, b"theirs").unwrap();
        let mut file = TempFile::create(&temp, TempOptions::default()).unwrap();
        file.file().write_all(b"ours").unwrap();
        assert_eq!(
            file.link_as(&target).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        drop(file);
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        assert_eq!(names(dir.path()), ["seg"]);

        let options = TempOptions {
            append: true,
            ..TempOptions::default()
        };
        let mut file = TempFile::create(&temp, options).unwrap();
        file.file().write_all(b"a").unwrap();
        file.rename_over(&target).unwrap();
        let mut handle = file.into_file();
        handle.write_all(b"b").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"ab");
        assert_eq!(names(dir.path()), ["seg"]);
    }
}
