//! The tiers below the node's store that share results across nodes (the shared directory,
//! Redis; the read-only bundles): the one interface each implements for what crosses
//! it ([`Tier`]), the order they are listed and asked in ([`TIER_ORDER`], declared here and
//! nowhere else), the list the daemon builds once ([`Tiers`], in `list`), and the memo of the
//! blobs a tier holds ([`PublishedBlobs`], the one both publishers keep).
//!
//! What a tier does inside (segments on an I/O thread; streams, scripts and a publish queue)
//! stays its own: the trait covers only what the daemon asks of every tier. A tier's blob
//! fetching side (`artifacts::BlobSource`) is built from its settings before the artifact
//! store opens, since the store is opened with its sources; the tier itself is started with
//! the store, whose blobs it publishes.

mod list;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::TierResult;

pub use list::{Tiers, SHUTDOWN_PUBLISH_LIMIT};

/// Which tier a thing is (counted per tier in Stats, named in reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierKind {
    Bundle,
    SharedDir,
    Cluster,
}

/// The order of the tiers, wherever they are listed: a missing blob is asked of the bundles
/// (a local file, verified at start) first, then the shared directory (a file read on this
/// network), then Redis; the last publish at shutdown and the health names go in the same
/// order. Whatever order the tiers are built in, they are listed in this one.
pub const TIER_ORDER: [TierKind; 3] = [TierKind::Bundle, TierKind::SharedDir, TierKind::Cluster];

impl TierKind {
    /// Its place in `TIER_ORDER`.
    pub fn rank(self) -> usize {
        TIER_ORDER
            .iter()
            .position(|kind| *kind == self)
            .unwrap_or(TIER_ORDER.len())
    }

    /// As a blob fetch's answer names it.
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Bundle => "a bundle",
            TierKind::SharedDir => "the shared directory",
            TierKind::Cluster => "Redis",
        }
    }

    /// As the report of the last publish at shutdown names it.
    pub fn part_name(self) -> &'static str {
        match self {
            TierKind::Bundle => "bundles",
            TierKind::SharedDir => "shared directory",
            TierKind::Cluster => "cluster tier",
        }
    }
}

/// A tier's own name on the gRPC health service, and how often its state is polled.
#[derive(Clone, Copy, Debug)]
pub struct TierHealth {
    pub name: &'static str,
    pub poll: Duration,
}

/// What a tier's operation answers, later.
pub type TierFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What crosses a tier, as the daemon asks it of each: its kind, its health, its resume
/// point and the publish of what is pending. Blobs cross through its `BlobSource`, built
/// before the artifact store (which is opened with it), and through its own publisher.
pub trait Tier: Send + Sync {
    /// Which tier this is: its place in `TIER_ORDER`, its name in reports.
    fn kind(&self) -> TierKind;

    /// Its name on the gRPC health service and how often `serving` is asked.
    fn health(&self) -> TierHealth;

    /// Whether it works now (SERVING on its health name). Asked every `health().poll`:
    /// reads state only, never waits.
    fn serving(&self) -> bool;

    /// Saves where this node has read the other nodes' publications through, so that its
    /// next start reads only what comes after. The default: a tier that keeps none.
    fn save_resume_point(&self) -> TierFuture<'_, TierResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Publishes what of this node's is pending (entries, tombstones and the blobs they
    /// name) before `deadline`, and says what happened. `None`: this tier publishes nothing
    /// (a read-only tier), the default.
    fn publish_pending(&self, deadline: tokio::time::Instant) -> TierFuture<'_, Option<String>> {
        let _ = deadline;
        Box::pin(async { None })
    }
}

/// The digests a tier is known to hold, so that each blob is published to it once per daemon
/// run (a fresh memo looks at every one again). Both tiers keep one: the shared directory's
/// I/O thread for its writer directory, the cluster tier for Redis's blob keys.
#[derive(Debug, Default)]
pub struct PublishedBlobs(HashSet<String>);

impl PublishedBlobs {
    /// Whether `digest` is known to be in the tier: nothing to publish.
    pub fn holds(&self, digest: &str) -> bool {
        self.0.contains(digest)
    }

    /// `digest` is in the tier now (published, found there, or never to be published there).
    pub fn mark(&mut self, digest: String) {
        self.0.insert(digest);
    }

    /// Every digest of `digests` is in the tier (one listing of it).
    pub fn mark_all(&mut self, digests: impl IntoIterator<Item = String>) {
        self.0.extend(digests);
    }

    /// The tier may have lost `digest`: look at it again on the next publish.
    pub fn unmark(&mut self, digest: &str) {
        self.0.remove(digest);
    }

    /// The tier may have lost anything (a flushed server, a removed directory).
    pub fn forget_all(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_memo_forgets_what_a_tier_may_have_lost() {
        let mut memo = PublishedBlobs::default();
        memo.mark("a".into());
        memo.mark_all(["b".to_owned(), "c".to_owned()]);
        assert!(memo.holds("a") && memo.holds("b") && memo.holds("c"));
        memo.unmark("b");
        assert!(!memo.holds("b") && memo.holds("c"));
        memo.forget_all();
        assert!(!memo.holds("a") && !memo.holds("c"));
    }
}
