//! The correctness reference every gemm tactic is checked against, on the CPU and the GPU:
//! the column-major gemm shape of a problem, deterministic operands, and the product by its
//! definition, accumulated in f64.

use super::SplitMix64;
use tunecache_proto::tuner::problem::GemmProblem;

/// Shape and layout of a column-major gemm (see `tunecache_proto::tuner::problem`).
#[derive(Debug, Clone, Copy)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transpose_a: bool,
    pub transpose_b: bool,
}

impl GemmShape {
    pub fn from_problem(problem: &GemmProblem) -> Self {
        GemmShape {
            m: problem.m as usize,
            n: problem.n as usize,
            k: problem.k as usize,
            transpose_a: problem.layout.transpose_a(),
            transpose_b: problem.layout.transpose_b(),
        }
    }

    /// `op(A)[i, p]`.
    #[inline]
    pub fn a_index(&self, i: usize, p: usize) -> usize {
        if self.transpose_a {
            p + i * self.k
        } else {
            i + p * self.m
        }
    }

    /// `op(B)[p, j]`.
    #[inline]
    pub fn b_index(&self, p: usize, j: usize) -> usize {
        if self.transpose_b {
            j + p * self.n
        } else {
            p + j * self.k
        }
    }
}

/// `c = op(a) · op(b)` by definition, accumulating in f64.
pub fn naive_matmul(shape: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
    for j in 0..shape.n {
        for i in 0..shape.m {
            c[i + j * shape.m] = reference_entry(shape, a, b, i, j) as f32;
        }
    }
}

/// One entry of `op(a) · op(b)`, accumulated in f64.
pub fn reference_entry(shape: &GemmShape, a: &[f32], b: &[f32], i: usize, j: usize) -> f64 {
    (0..shape.k)
        .map(|p| f64::from(a[shape.a_index(i, p)]) * f64::from(b[shape.b_index(p, j)]))
        .sum()
}

/// One entry of `op(a) · op(b)` and `sum |a||b|` over its products (the scale its rounding
/// error grows with), both accumulated in f64.
pub fn reference_entry_with_magnitude(
    shape: &GemmShape,
    a: &[f32],
    b: &[f32],
    i: usize,
    j: usize,
) -> (f64, f64) {
    (0..shape.k).fold((0.0, 0.0), |(sum, magnitude), p| {
        let product = f64::from(a[shape.a_index(i, p)]) * f64::from(b[shape.b_index(p, j)]);
        (sum + product, magnitude + product.abs())
    })
}

/// Inputs of a gemm, deterministic, in [-1, 1).
pub fn random_operands(shape: &GemmShape, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let a = (0..shape.m * shape.k)
        .map(|_| rng.next_signed_unit())
        .collect();
    let b = (0..shape.k * shape.n)
        .map(|_| rng.next_signed_unit())
        .collect();
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naive_matmul_is_the_definition() {
        // [1 2; 3 4] (column-major 1,3,2,4) times [5 6; 7 8] = [19 22; 43 50].
        let shape = GemmShape {
            m: 2,
            n: 2,
            k: 2,
            transpose_a: false,
            transpose_b: false,
        };
        let mut c = vec![0.0; 4];
        naive_matmul(&shape, &[1.0, 3.0, 2.0, 4.0], &[5.0, 7.0, 6.0, 8.0], &mut c);
        assert_eq!(c, vec![19.0, 43.0, 22.0, 50.0]);
        let transposed = GemmShape {
            transpose_a: true,
            ..shape
        };
        naive_matmul(
            &transposed,
            &[1.0, 3.0, 2.0, 4.0],
            &[5.0, 7.0, 6.0, 8.0],
            &mut c,
        );
        // A^T = [1 3; 2 4]: [26 30; 38 44].
        assert_eq!(c, vec![26.0, 38.0, 30.0, 44.0]);
        // Entry (0,0) of [1 -2] · [3; 4] is 3 - 8 = -5 from products of size 3 + 8.
        let row = GemmShape {
            m: 1,
            n: 1,
            k: 2,
            transpose_a: false,
            transpose_b: false,
        };
        assert_eq!(
            reference_entry_with_magnitude(&row, &[1.0, -2.0], &[3.0, 4.0], 0, 0),
            (-5.0, 11.0)
        );
    }
}
