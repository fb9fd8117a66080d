//! What one Forget costs the writer when many tombstones are held (issue 39, finding 5): the
//! tombstones are persistent maps, so a Forget makes its new version by copying the few
//! nodes on one path, never the whole set, and readers keep their immutable versions.
//!
//! Measured in bytes allocated, not time: a counting global allocator (this test binary
//! holds only this test) sums every allocation made while the one Forget is applied. With
//! a whole copy of the held set per Forget it is megabytes; with a path copy, kilobytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use tunecache_server::journal::FsyncPolicy;
use tunecache_server::model::entry::{CacheKey, Origin, TunedResult};
use tunecache_server::model::forget::{ForgetAsk, ForgetScope, Tombstone};
use tunecache_server::store::{Source, Store};

struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Tombstones held before the measured Forget.
const HELD: usize = 200_000;
/// Most bytes the measured Forget may allocate: a path copy of each persistent map, the
/// journal frame, the reply. A whole copy of `HELD` tombstones is tens of times this.
const MOST_BYTES: u64 = 1024 * 1024;

fn key(i: usize) -> CacheKey {
    CacheKey {
        namespace: "ns".into(),
        op: "gemm".into(),
        device: "dev".into(),
        problem: format!("m{i}_n4096_k4096"),
        rank: None,
    }
}

#[tokio::test]
async fn a_forget_copies_a_path_of_the_tombstones_not_the_whole_set() {
    let dir = tempfile::tempdir().unwrap();
    let (guard, _) = Store::open(dir.path(), FsyncPolicy::Never).unwrap();
    let store = guard.store();
    let victim = key(HELD + 1);
    let result = TunedResult {
        config: "{}".into(),
        time_us: 3.0,
        tuned_by: "t".into(),
        tuned_at_unix_ms: 1,
        forget_epoch: 0,
        artifacts: Default::default(),
    };
    // Recorded first: a Record may start a compaction, which must not overlap the
    // measured Forget (Forgets never start one).
    store
        .try_apply(vec![(victim.clone(), result)], None)
        .await
        .unwrap();
    // Stamped now: kept for the retention period by every compaction.
    let stamp = (tunecache_server::model::entry::unix_now_ms() as u64) << 16;
    let held: Vec<Tombstone> = (0..HELD)
        .map(|i| Tombstone {
            scope: ForgetScope::exact(&key(i)),
            stamp,
        })
        .collect();
    // This node's own, read back from its segments: held in both sets, all and own.
    store
        .apply_tombstones(held, Source::Snapshot, Origin::Own)
        .await
        .unwrap();
    let before = store.tombstones();
    assert_eq!(before.len(), HELD);

    let ask = ForgetAsk {
        scope: ForgetScope::exact(&victim),
        only_if: Some(("{}".into(), 3.0)),
    };
    let start = ALLOCATED.load(Ordering::Relaxed);
    let dropped = store.forget(ask).await.unwrap();
    let allocated = ALLOCATED.load(Ordering::Relaxed) - start;

    eprintln!("one Forget allocated {allocated} bytes with {HELD} tombstones held");
    assert_eq!(dropped, 1);
    assert_eq!(store.tombstones().len(), HELD + 1);
    assert_eq!(before.len(), HELD, "a reader's version does not change");
    assert!(
        allocated < MOST_BYTES,
        "one Forget allocated {allocated} bytes with {HELD} tombstones held"
    );
}
