//! Artifact blobs in the shared directory, under `DIR/v2/artifacts/` (the layout and what is
//! trusted there: `plan::blob_layout`): each writer uid's blobs in a directory of its own,
//! `<uid>/`, one file per digest, written once by whichever node of that uid publishes it
//! first (a temporary file, then a link, which never replaces what another node linked in).
//!
//! A node publishes the blobs its own contributions name before the segment that names them
//! (on the snapshot I/O thread, `io::blobs`), and fetches a blob only when a GetArtifact asks
//! for one it lacks ([`SharedDirBlobs`], a tier of the artifact store), so the shared
//! filesystem never carries nodes × store bytes. A blob needs no MAC: a reader takes it only
//! because an entry from a trusted segment (or Redis) names its digest, only from a trusted
//! writer's regular file of the entry's size, and the store keeps the bytes only if they hash
//! to it. A blob that cannot be published never holds back the segment naming it.
//!
//! - `dirs`: `v2/artifacts/` checked (and made, when this daemon may) and a writer's
//!   directory found or made;
//! - `publish`: the blobs linked in;
//! - `read`: one blob read for the store;
//! - `sweep`: blobs no live entry names collected, in the two steps of `plan::blob_sweep`
//!   (renamed to this node's trash, then deleted one pass later unless named again), only
//!   after a load that read every trusted segment; after each segment it links in, a
//!   publisher links in afresh any blob the segment names that is missing. So a blob a live
//!   segment names is never left deleted.

mod dirs;
mod publish;
mod read;
mod sweep;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::artifacts::{BlobSource, Partial};
use crate::error::TierError;
use crate::report::LogOnce;
use crate::snapshot::plan::trust::Writers;
use crate::tiers::TierKind;

pub(crate) use dirs::{check_blob_dir, writer_dir};
pub(crate) use publish::link_missing;
pub(crate) use sweep::{sweep, SweepReport};

/// The blobs' directory under `v2/`.
pub const BLOB_DIR: &str = "artifacts";

/// Names held by an untrusted owner where blobs are looked for or go (`v2/artifacts/` itself,
/// a writer's `<uid>/`, a blob's name): squatting, never obeyed. Each is counted
/// (`artifact_shared_dir_squatted`) and logged once.
#[derive(Default)]
pub(crate) struct Squats {
    names: AtomicU64,
    logged: LogOnce,
}

impl Squats {
    pub(crate) fn report(&self, path: &Path, owner: u32) {
        if self.logged.first(path.display().to_string()) {
            self.names.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                path = ?path,
                owner,
                "a name in the shared blob directory is held by uid {owner}, not a trusted \
                 writer: squatted, never used (blobs go and are looked for elsewhere; logged \
                 once per name)"
            );
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.names.load(Ordering::Relaxed)
    }
}

/// The shared directory as a tier of the artifact store.
pub struct SharedDirBlobs {
    /// `DIR/v2/artifacts`.
    dir: PathBuf,
    /// This daemon's uid first, then `--shared-dir-writer-uid`: whose blobs it takes.
    writer_uids: Arc<[u32]>,
    keyed: bool,
    squats: Arc<Squats>,
    fallbacks: Arc<read::FallbackListing>,
}

impl SharedDirBlobs {
    pub(crate) fn new(
        segment_dir: &Path,
        writer_uids: &[u32],
        keyed: bool,
        squats: Arc<Squats>,
    ) -> SharedDirBlobs {
        SharedDirBlobs {
            dir: segment_dir.join(BLOB_DIR),
            writer_uids: writer_uids.into(),
            keyed,
            squats,
            fallbacks: Arc::default(),
        }
    }

    /// The names squatted where it looks, which the publisher reports to as well.
    pub(crate) fn squats(&self) -> Arc<Squats> {
        Arc::clone(&self.squats)
    }
}

impl BlobSource for SharedDirBlobs {
    fn kind(&self) -> TierKind {
        TierKind::SharedDir
    }

    fn fetch(
        &self,
        digest: String,
        size: u64,
        into: Partial,
    ) -> crate::artifacts::tiers::FetchFuture {
        let dir = self.dir.clone();
        let uids = Arc::clone(&self.writer_uids);
        let keyed = self.keyed;
        let squats = Arc::clone(&self.squats);
        let fallbacks = Arc::clone(&self.fallbacks);
        Box::pin(async move {
            let shown = dir.clone();
            let what = format!("reading blob {digest} under");
            // The caller bounds the wait; a hung mount holds only this blocking thread.
            tokio::task::spawn_blocking(move || {
                let writers = Writers { uids: &uids, keyed };
                read::read_blob(&dir, &digest, size, writers, &squats, &fallbacks, into)
            })
            .await?
            .map_err(|e| TierError::io(what, shown, e))
        })
    }
}
