//! Appends: entries, last uses and tombstones written as frames at the end of the journal, synced per
//! `--fsync`, and the checks that make the journal refuse appends (so Records are refused,
//! not acknowledged) until a rewrite succeeds: the path no longer names the file, a sync
//! failed, or a failed append could not be cut back.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::model::entry::Origin;
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;
use crate::wire::stored::StoredEntry;

use super::frame::{encode_frames, encode_last_use_frames, encode_tombstone_frames};
use super::replace::sync_dir;
#[cfg(any(test, feature = "test-support"))]
use super::JournalEntry;
use super::{file_id, journal_path, FsyncPolicy, Journal, BATCH_SYNC_INTERVAL};

impl Journal {
    /// Checks by path (a stat, no descriptor) that `journal` still names the file appends go
    /// to. If it was deleted or replaced behind the daemon's back, appends are refused until
    /// a rewrite puts the journal back, rather than acknowledged into a file with no name.
    pub fn check_path(&mut self) {
        if self.unwritable.is_some() {
            return;
        }
        let path = journal_path(&self.dir);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if file_id(&meta) == self.file_id => {}
            Ok(_) => self.mark_unwritable(format!(
                "{} no longer names the file the daemon appends to",
                path.display()
            )),
            Err(error) => {
                self.mark_unwritable(format!("{} cannot be checked: {error}", path.display()))
            }
        }
    }

    pub(super) fn mark_unwritable(&mut self, reason: String) {
        self.unwritable.get_or_insert(reason);
    }

    /// Refuses when the journal cannot take an append; retries a pending directory sync.
    fn ensure_writable(&mut self) -> Result<()> {
        if let Some(reason) = &self.unwritable {
            return Err(Error::JournalWrite(Arc::new(Error::JournalUnwritable {
                reason: reason.clone(),
                source: None,
            })));
        }
        if self.dir_sync_pending {
            sync_dir(&self.dir_handle, &self.dir).map_err(|error| {
                Error::JournalWrite(Arc::new(Error::JournalUnwritable {
                    reason: format!("the rename of the new journal is not durable yet: {error}"),
                    source: Some(Box::new(error)),
                }))
            })?;
            self.dir_sync_pending = false;
        }
        Ok(())
    }

    /// `append_stored` for decoded entries, as the tests write them.
    #[cfg(any(test, feature = "test-support"))]
    pub fn append(&mut self, entries: &[JournalEntry]) -> Result<u64> {
        let stored: Vec<(StoredEntry, Origin)> = entries
            .iter()
            .map(|(key, result, origin)| (StoredEntry::new(key, result), *origin))
            .collect();
        self.append_stored(&stored)
    }

    /// Appends entries (in wire form, the store's: their records are copied) as one or more
    /// frames and syncs according to the policy. On failure the file is cut back to where it
    /// was, so a failed write leaves no partial frame; if that or a sync fails, the journal
    /// refuses appends until it is rewritten.
    pub fn append_stored(&mut self, entries: &[(StoredEntry, Origin)]) -> Result<u64> {
        self.ensure_writable()?;
        let bytes = encode_frames(
            entries.iter().map(|(entry, origin)| (entry, *origin)),
            self.limits,
        )?;
        self.append_bytes(bytes)
    }

    /// Appends a group's entries and the last uses it raised (each entry's key, with the day)
    /// as frames in one write, like `append_stored`.
    pub fn append_changes(
        &mut self,
        entries: &[(StoredEntry, Origin)],
        uses: &[(StoredEntry, Day, Origin)],
    ) -> Result<u64> {
        self.ensure_writable()?;
        let mut bytes = encode_frames(
            entries.iter().map(|(entry, origin)| (entry, *origin)),
            self.limits,
        )?;
        encode_last_use_frames(uses, self.limits, &mut bytes);
        self.append_bytes(bytes)
    }

    /// Appends tombstones as frames, like `append_stored`.
    pub fn append_tombstones(&mut self, tombstones: &[(Tombstone, Origin)]) -> Result<u64> {
        self.ensure_writable()?;
        let mut bytes = Vec::new();
        encode_tombstone_frames(tombstones, self.limits, &mut bytes)?;
        self.append_bytes(bytes)
    }

    fn append_bytes(&mut self, bytes: Vec<u8>) -> Result<u64> {
        let path = journal_path(&self.dir);
        if let Err(error) = self.file.write_all(&bytes) {
            if let Err(cut) = self.file.set_len(self.len) {
                self.mark_unwritable(format!(
                    "a failed append ({error}) could not be cut back: {cut}"
                ));
            }
            return Err(Error::io("appending to journal", path, error));
        }
        self.len += bytes.len() as u64;
        self.unsynced = true;
        let sync_now = match self.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Batch => self.last_sync.elapsed() >= BATCH_SYNC_INTERVAL,
            FsyncPolicy::Never => false,
        };
        if sync_now {
            if let Err(error) = self.sync() {
                // Not acknowledged: take the frames back out (best effort; the journal is
                // rewritten from memory before the next append anyway).
                self.len -= bytes.len() as u64;
                let _ = self.file.set_len(self.len);
                return Err(error);
            }
        }
        Ok(bytes.len() as u64)
    }

    /// Whether data is waiting for a `--fsync batch` sync.
    pub fn sync_pending(&self) -> bool {
        self.unsynced && self.fsync == FsyncPolicy::Batch
    }

    /// Forces written data to stable storage (unless the policy is `never`). A failed sync
    /// makes the journal refuse appends until it is rewritten: after a failed fsync the
    /// kernel may have dropped the unsynced pages, and a later fsync would not say so.
    pub fn sync(&mut self) -> Result<()> {
        if self.unsynced && self.fsync != FsyncPolicy::Never {
            if let Err(error) = self.file.sync_data() {
                let error = Error::io("syncing journal", journal_path(&self.dir), error);
                self.mark_unwritable(error.to_string());
                return Err(error);
            }
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::test_support::*;
    use crate::model::forget::{ForgetScope, RankScope};

    #[test]
    fn tombstones_survive_appends_and_rewrites_with_their_provenance() {
        let dir = tempfile::tempdir().unwrap();
        let scope = |problem: &str, rank| ForgetScope {
            namespace: "ns".into(),
            op: "op".into(),
            device: String::new(),
            problem: problem.into(),
            rank,
        };
        let own = Tombstone {
            scope: scope("", RankScope::Every),
            stamp: 7 << 16,
        };
        let learned = Tombstone {
            scope: scope("p1", RankScope::Rank(3)),
            stamp: 9 << 16,
        };
        {
            let (mut journal, _) =
                Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
            journal.append(&[entry(1)]).unwrap();
            journal
                .append_tombstones(&[
                    (own.clone(), Origin::Own),
                    (learned.clone(), Origin::Learned),
                ])
                .unwrap();
        }
        let (seen, report) = replay(dir.path());
        assert_eq!(seen.len(), 1);
        let expected = vec![
            (own.clone(), Origin::Own),
            (learned.clone(), Origin::Learned),
        ];
        assert_eq!(report.tombstones, expected);
        {
            let (mut journal, _) =
                Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
            journal
                .rewrite(stored(&[entry(2)]).iter().map(|(e, o)| (e, *o)), &expected)
                .unwrap();
        }
        let (seen, report) = replay(dir.path());
        assert_eq!(seen.len(), 1, "the rewrite holds what it was given");
        assert_eq!(report.tombstones, expected);
    }

    #[test]
    fn a_journal_deleted_behind_its_back_refuses_appends_until_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        std::fs::remove_file(journal_path(dir.path())).unwrap();
        journal.check_path();
        assert!(journal.needs_rewrite());
        let refused = journal.append(&[entry(2)]).unwrap_err().to_string();
        assert!(refused.contains("not writable"), "{refused}");
        let live = [entry(1)];
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        assert!(journal.unwritable().is_none());
        journal.append(&[entry(3)]).unwrap();
        drop(journal);
        assert_eq!(replay(dir.path()).0, vec![entry(1), entry(3)]);
    }
}
