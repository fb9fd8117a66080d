//! Reading one shared-directory file: opened safely (`shared_file`), its owner judged
//! (`trust`), parsed and MAC-checked (`format`), a read that raced a replacement tried again,
//! and each outcome counted and warned about once per file version. Also the version-1
//! whole-cache files of older daemons, read again only when their version changes.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::model::entry::Origin;
use crate::snapshot::format::{self, ParsedSnapshot};
use crate::snapshot::plan::trust::{self, Skip};
use crate::snapshot::segments::SegmentName;
use crate::snapshot::shared_file::{self, FileVersion, OpenError};

use super::{IoWorker, LoadReport, LoadedFile, Operation, Undo};

/// How often a read that raced a replacement (ENOENT, ESTALE) is tried again.
const REPLACEMENT_RETRIES: usize = 3;

/// A read of one file: its version and its entries, or why it was skipped.
pub(super) type FileRead = (FileVersion, Result<ParsedSnapshot>);

impl IoWorker {
    /// Version-1 `<node>.tunecache.json` files in the top directory.
    pub(super) fn load_v1(&mut self, include_own_v1: bool, report: &mut LoadReport) -> Result<()> {
        let Some(listing) = self.list_top(include_own_v1)? else {
            return Ok(());
        };
        for name in &listing.v1_files {
            let path = self.dir().join(name);
            if let Some(file) = self.read_v1_if_changed(&path, name) {
                report.files.push(file);
            }
        }
        self.seen.keep_only(&listing.v1_files);
        Ok(())
    }

    /// Reads one version-1 file unless this version was taken in (or skipped) before.
    fn read_v1_if_changed(&mut self, path: &Path, name: &str) -> Option<LoadedFile> {
        let (version, parsed) = match self.read_with_retries(path, self.seen.version(name)) {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                let _ = self.failed(Operation::Load, "reading", path, &error);
                return None;
            }
        };
        // Either way this version is done with: loaded now, or warned about once.
        self.seen.mark(name.to_owned(), version);
        let parsed = self.accept(path, version, parsed, false)?;
        Some(LoadedFile {
            name: name.to_owned(),
            node: parsed.node,
            origin: Origin::Learned,
            entries: parsed.entries,
            tombstones: parsed.tombstones,
            used: parsed.used,
            undo: Undo::V1(name.to_owned()),
        })
    }

    /// Counts a file read as loaded or skipped (`skipped`). `name_trusted`: the file is named
    /// after a node whose segments this daemon trusts (its own, or one it read a trusted
    /// writer's segment of), so another user's file there is squatting.
    pub(super) fn accept(
        &mut self,
        path: &Path,
        version: FileVersion,
        parsed: Result<ParsedSnapshot>,
        name_trusted: bool,
    ) -> Option<ParsedSnapshot> {
        let counters = &self.shared.counters;
        // Paths are logged escaped (`?`): a file name may hold a newline or a fake log line.
        let reason = match parsed {
            Ok(parsed) => {
                counters.peer_files_loaded.fetch_add(1, Ordering::Relaxed);
                if parsed.invalid_entries > 0 {
                    counters
                        .invalid_entries
                        .fetch_add(parsed.invalid_entries as u64, Ordering::Relaxed);
                    tracing::warn!(
                        path = ?path,
                        invalid = parsed.invalid_entries,
                        "snapshot file holds entries a Record would refuse; they are skipped"
                    );
                }
                return Some(parsed);
            }
            Err(reason) => reason,
        };
        let node = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(SegmentName::parse)
            .map(|segment| segment.node)
            .unwrap_or_default();
        self.skipped(path, &node, name_trusted, &reason, Some(version.size));
        None
    }

    /// Counts and reports a file that is not read (`trust::skip`): another user's files once
    /// per owner per hour (at info, or as squatting under a trusted name), anything else once
    /// per file version.
    pub(super) fn skipped(
        &mut self,
        path: &Path,
        node: &str,
        name_trusted: bool,
        reason: &Error,
        bytes: Option<u64>,
    ) {
        let counters = &self.shared.counters;
        let squatting = match trust::skip(reason, name_trusted) {
            Skip::OtherUser { uid } => (uid, false),
            Skip::Squatting { uid } => (uid, true),
            Skip::Warned { untrusted } => {
                counters.peer_files_skipped.fetch_add(1, Ordering::Relaxed);
                if untrusted {
                    counters.untrusted_files.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(
                    path = ?path,
                    bytes = bytes.unwrap_or(0),
                    "{reason}; skipped until the file changes"
                );
                return;
            }
        };
        let (uid, squatting) = squatting;
        counters.untrusted_files.fetch_add(1, Ordering::Relaxed);
        if squatting {
            counters.squatted_files.fetch_add(1, Ordering::Relaxed);
        }
        let Some(files) = self.owner_notices.skipped(uid, squatting, Instant::now()) else {
            tracing::debug!(path = ?path, uid, squatting, "another user's file in the shared v2/; not read");
            return;
        };
        if squatting {
            tracing::warn!(
                uid,
                node,
                files,
                example = ?path,
                "files owned by uid {uid}, not an allowed writer, are named after node {node:?}, \
                 whose segments this daemon trusts: name squatting, never read (Stats \
                 snapshot_squatted_files counts them; said once per owner an hour)"
            );
        } else {
            tracing::info!(
                uid,
                files,
                "files of uid {uid} in the shared v2/ are another user's cache; not read \
                 (Stats snapshot_untrusted_files counts them; said once per owner an hour)"
            );
        }
    }

    /// Who owns a segment, as `lstat` sees it, judged (`trust::judge_owner`) without opening
    /// it: another user's file may not even be readable (mode 0600). `Ok(None)` when it is
    /// gone.
    pub(super) fn judge_segment_owner(
        &self,
        segment: &SegmentName,
    ) -> io::Result<Option<Result<()>>> {
        let path = self.segment_dir().join(segment.file_name());
        match fs::symlink_metadata(&path) {
            Ok(metadata) => Ok(Some(trust::judge_owner(
                metadata.uid(),
                self.writers(),
                self.shared_by_users.get(),
            ))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reads a file, retrying when a replacement raced the read (ENOENT, or ESTALE on NFS).
    /// `Ok(None)` when its version is `seen`.
    fn read_with_retries(
        &self,
        path: &Path,
        seen: Option<FileVersion>,
    ) -> io::Result<Option<FileRead>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.read_new_version(path, seen) {
                Err(error) if is_replacement_race(&error) && attempt <= REPLACEMENT_RETRIES => {
                    std::thread::sleep(Duration::from_millis(20 * attempt as u64));
                }
                outcome => return outcome,
            }
        }
    }

    /// `Ok(None)` when the file is the version `seen`. Otherwise the version read and either
    /// its entries or why it was skipped (refused by type, size or owner, or damaged).
    fn read_new_version(
        &self,
        path: &Path,
        seen: Option<FileVersion>,
    ) -> io::Result<Option<FileRead>> {
        // lstat: a symlink's version is the link's own, so it is refused once, not per pass.
        let metadata = fs::symlink_metadata(path)?;
        let version = FileVersion::of(&metadata);
        if seen == Some(version) {
            return Ok(None);
        }
        // Another user's file is judged before it is opened: it may be theirs alone (0600).
        // The owner is judged again on the opened file (it may have been replaced since).
        if let Err(refused) =
            trust::judge_owner(metadata.uid(), self.writers(), self.shared_by_users.get())
        {
            return Ok(Some((version, Err(refused))));
        }
        let settings = &self.shared.settings;
        let max_bytes = settings.max_file_bytes;
        let opened = match shared_file::open(path, max_bytes) {
            Ok(opened) => opened,
            Err(OpenError::Io(error)) => return Err(error),
            Err(OpenError::Refused(refusal, refused_version)) => {
                let error = Error::SnapshotFormat(refusal.to_string());
                return Ok(Some((refused_version.unwrap_or(version), Err(error))));
            }
        };
        // The version of what is actually read, which may be newer than the lstat above.
        let version = opened.version;
        if let Err(refused) =
            trust::judge_owner(opened.owner, self.writers(), self.shared_by_users.get())
        {
            return Ok(Some((version, Err(refused))));
        }
        let reader = opened.reader(max_bytes, Arc::clone(&self.shared.counters.bytes_read));
        let parsed = format::read_authenticated(reader, settings.key.as_ref());
        Ok(Some((version, parsed)))
    }

    /// Reads a segment and checks that it says inside what its name says.
    pub(super) fn read_segment(&self, segment: &SegmentName) -> io::Result<Option<FileRead>> {
        let path = self.segment_dir().join(segment.file_name());
        let read = self.read_with_retries(&path, None)?;
        Ok(read.map(|(version, parsed)| {
            let parsed = parsed.and_then(|parsed| trust::agrees_with_name(parsed, segment));
            (version, parsed)
        }))
    }
}

fn is_replacement_race(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESTALE)
}
