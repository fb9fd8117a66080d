//! Owns issue 39's finding 1 as a benchmark (`tunecache-bench micro --only views-hostile`):
//! another job's first read of 10,000 keys in its own view, and plain one-key Lookups, with
//! and without an attacker at the default caps. The attacker is another allowed uid (65534,
//! through `setpriv`) making a new view of one pin per Lookup without end, so it holds its
//! `--max-views-per-uid` and drops its own idle-longest view on every request. Rounds with
//! and without the attacker alternate, so a loaded machine biases them alike; each round's
//! victim view is new, so every read is a view's first read.

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::{workspace_binary, DaemonProcess};
use tunecache_client::{proto as v1, Client};

use super::micro::{daemon_config, latency_of, Latency, MicroOptions};
use super::progress;

const KEYS: usize = 10_000;
const NAMESPACE: &str = "bench-views-hostile";
const ATTACKER_UID: &str = "65534";

fn key(i: usize) -> v1::Key {
    tunecache_client::key(NAMESPACE, "gemm", "bench-device", &format!("p{i}"), None)
}

#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// The victim's first read of 10,000 keys in a new view of its own, ms per round.
    pub first_read_ms: Vec<f64>,
    pub first_read_p50_ms: f64,
    /// One-key Lookups without a view made by a third client during the rounds.
    pub plain_lookup: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct ViewsHostile {
    pub rounds: usize,
    pub unattacked: Side,
    pub attacked: Side,
    /// Views the attacker made (and dropped of its own) during its rounds.
    pub attacker_views_evicted: u64,
    pub first_read_attacked_over_unattacked: f64,
    pub plain_p99_attacked_over_unattacked: f64,
}

/// The attacker: `tunecache-test-views views` as uid 65534, one new one-pin view per Lookup.
fn start_attacker(socket: &std::path::Path, round: usize) -> Result<Child> {
    Command::new("setpriv")
        .args([
            "--reuid",
            ATTACKER_UID,
            "--regid",
            ATTACKER_UID,
            "--clear-groups",
        ])
        .arg(workspace_binary("tunecache-test-views"))
        .arg("--socket")
        .arg(socket)
        .args([
            "views",
            "--prefix",
            &format!("attack-{round}"),
            "--count",
            "100000000",
        ])
        .args(["--problem", "p0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the attacker (setpriv and tunecache-test-views, run as root)")
}

/// One-key Lookups on their own connection until `stop`: each call's µs.
async fn probe(client: Client, stop: tokio::sync::watch::Receiver<bool>) -> Vec<f64> {
    let mut micros = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        let started = Instant::now();
        if client.lookup(vec![key(i % KEYS)]).await.is_err() {
            break;
        }
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        i += 7919;
    }
    micros
}

pub async fn run(options: &MicroOptions) -> Result<ViewsHostile> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("views-hostile acts as uid 65534 through setpriv: run it as root");
    }
    let rounds = if options.quick { 2 } else { 6 };
    let mut config = daemon_config(options, "views-hostile", None, 3600);
    config.extra_args = vec!["--allow-uid".into(), ATTACKER_UID.into()];
    let mut daemon = DaemonProcess::spawn(&config)?;
    let client = daemon.wait_ready().await?;
    std::fs::set_permissions(&config.work_dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666))?;
    let entries: Vec<v1::Entry> = (0..KEYS)
        .map(|i| v1::Entry {
            key: Some(key(i)),
            result: Some(v1::Result {
                config: format!("{{\"tile\":{i}}}"),
                time_us: 10.0,
                tuned_by: "bench".into(),
                tuned_at_unix_ms: 1,
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        })
        .collect();
    for chunk in entries.chunks(5_000) {
        client.record(chunk.to_vec()).await?;
    }
    let keys: Vec<v1::Key> = (0..KEYS).map(key).collect();
    let mut sides = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    let mut evicted = 0;
    for round in 0..2 * rounds {
        let attacked = round % 2 == 1;
        let mut attacker = None;
        if attacked {
            let before = client.stats().await?.views_evicted;
            attacker = Some(start_attacker(&daemon.socket, round)?);
            // Wait until it holds its view cap and drops its own views on every request.
            let deadline = Instant::now() + Duration::from_secs(120);
            while client.stats().await?.views_evicted < before + 1_000 {
                if Instant::now() > deadline {
                    bail!("the attacker never reached its view cap");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let prober = tokio::spawn(probe(Client::connect(&daemon.socket).await?, stopped));
        // Probes before, during and after the victim's read.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let victim = Client::connect(&daemon.socket)
            .await?
            .in_view(format!("victim-{round}"));
        let started = Instant::now();
        let hits = victim.lookup(keys.clone()).await?;
        let read_ms = started.elapsed().as_secs_f64() * 1e3;
        if hits.len() != KEYS {
            bail!("the victim's read answered {} of {KEYS}", hits.len());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = stop.send(true);
        let micros = prober.await.context("the prober")?;
        if let Some(mut attacker) = attacker {
            let before = client.stats().await?.views_evicted;
            let _ = attacker.kill();
            let _ = attacker.wait();
            evicted = evicted.max(before);
        }
        let side = &mut sides[usize::from(attacked)];
        side.0.push(read_ms);
        side.1.extend(micros);
        progress(&format!(
            "views-hostile round {round} ({}): first read {read_ms:.1} ms",
            if attacked { "attacked" } else { "unattacked" }
        ));
    }
    daemon.stop();
    let side = |(reads, probes): (Vec<f64>, Vec<f64>)| {
        let mut sorted = reads.clone();
        sorted.sort_by(f64::total_cmp);
        Side {
            first_read_p50_ms: sorted[sorted.len() / 2],
            first_read_ms: reads,
            plain_lookup: latency_of(probes),
        }
    };
    let [unattacked, attacked] = sides;
    let (unattacked, attacked) = (side(unattacked), side(attacked));
    Ok(ViewsHostile {
        rounds,
        first_read_attacked_over_unattacked: attacked.first_read_p50_ms
            / unattacked.first_read_p50_ms,
        plain_p99_attacked_over_unattacked: attacked.plain_lookup.p99_us
            / unattacked.plain_lookup.p99_us,
        attacker_views_evicted: evicted,
        unattacked,
        attacked,
    })
}
