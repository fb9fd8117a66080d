//! The config of a GEMM timing group, both ways: `{choice_hash: timing_ms}` as compact JSON
//! with its names sorted, and the time the merge rule compares. Inductor records a failed or
//! skipped choice as `inf` (and may record `nan`), which plain JSON cannot spell and a config
//! must be plain JSON, so a non-finite timing is the string `"inf"`, `"-inf"` or `"nan"`
//! (Python's `float()` reads each back).

use crate::pyjson::{self, Layout, Value};

fn nonfinite_name(timing: f64) -> Option<&'static str> {
    if timing.is_nan() {
        Some("nan")
    } else if timing == f64::INFINITY {
        Some("inf")
    } else if timing == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// The config of a timing group: compact JSON, names sorted, finite timings spelled as Python's
/// `repr` (so the text is `json.dumps(dict(sorted(timings)), separators=(",", ":"))` with the
/// non-finite ones as strings). A choice listed twice keeps its last timing, as a dict would.
pub fn timings_config(timings: &[(String, f64)]) -> String {
    let mut members: Vec<(String, Value)> = Vec::with_capacity(timings.len());
    for (choice, timing) in timings {
        let value = match nonfinite_name(*timing) {
            Some(name) => Value::String(name.to_owned()),
            None => Value::float(*timing),
        };
        pyjson::set_member(&mut members, choice, value);
    }
    members.sort_by(|(a, _), (b, _)| a.cmp(b));
    pyjson::write(&Value::Object(members), Layout::Compact)
}

/// The timings a config built by [`timings_config`] holds, in its order. Refused, with the
/// reason, for anything but an object of numbers and the strings `"inf"`, `"-inf"`, `"nan"`.
pub fn timings_of(config: &str) -> Result<Vec<(String, f64)>, String> {
    let value = pyjson::parse(config).map_err(|error| format!("config: {error}"))?;
    let members = value
        .as_object()
        .ok_or("config: not a JSON object of timings")?;
    members
        .iter()
        .map(|(choice, value)| {
            let timing = match value {
                Value::String(text) => match text.as_str() {
                    "inf" => Some(f64::INFINITY),
                    "-inf" => Some(f64::NEG_INFINITY),
                    "nan" => Some(f64::NAN),
                    _ => None,
                },
                other => other.as_f64(),
            };
            timing
                .map(|timing| (choice.clone(), timing))
                .ok_or_else(|| format!("config: the timing of {choice:?} is not a number"))
        })
        .collect()
}

/// `Result.time_us` of a timing group: its best (smallest finite) timing, in µs, which the
/// merge rule keeps the lower of; 0.0 when no choice has a finite timing. A negative timing
/// (never measured) counts as 0.0, the least time the daemon accepts.
pub fn timings_time_us(timings: &[(String, f64)]) -> f64 {
    timings
        .iter()
        .map(|(_, timing)| *timing)
        .filter(|timing| timing.is_finite())
        .reduce(f64::min)
        .map_or(0.0, |best| (best * 1000.0).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(items: &[(&str, f64)]) -> Vec<(String, f64)> {
        items
            .iter()
            .map(|(choice, timing)| ((*choice).to_owned(), *timing))
            .collect()
    }

    #[test]
    fn timings_come_back_non_finite_ones_included() {
        let written = timings(&[
            ("b", 0.012345678901234568),
            ("a", f64::INFINITY),
            ("c", f64::NAN),
            ("d", f64::NEG_INFINITY),
            ("e", 1e-05),
            ("f", 2.0),
        ]);
        let config = timings_config(&written);
        assert_eq!(
            config,
            r#"{"a":"inf","b":0.012345678901234568,"c":"nan","d":"-inf","e":1e-05,"f":2.0}"#
        );
        let read = timings_of(&config).unwrap();
        assert_eq!(read.len(), written.len());
        for (choice, timing) in &written {
            let (_, back) = read.iter().find(|(name, _)| name == choice).unwrap();
            assert!(
                back.to_bits() == timing.to_bits() || (back.is_nan() && timing.is_nan()),
                "{choice}: {back} for {timing}"
            );
        }
        assert_eq!(timings_time_us(&read), 1e-05 * 1000.0);
        assert_eq!(
            timings_config(&timings(&[("x", 1.0), ("x", 3.0)])),
            r#"{"x":3.0}"#
        );
    }

    #[test]
    fn the_time_is_the_best_finite_timing() {
        assert_eq!(timings_time_us(&timings(&[("a", 0.5), ("b", 0.25)])), 250.0);
        assert_eq!(timings_time_us(&timings(&[("a", f64::INFINITY)])), 0.0);
        assert_eq!(timings_time_us(&[]), 0.0);
        assert_eq!(timings_time_us(&timings(&[("a", -1.0)])), 0.0);
    }

    #[test]
    fn configs_that_are_not_timings_are_refused() {
        for bad in [
            "[]",
            "1",
            r#"{"a":"1.0"}"#,
            r#"{"a":null}"#,
            r#"{"a":[1]}"#,
            "{",
        ] {
            assert!(timings_of(bad).is_err(), "{bad}");
        }
        assert_eq!(timings_of("{}").unwrap(), vec![]);
    }
}
