//! How a gemm candidate's output is checked before its time counts, as pure rules: the
//! operands' device bytes (rounded to the element type, so the host reference sees what
//! the GPU sees), which entries of D are sampled and which bytes hold them, and how far an
//! entry may be from the f64 host reference.

use std::ops::Range;

use tunecache_proto::tuner::problem::GemmDtype;

use crate::backend::SplitMix64;
use crate::error::TuneError;

/// Output entries compared with the host reference per algorithm.
pub(super) const GEMM_CHECK_SAMPLES: usize = 256;
/// Columns of D those entries are drawn from: only these columns' checked rows are
/// downloaded, not the whole output.
pub(super) const GEMM_CHECK_COLUMNS: usize = 16;

/// Host values rounded to the element type, and their device bytes.
pub(super) fn encode_gemm_values(values: &mut [f32], dtype: GemmDtype) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for value in values.iter_mut() {
        match dtype {
            GemmDtype::F32 => bytes.extend_from_slice(&value.to_ne_bytes()),
            GemmDtype::F16 => {
                let half = half::f16::from_f32(*value);
                *value = half.to_f32();
                bytes.extend_from_slice(&half.to_bits().to_ne_bytes());
            }
            GemmDtype::Bf16 => {
                let half = half::bf16::from_f32(*value);
                *value = half.to_f32();
                bytes.extend_from_slice(&half.to_bits().to_ne_bytes());
            }
        }
    }
    bytes
}

/// Entry `index` of device bytes holding `dtype` values.
pub(super) fn decode_gemm_value(bytes: &[u8], index: usize, dtype: GemmDtype) -> f64 {
    match dtype {
        GemmDtype::F32 => {
            let raw = [
                bytes[4 * index],
                bytes[4 * index + 1],
                bytes[4 * index + 2],
                bytes[4 * index + 3],
            ];
            f64::from(f32::from_ne_bytes(raw))
        }
        GemmDtype::F16 => {
            let raw = u16::from_ne_bytes([bytes[2 * index], bytes[2 * index + 1]]);
            f64::from(half::f16::from_bits(raw).to_f32())
        }
        GemmDtype::Bf16 => {
            let raw = u16::from_ne_bytes([bytes[2 * index], bytes[2 * index + 1]]);
            f64::from(half::bf16::from_bits(raw).to_f32())
        }
    }
}

/// Tolerance of one checked gemm entry: the output's rounding of the result plus a bound
/// proportional to `sum |a||b|` (the magnitude the error of a dot product scales with:
/// split-K algorithms that reduce partial sums in the output type round those partials, so
/// an entry whose value cancels to near zero can still carry an error of eps * sum |a||b|).
pub fn gemm_tolerance(dtype: GemmDtype, k: usize, want: f64, sum_abs: f64) -> f64 {
    // Unit roundoff of the output type.
    let output = match dtype {
        GemmDtype::F32 => f64::from(f32::EPSILON) / 2.0,
        GemmDtype::F16 => 1.0 / 2048.0,
        GemmDtype::Bf16 => 1.0 / 256.0,
    };
    // f32 accumulation over k terms, at its typical sqrt(k) growth with a margin of 4.
    let accumulation = 4.0 * (k as f64).sqrt() * f64::from(f32::EPSILON) / 2.0;
    output * want.abs() + (output + accumulation) * sum_abs
}

/// Which entries of an `m x n` output to check: up to `columns` distinct columns, each with
/// distinct rows, `samples` entries in all. Column-major storage makes each column's rows
/// one contiguous range, so only those ranges are downloaded.
pub fn check_plan(
    m: usize,
    n: usize,
    samples: usize,
    columns: usize,
    seed: u64,
) -> Vec<(usize, Vec<usize>)> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |count: usize, of: usize| -> Vec<usize> {
        let count = count.min(of);
        let mut chosen = std::collections::BTreeSet::new();
        while chosen.len() < count {
            chosen.insert((rng.next_u64() % of as u64) as usize);
        }
        chosen.into_iter().collect()
    };
    let cols = pick(columns.max(1), n.max(1));
    let rows_per_column = samples.div_ceil(cols.len().max(1));
    cols.into_iter()
        .map(|j| (j, pick(rows_per_column, m.max(1))))
        .collect()
}

/// The bytes of column `j` of a column-major `m`-row output of `element`-byte entries that
/// hold rows `first..=last`: what is downloaded to check that column's sampled rows.
pub(super) fn checked_bytes(
    m: usize,
    element: usize,
    j: usize,
    first: usize,
    last: usize,
) -> Range<usize> {
    (j * m + first) * element..(j * m + last + 1) * element
}

/// Whether entry `(i, j)` of D, `got`, is within `tolerance` of the reference `want`; a NaN
/// never is.
pub(super) fn check_entry(
    (i, j): (usize, usize),
    got: f64,
    want: f64,
    tolerance: f64,
) -> Result<(), TuneError> {
    // NaN must fail too, hence the explicit check.
    if got.is_nan() || (got - want).abs() > tolerance {
        return Err(TuneError::WrongOutput(format!(
            "wrong output at ({i},{j}): {got} vs reference {want} (tolerance {tolerance:e})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_tolerance_admits_split_k_rounding_near_zero_but_not_a_dropped_block() {
        // k = 4096 of values in [-1, 1): sum |a||b| is about k/4.
        let k = 4096;
        let sum_abs = 1024.0;
        // An entry that cancels to 0.1 carrying bf16 rounding of split-K partials (each ~20
        // in size, rounded to 2^-8 relative): the old rule (eps|want| + 1e-4 sqrt(k))
        // allowed 0.0080 here and refused it.
        let old_rule = 1.6e-2 * 0.1 + 1e-4 * (k as f64).sqrt();
        let split_k_error = 4.0 * 20.0 / 256.0;
        assert!(split_k_error > old_rule);
        assert!(split_k_error < gemm_tolerance(GemmDtype::Bf16, k, 0.1, sum_abs));
        // A block of 256 products missing from an f16 entry is an error of ~ sqrt(256/9).
        let dropped = (256.0f64 / 9.0).sqrt();
        assert!(dropped > gemm_tolerance(GemmDtype::F16, k, 0.1, sum_abs));
        // f32 stays tight.
        assert!(gemm_tolerance(GemmDtype::F32, k, 10.0, sum_abs) < 0.02);
    }

    #[test]
    fn the_check_plan_samples_distinct_entries_from_a_few_columns() {
        let plan = check_plan(4096, 4096, 256, 16, 5);
        assert_eq!(plan.len(), 16);
        let total: usize = plan.iter().map(|(_, rows)| rows.len()).sum();
        assert_eq!(total, 256);
        for (j, rows) in &plan {
            assert!(*j < 4096);
            assert!(
                rows.windows(2).all(|w| w[0] < w[1]),
                "sorted, distinct rows"
            );
        }
        // Decode shapes: m = 16 has only 16 rows per column to check.
        let plan = check_plan(16, 4096, 256, 16, 5);
        assert!(plan.iter().all(|(_, rows)| rows.len() == 16));
        // Tiny outputs: everything, once.
        let plan = check_plan(2, 3, 256, 16, 5);
        assert_eq!(plan.len(), 3);
        assert!(plan.iter().all(|(_, rows)| rows == &vec![0, 1]));
    }

    #[test]
    fn the_checked_bytes_are_the_rows_of_one_column() {
        // Column 2 of a 100-row f16 output, rows 10..=19: entries 210..220.
        assert_eq!(checked_bytes(100, 2, 2, 10, 19), 420..440);
        // One row of column 0, f32.
        assert_eq!(checked_bytes(100, 4, 0, 0, 0), 0..4);
        // The last row of the last column ends at the end of D.
        assert_eq!(checked_bytes(100, 4, 63, 99, 99).end, 100 * 64 * 4);
    }

    #[test]
    fn an_entry_passes_within_its_tolerance_and_a_nan_never_does() {
        assert!(check_entry((0, 0), 1.0, 1.0, 0.0).is_ok());
        assert!(check_entry((0, 0), 1.05, 1.0, 0.1).is_ok());
        let error = check_entry((3, 7), 1.2, 1.0, 0.1).unwrap_err().to_string();
        assert!(
            error.starts_with("wrong output at (3,7): 1.2 vs reference 1"),
            "{error}"
        );
        assert!(check_entry((0, 0), f64::NAN, 1.0, f64::INFINITY).is_err());
        assert!(check_entry((0, 0), f64::NAN, f64::NAN, f64::INFINITY).is_err());
    }

    #[test]
    fn operands_are_rounded_to_the_element_type_and_read_back_exactly() {
        // 1 + 2^-12 is not an f16 or bf16 value: the host copy becomes what the GPU sees.
        let odd = 1.0 + 1.0 / 4096.0;
        for (dtype, size) in [
            (GemmDtype::F16, 2),
            (GemmDtype::Bf16, 2),
            (GemmDtype::F32, 4),
        ] {
            let mut values = vec![odd, -0.5, 3.0];
            let bytes = encode_gemm_values(&mut values, dtype);
            assert_eq!(bytes.len(), 3 * size, "{dtype:?}");
            if dtype == GemmDtype::F32 {
                assert_eq!(values[0], odd);
            } else {
                assert_eq!(values[0], 1.0, "{dtype:?} rounds the host copy");
            }
            for (index, value) in values.iter().enumerate() {
                assert_eq!(
                    decode_gemm_value(&bytes, index, dtype),
                    f64::from(*value),
                    "{dtype:?}"
                );
            }
        }
    }
}
