//! The validated problems of both ops. Each serialises to its canonical text: fields in a
//! fixed order, every default filled in (see the parent module for the contract).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
