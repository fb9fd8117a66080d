//! Owns the cost of a restart (`tunecache-bench micro --only replay`, issue 50 finding 7): a
//! daemon's journal is filled one way, the daemon is SIGKILLed and started again, and a
//! client without retries asks one Lookup after another from the moment of the spawn. What
//! is measured: when the first answer of any kind came (a daemon replaying its journal
//! answers UNAVAILABLE at once), when the first Lookup was answered with the entries, and
//! how many UNAVAILABLE answers came between.
//!
//! The journals: 51,523 frames of one entry each (sequential 1-entry Records: the journal
//! issue 50 restarted from), 100,000 entries in Records of 1,000, and 1,000,000 exact-key
//! tombstones (an administrator's Forgets of one rank's key each, 256 in flight).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::stream::{self, StreamExt};
use serde::Serialize;
use tunecache_bench::daemon::DaemonProcess;
use tunecache_client::proto::tune_cache_client::TuneCacheClient;
use tunecache_client::{proto as v1, Client};

use super::micro::{daemon_config, MicroOptions};
use super::progress;

const NAMESPACE: &str = "bench-replay";
const DEVICE: &str = "bench-device";
/// Forgets in flight while the tombstones are written.
const FORGETS_IN_FLIGHT: usize = 256;
/// Longest a restart may take before the run gives up.
const RESTART_LIMIT: Duration = Duration::from_secs(300);

/// How the journal was filled.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum JournalFill {
    /// Sequential 1-entry Records: one frame each.
    OneEntryFrames(usize),
    /// Records of 1,000 entries.
    Entries(usize),
    /// Exact-key Forgets of keys never recorded: one tombstone each.
    Tombstones(usize),
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplayCase {
    pub fill: JournalFill,
    pub fill_secs: f64,
    pub journal_bytes: u64,
    pub tombstones_held: u64,
    /// From the spawn after SIGKILL.
    pub first_answer_ms: f64,
    pub first_lookup_ms: f64,
    /// Lookups answered UNAVAILABLE (the daemon replaying) before the first one answered.
    pub unavailable_answers: u64,
    /// What the first UNAVAILABLE said, and the last.
    pub unavailable_message: Option<String>,
    pub last_unavailable_message: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplayResults {
    pub cases: Vec<ReplayCase>,
}

fn key(i: usize, rank: Option<u32>) -> v1::Key {
    tunecache_client::key(
        NAMESPACE,
        "gemm",
        DEVICE,
        &format!("m{i}_n4096_k4096"),
        rank,
    )
}

fn entry(i: usize) -> v1::Entry {
    v1::Entry {
        key: Some(key(i, None)),
        result: Some(v1::Result {
            config: r#"{"block":[128,64,1]}"#.to_owned(),
            time_us: 10.0,
            tuned_by: "bench".to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

async fn fill(client: &Client, fill: JournalFill) -> Result<()> {
    match fill {
        JournalFill::OneEntryFrames(frames) => {
            for i in 0..frames {
                client.record(vec![entry(i)]).await?;
            }
        }
        JournalFill::Entries(entries) => {
            let all: Vec<v1::Entry> = (0..entries).map(entry).collect();
            for batch in all.chunks(1_000) {
                client.record(batch.to_vec()).await?;
            }
        }
        JournalFill::Tombstones(tombstones) => {
            // A few connections: one HTTP/2 connection caps the streams in flight.
            let clients: Vec<Client> = vec![client.clone(); 4];
            let failed = stream::iter(0..tombstones)
                .map(|i| {
                    let client = clients[i % clients.len()].clone();
                    async move {
                        let key = key(i, Some(0));
                        let forget = v1::ForgetRequest {
                            namespace: key.namespace,
                            op: key.op,
                            device: key.device,
                            problem: key.problem,
                            rank: key.rank,
                            only_if: None,
                        };
                        client.forget(forget).await.is_err()
                    }
                })
                .buffer_unordered(FORGETS_IN_FLIGHT)
                .filter(|failed| std::future::ready(*failed))
                .count()
                .await;
            if failed > 0 {
                bail!("{failed} of {tombstones} Forgets failed");
            }
        }
    }
    Ok(())
}

/// After a spawn: Lookups without retries, one after another, until one is answered.
async fn first_answers(daemon: &DaemonProcess, probe: v1::Key) -> Result<ReplayCase> {
    let spawned = daemon.spawned_at;
    let deadline = spawned + RESTART_LIMIT;
    let mut first_answer = None;
    let mut unavailable = 0u64;
    let mut message = None;
    let mut last_message = None;
    loop {
        if Instant::now() > deadline {
            bail!("no Lookup answered {RESTART_LIMIT:?} after the restart");
        }
        let Ok(channel) = tunecache_client::connect_channel(&daemon.socket).await else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let mut raw = TuneCacheClient::new(channel);
        loop {
            let mut request = tonic::Request::new(v1::LookupRequest {
                keys: vec![probe.clone()],
                view: String::new(),
            });
            request.set_timeout(Duration::from_secs(60));
            let answer = raw.lookup(request).await;
            first_answer.get_or_insert_with(|| spawned.elapsed());
            match answer {
                Ok(hits) if !hits.get_ref().hits.is_empty() => {
                    return Ok(ReplayCase {
                        fill: JournalFill::Entries(0),
                        fill_secs: 0.0,
                        journal_bytes: 0,
                        tombstones_held: 0,
                        first_answer_ms: first_answer.unwrap_or_default().as_secs_f64() * 1e3,
                        first_lookup_ms: spawned.elapsed().as_secs_f64() * 1e3,
                        unavailable_answers: unavailable,
                        unavailable_message: message,
                        last_unavailable_message: last_message,
                    });
                }
                Ok(_) => bail!("the probe key is missing after the restart"),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    unavailable += 1;
                    message.get_or_insert_with(|| status.message().to_owned());
                    last_message = Some(status.message().to_owned());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(status) => bail!("Lookup after the restart: {status}"),
            }
        }
    }
}

async fn run_case(options: &MicroOptions, fill_with: JournalFill) -> Result<ReplayCase> {
    let name = match fill_with {
        JournalFill::OneEntryFrames(_) => "replay-frames",
        JournalFill::Entries(_) => "replay-entries",
        JournalFill::Tombstones(_) => "replay-tombstones",
    };
    let config = daemon_config(options, name, None, 3_600);
    let _ = std::fs::remove_dir_all(&config.work_dir);
    let mut daemon = DaemonProcess::spawn(&config)?;
    let client = daemon.wait_ready().await?;
    // The probe: one entry every fill holds (a tombstone fill forgets rank 0's keys only).
    client.record(vec![entry(0)]).await?;
    let started = Instant::now();
    fill(&client, fill_with)
        .await
        .context("filling the journal")?;
    let fill_secs = started.elapsed().as_secs_f64();
    let stats = client.stats().await?;
    daemon.kill();
    let mut daemon = DaemonProcess::spawn(&config)?;
    let mut case = first_answers(&daemon, key(0, None)).await?;
    daemon.stop();
    case.fill = fill_with;
    case.fill_secs = fill_secs;
    case.journal_bytes = stats.journal_bytes;
    case.tombstones_held = stats.tombstones_held;
    Ok(case)
}

pub async fn run(options: &MicroOptions) -> Result<ReplayResults> {
    let fills = if options.quick {
        [
            JournalFill::OneEntryFrames(2_000),
            JournalFill::Entries(10_000),
            JournalFill::Tombstones(20_000),
        ]
    } else {
        [
            JournalFill::OneEntryFrames(51_523),
            JournalFill::Entries(100_000),
            JournalFill::Tombstones(1_000_000),
        ]
    };
    let mut cases = Vec::new();
    for fill_with in fills {
        progress(&format!("replay: {fill_with:?}, SIGKILL, restart ..."));
        let case = run_case(options, fill_with).await?;
        progress(&format!(
            "  filled in {:.1} s ({} journal bytes, {} tombstones); first answer {:.0} ms, \
             first Lookup {:.0} ms after the spawn, {} UNAVAILABLE between ({:?} .. {:?})",
            case.fill_secs,
            case.journal_bytes,
            case.tombstones_held,
            case.first_answer_ms,
            case.first_lookup_ms,
            case.unavailable_answers,
            case.unavailable_message,
            case.last_unavailable_message,
        ));
        cases.push(case);
    }
    Ok(ReplayResults { cases })
}
