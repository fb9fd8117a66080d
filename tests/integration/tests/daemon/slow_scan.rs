//! Scans whose clients stop reading, against the real daemon: 100 stalled Scans while Records
//! keep changing the cache must not pin the versions they started from. The daemon's RSS is
//! read from /proc.
//!
//! The figures it compares: `version_bytes` (a lower bound on one version of the cache: the
//! bytes of its strings and their headers, no allocator or tree overhead), `pinned_estimate`
//! (100 such versions: each churn round rewrites every 32nd entry, which copies every leaf of
//! the ordered map, keys and values included, so each pinned version is a whole cache), and the
//! RSS growth measured with the Scans stalled and again after they are cancelled.

use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tunecache_client::{connect_channel, proto};
use tunecache_integration::{entry, test_key, wait, Lazy, TestDaemon};
use tunecache_proto::v1::tune_cache_client::TuneCacheClient;

const ENTRIES: usize = 40_000;
const STALLED_SCANS: usize = 100;
/// Stalled Scans share a few connections, as ranks of a process would.
const CONNECTIONS: usize = 4;
/// Each churn round rewrites every `CHURN_STRIDE`-th entry.
const CHURN_STRIDE: usize = 32;
const BATCH: usize = 2_000;

fn problem(i: usize) -> String {
    format!("m=4096,n=4096,k={i:08},dtype=bf16,layout=tn")
}

fn config(i: usize, round: usize) -> String {
    format!(
        "{{\"block_m\":128,\"block_n\":256,\"stages\":{},\"warps\":8,\"id\":{i}}}",
        round % 7
    )
}

/// Writes entries `indices` with a time that improves each round, so every write is stored.
async fn write(
    client: &tunecache_client::Client,
    indices: impl Iterator<Item = usize>,
    round: usize,
) {
    let entries: Vec<_> = indices
        .map(|i| {
            entry(
                test_key("gemm", &problem(i)),
                &config(i, round),
                1_000_000.0 - round as f64,
                "churn",
            )
        })
        .collect();
    for batch in entries.chunks(BATCH) {
        let outcome = client.record(batch.to_vec()).await.unwrap();
        assert_eq!(
            outcome.stored as usize,
            batch.len(),
            "every write is a change"
        );
    }
}

/// Bytes one version of the cache takes at the least: every entry's strings plus their
/// 24-byte headers (namespace, op, device, problem, config, tuned_by) and its scalars.
fn version_bytes_lower_bound() -> u64 {
    let key = test_key("gemm", "");
    let fixed = key.namespace.len() + key.op.len() + key.device.len() + "churn".len() + 6 * 24 + 24;
    let per_entry = (0..ENTRIES).map(|i| problem(i).len() + config(i, 0).len() + fixed);
    per_entry.sum::<usize>() as u64
}

/// Starts a Scan of everything and never reads it. (Its chunks are not even awaited: the
/// connection's flow-control window is shared, so unread Scans on one connection soon stop
/// any chunk from arriving on it.)
async fn stalled_scan(channel: &Channel) -> tonic::Streaming<proto::ScanResponse> {
    let mut client = TuneCacheClient::new(channel.clone()).max_decoding_message_size(64 << 20);
    client
        .scan(proto::ScanRequest::default())
        .await
        .unwrap()
        .into_inner()
}

/// Waits (at most 20 s) for the RSS to settle at or under `limit`; returns the last reading.
async fn rss_settled_under(daemon: &TestDaemon, limit: u64) -> u64 {
    // The caller judges the reading: no panic here when it never settles.
    let mut rss = 0;
    let _ = wait(Duration::from_secs(20), "the RSS settling")
        .every(Duration::from_millis(200))
        .try_until_some_async(|| {
            rss = daemon.rss_bytes();
            std::future::ready((rss <= limit).then_some(()))
        })
        .await;
    rss
}

/// Waits (at most 30 s) until the RSS holds still: ten readings 50 ms apart within 1 MiB of
/// each other; returns the last.
async fn rss_steady(daemon: &TestDaemon) -> u64 {
    let readings = std::sync::Mutex::new(std::collections::VecDeque::new());
    let still = Lazy(|| format!("the RSS holding still: {:?}", readings.lock().unwrap()));
    wait(Duration::from_secs(30), still)
        .every(Duration::from_millis(50))
        .until_some(|| {
            let mut readings = readings.lock().unwrap();
            readings.push_back(daemon.rss_bytes());
            if readings.len() > 10 {
                readings.pop_front();
            }
            let (low, high) = (readings.iter().min()?, readings.iter().max()?);
            (readings.len() == 10 && high - low < 1 << 20).then_some(*high)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_scans_do_not_pin_cache_versions() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    let client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let rss_empty = daemon.rss_bytes();
    write(&client, 0..ENTRIES, 0).await;
    let rss_loaded = daemon.rss_bytes();
    let cache_cost = rss_loaded.saturating_sub(rss_empty);
    assert!(
        cache_cost > 4 << 20,
        "the loaded cache should cost megabytes, measured {cache_cost} bytes"
    );
    let version_bytes = version_bytes_lower_bound();
    let pinned_estimate = STALLED_SCANS as u64 * version_bytes;
    // Generous: a quarter of what pinned versions would cost at the least. A stalled Scan may
    // hold its queued chunks and HTTP/2 buffers (about a MiB), never a version.
    let bound = pinned_estimate / 4;

    let mut channels = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(connect_channel(&daemon.socket).await.unwrap());
    }
    let mut stalled = Vec::new();
    for scan in 0..STALLED_SCANS {
        stalled.push(stalled_scan(&channels[scan % CONNECTIONS]).await);
        // Changes the cache after each Scan started, so each started on its own version.
        let offset = scan % CHURN_STRIDE;
        write(&client, (offset..ENTRIES).step_by(CHURN_STRIDE), scan + 1).await;
    }
    // The Scans run into their flow-control limits: the RSS stops moving.
    let settling = Instant::now();
    let rss_stalled = rss_steady(&daemon).await;
    eprintln!("the RSS held still after {:?}", settling.elapsed());
    let growth_stalled = rss_stalled.saturating_sub(rss_loaded);

    drop(stalled);
    drop(channels);
    let rss_after = rss_settled_under(&daemon, rss_loaded + bound).await;
    let growth_after = rss_after.saturating_sub(rss_loaded);

    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    eprintln!(
        "rss empty {:.1} MiB, loaded {:.1} MiB (cache {:.1} MiB, one version at least {:.1} MiB); \
         pinned estimate {:.1} MiB, bound {:.1} MiB; {STALLED_SCANS} stalled: +{:.1} MiB; \
         after cancel: +{:.1} MiB",
        mib(rss_empty),
        mib(rss_loaded),
        mib(cache_cost),
        mib(version_bytes),
        mib(pinned_estimate),
        mib(bound),
        mib(growth_stalled),
        mib(growth_after),
    );
    assert!(
        growth_stalled < bound,
        "{STALLED_SCANS} stalled Scans grew RSS by {:.1} MiB (bound {:.1} MiB; pinned versions \
         would cost about {:.1} MiB)",
        mib(growth_stalled),
        mib(bound),
        mib(pinned_estimate)
    );
    assert!(
        growth_after < bound,
        "after cancelling the Scans RSS stayed {:.1} MiB above the loaded cache (bound {:.1} MiB)",
        mib(growth_after),
        mib(bound)
    );

    // The daemon still answers, and a Scan that does read gets every entry once.
    let all = client.scan("", "").await.unwrap();
    assert_eq!(all.len(), ENTRIES);
}
