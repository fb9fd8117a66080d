//! The shared directory itself: `v2/` looked at before each use (and made when missing, with
//! the mode `trust` says, unless that is the administrator's to do), both directories listed,
//! and temp files of writers that crashed removed.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result};
use crate::snapshot::plan::listing::{self, SegmentListing, TopListing};
use crate::snapshot::plan::trust::{self, DirFacts, DirVerdict, MissingDir, Writers};

use super::{IoWorker, Operation};

impl IoWorker {
    pub(super) fn writers(&self) -> Writers<'_> {
        let settings = &self.shared.settings;
        Writers {
            uids: &settings.writer_uids,
            keyed: settings.key.is_some(),
        }
    }

    /// What to do about a missing `v2/`: by this daemon's uid and the top directory's mode.
    pub(super) fn missing_segment_dir(&self) -> MissingDir {
        let top_mode = fs::metadata(self.dir()).ok().map(|top| top.mode());
        trust::missing_segment_dir(nix::unistd::geteuid().is_root(), top_mode)
    }

    /// Why this daemon leaves the missing `v2/` to the administrator.
    fn left_to_admin(&self) -> String {
        let top_mode = fs::metadata(self.dir()).map_or(0, |top| top.mode());
        trust::left_to_admin_message(&self.segment_dir(), self.dir(), top_mode)
    }

    /// Checks `v2/` (`trust::judge_segment_dir`); creates it when missing. `Ok(false)`: it is
    /// missing and could not be made (read-only, full), which the publish that needs it
    /// reports.
    pub(super) fn check_segment_dir(&self, operation: Operation) -> Result<bool> {
        let dir = self.segment_dir();
        let metadata = match fs::symlink_metadata(&dir) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // No node has published a segment yet.
                let mode = match self.missing_segment_dir() {
                    MissingDir::Create { mode } => mode,
                    MissingDir::LeaveToAdmin => {
                        let why = self.left_to_admin();
                        self.shared.refused(&why);
                        return Err(Error::SharedDirUnsafe(why));
                    }
                };
                let created = fs::DirBuilder::new()
                    .mode(mode)
                    .create(&dir)
                    .and_then(|()| {
                        // The umask may have cleared bits of the mode asked for.
                        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                    });
                return match created {
                    Ok(()) => self.check_segment_dir(operation),
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                        self.check_segment_dir(operation)
                    }
                    Err(error) => {
                        tracing::debug!(dir = ?dir, %error, "segment directory not created");
                        Ok(false)
                    }
                };
            }
            Err(error) => return Err(self.failed(operation, "checking", &dir, &error)),
        };
        let facts = DirFacts {
            is_symlink: metadata.file_type().is_symlink(),
            is_dir: metadata.is_dir(),
            owner: metadata.uid(),
            mode: metadata.mode() & 0o7777,
        };
        match trust::judge_segment_dir(facts, self.writers()) {
            DirVerdict::Usable { shared_by_users } => {
                self.shared_by_users.set(shared_by_users);
                Ok(true)
            }
            DirVerdict::Unsafe(why) => {
                self.shared_by_users.set(false);
                let message = format!(
                    "refusing to use {dir:?} (owner uid {}, mode {:04o}): it {why}",
                    facts.owner, facts.mode
                );
                self.shared.refused(&message);
                Err(Error::SharedDirUnsafe(message))
            }
        }
    }

    /// Lists the top directory and removes stale version-1 temp files; `None` when it did
    /// not exist (it is created: the first node on a fresh shared directory).
    pub(super) fn list_top(&self, include_own_v1: bool) -> Result<Option<TopListing>> {
        let dir = self.dir();
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(dir)
                    .map_err(|e| self.failed(Operation::Load, "creating", dir, &e))?;
                return Ok(None);
            }
            Err(error) => return Err(self.failed(Operation::Load, "listing", dir, &error)),
        };
        let names = names_in(entries)
            .map_err(|error| self.failed(Operation::Load, "listing", dir, &error))?;
        let listing = listing::top_listing(names, self.node(), include_own_v1);
        for temp in &listing.temps {
            remove_if_stale(&dir.join(temp));
        }
        Ok(Some(listing))
    }

    /// Lists `DIR/v2` once it passes its check, removes stale temp files, and groups the
    /// segments by node.
    pub(super) fn list_segments(
        &self,
    ) -> Result<std::collections::BTreeMap<String, crate::snapshot::segments::NodeSegments>> {
        let dir = self.segment_dir();
        if !self.check_segment_dir(Operation::Load)? {
            return Ok(Default::default());
        }
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(Default::default());
            }
            Err(error) => return Err(self.failed(Operation::Load, "listing", &dir, &error)),
        };
        let names = names_in(entries)
            .map_err(|error| self.failed(Operation::Load, "listing", &dir, &error))?;
        let SegmentListing { by_node, temps } = listing::segment_listing(names);
        for temp in &temps {
            remove_if_stale(&dir.join(temp));
        }
        Ok(by_node)
    }
}

/// The UTF-8 names listed (no other name is ever this daemon's).
fn names_in(entries: fs::ReadDir) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for dirent in entries {
        if let Ok(name) = dirent?.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes a temp file left by a writer that crashed (`listing::is_stale`).
fn remove_if_stale(path: &Path) {
    let age = fs::symlink_metadata(path)
        .and_then(|metadata| metadata.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok());
    if listing::is_stale(age) {
        match fs::remove_file(path) {
            Ok(()) => {
                tracing::info!(path = ?path, "removed a crashed writer's temp file")
            }
            Err(error) => tracing::debug!(path = ?path, %error, "temp file not removed"),
        }
    }
}
