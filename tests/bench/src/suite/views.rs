//! Owns the cost of job views (`tunecache-bench micro --only views`, issue 27): the same
//! reads without a view, in a view whose first reads pinned everything already (later reads),
//! and as the first read of a view (which pins what it answers), side by side.
//!
//! Reads: a Lookup of one key and of a batch, a Scan of 5,000 entries and one of 100,000 (the
//! issue's bound: a Scan of 100k entries in a view costs at most 1.5x the same Scan without
//! one). Two tiers: one node alone (pins node-local), and two nodes on a real `redis-server`
//! (`--cluster-url`: a first read asks Redis which pin is first), where a fourth case is the
//! first read on node B of a view node A pinned already (B takes A's pins from Redis).
//!
//! The cases are interleaved call by call (their order rotating), so a loaded machine biases
//! them alike. Each call is timed by the Rust client over the Unix socket, its request built
//! before the clock starts; the daemon's CPU per call comes from its threads' `schedstat`
//! (and redis-server's on the Redis tier), the pins each case made, took from Redis or made
//! node-locally because Redis did not answer in time from the node's Stats. A first read's
//! view is ended (EndView, untimed) after it, so every first read starts from nothing.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::DaemonProcess;
use tunecache_bench::multinode::{find_redis_server, wait_connected, RedisServer};
use tunecache_bench::tunecache_system::{
    existing_entries, in_namespace, record_all, DEVICE, NAMESPACE,
};
use tunecache_client::{proto as v1, Client};

use super::micro::{daemon_config, key_of, latency_of, Latency, MicroOptions};
use super::transport::cpu_ns;
use super::{machine_info, progress, MachineInfo};

/// Namespace of the small Scan's entries (the large Scan's are the workload's `NAMESPACE`).
const SMALL_NAMESPACE: &str = "bench-views-small";
/// The view every key is pinned in before the timed reads ("later reads").
const LATER_VIEW: &str = "bench-later";
/// Longest the Redis tier's second node may take to hold every entry.
const CONVERGE_LIMIT: Duration = Duration::from_secs(120);

/// One kind of read.
#[derive(Clone, Copy, Debug)]
enum Read {
    /// A Lookup of this many keys of the large namespace.
    Lookup(usize),
    /// A Scan of one namespace, which holds this many entries.
    Scan(&'static str, usize),
}

impl Read {
    fn kind(self) -> &'static str {
        match self {
            Read::Lookup(_) => "lookup",
            Read::Scan(..) => "scan",
        }
    }

    fn entries(self) -> usize {
        match self {
            Read::Lookup(keys) => keys,
            Read::Scan(_, entries) => entries,
        }
    }

    /// Call `call` of this read in `view` ("" for none): the entries answered and the
    /// call's wall time in µs.
    async fn timed(
        self,
        client: &Client,
        keys: &[v1::Key],
        view: &str,
        call: usize,
    ) -> Result<(usize, f64)> {
        let view = view.to_owned();
        match self {
            Read::Lookup(count) => {
                let keys = if count == 1 {
                    vec![keys[(call * 7919) % keys.len()].clone()]
                } else {
                    let start = (call * count) % (keys.len() - count);
                    keys[start..start + count].to_vec()
                };
                let request = v1::LookupRequest { keys, view };
                let mut raw = client.raw();
                let started = Instant::now();
                let hits = raw
                    .lookup(request)
                    .await
                    .context("Lookup")?
                    .into_inner()
                    .hits;
                Ok((hits.len(), started.elapsed().as_secs_f64() * 1e6))
            }
            Read::Scan(namespace, _) => {
                let request = v1::ScanRequest {
                    namespace: namespace.to_owned(),
                    device: DEVICE.to_owned(),
                    rank: None,
                    view,
                };
                let started = Instant::now();
                let entries = client.scan_with(request).await?;
                Ok((entries.len(), started.elapsed().as_secs_f64() * 1e6))
            }
        }
    }
}

/// How a read is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    NoView,
    /// In [`LATER_VIEW`], which pinned every key before.
    Later,
    /// In a view nothing was read in yet.
    First,
    /// On node B, in a view node A read (and pinned, in Redis) just before.
    FirstElsewhere,
}

impl Case {
    fn id(self) -> &'static str {
        match self {
            Case::NoView => "no-view",
            Case::Later => "later",
            Case::First => "first",
            Case::FirstElsewhere => "first-elsewhere",
        }
    }

    fn view(self, read: Read, call: usize) -> String {
        match self {
            Case::NoView => String::new(),
            Case::Later => LATER_VIEW.to_owned(),
            Case::First | Case::FirstElsewhere => format!(
                "bench-{}-{}-{}-{call}",
                self.id(),
                read.kind(),
                read.entries()
            ),
        }
    }
}

/// One case of one read, over all its calls.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// `no-view`, `later`, `first` or `first-elsewhere` (see the module comment).
    pub case: &'static str,
    pub latency: Latency,
    /// This case's p50 over the same read's p50 without a view.
    pub p50_over_no_view: f64,
    /// CPU per call (mean) of the daemon read from, all its threads.
    pub daemon_cpu_us: f64,
    /// CPU per call (mean) of redis-server, on the Redis tier.
    pub redis_cpu_us: Option<f64>,
    /// Over all calls, from the node's Stats: pins made, pins taken from Redis that differ
    /// from this node's own candidate (another node pinned another result first; 0 here,
    /// where both nodes hold the same results), pins made node-locally because Redis did not
    /// answer within the cluster timeout.
    pub pins_made: u64,
    pub pins_from_cluster: u64,
    pub pin_fallbacks: u64,
}

/// One read on one tier, every case side by side.
#[derive(Debug, Clone, Serialize)]
pub struct ReadResult {
    /// `node` (one daemon, pins node-local) or `redis` (two daemons on one redis-server).
    pub tier: &'static str,
    /// `lookup` or `scan`.
    pub read: &'static str,
    /// Keys per Lookup, or entries the Scan answers.
    pub entries: usize,
    /// Timed calls per case.
    pub calls: usize,
    pub cases: Vec<CaseResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ViewsResults {
    pub machine: MachineInfo,
    /// `/proc/loadavg` (1, 5, 15 minutes) when the run started and when it ended.
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    /// Entries every daemon holds: the large namespace and the small one.
    pub entries_in_cache: usize,
    pub redis_version: Option<String>,
    /// Flags every daemon of the Redis tier ran with besides the harness's own and
    /// `--cluster-url` (`--cluster-timeout-ms` not given: its default).
    pub redis_tier_args: Vec<String>,
    pub reads: Vec<ReadResult>,
    /// What did not run, and why.
    pub skipped: Vec<String>,
    pub seconds: f64,
}

/// What each call of one case added up to.
#[derive(Default)]
struct Samples {
    wall_us: Vec<f64>,
    daemon_cpu_ns: u64,
    redis_cpu_ns: u64,
    pins_made: u64,
    pins_from_cluster: u64,
    pin_fallbacks: u64,
}

struct Node {
    daemon: DaemonProcess,
    client: Client,
}

/// The daemons of one tier, filled, with [`LATER_VIEW`] pinned on the first.
struct Tier {
    id: &'static str,
    nodes: Vec<Node>,
    redis: Option<RedisServer>,
}

struct Sizes {
    large: usize,
    small: usize,
    /// (read, timed calls per case), one node alone.
    node: Vec<(Read, usize)>,
    /// The same on the Redis tier.
    redis: Vec<(Read, usize)>,
}

fn sizes(quick: bool) -> Sizes {
    let (large, small, batch) = if quick {
        (2_000, 200, 100)
    } else {
        (100_000, 5_000, 1_000)
    };
    let calls = |full: usize, quick_calls: usize| if quick { quick_calls } else { full };
    let reads = |lookups: usize, batches: usize, small_scans: usize, large_scans: usize| {
        vec![
            (Read::Lookup(1), calls(lookups, 20)),
            (Read::Lookup(batch), calls(batches, 5)),
            (Read::Scan(SMALL_NAMESPACE, small), calls(small_scans, 5)),
            (Read::Scan(NAMESPACE, large), calls(large_scans, 2)),
        ]
    };
    Sizes {
        large,
        small,
        node: reads(3_000, 200, 100, 15),
        redis: reads(1_500, 100, 50, 5),
    }
}

fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|field| field.parse().ok())
        .collect()
}

async fn start_node(options: &MicroOptions, name: &str, extra_args: &[String]) -> Result<Node> {
    let mut config = daemon_config(options, name, None, 3_600);
    config.extra_args = extra_args.to_vec();
    let mut daemon = DaemonProcess::spawn(&config)?;
    let client = daemon.wait_ready().await?;
    Ok(Node { daemon, client })
}

/// Pins every entry of both namespaces in [`LATER_VIEW`] on `node` (a Scan of each in it).
async fn pin_later_view(node: &Node, sizes: &Sizes) -> Result<()> {
    for read in [
        Read::Scan(NAMESPACE, sizes.large),
        Read::Scan(SMALL_NAMESPACE, sizes.small),
    ] {
        let (answered, _) = read.timed(&node.client, &[], LATER_VIEW, 0).await?;
        if answered != read.entries() {
            bail!(
                "pinning {LATER_VIEW}: {answered} of {} entries",
                read.entries()
            );
        }
    }
    let pins = node.client.stats().await?.view_pins;
    if pins < (sizes.large + sizes.small) as u64 {
        bail!(
            "{LATER_VIEW} holds {pins} pins, not {}",
            sizes.large + sizes.small
        );
    }
    Ok(())
}

/// Ends `view` on `node` (its pins here and in Redis).
async fn end_view(node: &Node, view: &str) -> Result<()> {
    node.client
        .raw()
        .end_view(v1::EndViewRequest {
            name: view.to_owned(),
        })
        .await
        .with_context(|| format!("EndView {view}"))?;
    Ok(())
}

/// One timed call of `case`, added to `samples`.
async fn one_call(
    tier: &Tier,
    read: Read,
    keys: &[v1::Key],
    case: Case,
    call: usize,
    samples: &mut Samples,
) -> Result<()> {
    let view = case.view(read, call);
    let node = &tier.nodes[usize::from(case == Case::FirstElsewhere)];
    if case == Case::FirstElsewhere {
        read.timed(&tier.nodes[0].client, keys, &view, call).await?;
    }
    let before = node.client.stats().await?;
    let daemon_pid = node.daemon.pid()?;
    let redis_pid = tier.redis.as_ref().map(RedisServer::pid);
    let redis_cpu = || {
        redis_pid
            .map(cpu_ns)
            .transpose()
            .map(Option::unwrap_or_default)
    };
    let (daemon_cpu, redis_cpu_before) = (cpu_ns(daemon_pid)?, redis_cpu()?);
    let (answered, wall_us) = read.timed(&node.client, keys, &view, call).await?;
    samples.daemon_cpu_ns += cpu_ns(daemon_pid)? - daemon_cpu;
    samples.redis_cpu_ns += redis_cpu()? - redis_cpu_before;
    samples.wall_us.push(wall_us);
    if answered != read.entries() {
        bail!(
            "{} {read:?} in {view:?}: {answered} entries answered, not {}",
            tier.id,
            read.entries()
        );
    }
    let after = node.client.stats().await?;
    samples.pins_made += after.view_pins_made - before.view_pins_made;
    samples.pins_from_cluster += after.view_pins_from_cluster - before.view_pins_from_cluster;
    samples.pin_fallbacks += after.view_pin_fallbacks - before.view_pin_fallbacks;
    match case {
        Case::NoView | Case::Later => {}
        Case::First => end_view(node, &view).await?,
        Case::FirstElsewhere => {
            for node in &tier.nodes {
                end_view(node, &view).await?;
            }
        }
    }
    Ok(())
}

/// Every case of `read` on `tier`, interleaved call by call.
async fn measure_read(
    tier: &Tier,
    read: Read,
    calls: usize,
    keys: &[v1::Key],
) -> Result<ReadResult> {
    let cases: &[Case] = if tier.nodes.len() > 1 {
        &[Case::NoView, Case::Later, Case::First, Case::FirstElsewhere]
    } else {
        &[Case::NoView, Case::Later, Case::First]
    };
    progress(&format!(
        "views: {} tier, {} of {}, {calls} calls per case ...",
        tier.id,
        read.kind(),
        read.entries()
    ));
    // Warm the connections and the daemon's paths (the no-view and later reads pin nothing).
    for call in 0..calls.div_ceil(10).max(2) {
        for case in [Case::NoView, Case::Later] {
            read.timed(&tier.nodes[0].client, keys, &case.view(read, call), call)
                .await?;
        }
    }
    let mut samples: Vec<Samples> = cases.iter().map(|_| Samples::default()).collect();
    for call in 0..calls {
        for turn in 0..cases.len() {
            let index = (call + turn) % cases.len();
            one_call(tier, read, keys, cases[index], call, &mut samples[index]).await?;
        }
    }
    let no_view_p50 = latency_of(samples[0].wall_us.clone()).p50_us;
    let per_call = |ns: u64| ns as f64 / 1e3 / calls as f64;
    let cases = cases
        .iter()
        .zip(samples)
        .map(|(case, samples)| {
            let latency = latency_of(samples.wall_us);
            CaseResult {
                case: case.id(),
                p50_over_no_view: latency.p50_us / no_view_p50,
                latency,
                daemon_cpu_us: per_call(samples.daemon_cpu_ns),
                redis_cpu_us: tier.redis.is_some().then(|| per_call(samples.redis_cpu_ns)),
                pins_made: samples.pins_made,
                pins_from_cluster: samples.pins_from_cluster,
                pin_fallbacks: samples.pin_fallbacks,
            }
        })
        .collect();
    Ok(ReadResult {
        tier: tier.id,
        read: read.kind(),
        entries: read.entries(),
        calls,
        cases,
    })
}

/// Records both namespaces on the tier's first node and waits until every node holds them
/// and nothing is left to publish (no background work under the timed reads).
async fn fill(tier: &Tier, large: Vec<v1::Entry>, small: Vec<v1::Entry>) -> Result<()> {
    let total = (large.len() + small.len()) as u64;
    record_all(&tier.nodes[0].client, large).await?;
    record_all(&tier.nodes[0].client, small).await?;
    let deadline = Instant::now() + CONVERGE_LIMIT;
    for node in &tier.nodes {
        loop {
            let stats = node.client.stats().await?;
            let entries = stats.entries;
            if entries >= total && stats.cluster_publish_queue == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} tier: a node holds {entries} of {total} entries after {CONVERGE_LIMIT:?}",
                    tier.id
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Runs the comparison on one node, then on the Redis tier (skipped, and said, without
/// `redis-server`).
pub async fn run(options: &MicroOptions) -> Result<ViewsResults> {
    let started = Instant::now();
    let load_average_start = load_average();
    let sizes = sizes(options.quick);
    let large = existing_entries(8, sizes.large, 0.5);
    let small = in_namespace(existing_entries(8, sizes.small, 0.5), SMALL_NAMESPACE);
    let keys: Vec<v1::Key> = large.iter().map(key_of).collect();
    let mut reads = Vec::new();
    let mut skipped = Vec::new();

    progress("views: one node ...");
    let mut tier = Tier {
        id: "node",
        nodes: vec![start_node(options, "views-node", &[]).await?],
        redis: None,
    };
    fill(&tier, large.clone(), small.clone()).await?;
    pin_later_view(&tier.nodes[0], &sizes).await?;
    for &(read, calls) in &sizes.node {
        reads.push(measure_read(&tier, read, calls, &keys).await?);
    }
    for node in &mut tier.nodes {
        node.daemon.stop();
    }

    let mut redis_tier_args = Vec::new();
    let mut redis_version = None;
    match find_redis_server() {
        None => skipped.push(
            "redis tier: redis-server not found (set $REDIS_SERVER or install it)".to_owned(),
        ),
        Some(binary) => {
            progress("views: Redis tier, two nodes ...");
            redis_version = std::process::Command::new(&binary)
                .arg("--version")
                .output()
                .ok()
                .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
            let redis = RedisServer::start(&binary, &options.scratch.join("views-redis"))?;
            let args = [
                "--cluster-url".to_owned(),
                redis.url(),
                "--cluster-prefix".to_owned(),
                "bench-views:".to_owned(),
            ];
            redis_tier_args = args[2..].to_vec();
            let mut nodes = Vec::new();
            for name in ["views-a", "views-b"] {
                nodes.push(start_node(options, name, &args).await?);
            }
            let clients: Vec<Client> = nodes.iter().map(|node| node.client.clone()).collect();
            wait_connected(&clients, Duration::from_secs(30)).await?;
            let mut tier = Tier {
                id: "redis",
                nodes,
                redis: Some(redis),
            };
            fill(&tier, large, small).await?;
            pin_later_view(&tier.nodes[0], &sizes).await?;
            for &(read, calls) in &sizes.redis {
                reads.push(measure_read(&tier, read, calls, &keys).await?);
            }
            for node in &mut tier.nodes {
                node.daemon.stop();
            }
        }
    }
    Ok(ViewsResults {
        machine: machine_info(&std::env::args().collect::<Vec<_>>().join(" ")),
        load_average_start,
        load_average_end: load_average(),
        entries_in_cache: sizes.large + sizes.small,
        redis_version,
        redis_tier_args,
        reads,
        skipped,
        seconds: started.elapsed().as_secs_f64(),
    })
}
