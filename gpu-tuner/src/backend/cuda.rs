//! The CUDA backend: `gemm` through cuBLASLt's heuristic candidates and `nvrtc` through
//! run-time compiled kernel candidates, timed with CUDA events.
//!
//! cudarc is built with `dynamic-loading`, so this compiles without a CUDA toolkit and loads
//! `libcuda` / `libcublasLt` / `libnvrtc` only when used. cudarc panics when a library cannot
//! be loaded, so every entry point first checks that the library is present and never touches
//! cudarc otherwise.
//!
//! Sticky errors (illegal address, launch failure, ...) leave the CUDA context unusable for
//! the life of the process. The backend then exits the worker with [`POISONED_EXIT_CODE`]:
//! the supervisor restarts a fresh worker, and only the worker ever dies.

use std::ffi::c_void;
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
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use serde_json::json;
use tunecache_proto::tuner::problem::{
    parse_gemm, parse_nvrtc, BufferDtype, BufferInit, GemmDtype, GemmProblem, KernelArg,
    NvrtcProblem,
};
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

use super::reference::{random_operands, reference_entry, GemmShape};
use super::{make_result, tactic_deadline, Backend, SplitMix64};
use crate::error::TuneError;
use crate::measure::{measure, MeasureConfig, Stats};

/// Exit status of a worker whose CUDA context was poisoned by a sticky error.
pub const POISONED_EXIT_CODE: i32 = 70;
/// cuBLASLt algorithms asked of the heuristic.
pub const HEURISTIC_ALGOS: usize = 32;
/// Workspace offered to cuBLASLt algorithms.
pub const GEMM_WORKSPACE_BYTES: usize = 32 << 20;
/// Output entries compared with the host reference per algorithm.
const GEMM_CHECK_SAMPLES: usize = 256;

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

fn is_sticky(error: &DriverError) -> bool {
    use driver_sys::CUresult::*;
    matches!(
        error.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
    )
}

/// Turns a driver error into a job error, or ends the process if the context is poisoned.
fn driver_error(what: &str, error: DriverError) -> TuneError {
    if is_sticky(&error) {
        tracing::error!(%what, ?error, "sticky CUDA error: the context is unusable; exiting so the supervisor starts a fresh worker");
        eprintln!("tunecache-tuner: sticky CUDA error during {what}: {error:?}; exiting");
        std::process::exit(POISONED_EXIT_CODE);
    }
    TuneError::driver(what, error)
}

fn blas_error(what: &'static str, source: lt::CublasError) -> TuneError {
    TuneError::Blas { what, source }
}

struct CudaDevice {
    ordinal: usize,
    context: Arc<CudaContext>,
}

pub struct CudaBackend {
    devices: Vec<v1::Device>,
    handles: Vec<CudaDevice>,
    measure: MeasureConfig,
}

impl CudaBackend {
    /// Loads the driver and lists its devices; `Err` says why CUDA cannot be used.
    pub fn open(measure: MeasureConfig) -> Result<Self, TuneError> {
        if !driver_library_present() {
            return Err(TuneError::Unavailable(
                "libcuda.so.1 (the NVIDIA driver library) cannot be loaded".to_string(),
            ));
        }
        // A driver too old for a symbol cudarc looks up makes cudarc panic; contain that.
        catch_unwind(AssertUnwindSafe(|| Self::open_driver(measure))).unwrap_or_else(|_| {
            Err(TuneError::Unavailable(
                "the CUDA driver library panicked during initialisation".to_string(),
            ))
        })
    }

    fn open_driver(measure: MeasureConfig) -> Result<Self, TuneError> {
        let count = CudaContext::device_count()
            .map_err(|e| TuneError::driver("cuInit / cuDeviceGetCount failed", e))?;
        if count < 1 {
            return Err(TuneError::Unavailable(
                "the CUDA driver reports no devices".to_string(),
            ));
        }
        let mut cuda_version: i32 = 0;
        // SAFETY: plain out-parameter call into the loaded driver.
        unsafe { driver_sys::cuDriverGetVersion(&mut cuda_version) }
            .result()
            .map_err(|e| TuneError::driver("cuDriverGetVersion failed", e))?;
        let cuda_version = format!("{}.{}", cuda_version / 1000, (cuda_version % 1000) / 10);
        let driver_version = nvidia_driver_version();
        let mut devices = Vec::new();
        let mut handles = Vec::new();
        for ordinal in 0..count as usize {
            let context = CudaContext::new(ordinal).map_err(|e| {
                TuneError::driver(format!("creating a context on device {ordinal}"), e)
            })?;
            let name = context
                .name()
                .map_err(|e| TuneError::driver(format!("device {ordinal} name"), e))?;
            let (major, minor) = context.compute_capability().map_err(|e| {
                TuneError::driver(format!("device {ordinal} compute capability"), e)
            })?;
            let memory_bytes = context.total_mem().unwrap_or(0) as u64;
            devices.push(v1::Device {
                backend: "cuda".to_string(),
                fingerprint: format!("{name}|sm_{major}{minor}|cuda {cuda_version}"),
                name,
                compute_capability: format!("{major}.{minor}"),
                memory_bytes,
                driver_version: driver_version.clone(),
                cuda_version: cuda_version.clone(),
            });
            handles.push(CudaDevice { ordinal, context });
        }
        Ok(CudaBackend {
            devices,
            handles,
            measure,
        })
    }

    /// One line for the `Ready.note`.
    pub fn summary(&self) -> String {
        let mut kinds: Vec<&str> = self
            .devices
            .iter()
            .map(|d| d.fingerprint.as_str())
            .collect();
        kinds.dedup();
        format!(
            "{} CUDA device(s): {}",
            self.devices.len(),
            kinds.join(", ")
        )
    }

    fn tune_gemm(
        &self,
        device: &CudaDevice,
        job: &TuneJob,
        problem: &GemmProblem,
    ) -> Result<v1::Result, TuneError> {
        if !cublaslt_library_present() {
            return Err(TuneError::Unavailable(
                "libcublasLt cannot be loaded; op gemm needs cuBLASLt".to_string(),
            ));
        }
        let gemm = GemmRun::prepare(device, problem)?;
        gemm.tune(job, &self.measure)
    }

    fn tune_nvrtc(
        &self,
        device: &CudaDevice,
        job: &TuneJob,
        problem: &NvrtcProblem,
    ) -> Result<v1::Result, TuneError> {
        if !nvrtc_library_present() {
            return Err(TuneError::Unavailable(
                "libnvrtc cannot be loaded; op nvrtc needs NVRTC".to_string(),
            ));
        }
        NvrtcRun::prepare(device, problem, &self.measure)?.tune(job, &self.measure)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> &[v1::Device] {
        &self.devices
    }

    fn tune(&mut self, job: &TuneJob) -> Result<v1::Result, TuneError> {
        let index = self
            .devices
            .iter()
            .position(|d| d.fingerprint == job.device)
            .ok_or_else(|| TuneError::NoDevice(job.device.clone()))?;
        let device = &self.handles[index];
        device
            .context
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        tracing::debug!(ordinal = device.ordinal, "tuning on device");
        match job.op.as_str() {
            "gemm" => self.tune_gemm(device, job, &parse_gemm(&job.problem)?),
            "nvrtc" => self.tune_nvrtc(device, job, &parse_nvrtc(&job.problem)?),
            other => Err(TuneError::UnknownOp(other.to_string())),
        }
    }
}

/// The kernel module version from `/proc/driver/nvidia/version` (e.g. "570.86.15").
fn nvidia_driver_version() -> String {
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|text| {
            let line = text.lines().next()?.to_string();
            let after = line.split("Kernel Module").nth(1)?;
            after.split_whitespace().next().map(str::to_string)
        })
        .unwrap_or_default()
}

/// Times GPU work between two events on `stream`, optionally evicting L2 first.
struct EventTimer {
    start: CudaEvent,
    end: CudaEvent,
    l2_flush: Option<CudaSlice<u8>>,
}

impl EventTimer {
    fn new(
        context: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        flush_l2: bool,
    ) -> Result<Self, TuneError> {
        let event = || {
            context
                .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| driver_error("creating a CUDA event", e))
        };
        let l2_flush = if flush_l2 {
            let l2_bytes = context
                .attribute(driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
                .map_err(|e| driver_error("reading the L2 size", e))?;
            // Twice the L2 size so nothing of the previous run survives.
            let bytes = (l2_bytes.max(1 << 20) as usize) * 2;
            Some(
                stream
                    .alloc_zeros::<u8>(bytes)
                    .map_err(|e| driver_error("allocating the L2 flush buffer", e))?,
            )
        } else {
            None
        };
        Ok(EventTimer {
            start: event()?,
            end: event()?,
            l2_flush,
        })
    }

    /// Runs `work` once between the events and returns its GPU time in microseconds.
    fn time_us(
        &mut self,
        stream: &Arc<CudaStream>,
        work: impl FnOnce() -> Result<(), TuneError>,
    ) -> Result<f64, TuneError> {
        if let Some(flush) = self.l2_flush.as_mut() {
            stream
                .memset_zeros(flush)
                .map_err(|e| driver_error("flushing L2", e))?;
        }
        self.start
            .record(stream)
            .map_err(|e| driver_error("recording the start event", e))?;
        work()?;
        self.end
            .record(stream)
            .map_err(|e| driver_error("recording the end event", e))?;
        self.end
            .synchronize()
            .map_err(|e| driver_error("waiting for the timed work", e))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| driver_error("reading the event timer", e))?;
        Ok(f64::from(ms) * 1e3)
    }
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

/// One gemm problem set up on a device: operands, descriptors, host copies for checking.
struct GemmRun<'a> {
    device: &'a CudaDevice,
    stream: Arc<CudaStream>,
    problem: GemmProblem,
    shape: GemmShape,
    host_a: Vec<f32>,
    host_b: Vec<f32>,
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    d: CudaSlice<u8>,
    workspace: CudaSlice<u8>,
    descriptors: LtDescriptors,
}

impl<'a> GemmRun<'a> {
    fn prepare(device: &'a CudaDevice, problem: &GemmProblem) -> Result<Self, TuneError> {
        let stream = device.context.default_stream();
        let shape = GemmShape::from_problem(problem);
        let (mut host_a, mut host_b) = random_operands(&shape, 1);
        let a_bytes = encode_gemm_values(&mut host_a, problem.dtype);
        let b_bytes = encode_gemm_values(&mut host_b, problem.dtype);
        let element = a_bytes.len() / host_a.len().max(1);
        let a = stream
            .clone_htod(&a_bytes)
            .map_err(|e| driver_error("uploading A", e))?;
        let b = stream
            .clone_htod(&b_bytes)
            .map_err(|e| driver_error("uploading B", e))?;
        let d = stream
            .alloc_zeros::<u8>(shape.m * shape.n * element)
            .map_err(|e| driver_error("allocating D", e))?;
        let workspace = stream
            .alloc_zeros::<u8>(GEMM_WORKSPACE_BYTES)
            .map_err(|e| driver_error("allocating the workspace", e))?;
        Ok(GemmRun {
            device,
            stream,
            problem: problem.clone(),
            shape,
            host_a,
            host_b,
            a,
            b,
            d,
            workspace,
            descriptors: LtDescriptors::new(problem)?,
        })
    }

    /// Enqueues one `D = A·B` with `heuristic`'s algorithm (C aliases D, beta = 0).
    fn enqueue(
        &mut self,
        heuristic: &lt_sys::cublasLtMatmulHeuristicResult_t,
    ) -> Result<(), TuneError> {
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        let a = raw_ptr(&self.a, &self.stream);
        let b = raw_ptr(&self.b, &self.stream);
        let d = raw_ptr_mut(&mut self.d, &self.stream);
        let workspace = raw_ptr_mut(&mut self.workspace, &self.stream);
        let descriptors = &self.descriptors;
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
                self.stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(|e| blas_error("cublasLtMatmul", e))
    }

    /// Runs the algorithm once and compares sampled outputs with an f64 host reference.
    fn verify(
        &mut self,
        heuristic: &lt_sys::cublasLtMatmulHeuristicResult_t,
    ) -> Result<(), TuneError> {
        self.stream
            .memset_zeros(&mut self.d)
            .map_err(|e| driver_error("clearing D", e))?;
        self.enqueue(heuristic)?;
        let output = self
            .stream
            .clone_dtoh(&self.d)
            .map_err(|e| driver_error("downloading D", e))?;
        let output_eps = match self.problem.dtype {
            GemmDtype::F32 => 1e-6,
            GemmDtype::F16 => 2e-3,
            GemmDtype::Bf16 => 1.6e-2,
        };
        let shape = self.shape;
        let accumulation = 1e-4 * (shape.k as f64).sqrt();
        let mut rng = SplitMix64::new(5);
        for _ in 0..GEMM_CHECK_SAMPLES.min(shape.m * shape.n) {
            let i = (rng.next_u64() % shape.m as u64) as usize;
            let j = (rng.next_u64() % shape.n as u64) as usize;
            let want = reference_entry(&shape, &self.host_a, &self.host_b, i, j);
            let got = decode_gemm_value(&output, i + j * shape.m, self.problem.dtype);
            // NaN must fail too, hence the explicit check.
            if got.is_nan() || (got - want).abs() > output_eps * want.abs() + accumulation {
                return Err(TuneError::WrongOutput(format!(
                    "wrong output at ({i},{j}): {got} vs reference {want}"
                )));
            }
        }
        Ok(())
    }

    fn tune(
        mut self,
        job: &TuneJob,
        measure_config: &MeasureConfig,
    ) -> Result<v1::Result, TuneError> {
        let candidates = self.descriptors.heuristic()?;
        let stream = self.stream.clone();
        let mut timer = EventTimer::new(&self.device.context, &stream, measure_config.flush_l2)?;
        let deadline = tactic_deadline(job);
        let mut report = Vec::new();
        let mut measured: Vec<(usize, Stats)> = Vec::new();
        for (rank, heuristic) in candidates.iter().enumerate() {
            let mut entry = describe_algo(heuristic);
            entry["heuristic_rank"] = json!(rank);
            if heuristic.state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                entry["error"] = json!(format!("heuristic state {:?}", heuristic.state));
                report.push(entry);
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() > d) && !measured.is_empty() {
                entry["error"] = json!("skipped: the job's time budget ran out");
                report.push(entry);
                continue;
            }
            // Correctness before timing: a fast wrong answer must never win.
            if let Err(error) = self.verify(heuristic) {
                entry["error"] = json!(format!("failed verification: {error}"));
                report.push(entry);
                continue;
            }
            let outcome = measure(measure_config, "cuda", || {
                timer.time_us(&stream, || self.enqueue(heuristic))
            });
            match outcome {
                Ok(stats) => {
                    entry["median_us"] = json!(stats.median_us);
                    entry["spread"] = json!(stats.spread);
                    measured.push((rank, stats));
                }
                Err(error) => entry["error"] = json!(error.to_string()),
            }
            report.push(entry);
        }
        let (best_rank, best_stats) = measured
            .iter()
            .min_by(|x, y| x.1.median_us.total_cmp(&y.1.median_us))
            .cloned()
            .ok_or_else(|| {
                TuneError::NothingRan(format!(
                    "no cuBLASLt algorithm ran correctly: {}",
                    json!(report)
                ))
            })?;
        let heuristic0 = measured
            .iter()
            .find(|(rank, _)| *rank == 0)
            .map(|(_, s)| s.median_us);
        let flops = 2.0 * (self.shape.m * self.shape.n * self.shape.k) as f64;
        let mut algo = describe_algo(&candidates[best_rank]);
        algo["heuristic_rank"] = json!(best_rank);
        let config = json!({
            "backend": "cuda",
            "op": "gemm",
            "library": "cublasLt",
            "compute_type": "CUBLAS_COMPUTE_32F",
            "algo": algo,
            "stats": best_stats,
            "tflops": flops / (best_stats.median_us * 1e6),
            "heuristic0_median_us": heuristic0,
            "speedup_vs_heuristic0": heuristic0.map(|h0| h0 / best_stats.median_us),
            "verified": {"sampled_entries": GEMM_CHECK_SAMPLES, "reference": "f64 host dot products"},
            "candidates": report,
        });
        Ok(make_result("cuda", &config, best_stats.median_us))
    }
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

/// Enqueues one launch of `function` with the problem's arguments.
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

/// One nvrtc problem set up on a device.
struct NvrtcRun<'a> {
    device: &'a CudaDevice,
    stream: Arc<CudaStream>,
    problem: NvrtcProblem,
    initial: Vec<Vec<u8>>,
    buffers: Vec<CudaSlice<u8>>,
    args: Vec<ArgValue>,
    timer: EventTimer,
}

struct CompiledCandidate {
    index: usize,
    function: CudaFunction,
    config: LaunchConfig,
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
        let buffers = initial
            .iter()
            .map(|bytes| {
                stream
                    .clone_htod(bytes)
                    .map_err(|e| driver_error("uploading a buffer", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
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
        let timer = EventTimer::new(&device.context, &stream, measure.flush_l2)?;
        Ok(NvrtcRun {
            device,
            stream,
            problem: problem.clone(),
            initial,
            buffers,
            args,
            timer,
        })
    }

    fn reset_buffers(&mut self) -> Result<(), TuneError> {
        for (buffer, bytes) in self.buffers.iter_mut().zip(&self.initial) {
            self.stream
                .memcpy_htod(bytes, buffer)
                .map_err(|e| driver_error("re-initialising a buffer", e))?;
        }
        Ok(())
    }

    fn compile(&self, index: usize) -> Result<CompiledCandidate, TuneError> {
        let candidate = &self.problem.candidates[index];
        let (major, minor) = self
            .device
            .context
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        // PTX for the device's virtual arch; the driver JIT-compiles it for the exact GPU.
        let mut options = vec![format!("--gpu-architecture=compute_{major}{minor}")];
        for (name, value) in &candidate.defines {
            options.push(if value.is_empty() {
                format!("-D{name}")
            } else {
                format!("-D{name}={value}")
            });
        }
        let compile_options = CompileOptions {
            options,
            name: Some(format!("{}.cu", candidate.name)),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(&self.problem.source, compile_options)
            .map_err(TuneError::Compile)?;
        let module = self
            .device
            .context
            .load_module(ptx)
            .map_err(|e| driver_error("load module", e))?;
        let function = module
            .load_function(&self.problem.kernel)
            .map_err(|e| driver_error(&format!("kernel {:?} not found", self.problem.kernel), e))?;
        if candidate.shared_mem_bytes > 48 * 1024 {
            function
                .set_attribute(
                    driver_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    candidate.shared_mem_bytes as i32,
                )
                .map_err(|e| driver_error("raising the dynamic shared memory limit", e))?;
        }
        let config = LaunchConfig {
            grid_dim: (candidate.grid[0], candidate.grid[1], candidate.grid[2]),
            block_dim: (candidate.block[0], candidate.block[1], candidate.block[2]),
            shared_mem_bytes: candidate.shared_mem_bytes,
        };
        Ok(CompiledCandidate {
            index,
            function,
            config,
        })
    }

    /// Runs a candidate once on fresh buffers and returns the contents of buffer `check`.
    fn output_of(
        &mut self,
        compiled: &CompiledCandidate,
        check: usize,
    ) -> Result<Vec<f64>, TuneError> {
        self.reset_buffers()?;
        launch(
            &self.stream,
            &compiled.function,
            compiled.config,
            &self.args,
            &self.buffers,
        )?;
        self.stream
            .synchronize()
            .map_err(|e| driver_error("running the kernel", e))?;
        let bytes = self
            .stream
            .clone_dtoh(&self.buffers[check])
            .map_err(|e| driver_error("downloading the checked buffer", e))?;
        Ok(decode_buffer(&bytes, self.problem.buffers[check].dtype))
    }

    fn tune(
        mut self,
        job: &TuneJob,
        measure_config: &MeasureConfig,
    ) -> Result<v1::Result, TuneError> {
        let deadline = tactic_deadline(job);
        let mut report = Vec::new();
        let mut compiled_ok: Vec<(CompiledCandidate, Stats)> = Vec::new();
        for index in 0..self.problem.candidates.len() {
            let name = self.problem.candidates[index].name.clone();
            if deadline.is_some_and(|d| Instant::now() > d) && !compiled_ok.is_empty() {
                report
                    .push(json!({"name": name, "error": "skipped: the job's time budget ran out"}));
                continue;
            }
            let compiled = match self.compile(index) {
                Ok(compiled) => compiled,
                Err(error) => {
                    report.push(json!({"name": name, "error": error.to_string()}));
                    continue;
                }
            };
            let stream = self.stream.clone();
            let (args, buffers) = (&self.args, &self.buffers);
            let timer = &mut self.timer;
            let outcome = measure(measure_config, "cuda", || {
                timer.time_us(&stream, || {
                    launch(&stream, &compiled.function, compiled.config, args, buffers)
                })
            });
            match outcome {
                Ok(stats) => {
                    report.push(json!({"name": name, "median_us": stats.median_us, "spread": stats.spread, "repeats": stats.repeats}));
                    compiled_ok.push((compiled, stats));
                }
                Err(error) => {
                    report.push(json!({"name": name, "error": format!("launch: {error}")}))
                }
            }
        }
        let winner = compiled_ok
            .iter()
            .enumerate()
            .min_by(|x, y| x.1 .1.median_us.total_cmp(&y.1 .1.median_us))
            .map(|(position, _)| position)
            .ok_or_else(|| {
                TuneError::NothingRan(format!("no candidate compiled and ran: {}", json!(report)))
            })?;

        let verification = match self.problem.check.clone() {
            None => json!("none requested"),
            Some(check) => {
                let buffer = self
                    .problem
                    .buffers
                    .iter()
                    .position(|b| b.name == check.buffer)
                    .ok_or_else(|| TuneError::WrongOutput("check buffer vanished".to_string()))?;
                let got = self.output_of(&compiled_ok[winner].0, buffer)?;
                let close = |x: f64, y: f64| (x - y).abs() <= check.atol + check.rtol * y.abs();
                if let Some(reference) = &check.reference {
                    let reference_index = compiled_ok
                        .iter()
                        .position(|(c, _)| &self.problem.candidates[c.index].name == reference)
                        .ok_or_else(|| {
                            TuneError::NothingRan(format!(
                                "reference candidate {reference:?} did not compile and run"
                            ))
                        })?;
                    let want = self.output_of(&compiled_ok[reference_index].0, buffer)?;
                    if let Some((i, (g, w))) = got
                        .iter()
                        .zip(&want)
                        .enumerate()
                        .find(|(_, (g, w))| !close(**g, **w))
                    {
                        return Err(TuneError::WrongOutput(format!(
                            "winner {:?} disagrees with reference {reference:?} at {}[{i}]: {g} vs {w}",
                            self.problem.candidates[compiled_ok[winner].0.index].name, check.buffer
                        )));
                    }
                }
                if let Some(expected) = check.expected_sum {
                    let sum: f64 = got.iter().sum();
                    if !close(sum, expected) {
                        return Err(TuneError::WrongOutput(format!(
                            "winner's sum of {} is {sum}, expected {expected}",
                            check.buffer
                        )));
                    }
                }
                json!({"buffer": check.buffer, "reference": check.reference, "expected_sum": check.expected_sum})
            }
        };

        let (best, stats) = &compiled_ok[winner];
        let candidate = &self.problem.candidates[best.index];
        let config = json!({
            "backend": "cuda",
            "op": "nvrtc",
            "kernel": self.problem.kernel,
            "candidate": candidate.name,
            "defines": candidate.defines,
            "grid": candidate.grid,
            "block": candidate.block,
            "shared_mem_bytes": candidate.shared_mem_bytes,
            "stats": stats,
            "verified": verification,
            "candidates": report,
        });
        Ok(make_result("cuda", &config, stats.median_us))
    }
}
