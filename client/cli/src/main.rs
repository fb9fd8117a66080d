//! `tunecache`: the command-line client of the node daemon, for operators and scripts.
//!
//! Artifacts (the files beside a result) go through the client crate's `artifacts` module:
//! `put --artifact NAME=PATH` uploads each file, then Records the result naming them;
//! `get --artifacts-to DIR` writes a hit's files into DIR, each verified by its digest.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tunecache_client::{key, proto, Client, TuneLease, TuneStart};
use tunecache_trtllm as trtllm;

mod error_text;
mod stats;

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

    /// Read (get, scan, resolve, export) in view NAME, where the first answer for a key is
    /// pinned for the whole job; used only when no launcher names the view: $TUNECACHE_VIEW,
    /// then Slurm's SLURM_JOB_ID/SLURM_STEP_ID, then torchrun's TORCHELASTIC_RUN_ID come first.
    /// TUNECACHE_VIEW= (set, empty) reads without a view.
    #[arg(long, global = true, value_name = "NAME")]
    view: Option<String>,

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
    Get {
        #[command(flatten)]
        key: KeyArgs,
        /// After a hit, write each file its result names into DIR (which must exist) as
        /// DIR/NAME, verified against its digest, by a temporary file and a rename.
        #[arg(long, value_name = "DIR")]
        artifacts_to: Option<PathBuf>,
    },
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
        /// A file to store beside the result, as NAME (1-128 bytes of [A-Za-z0-9._-]); may be
        /// given up to 64 times. Each is uploaded first, then the Record names them all.
        #[arg(long = "artifact", value_name = "NAME=PATH", value_parser = parse_artifact)]
        artifacts: Vec<(String, PathBuf)>,
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
    /// Show how the daemon is doing: a short summary (health first), every counter with
    /// --all (or --json), or one line per problem with --problems.
    Stats {
        /// Every counter, one a line.
        #[arg(long)]
        all: bool,
        /// Only what is wrong, one `CAUSE<TAB>MESSAGE` line per cause; nothing when healthy.
        #[arg(long, conflicts_with = "all")]
        problems: bool,
    },
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
    /// Forget results on every node, for good; prints how many entries this node dropped.
    ///
    /// Without --only-if-*, every entry of the namespace whose fields equal the ones given,
    /// which only an administrator may do (root, the daemon's uid, its --admin-uid /
    /// --admin-gid). With them, the one key named (--op, --device and --problem all given), and
    /// only while its result is still that one: what any caller who may Record does about a
    /// config it found broken.
    Forget {
        #[arg(long)]
        namespace: String,
        /// Empty: every op.
        #[arg(long, default_value = "")]
        op: String,
        /// Empty: every device.
        #[arg(long, default_value = "")]
        device: String,
        /// Empty: every problem.
        #[arg(long, default_value = "")]
        problem: String,
        /// The rank's own entry; omit for the shared entry and every rank's (with --only-if-*:
        /// the shared entry).
        #[arg(long)]
        rank: Option<u32>,
        /// Forget the key only if its result has this config: the text exactly as stored, as
        /// `tunecache get` prints it.
        #[arg(long, requires = "only_if_time_us")]
        only_if_config: Option<String>,
        /// ... and this time_us, exactly (as `tunecache get --json` prints it).
        #[arg(long, requires = "only_if_config")]
        only_if_time_us: Option<f64>,
    },
    /// The node's views: the jobs whose ranks all read the first answer pinned for each key.
    View {
        #[command(subcommand)]
        command: ViewCommand,
    },
    /// Record the entries of a tuning-cache file (TensorRT-LLM's TLLM_AUTOTUNER_CACHE_PATH).
    /// Invalid entries are skipped with reasons and the rest stored; exits non-zero only when
    /// the file is not a cache or nothing in it could be stored.
    Import {
        #[arg(long, value_enum)]
        format: CacheFormat,
        /// Key.device for every entry, instead of the one built from the file's metadata.
        #[arg(long)]
        device: Option<String>,
        file: PathBuf,
    },
    /// Write the cache's entries as a tuning-cache file: under FILE.lock (the lock TensorRT-LLM's
    /// writers take), keeps the file's entries the cache lacks and replaces FILE by rename.
    /// Entries TensorRT-LLM's loader could not read back are skipped with the reason.
    Export {
        #[arg(long, value_enum)]
        format: CacheFormat,
        /// Only entries of this Key.device (also names the device in a file whose entries
        /// carry no imported metadata). Required when the cache holds several devices.
        #[arg(long)]
        device: Option<String>,
        /// Seconds to wait for FILE.lock held by a TensorRT-LLM writer.
        #[arg(long, default_value_t = 120.0)]
        lock_timeout: f64,
        /// Write a rank_<N> section for every rank below N, even an empty one (TensorRT-LLM
        /// refuses to load a file without its rank's section).
        #[arg(long)]
        world_size: Option<u32>,
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum ViewCommand {
    /// List the views holding pins on this node, most recently read first: name, pins, idle
    /// time.
    List,
    /// End a view (an administrator's act): its pins are dropped on this node and, with the
    /// cluster tier, in Redis, so the next read in it pins afresh.
    End {
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        name: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CacheFormat {
    /// TensorRT-LLM's autotuner cache (AutoTunerProfilingCache JSON).
    Trtllm,
}

/// `NAME=PATH` of `put --artifact`; the name is checked by the contract's rule when the files
/// are uploaded (`Client::put_artifacts`), before any of them is.
fn parse_artifact(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !path.is_empty() => Ok((name.to_owned(), PathBuf::from(path))),
        _ => Err(format!("{text:?} is not NAME=PATH")),
    }
}

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

fn skipped_for(entry: &proto::Entry, reason: String) -> trtllm::SkippedEntry {
    let key = entry.key.as_ref();
    trtllm::SkippedEntry {
        section: key
            .and_then(|key| key.rank)
            .map_or_else(|| "shared".to_owned(), |rank| format!("rank_{rank}")),
        key: key.map(|key| key.problem.clone()).unwrap_or_default(),
        reason,
    }
}

/// Imports every valid entry; exits non-zero only when the file is not a cache or nothing in it
/// could be stored.
async fn import_trtllm(
    client: &Client,
    device: Option<String>,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let text = trtllm::read_existing(file)?
        .with_context(|| format!("{} does not exist", file.display()))?;
    let outcome = trtllm::import_with(&text, &trtllm::ImportOptions { device })
        .with_context(|| format!("reading {}", file.display()))?;
    // One bad entry never costs the others: the client sets each refused entry aside and
    // splits a batch over the daemon's message size (tunecache_client::record).
    let kept = client
        .record_keeping_valid(outcome.entries)
        .await
        .context("record")?;
    let mut skipped = outcome.skipped;
    skipped.extend(kept.refused.iter().map(|refused| {
        skipped_for(
            &refused.entry,
            format!("daemon refused it: {}", refused.status.message()),
        )
    }));
    let accepted = kept.stored + kept.unchanged;
    if as_json {
        println!(
            "{}",
            json!({"imported": accepted, "stored": kept.stored, "unchanged": kept.unchanged,
                   "skipped": skipped_json(&skipped)})
        );
    } else {
        print_skipped(&skipped);
        println!(
            "imported {accepted} entries ({} stored, {} unchanged), skipped {}",
            kept.stored,
            kept.unchanged,
            skipped.len()
        );
    }
    if accepted == 0 && !skipped.is_empty() {
        anyhow::bail!("no entry of {} could be stored", file.display());
    }
    Ok(())
}

/// The distinct `Key.device`s of `entries`, sorted.
fn devices_of(entries: &[proto::Entry]) -> Vec<String> {
    let devices: std::collections::BTreeSet<&str> = entries
        .iter()
        .filter_map(|entry| entry.key.as_ref())
        .map(|key| key.device.as_str())
        .collect();
    devices.into_iter().map(str::to_owned).collect()
}

struct ExportArgs {
    device: Option<String>,
    world_size: Option<u32>,
    lock_timeout: std::time::Duration,
}

async fn export_trtllm(
    client: &Client,
    args: ExportArgs,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let entries = client
        .scan(trtllm::NAMESPACE, args.device.as_deref().unwrap_or(""))
        .await?;
    let devices = devices_of(&entries);
    if args.device.is_none() && devices.len() > 1 {
        anyhow::bail!(
            "the cache holds {} entries of {} devices ({}); a file holds one device's tactics: \
             choose one with --device",
            trtllm::NAMESPACE,
            devices.len(),
            devices
                .iter()
                .map(|device| format!("{device:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let metadata = match (trtllm::TrtllmMetadata::from_entries(&entries), &args.device) {
        (Some(metadata), _) => metadata,
        (None, Some(device)) => trtllm::TrtllmMetadata::for_device(device)?,
        (None, None) if entries.is_empty() => {
            anyhow::bail!("no {} entries in the cache to export", trtllm::NAMESPACE)
        }
        (None, None) => anyhow::bail!(
            "the entries carry no TensorRT-LLM metadata (they were not imported); name the device \
             with --device \"<device name>|sm_<major><minor>|trtllm <version>\""
        ),
    };
    let export_device = args
        .device
        .clone()
        .or_else(|| devices.first().cloned())
        .unwrap_or_else(|| metadata.device_fingerprint());

    // Under the writers' lock: keep what ranks saved to the file that the cache lacks, then
    // replace the file by rename, as their writers do.
    let _lock = trtllm::WriterLock::acquire(file, args.lock_timeout)?;
    let mut merge = trtllm::FileMerge::default();
    let mut all_entries = entries;
    if let Some(text) = trtllm::read_existing(file)? {
        match trtllm::import_with(&text, &trtllm::ImportOptions::default()) {
            Ok(existing) => {
                merge = trtllm::merge_file_entries(&mut all_entries, existing, &export_device);
            }
            Err(error) => eprintln!(
                "tunecache: replacing {}, which is not a readable cache ({error})",
                file.display()
            ),
        }
    }
    let trtllm::FileMerge {
        kept_from_file,
        replaced_device,
    } = merge;
    let options = trtllm::ExportOptions {
        empty_rank_sections: (0..args.world_size.unwrap_or(0)).collect(),
    };
    let outcome = trtllm::export(&all_entries, &metadata, &options)?;
    trtllm::write_atomically(file, outcome.json_text.as_bytes())?;
    if as_json {
        let skipped = skipped_json(&outcome.skipped);
        println!(
            "{}",
            json!({"exported": outcome.exported, "kept_from_file": kept_from_file,
                   "device": export_device, "replaced_device": replaced_device, "skipped": skipped})
        );
    } else {
        print_skipped(&outcome.skipped);
        if let Some(old) = &replaced_device {
            eprintln!(
                "tunecache: {} held entries of device {old:?}; replaced",
                file.display()
            );
        }
        println!(
            "exported {} entries of {export_device:?} to {} ({kept_from_file} kept from the file), skipped {}",
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

fn artifact_json(artifact: &proto::Artifact) -> Value {
    json!({"name": artifact.name, "sha256": artifact.sha256, "size": artifact.size})
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
            "artifacts": r.artifacts.iter().map(artifact_json).collect::<Vec<_>>(),
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
    let mut line = format!(
        "{}/{} [{}] {} ({}): {} in {:.3} us by {}",
        k.namespace, k.op, k.device, k.problem, rank, r.config, r.time_us, r.tuned_by
    );
    if !r.artifacts.is_empty() {
        let files: Vec<String> = r
            .artifacts
            .iter()
            .map(|a| format!("{} ({} bytes, sha256 {})", a.name, a.size, a.sha256))
            .collect();
        line.push_str(&format!("; artifacts: {}", files.join(", ")));
    }
    line
}

fn print_resolution(key: &proto::Key, start: &TuneStart, as_json: bool) {
    let value = match start {
        TuneStart::Hit(result) => {
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
        TuneStart::Tune(lease) => {
            if !as_json {
                println!(
                    "tune here: lease {} expires in {} ms; record with --lease-id",
                    lease.lease_id(),
                    lease.expires_in_ms()
                );
                return;
            }
            json!({"outcome": "tune_here", "lease_id": lease.lease_id(), "expires_in_ms": lease.expires_in_ms()})
        }
        TuneStart::Miss(reason) => {
            if !as_json {
                println!("miss: {reason}");
                return;
            }
            json!({"outcome": "miss", "reason": reason})
        }
    };
    println!("{value}");
}

/// A view's idle time for people: milliseconds under a second, then the two largest units.
fn idle_text(idle_ms: u64) -> String {
    let secs = idle_ms / 1000;
    match secs {
        0 => format!("{idle_ms} ms"),
        1..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

fn print_views(views: &[proto::ViewInfo], as_json: bool) {
    if as_json {
        let list: Vec<Value> = views
            .iter()
            .map(|view| {
                json!({"name": view.name, "uid": view.uid, "pins": view.pins, "idle_ms": view.idle_ms})
            })
            .collect();
        println!("{}", Value::Array(list));
        return;
    }
    if views.is_empty() {
        eprintln!("no views on this node");
        return;
    }
    let width = views
        .iter()
        .map(|view| view.name.len())
        .chain(["VIEW".len()])
        .max()
        .unwrap_or_default();
    println!("{:<width$}  {:>10}  {:>10}  IDLE", "VIEW", "UID", "PINS");
    for view in views {
        println!(
            "{:<width$}  {:>10}  {:>10}  {}",
            view.name,
            view.uid,
            view.pins,
            idle_text(view.idle_ms)
        );
    }
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
            eprintln!("tunecache: {}", error_text::one_line(&error));
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let socket = tunecache_client::socket_path(cli.socket.clone())?;
    // TUNECACHE_AUTOSTART=1 starts a daemon when none answers.
    let client = Client::connect_auto(&socket).await?;
    let client = match &cli.view {
        Some(explicit) => client.with_view(explicit),
        None => client,
    };
    match cli.command {
        Command::Get {
            key: key_args,
            artifacts_to,
        } => {
            let hits = client.lookup(vec![key_args.to_key()]).await?;
            match hits.first() {
                Some(entry) => {
                    // The files first: a failed fetch fails the command before it prints a hit
                    // whose files are not there.
                    let written = match &artifacts_to {
                        Some(dir) => {
                            // Made if missing, as `mkdir -p` would: a new directory is the usual ask.
                            tokio::fs::create_dir_all(dir)
                                .await
                                .with_context(|| format!("making {}", dir.display()))?;
                            client.fetch_artifacts(entry, dir).await.with_context(|| {
                                format!("fetching artifacts into {}", dir.display())
                            })?
                        }
                        None => Vec::new(),
                    };
                    if cli.json {
                        let mut value = entry_json(entry);
                        if artifacts_to.is_some() {
                            value["written"] = json!(written
                                .iter()
                                .map(|path| path.display().to_string())
                                .collect::<Vec<_>>());
                        }
                        println!("{value}");
                    } else {
                        println!("{}", entry_line(entry));
                        for path in &written {
                            eprintln!("wrote {}", path.display());
                        }
                    }
                }
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
            artifacts,
        } => {
            // Uploaded before the Record: the daemon refuses a Record naming a blob it lacks.
            let artifacts = match client.put_artifacts(artifacts).await {
                Ok(artifacts) => artifacts,
                Err(error) => {
                    // Nothing will be Recorded under the lease: give it up, as a failed tuning
                    // does, so that a waiter tunes at once.
                    if !lease_id.is_empty() {
                        let _ = client.give_up_lease(lease_id).await;
                    }
                    return Err(anyhow::Error::new(error).context("uploading artifacts"));
                }
            };
            let (key, result) = (
                key.to_key(),
                proto::Result {
                    config,
                    time_us,
                    tuned_by,
                    tuned_at_unix_ms: tunecache_proto::unix_now_ms(),
                    forget_epoch: 0,
                    artifacts,
                },
            );
            let response = if lease_id.is_empty() {
                let entry = proto::Entry {
                    key: Some(key),
                    result: Some(result),
                };
                client.record(vec![entry]).await.context("record")?
            } else {
                // Under the lease: a failed Record gives it up, as every client does
                // (tunecache_client::tuning).
                let lease = TuneLease::from_parts(
                    key,
                    proto::Lease {
                        lease_id,
                        expires_in_ms: 0,
                    },
                );
                client
                    .finish_tune(lease, result)
                    .await
                    .map_err(|failed| failed.error)
                    .context("record")?
            };
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
                view: String::new(),
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
        Command::Stats { all, problems } => {
            stats::print(&client.stats().await?, cli.json, all, problems)?
        }
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
            let start = client.begin_tune(key.to_key(), options).await?;
            print_resolution(&key.to_key(), &start, cli.json);
        }
        Command::Forget {
            namespace,
            op,
            device,
            problem,
            rank,
            only_if_config,
            only_if_time_us,
        } => {
            // clap makes the two --only-if flags come together; the daemon compares only the
            // config and time_us of `only_if`.
            let only_if = only_if_config
                .zip(only_if_time_us)
                .map(|(config, time_us)| proto::Result {
                    config,
                    time_us,
                    ..Default::default()
                });
            let request = proto::ForgetRequest {
                namespace,
                op,
                device,
                problem,
                rank,
                only_if,
            };
            let forgotten = client.forget(request).await.context("forget")?;
            if cli.json {
                println!("{}", json!({ "forgotten": forgotten }));
            } else {
                println!("forgotten {forgotten}");
            }
        }
        Command::View {
            command: ViewCommand::List,
        } => print_views(&client.list_views().await.context("list views")?, cli.json),
        Command::View {
            command: ViewCommand::End { name },
        } => {
            let ended = client.end_view(&name).await.context("end view")?;
            if cli.json {
                println!(
                    "{}",
                    json!({"name": name, "ended": ended.ended, "pins_dropped": ended.pins_dropped})
                );
            } else if ended.ended {
                println!("ended view {name}: {} pins dropped", ended.pins_dropped);
            } else {
                println!("no view {name} on this node: nothing ended here");
            }
        }
        Command::Import {
            format: CacheFormat::Trtllm,
            device,
            file,
        } => import_trtllm(&client, device, &file, cli.json).await?,
        Command::Export {
            format: CacheFormat::Trtllm,
            device,
            lock_timeout,
            world_size,
            file,
        } => {
            let lock_timeout = std::time::Duration::try_from_secs_f64(lock_timeout)
                .context("--lock-timeout must be a non-negative number of seconds")?;
            let args = ExportArgs {
                device,
                world_size,
                lock_timeout,
            };
            export_trtllm(&client, args, &file, cli.json).await?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::idle_text;

    #[test]
    fn idle_time_reads_in_the_largest_units() {
        assert_eq!(idle_text(0), "0 ms");
        assert_eq!(idle_text(999), "999 ms");
        assert_eq!(idle_text(1_000), "1 s");
        assert_eq!(idle_text(59_999), "59 s");
        assert_eq!(idle_text(61_000), "1 min 1 s");
        assert_eq!(idle_text(3_600_000), "1 h 0 min");
        assert_eq!(idle_text(86_400_000 + 5 * 60_000), "24 h 5 min");
    }
}
