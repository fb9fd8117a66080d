//! What the descriptor handoff hands (its door is `crate::handoff`): the file of a held blob,
//! opened read-only for a rank on this node to read directly.
//!
//! - **What is handed** is what GetArtifact would stream: the file was hashed whole to its
//!   digest as this very file (the index's stamp: device, inode, size, mtime, ctime), hashed
//!   here first otherwise. A file that does not match is dropped and answered `not-held`, and
//!   the client's GetArtifact then fetches the blob again from the tiers. The daemon writes a
//!   blob only by a rename of a new file, never in place, so a handed file stays as hashed.
//! - **Read-only for its receiver**: the file is mode 0444 and the daemon's (`disk`), so a
//!   rank of another uid can neither `fchmod` it nor reopen it writable through
//!   `/proc/self/fd`. A rank of the daemon's own uid can change its mode, as it can change any
//!   of that uid's files: a handed file found with another mode is set back to 0444 first
//!   (which changes its ctime, so it is hashed again), and the clients check its size, and its
//!   digest with `TUNECACHE_VERIFY=1` (docs/artifacts.md).
//! - **A cold blob** (named by a held entry, not on this node yet) is fetched from the tiers
//!   first, the one fetch per digest GetArtifact waits on (`tiers`), and then handed: a rank
//!   gets a descriptor on its first fetch too, never a stream because it asked first.
//! - **Nothing waits on the runtime**: opening and hashing run on the blocking pool with the
//!   store's bounded wait.

use std::fs::File;
use std::io::Seek;
use std::sync::Arc;
use std::time::Duration;

use super::ArtifactError;
use super::{add, disk, Artifacts};

/// What a handoff open found.
enum Opened {
    File(File),
    /// Gone, the wrong size, or bytes that do not hash to the digest.
    Bad,
}

impl Artifacts {
    /// Opens blob `digest` to hand its descriptor over, with its size. A blob this node lacks
    /// but a held entry names (a cold blob) is fetched from the tiers first, as GetArtifact
    /// fetches it, waiting at most `wait`. `None` when no entry here names it, the tiers did
    /// not supply it within `wait` (the fetch goes on; the caller's GetArtifact waits on the
    /// same one and hears why), or its file turned out not to be the blob (dropped, counted,
    /// fetched again by that stream).
    pub async fn open_for_handoff(
        self: &Arc<Self>,
        digest: &str,
        wait: Duration,
    ) -> Result<Option<(File, u64)>, ArtifactError> {
        let named = crate::sync::lock(&self.index).named_size(digest).is_some();
        let held = crate::sync::lock(&self.index).blob(digest).is_some();
        // Not named, not held: asking the tiers would only count a miss GetArtifact counts.
        if !held && (!named || self.fetch_if_named(digest, wait).await.is_err()) {
            return Ok(None);
        }
        let Some(blob) = crate::sync::lock(&self.index).blob(digest).cloned() else {
            return Ok(None);
        };
        let path = self.dir.path_of(digest);
        let (artifacts, name, size) = (Arc::clone(self), digest.to_owned(), blob.size);
        let opened = Self::blocking("opening a blob to hand it over", move || {
            let Ok(mut file) = File::open(&path) else {
                return Ok(Opened::Bad);
            };
            let mut metadata = file.metadata()?;
            if !disk::has_blob_mode(&metadata) {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(disk::BLOB_MODE))?;
                metadata = file.metadata()?;
            }
            let stamp = disk::stamp_of(&metadata);
            if stamp.len != size {
                return Ok(Opened::Bad);
            }
            if crate::sync::lock(&artifacts.index).must_hash(&name, &stamp) {
                let (hashed, len) = disk::hash_open(&mut file)?;
                if hashed != name || len != size {
                    return Ok(Opened::Bad);
                }
                crate::sync::lock(&artifacts.index).served_whole(&name, stamp);
                // The receiver shares this file offset: it starts at the first byte.
                file.rewind()?;
            }
            Ok(Opened::File(file))
        })
        .await?;
        match opened {
            Opened::File(file) => {
                add(&self.counters.fetches_local, 1);
                add(&self.counters.handoffs, 1);
                add(&self.counters.bytes_served, size);
                Ok(Some((file, size)))
            }
            Opened::Bad => {
                self.drop_corrupt(digest).await;
                Ok(None)
            }
        }
    }
}
