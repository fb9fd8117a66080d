//! Replacing the journal file (compaction, the clean rewrite after damage, the first start),
//! by the one protocol in the module doc of `journal`: write the new file and sync it, keep
//! its handle as the append handle, rename it over `journal`, check by path that `journal`
//! now names that handle's inode, sync the directory.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::fsx::atomic::{Durability, TempFile, TempOptions};
use crate::model::entry::Origin;
use crate::model::forget::Tombstone;
use crate::wire::stored::StoredEntry;

use super::frame::{encode_frames, encode_tombstone_frames};
use super::{file_id, journal_path, FileId, FsyncPolicy, Journal};

/// How a replacement failed.
pub(super) enum ReplaceError {
    /// Before the rename took effect: `journal` still names the old file.
    NotRenamed(Error),
    /// `journal` names neither the old nor the new file, or cannot be checked.
    Unknown(Error),
}

pub(super) fn sync_dir(dir_handle: &File, dir: &Path) -> Result<()> {
    dir_handle
        .sync_all()
        .map_err(|e| Error::io("syncing the state directory", dir, e))
}

/// Writes `bytes` to a fresh `journal.compacting`, synced per `fsync`. Its handle is the
/// append handle of the journal-to-be: nothing needs opening after the rename.
fn write_new_file(
    path: &Path,
    bytes: &[u8],
    fsync: FsyncPolicy,
) -> std::io::Result<(TempFile, FileId)> {
    let options = TempOptions {
        append: true,
        replace_stale: true,
        ..TempOptions::default()
    };
    let mut temp = TempFile::create(path, options)?;
    temp.file().write_all(bytes)?;
    temp.sync(if fsync != FsyncPolicy::Never {
        Durability::All
    } else {
        Durability::None
    })?;
    let id = file_id(&temp.file().metadata()?);
    Ok((temp, id))
}

/// Steps one to three of a replacement: the new file written and synced, renamed over
/// `journal`, and `journal` checked by path (stat, no descriptor) to name the new file.
/// `old` is the file appends go to now, if any.
pub(super) fn place_new_journal(
    dir: &Path,
    bytes: &[u8],
    fsync: FsyncPolicy,
    old: Option<FileId>,
) -> std::result::Result<(File, FileId), ReplaceError> {
    let path = journal_path(dir);
    let tmp_path = dir.join("journal.compacting");
    // A failed write removes the temporary file (`TempFile`'s drop).
    let (mut temp, new_id) = write_new_file(&tmp_path, bytes, fsync).map_err(|e| {
        ReplaceError::NotRenamed(Error::io("writing the new journal", &tmp_path, e))
    })?;
    let renamed = temp.rename_over(&path);
    // Whatever rename said, what counts is which file the path names now.
    let at_path = std::fs::symlink_metadata(&path).map(|m| file_id(&m));
    match (at_path, renamed) {
        (Ok(id), _) if id == new_id => Ok((temp.into_file(), new_id)),
        // Not renamed: dropping `temp` removes it.
        (Ok(id), Err(error)) if Some(id) == old => Err(ReplaceError::NotRenamed(Error::io(
            "renaming the new journal into place",
            &path,
            error,
        ))),
        (Err(error), Err(_)) if old.is_none() && error.kind() == ErrorKind::NotFound => {
            Err(ReplaceError::NotRenamed(Error::io(
                "renaming the new journal into place",
                &path,
                error,
            )))
        }
        // Unknown: the temporary file is left where it is, as it may be the journal.
        (Ok(_), _) => {
            drop(temp.into_file());
            Err(ReplaceError::Unknown(Error::io(
                "checking the journal after renaming it into place",
                &path,
                std::io::Error::other("the path names neither the old nor the new journal file"),
            )))
        }
        (Err(error), _) => {
            drop(temp.into_file());
            Err(ReplaceError::Unknown(Error::io(
                "checking the journal after renaming it into place",
                &path,
                error,
            )))
        }
    }
}

impl ReplaceError {
    pub(super) fn into_error(self) -> Error {
        match self {
            ReplaceError::NotRenamed(error) | ReplaceError::Unknown(error) => error,
        }
    }
}

impl Journal {
    /// Replaces the journal with one holding exactly `live` (the replacement protocol in
    /// the module doc). A crash at any point leaves the old or the new journal. On error:
    /// before the rename, appends go on to the old file, still in place; after it, appends
    /// go to the new file, or, where the path cannot be shown to name it, are refused until
    /// a later rewrite succeeds. A success makes a journal that refused appends writable.
    pub fn rewrite<'a>(
        &mut self,
        live: impl Iterator<Item = (&'a StoredEntry, Origin)>,
        tombstones: &[(Tombstone, Origin)],
    ) -> Result<()> {
        let mut bytes = encode_frames(live, self.limits)?;
        encode_tombstone_frames(tombstones, self.limits, &mut bytes)?;
        let (file, id) = match place_new_journal(&self.dir, &bytes, self.fsync, Some(self.file_id))
        {
            Ok(placed) => placed,
            Err(ReplaceError::NotRenamed(error)) => return Err(error),
            Err(ReplaceError::Unknown(error)) => {
                self.mark_unwritable(error.to_string());
                return Err(error);
            }
        };
        // The path names the new file: from here on appends go to it, whatever fails next.
        self.file = file;
        self.file_id = id;
        self.len = bytes.len() as u64;
        self.unsynced = false;
        self.last_sync = Instant::now();
        self.unwritable = None;
        self.damaged = false;
        self.dir_sync_pending = false;
        if self.fsync != FsyncPolicy::Never {
            if let Err(error) = sync_dir(&self.dir_handle, &self.dir) {
                self.dir_sync_pending = true;
                return Err(error);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::test_support::*;

    #[test]
    fn rewrite_keeps_exactly_the_live_entries() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _, _| {}).unwrap();
        for i in 0..10 {
            journal.append(&[entry(i)]).unwrap();
        }
        let live = [entry(3), entry(7)];
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        journal.append(&[entry(8)]).unwrap();
        drop(journal);
        let (seen, report) = replay(dir.path());
        assert_eq!(seen, vec![entry(3), entry(7), entry(8)]);
        assert!(report.skipped.is_empty() && report.torn_tail.is_none());
    }

    #[test]
    fn after_a_rewrite_appends_go_to_the_file_the_path_names() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Batch, |_, _, _, _| {}).unwrap();
        for round in 0..3 {
            journal.append(&[entry(round)]).unwrap();
            let live = [entry(round)];
            journal
                .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
                .unwrap();
            let at_path = std::fs::metadata(journal_path(dir.path())).unwrap();
            assert_eq!(
                file_id(&at_path),
                file_id(&journal.file.metadata().unwrap())
            );
            assert!(journal.unwritable().is_none());
        }
        journal.append(&[entry(9)]).unwrap();
        drop(journal);
        let (seen, _) = replay(dir.path());
        assert_eq!(seen, vec![entry(2), entry(9)]);
        assert!(!dir.path().join("journal.compacting").exists());
    }

    #[test]
    fn a_rewrite_that_cannot_write_its_new_file_leaves_appends_on_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        // A directory where the new file must go: creating it fails before any rename.
        std::fs::create_dir(dir.path().join("journal.compacting")).unwrap();
        std::fs::write(dir.path().join("journal.compacting/x"), b"x").unwrap();
        let live = [entry(1)];
        assert!(journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .is_err());
        assert!(journal.unwritable().is_none());
        journal.append(&[entry(2)]).unwrap();
        drop(journal);
        let (seen, _) = replay(dir.path());
        assert_eq!(seen, vec![entry(1), entry(2)]);
    }

    #[test]
    fn a_rename_that_leaves_the_path_naming_neither_file_refuses_appends() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        // `journal` becomes a non-empty directory: the rename fails, and the path names
        // neither the old file nor the new one.
        let path = journal_path(dir.path());
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"x").unwrap();
        let live = [entry(1)];
        assert!(journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .is_err());
        assert!(journal.needs_rewrite());
        assert!(journal.append(&[entry(2)]).is_err());
        std::fs::remove_dir_all(&path).unwrap();
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        journal.append(&[entry(3)]).unwrap();
        drop(journal);
        assert_eq!(replay(dir.path()).0, vec![entry(1), entry(3)]);
    }
}
