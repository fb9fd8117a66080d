//! Asking NVML how busy each GPU is, so that the worker can pick the least-loaded one.
//! `libnvidia-ml` is loaded at run time like cudarc's libraries; a host without it answers
//! `None` for every GPU.

use std::ffi::{c_char, c_void, CString};

use super::device::GpuLoad;

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
pub(super) fn nvml_loads(uuids: &[[u8; 16]]) -> Vec<Option<GpuLoad>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
