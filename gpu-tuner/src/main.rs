//! `tunecache-tuner`: the worker process that `tunecached` runs as a child to tune problems
//! of namespace `tunecache`.
//!
//! It picks a backend, announces itself with one `Ready` frame on stdout, then answers each
//! `ToWorker` job frame from stdin with a `JobDone` frame, one job at a time. Before it runs
//! any candidate's code it sends a `Running` frame naming it, so that if the candidate kills
//! the process the supervisor knows which one to exclude on the retry. End of stdin
//! means the daemon is gone or done: exit 0. Logs go to stderr only, since stdout carries
//! frames. A faulting kernel may leave the CUDA context unusable; the backend then exits the
//! process and the daemon's supervisor starts a fresh one.

use std::io::{BufReader, BufWriter};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tunecache_gpu_tuner::backend::{self, faults::FaultPlan, report, DeviceChoice};
use tunecache_gpu_tuner::error::TuneError;
use tunecache_gpu_tuner::measure::MeasureConfig;
use tunecache_proto::tuner::frame::{read_frame, write_frame};
use tunecache_proto::tuner::v1::{
    from_worker, job_done, to_worker, FromWorker, JobDone, Ready, Running, ToWorker,
};
use tunecache_proto::tuner::BackendChoice;

#[derive(Debug, Parser)]
#[command(
    name = "tunecache-tuner",
    about = "tunecache tuning worker (speaks frames on stdin/stdout)"
)]
struct Args {
    /// auto: cuda when the driver loads and shows a device, else the CPU stand-in.
    #[arg(long, default_value = "auto", env = "TUNECACHE_TUNER_BACKEND")]
    backend: BackendChoice,
    /// Evict L2 before every timed GPU run (cold-cache timings).
    #[arg(long, env = "TUNECACHE_TUNER_FLUSH_L2")]
    flush_l2: bool,
    /// Wall-clock budget for measuring one tactic, in milliseconds.
    #[arg(long, default_value_t = 2000, env = "TUNECACHE_TUNER_MS_PER_TACTIC")]
    ms_per_tactic: u64,
    /// The GPU to tune on (a CUDA ordinal), or auto: the least-loaded by NVML, else the last.
    /// The worker creates a context on this GPU only.
    #[arg(long, default_value = "auto", env = "TUNECACHE_TUNER_DEVICE")]
    device: DeviceChoice,
    /// Tests only (cpu backend): make candidate NAME fail as KIND (abort, poison, hang, wrong).
    #[arg(long, value_name = "NAME=KIND", hide = true)]
    inject_fault: Vec<String>,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line (no backtrace), since the supervisor quotes the last stderr lines.
            eprintln!("tunecache-tuner: error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let measure = MeasureConfig {
        flush_l2: args.flush_l2,
        max_time_per_tactic: Duration::from_millis(args.ms_per_tactic),
        ..MeasureConfig::default()
    };
    let faults = FaultPlan::parse(&args.inject_fault).map_err(anyhow::Error::msg)?;
    let (mut backend, note) = backend::select(args.backend, measure, args.device, faults.clone())
        .context("no backend")?;
    tracing::info!(backend = backend.name(), %note, devices = backend.devices().len(), "tuner worker ready");

    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let ready = FromWorker {
        msg: Some(from_worker::Msg::Ready(Ready {
            backend: backend.name().to_string(),
            devices: backend.devices().to_vec(),
            note,
        })),
    };
    write_frame(&mut output, &ready).context("writing Ready")?;

    while let Some(frame) = read_frame::<_, ToWorker>(&mut input).context("reading a job frame")? {
        let Some(to_worker::Msg::Job(job)) = frame.msg else {
            tracing::warn!("ignoring an empty frame");
            continue;
        };
        tracing::info!(job_id = job.job_id, op = %job.op, device = %job.device, "tuning");
        let started = Instant::now();
        let mut announce = |candidate: &str| {
            let running = FromWorker {
                msg: Some(from_worker::Msg::Running(Running {
                    job_id: job.job_id,
                    candidate: candidate.to_string(),
                })),
            };
            // Unsent, the supervisor blames the previous candidate if this one kills us;
            // a broken stdout also fails the JobDone below, which ends the worker.
            if let Err(error) = write_frame(&mut output, &running) {
                tracing::warn!(%error, "could not announce a candidate");
            }
            faults.on_running(candidate);
        };
        // A panic in a backend (e.g. a missing library symbol) fails this job, not the worker.
        let outcome = catch_unwind(AssertUnwindSafe(|| backend.tune(&job, &mut announce)))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown panic");
                Err(TuneError::Panicked(what.to_string()))
            });
        let outcome = match outcome {
            Ok(result) => {
                tracing::info!(
                    job_id = job.job_id,
                    time_us = result.time_us,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "tuned"
                );
                job_done::Outcome::Result(result)
            }
            Err(error) => {
                tracing::warn!(job_id = job.job_id, %error, "job failed");
                job_done::Outcome::Error(report::bound_error(&error.to_string()))
            }
        };
        let done = FromWorker {
            msg: Some(from_worker::Msg::Done(JobDone {
                job_id: job.job_id,
                outcome: Some(outcome),
            })),
        };
        write_frame(&mut output, &done).context("writing JobDone")?;
    }
    tracing::info!("stdin closed; exiting");
    Ok(())
}
