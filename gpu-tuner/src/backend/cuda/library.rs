//! Loading the CUDA libraries: whether `libcuda`, `libcublasLt` and `libnvrtc` can be
//! loaded, checked before anything touches cudarc (which panics on a library it cannot
//! find), and the error that says why one is missing.

use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::sys as driver_sys;

use crate::error::TuneError;

/// Whether the NVIDIA driver library can be loaded; checked before anything touches cudarc.
pub fn driver_library_present() -> bool {
    // SAFETY: only tries to dlopen the library names and drops the handle.
    unsafe { driver_sys::is_culib_present() }
}

pub(super) fn cublaslt_library_present() -> bool {
    // SAFETY: as above.
    unsafe { lt_sys::is_culib_present() }
}

pub(super) fn nvrtc_library_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Why a library cudarc cannot find is missing, after asking whether its CUDA 13 name loads.
pub(super) fn missing_library(lib: &str, op: &str) -> TuneError {
    let so13 = format!("lib{lib}.so.13");
    // SAFETY: only tries to dlopen the name and drops the handle.
    let has_13 = unsafe { libloading::Library::new(&so13) }.is_ok();
    missing_library_error(lib, op, has_13)
}

/// The error for a library cudarc cannot load. cudarc (built with `cuda-12080`) looks for
/// `.so`, `.so.12`, `.so.11`, ... but not `.so.13`, so a CUDA 13 host needs the CUDA 12
/// runtime libraries beside its own; say so when only the 13 one is there (`has_13`).
pub(super) fn missing_library_error(lib: &str, op: &str, has_13: bool) -> TuneError {
    let so13 = format!("lib{lib}.so.13");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_cuda_12_when_only_the_13_one_loads() {
        let only_13 = missing_library_error("nvrtc", "nvrtc", true).to_string();
        assert!(
            only_13.contains("libnvrtc.so.12 cannot be loaded, but libnvrtc.so.13 can"),
            "{only_13}"
        );
        assert!(
            only_13.contains("install the CUDA 12 nvrtc runtime"),
            "{only_13}"
        );
        assert!(only_13.ends_with("op nvrtc needs it"), "{only_13}");
        let neither = missing_library_error("cublasLt", "gemm", false).to_string();
        assert_eq!(
            neither,
            "libcublasLt cannot be loaded (looked for .so, .so.12, .so.11); op gemm needs it"
        );
        assert!(matches!(
            missing_library_error("cublasLt", "gemm", false),
            TuneError::Unavailable(_)
        ));
    }
}
