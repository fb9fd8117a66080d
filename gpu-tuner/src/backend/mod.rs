//! Tuning backends: what the worker process tunes on, and the pieces they share.
//!
//! A backend owns its devices (reported in `Ready`) and turns one `TuneJob` into the winning
//! `tunecache.v1.Result`. `cpu` is a real-but-slow stand-in used where no GPU is present;
//! `cuda` drives cuBLASLt and NVRTC through cudarc with the driver loaded at run time. Both
//! check gemm tactics against the same host reference (`reference`).
//!
//! Every backend names its candidates and announces each one before running it (the
//! worker forwards that as a `Running` frame), skips the candidates the job excludes
//! (they killed an earlier worker), checks a candidate's answer before its time counts,
//! and bounds its report (`report`). `faults` injects failures for the cpu backend's tests.

pub mod cpu;
pub mod cuda;
pub mod faults;
pub mod reference;
pub mod report;

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::tuner::BackendChoice;
use tunecache_proto::v1;

use crate::error::TuneError;
use crate::measure::MeasureConfig;

/// One tuning backend, used by one worker thread at a time.
pub trait Backend {
    /// `"cuda"` or `"cpu"`, as in `Ready.backend` and `Device.backend`.
    fn name(&self) -> &'static str;
    /// The devices this backend tunes; a job names one of them by fingerprint.
    fn devices(&self) -> &[v1::Device];
    /// Tunes one job. `Err` means the problem cannot be tuned here (not retried).
    /// `announce` is called with a candidate's name before any of its code runs.
    fn tune(
        &mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError>;
}

/// Which GPU the worker uses (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The least-loaded GPU by NVML when it loads, else the last one.
    #[default]
    Auto,
    /// This CUDA ordinal.
    Ordinal(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(DeviceChoice::Auto),
            number => number.parse().map(DeviceChoice::Ordinal).map_err(|_| {
                format!("--device {number:?}: expected auto or a CUDA device ordinal")
            }),
        }
    }
}

/// Opens the chosen backend and says why it was chosen (the `Ready.note`).
pub fn select(
    choice: BackendChoice,
    measure: MeasureConfig,
    device: DeviceChoice,
    faults: faults::FaultPlan,
) -> Result<(Box<dyn Backend>, String), TuneError> {
    if !faults.is_empty() && choice != BackendChoice::Cpu {
        return Err(TuneError::Unavailable(
            "--inject-fault is for tests of the cpu backend only".to_string(),
        ));
    }
    match choice {
        BackendChoice::Cpu => Ok((
            Box::new(cpu::CpuBackend::new(measure).with_faults(faults)),
            "cpu backend requested; CPU stand-in, not a GPU measurement".to_string(),
        )),
        BackendChoice::Cuda => {
            let backend = cuda::CudaBackend::open(measure, device)?;
            let note = format!("cuda backend requested; {}", backend.summary());
            Ok((Box::new(backend), note))
        }
        BackendChoice::Auto => match cuda::CudaBackend::open(measure.clone(), device) {
            Ok(backend) => {
                let note = format!("auto: {}", backend.summary());
                Ok((Box::new(backend), note))
            }
            Err(why) => Ok((
                Box::new(cpu::CpuBackend::new(measure)),
                format!("auto: cuda unavailable ({why}); using the CPU stand-in"),
            )),
        },
    }
}

/// `tuned_by` of results from this process.
pub fn tuned_by(backend: &str) -> String {
    format!("tunecache-tuner/{backend}@{}", hostname())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Builds the result from a winner's config JSON and median time; the config is fitted
/// under the daemon's size limit.
pub fn make_result(backend: &str, config: serde_json::Value, time_us: f64) -> v1::Result {
    v1::Result {
        config: report::fit_config(config).to_string(),
        time_us,
        tuned_by: tuned_by(backend),
        tuned_at_unix_ms: tunecache_proto::unix_now_ms(),
        forget_epoch: 0,
        artifacts: Default::default(),
    }
}

/// The job's excluded candidates: name to the reason (how a worker died running it).
pub fn excluded(job: &TuneJob) -> BTreeMap<String, String> {
    job.excluded
        .iter()
        .map(|e| (e.candidate.clone(), e.reason.clone()))
        .collect()
}

/// The report entry text of an excluded candidate.
pub fn excluded_text(reason: &str) -> String {
    format!("excluded: it killed the worker on an earlier attempt ({reason})")
}

/// When to stop measuring further tactics: 80% of the job's timeout, leaving time to
/// verify and answer before the supervisor gives up on the job.
pub fn tactic_deadline(job: &TuneJob) -> Option<Instant> {
    (job.timeout_ms > 0)
        .then(|| Instant::now() + Duration::from_millis(u64::from(job.timeout_ms)) * 4 / 5)
}

/// Deterministic pseudo-random values (splitmix64), so every run and every tactic sees the
/// same data and results are reproducible across workers.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn next_signed_unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
