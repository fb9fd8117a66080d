//! Measures what a million exact-key tombstones cost against the million entries they
//! removed: resident memory before and after building each (one process, one at a time).
use tunecache_server::model::entry::{CacheKey, TunedResult};
use tunecache_server::model::forget::{ForgetScope, Tombstone};
use tunecache_server::model::tombstones::Tombstones;
use tunecache_server::store::{EntryMap, StoredEntry};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn key(i: u64) -> CacheKey {
    CacheKey {
        namespace: "trtllm".into(),
        op: "trtllm::fused_moe::gemm1".into(),
        device: "NVIDIA H200|sm_90|cuda 12.8".into(),
        problem: format!("m={i},n=4096,k=7168,dtype=fp8,tp=8"),
        rank: None,
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let what = std::env::args().nth(1).unwrap_or_default();
    let before = rss_bytes();
    if what == "entries" {
        let mut map = EntryMap::new();
        for i in 0..n {
            let result = TunedResult {
                config: r#"{"tactic":17}"#.into(),
                time_us: 41.5,
                tuned_by: "node-a/rank0".into(),
                tuned_at_unix_ms: 1_700_000_000_000,
                forget_epoch: 0,
                artifacts: Default::default(),
            };
            map.insert(StoredEntry::new(&key(i), &result));
        }
        println!("entries {n}: {} bytes", rss_bytes() - before);
        std::hint::black_box(map);
    } else {
        let mut held = Tombstones::default();
        for i in 0..n {
            held.insert(Tombstone {
                scope: ForgetScope::exact(&key(i)),
                stamp: (1_800_000_000_000u64 << 16) + i,
            });
        }
        println!("tombstones {n}: {} bytes", rss_bytes() - before);
        std::hint::black_box(held);
    }
}
