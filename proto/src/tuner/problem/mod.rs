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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

/// Element type of gemm operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmDtype {
    F16,
    Bf16,
    F32,
}

impl GemmDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            GemmDtype::F16 => "f16",
            GemmDtype::Bf16 => "bf16",
            GemmDtype::F32 => "f32",
        }
    }
}

/// `op(A)` and `op(B)` of a gemm: `n` = as stored (column-major), `t` = transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmLayout {
    Nn,
    Nt,
    Tn,
    Tt,
}

impl GemmLayout {
    pub fn transpose_a(self) -> bool {
        matches!(self, GemmLayout::Tn | GemmLayout::Tt)
    }
    pub fn transpose_b(self) -> bool {
        matches!(self, GemmLayout::Nt | GemmLayout::Tt)
    }
}

/// A validated gemm problem; serialises to its canonical text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmProblem {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub dtype: GemmDtype,
    pub layout: GemmLayout,
}

/// Element type of an nvrtc buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferDtype {
    F32,
    F16,
    Bf16,
    I32,
    U32,
}

impl BufferDtype {
    pub fn size_bytes(self) -> u64 {
        match self {
            BufferDtype::F16 | BufferDtype::Bf16 => 2,
            BufferDtype::F32 | BufferDtype::I32 | BufferDtype::U32 => 4,
        }
    }
}

/// Initial contents of an nvrtc buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferInit {
    Zeros,
    Ones,
    Random,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferSpec {
    pub name: String,
    pub dtype: BufferDtype,
    pub len: u64,
    pub init: BufferInit,
}

/// One positional kernel argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelArg {
    Buffer(String),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSpec {
    pub name: String,
    pub defines: BTreeMap<String, String>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckSpec {
    pub buffer: String,
    pub reference: Option<String>,
    pub expected_sum: Option<f64>,
    pub rtol: f64,
    pub atol: f64,
}

/// A validated nvrtc problem; serialises to its canonical text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvrtcProblem {
    pub source: String,
    pub kernel: String,
    pub buffers: Vec<BufferSpec>,
    pub args: Vec<KernelArg>,
    pub candidates: Vec<CandidateSpec>,
    pub check: Option<CheckSpec>,
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

/// Parses and validates a gemm problem.
pub fn parse_gemm(problem: &str) -> Result<GemmProblem, ProblemError> {
    let root = parse_object(problem)?;
    let obj = Fields::new(&root, "")?;
    obj.only(&["m", "n", "k", "dtype", "layout"])?;
    let m = obj.uint("m", 1, MAX_GEMM_DIM)?;
    let n = obj.uint("n", 1, MAX_GEMM_DIM)?;
    let k = obj.uint("k", 1, MAX_GEMM_DIM)?;
    let dtype = match obj.string("dtype")? {
        "f16" => GemmDtype::F16,
        "bf16" => GemmDtype::Bf16,
        "f32" => GemmDtype::F32,
        other => {
            return Err(ProblemError::invalid(
                "dtype",
                format!("{other:?} is not one of \"f16\", \"bf16\", \"f32\""),
            ))
        }
    };
    let layout = match obj.string("layout")? {
        "nn" => GemmLayout::Nn,
        "nt" => GemmLayout::Nt,
        "tn" => GemmLayout::Tn,
        "tt" => GemmLayout::Tt,
        other => {
            return Err(ProblemError::invalid(
                "layout",
                format!("{other:?} is not one of \"nn\", \"nt\", \"tn\", \"tt\""),
            ))
        }
    };
    for (field, elems) in [("m", m * k), ("n", k * n), ("m", m * n)] {
        if elems > MAX_GEMM_OPERAND_ELEMS {
            return Err(ProblemError::invalid(
                field,
                format!(
                    "an operand would have {elems} elements (at most {MAX_GEMM_OPERAND_ELEMS})"
                ),
            ));
        }
    }
    Ok(GemmProblem {
        m,
        n,
        k,
        dtype,
        layout,
    })
}

/// Parses and validates an nvrtc problem.
pub fn parse_nvrtc(problem: &str) -> Result<NvrtcProblem, ProblemError> {
    let root = parse_object(problem)?;
    let obj = Fields::new(&root, "")?;
    obj.only(&["source", "kernel", "buffers", "args", "candidates", "check"])?;

    let source = obj.string("source")?;
    if source.is_empty() || source.len() > MAX_SOURCE_BYTES {
        return Err(ProblemError::invalid(
            "source",
            format!("must be 1..={MAX_SOURCE_BYTES} bytes"),
        ));
    }
    if source.contains('\0') {
        return Err(ProblemError::invalid("source", "contains a NUL byte"));
    }
    let kernel = obj.string("kernel")?;
    check_identifier("kernel", kernel)?;

    let mut buffers = Vec::new();
    let mut total_bytes: u64 = 0;
    for (i, item) in obj.array("buffers", 1, 64)?.iter().enumerate() {
        let path = format!("buffers[{i}]");
        let b = Fields::new(item, &path)?;
        b.only(&["name", "dtype", "len", "init"])?;
        let name = b.string("name")?;
        check_identifier(&b.path("name"), name)?;
        let dtype = match b.string("dtype")? {
            "f32" => BufferDtype::F32,
            "f16" => BufferDtype::F16,
            "bf16" => BufferDtype::Bf16,
            "i32" => BufferDtype::I32,
            "u32" => BufferDtype::U32,
            other => {
                return Err(ProblemError::invalid(
                    b.path("dtype"),
                    format!("{other:?} is not one of \"f32\", \"f16\", \"bf16\", \"i32\", \"u32\""),
                ))
            }
        };
        let len = b.uint("len", 1, MAX_BUFFER_ELEMS)?;
        let init = match b.optional_string("init")?.unwrap_or("random") {
            "zeros" => BufferInit::Zeros,
            "ones" => BufferInit::Ones,
            "random" => BufferInit::Random,
            other => {
                return Err(ProblemError::invalid(
                    b.path("init"),
                    format!("{other:?} is not one of \"zeros\", \"ones\", \"random\""),
                ))
            }
        };
        total_bytes += len * dtype.size_bytes();
        if total_bytes > MAX_TOTAL_BUFFER_BYTES {
            return Err(ProblemError::invalid(
                "buffers",
                format!("more than {MAX_TOTAL_BUFFER_BYTES} bytes in total"),
            ));
        }
        buffers.push(BufferSpec {
            name: name.to_string(),
            dtype,
            len,
            init,
        });
    }
    buffers.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = buffers.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ProblemError::invalid(
            "buffers",
            format!("name {:?} is used twice", pair[0].name),
        ));
    }
    let buffer_names: Vec<&str> = buffers.iter().map(|b| b.name.as_str()).collect();

    let mut args = Vec::new();
    for (i, item) in obj.array("args", 0, 64)?.iter().enumerate() {
        let path = format!("args[{i}]");
        let a = Fields::new(item, &path)?;
        if a.map.len() != 1 {
            return Err(ProblemError::invalid(
                &path,
                "must have exactly one of buffer, i32, u32, i64, u64, f32",
            ));
        }
        a.only(&["buffer", "i32", "u32", "i64", "u64", "f32"])?;
        let arg = if a.map.contains_key("buffer") {
            let name = a.string("buffer")?;
            if !buffer_names.contains(&name) {
                return Err(ProblemError::invalid(
                    a.path("buffer"),
                    format!("no buffer named {name:?}"),
                ));
            }
            KernelArg::Buffer(name.to_string())
        } else if a.map.contains_key("i32") {
            KernelArg::I32(a.int("i32", i32::MIN.into(), i32::MAX.into())? as i32)
        } else if a.map.contains_key("u32") {
            KernelArg::U32(a.uint("u32", 0, u32::MAX.into())? as u32)
        } else if a.map.contains_key("i64") {
            KernelArg::I64(a.int("i64", i64::MIN, i64::MAX)?)
        } else if a.map.contains_key("u64") {
            KernelArg::U64(a.uint("u64", 0, u64::MAX)?)
        } else {
            KernelArg::F32(a.float32("f32")?)
        };
        args.push(arg);
    }

    let mut candidates = Vec::new();
    for (i, item) in obj
        .array("candidates", 1, MAX_CANDIDATES)?
        .iter()
        .enumerate()
    {
        let path = format!("candidates[{i}]");
        let c = Fields::new(item, &path)?;
        c.only(&["name", "defines", "grid", "block", "shared_mem_bytes"])?;
        let name = c.string("name")?;
        if name.is_empty() || name.len() > 64 || name.chars().any(|ch| ch.is_control()) {
            return Err(ProblemError::invalid(
                c.path("name"),
                "must be 1..=64 printable characters",
            ));
        }
        let mut defines = BTreeMap::new();
        if let Some(value) = c.map.get("defines") {
            let defs = Fields::new(value, &c.path("defines"))?;
            for (macro_name, macro_value) in defs.map {
                let field = defs.path(macro_name);
                check_identifier(&field, macro_name)?;
                let text = macro_value
                    .as_str()
                    .ok_or_else(|| ProblemError::invalid(&field, "must be a string"))?;
                if text.len() > 256 || text.chars().any(|ch| ch.is_control()) {
                    return Err(ProblemError::invalid(
                        &field,
                        "must be at most 256 characters without control characters",
                    ));
                }
                defines.insert(macro_name.clone(), text.to_string());
            }
        }
        let grid = c.dims("grid", [u32::MAX >> 1, 65_535, 65_535])?;
        let block = c.dims("block", [1024, 1024, 64])?;
        let threads: u64 = block.iter().map(|&d| u64::from(d)).product();
        if threads > 1024 {
            return Err(ProblemError::invalid(
                c.path("block"),
                format!("{threads} threads per block (at most 1024)"),
            ));
        }
        let shared_mem_bytes = c.optional_uint("shared_mem_bytes", 0, MAX_SHARED_MEM_BYTES)?;
        candidates.push(CandidateSpec {
            name: name.to_string(),
            defines,
            grid,
            block,
            shared_mem_bytes: shared_mem_bytes.unwrap_or(0) as u32,
        });
    }
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = candidates.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ProblemError::invalid(
            "candidates",
            format!("name {:?} is used twice", pair[0].name),
        ));
    }

    let check = match obj.map.get("check") {
        None | Some(Value::Null) => None,
        Some(value) => {
            let c = Fields::new(value, "check")?;
            c.only(&["buffer", "reference", "expected_sum", "rtol", "atol"])?;
            let buffer = c.string("buffer")?;
            if !buffer_names.contains(&buffer) {
                return Err(ProblemError::invalid(
                    c.path("buffer"),
                    format!("no buffer named {buffer:?}"),
                ));
            }
            let reference = c.optional_string("reference")?;
            if let Some(reference) = reference {
                if !candidates.iter().any(|cand| cand.name == reference) {
                    return Err(ProblemError::invalid(
                        c.path("reference"),
                        format!("no candidate named {reference:?}"),
                    ));
                }
            }
            let expected_sum = c.optional_float("expected_sum")?;
            if reference.is_none() && expected_sum.is_none() {
                return Err(ProblemError::Missing {
                    field: c.path("reference"),
                });
            }
            let rtol = c.optional_float("rtol")?.unwrap_or(1e-3);
            let atol = c.optional_float("atol")?.unwrap_or(1e-3);
            for (field, tol) in [("rtol", rtol), ("atol", atol)] {
                if tol < 0.0 {
                    return Err(ProblemError::invalid(c.path(field), "must be >= 0"));
                }
            }
            Some(CheckSpec {
                buffer: buffer.to_string(),
                reference: reference.map(str::to_string),
                expected_sum,
                rtol,
                atol,
            })
        }
    };

    Ok(NvrtcProblem {
        source: source.to_string(),
        kernel: kernel.to_string(),
        buffers,
        args,
        candidates,
        check,
    })
}

fn parse_object(problem: &str) -> Result<Value, ProblemError> {
    serde_json::from_str(problem).map_err(|e| ProblemError::NotJson(e.to_string()))
}

fn check_identifier(field: &str, text: &str) -> Result<(), ProblemError> {
    let mut chars = text.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || text.len() > 128 {
        return Err(ProblemError::invalid(
            field,
            format!("{text:?} is not a C identifier"),
        ));
    }
    Ok(())
}

/// A JSON object being validated, remembering its path for error messages.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, path: &str) -> Result<Self, ProblemError> {
        match value {
            Value::Object(map) => Ok(Fields {
                map,
                prefix: if path.is_empty() {
                    String::new()
                } else {
                    format!("{path}.")
                },
            }),
            _ => Err(if path.is_empty() {
                ProblemError::NotJson("the problem must be a JSON object".to_string())
            } else {
                ProblemError::invalid(path, "must be a JSON object")
            }),
        }
    }

    fn path(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn only(&self, allowed: &[&str]) -> Result<(), ProblemError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(unknown) => Err(ProblemError::UnknownField {
                field: self.path(unknown),
            }),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Result<&'a Value, ProblemError> {
        self.map.get(name).ok_or_else(|| ProblemError::Missing {
            field: self.path(name),
        })
    }

    fn string(&self, name: &str) -> Result<&'a str, ProblemError> {
        self.get(name)?
            .as_str()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be a string"))
    }

    fn optional_string(&self, name: &str) -> Result<Option<&'a str>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.string(name).map(Some),
        }
    }

    fn uint(&self, name: &str, min: u64, max: u64) -> Result<u64, ProblemError> {
        let value = self.get(name)?;
        let number = value.as_u64().ok_or_else(|| {
            ProblemError::invalid(self.path(name), "must be a non-negative integer")
        })?;
        if number < min || number > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("{number} is outside {min}..={max}"),
            ));
        }
        Ok(number)
    }

    fn optional_uint(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.uint(name, min, max).map(Some),
        }
    }

    fn int(&self, name: &str, min: i64, max: i64) -> Result<i64, ProblemError> {
        let number = self
            .get(name)?
            .as_i64()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be an integer"))?;
        if number < min || number > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("{number} is outside {min}..={max}"),
            ));
        }
        Ok(number)
    }

    fn float(&self, name: &str) -> Result<f64, ProblemError> {
        let number = self
            .get(name)?
            .as_f64()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be a number"))?;
        if !number.is_finite() {
            return Err(ProblemError::invalid(self.path(name), "must be finite"));
        }
        Ok(number)
    }

    fn optional_float(&self, name: &str) -> Result<Option<f64>, ProblemError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.float(name).map(Some),
        }
    }

    fn float32(&self, name: &str) -> Result<f32, ProblemError> {
        let number = self.float(name)?;
        let narrowed = number as f32;
        if !narrowed.is_finite() {
            return Err(ProblemError::invalid(
                self.path(name),
                "does not fit in an f32",
            ));
        }
        Ok(narrowed)
    }

    fn array(&self, name: &str, min: usize, max: usize) -> Result<&'a Vec<Value>, ProblemError> {
        let items = self
            .get(name)?
            .as_array()
            .ok_or_else(|| ProblemError::invalid(self.path(name), "must be an array"))?;
        if items.len() < min || items.len() > max {
            return Err(ProblemError::invalid(
                self.path(name),
                format!("has {} entries (allowed {min}..={max})", items.len()),
            ));
        }
        Ok(items)
    }

    /// 1 to 3 positive launch dimensions, padded with 1s.
    fn dims(&self, name: &str, max: [u32; 3]) -> Result<[u32; 3], ProblemError> {
        let items = self.array(name, 1, 3)?;
        let mut dims = [1u32; 3];
        for (i, item) in items.iter().enumerate() {
            let value = item.as_u64().filter(|v| *v >= 1 && *v <= u64::from(max[i]));
            dims[i] = value.ok_or_else(|| {
                ProblemError::invalid(
                    self.path(name),
                    format!("entry {i} must be an integer in 1..={}", max[i]),
                )
            })? as u32;
        }
        Ok(dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm_field_error(problem: &str) -> String {
        let err = canonicalize("gemm", problem).expect_err(problem);
        err.field()
            .unwrap_or_else(|| panic!("{err} names no field"))
            .to_string()
    }

    #[test]
    fn equal_gemm_problems_give_equal_text() {
        let a = canonicalize(
            "gemm",
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nt"}"#,
        );
        let b = canonicalize(
            "gemm",
            r#" { "layout" : "nt", "dtype":"f16", "k":32, "n": 64, "m":128 } "#,
        );
        assert_eq!(a, b);
        assert_eq!(
            a.unwrap(),
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nt"}"#
        );
        let c = canonicalize(
            "gemm",
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nn"}"#,
        );
        assert_ne!(c.unwrap(), b.unwrap());
    }

    #[test]
    fn canonical_gemm_text_is_a_fixed_point() {
        let once = canonicalize(
            "gemm",
            r#"{"k":7,"m":5,"n":3,"dtype":"bf16","layout":"tt"}"#,
        )
        .unwrap();
        assert_eq!(canonicalize("gemm", &once).unwrap(), once);
    }

    #[test]
    fn each_malformed_gemm_field_is_named() {
        let cases = [
            (r#"{"n":1,"k":1,"dtype":"f32","layout":"nn"}"#, "m"),
            (r#"{"m":0,"n":1,"k":1,"dtype":"f32","layout":"nn"}"#, "m"),
            (r#"{"m":1,"n":-4,"k":1,"dtype":"f32","layout":"nn"}"#, "n"),
            (r#"{"m":1,"n":1,"k":1.5,"dtype":"f32","layout":"nn"}"#, "k"),
            (r#"{"m":1,"n":1,"k":"8","dtype":"f32","layout":"nn"}"#, "k"),
            (
                r#"{"m":1,"n":1,"k":65537,"dtype":"f32","layout":"nn"}"#,
                "k",
            ),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f64","layout":"nn"}"#,
                "dtype",
            ),
            (r#"{"m":1,"n":1,"k":1,"layout":"nn"}"#, "dtype"),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f32","layout":"NN"}"#,
                "layout",
            ),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f32","layout":"nn","alpha":2}"#,
                "alpha",
            ),
            (
                r#"{"m":65536,"n":65536,"k":1,"dtype":"f32","layout":"nn"}"#,
                "m",
            ),
        ];
        for (problem, field) in cases {
            assert_eq!(gemm_field_error(problem), field, "{problem}");
        }
    }

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

    const NVRTC: &str = r#"{
        "source": "extern \"C\" __global__ void scale(float* y, const float* x, int n) { int i = blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }",
        "kernel": "scale",
        "buffers": [{"name":"y","dtype":"f32","len":1024,"init":"zeros"},{"name":"x","dtype":"f32","len":1024}],
        "args": [{"buffer":"y"},{"buffer":"x"},{"i32":1024}],
        "candidates": [
            {"name":"b256","defines":{"BLOCK":"256"},"grid":[4],"block":[256]},
            {"name":"b128","defines":{"BLOCK":"128","UNUSED":""},"grid":[8,1],"block":[128,1,1],"shared_mem_bytes":0}
        ],
        "check": {"buffer":"y","reference":"b128"}
    }"#;

    #[test]
    fn nvrtc_canonical_form_sorts_and_fills_defaults() {
        let text = canonicalize("nvrtc", NVRTC).unwrap();
        let reordered = NVRTC.replace(
            r#"{"name":"b256","defines":{"BLOCK":"256"},"grid":[4],"block":[256]},"#,
            "",
        );
        let reordered = reordered.replace(
            r#""shared_mem_bytes":0}"#,
            r#""shared_mem_bytes":0},{"block":[256,1,1],"grid":[4,1,1],"name":"b256","defines":{"BLOCK":"256"}}"#,
        );
        assert_eq!(canonicalize("nvrtc", &reordered).unwrap(), text);
        let parsed = parse_nvrtc(&text).unwrap();
        assert_eq!(parsed.candidates[0].name, "b128");
        assert_eq!(parsed.candidates[1].grid, [4, 1, 1]);
        assert_eq!(parsed.buffers[0].name, "x");
        assert_eq!(parsed.buffers[0].init, BufferInit::Random);
        let check = parsed.check.unwrap();
        assert_eq!((check.rtol, check.atol), (1e-3, 1e-3));
        assert_eq!(canonicalize("nvrtc", &text).unwrap(), text);
    }

    #[test]
    fn each_malformed_nvrtc_field_is_named() {
        let cases = [
            (r#""kernel": "scale""#, r#""kernel": "sca le""#, "kernel"),
            (r#""kernel": "scale","#, "", "kernel"),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f64","len":1024}"#,
                "buffers[1].dtype",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f32","len":0}"#,
                "buffers[1].len",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f32","len":4,"init":"iota"}"#,
                "buffers[1].init",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"y","dtype":"f32","len":1024}"#,
                "buffers",
            ),
            (r#"{"buffer":"x"}"#, r#"{"buffer":"z"}"#, "args[1].buffer"),
            (r#"{"i32":1024}"#, r#"{"i32":4294967296}"#, "args[2].i32"),
            (r#"{"i32":1024}"#, r#"{"i16":3}"#, "args[2].i16"),
            (r#""grid":[4]"#, r#""grid":[0]"#, "candidates[0].grid"),
            (
                r#""block":[256]"#,
                r#""block":[256,8]"#,
                "candidates[0].block",
            ),
            (
                r#""BLOCK":"256""#,
                r#""BLOCK SIZE":"256""#,
                "candidates[0].defines.BLOCK SIZE",
            ),
            (
                r#""shared_mem_bytes":0"#,
                r#""shared_mem_bytes":1000000"#,
                "candidates[1].shared_mem_bytes",
            ),
            (r#""name":"b256""#, r#""name":"b128""#, "candidates"),
            (
                r#""reference":"b128""#,
                r#""reference":"b512""#,
                "check.reference",
            ),
            (r#""reference":"b128""#, r#""rtol":0.1"#, "check.reference"),
            (
                r#""check": {"buffer":"y""#,
                r#""check": {"buffer":"w""#,
                "check.buffer",
            ),
        ];
        for (from, to, field) in cases {
            let problem = NVRTC.replacen(from, to, 1);
            assert_ne!(problem, NVRTC, "replacement {from} did not apply");
            let err = canonicalize("nvrtc", &problem).expect_err(to);
            assert_eq!(err.field(), Some(field), "{to}: {err}");
        }
    }
}
