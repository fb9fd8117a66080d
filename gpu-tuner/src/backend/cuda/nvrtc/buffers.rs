//! An nvrtc problem's data on the device: the deterministic initial bytes of its buffers,
//! reading a buffer back as numbers, its kernel arguments, and one launch of a candidate
//! with them. Everything but [`launch`] is pure.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use tunecache_proto::tuner::problem::{BufferDtype, BufferInit, KernelArg, NvrtcProblem};

use crate::backend::cuda::sticky::driver_error;
use crate::backend::SplitMix64;
use crate::error::TuneError;

/// A kernel argument with a stable address for the launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum ArgValue {
    /// The index of a buffer of the problem.
    Buffer(usize),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

/// The problem's positional kernel arguments, a buffer named by its index among the
/// problem's buffers.
pub(super) fn kernel_args(problem: &NvrtcProblem) -> Vec<ArgValue> {
    problem
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
        .collect()
}

/// The initial bytes of every buffer of the problem, in its order: buffer `i` is seeded
/// with `1000 + i`, so every run and every worker sees the same data.
pub(super) fn initial_contents(problem: &NvrtcProblem) -> Vec<Vec<u8>> {
    problem
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| initial_bytes(b.dtype, b.init, b.len as usize, 1000 + i as u64))
        .collect()
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

/// A buffer's device bytes as numbers.
pub(super) fn decode_buffer(bytes: &[u8], dtype: BufferDtype) -> Vec<f64> {
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

/// Enqueues one launch of `function` with the problem's arguments on `buffers`.
pub(super) fn launch(
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

#[cfg(test)]
mod tests {
    use super::*;
    use tunecache_proto::tuner::problem::parse_nvrtc;

    const PROBLEM: &str = r#"{
        "source": "extern \"C\" __global__ void k(float* y, const int* x, unsigned n, float s) {}",
        "kernel": "k",
        "buffers": [{"name":"y","dtype":"f32","len":64,"init":"zeros"},
                    {"name":"x","dtype":"i32","len":64},
                    {"name":"u","dtype":"u32","len":64},
                    {"name":"h","dtype":"f16","len":4,"init":"ones"}],
        "args": [{"buffer":"y"},{"buffer":"x"},{"u32":64},{"f32":0.5},{"i64":-3},{"buffer":"u"}],
        "candidates": [{"name":"one","grid":[1],"block":[64]}]
    }"#;

    #[test]
    fn buffer_arguments_name_the_buffer_by_its_index_in_the_problem() {
        let problem = parse_nvrtc(PROBLEM).unwrap();
        // Buffers are sorted by name: h, u, x, y.
        assert_eq!(
            kernel_args(&problem),
            vec![
                ArgValue::Buffer(3),
                ArgValue::Buffer(2),
                ArgValue::U32(64),
                ArgValue::F32(0.5),
                ArgValue::I64(-3),
                ArgValue::Buffer(1),
            ]
        );
    }

    #[test]
    fn initial_contents_are_deterministic_per_buffer_and_in_the_documented_ranges() {
        let problem = parse_nvrtc(PROBLEM).unwrap();
        let contents = initial_contents(&problem);
        assert_eq!(contents, initial_contents(&problem));
        let values: Vec<Vec<f64>> = contents
            .iter()
            .zip(&problem.buffers)
            .map(|(bytes, buffer)| {
                assert_eq!(
                    bytes.len() as u64,
                    buffer.len * buffer.dtype.size_bytes(),
                    "{}",
                    buffer.name
                );
                decode_buffer(bytes, buffer.dtype)
            })
            .collect();
        let [h, u, x, y] = [&values[0], &values[1], &values[2], &values[3]];
        assert!(h.iter().all(|&v| v == 1.0), "ones: {h:?}");
        assert!(y.iter().all(|&v| v == 0.0), "zeros: {y:?}");
        // Random i32 in [-8, 8), u32 in [0, 16), not all equal.
        assert!(x.iter().all(|&v| (-8.0..8.0).contains(&v)), "{x:?}");
        assert!(u.iter().all(|&v| (0.0..16.0).contains(&v)), "{u:?}");
        assert!(x.iter().any(|&v| v != x[0]), "{x:?}");
        // Buffer i is seeded with 1000 + i: x, the third, with 1002.
        assert_eq!(
            contents[2],
            initial_bytes(BufferDtype::I32, BufferInit::Random, 64, 1002)
        );
        // Each buffer has its own seed: same length and init, different data.
        let same_seed = initial_bytes(BufferDtype::I32, BufferInit::Random, 64, 1000);
        let next_seed = initial_bytes(BufferDtype::I32, BufferInit::Random, 64, 1001);
        assert_ne!(same_seed, next_seed);
    }

    #[test]
    fn random_floats_read_back_as_the_values_written() {
        let bytes = initial_bytes(BufferDtype::F32, BufferInit::Random, 8, 7);
        let mut rng = SplitMix64::new(7);
        let want: Vec<f64> = (0..8).map(|_| f64::from(rng.next_signed_unit())).collect();
        assert_eq!(decode_buffer(&bytes, BufferDtype::F32), want);
        let bytes = initial_bytes(BufferDtype::Bf16, BufferInit::Ones, 3, 7);
        assert_eq!(decode_buffer(&bytes, BufferDtype::Bf16), vec![1.0; 3]);
    }
}
