//! The change feed: what the writer tells its subscribers about every change, after it is
//! durable and visible to readers, and before the writes that made it are answered.
//!
//! Its subscribers: the coordinator (wakes callers waiting for a key), the views (pin a lease
//! holder's result), the cluster tier (publishes what it did not bring itself), the snapshot
//! writer (publishes this node's contributions). Each change says where it came from
//! (`Source`), so no subscriber keeps its own record of what it wrote.

use std::sync::Arc;

use crate::model::entry::CacheKey;
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;
use crate::wire::stored::StoredEntry;

/// Told, on the writer thread, about every entry that changed, after it is durable and
/// visible to readers, and before the writes that made the changes are answered.
pub trait ChangeListener: Send + Sync {
    fn entries_changed(&self, changes: &[Change]);

    /// Tombstones this node learned or made, after they are durable and their entries are
    /// gone from what readers see.
    fn forgotten(&self, _forgets: &[ForgetChange]) {}

    /// Keys whose last use rose (`model::lifecycle`) without their entry changing, after the
    /// days are journalled: this node's ranks read them (`Source::Read`), a Record repeated
    /// a result held, or another node reported a use.
    fn used(&self, _uses: &[UseChange]) {}

    /// Entries expired (unused past their retention, or past `--max-entries`), after they are
    /// gone from what readers see.
    fn expired(&self, _entries: &[StoredEntry]) {}
}

/// A last use raised, as the feed tells it.
#[derive(Clone, Debug)]
pub struct UseChange {
    /// The entry whose key was used (the cache's, when the use was journalled).
    pub entry: StoredEntry,
    pub day: Day,
    /// `Source::Read` or `Source::Record` (a use on this node: the tiers publish it), else
    /// the tier that reported it.
    pub source: Source,
}

/// A tombstone new to this node, as the feed tells it.
#[derive(Clone, Debug, PartialEq)]
pub struct ForgetChange {
    pub tombstone: Tombstone,
    /// `Source::Forget` when asked of this node (it publishes those), else where it came from.
    pub source: Source,
    /// Entries it removed from this node's cache.
    pub dropped: u32,
}

/// Where a change came from: the feed's subscribers filter on it, instead of keeping their
/// own records of what they wrote.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A rank's Record, with the lease it was tuned under, if any.
    Record { lease: Option<Arc<RecordLease>> },
    /// The node's tuner worker.
    Tuner,
    /// A segment read from the shared directory.
    Snapshot,
    /// The Redis cluster tier.
    Cluster,
    /// A bundle (`--bundle`), merged at start.
    Bundle,
    /// A Forget asked of this node (the Forget RPC).
    Forget,
    /// Reads by this node's ranks (Lookup, Scan, Resolve): last uses only.
    Read,
}

/// The lease a Record was tuned under, as the coordinator knew it when the Record arrived:
/// its id and, while this node held it, the key it was granted for and the job view of the
/// Resolve it was granted to (`views` pins the holder's result there).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordLease {
    pub id: String,
    pub key: Option<CacheKey>,
    pub view: Option<crate::model::names::ViewId>,
}

/// One changed entry, as the feed tells it.
#[derive(Clone, Debug)]
pub struct Change {
    pub entry: StoredEntry,
    pub source: Source,
    /// The cache's winner for the key is now `entry`: readers see it.
    pub in_cache: bool,
    /// This node's own contributions (what it publishes) now hold `entry`.
    pub own: bool,
}
