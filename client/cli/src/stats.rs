//! `tunecache stats`: what an operator reads first (a short summary: health, entries, hits
//! and misses, the last snapshot and its error, the cluster tier, untrusted files), every
//! counter with `--all` (or `--json`), and with `--problems` one line per cause of trouble,
//! for launchers that log it (the Slurm prolog writes each to its LOG).

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::proto::StatsResponse;

/// Something an administrator should look at, by cause.
#[derive(Debug, PartialEq, Eq)]
pub struct Problem {
    /// A short stable name (`shared-dir`, `squatting`, ...), what a launcher logs once per.
    pub cause: &'static str,
    pub message: String,
}

/// What is wrong, read from Stats alone.
pub fn problems(stats: &StatsResponse) -> Vec<Problem> {
    let mut found = Vec::new();
    let mut add = |cause, message: String| found.push(Problem { cause, message });
    if !stats.stuck_operation.is_empty() {
        add(
            "shared-dir-stuck",
            format!(
                "the shared directory {} has not answered {} for {}",
                stats.shared_dir,
                stats.stuck_operation,
                age_text(stats.stuck_since_unix_ms)
            ),
        );
    }
    if !stats.last_snapshot_error.is_empty() {
        add(
            "shared-dir",
            format!(
                "{} ({} snapshot errors since start)",
                stats.last_snapshot_error, stats.snapshot_errors
            ),
        );
    }
    if stats.snapshot_squatted_files > 0 {
        add(
            "squatting",
            format!(
                "{} files in {}/v2 are owned by other users yet named after nodes whose \
                 segments this daemon trusts (name squatting; never read; the daemon's log \
                 names their owners)",
                stats.snapshot_squatted_files, stats.shared_dir
            ),
        );
    }
    if !stats.journal_unwritable.is_empty() {
        add(
            "journal",
            format!(
                "the journal cannot be written: {}",
                stats.journal_unwritable
            ),
        );
    }
    if stats.cluster_state.starts_with("down") {
        add(
            "cluster",
            format!(
                "the cluster tier {} is {}",
                stats.cluster_url, stats.cluster_state
            ),
        );
    }
    found
}

/// Prints Stats: the summary, every counter (`all`), or the problems (`problems`); `json`
/// prints the same as one JSON value.
pub fn print(
    stats: &StatsResponse,
    as_json: bool,
    all: bool,
    show_problems: bool,
) -> anyhow::Result<()> {
    if show_problems {
        let found = problems(stats);
        if as_json {
            let list: Vec<Value> = found
                .iter()
                .map(|p| json!({"cause": p.cause, "message": p.message}))
                .collect();
            println!("{}", Value::Array(list));
        } else {
            for problem in found {
                println!("{}\t{}", problem.cause, one_line(&problem.message));
            }
        }
        return Ok(());
    }
    if as_json {
        // Straight from the struct: the fields in proto order.
        println!(
            "{}",
            serde_json::to_string(stats).context("encoding stats")?
        );
        return Ok(());
    }
    if !all {
        for line in summary(stats, now_ms()) {
            println!("{line}");
        }
        return Ok(());
    }
    let Value::Object(figures) = serde_json::to_value(stats).context("encoding stats")? else {
        anyhow::bail!("stats did not encode as an object");
    };
    for (name, value) in figures {
        match value {
            Value::String(text) => println!("{name:<28} {text}"),
            other => println!("{name:<28} {other}"),
        }
    }
    Ok(())
}

/// The summary's lines, as of `now_ms`.
pub fn summary(stats: &StatsResponse, now_ms: i64) -> Vec<String> {
    let found = problems(stats);
    let mut lines = Vec::new();
    let mut line = |label: &str, text: String| lines.push(format!("{label:<12} {text}"));
    line(
        "health",
        if found.is_empty() {
            "OK".to_owned()
        } else {
            let causes: Vec<&str> = found.iter().map(|p| p.cause).collect();
            format!("{} to look at: {}", found.len(), causes.join(", "))
        },
    );
    line(
        "daemon",
        format!(
            "{} on node {}, pid {}, uid {}, up {}",
            stats.version,
            stats.node_name,
            stats.daemon_pid,
            stats.daemon_uid,
            duration_text(stats.uptime_ms.try_into().unwrap_or(i64::MAX))
        ),
    );
    line(
        "entries",
        format!(
            "{} (lookups {}: {} hits, {} misses; {} records)",
            stats.entries, stats.lookups, stats.hits, stats.misses, stats.records
        ),
    );
    let snapshots = if stats.shared_dir.is_empty() {
        "off".to_owned()
    } else {
        let last = if stats.last_snapshot_unix_ms > 0 {
            format!(
                "last written {} ago",
                duration_text(now_ms - stats.last_snapshot_unix_ms)
            )
        } else {
            "none written yet".to_owned()
        };
        let error = if stats.last_snapshot_error.is_empty() {
            String::new()
        } else {
            format!("; last error: {}", one_line(&stats.last_snapshot_error))
        };
        format!(
            "{}: {last}, {} passes, {} own entries published{error}",
            stats.shared_dir, stats.snapshot_passes, stats.own_entries_published
        )
    };
    line("shared dir", snapshots);
    if !stats.shared_dir.is_empty() {
        line(
            "untrusted",
            format!(
                "{} files skipped in the shared directory ({} of them name squatting)",
                stats.snapshot_untrusted_files, stats.snapshot_squatted_files
            ),
        );
    }
    let cluster = if stats.cluster_state.is_empty() || stats.cluster_state == "off" {
        "off".to_owned()
    } else {
        format!("{}: {}", stats.cluster_url, stats.cluster_state)
    };
    line("cluster", cluster);
    line(
        "tuner",
        format!(
            "{} ({}), {} queued",
            stats.tuner_backend, stats.tuner_state, stats.tuner_queue_depth
        ),
    );
    for problem in &found {
        line(
            "problem",
            format!("{}: {}", problem.cause, one_line(&problem.message)),
        );
    }
    line("", "(tunecache stats --all: every counter)".to_owned());
    lines
}

/// A message on one line (a file name or an error may hold a newline).
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How long ago `since_unix_ms` was, in the largest units; "a while" when unknown (0).
pub fn age_text(since_unix_ms: i64) -> String {
    if since_unix_ms <= 0 {
        return "a while".to_owned();
    }
    duration_text(now_ms() - since_unix_ms)
}

/// Milliseconds in the largest units: "850 ms", "12 s", "3 min 4 s", "5 h 2 min".
pub fn duration_text(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{} s", ms / 1_000),
        60_000..=3_599_999 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1_000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> StatsResponse {
        StatsResponse {
            node_name: "n1".into(),
            version: "0.1.0".into(),
            uptime_ms: 3_723_000,
            entries: 12,
            lookups: 10,
            hits: 7,
            misses: 3,
            shared_dir: "/shared/tc".into(),
            last_snapshot_unix_ms: 1_000_000 - 12_000,
            snapshot_passes: 40,
            cluster_state: "off".into(),
            tuner_backend: "cpu".into(),
            tuner_state: "running".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_healthy_daemon_has_no_problem_and_a_short_summary() {
        let stats = healthy();
        assert!(problems(&stats).is_empty());
        let lines = summary(&stats, 1_000_000);
        assert!(lines.len() <= 10, "{lines:#?}");
        assert_eq!(lines[0], "health       OK");
        let text = lines.join("\n");
        for wanted in [
            "12 (lookups 10: 7 hits, 3 misses",
            "/shared/tc: last written 12 s ago, 40 passes",
            "up 1 h 2 min",
            "cluster      off",
            "0 files skipped",
            "--all",
        ] {
            assert!(text.contains(wanted), "no {wanted:?} in:\n{text}");
        }
    }

    #[test]
    fn each_cause_of_trouble_is_one_problem_named_in_the_health_line() {
        let stats = StatsResponse {
            last_snapshot_error: "not creating \"/s/v2\": ...\nas root, install -d".into(),
            snapshot_errors: 3,
            snapshot_squatted_files: 2,
            snapshot_untrusted_files: 9,
            stuck_operation: "loading peer snapshots".into(),
            journal_unwritable: "disk full".into(),
            cluster_state: "down: timed out".into(),
            cluster_url: "redis://r".into(),
            ..healthy()
        };
        let found = problems(&stats);
        let causes: Vec<&str> = found.iter().map(|p| p.cause).collect();
        assert_eq!(
            causes,
            [
                "shared-dir-stuck",
                "shared-dir",
                "squatting",
                "journal",
                "cluster"
            ]
        );
        assert!(found[1].message.contains("3 snapshot errors"));
        let lines = summary(&stats, 1_000_000);
        assert!(
            lines[0].starts_with("health       5 to look at: shared-dir-stuck"),
            "{lines:#?}"
        );
        let text = lines.join("\n");
        assert!(text.contains("9 files skipped in the shared directory (2 of them name squatting)"));
        // Every line is one line, whatever the error held.
        assert!(lines.iter().all(|l| !l.contains('\n')));
    }

    #[test]
    fn durations_read_in_the_largest_units() {
        assert_eq!(duration_text(-5), "0 ms");
        assert_eq!(duration_text(850), "850 ms");
        assert_eq!(duration_text(12_500), "12 s");
        assert_eq!(duration_text(184_000), "3 min 4 s");
        assert_eq!(duration_text(18_120_000), "5 h 2 min");
    }
}
