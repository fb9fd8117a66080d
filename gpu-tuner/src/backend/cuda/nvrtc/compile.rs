//! Building an nvrtc candidate: its NVRTC options, the targets tried for the GPU (falling
//! back when NVRTC does not know one), the compile itself, and the launch it is given
//! (shape, and the shared memory it must opt in to). The choices are pure functions;
//! [`nvrtc_compile`] is the only call into NVRTC.

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};

use cudarc::driver::LaunchConfig;
use cudarc::nvrtc::Ptx;
use tunecache_proto::tuner::problem::CandidateSpec;

use crate::backend::report::{cut, MAX_FIELD_CHARS};
use crate::error::TuneError;

/// Shared memory a block gets without opting in.
const DEFAULT_SHARED_BYTES: u64 = 48 * 1024;

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

/// A candidate's `defines` as NVRTC options: `-DNAME=value`, or a bare `-DNAME` for "".
pub(super) fn define_options(defines: &BTreeMap<String, String>) -> Vec<String> {
    defines
        .iter()
        .map(|(name, value)| {
            if value.is_empty() {
                format!("-D{name}")
            } else {
                format!("-D{name}={value}")
            }
        })
        .collect()
}

/// A compile that failed: NVRTC's status and log.
pub(super) struct CompileFailure {
    /// NVRTC rejected an option (e.g. an arch it does not know): try the next target.
    pub(super) invalid_option: bool,
    pub(super) text: String,
}

/// Compiles for the first of `targets` (`(target, cubin)`, best first) that NVRTC accepts,
/// and returns the image with its target. A target NVRTC does not know (an older NVRTC)
/// moves on to the next one; any other failure is the candidate's, and ends the search.
pub(super) fn first_accepted_target<T>(
    targets: Vec<(String, bool)>,
    mut compile: impl FnMut(&str, bool) -> Result<T, CompileFailure>,
) -> Result<(T, String), TuneError> {
    let mut tried = Vec::new();
    for (target, cubin) in targets {
        match compile(&target, cubin) {
            Ok(image) => return Ok((image, target)),
            // An unknown target: an older NVRTC; the next one may do.
            Err(failure) if failure.invalid_option => tried.push(failure.text),
            Err(failure) => return Err(TuneError::Compile(failure.text)),
        }
    }
    Err(TuneError::Compile(cut(
        &format!("NVRTC accepted no target: {}", tried.join("; ")),
        MAX_FIELD_CHARS,
    )))
}

/// Compiles `source` for `target` with NVRTC and returns a module image: the CUBIN for an
/// `sm_` target, the PTX text for a `compute_` one.
pub(super) fn nvrtc_compile(
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

/// The launch a candidate asks for: its grid, block and dynamic shared memory.
pub(super) fn launch_config(candidate: &CandidateSpec) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (candidate.grid[0], candidate.grid[1], candidate.grid[2]),
        block_dim: (candidate.block[0], candidate.block[1], candidate.block[2]),
        shared_mem_bytes: candidate.shared_mem_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn defines_become_d_options_and_an_empty_value_a_bare_name() {
        let defines = BTreeMap::from([
            ("BLOCK".to_string(), "128".to_string()),
            ("UNROLL".to_string(), String::new()),
        ]);
        assert_eq!(define_options(&defines), vec!["-DBLOCK=128", "-DUNROLL"]);
        assert!(define_options(&BTreeMap::new()).is_empty());
    }

    fn failure(invalid_option: bool, text: &str) -> CompileFailure {
        CompileFailure {
            invalid_option,
            text: text.to_string(),
        }
    }

    #[test]
    fn an_unknown_target_falls_back_and_any_other_failure_is_the_candidates() {
        // An older NVRTC that knows neither sm_90a nor sm_90: the PTX target is built.
        let mut tried = Vec::new();
        let (image, target) = first_accepted_target(nvrtc_targets(9, 0), |target, cubin| {
            tried.push(target.to_string());
            if cubin {
                Err(failure(true, &format!("no {target}")))
            } else {
                Ok("ptx")
            }
        })
        .unwrap();
        assert_eq!((image, target.as_str()), ("ptx", "compute_90"));
        assert_eq!(tried, ["sm_90a", "sm_90", "compute_90"]);
        // The first target NVRTC takes wins; later ones are never compiled.
        let mut calls = 0;
        let (_, target) = first_accepted_target(nvrtc_targets(9, 0), |_, _| {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((target.as_str(), calls), ("sm_90a", 1));
        // A syntax error is the candidate's: no other target is tried.
        let mut calls = 0;
        let error = first_accepted_target(nvrtc_targets(9, 0), |_, _| -> Result<(), _> {
            calls += 1;
            Err(failure(false, "error: expected a ';'"))
        })
        .unwrap_err();
        assert_eq!(calls, 1);
        assert_eq!(error.to_string(), "compile: error: expected a ';'");
        // No target known: every refusal is listed.
        let error = first_accepted_target(nvrtc_targets(8, 0), |target, _| -> Result<(), _> {
            Err(failure(true, &format!("no {target}")))
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "compile: NVRTC accepted no target: no sm_80; no compute_80"
        );
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
    fn the_launch_is_the_candidates_grid_block_and_dynamic_shared_memory() {
        let candidate = CandidateSpec {
            name: "b128".to_string(),
            defines: BTreeMap::new(),
            grid: [8, 4, 2],
            block: [128, 2, 1],
            shared_mem_bytes: 4096,
        };
        let config = launch_config(&candidate);
        assert_eq!(config.grid_dim, (8, 4, 2));
        assert_eq!(config.block_dim, (128, 2, 1));
        assert_eq!(config.shared_mem_bytes, 4096);
    }
}
