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
//! This module opens the GPU and routes a job to its op. The parts:
//! * `library`: loading the CUDA libraries, and why one is missing;
//! * `sticky`: error mapping, and the exit of a worker whose context is poisoned;
//! * `device` and `nvml`: which GPU, and its fingerprint;
//! * `timer`: CUDA events, the spin kernel, cold-L2 rotation;
//! * `gemm`: cuBLASLt gemm measurement;
//! * `nvrtc`: NVRTC kernel candidates.
//!
//! Each keeps its rules in pure functions with CPU unit tests; only their adapters call
//! the driver.

mod device;
mod gemm;
mod library;
mod nvml;
mod nvrtc;
mod sticky;
mod timer;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys as driver_sys;
use cudarc::driver::CudaContext;
use tunecache_proto::tuner::problem::{parse_gemm, parse_nvrtc};
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

pub use tunecache_proto::tuner::POISONED_EXIT_CODE;

use self::device::{choose_device, cuda_version_text, describe_device, nvidia_driver_version};
pub use self::device::{parse_driver_version, pick_device, GpuLoad};
use self::gemm::GemmRun;
pub use self::gemm::{
    check_plan, gemm_tolerance, parse_algo_hex, time_algo_back_to_back, GEMM_WORKSPACE_BYTES,
    HEURISTIC_ALGOS,
};
pub use self::library::driver_library_present;
use self::library::{cublaslt_library_present, missing_library, nvrtc_library_present};
use self::nvml::nvml_loads;
pub use self::nvml::nvml_uuid;
use self::nvrtc::NvrtcRun;
pub use self::nvrtc::{nvrtc_targets, shared_memory_opt_in};
use self::sticky::driver_error;
pub use self::sticky::{is_sticky, verdict, Verdict};
use super::{Backend, DeviceChoice};
use crate::error::TuneError;
use crate::measure::MeasureConfig;

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
        let count = count.max(0) as usize;
        let (ordinal, chosen_because) = choose_device(choice, count, || {
            // UUIDs need no context, so no GPU but the chosen one gets one.
            let uuids: Vec<[u8; 16]> = (0..count)
                .map(|i| {
                    raw_device::get(i as i32)
                        .and_then(raw_device::get_uuid)
                        .map(|uuid| uuid.bytes.map(|b| b as u8))
                        .unwrap_or([0; 16])
                })
                .collect();
            nvml_loads(&uuids)
        })?;
        let mut cuda_version: i32 = 0;
        // SAFETY: plain out-parameter call into the loaded driver.
        unsafe { driver_sys::cuDriverGetVersion(&mut cuda_version) }
            .result()
            .map_err(|e| TuneError::driver("cuDriverGetVersion failed", e))?;
        let context = CudaContext::new(ordinal)
            .map_err(|e| TuneError::driver(format!("creating a context on device {ordinal}"), e))?;
        let name = context
            .name()
            .map_err(|e| TuneError::driver(format!("device {ordinal} name"), e))?;
        let capability = context
            .compute_capability()
            .map_err(|e| TuneError::driver(format!("device {ordinal} compute capability"), e))?;
        let memory_bytes = context.total_mem().unwrap_or(0) as u64;
        let devices = vec![describe_device(
            name,
            capability,
            memory_bytes,
            nvidia_driver_version(),
            cuda_version_text(cuda_version),
        )];
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
