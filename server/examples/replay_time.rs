//! Measures a restart's replay (`Store::open`) of a journal holding N exact-key tombstones,
//! each in a frame of its own (one Forget at a time, as one uid's Forgets reach the writer),
//! or N entries in Records of 1,000:
//! `cargo run --release -p tunecache-server --example replay_time -- tombstones|entries [N
//! [STATE_DIR]]`.
use std::time::Instant;

use tunecache_server::journal::FsyncPolicy;
use tunecache_server::model::entry::{CacheKey, TunedResult};
use tunecache_server::model::forget::{ForgetAsk, ForgetScope};
use tunecache_server::store::Store;

fn key(i: u64) -> CacheKey {
    CacheKey {
        namespace: "bench-replay".into(),
        op: "gemm".into(),
        device: "bench-device".into(),
        problem: format!("m{i}_n4096_k4096"),
        rank: Some(0),
    }
}

#[tokio::main]
async fn main() {
    let what = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tombstones".into());
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    // A third argument keeps the state directory there (for a daemon to start on).
    let temporary = tempfile::tempdir().expect("a temporary directory");
    let dir = std::env::args()
        .nth(3)
        .map_or_else(|| temporary.path().to_path_buf(), std::path::PathBuf::from);
    {
        let (guard, _) = Store::open(&dir, FsyncPolicy::Never).expect("open");
        let store = guard.store();
        if what == "entries" {
            let keys: Vec<u64> = (0..n).collect();
            for chunk in keys.chunks(1_000) {
                let entries = chunk
                    .iter()
                    .map(|i| {
                        let result = TunedResult {
                            config: r#"{"block":[128,64,1]}"#.into(),
                            time_us: 10.0,
                            tuned_by: "bench".into(),
                            tuned_at_unix_ms: 1_700_000_000_000,
                            forget_epoch: 0,
                            artifacts: Default::default(),
                        };
                        (key(*i), result)
                    })
                    .collect();
                store
                    .apply(entries, tunecache_server::store::Source::Tuner)
                    .await
                    .expect("Record");
            }
        } else {
            for i in 0..n {
                let ask = ForgetAsk {
                    scope: ForgetScope::exact(&key(i)),
                    only_if: None,
                };
                store.forget(ask).await.expect("Forget");
            }
        }
        drop(store);
        guard.shutdown();
    }
    let started = Instant::now();
    let (guard, report) = Store::open(&dir, FsyncPolicy::Never).expect("reopen");
    let took = started.elapsed();
    let store = guard.store();
    println!(
        "{what}: {n}, {} frames replayed in {took:?} ({} tombstones, {} entries held)",
        report.frames,
        store.tombstones().len(),
        store.len()
    );
}
