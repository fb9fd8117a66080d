//! The snapshot I/O thread: every call on the shared directory happens here, never on the
//! async runtime. It carries out what the rules (`plan`) decide; it decides nothing itself.
//!
//! - Load: read what is new. Version-2 segments of other nodes, from where this node left
//!   off per node (`peers`); at the first load also this node's own segments (`own`: a wiped
//!   node gets its contributions back, and learns what it has already published);
//!   version-1 whole-cache files of older daemons, re-read only when their version changes
//!   (`read`).
//! - Publish (`publish`): one new segment holding the own contributions not yet published
//!   and the local uses of keys since the last one (`used`), by temp file and link; then, past the bound, compaction of this node's segments into
//!   one, linked in before the segments it replaces are removed. The blobs its entries name
//!   go in before it (`publish_blobs`); one that cannot is reported and retried every pass.
//! - `dir`: `v2/` checked before it is used (and made when missing), listings, stale temp
//!   files removed.
//! - `merged`: the record of the places merged through in other nodes' segments, in the
//!   state directory: read at the first load, so a restarted node reads on from them.
//!
//! A job's files come back in a `LoadReport`; a load nobody took is undone (`Undo`), so
//! its files are read again next time rather than lost.

mod dir;
pub(super) mod merged;
mod own;
mod peers;
mod publish;
mod publish_blobs;
mod read;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::model::entry::Origin;
use crate::model::forget::Tombstone;
use crate::model::tombstones::Tombstones;
use crate::snapshot::plan::listing::SeenV1;
use crate::snapshot::plan::merged::{MergedPeer, MergedPlaces, MergedRecord};
use crate::snapshot::plan::not_ours::NotOurs;
use crate::snapshot::plan::own::OwnSegments;
use crate::snapshot::plan::peers::{NodeCursor, Rejected};
use crate::snapshot::plan::trust::OwnerNotices;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::segments::SEGMENT_DIR;
use super::{Operation, Shared};

/// A load stops starting new reads after this long and goes on next pass, so a node joining
/// a large cluster never runs into the async side's wait bound.
const LOAD_BUDGET: Duration = Duration::from_secs(4);

pub(super) enum IoJob {
    Write {
        own: Arc<EntryMap>,
        /// Tombstones of Forgets made here (published), and all known (what published
        /// entries no longer count).
        own_tombstones: Arc<Tombstones>,
        all_tombstones: Arc<Tombstones>,
        /// Local uses of keys since the last publish, as the cache holds the keys now.
        used: EntryMap,
        /// Entries expiry dropped since the last publish: no longer published.
        expired: Vec<StoredEntry>,
        reply: tokio::sync::oneshot::Sender<Result<WriteReport>>,
    },
    /// Collect the shared directory's blobs that no entry of `entries` (the whole cache,
    /// after a load that caught up) names: `blobs::sweep`.
    SweepBlobs {
        entries: Arc<EntryMap>,
        grace: Duration,
        reply: tokio::sync::oneshot::Sender<Result<super::blobs::SweepReport>>,
    },
    Load {
        /// The store is empty (a wiped node): read its own version-1 file too, and take up
        /// no remembered place (the journal that held what they claim is gone).
        include_own_v1: bool,
        reply: tokio::sync::oneshot::Sender<Result<LoadReport>>,
    },
}

/// What a publish did.
pub(super) struct WriteReport {
    /// The segment written, or the segment directory when there was nothing new.
    pub path: PathBuf,
    pub wrote: bool,
    pub bytes: u64,
    /// Own contributions published in all, after this write.
    pub published: usize,
}

/// How to forget that a loaded file was read, when nobody took its entries.
enum Undo {
    V1(String),
    Segment {
        node: String,
        read_through: u64,
        /// The recorded place before the read.
        place: Option<MergedPeer>,
    },
    OwnSegments,
    /// A segment under this node's name that it did not write.
    NotOurs(String),
}

pub(super) struct LoadedFile {
    pub name: String,
    pub node: String,
    pub origin: Origin,
    pub entries: Vec<StoredEntry>,
    pub tombstones: Vec<Tombstone>,
    /// The file's `used` list: merged as learned entries, whoever wrote it.
    pub used: Vec<StoredEntry>,
    undo: Undo,
}

#[derive(Default)]
pub(super) struct LoadReport {
    pub files: Vec<LoadedFile>,
    /// Segments this node wrote vanished: publish now, even if nothing changed since the
    /// last publish (it all has to go out again).
    pub own_vanished: bool,
    /// Every place merged through in other nodes' segments, when any changed since the last
    /// load: for the state directory once the store has these files' entries and the journal
    /// is synced.
    pub merged: Option<MergedRecord>,
    /// Every trusted node's segments listed were read through: once the store has taken
    /// these files, it holds every live entry of the directory (what a blob sweep needs).
    pub caught_up: bool,
}

/// The I/O thread's state.
pub(super) struct IoWorker {
    shared: Arc<Shared>,
    /// Version-1 files already taken in (or skipped), by version.
    seen: SeenV1,
    cursors: std::collections::HashMap<String, NodeCursor>,
    own: OwnSegments,
    /// Nodes whose segment gap was already warned about.
    warned_gaps: std::collections::HashSet<String>,
    /// Segments under this node's name that it did not write, already read (or refused).
    not_ours: NotOurs,
    /// A trusted writer's segment under this node's name was warned about (once a run).
    warned_not_ours: bool,
    /// When other users' files were last said, per owner (`trust::OwnerNotices`).
    owner_notices: OwnerNotices,
    /// Segments that did not prove their writer or disagree with their name.
    rejected: Rejected,
    /// `v2/` was, at its last check, the one every user shares (root's, sticky): files of
    /// uids this daemon does not trust are other users' there, not forgeries.
    shared_by_users: Cell<bool>,
    /// Own segments vanished and no load that says so has reached the async side yet.
    own_vanished: bool,
    /// Where this reader stands with each other node, as the state directory will record it.
    merged: MergedPlaces,
    /// The state directory's record was read (at the first load).
    merged_record_read: bool,
    /// Blob digests known to be in this uid's directory of `v2/artifacts/`.
    blobs_published: crate::tiers::PublishedBlobs,
    /// Blobs a publish could not link in: retried every pass until they are.
    blobs_pending: std::collections::BTreeSet<String>,
    /// This run has looked at every blob this node's contributions name.
    blobs_seeded: bool,
}

impl IoWorker {
    pub(super) fn new(shared: Arc<Shared>) -> IoWorker {
        IoWorker {
            shared,
            seen: SeenV1::default(),
            cursors: Default::default(),
            own: OwnSegments::default(),
            warned_gaps: Default::default(),
            not_ours: NotOurs::default(),
            warned_not_ours: false,
            owner_notices: OwnerNotices::default(),
            rejected: Rejected::default(),
            shared_by_users: Cell::new(false),
            own_vanished: false,
            merged: MergedPlaces::default(),
            merged_record_read: false,
            blobs_published: Default::default(),
            blobs_pending: Default::default(),
            blobs_seeded: false,
        }
    }

    pub(super) fn run(mut self, jobs: mpsc::Receiver<IoJob>) {
        while let Ok(job) = jobs.recv() {
            match job {
                IoJob::Write {
                    own,
                    own_tombstones,
                    all_tombstones,
                    used,
                    expired,
                    reply,
                } => {
                    self.shared.begin(Operation::Write);
                    self.own.expired(&expired);
                    drop(expired);
                    let outcome = self.publish(&own, &used, &own_tombstones, all_tombstones);
                    drop(own);
                    self.shared.end();
                    let _ = reply.send(outcome);
                }
                IoJob::SweepBlobs {
                    entries,
                    grace,
                    reply,
                } => {
                    self.shared.begin(Operation::Write);
                    let outcome = self.sweep_blobs(&entries, grace);
                    drop(entries);
                    self.shared.end();
                    let _ = reply.send(outcome);
                }
                IoJob::Load {
                    include_own_v1,
                    reply,
                } => {
                    self.shared.begin(Operation::Load);
                    let outcome = self.load(include_own_v1);
                    self.shared.end();
                    if let Err(Ok(abandoned)) = reply.send(outcome) {
                        // Nobody waited for these entries any more: read them again next
                        // time rather than losing them.
                        self.own_vanished |= abandoned.own_vanished;
                        if abandoned.merged.is_some() {
                            self.merged.not_taken();
                        }
                        for file in abandoned.files.into_iter().rev() {
                            self.undo(file.undo);
                        }
                    }
                }
            }
        }
    }

    fn sweep_blobs(
        &mut self,
        entries: &EntryMap,
        grace: Duration,
    ) -> Result<super::blobs::SweepReport> {
        let mut named = std::collections::HashSet::new();
        for entry in entries.iter() {
            for artifact in entry.result().artifacts.iter() {
                named.insert(artifact.sha256.to_owned());
            }
        }
        let segment_dir = self.segment_dir();
        let report = super::blobs::sweep(&segment_dir, &named, grace, self.node(), self.writers())
            .map_err(|error| Error::io("sweeping artifact blobs", &segment_dir, error))?;
        // What was renamed away is no longer known to be there: a later publish naming it
        // links it in again.
        if report.trashed > 0 {
            self.blobs_published.forget_all();
        }
        Ok(report)
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::V1(name) => self.seen.forget(&name),
            Undo::Segment {
                node,
                read_through,
                place,
            } => {
                self.cursors
                    .entry(node.clone())
                    .or_default()
                    .undo(read_through);
                self.merged.restore(&node, place);
            }
            Undo::OwnSegments => self.own.loaded = false,
            Undo::NotOurs(name) => self.not_ours.forget(&name),
        }
    }

    fn dir(&self) -> &Path {
        &self.shared.settings.dir
    }

    fn segment_dir(&self) -> PathBuf {
        self.dir().join(SEGMENT_DIR)
    }

    fn node(&self) -> &str {
        &self.shared.settings.node
    }

    /// Counts and reports a failure; logs each kind of failure of each operation once.
    fn failed(
        &self,
        operation: Operation,
        what: &str,
        path: &Path,
        error: &std::io::Error,
    ) -> Error {
        self.shared.failed(operation, what, path, error)
    }

    fn load(&mut self, include_own_v1: bool) -> Result<LoadReport> {
        let started = Instant::now();
        if !self.merged_record_read {
            self.merged_record_read = true;
            let places = self.read_merged_record();
            if include_own_v1 && !places.is_empty() {
                tracing::info!(
                    "the store is empty, so the record of merged segments claims what it does \
                     not hold; ignored, every segment is read again"
                );
            } else {
                self.merged = places;
            }
        }
        let mut report = LoadReport::default();
        let outcome = self
            .load_v1(include_own_v1, &mut report)
            .and_then(|()| self.load_segments(started, &mut report));
        if let Err(error) = outcome {
            // Nothing of a failed load reaches the store: read it all again next time.
            for file in report.files.into_iter().rev() {
                self.undo(file.undo);
            }
            return Err(error);
        }
        report.own_vanished = std::mem::take(&mut self.own_vanished);
        let settings = &self.shared.settings;
        let dir = settings.dir.display().to_string();
        report.merged = self.merged.changed_record(&settings.node, &dir);
        Ok(report)
    }

    fn load_segments(&mut self, started: Instant, report: &mut LoadReport) -> Result<()> {
        let mut by_node = self.list_segments()?;
        self.rejected.keep_only(by_node.values());
        let own_listed = by_node.remove(self.node()).unwrap_or_default();
        if !self.own.loaded {
            self.load_own_segments(own_listed, report)?;
        } else {
            self.reconcile_own(&own_listed);
            self.read_not_ours(&own_listed, report);
        }
        let mut caught_up = true;
        for (node, listed) in by_node {
            if started.elapsed() > LOAD_BUDGET {
                tracing::debug!("load budget spent; the rest is read next pass");
                caught_up = false;
                break;
            }
            caught_up &= self.read_new_segments(&node, &listed, started, report);
        }
        report.caught_up = caught_up;
        Ok(())
    }
}
