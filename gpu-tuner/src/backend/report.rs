//! Bounds on what a job reports, so that a good result is never refused for its size.
//!
//! The daemon refuses a result whose config exceeds `MAX_CONFIG_BYTES` (64 KiB), and the
//! config carries one report entry per candidate. A failed NVRTC compile alone can log tens
//! of KiB, so each text is cut here (head and tail kept: NVRTC puts the first error at the
//! start and the error count at the end), the candidate list is shrunk to fit a budget, and
//! [`fit_config`] is the last check before a result leaves the worker.

use serde_json::{json, Value};

use crate::error::TuneError;
use crate::measure::Stats;
use tunecache_proto::limits::MAX_CONFIG_BYTES;

/// Longest text kept in one field of a candidate's report entry.
pub const MAX_FIELD_CHARS: usize = 600;
/// Longest text kept per field once the report has to shrink further.
const TERSE_FIELD_CHARS: usize = 120;
/// Room for the candidate list in a result's config; the rest (winner, stats, method) is
/// far below the other half of `MAX_CONFIG_BYTES`.
pub const REPORT_BUDGET_BYTES: usize = 24 * 1024;
/// Longest job error (`JobDone.error`): the caller gets it in a gRPC status.
pub const MAX_JOB_ERROR_BYTES: usize = 8 * 1024;

/// `text` cut to at most about `max` bytes, keeping its start and end.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let keep = max.saturating_sub(40) / 2;
    let mut head_end = keep;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - keep;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{} [... {} bytes cut ...] {}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

/// Cuts every string inside `value` (objects and arrays included) to `max` bytes.
fn cut_strings(value: &mut Value, max: usize) {
    match value {
        Value::String(text) if text.len() > max => *text = cut(text, max),
        Value::Array(items) => items.iter_mut().for_each(|item| cut_strings(item, max)),
        Value::Object(fields) => fields.values_mut().for_each(|item| cut_strings(item, max)),
        _ => {}
    }
}

fn size(value: &Value) -> usize {
    value.to_string().len()
}

/// Fields of an entry kept when the report must shrink: who it is and what happened.
const TERSE_FIELDS: [&str; 6] = [
    "name",
    "heuristic_rank",
    "tactic",
    "median_us",
    "error",
    "excluded",
];

/// The candidate list shrunk to `budget` bytes: long texts cut first, then entries reduced
/// to their name, time and error, then the last entries replaced by a count.
pub fn bound_report(mut entries: Vec<Value>, budget: usize) -> Vec<Value> {
    entries
        .iter_mut()
        .for_each(|entry| cut_strings(entry, MAX_FIELD_CHARS));
    if size(&Value::Array(entries.clone())) <= budget {
        return entries;
    }
    for entry in entries.iter_mut() {
        if let Value::Object(fields) = entry {
            fields.retain(|key, _| TERSE_FIELDS.contains(&key.as_str()));
        }
        cut_strings(entry, TERSE_FIELD_CHARS);
    }
    if size(&Value::Array(entries.clone())) <= budget {
        return entries;
    }
    // Keep entries while they fit, leaving room for the note about the rest.
    let mut kept = Vec::new();
    let mut used = 2 + 120;
    let total = entries.len();
    for entry in entries {
        let bytes = size(&entry) + 1;
        if used + bytes > budget {
            break;
        }
        used += bytes;
        kept.push(entry);
    }
    let omitted = total - kept.len();
    kept.push(json!({"omitted": omitted, "why": "the report was cut to stay within the daemon's config size limit"}));
    kept
}

/// A job error cut to [`MAX_JOB_ERROR_BYTES`].
pub fn bound_error(text: &str) -> String {
    cut(text, MAX_JOB_ERROR_BYTES)
}

/// Last guard before a result leaves the worker: if the config is still over the daemon's
/// limit, its candidate list is replaced by a count, so the winner is kept.
pub fn fit_config(mut config: Value) -> Value {
    if size(&config) <= MAX_CONFIG_BYTES {
        return config;
    }
    if let Some(candidates) = config.get_mut("candidates") {
        let count = candidates.as_array().map_or(0, Vec::len);
        *candidates = json!([{"omitted": count, "why": "the report was too large for the daemon's config size limit"}]);
    }
    if size(&config) > MAX_CONFIG_BYTES {
        cut_strings(&mut config, TERSE_FIELD_CHARS);
    }
    config
}

/// Writes each measured candidate's figures (median, spread, repeats, runs per sample) into
/// its report entry, or why timing it failed as `"{what}{error}"`, and returns the measured
/// candidates fastest first: what every backend does with `measure_interleaved`'s outcomes.
pub fn record_timings(
    report: &mut [Value],
    outcomes: Vec<(usize, Result<Stats, TuneError>)>,
    what: &str,
) -> Vec<(usize, Stats)> {
    let mut ranked = Vec::new();
    for (index, outcome) in outcomes {
        match outcome {
            Ok(stats) => {
                report[index]["median_us"] = json!(stats.median_us);
                report[index]["spread"] = json!(stats.spread);
                report[index]["repeats"] = json!(stats.repeats);
                report[index]["runs_per_sample"] = json!(stats.runs_per_sample);
                ranked.push((index, stats));
            }
            Err(error) => report[index]["error"] = json!(format!("{what}{error}")),
        }
    }
    ranked.sort_by(|x, y| x.1.median_us.total_cmp(&y.1.median_us));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_go_into_the_report_and_come_back_fastest_first() {
        let stats = |median_us: f64| Stats {
            median_us,
            min_us: median_us,
            max_us: median_us,
            spread: 0.0,
            repeats: 5,
            runs_per_sample: 3,
            backend: "cpu".into(),
            flush_l2: false,
        };
        let mut report = vec![
            json!({"tactic": 0}),
            json!({"tactic": 1}),
            json!({"tactic": 2}),
        ];
        let outcomes = vec![
            (0, Ok(stats(9.0))),
            (1, Err(TuneError::NoDevice("x".into()))),
            (2, Ok(stats(4.0))),
        ];
        let ranked = record_timings(&mut report, outcomes, "timing: ");
        assert_eq!(ranked.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [2, 0]);
        assert_eq!(report[2]["median_us"], json!(4.0));
        assert_eq!(report[0]["runs_per_sample"], json!(3));
        assert_eq!(
            report[1]["error"],
            json!(r#"timing: this worker has no device "x""#)
        );
    }

    #[test]
    fn cut_keeps_head_and_tail_on_char_boundaries() {
        let log = format!("error: first\n{}\n3 errors detected", "é".repeat(5000));
        let short = cut(&log, 200);
        assert!(short.len() <= 240, "{}", short.len());
        assert!(short.starts_with("error: first"), "{short}");
        assert!(short.ends_with("3 errors detected"), "{short}");
        assert!(short.contains("bytes cut"));
        assert_eq!(cut("short", 200), "short");
    }

    /// What a cuda nvrtc result looks like after 64 failed compiles with long logs, and a
    /// winner: it must stay under the daemon's limit and keep the winner.
    #[test]
    fn sixty_four_failed_compiles_with_long_logs_fit_the_config_limit() {
        let log = "x".repeat(40_000);
        let mut entries: Vec<Value> = (0..63)
            .map(|i| json!({"name": format!("cand{i}"), "error": format!("compile: {log}"), "options": vec![log.clone(); 4]}))
            .collect();
        entries.push(json!({"name": "winner", "median_us": 3.5, "spread": 0.01}));
        let unbounded = json!({"candidate": "winner", "candidates": entries.clone()});
        assert!(
            size(&unbounded) > MAX_CONFIG_BYTES,
            "the test must start over the limit"
        );

        let bounded = bound_report(entries, REPORT_BUDGET_BYTES);
        let config = fit_config(json!({"candidate": "winner", "candidates": bounded}));
        assert!(size(&config) <= MAX_CONFIG_BYTES, "{}", size(&config));
        assert!(size(&config["candidates"]) <= REPORT_BUDGET_BYTES);
        assert_eq!(config["candidate"], "winner");
        let listed = config["candidates"].as_array().unwrap();
        assert!(listed[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("compile: xxx"));
        // Either every entry survived in terse form or the rest is counted.
        let named = listed.iter().filter(|e| e.get("name").is_some()).count();
        let omitted = listed
            .iter()
            .find_map(|e| e["omitted"].as_u64())
            .unwrap_or(0) as usize;
        assert_eq!(named + omitted, 64);
    }

    #[test]
    fn a_small_report_is_left_alone_and_an_oversized_config_keeps_its_winner() {
        let entries = vec![json!({"name": "a", "median_us": 1.0, "options": ["-DX=1"]})];
        assert_eq!(bound_report(entries.clone(), REPORT_BUDGET_BYTES), entries);
        let huge = json!({"candidate": "a", "candidates": vec!["y".repeat(1000); 100]});
        let fitted = fit_config(huge);
        assert!(size(&fitted) <= MAX_CONFIG_BYTES);
        assert_eq!(fitted["candidate"], "a");
        assert_eq!(fitted["candidates"][0]["omitted"], 100);
        assert!(bound_error(&"z".repeat(100_000)).len() <= MAX_JOB_ERROR_BYTES + 64);
    }
}
