//! The index's rules: limits, shares, scans and served stamps.

use super::*;

const MIB: u64 = 1024 * 1024;

fn limits() -> Limits {
    Limits {
        max_blob_bytes: 8 * MIB,
        store_bytes: 20 * MIB,
        store_bytes_per_uid: 16 * MIB,
        unreferenced_bytes_per_uid: 12 * MIB,
        grace_ms: 1_000,
    }
}

fn digest(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn upload(index: &mut Index, uid: u32, n: u8, size: u64, now: u64) {
    assert_eq!(index.admit(uid, &digest(n), size, now), Admit::Reserved);
    index.release(uid, size);
    assert!(index.insert(digest(n), size, Some(uid), now));
}

#[test]
fn a_blob_over_the_limit_is_refused() {
    let mut index = Index::new(limits());
    assert_eq!(
        index.admit(1, &digest(99), 8 * MIB + 1, 0),
        Admit::Refused(Refusal::BlobTooLarge {
            size: 8 * MIB + 1,
            limit: 8 * MIB
        })
    );
    assert_eq!(index.admit(1, &digest(99), 8 * MIB, 0), Admit::Reserved);
}

#[test]
fn one_uid_cannot_fill_the_store_with_unreferenced_uploads() {
    let mut index = Index::new(limits());
    upload(&mut index, 1, 1, 8 * MIB, 0);
    // In progress counts too.
    assert_eq!(index.admit(1, &digest(99), 4 * MIB, 0), Admit::Reserved);
    assert_eq!(
        index.admit(1, &digest(99), 1, 0),
        Admit::Refused(Refusal::UidUnreferenced {
            uid: 1,
            size: 1,
            held: 12 * MIB,
            limit: 12 * MIB
        })
    );
    // Another uid is not held to uid 1's bytes.
    assert_eq!(index.admit(2, &digest(99), 8 * MIB, 0), Admit::Reserved);
    index.release(2, 8 * MIB);
    index.release(1, 4 * MIB);
    // Once a Record names it, it is no longer uid 1's.
    index.name(&digest(1), 8 * MIB, 5);
    assert_eq!(index.unreferenced_bytes_of(1), 0);
    assert_eq!(index.admit(1, &digest(99), 8 * MIB, 5), Admit::Reserved);
}

#[test]
fn a_full_store_collects_only_unnamed_blobs_past_grace_then_refuses() {
    let mut index = Index::new(limits());
    upload(&mut index, 1, 1, 8 * MIB, 0);
    upload(&mut index, 2, 2, 8 * MIB, 0);
    index.name(&digest(2), 8 * MIB, 0);
    // Within the grace period nothing may go: refused, naming the store.
    assert_eq!(
        index.admit(3, &digest(99), 8 * MIB, 500),
        Admit::Refused(Refusal::StoreFull {
            size: 8 * MIB,
            held: 16 * MIB,
            limit: 20 * MIB
        })
    );
    // Past it, the unnamed blob is collected; the named one never.
    assert_eq!(
        index.admit(3, &digest(99), 8 * MIB, 1_000),
        Admit::CollectFirst(vec![digest(1)])
    );
    assert_eq!(index.collectable(10_000), vec![digest(1)]);
    index.forget_blob(&digest(1));
    assert_eq!(index.admit(3, &digest(99), 8 * MIB, 1_000), Admit::Reserved);
    assert_eq!(index.held_bytes(), 8 * MIB);
}

/// uid's Record of an entry naming `blobs` (digest number, size) is live.
fn recorded(index: &mut Index, uid: u32, entry: u64, blobs: &[(u8, u64)]) {
    let ids = crate::artifacts::charges::EntryIds {
        key: entry,
        result: entry,
    };
    for (n, size) in blobs {
        index.name(&digest(*n), *size, 0);
    }
    let charges = index.charges_mut();
    charges.asked(uid, ids);
    charges.live(ids, blobs.iter().map(|(n, size)| (digest(*n), *size)));
    charges.answered(uid, ids);
}

#[test]
fn a_uid_past_its_share_is_refused_and_another_is_not_held_to_it() {
    let mut index = Index::new(limits());
    upload(&mut index, 1, 1, 8 * MIB, 0);
    upload(&mut index, 1, 2, 4 * MIB, 0);
    recorded(&mut index, 1, 7, &[(1, 8 * MIB), (2, 4 * MIB)]);
    assert_eq!(index.unreferenced_bytes_of(1), 0);
    // 12 MiB its live entries name and 4 MiB in progress fill its 16 MiB share.
    assert_eq!(index.admit(1, &digest(3), 4 * MIB, 0), Admit::Reserved);
    assert_eq!(
        index.admit(1, &digest(4), 1, 0),
        Admit::Refused(Refusal::UidShare {
            uid: 1,
            size: 1,
            held: 16 * MIB,
            limit: 16 * MIB
        })
    );
    index.release(1, 4 * MIB);
    // Another uid naming the same blobs is charged for them too; uid 1 is not relieved,
    // and uid 2 uploads within its own share.
    recorded(&mut index, 2, 8, &[(1, 8 * MIB)]);
    assert_eq!(index.admit(2, &digest(5), 8 * MIB, 0), Admit::Reserved);
    assert_eq!(index.charges().bytes_of(1), 12 * MIB);
}

#[test]
fn a_fetch_from_the_tiers_fits_the_store_or_is_refused() {
    let mut index = Index::new(limits());
    upload(&mut index, 1, 1, 8 * MIB, 0);
    upload(&mut index, 2, 2, 8 * MIB, 0);
    index.name(&digest(1), 8 * MIB, 0);
    // Within the grace period nothing may go: refused.
    assert_eq!(
        index.admit_fetch(8 * MIB, 500),
        Admit::Refused(Refusal::StoreFull {
            size: 8 * MIB,
            held: 16 * MIB,
            limit: 20 * MIB
        })
    );
    // Past it, the unnamed blob goes first; the named one never.
    assert_eq!(
        index.admit_fetch(8 * MIB, 1_000),
        Admit::CollectFirst(vec![digest(2)])
    );
    index.forget_blob(&digest(2));
    assert_eq!(index.admit_fetch(8 * MIB, 1_000), Admit::Reserved);
    // The fetch's reservation counts against uploads until it ends.
    assert_eq!(
        index.admit(3, &digest(3), 8 * MIB, 1_000),
        Admit::Refused(Refusal::StoreFull {
            size: 8 * MIB,
            held: 16 * MIB,
            limit: 20 * MIB
        })
    );
    index.release_fetch(8 * MIB);
    assert!(index.insert(digest(4), 8 * MIB, None, 1_000));
    assert_eq!(index.held_bytes(), 16 * MIB);
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
    index.scan_finished(HashMap::new(), &HashMap::new());
    assert_eq!(index.named_size(&digest(1)), None);
    assert_eq!(index.named_size(&digest(2)), Some(MIB));
    assert_eq!(index.collectable(2_000), vec![digest(1)]);
    // The next scan that does not find digest 2 lets it go too.
    index.scan_started();
    index.scan_finished(HashMap::new(), &HashMap::new());
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
