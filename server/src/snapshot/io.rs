//! The snapshot I/O thread's work: every call on the shared directory happens here, never on
//! the async runtime.
//!
//! - Load: read what is new. Version-2 segments of other nodes, from where this node left
//!   off per node (`segments::next_to_read`); at the first load also this node's own segments
//!   (a wiped node gets its contributions back, and learns what it has already published);
//!   version-1 whole-cache files of older daemons, re-read only when their version changes.
//! - Publish: one new segment holding the own contributions not yet published, by temp file
//!   and rename; then, past the bound, compaction of this node's segments into one, renamed
//!   in before the segments it replaces are removed.
//!
//! Trust: a file counts only if it proves who wrote it: with `--shared-dir-key-file`, a MAC
//! that verifies; without, an owner uid among this daemon's own and `--shared-dir-writer-uid`.
//! A segment must also
//! say inside what its name says (node, sequence range). A node believes only what it wrote
//! about itself: the names of its own segments are recorded in its state directory
//! (`shared-segments.json`) before each rename, and only recorded segments are read as its
//! own, compacted or removed. A segment that merely carries its name (an earlier state
//! directory, an impostor, a second daemon given the same name) is read like another node's,
//! warned about once and counted, and never deleted, adopted or renumbered from.
//! `v2/` itself must be a real directory owned by an allowed writer or root, not writable by
//! group or others unless a key is set or it is root's and sticky (mode 1777: one `v2/` for
//! every user, each file trusted by its owner's uid alone; the sticky bit stops anyone but a
//! file's owner from removing or renaming it). There, files of uids this daemon does not trust
//! are other users' caches and are skipped quietly, except under a name it trusts (its own, or
//! one whose trusted segments it has read): that is name squatting, warned about and counted.
//! Otherwise nothing is read or written there. A missing `v2/` is created 0755, but never in a
//! top directory that group or others may write: whoever made it there would own every
//! user's `v2/`.

use crate::model::forget::{Tombstone, Tombstones};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result};
use crate::model::entry::{unix_now_ms, Origin};
use crate::model::merge::{merge_views, MergeOutcome};
use crate::snapshot::format::{self, ParsedSnapshot, SNAPSHOT_SUFFIX};
use crate::snapshot::shared_file::{self, FileVersion, OpenError};
use crate::wire::stored::{EntryMap, StoredEntry};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};

use super::segments::{self, Next, NodeSegments, SegmentName, SEGMENT_DIR, SEGMENT_TEMP_MARKER};
use super::{Operation, Shared};

/// Temp files older than this belong to writers that crashed; they are removed.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// How often a read that raced a replacement (ENOENT, ESTALE) is tried again.
const REPLACEMENT_RETRIES: usize = 3;
/// Marks version-1 temp files (written by older daemons); removed when stale.
const V1_TEMP_MARKER: &str = ".tunecache.json.tmp.";
/// A load stops starting new reads after this long and goes on next pass, so a node joining
/// a large cluster never runs into the async side's wait bound.
const LOAD_BUDGET: Duration = Duration::from_secs(4);
/// A gap in a node's segments that lasts this many listings is skipped (files removed by
/// hand); a shorter one is a listing that raced a compaction.
const GAP_PASSES: u32 = 3;
/// Compaction also runs when the own segments hold more than twice the live entries, once
/// they hold at least this many.
const COMPACT_MIN_ENTRIES: usize = 10_000;

pub(super) enum IoJob {
    Write {
        own: Arc<EntryMap>,
        /// Tombstones of Forgets made here (published), and all known (what published
        /// entries no longer count).
        own_tombstones: Arc<Tombstones>,
        all_tombstones: Arc<Tombstones>,
        reply: tokio::sync::oneshot::Sender<Result<WriteReport>>,
    },
    Load {
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
    V1(OsString),
    Segment {
        node: String,
        read_through: u64,
    },
    OwnSegments,
    /// A segment under this node's name that it did not write.
    NotOurs(String),
}

/// The state-directory file that records which segments this node wrote.
const OWN_RECORD_FILE: &str = "shared-segments.json";

/// What this node wrote to the shared directory, kept in its own state directory: the only
/// source of truth about its own segments.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct OwnRecord {
    node: String,
    shared_dir: String,
    next_seq: u64,
    segments: Vec<String>,
}

pub(super) struct LoadedFile {
    pub name: String,
    pub node: String,
    pub origin: Origin,
    pub entries: Vec<StoredEntry>,
    pub tombstones: Vec<Tombstone>,
    undo: Undo,
}

#[derive(Default)]
pub(super) struct LoadReport {
    pub files: Vec<LoadedFile>,
}

/// Where this reader stands with one other node's segments.
#[derive(Default)]
struct NodeCursor {
    read_through: u64,
    gap_passes: u32,
}

/// This node's own segments, as far as its writer knows them.
#[derive(Default)]
struct OwnSegments {
    /// Listed and read once since start.
    loaded: bool,
    segments: Vec<SegmentName>,
    next_seq: u64,
    /// Best entry per key that the segments hold: what is published.
    published: EntryMap,
    /// Tombstones of this node's Forgets that its segments hold.
    published_tombstones: Tombstones,
    /// The tombstones `published` was last pruned with.
    pruned_with: Option<Arc<Tombstones>>,
    /// Entries the segments hold, superseded ones included.
    entries_in_segments: usize,
    /// Another writer uses this node's name: compaction would hide its segments.
    name_conflict: bool,
}

/// The I/O thread's state.
pub(super) struct IoWorker {
    shared: Arc<Shared>,
    /// Version-1 files: the version of each already taken in (or skipped).
    seen: HashMap<OsString, FileVersion>,
    cursors: HashMap<String, NodeCursor>,
    own: OwnSegments,
    /// Nodes whose segment gap was already warned about.
    warned_gaps: HashSet<String>,
    /// Segments under this node's name that it did not write, already read (or refused).
    not_ours: HashSet<String>,
    /// Segments that did not prove their writer or disagree with their name: treated as
    /// absent, so a forged name can never make a reader skip the real segments it claims
    /// to cover.
    rejected: HashSet<String>,
    /// `v2/` was, at its last check, the one every user shares (root's, sticky): files of
    /// uids this daemon does not trust are other users' there, not forgeries.
    shared_by_users: Cell<bool>,
}

/// A read of one file: its version and its entries, or why it was skipped.
type FileRead = (FileVersion, Result<ParsedSnapshot>);

impl IoWorker {
    pub(super) fn new(shared: Arc<Shared>) -> IoWorker {
        IoWorker {
            shared,
            seen: HashMap::new(),
            cursors: HashMap::new(),
            own: OwnSegments::default(),
            warned_gaps: HashSet::new(),
            not_ours: HashSet::new(),
            rejected: HashSet::new(),
            shared_by_users: Cell::new(false),
        }
    }

    pub(super) fn run(mut self, jobs: mpsc::Receiver<IoJob>) {
        while let Ok(job) = jobs.recv() {
            match job {
                IoJob::Write {
                    own,
                    own_tombstones,
                    all_tombstones,
                    reply,
                } => {
                    self.begin(Operation::Write);
                    let outcome = self.publish(&own, &own_tombstones, all_tombstones);
                    drop(own);
                    self.end();
                    let _ = reply.send(outcome);
                }
                IoJob::Load {
                    include_own_v1,
                    reply,
                } => {
                    self.begin(Operation::Load);
                    let outcome = self.load(include_own_v1);
                    self.end();
                    if let Err(Ok(abandoned)) = reply.send(outcome) {
                        // Nobody waited for these entries any more: read them again next
                        // time rather than losing them.
                        for file in abandoned.files.into_iter().rev() {
                            self.undo(file.undo);
                        }
                    }
                }
            }
        }
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::V1(name) => {
                self.seen.remove(&name);
            }
            Undo::Segment { node, read_through } => {
                let cursor = self.cursors.entry(node).or_default();
                cursor.read_through = cursor.read_through.min(read_through);
            }
            Undo::OwnSegments => self.own.loaded = false,
            Undo::NotOurs(name) => {
                self.not_ours.remove(&name);
            }
        }
    }

    fn begin(&self, operation: Operation) {
        self.shared.begin(operation);
    }

    fn end(&self) {
        self.shared.end();
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
    fn failed(&self, operation: Operation, what: &str, path: &Path, error: &io::Error) -> Error {
        self.shared.failed(operation, what, path, error)
    }

    // --- Load ---------------------------------------------------------------------------

    fn load(&mut self, include_own_v1: bool) -> Result<LoadReport> {
        let started = Instant::now();
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
        Ok(report)
    }

    /// Version-1 `<node>.tunecache.json` files in the top directory.
    fn load_v1(&mut self, include_own_v1: bool, report: &mut LoadReport) -> Result<()> {
        let dir = self.dir().to_path_buf();
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // First node on a fresh shared directory: create it, nothing to read yet.
                fs::create_dir_all(&dir)
                    .map_err(|e| self.failed(Operation::Load, "creating", &dir, &e))?;
                return Ok(());
            }
            Err(error) => return Err(self.failed(Operation::Load, "listing", &dir, &error)),
        };
        let own_v1 = format::snapshot_file_name(self.node());
        let mut present = HashSet::new();
        for dirent in listing {
            let dirent = dirent.map_err(|e| self.failed(Operation::Load, "listing", &dir, &e))?;
            let name = dirent.file_name();
            let Some(text) = name.to_str() else { continue };
            if text.starts_with('.') {
                if text.contains(V1_TEMP_MARKER) {
                    remove_if_stale(&dirent.path());
                }
                continue;
            }
            if !text.ends_with(SNAPSHOT_SUFFIX) || text.len() == SNAPSHOT_SUFFIX.len() {
                continue;
            }
            if text == own_v1 && !include_own_v1 {
                continue;
            }
            present.insert(name.clone());
            if let Some(file) = self.read_v1_if_changed(&dirent.path(), name) {
                report.files.push(file);
            }
        }
        // Forget files that are gone (or our own, once no longer read) so a later file of
        // the same name is read afresh.
        self.seen.retain(|name, _| present.contains(name));
        Ok(())
    }

    /// Reads one version-1 file unless this version was taken in (or skipped) before.
    fn read_v1_if_changed(&mut self, path: &Path, name: OsString) -> Option<LoadedFile> {
        let seen = self.seen.get(&name).copied();
        let (version, parsed) = match self.read_with_retries(path, seen) {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                let _ = self.failed(Operation::Load, "reading", path, &error);
                return None;
            }
        };
        // Either way this version is done with: loaded now, or warned about once.
        self.seen.insert(name.clone(), version);
        let parsed = self.accept(path, version, parsed)?;
        Some(LoadedFile {
            name: name.to_string_lossy().into_owned(),
            node: parsed.node,
            origin: Origin::Learned,
            entries: parsed.entries,
            tombstones: parsed.tombstones,
            undo: Undo::V1(name),
        })
    }

    /// Counts a file read as loaded or skipped, and warns about a skipped one.
    fn accept(
        &self,
        path: &Path,
        version: FileVersion,
        parsed: Result<ParsedSnapshot>,
    ) -> Option<ParsedSnapshot> {
        let counters = &self.shared.counters;
        // Paths are logged escaped (`?`): a file name may hold a newline or a fake log line.
        match parsed {
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
                Some(parsed)
            }
            Err(Error::OtherUsersFile(uid)) => {
                tracing::debug!(path = ?path, uid, "another user's file in the shared v2/; not read");
                None
            }
            Err(reason) => {
                counters.peer_files_skipped.fetch_add(1, Ordering::Relaxed);
                if matches!(reason, Error::Unauthenticated(_)) {
                    counters.untrusted_files.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(
                    path = ?path,
                    bytes = version.size,
                    "{reason}; skipped until the file changes"
                );
                None
            }
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
    /// its entries or why it was skipped (refused by type or size, or damaged).
    fn read_new_version(
        &self,
        path: &Path,
        seen: Option<FileVersion>,
    ) -> io::Result<Option<FileRead>> {
        // lstat: a symlink's version is the link's own, so it is refused once, not per pass.
        let version = shared_file::version_of(path)?;
        if seen == Some(version) {
            return Ok(None);
        }
        let max_bytes = self.shared.settings.max_file_bytes;
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
        let settings = &self.shared.settings;
        if settings.key.is_none() && !settings.writer_uids.contains(&opened.owner) {
            if self.shared_by_users.get() {
                return Ok(Some((version, Err(Error::OtherUsersFile(opened.owner)))));
            }
            let error = Error::Unauthenticated(format!(
                "owned by uid {}, not an allowed writer (--shared-dir-writer-uid {})",
                opened.owner,
                uid_list(&settings.writer_uids)
            ));
            return Ok(Some((version, Err(error))));
        }
        let reader = opened.reader(max_bytes, Arc::clone(&self.shared.counters.bytes_read));
        let parsed = format::read_authenticated(reader, settings.key.as_ref());
        Ok(Some((version, parsed)))
    }

    /// Reads a segment and checks that it says inside what its name says.
    fn read_segment(&self, segment: &SegmentName) -> io::Result<Option<FileRead>> {
        let path = self.segment_dir().join(segment.file_name());
        let read = self.read_with_retries(&path, None)?;
        Ok(read.map(|(version, parsed)| {
            let parsed = parsed.and_then(|parsed| {
                let agrees = parsed.version == format::FORMAT_VERSION
                    && parsed.node == segment.node
                    && parsed.first_seq == Some(segment.first)
                    && parsed.last_seq == Some(segment.last);
                if agrees {
                    Ok(parsed)
                } else {
                    Err(Error::Unauthenticated(format!(
                        "says it is node {:?}, sequence {:?}..{:?}, version {}, which its name \
                         does not",
                        parsed.node, parsed.first_seq, parsed.last_seq, parsed.version
                    )))
                }
            });
            (version, parsed)
        }))
    }

    /// `v2/` must be a real directory (not a symlink), owned by an allowed writer or root, and
    /// not writable by group or others unless a key authenticates every file or it is root's
    /// and sticky (every user's `v2/`, each file trusted by its owner). Created 0755 when
    /// missing, unless group or others may write the top directory.
    fn check_segment_dir(&self, operation: Operation) -> Result<bool> {
        let dir = self.segment_dir();
        let metadata = match fs::symlink_metadata(&dir) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                if let Some(why) = self.v2_left_to_the_admin() {
                    self.shared.refused(&why);
                    return Err(Error::SharedDirUnsafe(why));
                }
                // No node has published a segment yet. A directory that cannot be created
                // (read-only, full) is reported by the publish that needs it. Root makes
                // every user's v2/ in a top directory others may write, as the admin would.
                let mode = if self.top_writable_by_others() {
                    0o1777
                } else {
                    0o755
                };
                let created = fs::DirBuilder::new()
                    .mode(mode)
                    .create(&dir)
                    .and_then(|()| {
                        // The umask may have cleared bits of the mode asked for.
                        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                    });
                match created {
                    Ok(()) => return self.check_segment_dir(operation),
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                        return self.check_segment_dir(operation)
                    }
                    Err(error) => {
                        tracing::debug!(dir = ?dir, %error, "segment directory not created");
                        return Ok(false);
                    }
                }
            }
            Err(error) => return Err(self.failed(operation, "checking", &dir, &error)),
        };
        let settings = &self.shared.settings;
        let mode = metadata.mode() & 0o7777;
        let owner = metadata.uid();
        let shared_by_users = owner == 0 && mode & 0o1000 != 0;
        let unsafe_because = if metadata.file_type().is_symlink() {
            Some("is a symbolic link".to_owned())
        } else if !metadata.is_dir() {
            Some("is not a directory".to_owned())
        } else if owner != 0 && !settings.writer_uids.contains(&owner) {
            Some(format!(
                "is owned by uid {owner}, not an allowed writer (this daemon's uid and \
                 --shared-dir-writer-uid: {}) or root",
                uid_list(&settings.writer_uids)
            ))
        } else if mode & 0o022 != 0 && settings.key.is_none() && !shared_by_users {
            Some(format!(
                "is writable by group or others (mode {mode:04o}), and neither the sticky bit \
                 on a root-owned v2/ (mode 1777) nor --shared-dir-key-file protects its files"
            ))
        } else {
            None
        };
        match unsafe_because {
            None => {
                self.shared_by_users
                    .set(shared_by_users && mode & 0o022 != 0);
                Ok(true)
            }
            Some(why) => {
                self.shared_by_users.set(false);
                let message = format!(
                    "refusing to use {dir:?} (owner uid {owner}, mode {mode:04o}): it {why}"
                );
                self.shared.refused(&message);
                Err(Error::SharedDirUnsafe(message))
            }
        }
    }

    /// Whether group or others may write the top directory: then its `v2/` is every user's.
    fn top_writable_by_others(&self) -> bool {
        fs::metadata(self.dir()).is_ok_and(|top| top.mode() & 0o022 != 0)
    }

    /// Why this daemon must not create `v2/` itself: it does not run as root and the top
    /// directory is one that group or others may write, so the `v2/` of every user there is
    /// the administrator's to make (whoever creates it owns it, and so could remove every
    /// other user's files, and the other users' daemons refuse it).
    fn v2_left_to_the_admin(&self) -> Option<String> {
        if nix::unistd::geteuid().is_root() {
            return None;
        }
        let top = fs::metadata(self.dir()).ok()?;
        let mode = top.mode() & 0o7777;
        (mode & 0o022 != 0).then(|| {
            format!(
                "not creating {:?}: group or others may write {:?} (mode {mode:04o}), so a \
                 v2/ made by this daemon would be this user's alone; as root, create it for \
                 every user with `install -d -m 1777 -o root -g root {}`",
                self.segment_dir(),
                self.dir(),
                self.segment_dir().display()
            )
        })
    }

    /// Lists `DIR/v2`, removes stale temp files, and groups the segments by node.
    fn list_segments(&self) -> Result<std::collections::BTreeMap<String, NodeSegments>> {
        let dir = self.segment_dir();
        if !self.check_segment_dir(Operation::Load)? {
            return Ok(Default::default());
        }
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(Default::default());
            }
            Err(error) => return Err(self.failed(Operation::Load, "listing", &dir, &error)),
        };
        let mut names = Vec::new();
        for dirent in listing {
            let dirent = dirent.map_err(|e| self.failed(Operation::Load, "listing", &dir, &e))?;
            let name = dirent.file_name();
            let Some(text) = name.to_str() else { continue };
            if text.starts_with('.') {
                if text.contains(SEGMENT_TEMP_MARKER) {
                    remove_if_stale(&dirent.path());
                }
                continue;
            }
            names.extend(SegmentName::parse(text));
        }
        Ok(segments::group_by_node(names))
    }

    fn load_segments(&mut self, started: Instant, report: &mut LoadReport) -> Result<()> {
        let mut by_node = self.list_segments()?;
        if !self.rejected.is_empty() {
            let listed_names: HashSet<String> = by_node
                .values()
                .flat_map(|segments| segments.as_slice().iter().map(SegmentName::file_name))
                .collect();
            self.rejected.retain(|name| listed_names.contains(name));
        }
        let own_listed = by_node.remove(self.node()).unwrap_or_default();
        if !self.own.loaded {
            self.load_own_segments(own_listed, report)?;
        } else {
            self.republish_if_removed(&own_listed);
            self.remove_leftovers(&own_listed);
            self.read_not_ours(&own_listed, report);
        }
        for (node, listed) in by_node {
            if started.elapsed() > LOAD_BUDGET {
                tracing::debug!("load budget spent; the rest is read next pass");
                break;
            }
            self.read_new_segments(&node, &listed, started, report);
        }
        Ok(())
    }

    /// At the first load: what this node has published (the segments its state directory
    /// records), and its own contributions back.
    fn load_own_segments(&mut self, listed: NodeSegments, report: &mut LoadReport) -> Result<()> {
        let record = self.read_own_record();
        let recorded: HashSet<&str> = record.segments.iter().map(String::as_str).collect();
        let mine = NodeSegments::new(
            listed
                .as_slice()
                .iter()
                .filter(|s| recorded.contains(s.file_name().as_str()))
                .cloned()
                .collect(),
        );
        let mut published = EntryMap::new();
        let mut published_tombstones = Tombstones::default();
        let mut entries_in_segments = 0;
        let mut entries = Vec::new();
        let mut tombstones = Vec::new();
        let mut read_through = 0;
        while let Next::Read(segment) = mine.next_to_read(read_through) {
            let path = self.segment_dir().join(segment.file_name());
            let (version, parsed) = match self.read_segment(segment) {
                Ok(Some((version, parsed))) => (version, squatting(parsed, &segment.node)),
                // Removed since the listing: look again next pass.
                Ok(None) => return Ok(()),
                // Without every own segment the writer cannot know what it published, and
                // a compaction could drop what it did not read: fail, retry with backoff.
                Err(error) => return Err(self.failed(Operation::Load, "reading", &path, &error)),
            };
            if let Some(parsed) = self.accept(&path, version, parsed) {
                entries_in_segments += parsed.entries.len();
                for tombstone in parsed.tombstones {
                    published_tombstones.insert(tombstone.clone());
                    tombstones.push(tombstone);
                }
                for entry in parsed.entries {
                    let best = published.get_view(&entry.key()).map(StoredEntry::result);
                    if merge_views(best, entry.result()) == MergeOutcome::Replace {
                        published.insert(entry.clone());
                    }
                    entries.push(entry);
                }
            }
            read_through = segment.last;
        }
        // Numbering goes on after everything under this name that is listed, so no segment
        // of another writer of the name is overwritten (names past `MAX_SEQ` never parse).
        let next_seq = [
            record.next_seq,
            mine.max_last().map_or(0, |last| last + 1),
            listed.max_last().map_or(0, |last| last + 1),
            1,
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        self.own = OwnSegments {
            loaded: true,
            next_seq,
            segments: mine.as_slice().to_vec(),
            published,
            published_tombstones,
            pruned_with: None,
            entries_in_segments,
            name_conflict: false,
        };
        self.write_own_record()?;
        if !entries.is_empty() || !tombstones.is_empty() {
            tracing::info!(
                segments = self.own.segments.len(),
                entries = self.own.published.len(),
                "read this node's own published segments"
            );
            report.files.push(LoadedFile {
                name: format!("{SEGMENT_DIR}/{}.*", self.node()),
                node: self.node().to_owned(),
                origin: Origin::Own,
                entries,
                tombstones,
                undo: Undo::OwnSegments,
            });
        }
        self.read_not_ours(&listed, report);
        Ok(())
    }

    /// Only this node removes its own segments, and it updates its record first; a recorded
    /// segment missing from the listing was removed by someone else (`v2/` wiped, files
    /// deleted by hand). What it held is then published again, in the next segment, so a
    /// node that joins later still gets every contribution of this one.
    fn republish_if_removed(&mut self, listed: &NodeSegments) {
        let before = self.own.segments.len();
        // The listing is sorted: a binary search per recorded segment.
        self.own
            .segments
            .retain(|s| listed.as_slice().binary_search(s).is_ok());
        let missing = before - self.own.segments.len();
        if missing == 0 {
            return;
        }
        tracing::warn!(
            missing,
            node = self.node(),
            "segments this node wrote are gone from the shared directory; publishing its \
             contributions again"
        );
        self.own.published = EntryMap::new();
        self.own.entries_in_segments = 0;
        if let Err(error) = self.write_own_record() {
            tracing::debug!(%error, "record not updated; the next pass tries again");
        }
    }

    /// Segments under this node's name that its record does not list: read once each like
    /// another node's (if they prove their writer), warned about once, counted; never
    /// deleted, adopted or numbered from.
    fn read_not_ours(&mut self, listed: &NodeSegments, report: &mut LoadReport) {
        let recorded: HashSet<String> = self
            .own
            .segments
            .iter()
            .map(SegmentName::file_name)
            .collect();
        for segment in listed.as_slice() {
            let name = segment.file_name();
            if recorded.contains(&name) || self.not_ours.contains(&name) {
                continue;
            }
            self.not_ours.insert(name.clone());
            let earlier = self
                .shared
                .counters
                .name_conflicts
                .fetch_add(1, Ordering::Relaxed);
            if earlier > 0 {
                tracing::debug!(file = ?name, "another segment under this node's name it did not write");
            } else {
                tracing::warn!(
                    file = ?name,
                    node = self.node(),
                    "a segment under this node's name that this node did not write (an earlier \
                     state directory, an impostor, or a second daemon with the same --node-name); \
                     read like another node's, never taken as this node's own (logged once; \
                     Stats snapshot_name_conflicts counts them)"
                );
            }
            let path = self.segment_dir().join(&name);
            let (version, parsed) = match self.read_segment(segment) {
                Ok(Some((version, parsed))) => (version, squatting(parsed, &segment.node)),
                Ok(None) => continue,
                Err(error) => {
                    let _ = self.failed(Operation::Load, "reading", &path, &error);
                    self.not_ours.remove(&name);
                    continue;
                }
            };
            if let Some(parsed) = self.accept(&path, version, parsed) {
                report.files.push(LoadedFile {
                    name: name.clone(),
                    node: self.node().to_owned(),
                    origin: Origin::Learned,
                    entries: parsed.entries,
                    tombstones: parsed.tombstones,
                    undo: Undo::NotOurs(name),
                });
            }
        }
        // Forget names that are gone, so the set stays as small as the listing.
        let listed_names: HashSet<String> = listed
            .as_slice()
            .iter()
            .map(SegmentName::file_name)
            .collect();
        self.not_ours.retain(|name| listed_names.contains(name));
    }

    fn own_record_path(&self) -> PathBuf {
        self.shared.settings.state_dir.join(OWN_RECORD_FILE)
    }

    /// The record of this node's own segments; empty when there is none yet, or when it
    /// was written for another node name or shared directory.
    fn read_own_record(&self) -> OwnRecord {
        let path = self.own_record_path();
        let record: OwnRecord = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(record) => record,
                Err(error) => {
                    tracing::warn!(path = ?path, %error, "the record of this node's segments is damaged; starting a new one");
                    return OwnRecord::default();
                }
            },
            Err(_) => return OwnRecord::default(),
        };
        if record.node != self.node() || record.shared_dir != self.dir().display().to_string() {
            return OwnRecord::default();
        }
        record
    }

    /// Writes the record (temp file, fsync, rename) in the state directory.
    fn write_own_record(&self) -> Result<()> {
        let record = OwnRecord {
            node: self.node().to_owned(),
            shared_dir: self.dir().display().to_string(),
            next_seq: self.own.next_seq,
            segments: self
                .own
                .segments
                .iter()
                .map(SegmentName::file_name)
                .collect(),
        };
        let path = self.own_record_path();
        let temp = path.with_extension("json.tmp");
        let write = || -> io::Result<()> {
            let mut file = File::create(&temp)?;
            file.write_all(&serde_json::to_vec(&record).map_err(io::Error::from)?)?;
            file.sync_all()?;
            fs::rename(&temp, &path)?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|error| Error::io("recording this node's segments in", &path, error))
    }

    /// Reads the segments of `node` this reader has not read yet, in order.
    fn read_new_segments(
        &mut self,
        node: &str,
        listed: &NodeSegments,
        started: Instant,
        report: &mut LoadReport,
    ) {
        let without_rejected = |rejected: &HashSet<String>| {
            NodeSegments::new(
                listed
                    .as_slice()
                    .iter()
                    .filter(|s| !rejected.contains(&s.file_name()))
                    .cloned()
                    .collect(),
            )
        };
        // The listing itself while nothing of it is rejected (the usual case: no copy).
        let any_rejected = !self.rejected.is_empty()
            && listed
                .as_slice()
                .iter()
                .any(|s| self.rejected.contains(&s.file_name()));
        let mut filtered: Option<NodeSegments> =
            any_rejected.then(|| without_rejected(&self.rejected));
        let mut read_through = self.cursors.get(node).map_or(0, |c| c.read_through);
        let mut gap_passes = self.cursors.get(node).map_or(0, |c| c.gap_passes);
        loop {
            if started.elapsed() > LOAD_BUDGET {
                break;
            }
            let candidates = filtered.as_ref().unwrap_or(listed);
            let segment = match candidates.next_to_read(read_through) {
                Next::UpToDate => {
                    gap_passes = 0;
                    break;
                }
                Next::Read(segment) => segment,
                Next::Restarted => {
                    tracing::warn!(
                        node,
                        read_through,
                        "a node's segments restarted numbering; reading them from the start"
                    );
                    read_through = 0;
                    continue;
                }
                Next::Gap => {
                    gap_passes += 1;
                    if gap_passes < GAP_PASSES {
                        break;
                    }
                    // The same hole over several listings: files were removed by hand.
                    let resume = candidates
                        .as_slice()
                        .iter()
                        .map(|s| s.first)
                        .filter(|first| *first > read_through)
                        .min()
                        .unwrap_or(read_through + 1);
                    if self.warned_gaps.insert(node.to_owned()) {
                        tracing::warn!(
                            node,
                            missing_from = read_through + 1,
                            missing_to = resume - 1,
                            "segments of a node are missing from the shared directory; skipped"
                        );
                    }
                    read_through = resume - 1;
                    gap_passes = 0;
                    continue;
                }
            };
            let path = self.segment_dir().join(segment.file_name());
            let (version, parsed) = match self.read_segment(segment) {
                // Under a name this reader has trusted segments of, an untrusted owner's
                // file is no other user's cache but a squatter's.
                Ok(Some((version, parsed))) if read_through > 0 => {
                    (version, squatting(parsed, node))
                }
                Ok(Some(read)) => read,
                // Removed by a compaction after the listing: the compacted segment is in
                // place; the next listing finds it.
                Ok(None) => break,
                Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                Err(error) => {
                    let _ = self.failed(Operation::Load, "reading", &path, &error);
                    break;
                }
            };
            if matches!(
                parsed,
                Err(Error::Unauthenticated(_) | Error::OtherUsersFile(_))
            ) {
                // Not a segment of this node's at all: as if it were not there.
                let name = segment.file_name();
                let _ = self.accept(&path, version, parsed);
                self.rejected.insert(name);
                filtered = Some(without_rejected(&self.rejected));
                continue;
            }
            let before = read_through;
            // A damaged segment is warned about once and passed over, like a damaged file.
            read_through = segment.last;
            if let Some(parsed) = self.accept(&path, version, parsed) {
                self.shared
                    .counters
                    .segments_loaded
                    .fetch_add(1, Ordering::Relaxed);
                report.files.push(LoadedFile {
                    name: segment.file_name(),
                    node: node.to_owned(),
                    origin: Origin::Learned,
                    entries: parsed.entries,
                    tombstones: parsed.tombstones,
                    undo: Undo::Segment {
                        node: node.to_owned(),
                        read_through: before,
                    },
                });
            }
        }
        let cursor = self.cursors.entry(node.to_owned()).or_default();
        cursor.read_through = read_through;
        cursor.gap_passes = gap_passes;
    }

    /// Removes own segments (recorded ones only) that another recorded own segment covers:
    /// left by a compaction that was interrupted after its rename.
    fn remove_leftovers(&mut self, listed: &NodeSegments) {
        let recorded: HashSet<&SegmentName> = self.own.segments.iter().collect();
        let mine = NodeSegments::new(
            listed
                .as_slice()
                .iter()
                .filter(|s| recorded.contains(s))
                .cloned()
                .collect(),
        );
        let mut removed = Vec::new();
        for leftover in mine.covered() {
            let path = self.segment_dir().join(leftover.file_name());
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = ?path, "removed a compacted segment");
                    removed.push(leftover.clone());
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    removed.push(leftover.clone())
                }
                Err(error) => tracing::debug!(path = ?path, %error, "not removed"),
            }
        }
        if !removed.is_empty() {
            self.own.segments.retain(|s| !removed.contains(s));
            if let Err(error) = self.write_own_record() {
                tracing::debug!(%error, "record not updated; the next pass tries again");
            }
        }
    }

    // --- Publish ------------------------------------------------------------------------

    fn publish(
        &mut self,
        own: &EntryMap,
        own_tombstones: &Tombstones,
        all_tombstones: Arc<Tombstones>,
    ) -> Result<WriteReport> {
        if !self.own.loaded {
            return Err(Error::SharedDirUnavailable(
                "this node's published segments have not been read yet".into(),
            ));
        }
        let started = Instant::now();
        // What Forgets removed no longer counts as published: a compaction leaves it out.
        if !self
            .own
            .pruned_with
            .as_ref()
            .is_some_and(|pruned| Arc::ptr_eq(pruned, &all_tombstones))
        {
            for tombstone in all_tombstones.iter() {
                self.own.published.remove_dropped_by(&tombstone);
            }
            self.own.pruned_with = Some(all_tombstones);
        }
        let new: EntryMap = own
            .iter()
            .filter(|entry| !self.own.published.contains(entry))
            .cloned()
            .collect();
        let new_tombstones: Vec<Tombstone> = own_tombstones
            .iter()
            .filter(|tombstone| !self.own.published_tombstones.subsumes(tombstone))
            .collect();
        if new.is_empty() && new_tombstones.is_empty() {
            return Ok(WriteReport {
                path: self.segment_dir(),
                wrote: false,
                bytes: 0,
                published: self.own.published.len(),
            });
        }
        let segment = SegmentName {
            node: self.node().to_owned(),
            first: self.own.next_seq,
            last: self.own.next_seq,
        };
        let path = self.segment_dir().join(segment.file_name());
        // Recorded before it exists, so a crash between the two never leaves a segment of
        // this node that its record does not know.
        self.own.next_seq += 1;
        self.own.segments.push(segment.clone());
        if let Err(error) = self.write_own_record() {
            self.own.next_seq -= 1;
            self.own.segments.pop();
            return Err(error);
        }
        let bytes = match self.write_segment(&segment, &new, &new_tombstones) {
            Ok(bytes) => bytes,
            Err(error) => {
                // Not written: the number is used by the next try (the record may list the
                // name meanwhile, which is harmless: it only ever protects).
                self.own.segments.pop();
                if matches!(&error, Error::SegmentNameTaken(_)) {
                    // Another writer of this name took the number: go past it next pass.
                    self.report_name_taken(&segment);
                } else {
                    self.own.next_seq -= 1;
                }
                return Err(error);
            }
        };
        self.own.entries_in_segments += new.len();
        for entry in new.iter() {
            self.own.published.insert(entry.clone());
        }
        for tombstone in new_tombstones {
            self.own.published_tombstones.insert(tombstone);
        }
        self.shared.wrote(&path);
        tracing::debug!(
            path = %path.display(),
            entries = new.len(),
            bytes,
            elapsed = ?started.elapsed(),
            "segment written"
        );
        if self.compaction_due() {
            self.compact();
        }
        Ok(WriteReport {
            path,
            wrote: true,
            bytes,
            published: self.own.published.len(),
        })
    }

    /// A segment name this node was about to use exists already: a second daemon with the
    /// same `--node-name` (or an impostor) writes there. Counted, warned about once; this
    /// node stops compacting, since a compaction would cover the other writer's numbers.
    fn report_name_taken(&mut self, segment: &SegmentName) {
        self.shared
            .counters
            .name_conflicts
            .fetch_add(1, Ordering::Relaxed);
        if !self.own.name_conflict {
            tracing::warn!(
                file = ?segment.file_name(),
                node = self.node(),
                "another writer uses this node's name (a second daemon with the same --node-name, \
                 or an impostor); numbering goes past its segments and compaction stops"
            );
        }
        self.own.name_conflict = true;
    }

    /// Whether a segment under this node's name that it did not write lies inside the range
    /// a compaction of its own segments would cover (and so would hide from readers). Those
    /// of an earlier state directory lie before it: numbering went on after them.
    fn not_ours_within_own_range(&self) -> bool {
        let (Some(first), Some(last)) = (
            self.own.segments.iter().map(|s| s.first).min(),
            self.own.segments.iter().map(|s| s.last).max(),
        ) else {
            return false;
        };
        self.not_ours
            .iter()
            .filter_map(|name| SegmentName::parse(name))
            .any(|other| other.first <= last && first <= other.last)
    }

    fn compaction_due(&self) -> bool {
        let own = &self.own;
        if own.name_conflict || self.not_ours_within_own_range() {
            return false;
        }
        own.segments.len() > self.shared.settings.compact_segments
            || (own.entries_in_segments >= COMPACT_MIN_ENTRIES
                && own.entries_in_segments > 2 * own.published.len())
    }

    /// Folds this node's segments into one covering all their sequence numbers. The
    /// compacted segment is renamed in before any old one is removed, so a reader always
    /// finds every sequence number it has not read in some segment.
    fn compact(&mut self) {
        let (Some(first), Some(last)) = (
            self.own.segments.iter().map(|s| s.first).min(),
            self.own.segments.iter().map(|s| s.last).max(),
        ) else {
            return;
        };
        let compacted = SegmentName {
            node: self.node().to_owned(),
            first,
            last,
        };
        let published = self.own.published.clone();
        let tombstones: Vec<Tombstone> = self.own.published_tombstones.iter().collect();
        if !self.own.segments.contains(&compacted) {
            self.own.segments.push(compacted.clone());
        }
        if let Err(error) = self.write_own_record() {
            tracing::debug!(%error, "compaction not recorded; the segments stay as they are");
            self.own.segments.retain(|s| *s != compacted);
            return;
        }
        if let Err(error) = self.write_segment(&compacted, &published, &tombstones) {
            tracing::debug!(%error, "compaction failed; the segments stay as they are");
            return;
        }
        for old in std::mem::take(&mut self.own.segments) {
            if old == compacted {
                continue;
            }
            let path = self.segment_dir().join(old.file_name());
            if let Err(error) = fs::remove_file(&path) {
                // The next load removes what the compacted segment covers.
                tracing::debug!(path = ?path, %error, "old segment not removed");
            }
        }
        tracing::info!(
            segment = %compacted.file_name(),
            entries = published.len(),
            "compacted this node's segments"
        );
        self.own.segments = vec![compacted];
        if let Err(error) = self.write_own_record() {
            // The record still lists the old names: harmless, they are gone.
            tracing::debug!(%error, "compaction's record not updated");
        }
        self.own.entries_in_segments = published.len();
        self.shared
            .counters
            .compactions
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Writes one segment by temp file and rename; returns its bytes.
    fn write_segment(
        &self,
        segment: &SegmentName,
        entries: &EntryMap,
        tombstones: &[Tombstone],
    ) -> Result<u64> {
        let dir = self.segment_dir();
        self.check_segment_dir(Operation::Write)?;
        let key = self.shared.settings.key.clone();
        let temp_path = dir.join(temp_file_name(self.node()));
        let path = dir.join(segment.file_name());
        let write = |out: &mut dyn Write| {
            format::write_segment_with_forgets(
                out,
                self.node(),
                (segment.first, segment.last),
                unix_now_ms(),
                entries,
                tombstones,
                key.as_ref(),
            )
        };
        match self.write_temp_then_rename(&dir, &temp_path, &path, write) {
            Ok(bytes) => Ok(bytes),
            Err((what, error)) => {
                if what != "creating" {
                    // Best effort: a temp file left behind is removed after an hour anyway.
                    let _ = fs::remove_file(&temp_path);
                }
                if what == "linking" && error.kind() == io::ErrorKind::AlreadyExists {
                    return Err(Error::SegmentNameTaken(segment.file_name()));
                }
                let at = if what == "linking" { &path } else { &temp_path };
                Err(self.failed(Operation::Write, what, at, &error))
            }
        }
    }

    /// The steps of one write; an error names the step that failed.
    fn write_temp_then_rename(
        &self,
        dir: &Path,
        temp_path: &Path,
        path: &Path,
        write: impl FnOnce(&mut dyn Write) -> serde_json::Result<()>,
    ) -> Result<u64, (&'static str, io::Error)> {
        let fsync = self.shared.settings.fsync;
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(temp_path)
        };
        let file = match create() {
            // The segment directory is made by the first load; it may not have been
            // possible then (read-only, full) or it was removed since.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                if self.v2_left_to_the_admin().is_some() {
                    return Err(("creating", error));
                }
                fs::create_dir_all(dir).map_err(|e| ("creating", e))?;
                create()
            }
            opened => opened,
        }
        .map_err(|e| ("creating", e))?;
        let mut out = BufWriter::with_capacity(
            1 << 20,
            CountingWriter {
                inner: file,
                bytes: 0,
                total: &self.shared.counters.bytes_written,
            },
        );
        write(&mut out).map_err(|e| ("writing", io::Error::from(e)))?;
        let counted = out.into_inner().map_err(|e| ("writing", e.into_error()))?;
        if fsync {
            counted.inner.sync_all().map_err(|e| ("syncing", e))?;
        }
        let bytes = counted.bytes;
        drop(counted);
        // Linked in, not renamed: a rename would silently replace a segment another writer
        // of this name put there; a link fails instead (atomic on NFS too).
        match fs::hard_link(temp_path, path) {
            Ok(()) => {
                let _ = fs::remove_file(temp_path);
            }
            Err(error) if link_unsupported(&error) => {
                // A filesystem without hard links (some FUSE and object-store mounts): look,
                // then rename. A second writer of this name racing inside that window could
                // still be replaced; every other case is caught.
                if fs::symlink_metadata(path).is_ok() {
                    return Err(("linking", io::Error::from(io::ErrorKind::AlreadyExists)));
                }
                fs::rename(temp_path, path).map_err(|e| ("renaming", e))?;
            }
            Err(error) => return Err(("linking", error)),
        }
        if fsync {
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| ("syncing the directory of", e))?;
        }
        Ok(bytes)
    }
}

/// Another user's file under a name this daemon trusts (its own, or one whose trusted segments
/// it has read) is name squatting: refused like a forgery, so it is warned about and counted
/// (`snapshot_untrusted_files`), never read.
fn squatting(parsed: Result<ParsedSnapshot>, node: &str) -> Result<ParsedSnapshot> {
    match parsed {
        Err(Error::OtherUsersFile(uid)) => Err(Error::Unauthenticated(format!(
            "owned by uid {uid}, not an allowed writer, yet named as node {node:?}, whose \
             segments this daemon trusts: name squatting, never read"
        ))),
        other => other,
    }
}

/// `link(2)` refused because the filesystem has no hard links, not because of the name.
fn link_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EPERM | libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK | libc::ENOSYS)
    )
}

/// Uids as the flag takes them.
fn uid_list(uids: &[u32]) -> String {
    uids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn is_replacement_race(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESTALE)
}

/// `.<node>.seg.tmp.<pid>.<unique>`: hidden, so readers never take it for a segment, and
/// unique per writer.
fn temp_file_name(node: &str) -> String {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{node}{SEGMENT_TEMP_MARKER}{}.{nanos:08x}{sequence:x}",
        std::process::id()
    )
}

/// Removes a temp file left by a writer that crashed more than `STALE_TEMP_AGE` ago.
fn remove_if_stale(path: &Path) {
    let age = fs::symlink_metadata(path)
        .and_then(|metadata| metadata.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok());
    if age.is_some_and(|age| age > STALE_TEMP_AGE) {
        match fs::remove_file(path) {
            Ok(()) => {
                tracing::info!(path = ?path, "removed a crashed writer's temp file")
            }
            Err(error) => tracing::debug!(path = ?path, %error, "temp file not removed"),
        }
    }
}

/// Counts the bytes that reach the file, so the size is known without another stat.
struct CountingWriter<'a> {
    inner: File,
    bytes: u64,
    total: &'a AtomicU64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written as u64;
        self.total.fetch_add(written as u64, Ordering::Relaxed);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
