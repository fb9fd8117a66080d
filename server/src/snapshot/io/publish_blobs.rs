//! Publishing blobs from the I/O thread: before a segment, the blobs its entries name and
//! every blob an earlier publish could not; at the first publish of a run, every blob this
//! node's contributions name that its writer directory lacks (one listing); after a segment,
//! any that a sweep renamed meanwhile. A blob that cannot be published is reported
//! (`Shared::blobs_failed`: counted, named, logged once per cause, health down) and retried
//! every pass; it never holds back a segment.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;

use crate::snapshot::blobs;
use crate::tiers::PublishedBlobs;
use crate::wire::stored::EntryMap;

use super::IoWorker;

impl IoWorker {
    /// Links in the blobs `entries` name and every blob still pending; with `afresh`, looks
    /// again at each one `entries` name (not at the pending ones) even if it was published
    /// before. Answers how many it linked, `None` when the blob directory could not be used.
    pub(super) fn publish_blobs(&mut self, entries: &EntryMap, afresh: bool) -> Option<usize> {
        let artifacts = Arc::clone(&self.shared.artifacts);
        let mut digests = BTreeSet::new();
        for entry in entries.iter() {
            for artifact in entry.result().artifacts.iter() {
                if !(afresh && self.blobs_pending.contains(artifact.sha256)) {
                    digests.insert(artifact.sha256.to_owned());
                }
            }
        }
        if !afresh {
            digests.extend(self.blobs_pending.iter().cloned());
        }
        if digests.is_empty() {
            // Nothing named yet: a later segment's entries bring what there is to look at.
            self.blobs_seeded |= !afresh;
            return Some(0);
        }
        let uid = nix::unistd::geteuid().as_raw();
        let squats = &self.shared.squats;
        let modes = self.written_modes();
        let (dir_mode, file_mode) = modes.map_or((0o755, 0o644), |m| (m.dir, m.file));
        let dir = match blobs::check_blob_dir(&self.segment_dir(), self.writers(), squats)
            .and_then(|blob_dir| blobs::writer_dir(&blob_dir, uid, dir_mode, squats))
        {
            Ok(dir) => dir,
            Err(trouble) => {
                let message = with_count(trouble.message(), digests.len());
                self.blobs_pending.extend(digests);
                self.shared.blobs_failed(&message, &trouble.cause());
                return None;
            }
        };
        if !self.blobs_seeded {
            // What earlier runs linked in: one listing, not a look at each blob.
            self.blobs_seeded = true;
            self.blobs_published.mark_all(digests_in(&dir));
        }
        let (fsync, node) = (self.shared.settings.fsync, self.node().to_owned());
        let mut looked_afresh = PublishedBlobs::default();
        let published = if afresh {
            &mut looked_afresh
        } else {
            &mut self.blobs_published
        };
        let outcome = blobs::link_missing(
            &dir,
            digests.iter().map(String::as_str),
            &artifacts,
            published,
            file_mode,
            fsync,
            &node,
        );
        for digest in &digests {
            self.blobs_pending.remove(digest);
        }
        let failed = outcome.failed.len();
        if let Some((digest, trouble)) = outcome.failed.first() {
            let message = with_count(trouble.message(digest), failed);
            self.shared.blobs_failed(&message, &trouble.cause());
            self.blobs_pending
                .extend(outcome.failed.into_iter().map(|(digest, _)| digest));
        } else if self.blobs_pending.is_empty() {
            self.shared.blobs_all_published();
        }
        Some(outcome.linked)
    }

    /// Drops the pending blobs that no contribution in `own` names any more (its entry was
    /// forgotten): there is nothing left to publish them for.
    pub(super) fn prune_pending_blobs(&mut self, own: &EntryMap) {
        if self.blobs_pending.is_empty() {
            return;
        }
        let mut named = HashSet::new();
        for entry in own.iter() {
            for artifact in entry.result().artifacts.iter() {
                if self.blobs_pending.contains(artifact.sha256) {
                    named.insert(artifact.sha256.to_owned());
                }
            }
        }
        self.blobs_pending.retain(|digest| named.contains(digest));
        if self.blobs_pending.is_empty() {
            self.shared.blobs_all_published();
        }
    }

    /// Whether a publish has blobs to look at although no segment is due: some are pending,
    /// or this run has not yet looked at what its contributions name.
    pub(super) fn blobs_due(&self) -> bool {
        !self.blobs_seeded || !self.blobs_pending.is_empty()
    }
}

/// `message`, saying how many blobs in all it held back.
fn with_count(message: String, blobs: usize) -> String {
    if blobs > 1 {
        format!("{message} ({blobs} blobs not published)")
    } else {
        message
    }
}

/// The blob names in `dir` (nothing when it cannot be listed: each is then looked at).
fn digests_in(dir: &Path) -> Vec<String> {
    let Ok(listing) = fs::read_dir(dir) else {
        return Vec::new();
    };
    listing
        .filter_map(|item| item.ok()?.file_name().into_string().ok())
        .filter(|name| {
            matches!(
                crate::snapshot::plan::blob_sweep::classify(name, ""),
                crate::snapshot::plan::blob_sweep::BlobName::Blob(_)
            )
        })
        .collect()
}
