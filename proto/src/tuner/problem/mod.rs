//! Problems of namespace `tunecache`: parsing, validation and canonical text.
//!
//! This module owns the meaning of `Key.problem` for the two ops the tuner worker can tune.
//! It is pure (no CUDA, no I/O). The daemon calls [`canonicalize`] once per request key, to
//! reject malformed requests (INVALID_ARGUMENT) and to key jobs; the worker parses the same
//! canonical text with [`parse_gemm`] / [`parse_nvrtc`]. Canonical text is compact JSON with a fixed field order
//! and every default filled in, so two requests that describe the same problem give the same
//! key byte for byte. Unknown fields are rejected rather than ignored, because an ignored
//! field would silently alias two different problems onto one key.
//!
//! # op `gemm`
//!
//! `D[m×n] = op(A)[m×k] · op(B)[k×n]`, BLAS convention: column-major storage, `layout` is the
//! pair of `op`s for A and B (`n` = as stored, `t` = transposed), i.e. `"nt"` means A is stored
//! `m×k` (lda = m) and B is stored `n×k` (ldb = n). Accumulation is in f32.
//!
//! ```json
//! {"m":4096,"n":4096,"k":4096,"dtype":"f16","layout":"nn"}
//! ```
//!
//! `m`, `n`, `k`: integers in `1..=65536`, and every operand at most 2^30 elements.
//! `dtype`: `"f16"`, `"bf16"` or `"f32"` (inputs and output). `layout`: `"nn"|"nt"|"tn"|"tt"`.
//!
//! # op `nvrtc`
//!
//! A CUDA C kernel compiled at run time with NVRTC once per candidate, each candidate being a
//! set of `-D` defines plus a launch shape. The fastest candidate that compiles and runs wins.
//!
//! ```json
//! {
//!   "source": "extern \"C\" __global__ void scale(float* y, const float* x, int n) { ... }",
//!   "kernel": "scale",
//!   "buffers": [
//!     {"name": "x", "dtype": "f32", "len": 1048576, "init": "random"},
//!     {"name": "y", "dtype": "f32", "len": 1048576, "init": "zeros"}
//!   ],
//!   "args": [{"buffer": "y"}, {"buffer": "x"}, {"i32": 1048576}],
//!   "candidates": [
//!     {"name": "b128", "defines": {"BLOCK": "128"}, "grid": [8192], "block": [128]},
//!     {"name": "b256", "defines": {"BLOCK": "256"}, "grid": [4096], "block": [256], "shared_mem_bytes": 0}
//!   ],
//!   "check": {"buffer": "y", "reference": "b128", "rtol": 0.001, "atol": 0.001}
//! }
//! ```
//!
//! * `source` (≤ 1 MiB) must define `kernel` with `extern "C"` linkage (a C identifier).
//! * `buffers`: device allocations, each `name` (identifier, unique), `dtype`
//!   (`f32|f16|bf16|i32|u32`), `len` in elements (1..=2^30, all buffers ≤ 16 GiB together) and
//!   `init`: `"zeros"`, `"ones"` or `"random"` (default; deterministic values in [-1, 1) for
//!   floats, in [-8, 8) for i32 and [0, 16) for u32, so every run and every candidate sees
//!   the same data).
//!   Buffers are re-initialised before every correctness run.
//! * `args`: positional kernel arguments, each exactly one of `{"buffer": name}` (a device
//!   pointer), `{"i32": v}`, `{"u32": v}`, `{"i64": v}`, `{"u64": v}`, `{"f32": v}`.
//! * `candidates` (1..=64, unique names): `defines` maps macro names to values (`""` means a
//!   bare `-DNAME`); `grid` and `block` have 1 to 3 positive entries (missing ones are 1;
//!   threads per block ≤ 1024); `shared_mem_bytes` is dynamic shared memory (default 0,
//!   ≤ 227 KiB).
//! * `check` (optional): after choosing the winner, the named `buffer` it produced is compared
//!   element-wise with the one produced by the `reference` candidate, and/or its sum with
//!   `expected_sum`, within `|x - y| <= atol + rtol * |y|` (defaults 1e-3 each). At least one
//!   of `reference` / `expected_sum` must be given. Without `check`, correctness is the
//!   kernel author's business.
//!
//! Canonical form: candidates and buffers sorted by name, `defines` sorted by name, `grid` and
//! `block` padded to three entries, defaults written out.
//!
//! # Layout
//!
//! `types` holds the validated problems (which serialise to the canonical text),
//! `gemm` and `nvrtc` parse and validate each op, and `fields` is the JSON reader they
//! share, which names the offending field of every error.

mod fields;
mod gemm;
mod nvrtc;
mod types;

pub use gemm::parse_gemm;
pub use nvrtc::parse_nvrtc;
pub use types::{
    BufferDtype, BufferInit, BufferSpec, CandidateSpec, CheckSpec, GemmDtype, GemmLayout,
    GemmProblem, KernelArg, NvrtcProblem,
};

/// The namespace whose problems this module understands.
pub const NAMESPACE: &str = "tunecache";

/// Largest allowed gemm dimension.
pub const MAX_GEMM_DIM: u64 = 65_536;
/// Largest operand of a gemm, in elements (keeps every index in i32 range for the kernels).
pub const MAX_GEMM_OPERAND_ELEMS: u64 = 1 << 30;
/// Largest nvrtc source text, in bytes.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Largest nvrtc buffer, in elements.
pub const MAX_BUFFER_ELEMS: u64 = 1 << 30;
/// Largest total of all nvrtc buffers, in bytes.
pub const MAX_TOTAL_BUFFER_BYTES: u64 = 16 << 30;
/// Most nvrtc candidates per problem.
pub const MAX_CANDIDATES: usize = 64;
/// Most dynamic shared memory per block on current GPUs (227 KiB on sm_90).
pub const MAX_SHARED_MEM_BYTES: u64 = 227 * 1024;

/// Why a problem is not acceptable. Field names are JSON paths such as `candidates[2].block`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProblemError {
    #[error("unknown op {0:?} in namespace \"tunecache\" (expected \"gemm\" or \"nvrtc\")")]
    UnknownOp(String),
    #[error("problem is not valid JSON: {0}")]
    NotJson(String),
    #[error("field `{field}` is missing")]
    Missing { field: String },
    #[error("field `{field}` is not allowed here")]
    UnknownField { field: String },
    #[error("field `{field}` is invalid: {reason}")]
    Invalid { field: String, reason: String },
}

impl ProblemError {
    /// The JSON path of the offending field, when one field is to blame.
    pub fn field(&self) -> Option<&str> {
        match self {
            ProblemError::Missing { field }
            | ProblemError::UnknownField { field }
            | ProblemError::Invalid { field, .. } => Some(field),
            ProblemError::UnknownOp(_) | ProblemError::NotJson(_) => None,
        }
    }

    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ProblemError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Validates `problem` for `op` of namespace `tunecache` and returns its canonical text.
pub fn canonicalize(op: &str, problem: &str) -> Result<String, ProblemError> {
    let text = match op {
        "gemm" => serde_json::to_string(&parse_gemm(problem)?),
        "nvrtc" => serde_json::to_string(&parse_nvrtc(problem)?),
        other => return Err(ProblemError::UnknownOp(other.to_string())),
    };
    // Serialising plain structs of strings, integers and finite floats cannot fail; map it
    // anyway rather than unwrap.
    text.map_err(|e| ProblemError::NotJson(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_json_and_unknown_op_are_rejected() {
        assert!(matches!(
            canonicalize("gemm", "{m:1"),
            Err(ProblemError::NotJson(_))
        ));
        assert!(matches!(
            canonicalize("gemm", "[1,2]"),
            Err(ProblemError::NotJson(_))
        ));
        assert_eq!(
            canonicalize("conv", "{}"),
            Err(ProblemError::UnknownOp("conv".to_string()))
        );
    }
}
