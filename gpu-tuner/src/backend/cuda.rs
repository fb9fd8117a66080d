//! The CUDA backend: `gemm` through cuBLASLt's heuristic candidates and `nvrtc` through
//! run-time compiled kernel candidates, timed with CUDA events on one GPU.
//!
//! cudarc is built with `dynamic-loading`, so this compiles without a CUDA toolkit and loads
//! `libcuda` / `libcublasLt` / `libnvrtc` only when used. cudarc panics when a library cannot
//! be loaded, so every entry point first checks that the library is present and never touches
//! cudarc otherwise.
//!
//! The worker uses one GPU (`--device`, default: the least-loaded by NVML, else the last)
//! and creates a context on that GPU only, so it takes no memory from ranks on the others
//! and does not collide with EXCLUSIVE_PROCESS mode there.
//!
//! Timing follows `measure`: a spin kernel keeps the GPU busy while the host queues N
//! back-to-back runs between one pair of events; cold-L2 timing rotates through copies of
//! the buffers that together exceed twice the L2 size.
//!
//! Sticky errors (illegal address, invalid address space, uncorrectable ECC, launch failure,
//! ...) leave the CUDA context unusable for the life of the process. After any failed driver
//! or cuBLASLt call the backend also asks the context itself (`cuCtxSynchronize`), since a
//! library may report a sticky error under a code of its own. A poisoned worker exits with
//! [`POISONED_EXIT_CODE`]: the supervisor restarts a fresh one, excluding the candidate it
//! had announced, and only the worker ever dies.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::sys as driver_sys;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use serde_json::json;
use tunecache_proto::tuner::problem::{
    parse_gemm, parse_nvrtc, BufferDtype, BufferInit, CheckSpec, GemmDtype, GemmProblem, KernelArg,
    NvrtcProblem,
};
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

pub use tunecache_proto::tuner::POISONED_EXIT_CODE;

use super::reference::{random_operands, reference_entry_with_magnitude, GemmShape};
use super::report::{
    bound_error, bound_report, cut, record_timings, MAX_FIELD_CHARS, REPORT_BUDGET_BYTES,
};
use super::{
    excluded, excluded_text, make_result, tactic_deadline, Backend, DeviceChoice, SplitMix64,
};
use crate::error::TuneError;
use crate::measure::{
    measure_interleaved, rotation_sets, DelayPolicy, MeasureConfig, Timed, TimingMethod,
};

/// cuBLASLt algorithms asked of the heuristic.
pub const HEURISTIC_ALGOS: usize = 32;
/// Workspace offered to cuBLASLt algorithms.
pub const GEMM_WORKSPACE_BYTES: usize = 32 << 20;
/// Output entries compared with the host reference per algorithm.
const GEMM_CHECK_SAMPLES: usize = 256;
/// Columns of D those entries are drawn from: only these columns' checked rows are
/// downloaded, not the whole output.
const GEMM_CHECK_COLUMNS: usize = 16;
/// Shared memory a block gets without opting in.
const DEFAULT_SHARED_BYTES: u64 = 48 * 1024;
/// At most this many copies of a problem's buffers for cold-L2 rotation.
const MAX_ROTATION_SETS: u64 = 64;

/// Whether the NVIDIA driver library can be loaded; checked before anything touches cudarc.
pub fn driver_library_present() -> bool {
    // SAFETY: only tries to dlopen the library names and drops the handle.
    unsafe { driver_sys::is_culib_present() }
}

fn cublaslt_library_present() -> bool {
    // SAFETY: as above.
    unsafe { lt_sys::is_culib_present() }
}

fn nvrtc_library_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Why a library cudarc cannot find is missing. cudarc (built with `cuda-12080`) looks for
/// `.so`, `.so.12`, `.so.11`, ... but not `.so.13`, so a CUDA 13 host needs the CUDA 12
/// runtime libraries beside its own; say so when only the 13 one is there.
fn missing_library(lib: &str, op: &str) -> TuneError {
    let so13 = format!("lib{lib}.so.13");
    // SAFETY: only tries to dlopen the name and drops the handle.
    let has_13 = unsafe { libloading::Library::new(&so13) }.is_ok();
    TuneError::Unavailable(if has_13 {
        format!(
            "lib{lib}.so.12 cannot be loaded, but {so13} can: this worker's bindings (cudarc, \
             cuda-12080) load the CUDA 12 library only; install the CUDA 12 {lib} runtime \
             (e.g. pip nvidia-*-cu12 or the distribution's CUDA 12 package) and put it on \
             LD_LIBRARY_PATH; op {op} needs it"
        )
    } else {
        format!("lib{lib} cannot be loaded (looked for .so, .so.12, .so.11); op {op} needs it")
    })
}

/// CUDA errors after which the context can no longer be used: CUDA's documentation says the
/// process must terminate (or that the context is unusable) for each of these.
pub fn is_sticky(code: driver_sys::CUresult) -> bool {
    use driver_sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_NVLINK_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// What a failed call means for the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The job fails (or the candidate is reported), and the worker carries on.
    JobError,
    /// The context is unusable: the worker must exit.
    Poisoned,
}

/// The verdict on a failed call that returned `code` (`None` for a library's own status,
/// e.g. cuBLASLt's), given what `cuCtxSynchronize` said right after (`probe`): a sticky code
/// is fatal at once; otherwise the context's own answer decides, since a library can hide a
/// sticky driver error behind a status of its own (CUBLAS_STATUS_EXECUTION_FAILED).
pub fn verdict(
    code: Option<driver_sys::CUresult>,
    probe: Result<(), driver_sys::CUresult>,
) -> Verdict {
    if code.is_some_and(is_sticky) {
        return Verdict::Poisoned;
    }
    match probe {
        Ok(()) => Verdict::JobError,
        // Any failure of a plain synchronize means the context is unusable (asynchronous
        // errors are sticky; a lost context answers with other codes).
        Err(_) => Verdict::Poisoned,
    }
}

/// Asks the current context whether it still works.
fn probe_context() -> Result<(), driver_sys::CUresult> {
    // SAFETY: no arguments; acts on the context bound to this thread at the job's start.
    let status = unsafe { driver_sys::cuCtxSynchronize() };
    match status {
        driver_sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(other),
    }
}

fn exit_poisoned(what: &str, detail: &str) -> ! {
    tracing::error!(%what, %detail, "sticky CUDA error: the context is unusable; exiting so the supervisor starts a fresh worker");
    eprintln!("tunecache-tuner: sticky CUDA error during {what}: {detail}; exiting");
    std::process::exit(POISONED_EXIT_CODE);
}

/// Turns a driver error into a job error, or ends the process if the context is poisoned.
fn driver_error(what: &str, error: DriverError) -> TuneError {
    let probe = if is_sticky(error.0) {
        Ok(())
    } else {
        probe_context()
    };
    if verdict(Some(error.0), probe) == Verdict::Poisoned {
        exit_poisoned(what, &format!("{error:?} (context check: {probe:?})"));
    }
    TuneError::driver(what, error)
}

/// Turns a cuBLASLt error into a job error, after asking the context whether it survived.
fn blas_error(what: &'static str, source: lt::CublasError) -> TuneError {
    let probe = probe_context();
    if verdict(None, probe) == Verdict::Poisoned {
        exit_poisoned(what, &format!("{source:?} (context check: {probe:?})"));
    }
    TuneError::Blas { what, source }
}

/// The kernel module version from `/proc/driver/nvidia/version`, in both flavours:
/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  ..." and
/// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...".
/// The version is the first word after "Kernel Module" that looks like one.
pub fn parse_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("NVRM version"))?;
    let after = line.split("Kernel Module").nth(1)?;
    after
        .split_whitespace()
        .find(|word| {
            word.starts_with(|c: char| c.is_ascii_digit())
                && word.contains('.')
                && word.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_string)
}

fn nvidia_driver_version() -> String {
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|text| parse_driver_version(&text))
        .unwrap_or_default()
}

/// How busy a GPU is, by NVML.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuLoad {
    /// Percent of time a kernel ran over NVML's last sample period.
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
}

impl GpuLoad {
    fn score(&self) -> f64 {
        let memory = self.memory_used_bytes as f64 / self.memory_total_bytes.max(1) as f64;
        f64::from(self.utilization_percent) + 100.0 * memory
    }
}

/// The GPU to tune on when none is named: the least-loaded one when every GPU's load is
/// known (ties go to the higher ordinal), else the last GPU, since rank 0 usually runs on
/// the first. Returns the ordinal and why it was picked.
pub fn pick_device(loads: &[Option<GpuLoad>]) -> (usize, String) {
    let last = loads.len().saturating_sub(1);
    let known: Option<Vec<GpuLoad>> = loads.iter().copied().collect();
    match known {
        Some(loads) if !loads.is_empty() => {
            let (ordinal, load) = loads
                .iter()
                .enumerate()
                .rev()
                .min_by(|x, y| x.1.score().total_cmp(&y.1.score()))
                .map(|(i, l)| (i, *l))
                .unwrap_or((last, loads[last]));
            (
                ordinal,
                format!(
                    "least-loaded by NVML ({}% busy, {} MiB of {} MiB used)",
                    load.utilization_percent,
                    load.memory_used_bytes >> 20,
                    load.memory_total_bytes >> 20
                ),
            )
        }
        _ => (last, "the last GPU (NVML not loadable)".to_string()),
    }
}

/// NVML's UUID text of a CUDA device UUID: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
pub fn nvml_uuid(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The load of each GPU (by CUDA ordinal) from NVML, matched by UUID since NVML and CUDA
/// may number GPUs differently; `None` for a GPU NVML could not answer for.
fn nvml_loads(uuids: &[[u8; 16]]) -> Vec<Option<GpuLoad>> {
    #[repr(C)]
    struct Utilization {
        gpu: u32,
        memory: u32,
    }
    #[repr(C)]
    struct Memory {
        total: u64,
        free: u64,
        used: u64,
    }
    type Init = unsafe extern "C" fn() -> i32;
    type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> i32;
    type GetUtilization = unsafe extern "C" fn(*mut c_void, *mut Utilization) -> i32;
    type GetMemory = unsafe extern "C" fn(*mut c_void, *mut Memory) -> i32;
    let none = || vec![None; uuids.len()];
    // SAFETY: libnvidia-ml is the NVIDIA driver's own library; the symbols below have had
    // these C signatures since NVML 3 (nvmlReturn_t is an int, 0 = success).
    unsafe {
        let Ok(library) = libloading::Library::new("libnvidia-ml.so.1") else {
            return none();
        };
        let (Ok(init), Ok(shutdown), Ok(by_uuid), Ok(utilization), Ok(memory)) = (
            library.get::<Init>(b"nvmlInit_v2\0"),
            library.get::<Init>(b"nvmlShutdown\0"),
            library.get::<ByUuid>(b"nvmlDeviceGetHandleByUUID\0"),
            library.get::<GetUtilization>(b"nvmlDeviceGetUtilizationRates\0"),
            library.get::<GetMemory>(b"nvmlDeviceGetMemoryInfo\0"),
        ) else {
            return none();
        };
        if init() != 0 {
            return none();
        }
        let loads = uuids
            .iter()
            .map(|uuid| {
                let text = CString::new(nvml_uuid(uuid)).ok()?;
                let mut handle: *mut c_void = std::ptr::null_mut();
                if by_uuid(text.as_ptr(), &mut handle) != 0 {
                    return None;
                }
                let mut busy = Utilization { gpu: 0, memory: 0 };
                let mut mem = Memory {
                    total: 0,
                    free: 0,
                    used: 0,
                };
                if utilization(handle, &mut busy) != 0 || memory(handle, &mut mem) != 0 {
                    return None;
                }
                Some(GpuLoad {
                    utilization_percent: busy.gpu,
                    memory_used_bytes: mem.used,
                    memory_total_bytes: mem.total,
                })
            })
            .collect();
        shutdown();
        loads
    }
}

/// Shared memory a launch needs beyond the default: `Ok(Some(bytes))` to raise the
/// function's dynamic limit to, `Ok(None)` when the default 48 KiB suffices. The limit
/// applies to static plus dynamic shared memory, so both count; `optin_max` is the device's
/// per-block opt-in maximum.
pub fn shared_memory_opt_in(
    static_bytes: u64,
    dynamic_bytes: u64,
    optin_max: u64,
) -> Result<Option<u64>, String> {
    let total = static_bytes + dynamic_bytes;
    if total <= DEFAULT_SHARED_BYTES {
        return Ok(None);
    }
    if total > optin_max {
        return Err(format!(
            "needs {total} bytes of shared memory per block ({static_bytes} static + \
             {dynamic_bytes} dynamic); this GPU allows at most {optin_max}"
        ));
    }
    Ok(Some(dynamic_bytes))
}

/// Tolerance of one checked gemm entry: the output's rounding of the result plus a bound
/// proportional to `sum |a||b|` (the magnitude the error of a dot product scales with:
/// split-K algorithms that reduce partial sums in the output type round those partials, so
/// an entry whose value cancels to near zero can still carry an error of eps * sum |a||b|).
pub fn gemm_tolerance(dtype: GemmDtype, k: usize, want: f64, sum_abs: f64) -> f64 {
    // Unit roundoff of the output type.
    let output = match dtype {
        GemmDtype::F32 => f64::from(f32::EPSILON) / 2.0,
        GemmDtype::F16 => 1.0 / 2048.0,
        GemmDtype::Bf16 => 1.0 / 256.0,
    };
    // f32 accumulation over k terms, at its typical sqrt(k) growth with a margin of 4.
    let accumulation = 4.0 * (k as f64).sqrt() * f64::from(f32::EPSILON) / 2.0;
    output * want.abs() + (output + accumulation) * sum_abs
}

/// Which entries of an `m x n` output to check: up to `columns` distinct columns, each with
/// distinct rows, `samples` entries in all. Column-major storage makes each column's rows
/// one contiguous range, so only those ranges are downloaded.
pub fn check_plan(
    m: usize,
    n: usize,
    samples: usize,
    columns: usize,
    seed: u64,
) -> Vec<(usize, Vec<usize>)> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |count: usize, of: usize| -> Vec<usize> {
        let count = count.min(of);
        let mut chosen = std::collections::BTreeSet::new();
        while chosen.len() < count {
            chosen.insert((rng.next_u64() % of as u64) as usize);
        }
        chosen.into_iter().collect()
    };
    let cols = pick(columns.max(1), n.max(1));
    let rows_per_column = samples.div_ceil(cols.len().max(1));
    cols.into_iter()
        .map(|j| (j, pick(rows_per_column, m.max(1))))
        .collect()
}

/// The device the worker tunes on.
struct CudaDevice {
    ordinal: usize,
    context: Arc<CudaContext>,
}

pub struct CudaBackend {
    devices: Vec<v1::Device>,
    device: CudaDevice,
    /// Why this GPU (for the Ready note).
    chosen_because: String,
    measure: MeasureConfig,
}

impl CudaBackend {
    /// Loads the driver and opens the chosen GPU; `Err` says why CUDA cannot be used.
    pub fn open(measure: MeasureConfig, device: DeviceChoice) -> Result<Self, TuneError> {
        if !driver_library_present() {
            return Err(TuneError::Unavailable(
                "libcuda.so.1 (the NVIDIA driver library) cannot be loaded".to_string(),
            ));
        }
        // A driver too old for a symbol cudarc looks up makes cudarc panic; contain that.
        catch_unwind(AssertUnwindSafe(|| Self::open_driver(measure, device))).unwrap_or_else(|_| {
            Err(TuneError::Unavailable(
                "the CUDA driver library panicked during initialisation".to_string(),
            ))
        })
    }

    fn open_driver(measure: MeasureConfig, choice: DeviceChoice) -> Result<Self, TuneError> {
        use cudarc::driver::result::device as raw_device;
        let count = CudaContext::device_count()
            .map_err(|e| TuneError::driver("cuInit / cuDeviceGetCount failed", e))?;
        if count < 1 {
            return Err(TuneError::Unavailable(
                "the CUDA driver reports no devices".to_string(),
            ));
        }
        let count = count as usize;
        let (ordinal, chosen_because) = match choice {
            DeviceChoice::Ordinal(ordinal) if ordinal < count => {
                (ordinal, "named by --device".to_string())
            }
            DeviceChoice::Ordinal(ordinal) => {
                return Err(TuneError::Unavailable(format!(
                    "--device {ordinal}: the CUDA driver shows {count} device(s) (0..{})",
                    count - 1
                )))
            }
            DeviceChoice::Auto => {
                // UUIDs need no context, so no GPU but the chosen one gets one.
                let uuids: Vec<[u8; 16]> = (0..count)
                    .map(|i| {
                        raw_device::get(i as i32)
                            .and_then(raw_device::get_uuid)
                            .map(|uuid| uuid.bytes.map(|b| b as u8))
                            .unwrap_or([0; 16])
                    })
                    .collect();
                pick_device(&nvml_loads(&uuids))
            }
        };
        let mut cuda_version: i32 = 0;
        // SAFETY: plain out-parameter call into the loaded driver.
        unsafe { driver_sys::cuDriverGetVersion(&mut cuda_version) }
            .result()
            .map_err(|e| TuneError::driver("cuDriverGetVersion failed", e))?;
        let cuda_version = format!("{}.{}", cuda_version / 1000, (cuda_version % 1000) / 10);
        let context = CudaContext::new(ordinal)
            .map_err(|e| TuneError::driver(format!("creating a context on device {ordinal}"), e))?;
        let name = context
            .name()
            .map_err(|e| TuneError::driver(format!("device {ordinal} name"), e))?;
        let (major, minor) = context
            .compute_capability()
            .map_err(|e| TuneError::driver(format!("device {ordinal} compute capability"), e))?;
        let memory_bytes = context.total_mem().unwrap_or(0) as u64;
        let devices = vec![v1::Device {
            backend: "cuda".to_string(),
            fingerprint: format!("{name}|sm_{major}{minor}|cuda {cuda_version}"),
            name,
            compute_capability: format!("{major}.{minor}"),
            memory_bytes,
            driver_version: nvidia_driver_version(),
            cuda_version,
        }];
        Ok(CudaBackend {
            devices,
            device: CudaDevice { ordinal, context },
            chosen_because,
            measure,
        })
    }

    /// One line for the `Ready.note`.
    pub fn summary(&self) -> String {
        format!(
            "CUDA device {} ({}): {}",
            self.device.ordinal, self.chosen_because, self.devices[0].fingerprint
        )
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> &[v1::Device] {
        &self.devices
    }

    fn tune(
        &mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        if self.devices[0].fingerprint != job.device {
            return Err(TuneError::NoDevice(job.device.clone()));
        }
        let device = &self.device;
        device
            .context
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        tracing::debug!(ordinal = device.ordinal, "tuning on device");
        match job.op.as_str() {
            "gemm" => {
                let problem = parse_gemm(&job.problem)?;
                if !cublaslt_library_present() {
                    return Err(missing_library("cublasLt", "gemm"));
                }
                GemmRun::prepare(device, &problem, &self.measure)?.tune(job, announce)
            }
            "nvrtc" => {
                let problem = parse_nvrtc(&job.problem)?;
                if !nvrtc_library_present() {
                    return Err(missing_library("nvrtc", "nvrtc"));
                }
                NvrtcRun::prepare(device, &problem, &self.measure)?.tune(job, announce)
            }
            other => Err(TuneError::UnknownOp(other.to_string())),
        }
    }
}

/// The delay kernel, as PTX so that it loads without NVRTC (gemm jobs do not need NVRTC):
/// it spins on the global nanosecond timer until `ns` have passed. PTX ISA 6.0 for sm_50
/// loads on every driver and GPU this backend supports; the driver compiles it for the GPU.
const SPIN_PTX: &str = r#"
.version 6.0
.target sm_50
.address_size 64

.visible .entry tunecache_spin(
    .param .u64 tunecache_spin_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [tunecache_spin_ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
SPIN:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra SPIN;
    ret;
}
"#;

/// Times samples of back-to-back runs: a spin kernel first, so the GPU is busy while the
/// host queues the runs, then the runs between one pair of events.
struct SampleTimer {
    start: CudaEvent,
    end: CudaEvent,
    spin: CudaFunction,
    delay: DelayPolicy,
    /// Samples taken again because the host out-ran the delay.
    retaken: u32,
}

impl SampleTimer {
    fn new(context: &Arc<CudaContext>) -> Result<Self, TuneError> {
        let event = || {
            context
                .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| driver_error("creating a CUDA event", e))
        };
        let module = context
            .load_module(Ptx::from_src(SPIN_PTX))
            .map_err(|e| driver_error("loading the delay kernel", e))?;
        let spin = module
            .load_function("tunecache_spin")
            .map_err(|e| driver_error("finding the delay kernel", e))?;
        Ok(SampleTimer {
            start: event()?,
            end: event()?,
            spin,
            delay: DelayPolicy::default(),
            retaken: 0,
        })
    }

    /// Queues the delay kernel, then `runs` calls of `enqueue` between the events; returns
    /// the mean GPU time of one run in microseconds.
    fn sample(
        &mut self,
        stream: &Arc<CudaStream>,
        runs: u32,
        enqueue: &mut dyn FnMut() -> Result<(), TuneError>,
    ) -> Result<f64, TuneError> {
        let runs = runs.max(1);
        // A sample the host out-ran (the GPU may have idled inside it) is taken once more.
        let mut retaken = false;
        loop {
            let ns = (self.delay.delay_us * 1e3) as u64;
            let mut builder = stream.launch_builder(&self.spin);
            builder.arg(&ns);
            // SAFETY: the kernel takes one u64 by value, as pushed.
            let one = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { builder.launch(one) }
                .map_err(|e| driver_error("launching the delay kernel", e))?;
            self.start
                .record(stream)
                .map_err(|e| driver_error("recording the start event", e))?;
            let queued = Instant::now();
            for _ in 0..runs {
                enqueue()?;
            }
            self.end
                .record(stream)
                .map_err(|e| driver_error("recording the end event", e))?;
            let enqueue_us = queued.elapsed().as_secs_f64() * 1e6;
            self.end
                .synchronize()
                .map_err(|e| driver_error("waiting for the timed runs", e))?;
            let ms = self
                .start
                .elapsed_ms(&self.end)
                .map_err(|e| driver_error("reading the event timer", e))?;
            let starved = self.delay.observe(enqueue_us);
            if !starved || retaken {
                return Ok(f64::from(ms) * 1e3 / f64::from(runs));
            }
            retaken = true;
            self.retaken += 1;
        }
    }

    fn queued_behind(&self) -> String {
        format!(
            "spin kernel on %globaltimer, {:.0} us at the end (grown to cover the host's queueing; {} sample(s) retaken)",
            self.delay.delay_us, self.retaken
        )
    }
}

/// How many copies of `set_bytes` of buffers to rotate through, and the method's text.
fn plan_rotation(
    context: &Arc<CudaContext>,
    set_bytes: u64,
    flush_l2: bool,
) -> Result<(u64, String), TuneError> {
    if !flush_l2 {
        return Ok((1, "off".to_string()));
    }
    let l2 = context
        .attribute(driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(|e| driver_error("reading the L2 size", e))?
        .max(1 << 20) as u64;
    let (free, _total) = context
        .mem_get_info()
        .map_err(|e| driver_error("reading free device memory", e))?;
    // Half of what is free, less the set already allocated.
    let budget = (free as u64 / 2).saturating_add(set_bytes);
    let (sets, enough) = rotation_sets(set_bytes, l2, budget, MAX_ROTATION_SETS);
    let text = format!(
        "rotating {sets} copies of the buffers ({set_bytes} bytes each; L2 {l2} bytes){}",
        if enough {
            ""
        } else {
            "; too little memory for more, so partly warm"
        }
    );
    Ok((sets, text))
}

/// Raw device address of a slice. Valid while the slice lives; with a single stream there
/// is no cross-stream ordering for cudarc's guard to do, so the guard is dropped at once.
fn raw_ptr(slice: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> driver_sys::CUdeviceptr {
    let (ptr, _guard) = slice.device_ptr(stream);
    ptr
}

fn raw_ptr_mut(slice: &mut CudaSlice<u8>, stream: &Arc<CudaStream>) -> driver_sys::CUdeviceptr {
    let (ptr, _guard) = slice.device_ptr_mut(stream);
    ptr
}

fn gemm_data_type(dtype: GemmDtype) -> lt_sys::cudaDataType {
    match dtype {
        GemmDtype::F16 => lt_sys::cudaDataType::CUDA_R_16F,
        GemmDtype::Bf16 => lt_sys::cudaDataType::CUDA_R_16BF,
        GemmDtype::F32 => lt_sys::cudaDataType::CUDA_R_32F,
    }
}

/// Host values rounded to the element type, and their device bytes.
fn encode_gemm_values(values: &mut [f32], dtype: GemmDtype) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for value in values.iter_mut() {
        match dtype {
            GemmDtype::F32 => bytes.extend_from_slice(&value.to_ne_bytes()),
            GemmDtype::F16 => {
                let half = half::f16::from_f32(*value);
                *value = half.to_f32();
                bytes.extend_from_slice(&half.to_bits().to_ne_bytes());
            }
            GemmDtype::Bf16 => {
                let half = half::bf16::from_f32(*value);
                *value = half.to_f32();
                bytes.extend_from_slice(&half.to_bits().to_ne_bytes());
            }
        }
    }
    bytes
}

fn decode_gemm_value(bytes: &[u8], index: usize, dtype: GemmDtype) -> f64 {
    match dtype {
        GemmDtype::F32 => {
            let raw = [
                bytes[4 * index],
                bytes[4 * index + 1],
                bytes[4 * index + 2],
                bytes[4 * index + 3],
            ];
            f64::from(f32::from_ne_bytes(raw))
        }
        GemmDtype::F16 => {
            let raw = u16::from_ne_bytes([bytes[2 * index], bytes[2 * index + 1]]);
            f64::from(half::f16::from_bits(raw).to_f32())
        }
        GemmDtype::Bf16 => {
            let raw = u16::from_ne_bytes([bytes[2 * index], bytes[2 * index + 1]]);
            f64::from(half::bf16::from_bits(raw).to_f32())
        }
    }
}

/// cuBLASLt descriptors of one gemm, destroyed on drop.
struct LtDescriptors {
    handle: lt_sys::cublasLtHandle_t,
    matmul: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
    preference: lt_sys::cublasLtMatmulPreference_t,
}

impl Drop for LtDescriptors {
    fn drop(&mut self) {
        // SAFETY: each was created once by `LtDescriptors::new` and is destroyed once here.
        unsafe {
            let _ = lt::destroy_matmul_pref(self.preference);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matmul_desc(self.matmul);
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl LtDescriptors {
    fn new(problem: &GemmProblem) -> Result<Self, TuneError> {
        let data_type = gemm_data_type(problem.dtype);
        let (m, n, k) = (problem.m, problem.n, problem.k);
        let handle = lt::create_handle().map_err(|e| blas_error("cublasLtCreate", e))?;
        let mut descriptors = LtDescriptors {
            handle,
            matmul: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            preference: std::ptr::null_mut(),
        };
        descriptors.matmul = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| blas_error("cublasLtMatmulDescCreate", e))?;
        for (attribute, transposed) in [
            (
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                problem.layout.transpose_a(),
            ),
            (
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                problem.layout.transpose_b(),
            ),
        ] {
            // cublasOperation_t from cublas_api.h (not in cudarc's cublasLt bindings):
            // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
            let op: i32 = i32::from(transposed);
            // SAFETY: the attribute is an int32 cublasOperation_t read from a live local.
            unsafe {
                lt::set_matmul_desc_attribute(
                    descriptors.matmul,
                    attribute,
                    (&op as *const i32).cast(),
                    std::mem::size_of::<i32>(),
                )
            }
            .map_err(|e| blas_error("setting the transpose attribute", e))?;
        }
        // Column-major storage: op 'n' stores rows×cols as given, 't' stores the transpose.
        let (a_rows, a_cols) = if problem.layout.transpose_a() {
            (k, m)
        } else {
            (m, k)
        };
        let (b_rows, b_cols) = if problem.layout.transpose_b() {
            (n, k)
        } else {
            (k, n)
        };
        descriptors.a = lt::create_matrix_layout(data_type, a_rows, a_cols, a_rows as i64)
            .map_err(|e| blas_error("layout of A", e))?;
        descriptors.b = lt::create_matrix_layout(data_type, b_rows, b_cols, b_rows as i64)
            .map_err(|e| blas_error("layout of B", e))?;
        descriptors.d = lt::create_matrix_layout(data_type, m, n, m as i64)
            .map_err(|e| blas_error("layout of D", e))?;
        descriptors.preference = lt::create_matmul_pref()
            .map_err(|e| blas_error("cublasLtMatmulPreferenceCreate", e))?;
        let workspace = GEMM_WORKSPACE_BYTES as u64;
        // SAFETY: the attribute is a uint64 read from a live local.
        unsafe {
            lt::set_matmul_pref_attribute(
                descriptors.preference,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(|e| blas_error("setting the workspace limit", e))?;
        Ok(descriptors)
    }

    /// Up to [`HEURISTIC_ALGOS`] algorithms, best-first in the heuristic's opinion.
    fn heuristic(&self) -> Result<Vec<lt_sys::cublasLtMatmulHeuristicResult_t>, TuneError> {
        // SAFETY: plain-old-data C structs for which all-zero bytes are a valid value.
        let mut results: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; HEURISTIC_ALGOS];
        let mut returned: i32 = 0;
        // SAFETY: descriptors are live; the output array holds HEURISTIC_ALGOS entries.
        unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.matmul,
                self.a,
                self.b,
                self.d,
                self.d,
                self.preference,
                HEURISTIC_ALGOS as i32,
                results.as_mut_ptr(),
                &mut returned,
            )
        }
        .result()
        .map_err(|e| blas_error("cublasLtMatmulAlgoGetHeuristic", e))?;
        results.truncate(returned.max(0) as usize);
        if results.is_empty() {
            return Err(TuneError::NothingRan(
                "cuBLASLt has no algorithm for this gemm".to_string(),
            ));
        }
        Ok(results)
    }
}

fn algo_attribute(
    algo: &lt_sys::cublasLtMatmulAlgo_t,
    attribute: lt_sys::cublasLtMatmulAlgoConfigAttributes_t,
) -> Option<u32> {
    let mut value: u32 = 0;
    let mut written: usize = 0;
    // SAFETY: every attribute read here is a 4-byte integer; the buffer is a live local.
    unsafe {
        lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attribute,
            (&mut value as *mut u32).cast(),
            std::mem::size_of::<u32>(),
            &mut written,
        )
    }
    .result()
    .ok()?;
    Some(value)
}

/// Opaque algorithm bytes (to replay it with cuBLASLt) plus readable attributes.
fn describe_algo(heuristic: &lt_sys::cublasLtMatmulHeuristicResult_t) -> serde_json::Value {
    use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Attr;
    let algo = &heuristic.algo;
    let hex: String = algo
        .data
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .map(|byte| format!("{byte:02x}"))
        .collect();
    json!({
        "algo_hex": hex,
        "algo_id": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_ID),
        "tile_id": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_TILE_ID),
        "stages_id": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_STAGES_ID),
        "split_k": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        "reduction_scheme": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        "cta_swizzling": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
        "custom_option": algo_attribute(algo, Attr::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
        "workspace_bytes": heuristic.workspaceSize,
        "waves": heuristic.wavesCount,
    })
}

/// One copy of a gemm's operands and output; cold-L2 timing rotates through several.
struct GemmSet {
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    d: CudaSlice<u8>,
}

/// Enqueues one `D = A·B` on `set` with `heuristic`'s algorithm (C aliases D, beta = 0).
fn enqueue_gemm(
    stream: &Arc<CudaStream>,
    descriptors: &LtDescriptors,
    set: &mut GemmSet,
    workspace: &mut CudaSlice<u8>,
    heuristic: &lt_sys::cublasLtMatmulHeuristicResult_t,
) -> Result<(), TuneError> {
    let alpha: f32 = 1.0;
    let beta: f32 = 0.0;
    let a = raw_ptr(&set.a, stream);
    let b = raw_ptr(&set.b, stream);
    let d = raw_ptr_mut(&mut set.d, stream);
    let workspace = raw_ptr_mut(workspace, stream);
    // SAFETY: all pointers are live device allocations of the sizes the layouts describe;
    // the workspace is at least the heuristic's workspaceSize (capped by the preference).
    unsafe {
        lt::matmul(
            descriptors.handle,
            descriptors.matmul,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            a as *const c_void,
            descriptors.a,
            b as *const c_void,
            descriptors.b,
            d as *const c_void,
            descriptors.d,
            d as *mut c_void,
            descriptors.d,
            &heuristic.algo,
            workspace as *mut c_void,
            heuristic.workspaceSize.min(GEMM_WORKSPACE_BYTES),
            stream.cu_stream() as lt_sys::cudaStream_t,
        )
    }
    .map_err(|e| blas_error("cublasLtMatmul", e))
}

/// cuBLASLt's version as "major.minor.patch": replaying an `algo_hex` depends on it.
fn cublaslt_version() -> String {
    // SAFETY: no arguments; the library is loaded (checked before a gemm job starts).
    let version = unsafe { lt_sys::cublasLtGetVersion() };
    format!(
        "{}.{}.{}",
        version / 10_000,
        (version / 100) % 100,
        version % 100
    )
}

/// One gemm problem set up on a device: operands, descriptors, host copies for checking.
struct GemmRun {
    stream: Arc<CudaStream>,
    problem: GemmProblem,
    shape: GemmShape,
    host_a: Vec<f32>,
    host_b: Vec<f32>,
    element: usize,
    sets: Vec<GemmSet>,
    next_set: usize,
    workspace: CudaSlice<u8>,
    descriptors: LtDescriptors,
    candidates: Vec<lt_sys::cublasLtMatmulHeuristicResult_t>,
    timer: SampleTimer,
    cold_l2: String,
    measure: MeasureConfig,
}

impl GemmRun {
    fn prepare(
        device: &CudaDevice,
        problem: &GemmProblem,
        measure: &MeasureConfig,
    ) -> Result<Self, TuneError> {
        let stream = device.context.default_stream();
        let shape = GemmShape::from_problem(problem);
        let (mut host_a, mut host_b) = random_operands(&shape, 1);
        let a_bytes = encode_gemm_values(&mut host_a, problem.dtype);
        let b_bytes = encode_gemm_values(&mut host_b, problem.dtype);
        let element = a_bytes.len() / host_a.len().max(1);
        let d_bytes = shape.m * shape.n * element;
        let first = GemmSet {
            a: stream
                .clone_htod(&a_bytes)
                .map_err(|e| driver_error("uploading A", e))?,
            b: stream
                .clone_htod(&b_bytes)
                .map_err(|e| driver_error("uploading B", e))?,
            d: stream
                .alloc_zeros::<u8>(d_bytes)
                .map_err(|e| driver_error("allocating D", e))?,
        };
        let set_bytes = (a_bytes.len() + b_bytes.len() + d_bytes) as u64;
        let (count, cold_l2) = plan_rotation(&device.context, set_bytes, measure.flush_l2)?;
        let mut sets = vec![first];
        for _ in 1..count {
            let copy = GemmSet {
                a: stream
                    .clone_dtod(&sets[0].a)
                    .map_err(|e| driver_error("copying A for L2 rotation", e))?,
                b: stream
                    .clone_dtod(&sets[0].b)
                    .map_err(|e| driver_error("copying B for L2 rotation", e))?,
                d: stream
                    .alloc_zeros::<u8>(d_bytes)
                    .map_err(|e| driver_error("allocating D for L2 rotation", e))?,
            };
            sets.push(copy);
        }
        let workspace = stream
            .alloc_zeros::<u8>(GEMM_WORKSPACE_BYTES)
            .map_err(|e| driver_error("allocating the workspace", e))?;
        let descriptors = LtDescriptors::new(problem)?;
        let candidates = descriptors.heuristic()?;
        Ok(GemmRun {
            timer: SampleTimer::new(&device.context)?,
            stream,
            problem: problem.clone(),
            shape,
            host_a,
            host_b,
            element,
            sets,
            next_set: 0,
            workspace,
            descriptors,
            candidates,
            cold_l2,
            measure: measure.clone(),
        })
    }

    /// Runs algorithm `rank` once and compares sampled outputs with an f64 host reference,
    /// downloading only the checked rows of the checked columns.
    fn verify(&mut self, rank: usize) -> Result<(), TuneError> {
        let heuristic = self.candidates[rank];
        let set = &mut self.sets[0];
        self.stream
            .memset_zeros(&mut set.d)
            .map_err(|e| driver_error("clearing D", e))?;
        enqueue_gemm(
            &self.stream,
            &self.descriptors,
            set,
            &mut self.workspace,
            &heuristic,
        )?;
        let shape = self.shape;
        let element = self.element;
        for (j, rows) in check_plan(shape.m, shape.n, GEMM_CHECK_SAMPLES, GEMM_CHECK_COLUMNS, 5) {
            let (Some(&first), Some(&last)) = (rows.first(), rows.last()) else {
                continue;
            };
            let start = (j * shape.m + first) * element;
            let end = (j * shape.m + last + 1) * element;
            let view = self.sets[0].d.slice(start..end);
            let bytes = self
                .stream
                .clone_dtoh(&view)
                .map_err(|e| driver_error("downloading checked entries of D", e))?;
            self.stream
                .synchronize()
                .map_err(|e| driver_error("running the gemm", e))?;
            for i in rows {
                let (want, magnitude) =
                    reference_entry_with_magnitude(&shape, &self.host_a, &self.host_b, i, j);
                let got = decode_gemm_value(&bytes, i - first, self.problem.dtype);
                let tolerance = gemm_tolerance(self.problem.dtype, shape.k, want, magnitude);
                // NaN must fail too, hence the explicit check.
                if got.is_nan() || (got - want).abs() > tolerance {
                    return Err(TuneError::WrongOutput(format!(
                        "wrong output at ({i},{j}): {got} vs reference {want} (tolerance {tolerance:e})"
                    )));
                }
            }
        }
        Ok(())
    }

    fn tune(
        mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        let excluded = excluded(job);
        let mut report: Vec<serde_json::Value> = Vec::new();
        let mut live = Vec::new();
        for rank in 0..self.candidates.len() {
            let heuristic = self.candidates[rank];
            let name = self.name(rank);
            let mut entry = describe_algo(&heuristic);
            entry["name"] = json!(name);
            entry["heuristic_rank"] = json!(rank);
            if let Some(reason) = excluded.get(&name) {
                entry["error"] = json!(excluded_text(reason));
            } else if heuristic.state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                entry["error"] = json!(format!("heuristic state {:?}", heuristic.state));
            } else {
                // Correctness before timing: a fast wrong answer must never win.
                announce(&name);
                match self.verify(rank) {
                    Ok(()) => live.push(rank),
                    Err(error) => entry["error"] = json!(format!("failed verification: {error}")),
                }
            }
            report.push(entry);
        }
        let measure = self.measure.clone();
        let measured = measure_interleaved(
            &measure,
            "cuda",
            &live,
            &mut self,
            announce,
            tactic_deadline(job),
        );
        let ranked = record_timings(&mut report, measured.outcomes, "timing: ");
        let heuristic0 = ranked
            .iter()
            .find(|(rank, _)| *rank == 0)
            .map(|(_, stats)| stats.median_us);
        let report = bound_report(report, REPORT_BUDGET_BYTES);
        let Some((best_rank, best_stats)) = ranked.into_iter().next() else {
            return Err(TuneError::NothingRan(bound_error(&format!(
                "no cuBLASLt algorithm ran correctly: {}",
                json!(report)
            ))));
        };
        let flops = 2.0 * (self.shape.m * self.shape.n * self.shape.k) as f64;
        let mut algo = describe_algo(&self.candidates[best_rank]);
        algo["heuristic_rank"] = json!(best_rank);
        let timing = TimingMethod::new(
            &measure,
            measured.rounds,
            self.timer.queued_behind(),
            self.cold_l2.clone(),
        );
        let config = json!({
            "backend": "cuda",
            "op": "gemm",
            "library": "cublasLt",
            "cublaslt_version": cublaslt_version(),
            "compute_type": "CUBLAS_COMPUTE_32F",
            "algo": algo,
            "stats": best_stats,
            "timing": timing,
            "tflops": flops / (best_stats.median_us * 1e6),
            "heuristic0_median_us": heuristic0,
            "speedup_vs_heuristic0": heuristic0.map(|h0| h0 / best_stats.median_us),
            "verified": {
                "sampled_entries": GEMM_CHECK_SAMPLES,
                "columns": GEMM_CHECK_COLUMNS,
                "reference": "f64 host dot products",
                "tolerance": "u_out*|want| + (u_out + 4*sqrt(k)*u_f32) * sum|a||b|",
            },
            "candidates": report,
        });
        Ok(make_result("cuda", config, best_stats.median_us))
    }
}

impl Timed for GemmRun {
    fn name(&self, rank: usize) -> String {
        format!("heuristic#{rank}")
    }

    fn sample(&mut self, rank: usize, runs: u32) -> Result<f64, TuneError> {
        let heuristic = self.candidates[rank];
        let GemmRun {
            stream,
            descriptors,
            sets,
            next_set,
            workspace,
            timer,
            ..
        } = self;
        let stream: &Arc<CudaStream> = stream;
        let count = sets.len();
        timer.sample(stream, runs, &mut || {
            let set = *next_set;
            *next_set = (set + 1) % count;
            enqueue_gemm(stream, descriptors, &mut sets[set], workspace, &heuristic)
        })
    }
}

/// The 64 bytes of a `cublasLtMatmulAlgo_t` from the `algo_hex` of a result.
pub fn parse_algo_hex(hex: &str) -> Option<[u64; 8]> {
    if hex.len() != 128 || !hex.is_ascii() {
        return None;
    }
    let mut words = [0u64; 8];
    for (word, chunk) in words.iter_mut().zip(hex.as_bytes().chunks(16)) {
        let mut bytes = [0u8; 8];
        for (byte, pair) in bytes.iter_mut().zip(chunk.chunks(2)) {
            *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        *word = u64::from_le_bytes(bytes);
    }
    Some(words)
}

/// For the GPU check (`tests/gpu.rs`): the mean time of one run of `algo_hex` on `problem`
/// (canonical gemm JSON) on GPU `ordinal`, timed the plain way: `runs` back-to-back launches
/// between one event pair after a warm-up, no delay kernel, warm L2. An independent method
/// to hold the tuner's median against.
pub fn time_algo_back_to_back(
    ordinal: usize,
    problem: &str,
    algo_hex: &str,
    runs: u32,
) -> Result<f64, TuneError> {
    if !driver_library_present() || !cublaslt_library_present() {
        return Err(TuneError::Unavailable(
            "libcuda or libcublasLt is missing".into(),
        ));
    }
    let problem = parse_gemm(problem)?;
    let data = parse_algo_hex(algo_hex)
        .ok_or_else(|| TuneError::Unsupported(format!("not an algo_hex: {algo_hex:?}")))?;
    let context = CudaContext::new(ordinal).map_err(|e| TuneError::driver("context", e))?;
    let device = CudaDevice { ordinal, context };
    let mut run = GemmRun::prepare(&device, &problem, &MeasureConfig::default())?;
    let mut heuristic = run.candidates[0];
    heuristic.algo.data = data;
    heuristic.workspaceSize = GEMM_WORKSPACE_BYTES;
    let GemmRun {
        stream,
        descriptors,
        sets,
        workspace,
        ..
    } = &mut run;
    for _ in 0..20 {
        enqueue_gemm(stream, descriptors, &mut sets[0], workspace, &heuristic)?;
    }
    let event = || {
        device
            .context
            .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("creating a CUDA event", e))
    };
    let (start, end) = (event()?, event()?);
    stream
        .synchronize()
        .map_err(|e| driver_error("warming up", e))?;
    start
        .record(stream)
        .map_err(|e| driver_error("recording the start event", e))?;
    for _ in 0..runs.max(1) {
        enqueue_gemm(stream, descriptors, &mut sets[0], workspace, &heuristic)?;
    }
    end.record(stream)
        .map_err(|e| driver_error("recording the end event", e))?;
    end.synchronize()
        .map_err(|e| driver_error("waiting for the runs", e))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| driver_error("reading the event timer", e))?;
    Ok(f64::from(ms) * 1e3 / f64::from(runs.max(1)))
}

/// A kernel argument with a stable address for the launch.
enum ArgValue {
    Buffer(usize),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

/// Deterministic initial contents of an nvrtc buffer.
fn initial_bytes(dtype: BufferDtype, init: BufferInit, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut bytes = Vec::with_capacity(len * dtype.size_bytes() as usize);
    for _ in 0..len {
        let unit = match init {
            BufferInit::Zeros => 0.0,
            BufferInit::Ones => 1.0,
            BufferInit::Random => rng.next_signed_unit(),
        };
        match dtype {
            BufferDtype::F32 => bytes.extend_from_slice(&unit.to_ne_bytes()),
            BufferDtype::F16 => {
                bytes.extend_from_slice(&half::f16::from_f32(unit).to_bits().to_ne_bytes())
            }
            BufferDtype::Bf16 => {
                bytes.extend_from_slice(&half::bf16::from_f32(unit).to_bits().to_ne_bytes())
            }
            BufferDtype::I32 => {
                bytes.extend_from_slice(&((unit * 8.0).floor() as i32).to_ne_bytes())
            }
            BufferDtype::U32 => {
                bytes.extend_from_slice(&(((unit + 1.0) * 8.0).floor() as u32).to_ne_bytes())
            }
        }
    }
    bytes
}

fn decode_buffer(bytes: &[u8], dtype: BufferDtype) -> Vec<f64> {
    let size = dtype.size_bytes() as usize;
    bytes
        .chunks_exact(size)
        .map(|raw| match dtype {
            BufferDtype::F32 => f64::from(f32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]])),
            BufferDtype::I32 => f64::from(i32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]])),
            BufferDtype::U32 => f64::from(u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]])),
            BufferDtype::F16 => {
                f64::from(half::f16::from_bits(u16::from_ne_bytes([raw[0], raw[1]])).to_f32())
            }
            BufferDtype::Bf16 => {
                f64::from(half::bf16::from_bits(u16::from_ne_bytes([raw[0], raw[1]])).to_f32())
            }
        })
        .collect()
}

/// Enqueues one launch of `function` with the problem's arguments on `buffers`.
fn launch(
    stream: &Arc<CudaStream>,
    function: &CudaFunction,
    config: LaunchConfig,
    args: &[ArgValue],
    buffers: &[CudaSlice<u8>],
) -> Result<(), TuneError> {
    let mut builder = stream.launch_builder(function);
    for arg in args {
        match arg {
            ArgValue::Buffer(index) => builder.arg(&buffers[*index]),
            ArgValue::I32(value) => builder.arg(value),
            ArgValue::U32(value) => builder.arg(value),
            ArgValue::I64(value) => builder.arg(value),
            ArgValue::U64(value) => builder.arg(value),
            ArgValue::F32(value) => builder.arg(value),
        };
    }
    // SAFETY: argument count and types come from the problem, whose author vouches that they
    // match the kernel's signature; a mismatch can fault, which kills only this worker.
    unsafe { builder.launch(config) }
        .map(|_| ())
        .map_err(|e| driver_error("launching the kernel", e))
}

/// The NVRTC targets to try for a GPU of compute capability `major.minor`, best first:
/// SASS for the arch-specific target (sm_90a, sm_100a, ...: their features need it), SASS
/// for the plain target, then PTX for the driver to compile. SASS runs on a driver older
/// than NVRTC, which PTX from a newer NVRTC does not.
pub fn nvrtc_targets(major: i32, minor: i32) -> Vec<(String, bool)> {
    let arch = format!("{major}{minor}");
    let mut targets = Vec::new();
    if matches!(
        (major, minor),
        (9, 0) | (10, 0) | (10, 1) | (10, 3) | (12, 0) | (12, 1)
    ) {
        targets.push((format!("sm_{arch}a"), true));
    }
    targets.push((format!("sm_{arch}"), true));
    targets.push((format!("compute_{arch}"), false));
    targets
}

/// A compile that failed: NVRTC's status and log.
struct CompileFailure {
    /// NVRTC rejected an option (e.g. an arch it does not know): try the next target.
    invalid_option: bool,
    text: String,
}

/// Compiles `source` for `target` with NVRTC and returns a module image: the CUBIN for an
/// `sm_` target, the PTX text for a `compute_` one.
fn nvrtc_compile(
    source: &str,
    name: &str,
    target: &str,
    cubin: bool,
    defines: &[String],
) -> Result<Ptx, CompileFailure> {
    use cudarc::nvrtc::result as nvrtc;
    use cudarc::nvrtc::sys as nvrtc_sys;
    let failure = |text: String| CompileFailure {
        invalid_option: false,
        text,
    };
    let source =
        CString::new(source).map_err(|_| failure("the source contains a NUL byte".into()))?;
    let name = CString::new(name).map_err(|_| failure("the name contains a NUL byte".into()))?;
    let mut options = vec![format!("--gpu-architecture={target}")];
    options.extend_from_slice(defines);
    let program = nvrtc::create_program(&source, Some(&name))
        .map_err(|e| failure(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: `program` was just created and is destroyed once, below; the buffers handed
    // to NVRTC are sized by the size calls before them.
    let outcome = unsafe {
        match nvrtc::compile_program(program, &options) {
            Err(status) => {
                let log = nvrtc::get_program_log(program)
                    .map(|raw| CStr::from_ptr(raw.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(CompileFailure {
                    invalid_option: status.0 == nvrtc_sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
                    text: cut(&format!("{status:?} for {target}: {log}"), MAX_FIELD_CHARS),
                })
            }
            Ok(()) if cubin => {
                let mut size = 0usize;
                nvrtc_sys::nvrtcGetCUBINSize(program, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut image = vec![0 as c_char; size];
                        nvrtc_sys::nvrtcGetCUBIN(program, image.as_mut_ptr())
                            .result()
                            .map(|()| {
                                Ptx::from_binary(image.into_iter().map(|c| c as u8).collect())
                            })
                    })
                    .map_err(|e| failure(format!("nvrtcGetCUBIN: {e:?}")))
            }
            Ok(()) => nvrtc::get_ptx(program)
                .map(|raw| {
                    Ptx::from_src(CStr::from_ptr(raw.as_ptr()).to_string_lossy().into_owned())
                })
                .map_err(|e| failure(format!("nvrtcGetPTX: {e:?}"))),
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(program) };
    outcome
}

struct CompiledCandidate {
    function: CudaFunction,
    config: LaunchConfig,
    /// The NVRTC target the module was built for.
    target: String,
}

/// One nvrtc problem set up on a device.
struct NvrtcRun<'a> {
    device: &'a CudaDevice,
    stream: Arc<CudaStream>,
    problem: NvrtcProblem,
    initial: Vec<Vec<u8>>,
    /// Copies of every buffer; cold-L2 timing rotates through them, checks use the first.
    sets: Vec<Vec<CudaSlice<u8>>>,
    next_set: usize,
    args: Vec<ArgValue>,
    compiled: Vec<Option<CompiledCandidate>>,
    timer: SampleTimer,
    cold_l2: String,
    measure: MeasureConfig,
}

impl<'a> NvrtcRun<'a> {
    fn prepare(
        device: &'a CudaDevice,
        problem: &NvrtcProblem,
        measure: &MeasureConfig,
    ) -> Result<Self, TuneError> {
        let stream = device.context.default_stream();
        let initial: Vec<Vec<u8>> = problem
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| initial_bytes(b.dtype, b.init, b.len as usize, 1000 + i as u64))
            .collect();
        let first = initial
            .iter()
            .map(|bytes| {
                stream
                    .clone_htod(bytes)
                    .map_err(|e| driver_error("uploading a buffer", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let set_bytes: u64 = initial.iter().map(|b| b.len() as u64).sum();
        let (count, cold_l2) = plan_rotation(&device.context, set_bytes, measure.flush_l2)?;
        let mut sets = vec![first];
        for _ in 1..count {
            let copy = sets[0]
                .iter()
                .map(|buffer| {
                    stream
                        .clone_dtod(buffer)
                        .map_err(|e| driver_error("copying a buffer for L2 rotation", e))
                })
                .collect::<Result<Vec<_>, _>>()?;
            sets.push(copy);
        }
        let args = problem
            .args
            .iter()
            .map(|arg| match arg {
                KernelArg::Buffer(name) => ArgValue::Buffer(
                    problem
                        .buffers
                        .iter()
                        .position(|b| &b.name == name)
                        .unwrap_or(0),
                ),
                KernelArg::I32(v) => ArgValue::I32(*v),
                KernelArg::U32(v) => ArgValue::U32(*v),
                KernelArg::I64(v) => ArgValue::I64(*v),
                KernelArg::U64(v) => ArgValue::U64(*v),
                KernelArg::F32(v) => ArgValue::F32(*v),
            })
            .collect();
        Ok(NvrtcRun {
            device,
            timer: SampleTimer::new(&device.context)?,
            stream,
            problem: problem.clone(),
            initial,
            sets,
            next_set: 0,
            args,
            compiled: Vec::new(),
            cold_l2,
            measure: measure.clone(),
        })
    }

    fn reset_buffers(&mut self) -> Result<(), TuneError> {
        for (buffer, bytes) in self.sets[0].iter_mut().zip(&self.initial) {
            self.stream
                .memcpy_htod(bytes, buffer)
                .map_err(|e| driver_error("re-initialising a buffer", e))?;
        }
        Ok(())
    }

    /// Compiles and loads candidate `index`; `Err` is the text for its report entry.
    fn compile(&self, index: usize) -> Result<CompiledCandidate, TuneError> {
        let candidate = &self.problem.candidates[index];
        let context = &self.device.context;
        let (major, minor) = context
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        let defines: Vec<String> = candidate
            .defines
            .iter()
            .map(|(name, value)| {
                if value.is_empty() {
                    format!("-D{name}")
                } else {
                    format!("-D{name}={value}")
                }
            })
            .collect();
        let file = format!("{}.cu", candidate.name);
        let mut tried = Vec::new();
        let mut image = None;
        for (target, cubin) in nvrtc_targets(major, minor) {
            match nvrtc_compile(&self.problem.source, &file, &target, cubin, &defines) {
                Ok(module) => {
                    image = Some((module, target));
                    break;
                }
                // An unknown target: an older NVRTC; the next one may do.
                Err(failure) if failure.invalid_option => tried.push(failure.text),
                Err(failure) => return Err(TuneError::Compile(failure.text)),
            }
        }
        let Some((module, target)) = image else {
            return Err(TuneError::Compile(cut(
                &format!("NVRTC accepted no target: {}", tried.join("; ")),
                MAX_FIELD_CHARS,
            )));
        };
        let module = context
            .load_module(module)
            .map_err(|e| driver_error(&format!("loading the module built for {target}"), e))?;
        let function = module
            .load_function(&self.problem.kernel)
            .map_err(|e| driver_error(&format!("kernel {:?} not found", self.problem.kernel), e))?;
        let static_bytes = function
            .shared_size_bytes()
            .map_err(|e| driver_error("reading the kernel's static shared memory", e))?
            .max(0) as u64;
        let optin = context
            .attribute(
                driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| driver_error("reading the shared memory opt-in limit", e))?
            .max(0) as u64;
        match shared_memory_opt_in(static_bytes, u64::from(candidate.shared_mem_bytes), optin) {
            Err(why) => return Err(TuneError::Unsupported(why)),
            Ok(None) => {}
            Ok(Some(dynamic)) => function
                .set_attribute(
                    driver_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
                .map_err(|e| driver_error("raising the dynamic shared memory limit", e))?,
        }
        let config = LaunchConfig {
            grid_dim: (candidate.grid[0], candidate.grid[1], candidate.grid[2]),
            block_dim: (candidate.block[0], candidate.block[1], candidate.block[2]),
            shared_mem_bytes: candidate.shared_mem_bytes,
        };
        Ok(CompiledCandidate {
            function,
            config,
            target,
        })
    }

    /// Runs a candidate once on fresh buffers and returns the contents of buffer `check`.
    fn output_of(&mut self, index: usize, check: usize) -> Result<Vec<f64>, TuneError> {
        self.reset_buffers()?;
        let compiled = self.compiled[index]
            .as_ref()
            .ok_or_else(|| TuneError::NothingRan("the candidate did not compile".to_string()))?;
        launch(
            &self.stream,
            &compiled.function,
            compiled.config,
            &self.args,
            &self.sets[0],
        )?;
        self.stream
            .synchronize()
            .map_err(|e| driver_error("running the kernel", e))?;
        let bytes = self
            .stream
            .clone_dtoh(&self.sets[0][check])
            .map_err(|e| driver_error("downloading the checked buffer", e))?;
        Ok(decode_buffer(&bytes, self.problem.buffers[check].dtype))
    }

    /// Whether candidate `index`'s output agrees with the check: `Err` says how it does not.
    fn check_candidate(
        &mut self,
        index: usize,
        check: &CheckSpec,
        buffer: usize,
        want: Option<&[f64]>,
    ) -> Result<(), TuneError> {
        let got = self.output_of(index, buffer)?;
        let close = |x: f64, y: f64| (x - y).abs() <= check.atol + check.rtol * y.abs();
        if let (Some(want), Some(reference)) = (want, &check.reference) {
            if let Some((i, (g, w))) = got
                .iter()
                .zip(want)
                .enumerate()
                .find(|(_, (g, w))| !close(**g, **w) || g.is_nan())
            {
                return Err(TuneError::WrongOutput(format!(
                    "disagrees with reference {reference:?} at {}[{i}]: {g} vs {w}",
                    check.buffer
                )));
            }
        }
        if let Some(expected) = check.expected_sum {
            let sum: f64 = got.iter().sum();
            if !close(sum, expected) || sum.is_nan() {
                return Err(TuneError::WrongOutput(format!(
                    "its sum of {} is {sum}, expected {expected}",
                    check.buffer
                )));
            }
        }
        Ok(())
    }

    fn tune(
        mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        let excluded = excluded(job);
        let count = self.problem.candidates.len();
        let names: Vec<String> = self
            .problem
            .candidates
            .iter()
            .map(|c| c.name.clone())
            .collect();
        let mut report: Vec<serde_json::Value> =
            names.iter().map(|name| json!({"name": name})).collect();
        let mut errors: BTreeMap<usize, String> = BTreeMap::new();
        self.compiled = (0..count).map(|_| None).collect();
        for index in 0..count {
            if let Some(reason) = excluded.get(&names[index]) {
                errors.insert(index, excluded_text(reason));
                continue;
            }
            // NVRTC runs in this process too: a crash inside it is this candidate's.
            announce(&names[index]);
            match self.compile(index) {
                Ok(compiled) => {
                    report[index]["target"] = json!(compiled.target);
                    self.compiled[index] = Some(compiled);
                }
                Err(error) => {
                    errors.insert(index, error.to_string());
                }
            }
        }

        // Correctness before timing: every candidate is checked before it is timed, so a
        // fast wrong one never wins and a faulting one is found alone.
        let mut live: Vec<usize> = (0..count).filter(|&i| self.compiled[i].is_some()).collect();
        let verification = match self.problem.check.clone() {
            None => json!("none requested"),
            Some(check) => {
                let buffer = self
                    .problem
                    .buffers
                    .iter()
                    .position(|b| b.name == check.buffer)
                    .ok_or_else(|| TuneError::WrongOutput("check buffer vanished".to_string()))?;
                let want = match &check.reference {
                    None => None,
                    Some(reference) => {
                        let index = names
                            .iter()
                            .position(|n| n == reference)
                            .filter(|&i| self.compiled[i].is_some());
                        let Some(index) = index else {
                            let why = names
                                .iter()
                                .position(|n| n == reference)
                                .and_then(|i| errors.get(&i).cloned())
                                .unwrap_or_default();
                            return Err(TuneError::NothingRan(bound_error(&format!(
                                "reference candidate {reference:?} did not compile and run: {why}"
                            ))));
                        };
                        announce(reference);
                        Some(self.output_of(index, buffer).map_err(|error| {
                            TuneError::NothingRan(bound_error(&format!(
                                "reference candidate {reference:?} failed to run: {error}"
                            )))
                        })?)
                    }
                };
                let mut passed = Vec::new();
                for index in live {
                    announce(&names[index]);
                    match self.check_candidate(index, &check, buffer, want.as_deref()) {
                        Ok(()) => passed.push(index),
                        Err(error) => {
                            errors.insert(index, format!("failed verification: {error}"));
                        }
                    }
                }
                live = passed;
                json!({"buffer": check.buffer, "reference": check.reference, "expected_sum": check.expected_sum, "every_candidate": true})
            }
        };

        let measure = self.measure.clone();
        let measured = measure_interleaved(
            &measure,
            "cuda",
            &live,
            &mut self,
            announce,
            tactic_deadline(job),
        );
        for (index, error) in errors {
            report[index]["error"] = json!(error);
        }
        let ranked = record_timings(&mut report, measured.outcomes, "launch: ");
        let report = bound_report(report, REPORT_BUDGET_BYTES);
        let Some((winner, stats)) = ranked.into_iter().next() else {
            return Err(TuneError::NothingRan(bound_error(&format!(
                "no candidate compiled, passed its check and ran: {}",
                json!(report)
            ))));
        };
        let candidate = &self.problem.candidates[winner];
        let target = self.compiled[winner]
            .as_ref()
            .map(|c| c.target.clone())
            .unwrap_or_default();
        let timing = TimingMethod::new(
            &measure,
            measured.rounds,
            self.timer.queued_behind(),
            self.cold_l2.clone(),
        );
        let config = json!({
            "backend": "cuda",
            "op": "nvrtc",
            "kernel": self.problem.kernel,
            "candidate": candidate.name,
            "defines": candidate.defines,
            "grid": candidate.grid,
            "block": candidate.block,
            "shared_mem_bytes": candidate.shared_mem_bytes,
            "target": target,
            "stats": stats,
            "timing": timing,
            "verified": verification,
            "candidates": report,
        });
        Ok(make_result("cuda", config, stats.median_us))
    }
}

impl Timed for NvrtcRun<'_> {
    fn name(&self, index: usize) -> String {
        self.problem.candidates[index].name.clone()
    }

    fn sample(&mut self, index: usize, runs: u32) -> Result<f64, TuneError> {
        let NvrtcRun {
            stream,
            sets,
            next_set,
            args,
            compiled,
            timer,
            ..
        } = self;
        let compiled = compiled[index]
            .as_ref()
            .ok_or_else(|| TuneError::NothingRan("the candidate did not compile".to_string()))?;
        let stream: &Arc<CudaStream> = stream;
        let count = sets.len();
        timer.sample(stream, runs, &mut || {
            let set = *next_set;
            *next_set = (set + 1) % count;
            launch(
                stream,
                &compiled.function,
                compiled.config,
                args,
                &sets[set],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use driver_sys::CUresult;

    #[test]
    fn sticky_errors_include_invalid_address_space_and_uncorrectable_ecc() {
        assert_eq!(CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE as i32, 717);
        assert_eq!(CUresult::CUDA_ERROR_ECC_UNCORRECTABLE as i32, 214);
        for code in [
            CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
            CUresult::CUDA_ERROR_ASSERT,
            CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
        ] {
            assert!(is_sticky(code), "{code:?}");
            // Sticky means fatal even if a synchronize happened to succeed.
            assert_eq!(verdict(Some(code), Ok(())), Verdict::Poisoned, "{code:?}");
        }
        for code in [
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            CUresult::CUDA_ERROR_NOT_FOUND,
            CUresult::CUDA_ERROR_INVALID_PTX,
        ] {
            assert!(!is_sticky(code), "{code:?}");
            assert_eq!(verdict(Some(code), Ok(())), Verdict::JobError, "{code:?}");
        }
    }

    #[test]
    fn a_library_error_is_fatal_when_the_context_check_fails() {
        // cuBLASLt reports a faulting kernel as its own status; the context tells the truth.
        assert_eq!(verdict(None, Ok(())), Verdict::JobError);
        assert_eq!(
            verdict(None, Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)),
            Verdict::Poisoned
        );
        assert_eq!(
            verdict(None, Err(CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE)),
            Verdict::Poisoned
        );
        // An unlisted code from the context check is fatal too.
        assert_eq!(
            verdict(
                Some(CUresult::CUDA_ERROR_INVALID_VALUE),
                Err(CUresult::CUDA_ERROR_UNKNOWN)
            ),
            Verdict::Poisoned
        );
    }

    #[test]
    fn driver_version_parses_both_kernel_module_flavours() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n";
        let arm = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build  (dvs-builder@U16-I2-C03-12-4)  Thu Jan 23 21:07:27 UTC 2025\n";
        assert_eq!(
            parse_driver_version(proprietary).as_deref(),
            Some("550.54.14")
        );
        assert_eq!(parse_driver_version(open).as_deref(), Some("580.65.06"));
        assert_eq!(parse_driver_version(arm).as_deref(), Some("570.86.15"));
        assert_eq!(parse_driver_version("GCC version: 12\n"), None);
        assert_eq!(parse_driver_version(""), None);
    }

    #[test]
    fn shared_memory_opt_in_counts_static_and_dynamic() {
        let kib = 1024;
        // 40 KiB static + 16 KiB dynamic: over 48 KiB although the dynamic part is not.
        assert_eq!(
            shared_memory_opt_in(40 * kib, 16 * kib, 227 * kib),
            Ok(Some(16 * kib))
        );
        assert_eq!(
            shared_memory_opt_in(0, 100 * kib, 227 * kib),
            Ok(Some(100 * kib))
        );
        assert_eq!(
            shared_memory_opt_in(16 * kib, 32 * kib, 227 * kib),
            Ok(None)
        );
        let error = shared_memory_opt_in(40 * kib, 200 * kib, 227 * kib).unwrap_err();
        assert!(error.contains("at most"), "{error}");
    }

    #[test]
    fn gemm_tolerance_admits_split_k_rounding_near_zero_but_not_a_dropped_block() {
        // k = 4096 of values in [-1, 1): sum |a||b| is about k/4.
        let k = 4096;
        let sum_abs = 1024.0;
        // An entry that cancels to 0.1 carrying bf16 rounding of split-K partials (each ~20
        // in size, rounded to 2^-8 relative): the old rule (eps|want| + 1e-4 sqrt(k))
        // allowed 0.0080 here and refused it.
        let old_rule = 1.6e-2 * 0.1 + 1e-4 * (k as f64).sqrt();
        let split_k_error = 4.0 * 20.0 / 256.0;
        assert!(split_k_error > old_rule);
        assert!(split_k_error < gemm_tolerance(GemmDtype::Bf16, k, 0.1, sum_abs));
        // A block of 256 products missing from an f16 entry is an error of ~ sqrt(256/9).
        let dropped = (256.0f64 / 9.0).sqrt();
        assert!(dropped > gemm_tolerance(GemmDtype::F16, k, 0.1, sum_abs));
        // f32 stays tight.
        assert!(gemm_tolerance(GemmDtype::F32, k, 10.0, sum_abs) < 0.02);
    }

    #[test]
    fn the_check_plan_samples_distinct_entries_from_a_few_columns() {
        let plan = check_plan(4096, 4096, 256, 16, 5);
        assert_eq!(plan.len(), 16);
        let total: usize = plan.iter().map(|(_, rows)| rows.len()).sum();
        assert_eq!(total, 256);
        for (j, rows) in &plan {
            assert!(*j < 4096);
            assert!(
                rows.windows(2).all(|w| w[0] < w[1]),
                "sorted, distinct rows"
            );
        }
        // Decode shapes: m = 16 has only 16 rows per column to check.
        let plan = check_plan(16, 4096, 256, 16, 5);
        assert!(plan.iter().all(|(_, rows)| rows.len() == 16));
        // Tiny outputs: everything, once.
        let plan = check_plan(2, 3, 256, 16, 5);
        assert_eq!(plan.len(), 3);
        assert!(plan.iter().all(|(_, rows)| rows == &vec![0, 1]));
    }

    #[test]
    fn the_tuning_gpu_is_the_least_loaded_or_else_the_last() {
        let load = |busy: u32, used: u64| {
            Some(GpuLoad {
                utilization_percent: busy,
                memory_used_bytes: used << 30,
                memory_total_bytes: 80 << 30,
            })
        };
        let (ordinal, why) = pick_device(&[load(90, 70), load(0, 1), load(95, 75)]);
        assert_eq!(ordinal, 1);
        assert!(why.contains("least-loaded"), "{why}");
        // Equal loads: the last of them (rank 0 is usually on the first).
        assert_eq!(pick_device(&[load(0, 1), load(0, 1)]).0, 1);
        // One GPU NVML cannot answer for: no ranking, the last GPU.
        let (ordinal, why) = pick_device(&[load(0, 1), None, load(99, 79)]);
        assert_eq!(ordinal, 2);
        assert!(why.contains("last"), "{why}");
        assert_eq!(pick_device(&[None]).0, 0);
    }

    #[test]
    fn nvml_uuid_text_matches_nvidia_smi() {
        let bytes = [
            0x5b, 0x0c, 0x9a, 0x2e, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa,
            0xbb, 0xcc,
        ];
        assert_eq!(
            nvml_uuid(&bytes),
            "GPU-5b0c9a2e-1122-3344-5566-778899aabbcc"
        );
    }

    #[test]
    fn nvrtc_targets_try_arch_specific_sass_then_sass_then_ptx() {
        assert_eq!(
            nvrtc_targets(9, 0),
            vec![
                ("sm_90a".to_string(), true),
                ("sm_90".to_string(), true),
                ("compute_90".to_string(), false)
            ]
        );
        assert_eq!(nvrtc_targets(8, 0)[0], ("sm_80".to_string(), true));
        assert_eq!(nvrtc_targets(8, 0).len(), 2);
    }

    #[test]
    fn algo_hex_round_trips_to_the_algorithm_words() {
        let words = [1u64, 2, 3, 0xdead_beef, 5, 6, 7, u64::MAX];
        let hex: String = words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(parse_algo_hex(&hex), Some(words));
        assert_eq!(parse_algo_hex(&hex[..126]), None);
        assert_eq!(parse_algo_hex(&"zz".repeat(64)), None);
    }

    #[test]
    fn the_delay_kernel_is_one_entry_taking_a_u64() {
        assert!(SPIN_PTX.contains(".visible .entry tunecache_spin("));
        assert!(SPIN_PTX.contains(".param .u64 tunecache_spin_ns"));
        assert_eq!(SPIN_PTX.matches('{').count(), SPIN_PTX.matches('}').count());
    }
}
