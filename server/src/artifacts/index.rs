//! The rules of the node's blob store, as one pure type: which blobs it holds, which of them a
//! live entry names, what each uid's unreferenced uploads weigh, whether an upload fits under
//! the limits, and which blobs collection may delete. No I/O and no clock: the adapter
//! (`artifacts::Artifacts`) passes the time in and does what the answers say.

use std::collections::{HashMap, HashSet};

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
    /// `--artifact-store-mib`, in bytes: everything held and being uploaded.
    pub store_bytes: u64,
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
    /// Bytes reserved by uploads in progress, in all and per uid.
    reserved_bytes: u64,
    reserved_by_uid: HashMap<u32, u64>,
    /// Blobs out of the index whose files are being removed: an upload or fetch of one of
    /// them must not rename its file in until the removal is done (it would be removed).
    deleting: HashSet<String>,
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
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
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

    /// Whether an upload of `size` bytes from `uid` fits; reserves it if so.
    pub fn admit(&mut self, uid: u32, size: u64, now_ms: u64) -> Admit {
        let limits = self.limits;
        if size > limits.max_blob_bytes {
            return Admit::Refused(Refusal::BlobTooLarge {
                size,
                limit: limits.max_blob_bytes,
            });
        }
        let uid_held = self.unreferenced_bytes_of(uid);
        if uid_held.saturating_add(size) > limits.unreferenced_bytes_per_uid {
            return Admit::Refused(Refusal::UidUnreferenced {
                uid,
                size,
                held: uid_held,
                limit: limits.unreferenced_bytes_per_uid,
            });
        }
        let used = self.held_bytes + self.reserved_bytes;
        if used.saturating_add(size) > limits.store_bytes {
            let over = used.saturating_add(size) - limits.store_bytes;
            let mut candidates = self.collectable(now_ms);
            // Oldest first; collect only what the upload needs.
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
        *self.reserved_by_uid.entry(uid).or_default() += size;
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

    /// A collection scan begins: what is named from now on is kept when it ends.
    pub fn scan_started(&mut self) {
        self.named_since_scan.clear();
    }

    /// A collection scan's result: the digests the live entries name now. Blobs no longer
    /// named count against nobody (their uploader's upload was recorded); collection deletes
    /// them after the grace period.
    pub fn scan_finished(&mut self, named: HashMap<String, u64>) {
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
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn limits() -> Limits {
        Limits {
            max_blob_bytes: 8 * MIB,
            store_bytes: 20 * MIB,
            unreferenced_bytes_per_uid: 12 * MIB,
            grace_ms: 1_000,
        }
    }

    fn digest(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn upload(index: &mut Index, uid: u32, n: u8, size: u64, now: u64) {
        assert_eq!(index.admit(uid, size, now), Admit::Reserved);
        index.release(uid, size);
        assert!(index.insert(digest(n), size, Some(uid), now));
    }

    #[test]
    fn a_blob_over_the_limit_is_refused() {
        let mut index = Index::new(limits());
        assert_eq!(
            index.admit(1, 8 * MIB + 1, 0),
            Admit::Refused(Refusal::BlobTooLarge {
                size: 8 * MIB + 1,
                limit: 8 * MIB
            })
        );
        assert_eq!(index.admit(1, 8 * MIB, 0), Admit::Reserved);
    }

    #[test]
    fn one_uid_cannot_fill_the_store_with_unreferenced_uploads() {
        let mut index = Index::new(limits());
        upload(&mut index, 1, 1, 8 * MIB, 0);
        // In progress counts too.
        assert_eq!(index.admit(1, 4 * MIB, 0), Admit::Reserved);
        assert_eq!(
            index.admit(1, 1, 0),
            Admit::Refused(Refusal::UidUnreferenced {
                uid: 1,
                size: 1,
                held: 12 * MIB,
                limit: 12 * MIB
            })
        );
        // Another uid is not held to uid 1's bytes.
        assert_eq!(index.admit(2, 8 * MIB, 0), Admit::Reserved);
        index.release(2, 8 * MIB);
        index.release(1, 4 * MIB);
        // Once a Record names it, it is no longer uid 1's.
        index.name(&digest(1), 8 * MIB, 5);
        assert_eq!(index.unreferenced_bytes_of(1), 0);
        assert_eq!(index.admit(1, 8 * MIB, 5), Admit::Reserved);
    }

    #[test]
    fn a_full_store_collects_only_unnamed_blobs_past_grace_then_refuses() {
        let mut index = Index::new(limits());
        upload(&mut index, 1, 1, 8 * MIB, 0);
        upload(&mut index, 2, 2, 8 * MIB, 0);
        index.name(&digest(2), 8 * MIB, 0);
        // Within the grace period nothing may go: refused, naming the store.
        assert_eq!(
            index.admit(3, 8 * MIB, 500),
            Admit::Refused(Refusal::StoreFull {
                size: 8 * MIB,
                held: 16 * MIB,
                limit: 20 * MIB
            })
        );
        // Past it, the unnamed blob is collected; the named one never.
        assert_eq!(
            index.admit(3, 8 * MIB, 1_000),
            Admit::CollectFirst(vec![digest(1)])
        );
        assert_eq!(index.collectable(10_000), vec![digest(1)]);
        index.forget_blob(&digest(1));
        assert_eq!(index.admit(3, 8 * MIB, 1_000), Admit::Reserved);
        assert_eq!(index.held_bytes(), 8 * MIB);
    }

    #[test]
    fn a_scan_keeps_what_was_named_while_it_ran_and_drops_the_rest() {
        let mut index = Index::new(limits());
        upload(&mut index, 1, 1, MIB, 0);
        upload(&mut index, 1, 2, MIB, 0);
        index.name(&digest(1), MIB, 0);
        index.scan_started();
        // Named while the scan ran (from a version it did not read).
        index.name(&digest(2), MIB, 0);
        // The scan found neither: digest 1's entry was beaten.
        index.scan_finished(HashMap::new());
        assert_eq!(index.named_size(&digest(1)), None);
        assert_eq!(index.named_size(&digest(2)), Some(MIB));
        assert_eq!(index.collectable(2_000), vec![digest(1)]);
        // The next scan that does not find digest 2 lets it go too.
        index.scan_started();
        index.scan_finished(HashMap::new());
        let mut collectable = index.collectable(2_000);
        collectable.sort();
        assert_eq!(collectable, vec![digest(1), digest(2)]);
    }

    #[test]
    fn a_second_upload_of_a_held_blob_changes_nothing() {
        let mut index = Index::new(limits());
        upload(&mut index, 1, 1, MIB, 0);
        assert!(!index.insert(digest(1), MIB, Some(2), 10));
        assert_eq!(index.len(), 1);
        assert_eq!(index.held_bytes(), MIB);
        assert_eq!(index.unreferenced_bytes_of(2), 0);
        assert_eq!(index.blob(&digest(1)).map(|b| b.touched_ms), Some(10));
    }

    fn stamp(ino: u64, ctime_ns: i128) -> FileStamp {
        FileStamp {
            dev: 1,
            ino,
            len: MIB,
            mtime_ns: 5,
            ctime_ns,
        }
    }

    #[test]
    fn a_serve_skips_the_hash_only_for_the_verified_file_it_hashed_unchanged() {
        let mut index = Index::new(limits());
        index.found(digest(1), MIB, 0);
        // Found at start: hashed on its first serve, whatever its stamp.
        assert!(index.must_hash(&digest(1), &stamp(7, 9)));
        index.served_whole(&digest(1), stamp(7, 9));
        assert_eq!(
            index.blob(&digest(1)).map(|b| b.check),
            Some(Check::Verified)
        );
        assert!(!index.must_hash(&digest(1), &stamp(7, 9)));
        // Written to (a new ctime), or replaced (a new inode): hashed again.
        assert!(index.must_hash(&digest(1), &stamp(7, 10)));
        assert!(index.must_hash(&digest(1), &stamp(8, 9)));
        // An upload just verified its bytes, but not this file as served: hashed once.
        upload(&mut index, 2, 2, MIB, 0);
        assert!(index.must_hash(&digest(2), &stamp(3, 1)));
        // Not held at all.
        assert!(index.must_hash(&digest(3), &stamp(7, 9)));
    }
}
