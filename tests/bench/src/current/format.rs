//! How every table writes its figures (milliseconds, bytes, ratios, grouped digits, a
//! target's verdict), and the lenient reads of untyped JSON they are taken from (a missing
//! figure reads as NaN, 0 or "", so older runs' output still renders).

use serde_json::Value;

/// Milliseconds the way every table writes them.
pub fn ms(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1} s", value / 1e3)
    } else if value >= 100.0 {
        format!("{value:.0} ms")
    } else if value >= 1.0 {
        format!("{value:.1} ms")
    } else {
        format!("{value:.2} ms")
    }
}

/// Bytes in binary units.
pub fn bytes(value: u64) -> String {
    let value = value as f64;
    if value >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", value / (1024.0 * 1024.0))
    } else if value >= 1024.0 {
        format!("{:.0} KiB", value / 1024.0)
    } else {
        format!("{value:.0} B")
    }
}

/// A ratio with two decimals below 10, one above.
pub fn times(ratio: f64) -> String {
    if ratio < 10.0 {
        format!("{ratio:.2}x")
    } else {
        format!("{ratio:.1}x")
    }
}

/// An integer with thousands separators.
pub(super) fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The `goals` of a drop-in benchmark's results (`what`, `ratio`, `met`) as a table whose first
/// column is headed `heading`; nothing when there are none.
pub(super) fn goals_table(results: &Value, heading: &str) -> String {
    let goals = array(results, "goals");
    if goals.is_empty() {
        return String::new();
    }
    let mut out = format!("\n| {heading} | drop-in / floor | verdict |\n|---|---:|---|\n");
    for goal in goals {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            text(goal, "what"),
            times(num(goal, "ratio")),
            verdict(goal.get("met").and_then(Value::as_bool).unwrap_or(false))
        ));
    }
    out
}

pub(super) fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

pub(super) fn num(value: &Value, key: &str) -> f64 {
    value.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

pub(super) fn uint(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn seconds(value: Option<f64>) -> String {
    value
        .filter(|value| value.is_finite())
        .map(|value| format!("{:.2} s", value / 1e3))
        .unwrap_or_else(|| "–".to_owned())
}

/// Microseconds, as ms from 1 ms up.
pub(super) fn micros(value: f64) -> String {
    if value >= 1_000.0 {
        ms(value / 1e3)
    } else {
        format!("{value:.1} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(381), "381");
        assert_eq!(grouped(24_003), "24,003");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }
}
