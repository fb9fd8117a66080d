//! cuBLASLt for one gemm: its descriptors, the heuristic's candidate algorithms, how an
//! algorithm is described in a result (and its `algo_hex` read back), and enqueueing one
//! `D = A·B` with a chosen algorithm. The shapes, workspace and texts these calls are given
//! are worked out by pure functions, tested without a GPU.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::sys as driver_sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use serde_json::json;
use tunecache_proto::tuner::problem::{GemmDtype, GemmProblem};

use crate::backend::cuda::sticky::blas_error;
use crate::error::TuneError;

/// cuBLASLt algorithms asked of the heuristic.
pub const HEURISTIC_ALGOS: usize = 32;
/// Workspace offered to cuBLASLt algorithms.
pub const GEMM_WORKSPACE_BYTES: usize = 32 << 20;

/// The stored `rows x cols` of an operand whose `op` is `rows x cols`: column-major storage,
/// op 'n' stores it as given, 't' stores the transpose.
pub(super) fn stored_shape(rows: u64, cols: u64, transposed: bool) -> (u64, u64) {
    if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    }
}

/// The workspace a matmul with an algorithm that asks for `algo_bytes` is given: never more
/// than was allocated ([`GEMM_WORKSPACE_BYTES`], also the heuristic's limit).
pub(super) fn workspace_for(algo_bytes: usize) -> usize {
    algo_bytes.min(GEMM_WORKSPACE_BYTES)
}

/// `cublasLtGetVersion`'s number (10000 * major + 100 * minor + patch) as
/// "major.minor.patch".
pub(super) fn version_text(version: usize) -> String {
    format!(
        "{}.{}.{}",
        version / 10_000,
        (version / 100) % 100,
        version % 100
    )
}

/// cuBLASLt's version as "major.minor.patch": replaying an `algo_hex` depends on it.
pub(super) fn cublaslt_version() -> String {
    // SAFETY: no arguments; the library is loaded (checked before a gemm job starts).
    version_text(unsafe { lt_sys::cublasLtGetVersion() })
}

/// The opaque 64 bytes of a `cublasLtMatmulAlgo_t` as hex, little-endian word by word.
pub(super) fn algo_hex(words: &[u64; 8]) -> String {
    words
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .map(|byte| format!("{byte:02x}"))
        .collect()
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

fn gemm_data_type(dtype: GemmDtype) -> lt_sys::cudaDataType {
    match dtype {
        GemmDtype::F16 => lt_sys::cudaDataType::CUDA_R_16F,
        GemmDtype::Bf16 => lt_sys::cudaDataType::CUDA_R_16BF,
        GemmDtype::F32 => lt_sys::cudaDataType::CUDA_R_32F,
    }
}

/// cuBLASLt descriptors of one gemm, destroyed on drop.
pub(super) struct LtDescriptors {
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
    pub(super) fn new(problem: &GemmProblem) -> Result<Self, TuneError> {
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
        let (a_rows, a_cols) = stored_shape(m, k, problem.layout.transpose_a());
        let (b_rows, b_cols) = stored_shape(k, n, problem.layout.transpose_b());
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
    pub(super) fn heuristic(
        &self,
    ) -> Result<Vec<lt_sys::cublasLtMatmulHeuristicResult_t>, TuneError> {
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
pub(super) fn describe_algo(
    heuristic: &lt_sys::cublasLtMatmulHeuristicResult_t,
) -> serde_json::Value {
    use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Attr;
    let algo = &heuristic.algo;
    json!({
        "algo_hex": algo_hex(&algo.data),
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
pub(super) struct GemmSet {
    pub(super) a: CudaSlice<u8>,
    pub(super) b: CudaSlice<u8>,
    pub(super) d: CudaSlice<u8>,
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

/// Enqueues one `D = A·B` on `set` with `heuristic`'s algorithm (C aliases D, beta = 0).
pub(super) fn enqueue_gemm(
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
            workspace_for(heuristic.workspaceSize),
            stream.cu_stream() as lt_sys::cudaStream_t,
        )
    }
    .map_err(|e| blas_error("cublasLtMatmul", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunecache_proto::tuner::problem::GemmLayout;

    #[test]
    fn operands_are_stored_column_major_as_the_layout_says() {
        let (m, n, k) = (128, 64, 32);
        let stored = |layout: GemmLayout| {
            (
                stored_shape(m, k, layout.transpose_a()),
                stored_shape(k, n, layout.transpose_b()),
            )
        };
        // "nn": A is m x k, B is k x n, as given.
        assert_eq!(stored(GemmLayout::Nn), ((m, k), (k, n)));
        // "nt": A stored m x k (lda = m), B stored n x k (ldb = n).
        assert_eq!(stored(GemmLayout::Nt), ((m, k), (n, k)));
        assert_eq!(stored(GemmLayout::Tn), ((k, m), (k, n)));
        assert_eq!(stored(GemmLayout::Tt), ((k, m), (n, k)));
    }

    #[test]
    fn an_algorithm_never_gets_more_workspace_than_was_allocated() {
        assert_eq!(workspace_for(0), 0);
        assert_eq!(workspace_for(4096), 4096);
        assert_eq!(workspace_for(GEMM_WORKSPACE_BYTES), GEMM_WORKSPACE_BYTES);
        assert_eq!(
            workspace_for(GEMM_WORKSPACE_BYTES + 1),
            GEMM_WORKSPACE_BYTES
        );
    }

    #[test]
    fn the_cublaslt_version_reads_as_major_minor_patch() {
        assert_eq!(version_text(120_803), "12.8.3");
        assert_eq!(version_text(130_100), "13.1.0");
        assert_eq!(version_text(110_402), "11.4.2");
    }

    #[test]
    fn algo_hex_round_trips_to_the_algorithm_words() {
        let words = [1u64, 2, 3, 0xdead_beef, 5, 6, 7, u64::MAX];
        let hex: String = words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(algo_hex(&words), hex);
        assert!(hex.starts_with("0100000000000000"), "{hex}");
        assert_eq!(parse_algo_hex(&hex), Some(words));
        assert_eq!(parse_algo_hex(&hex[..126]), None);
        assert_eq!(parse_algo_hex(&"zz".repeat(64)), None);
    }
}
