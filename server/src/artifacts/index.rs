//! The rules of the node's blob store, as one pure type: which blobs it holds, which of them a
//! live entry names, what each uid holds in it (its share: `charges` for the blobs its live
//! entries name, plus its unreferenced uploads), whether an upload or a fetch from the tiers
//! fits under the limits, and which blobs collection may delete. No I/O and no clock: the
//! adapter (`artifacts::Artifacts`) passes the time in and does what the answers say.

use std::collections::{HashMap, HashSet};

use super::charges::Charges;

/// A blob's life in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Hashed to its digest since this daemon started (an upload, a fetch, the start-up pass).
    Verified,
    /// Found on disk at start and not hashed yet: held (a Record may name it), but hashed
    /// before anything of it is served.
    Unverified,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Blob {
    pub size: u64,
    pub check: Check,
    /// Milliseconds (the adapter's monotonic clock) of its upload, or of the last Record or
    /// change that named it: collection keeps it for the grace period after.
    pub touched_ms: u64,
    /// Whose upload it was, while no live entry names it (it counts against that uid's
    /// unreferenced bytes); `None` once named, or for a blob found at start or fetched.
    pub uploader: Option<u32>,
    /// The file's identity when a GetArtifact last hashed all of it to its digest. A serve
    /// that finds the file still so skips hashing it again; any write to the file, a
    /// replacement or a new inode changes the stamp, so those are hashed again before the
    /// stream ends.
    pub served: Option<FileStamp>,
}

/// What identifies a file's bytes without reading them: its inode and size, and its
/// modification and change times to the nanosecond. Every write changes the ctime, which no
/// call can set back, so an unchanged stamp means bytes unchanged since it was taken (bit rot
/// aside, which the clients' own digest check catches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

/// The limits the index enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `--max-artifact-bytes`: one blob.
    pub max_blob_bytes: u64,
    /// `--artifact-store-mib`, in bytes: everything held, being uploaded and being fetched.
    pub store_bytes: u64,
    /// `--artifact-store-mib-per-uid`, in bytes: one uid's share, the blobs its live entries
    /// name and its uploads no live entry names yet.
    pub store_bytes_per_uid: u64,
    /// `--artifact-unreferenced-mib-per-uid`, in bytes: one uid's uploads no live entry names
    /// yet, held or being uploaded.
    pub unreferenced_bytes_per_uid: u64,
    /// `--artifact-grace-secs`, in milliseconds.
    pub grace_ms: u64,
}

/// Why an upload does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Over `--max-artifact-bytes`.
    BlobTooLarge { size: u64, limit: u64 },
    /// The store would pass `--artifact-store-mib` even after collecting what it may.
    StoreFull { size: u64, held: u64, limit: u64 },
    /// The uid's unreferenced uploads would pass `--artifact-unreferenced-mib-per-uid`.
    UidUnreferenced {
        uid: u32,
        size: u64,
        held: u64,
        limit: u64,
    },
    /// The uid's share would pass `--artifact-store-mib-per-uid`.
    UidShare {
        uid: u32,
        size: u64,
        held: u64,
        limit: u64,
    },
}

impl Refusal {
    /// The bytes refused.
    pub fn size(&self) -> u64 {
        match *self {
            Refusal::BlobTooLarge { size, .. }
            | Refusal::StoreFull { size, .. }
            | Refusal::UidUnreferenced { size, .. }
            | Refusal::UidShare { size, .. } => size,
        }
    }
}

/// What `admit` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Reserved: the upload may go on (`release` or `insert` ends the reservation).
    Reserved,
    /// It fits once these unreferenced, past-grace blobs are deleted: delete them
    /// (`forget_blob` each), then ask again.
    CollectFirst(Vec<String>),
    Refused(Refusal),
}

/// The store's state. One per node, behind the adapter's lock.
#[derive(Debug)]
pub struct Index {
    limits: Limits,
    blobs: HashMap<String, Blob>,
    /// Digests a live entry names, as the last collection scan found them, plus what Records
    /// and the change feed named since (`name`). A GetArtifact of a digest in here that the
    /// store lacks is fetched from the tiers below.
    named: HashMap<String, u64>,
    /// Named since the scan in progress began: kept when that scan's result replaces `named`.
    named_since_scan: HashSet<String>,
    held_bytes: u64,
    /// Bytes reserved by uploads and fetches in progress, in all, and by uploads per uid.
    reserved_bytes: u64,
    reserved_by_uid: HashMap<u32, u64>,
    /// Blobs out of the index whose files are being removed: an upload or fetch of one of
    /// them must not rename its file in until the removal is done (it would be removed).
    deleting: HashSet<String>,
    /// Who is charged for the blobs live entries name.
    charges: Charges,
}

impl Index {
    pub fn new(limits: Limits) -> Index {
        Index {
            limits,
            blobs: HashMap::new(),
            named: HashMap::new(),
            named_since_scan: HashSet::new(),
            held_bytes: 0,
            reserved_bytes: 0,
            reserved_by_uid: HashMap::new(),
            deleting: HashSet::new(),
            charges: Charges::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn charges(&self) -> &Charges {
        &self.charges
    }

    pub fn charges_mut(&mut self) -> &mut Charges {
        &mut self.charges
    }

    pub fn blob(&self, digest: &str) -> Option<&Blob> {
        self.blobs.get(digest)
    }

    pub fn digests(&self) -> impl Iterator<Item = &str> + '_ {
        self.blobs.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.blobs.len()
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The size a live entry names `digest` with, if one does.
    pub fn named_size(&self, digest: &str) -> Option<u64> {
        self.named.get(digest).copied()
    }

    pub fn named(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.named
            .iter()
            .map(|(digest, size)| (digest.clone(), *size))
    }

    /// A blob found on disk at start: held, not yet verified.
    pub fn found(&mut self, digest: String, size: u64, now_ms: u64) {
        self.put(
            digest,
            Blob {
                size,
                check: Check::Unverified,
                touched_ms: now_ms,
                uploader: None,
                served: None,
            },
        );
    }

    pub fn verified(&mut self, digest: &str) {
        if let Some(blob) = self.blobs.get_mut(digest) {
            blob.check = Check::Verified;
        }
    }

    /// A serve hashed all of `digest`'s file, found with `stamp`, to its digest.
    pub fn served_whole(&mut self, digest: &str, stamp: FileStamp) {
        if let Some(blob) = self.blobs.get_mut(digest) {
            blob.check = Check::Verified;
            blob.served = Some(stamp);
        }
    }

    /// Whether a serve of `digest` from a file found with `stamp` must hash it: unless the
    /// blob is verified and a serve hashed this very file, unchanged since.
    pub fn must_hash(&self, digest: &str, stamp: &FileStamp) -> bool {
        self.blobs
            .get(digest)
            .is_none_or(|blob| blob.check != Check::Verified || blob.served.as_ref() != Some(stamp))
    }

    /// Whether an upload of blob `digest`, `size` bytes, from `uid` fits; reserves it if so.
    pub fn admit(&mut self, uid: u32, digest: &str, size: u64, now_ms: u64) -> Admit {
        let limits = self.limits;
        if size > limits.max_blob_bytes {
            return Admit::Refused(Refusal::BlobTooLarge {
                size,
                limit: limits.max_blob_bytes,
            });
        }
        let unreferenced = self.unreferenced_bytes_of(uid);
        if unreferenced.saturating_add(size) > limits.unreferenced_bytes_per_uid {
            return Admit::Refused(Refusal::UidUnreferenced {
                uid,
                size,
                held: unreferenced,
                limit: limits.unreferenced_bytes_per_uid,
            });
        }
        // A blob the uid's live entries name already (and the store lost) costs its share
        // nothing more.
        let adds = if self.charges.names(uid, digest) {
            0
        } else {
            size
        };
        let share = self.charges.bytes_of(uid) + unreferenced;
        if share.saturating_add(adds) > limits.store_bytes_per_uid {
            return Admit::Refused(Refusal::UidShare {
                uid,
                size,
                held: share,
                limit: limits.store_bytes_per_uid,
            });
        }
        let admit = self.admit_to_store(size, now_ms);
        if admit == Admit::Reserved {
            *self.reserved_by_uid.entry(uid).or_default() += size;
        }
        admit
    }

    /// Whether a fetch of `size` bytes from the tiers fits in the store (it names no uid: an
    /// entry from a tier is charged to nobody); reserves it if so. `release_fetch` ends it.
    pub fn admit_fetch(&mut self, size: u64, now_ms: u64) -> Admit {
        self.admit_to_store(size, now_ms)
    }

    pub fn release_fetch(&mut self, size: u64) {
        self.reserved_bytes = self.reserved_bytes.saturating_sub(size);
    }

    /// The store's own bound: reserves `size` if it fits, else names what to collect first
    /// (unreferenced blobs past their grace period, oldest first), else refuses.
    fn admit_to_store(&mut self, size: u64, now_ms: u64) -> Admit {
        let limits = self.limits;
        let used = self.held_bytes + self.reserved_bytes;
        if used.saturating_add(size) > limits.store_bytes {
            let over = used.saturating_add(size) - limits.store_bytes;
            let mut candidates = self.collectable(now_ms);
            // Oldest first; collect only what is needed.
            candidates.sort_by_key(|digest| self.blobs[digest].touched_ms);
            let mut freed = 0;
            let mut chosen = Vec::new();
            for digest in candidates {
                if freed >= over {
                    break;
                }
                freed += self.blobs[&digest].size;
                chosen.push(digest);
            }
            if freed >= over {
                return Admit::CollectFirst(chosen);
            }
            return Admit::Refused(Refusal::StoreFull {
                size,
                held: used,
                limit: limits.store_bytes,
            });
        }
        self.reserved_bytes += size;
        Admit::Reserved
    }

    /// Ends a reservation `admit` made (the upload ended, stored or not).
    pub fn release(&mut self, uid: u32, size: u64) {
        self.reserved_bytes = self.reserved_bytes.saturating_sub(size);
        if let Some(held) = self.reserved_by_uid.get_mut(&uid) {
            *held = held.saturating_sub(size);
            if *held == 0 {
                self.reserved_by_uid.remove(&uid);
            }
        }
    }

    /// A verified blob is now on disk under its digest (an upload by `uploader`, or a fetch).
    /// Returns false if it was held already (the bytes are the same).
    pub fn insert(
        &mut self,
        digest: String,
        size: u64,
        uploader: Option<u32>,
        now_ms: u64,
    ) -> bool {
        if let Some(blob) = self.blobs.get_mut(&digest) {
            blob.check = Check::Verified;
            blob.touched_ms = now_ms;
            return false;
        }
        let uploader = if self.named.contains_key(&digest) {
            None
        } else {
            uploader
        };
        self.put(
            digest,
            Blob {
                size,
                check: Check::Verified,
                touched_ms: now_ms,
                uploader,
                served: None,
            },
        );
        true
    }

    fn put(&mut self, digest: String, blob: Blob) {
        self.held_bytes += blob.size;
        if let Some(old) = self.blobs.insert(digest, blob) {
            self.held_bytes -= old.size;
        }
    }

    /// The blob is gone (collected, or its bytes failed their digest).
    pub fn forget_blob(&mut self, digest: &str) -> Option<Blob> {
        let blob = self.blobs.remove(digest)?;
        self.held_bytes -= blob.size;
        Some(blob)
    }

    /// Takes a blob out of the index to remove its file: `is_deleting` holds until
    /// `deleted`.
    pub fn begin_delete(&mut self, digest: &str) -> Option<Blob> {
        let blob = self.forget_blob(digest)?;
        self.deleting.insert(digest.to_owned());
        Some(blob)
    }

    pub fn deleted(&mut self, digest: &str) {
        self.deleting.remove(digest);
    }

    pub fn is_deleting(&self, digest: &str) -> bool {
        self.deleting.contains(digest)
    }

    /// A Record (or a change) names `digest` of `size`: keeps the blob for the grace period
    /// from now and stops counting it against its uploader.
    pub fn name(&mut self, digest: &str, size: u64, now_ms: u64) {
        if !self.named.contains_key(digest) {
            self.named.insert(digest.to_owned(), size);
        }
        self.named_since_scan.insert(digest.to_owned());
        if let Some(blob) = self.blobs.get_mut(digest) {
            blob.touched_ms = now_ms;
            blob.uploader = None;
        }
    }

    /// A collection scan begins: what is named or charged from now on is kept when it ends.
    pub fn scan_started(&mut self) {
        self.named_since_scan.clear();
        self.charges.scan_started();
    }

    /// A collection scan's result: the digests the live entries name now, and those entries
    /// (`charges::EntryIds`, key to result). Blobs no longer named count against nobody
    /// (their uploader's upload was recorded); collection deletes them after the grace
    /// period. Charges of entries no longer live end.
    pub fn scan_finished(&mut self, named: HashMap<String, u64>, live: &HashMap<u64, u64>) {
        self.charges.scan_finished(live);
        let mut named = named;
        for digest in self.named_since_scan.drain() {
            if let Some(size) = self.named.get(&digest) {
                named.entry(digest).or_insert(*size);
            }
        }
        for (digest, blob) in &mut self.blobs {
            if named.contains_key(digest) {
                blob.uploader = None;
            }
        }
        self.named = named;
    }

    /// Unreferenced blobs past their grace period: what collection deletes.
    pub fn collectable(&self, now_ms: u64) -> Vec<String> {
        self.blobs
            .iter()
            .filter(|(digest, blob)| {
                !self.named.contains_key(*digest)
                    && blob.touched_ms.saturating_add(self.limits.grace_ms) <= now_ms
            })
            .map(|(digest, _)| digest.clone())
            .collect()
    }

    /// The uid's uploads that no live entry names, held or in progress.
    pub fn unreferenced_bytes_of(&self, uid: u32) -> u64 {
        let held: u64 = self
            .blobs
            .iter()
            .filter(|(digest, blob)| {
                blob.uploader == Some(uid) && !self.named.contains_key(*digest)
            })
            .map(|(_, blob)| blob.size)
            .sum();
        held + self.reserved_by_uid.get(&uid).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
