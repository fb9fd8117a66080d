//! The snapshot's rules as one pure step: from a listing of the shared directory (names,
//! owners, modes and versions of the files seen), this node's own record and its settings,
//! to what to read, what to trust, what to publish and what to compact. Plain types and
//! functions; the I/O thread (`io`) makes every filesystem call and carries out what these
//! decide, so each rule is tested here without a filesystem.
//!
//! - `listing`: what a listing holds, by name (version-1 files, each node's segments, temp
//!   files of writers that crashed), and which version-1 files changed since they were read.
//! - `trust`: who may speak: the verdicts on `v2/`, on a missing `v2/`, on a file's owner, on
//!   a segment whose contents disagree with its name, on a squatter under a trusted name.
//! - `peers`: where this reader stands with each other node's segments, what it reads next.
//! - `own`: what this node knows of its own segments: its record, the first load, each later
//!   listing reconciled with it, the name of each segment it writes.
//! - `not_ours`: the segments under this node's name it did not write, and who wrote each.
//! - `publish`: what a publish writes, when the own segments are compacted and into what.
//! - `merged`: the places in other nodes' segments this reader has merged through, kept in
//!   the state directory, and when a remembered place still holds after a restart.
//! - `blob_layout`: where blobs live under `v2/artifacts/` (a directory per writer uid) and
//!   which file there a reader may take.
//! - `blob_sweep`: what a sweep of `v2/artifacts/` does with each name there.

pub(super) mod blob_layout;
pub(super) mod blob_sweep;
pub(super) mod listing;
pub(super) mod merged;
pub(super) mod not_ours;
pub(super) mod own;
pub(super) mod peers;
pub(super) mod publish;
pub(super) mod trust;
