//! `tunecache`: the command-line client of the node daemon, for operators and scripts.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tunecache_client::{key, proto, trtllm, Client, Resolution};

#[derive(Parser)]
#[command(
    name = "tunecache",
    version,
    about = "Query and fill the tunecached node cache"
)]
struct Cli {
    /// Daemon socket [default: $TUNECACHE_SOCKET, then $XDG_RUNTIME_DIR/tunecache/tunecache.sock,
    /// then /tmp/tunecache-<uid>/tunecache.sock]
    #[arg(long, global = true, env = "TUNECACHE_SOCKET")]
    socket: Option<PathBuf>,

    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct KeyArgs {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    op: String,
    #[arg(long, default_value = "")]
    device: String,
    #[arg(long, default_value = "")]
    problem: String,
    /// The rank's own entry; omit for the entry shared by all ranks.
    #[arg(long)]
    rank: Option<u32>,
}

impl KeyArgs {
    fn to_key(&self) -> proto::Key {
        key(
            &self.namespace,
            &self.op,
            &self.device,
            &self.problem,
            self.rank,
        )
    }
}

#[derive(Subcommand)]
enum Command {
    /// Look one key up.
    Get(KeyArgs),
    /// Record one result.
    Put {
        #[command(flatten)]
        key: KeyArgs,
        /// The chosen config, as JSON text.
        #[arg(long)]
        config: String,
        #[arg(long)]
        time_us: f64,
        #[arg(long, default_value = "tunecache-cli")]
        tuned_by: String,
        /// Completes the lease `resolve` granted.
        #[arg(long, default_value = "")]
        lease_id: String,
    },
    /// List entries, optionally of one namespace and device.
    Scan {
        #[arg(long, default_value = "")]
        namespace: String,
        #[arg(long, default_value = "")]
        device: String,
        /// Only the shared entries and this rank's own (what that rank loads).
        #[arg(long)]
        rank: Option<u32>,
    },
    /// Show the daemon's counters.
    Stats,
    /// List the node's tuning devices and their fingerprints.
    Devices,
    /// Resolve one key: print the hit, the lease granted to tune it, or the miss. A lease is
    /// held by the calling process and released when it exits, so from the CLI this mostly
    /// shows what a rank would be told.
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        /// How long to wait for someone else's result, in ms.
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
        /// This caller can tune the problem (it may be handed the lease).
        #[arg(long)]
        can_tune: bool,
        /// Lease length in ms if granted (0: daemon default).
        #[arg(long, default_value_t = 0)]
        lease_ms: u64,
    },
    /// Record the entries of a tuning-cache file (TensorRT-LLM's TLLM_AUTOTUNER_CACHE_PATH).
    Import {
        #[arg(long, value_enum)]
        format: CacheFormat,
        /// Key.device for every entry, instead of the one built from the file's metadata.
        #[arg(long)]
        device: Option<String>,
        file: PathBuf,
    },
    /// Write the cache's entries as a tuning-cache file, replacing FILE atomically.
    Export {
        #[arg(long, value_enum)]
        format: CacheFormat,
        /// Only entries of this Key.device (also names the device in a file whose entries
        /// carry no imported metadata).
        #[arg(long)]
        device: Option<String>,
        /// Write a rank_<N> section for every rank below N, even an empty one (TensorRT-LLM
        /// refuses to load a file without its rank's section).
        #[arg(long)]
        world_size: Option<u32>,
        file: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CacheFormat {
    /// TensorRT-LLM's autotuner cache (AutoTunerProfilingCache JSON).
    Trtllm,
}

/// Entries per Record call on import: well under the daemon's batch limit.
const IMPORT_BATCH: usize = 1000;

fn skipped_json(skipped: &[trtllm::SkippedEntry]) -> Vec<Value> {
    skipped
        .iter()
        .map(|s| json!({"section": s.section, "key": s.key, "reason": s.reason}))
        .collect()
}

fn print_skipped(skipped: &[trtllm::SkippedEntry]) {
    for entry in skipped {
        let key = if entry.key.is_empty() {
            "(whole section)"
        } else {
            entry.key.as_str()
        };
        eprintln!("skipped [{}] {key}: {}", entry.section, entry.reason);
    }
}

async fn import_trtllm(
    client: &Client,
    device: Option<String>,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let outcome = trtllm::import_with(&text, &trtllm::ImportOptions { device })
        .with_context(|| format!("reading {}", file.display()))?;
    let (mut stored, mut unchanged) = (0u64, 0u64);
    for batch in outcome.entries.chunks(IMPORT_BATCH) {
        let response = client.record(batch.to_vec()).await.context("record")?;
        stored += u64::from(response.stored);
        unchanged += u64::from(response.unchanged);
    }
    let imported = outcome.entries.len();
    if as_json {
        let skipped = skipped_json(&outcome.skipped);
        println!(
            "{}",
            json!({"imported": imported, "stored": stored, "unchanged": unchanged, "skipped": skipped})
        );
    } else {
        print_skipped(&outcome.skipped);
        println!(
            "imported {imported} entries ({stored} stored, {unchanged} unchanged), skipped {}",
            outcome.skipped.len()
        );
    }
    Ok(())
}

async fn export_trtllm(
    client: &Client,
    device: Option<String>,
    world_size: Option<u32>,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let entries = client
        .scan(trtllm::NAMESPACE, device.as_deref().unwrap_or(""))
        .await?;
    let metadata = match (trtllm::TrtllmMetadata::from_entries(&entries), &device) {
        (Some(metadata), _) => metadata,
        (None, Some(device)) => trtllm::TrtllmMetadata::for_device(device)?,
        (None, None) if entries.is_empty() => {
            anyhow::bail!("no {} entries in the cache to export", trtllm::NAMESPACE)
        }
        (None, None) => anyhow::bail!(
            "the entries carry no TensorRT-LLM metadata (they were not imported); name the device \
             with --device \"<device name>|sm_<major><minor>\""
        ),
    };
    let options = trtllm::ExportOptions {
        empty_rank_sections: (0..world_size.unwrap_or(0)).collect(),
    };
    let outcome = trtllm::export(&entries, &metadata, &options)?;
    trtllm::write_atomically(file, outcome.json_text.as_bytes())?;
    if as_json {
        let skipped = skipped_json(&outcome.skipped);
        println!(
            "{}",
            json!({"exported": outcome.exported, "skipped": skipped})
        );
    } else {
        print_skipped(&outcome.skipped);
        println!(
            "exported {} entries to {}, skipped {}",
            outcome.exported,
            file.display(),
            outcome.skipped.len()
        );
    }
    Ok(())
}

fn key_json(key: &proto::Key) -> Value {
    json!({
        "namespace": key.namespace,
        "op": key.op,
        "device": key.device,
        "problem": key.problem,
        "rank": key.rank,
    })
}

fn entry_json(entry: &proto::Entry) -> Value {
    let key = entry.key.as_ref().map(key_json).unwrap_or(Value::Null);
    let result = entry.result.as_ref().map_or(Value::Null, |r| {
        json!({
            // The daemon only stores valid JSON configs; fall back to the text regardless.
            "config": serde_json::from_str::<Value>(&r.config).unwrap_or_else(|_| Value::String(r.config.clone())),
            "time_us": r.time_us,
            "tuned_by": r.tuned_by,
            "tuned_at_unix_ms": r.tuned_at_unix_ms,
        })
    });
    json!({ "key": key, "result": result })
}

fn entry_line(entry: &proto::Entry) -> String {
    let (Some(k), Some(r)) = (&entry.key, &entry.result) else {
        return String::from("(incomplete entry)");
    };
    let rank = k
        .rank
        .map_or_else(|| "shared".to_owned(), |n| format!("rank {n}"));
    format!(
        "{}/{} [{}] {} ({}): {} in {:.3} us by {}",
        k.namespace, k.op, k.device, k.problem, rank, r.config, r.time_us, r.tuned_by
    )
}

fn print_resolution(key: &proto::Key, resolution: &Resolution, as_json: bool) {
    let value = match resolution {
        Resolution::Hit(result) => {
            let entry = proto::Entry {
                key: Some(key.clone()),
                result: Some(result.clone()),
            };
            if !as_json {
                println!("hit: {}", entry_line(&entry));
                return;
            }
            json!({"outcome": "hit", "entry": entry_json(&entry)})
        }
        Resolution::TuneHere(lease) => {
            if !as_json {
                println!(
                    "tune here: lease {} expires in {} ms; record with --lease-id",
                    lease.lease_id, lease.expires_in_ms
                );
                return;
            }
            json!({"outcome": "tune_here", "lease_id": lease.lease_id, "expires_in_ms": lease.expires_in_ms})
        }
        Resolution::Miss(reason) => {
            if !as_json {
                println!("miss: {reason}");
                return;
            }
            json!({"outcome": "miss", "reason": reason})
        }
    };
    println!("{value}");
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn print_stats(stats: &proto::StatsResponse, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        // Straight from the struct: the fields in proto order.
        println!(
            "{}",
            serde_json::to_string(stats).context("encoding stats")?
        );
        return Ok(());
    }
    let Value::Object(figures) = serde_json::to_value(stats).context("encoding stats")? else {
        anyhow::bail!("stats did not encode as an object");
    };
    for (name, value) in figures {
        match value {
            Value::String(text) => println!("{name:<28} {text}"),
            other => println!("{name:<28} {other}"),
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    // Like other Unix filters: `tunecache scan | head` ends quietly when the reader goes away
    // instead of panicking on a broken pipe.
    // SAFETY: restores the default disposition of one signal before any thread writes.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tunecache: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let socket = cli
        .socket
        .clone()
        .unwrap_or_else(tunecache_client::default_socket_path);
    // TUNECACHE_AUTOSTART=1 starts a daemon when none answers.
    let client = Client::connect_auto(&socket).await?;
    match cli.command {
        Command::Get(key_args) => {
            let hits = client.lookup(vec![key_args.to_key()]).await?;
            match hits.first() {
                Some(entry) if cli.json => println!("{}", entry_json(entry)),
                Some(entry) => println!("{}", entry_line(entry)),
                None => {
                    if cli.json {
                        println!("null");
                    } else {
                        eprintln!("miss");
                    }
                    std::process::exit(1);
                }
            }
        }
        Command::Put {
            key,
            config,
            time_us,
            tuned_by,
            lease_id,
        } => {
            let entry = proto::Entry {
                key: Some(key.to_key()),
                result: Some(proto::Result {
                    config,
                    time_us,
                    tuned_by,
                    tuned_at_unix_ms: unix_now_ms(),
                }),
            };
            let response = client
                .record_with_lease(vec![entry], lease_id)
                .await
                .context("record")?;
            if cli.json {
                println!(
                    "{}",
                    json!({"stored": response.stored, "unchanged": response.unchanged})
                );
            } else if response.stored == 1 {
                println!("stored");
            } else {
                println!("unchanged (the cache holds a result at least as good)");
            }
        }
        Command::Scan {
            namespace,
            device,
            rank,
        } => {
            let filter = proto::ScanRequest {
                namespace,
                device,
                rank,
            };
            let entries = client.scan_with(filter).await?;
            if cli.json {
                let list: Vec<Value> = entries.iter().map(entry_json).collect();
                println!("{}", Value::Array(list));
            } else {
                for entry in &entries {
                    println!("{}", entry_line(entry));
                }
            }
        }
        Command::Stats => print_stats(&client.stats().await?, cli.json)?,
        Command::Devices => {
            for device in client.devices().await? {
                if cli.json {
                    println!(
                        "{}",
                        json!({
                            "backend": device.backend,
                            "name": device.name,
                            "compute_capability": device.compute_capability,
                            "memory_bytes": device.memory_bytes,
                            "driver_version": device.driver_version,
                            "cuda_version": device.cuda_version,
                            "fingerprint": device.fingerprint,
                        })
                    );
                } else {
                    println!(
                        "{}\t{}\t{}",
                        device.backend, device.fingerprint, device.name
                    );
                }
            }
        }
        Command::Resolve {
            key,
            wait_ms,
            can_tune,
            lease_ms,
        } => {
            let options = tunecache_client::ResolveOptions {
                wait: std::time::Duration::from_millis(wait_ms),
                can_tune,
                lease: std::time::Duration::from_millis(lease_ms),
            };
            let resolution = client.resolve(key.to_key(), options).await?;
            print_resolution(&key.to_key(), &resolution, cli.json);
        }
        Command::Import {
            format: CacheFormat::Trtllm,
            device,
            file,
        } => import_trtllm(&client, device, &file, cli.json).await?,
        Command::Export {
            format: CacheFormat::Trtllm,
            device,
            world_size,
            file,
        } => export_trtllm(&client, device, world_size, &file, cli.json).await?,
    }
    Ok(())
}
