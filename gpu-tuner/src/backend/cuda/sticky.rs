//! Error mapping: what a failed driver or cuBLASLt call means for the worker.
//!
//! Sticky errors (illegal address, invalid address space, uncorrectable ECC, launch failure,
//! ...) leave the CUDA context unusable for the life of the process. After any failed driver
//! or cuBLASLt call the backend also asks the context itself (`cuCtxSynchronize`), since a
//! library may report a sticky error under a code of its own. A poisoned worker exits with
//! [`POISONED_EXIT_CODE`]: the supervisor restarts a fresh one, excluding the candidate it
//! had announced, and only the worker ever dies. The rule ([`verdict`]) is pure; the
//! adapters ([`driver_error`], [`blas_error`]) probe the context and exit.

use cudarc::cublaslt::result as lt;
use cudarc::driver::sys as driver_sys;
use cudarc::driver::DriverError;
use tunecache_proto::tuner::POISONED_EXIT_CODE;

use crate::error::TuneError;

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
pub(super) fn driver_error(what: &str, error: DriverError) -> TuneError {
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
pub(super) fn blas_error(what: &'static str, source: lt::CublasError) -> TuneError {
    let probe = probe_context();
    if verdict(None, probe) == Verdict::Poisoned {
        exit_poisoned(what, &format!("{source:?} (context check: {probe:?})"));
    }
    TuneError::Blas { what, source }
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
}
