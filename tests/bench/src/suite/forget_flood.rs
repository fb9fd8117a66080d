//! Owns the cost of a Forget flood to a bystander (`tunecache-bench micro --only forget`,
//! issue 39 finding 5, issue 50 finding 7): one uid sends 20,000 exact-key Forgets, each
//! `only_if` on its own entry's winner (what any allowed user can do to entries it can
//! Scan), or an administrator sends 20,000 scope Forgets (every rank of one problem each),
//! while another client records one entry at a time; the bystander's Record latency is
//! compared with its latency without the flood.
//!
//! Two budgets: `--max-exact-forgets-per-uid 20000` (the whole flood admitted: every
//! Forget reaches the writer and adds a tombstone) and the default (600 a minute: the rest
//! refused RESOURCE_EXHAUSTED before the writer). Each case starts a fresh daemon. The flood
//! runs `FLOOD_IN_FLIGHT` Forgets at a time; the bystander records sequentially for as long
//! as the flood runs, on its own connection.

use std::time::Instant;

use anyhow::{Context, Result};
use futures::stream::{self, StreamExt};
use serde::Serialize;
use tunecache_bench::daemon::DaemonProcess;
use tunecache_client::{proto as v1, Client};

use super::micro::{daemon_config, latency_of, Latency, MicroOptions};
use super::progress;

const FLOOD_NAMESPACE: &str = "bench-flood";
const BYSTANDER_NAMESPACE: &str = "bench-bystander";
const DEVICE: &str = "bench-device";
const CONFIG: &str = r#"{"block":[128,64,1]}"#;
/// Forgets of the flood in flight at once.
const FLOOD_IN_FLIGHT: usize = 16;
/// The default of `--max-exact-forgets-per-uid`.
const DEFAULT_BUDGET: u32 = 600;

/// Which Forgets flood the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum FloodKind {
    /// Exact-key Forgets `only_if` on the entry's winner: any allowed uid may send them.
    OnlyIf,
    /// An administrator's scope Forgets, one per problem, every rank (`rank` unset, no
    /// `only_if`): each leaves a wide tombstone (issue 50, finding 7).
    Scope,
}

/// One budget's run.
#[derive(Debug, Clone, Serialize)]
pub struct FloodCase {
    pub kind: FloodKind,
    pub budget_per_minute: u32,
    pub forgets_sent: usize,
    pub forgets_admitted: usize,
    pub forgets_refused: usize,
    pub flood_secs: f64,
    /// The bystander's 1-entry Records with no flood, then during it.
    pub record_quiet: Latency,
    pub record_during_flood: Latency,
    pub tombstones_held: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ForgetFloodResults {
    pub cases: Vec<FloodCase>,
}

fn flood_key(i: usize) -> v1::Key {
    tunecache_client::key(
        FLOOD_NAMESPACE,
        "gemm",
        DEVICE,
        &format!("m{i}_n4096_k4096"),
        None,
    )
}

fn result(time_us: f64) -> v1::Result {
    v1::Result {
        config: CONFIG.to_owned(),
        time_us,
        tuned_by: "bench".to_owned(),
        tuned_at_unix_ms: 1_700_000_000_000,
        forget_epoch: 0,
        artifacts: Default::default(),
    }
}

fn entry(key: v1::Key, time_us: f64) -> v1::Entry {
    v1::Entry {
        key: Some(key),
        result: Some(result(time_us)),
    }
}

/// Records 1-entry batches one after the other until `until` says stop (at least
/// `min_samples`); each call's latency in microseconds.
async fn bystander(
    client: &Client,
    min_samples: usize,
    mut until: impl FnMut() -> bool,
) -> Result<Vec<f64>> {
    let mut micros = Vec::new();
    let mut i = 0usize;
    while micros.len() < min_samples || !until() {
        let key =
            tunecache_client::key(BYSTANDER_NAMESPACE, "gemm", DEVICE, &format!("b{i}"), None);
        let batch = vec![entry(key, 10.0)];
        let started = Instant::now();
        client.record(batch).await.context("bystander Record")?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    Ok(micros)
}

async fn run_case(
    options: &MicroOptions,
    kind: FloodKind,
    budget: u32,
    flood: usize,
) -> Result<FloodCase> {
    let name = format!("forget-flood-{kind:?}-{budget}");
    let mut config = daemon_config(options, &name, None, 3_600);
    config.extra_args = vec!["--max-exact-forgets-per-uid".to_owned(), budget.to_string()];
    let mut daemon = DaemonProcess::spawn(&config)?;
    let attacker = daemon.wait_ready().await?;
    let victim = Client::connect(&daemon.socket).await?;
    // The entries the flood forgets, each with its own winner.
    let entries: Vec<v1::Entry> = (0..flood).map(|i| entry(flood_key(i), 1.0)).collect();
    for batch in entries.chunks(5_000) {
        attacker.record(batch.to_vec()).await?;
    }
    let quiet_samples = if options.quick { 200 } else { 2_000 };
    let quiet = bystander(&victim, quiet_samples, || true).await?;

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood_done = done.clone();
    let started = Instant::now();
    let flooding = tokio::spawn(async move {
        let outcomes: Vec<bool> = stream::iter(0..flood)
            .map(|i| {
                let attacker = attacker.clone();
                async move {
                    let key = flood_key(i);
                    let forget = v1::ForgetRequest {
                        namespace: key.namespace,
                        op: key.op,
                        device: key.device,
                        problem: key.problem,
                        rank: key.rank,
                        only_if: (kind == FloodKind::OnlyIf).then(|| result(1.0)),
                    };
                    attacker.forget(forget).await.is_ok()
                }
            })
            .buffer_unordered(FLOOD_IN_FLIGHT)
            .collect()
            .await;
        flood_done.store(true, std::sync::atomic::Ordering::Release);
        (outcomes, started.elapsed())
    });
    let during = bystander(&victim, 100, || {
        done.load(std::sync::atomic::Ordering::Acquire)
    })
    .await?;
    let (outcomes, took) = flooding.await?;
    let admitted = outcomes.iter().filter(|ok| **ok).count();
    let stats = victim.stats().await?;
    daemon.stop();
    Ok(FloodCase {
        kind,
        budget_per_minute: budget,
        forgets_sent: flood,
        forgets_admitted: admitted,
        forgets_refused: flood - admitted,
        flood_secs: took.as_secs_f64(),
        record_quiet: latency_of(quiet),
        record_during_flood: latency_of(during),
        tombstones_held: stats.tombstones_held,
    })
}

pub async fn run(options: &MicroOptions) -> Result<ForgetFloodResults> {
    let flood = if options.quick { 2_000 } else { 20_000 };
    let mut cases = Vec::new();
    let cases_to_run = [
        (FloodKind::Scope, flood as u32),
        (FloodKind::OnlyIf, flood as u32),
        (FloodKind::OnlyIf, DEFAULT_BUDGET),
    ];
    for (kind, budget) in cases_to_run {
        progress(&format!(
            "forget flood: {flood} {kind:?} Forgets, --max-exact-forgets-per-uid {budget} ..."
        ));
        let case = run_case(options, kind, budget, flood).await?;
        progress(&format!(
            "  {} admitted in {:.1} s; bystander Record p50/p99/max {:.0}/{:.0}/{:.0} us \
             (quiet {:.0}/{:.0}/{:.0})",
            case.forgets_admitted,
            case.flood_secs,
            case.record_during_flood.p50_us,
            case.record_during_flood.p99_us,
            case.record_during_flood.max_us,
            case.record_quiet.p50_us,
            case.record_quiet.p99_us,
            case.record_quiet.max_us,
        ));
        cases.push(case);
    }
    Ok(ForgetFloodResults { cases })
}
