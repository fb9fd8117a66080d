//! `tunecache`: the command-line client of the node daemon, for operators and scripts.
//!
//! Artifacts (the files beside a result) go through the client crate's `artifacts` module:
//! `put --artifact NAME=PATH` uploads each file, then Records the result naming them;
//! `get --artifacts-to DIR` writes a hit's files into DIR, each verified by its digest.
//!
//! This file holds the command line (clap) and hands each command to its module: `read`
//! (get, scan, resolve, devices), `write` (put, forget), `views`, `stats`, `trtllm_file`,
//! `flashinfer_store` and `inductor_store` (import, export, which `store_report` reports),
//! `bundle` and `bundle_export` (bundles: one file of entries and their artifacts, docs/bundles.md), `misses` (what replay found missing), `du`
//! and `prune` (what the cache holds by last use, and an administrator's expiry of what is
//! unused, docs/lifecycle.md); `entry_output` prints entries.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tunecache_client::{key, proto, Client};

mod bundle;
mod bundle_export;
mod du;
mod entry_output;
mod error_text;
mod flashinfer_store;
mod inductor_store;
mod misses;
mod prune;
mod read;
mod stats;
mod store_report;
mod trtllm_file;
mod views;
mod write;

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

    /// Read (get, scan, resolve, export, bundle export, bundle diff's `live`) in view NAME,
    /// where the first answer for a key is pinned for the whole job; used only when no launcher
    /// names the view: $TUNECACHE_VIEW, then Slurm's SLURM_JOB_ID/SLURM_STEP_ID, then torchrun's
    /// TORCHELASTIC_RUN_ID come first. TUNECACHE_VIEW= (set, empty) reads without a view.
    /// For `misses`, only the view listed, exactly as given.
    #[arg(long, global = true, value_name = "NAME")]
    view: Option<String>,

    #[command(subcommand)]
    command: TopCommand,
}

/// The commands: the cache's own, then bundles and replay's misses (issue 52), which connect
/// to the daemon only when they need it, and the lifecycle's (issue 51).
#[derive(Subcommand)]
enum TopCommand {
    #[command(flatten)]
    Daemon(Command),
    /// Bundles: one file holding entries, the artifacts they name and a manifest of digests,
    /// optionally signed (docs/bundles.md).
    Bundle {
        #[command(subcommand)]
        command: BundleCommand,
    },
    /// The keys asked in replay that had no answer, per view (every view, or --view's): what
    /// staging must tune next. Needs a daemon that answers ListMisses.
    Misses,
    /// What the node's cache holds per group: entries, their bytes (what memory and the
    /// journal hold), the artifact bytes they name and how long ago they were last used
    /// (today, 1-7 d, 7-30 d, 30-90 d, older), then the total and the daemon's retention and
    /// bound (docs/lifecycle.md).
    Du {
        /// Group the entries by this field of their keys.
        #[arg(long, value_enum, default_value = "namespace")]
        by: du::GroupBy,
    },
    /// Expire now, on every node, the entries not used for more than DAYS days (each key is
    /// forgotten while its result is still the one judged; a later Record brings it back).
    /// Prints each key and the count. An administrator's act (root, the daemon's uid, its
    /// --admin-uid / --admin-gid).
    Prune {
        /// Expire entries whose last use is more than DAYS days ago.
        #[arg(long, value_name = "DAYS")]
        unused_for: u32,
        /// Only entries of this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// Only entries of this Key.device.
        #[arg(long)]
        device: Option<String>,
        /// List what would expire; expire nothing.
        #[arg(long)]
        dry_run: bool,
    },
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
    /// Record the entries of a tuning cache: `--format trtllm FILE` (TensorRT-LLM's
    /// TLLM_AUTOTUNER_CACHE_PATH), `flashinfer ROOT` (FlashInfer's managed autotune store,
    /// every environment under ROOT/v2/) or `inductor DIR` (PyTorch Inductor's
    /// TORCHINDUCTOR_CACHE_DIR: the GEMM timings of DIR/cache/<system_hash> and every
    /// DIR/*/*.best_config). Invalid entries are skipped with reasons and the rest stored; exits
    /// non-zero only when the cache cannot be read or nothing in it could be stored.
    Import {
        #[arg(long, value_enum)]
        format: Option<CacheFormat>,
        /// Key.device for every entry, instead of the one built from the file's metadata
        /// (trtllm).
        #[arg(long)]
        device: Option<String>,
        /// `FILE` (with --format), or `FORMAT PATH`.
        #[arg(required = true, num_args = 1..=2, value_name = "[FORMAT] PATH")]
        target: Vec<String>,
    },
    /// Write the cache's entries as a tuning cache. `--format trtllm FILE`: under FILE.lock (the
    /// lock TensorRT-LLM's writers take), keeps the file's entries the cache lacks and replaces
    /// FILE by rename; entries TensorRT-LLM's loader could not read back are skipped with the
    /// reason. `flashinfer ROOT`: FlashInfer's store layout under ROOT (manifest.json and one
    /// file per entry, as FlashInfer's publish writes them), every environment or `--env`'s.
    /// `inductor DIR`: each system's timings merged into DIR/cache/<system_hash> (the file's
    /// other timings kept, ours winning on the same choice) and each best config written to
    /// its DIR/<dir>/<name>.best_config, as Inductor writes them.
    Export {
        #[arg(long, value_enum)]
        format: Option<CacheFormat>,
        /// Only entries of this Key.device (also names the device in a file whose entries
        /// carry no imported metadata). Required when the cache holds several devices (trtllm).
        #[arg(long)]
        device: Option<String>,
        /// Seconds to wait for FILE.lock held by a TensorRT-LLM writer.
        #[arg(long, default_value_t = 120.0)]
        lock_timeout: f64,
        /// Write a rank_<N> section for every rank below N, even an empty one (TensorRT-LLM
        /// refuses to load a file without its rank's section).
        #[arg(long)]
        world_size: Option<u32>,
        /// Only the environment whose hash is HASH (the directory name under ROOT/v2/;
        /// flashinfer).
        #[arg(long, value_name = "HASH")]
        env: Option<String>,
        /// `FILE` (with --format), or `FORMAT PATH`.
        #[arg(required = true, num_args = 1..=2, value_name = "[FORMAT] PATH")]
        target: Vec<String>,
    },
}

#[derive(Subcommand)]
enum BundleCommand {
    /// Write the entries the daemon serves (in --view, when given) and every artifact they
    /// name into one bundle file, by a temporary file in FILE's directory and a rename. Its
    /// creation time is $SOURCE_DATE_EPOCH when set, so that the same cache gives the same
    /// bytes.
    Export {
        /// The bundle to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Only entries of this namespace; may be given several times. None: every namespace.
        #[arg(long)]
        namespace: Vec<String>,
        /// Only entries of this Key.device.
        #[arg(long)]
        device: Option<String>,
        /// Only entries of this Key.op.
        #[arg(long)]
        op: Option<String>,
        /// Sign the manifest with this Ed25519 key (PKCS#8 PEM, as `openssl genpkey -algorithm
        /// ed25519` writes it; the file must be private, chmod 600).
        #[arg(long, value_name = "KEY.pem")]
        sign_key: Option<PathBuf>,
    },
    /// Show a bundle's manifest: entries, artifacts, bytes, namespaces, devices and signer, and
    /// whether every part matches its digest (exits 1 when one does not).
    Inspect { file: PathBuf },
    /// Check every part of a bundle against its digest and, with --trust-key, that one of
    /// those keys signed it. Exits 0 only then; otherwise prints the part and why, and exits 1.
    Verify {
        file: PathBuf,
        /// A public key (SPKI PEM, as `openssl pkey -pubout` writes it) whose signature is
        /// trusted; may be given several times.
        #[arg(long, value_name = "PUB.pem")]
        trust_key: Vec<PathBuf>,
    },
    /// Compare the entries of two bundles: keys only in A, only in B, and keys whose config,
    /// time_us or artifacts differ. Either side may be `live`, what the daemon serves now (in
    /// --view, when given); `./live` names a file. Exits 0 when they hold the same results,
    /// 1 when they differ.
    Diff { a: String, b: String },
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
    /// FlashInfer's managed autotune store (autotune_v2), a directory.
    Flashinfer,
    /// PyTorch Inductor's autotune cache (TORCHINDUCTOR_CACHE_DIR), a directory.
    Inductor,
}

/// The format and path of `import`/`export`: `--format F PATH` or `F PATH`.
fn format_and_path(
    format: Option<CacheFormat>,
    target: Vec<String>,
) -> anyhow::Result<(CacheFormat, PathBuf)> {
    use clap::ValueEnum;
    let mut target = target.into_iter();
    let (first, second) = (target.next().unwrap_or_default(), target.next());
    match (format, second) {
        (Some(format), None) => Ok((format, PathBuf::from(first))),
        (None, Some(path)) => {
            let format = CacheFormat::from_str(&first, true).map_err(|_| {
                anyhow::anyhow!("{first:?} is not a format (trtllm, flashinfer, inductor)")
            })?;
            Ok((format, PathBuf::from(path)))
        }
        (Some(_), Some(_)) => anyhow::bail!("give the format once: --format F PATH, or F PATH"),
        (None, None) => anyhow::bail!("name the format: --format F PATH, or F PATH"),
    }
}

/// `NAME=PATH` of `put --artifact`; the name is checked by the contract's rule when the files
/// are uploaded (`Client::put_artifacts`), before any of them is.
fn parse_artifact(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !path.is_empty() => Ok((name.to_owned(), PathBuf::from(path))),
        _ => Err(format!("{text:?} is not NAME=PATH")),
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

/// The daemon a command talks to, connected only by the commands that need one: a bundle on
/// disk is inspected, verified and compared with no daemon running.
struct Daemon {
    socket: Option<PathBuf>,
    view: Option<String>,
}

impl Daemon {
    async fn connect(&self) -> anyhow::Result<Client> {
        let socket = tunecache_client::socket_path(self.socket.clone())?;
        // TUNECACHE_AUTOSTART=1 starts a daemon when none answers.
        let client = Client::connect_auto(&socket).await?;
        Ok(match &self.view {
            Some(explicit) => client.with_view(explicit),
            None => client,
        })
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let as_json = cli.json;
    let daemon = Daemon {
        socket: cli.socket,
        view: cli.view,
    };
    let command = match cli.command {
        TopCommand::Daemon(command) => command,
        TopCommand::Bundle { command } => return bundle::run(command, &daemon, as_json).await,
        TopCommand::Misses => {
            let client = daemon.connect().await?;
            return misses::print(&client, daemon.view.as_deref(), as_json).await;
        }
        TopCommand::Du { by } => {
            let client = daemon.connect().await?;
            return du::print(&client, by, as_json).await;
        }
        TopCommand::Prune {
            unused_for,
            namespace,
            device,
            dry_run,
        } => {
            let client = daemon.connect().await?;
            let args = prune::PruneArgs {
                unused_for_days: unused_for,
                namespace,
                device,
                dry_run,
            };
            return prune::run(&client, args, as_json).await;
        }
    };
    let client = daemon.connect().await?;
    match command {
        Command::Get { key, artifacts_to } => {
            read::get(&client, &key, artifacts_to.as_deref(), as_json).await?
        }
        Command::Put {
            key,
            config,
            time_us,
            tuned_by,
            lease_id,
            artifacts,
        } => {
            let args = write::PutArgs {
                key,
                config,
                time_us,
                tuned_by,
                lease_id,
                artifacts,
            };
            write::put(&client, args, as_json).await?
        }
        Command::Scan {
            namespace,
            device,
            rank,
        } => read::scan(&client, namespace, device, rank, as_json).await?,
        Command::Stats { all, problems } => {
            stats::print(&client.stats().await?, as_json, all, problems)?
        }
        Command::Devices => read::devices(&client, as_json).await?,
        Command::Resolve {
            key,
            wait_ms,
            can_tune,
            lease_ms,
        } => read::resolve(&client, &key, wait_ms, can_tune, lease_ms, as_json).await?,
        Command::Forget {
            namespace,
            op,
            device,
            problem,
            rank,
            only_if_config,
            only_if_time_us,
        } => {
            let args = write::ForgetArgs {
                namespace,
                op,
                device,
                problem,
                rank,
                only_if_config,
                only_if_time_us,
            };
            write::forget(&client, args, as_json).await?
        }
        Command::View {
            command: ViewCommand::List,
        } => views::list(&client, as_json).await?,
        Command::View {
            command: ViewCommand::End { name },
        } => views::end(&client, &name, as_json).await?,
        Command::Import {
            format,
            device,
            target,
        } => match format_and_path(format, target)? {
            (CacheFormat::Trtllm, file) => {
                trtllm_file::import_trtllm(&client, device, &file, as_json).await?
            }
            (CacheFormat::Flashinfer, root) => {
                anyhow::ensure!(
                    device.is_none(),
                    "--device is for trtllm files; a FlashInfer store names its environments"
                );
                flashinfer_store::import(&client, &root, as_json).await?
            }
            (CacheFormat::Inductor, dir) => {
                anyhow::ensure!(
                    device.is_none(),
                    "--device is for trtllm files; Inductor's files name their systems"
                );
                inductor_store::import(&client, &dir, as_json).await?
            }
        },
        Command::Export {
            format,
            device,
            lock_timeout,
            world_size,
            env,
            target,
        } => match format_and_path(format, target)? {
            (CacheFormat::Trtllm, file) => {
                anyhow::ensure!(env.is_none(), "--env is for flashinfer stores");
                let lock_timeout = std::time::Duration::try_from_secs_f64(lock_timeout)
                    .context("--lock-timeout must be a non-negative number of seconds")?;
                let args = trtllm_file::ExportArgs {
                    device,
                    world_size,
                    lock_timeout,
                };
                trtllm_file::export_trtllm(&client, args, &file, as_json).await?
            }
            (CacheFormat::Flashinfer, root) => {
                anyhow::ensure!(
                    device.is_none() && world_size.is_none(),
                    "--device and --world-size are for trtllm files; choose an environment with --env"
                );
                flashinfer_store::export(&client, &root, env.as_deref(), as_json).await?
            }
            (CacheFormat::Inductor, dir) => {
                anyhow::ensure!(
                    device.is_none() && world_size.is_none() && env.is_none(),
                    "--device and --world-size are for trtllm files, --env for flashinfer stores"
                );
                inductor_store::export(&client, &dir, as_json).await?
            }
        },
    }
    Ok(())
}
