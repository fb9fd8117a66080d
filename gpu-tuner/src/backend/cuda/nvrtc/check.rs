//! The `check` of an nvrtc problem, as pure rules: which candidate's output is the
//! reference, and whether another candidate's checked buffer agrees with it and with the
//! expected sum, within `|x - y| <= atol + rtol * |y|` (`y` the reference).

use std::collections::BTreeMap;

use tunecache_proto::tuner::problem::CheckSpec;

use crate::backend::report::bound_error;
use crate::error::TuneError;

/// The index of the `reference` candidate among `names`, if it compiled; else why the job
/// cannot be checked (with the reference's own compile error from `errors`, if it had one).
pub(super) fn reference_candidate(
    names: &[String],
    reference: &str,
    compiled: impl Fn(usize) -> bool,
    errors: &BTreeMap<usize, String>,
) -> Result<usize, TuneError> {
    let position = names.iter().position(|n| n == reference);
    match position.filter(|&i| compiled(i)) {
        Some(index) => Ok(index),
        None => {
            let why = position
                .and_then(|i| errors.get(&i).cloned())
                .unwrap_or_default();
            Err(TuneError::NothingRan(bound_error(&format!(
                "reference candidate {reference:?} did not compile and run: {why}"
            ))))
        }
    }
}

/// Whether `got`, a candidate's checked buffer, passes `check`: element-wise against the
/// reference candidate's buffer (`want`, when the check names a reference) and its sum
/// against `expected_sum`. A NaN never passes. `Err` says where it does not.
pub(super) fn check_output(
    got: &[f64],
    check: &CheckSpec,
    want: Option<&[f64]>,
) -> Result<(), TuneError> {
    let close = |x: f64, y: f64| (x - y).abs() <= check.atol + check.rtol * y.abs();
    if let (Some(want), Some(reference)) = (want, &check.reference) {
        if let Some((i, (g, w))) = got
            .iter()
            .zip(want)
            .enumerate()
            .find(|(_, (g, w))| !close(**g, **w) || g.is_nan())
        {
            return Err(TuneError::WrongOutput(format!(
                "disagrees with reference {reference:?} at {}[{i}]: {g} vs {w}",
                check.buffer
            )));
        }
    }
    if let Some(expected) = check.expected_sum {
        let sum: f64 = got.iter().sum();
        if !close(sum, expected) || sum.is_nan() {
            return Err(TuneError::WrongOutput(format!(
                "its sum of {} is {sum}, expected {expected}",
                check.buffer
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        reference: Option<&str>,
        expected_sum: Option<f64>,
        rtol: f64,
        atol: f64,
    ) -> CheckSpec {
        CheckSpec {
            buffer: "y".to_string(),
            reference: reference.map(str::to_string),
            expected_sum,
            rtol,
            atol,
        }
    }

    #[test]
    fn the_tolerance_is_relative_to_the_reference() {
        let spec = check(Some("b128"), None, 0.5, 0.0);
        // |0.5 - 1| = 0.5 <= 0.5 * |1|; relative to the candidate it would be 0.25.
        assert!(check_output(&[0.5], &spec, Some(&[1.0])).is_ok());
        // |2 - 1| = 1 > 0.5 * |1|.
        let error = check_output(&[1.0, 2.0], &spec, Some(&[1.0, 1.0]))
            .unwrap_err()
            .to_string();
        assert_eq!(error, "disagrees with reference \"b128\" at y[1]: 2 vs 1");
        // atol adds to it.
        let spec = check(Some("b128"), None, 0.0, 0.25);
        assert!(check_output(&[1.25], &spec, Some(&[1.0])).is_ok());
        assert!(check_output(&[1.5], &spec, Some(&[1.0])).is_err());
    }

    #[test]
    fn a_nan_fails_element_wise_and_in_the_sum() {
        let spec = check(Some("b128"), None, 1.0, f64::INFINITY);
        assert!(check_output(&[f64::NAN], &spec, Some(&[1.0])).is_err());
        let spec = check(None, Some(1.0), 1.0, f64::INFINITY);
        let error = check_output(&[f64::NAN], &spec, None)
            .unwrap_err()
            .to_string();
        assert_eq!(error, "its sum of y is NaN, expected 1");
    }

    #[test]
    fn the_sum_is_checked_with_or_without_a_reference() {
        let spec = check(None, Some(6.0), 0.0, 1e-9);
        assert!(check_output(&[1.0, 2.0, 3.0], &spec, None).is_ok());
        assert!(check_output(&[1.0, 2.0, 4.0], &spec, None).is_err());
        // Both: the element-wise check passes, the sum does not.
        let spec = check(Some("b128"), Some(7.0), 0.0, 1e-9);
        let error = check_output(&[1.0, 2.0, 3.0], &spec, Some(&[1.0, 2.0, 3.0]))
            .unwrap_err()
            .to_string();
        assert_eq!(error, "its sum of y is 6, expected 7");
        // No reference in the check: a reference buffer, if any, is not compared.
        let spec = check(None, Some(6.0), 0.0, 1e-9);
        assert!(check_output(&[1.0, 2.0, 3.0], &spec, Some(&[9.0, 9.0, 9.0])).is_ok());
    }

    #[test]
    fn the_reference_must_have_compiled() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let errors = BTreeMap::from([(1, "compile: error: expected a ';'".to_string())]);
        let compiled = |i: usize| i != 1;
        assert_eq!(
            reference_candidate(&names, "c", compiled, &errors).unwrap(),
            2
        );
        let error = reference_candidate(&names, "b", compiled, &errors)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "reference candidate \"b\" did not compile and run: compile: error: expected a ';'"
        );
        // Excluded or otherwise not built, without a recorded error.
        let error = reference_candidate(&names, "a", |_| false, &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert_eq!(error, "reference candidate \"a\" did not compile and run: ");
    }
}
