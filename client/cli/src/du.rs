//! `tunecache du`: what the node's cache holds per group (namespace, device or op), from the
//! daemon's Usage: entries, the bytes their records take (what memory and the journal hold),
//! the artifact bytes they name, and how long ago they were last used, as a histogram over the
//! age buckets of docs/lifecycle.md; then the total and the daemon's retention and bound.

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client, ClientError};

/// The age buckets, in the order of `UsageGroup.by_age`: today, 1-7 d, 7-30 d, 30-90 d, older.
/// The labels are the JSON document's keys, so they never change.
pub const BUCKETS: [&str; 5] = ["today", "1-7d", "7-30d", "30-90d", "older"];

/// The width of the longest bar: the fullest bucket of a group fills it.
const BAR_WIDTH: usize = 40;

/// How `du` groups the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    Namespace,
    Device,
    Op,
}

impl GroupBy {
    /// The name Usage takes (`UsageRequest.by`), also the JSON's `by`.
    fn as_str(self) -> &'static str {
        match self {
            GroupBy::Namespace => "namespace",
            GroupBy::Device => "device",
            GroupBy::Op => "op",
        }
    }
}

/// One group's figures (or the total's), its buckets always all five whatever the daemon sent:
/// a missing bucket is 0, so the output has the same shape from every daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Figures {
    entries: u64,
    entry_bytes: u64,
    artifact_bytes: u64,
    by_age: [u64; 5],
}

impl Figures {
    fn of(group: &proto::UsageGroup) -> Figures {
        let mut by_age = [0; 5];
        for (slot, count) in by_age.iter_mut().zip(&group.by_age) {
            *slot = *count;
        }
        Figures {
            entries: group.entries,
            entry_bytes: group.entry_bytes,
            artifact_bytes: group.artifact_bytes,
            by_age,
        }
    }

    fn add(&mut self, other: &Figures) {
        self.entries += other.entries;
        self.entry_bytes += other.entry_bytes;
        self.artifact_bytes += other.artifact_bytes;
        for (sum, count) in self.by_age.iter_mut().zip(other.by_age) {
            *sum += count;
        }
    }

    fn json(&self) -> Value {
        let by_age: serde_json::Map<String, Value> = BUCKETS
            .iter()
            .zip(self.by_age)
            .map(|(label, count)| ((*label).to_owned(), json!(count)))
            .collect();
        json!({
            "entries": self.entries,
            "entry_bytes": self.entry_bytes,
            "artifact_bytes": self.artifact_bytes,
            "by_age": by_age,
        })
    }

    /// The summary line and one bar per bucket, the fullest bucket filling [`BAR_WIDTH`].
    fn lines(&self, title: &str) -> Vec<String> {
        let mut lines = vec![format!(
            "{title}: {} entries, {} in entries, {} of artifacts",
            self.entries,
            size_text(self.entry_bytes),
            size_text(self.artifact_bytes)
        )];
        let fullest = self.by_age.iter().copied().max().unwrap_or_default();
        for (label, count) in BUCKETS.iter().zip(self.by_age) {
            lines.push(format!(
                "  {label:<6} {:<BAR_WIDTH$} {count}",
                bar(count, fullest)
            ));
        }
        lines
    }
}

/// `count` of `fullest` as a bar of `#`: [`BAR_WIDTH`] for the fullest, at least one for any
/// count above 0 (so a bucket with a few entries beside a million still shows), none for 0.
fn bar(count: u64, fullest: u64) -> String {
    if count == 0 || fullest == 0 {
        return String::new();
    }
    let width = (u128::from(count) * BAR_WIDTH as u128 / u128::from(fullest)) as usize;
    "#".repeat(width.clamp(1, BAR_WIDTH))
}

/// Bytes for people: "512 B", "3.4 KiB", "1.2 GiB".
fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A group's name for people: an empty one (an entry without a device) said so.
fn group_title(by: GroupBy, name: &str) -> String {
    if name.is_empty() {
        format!("{} (none)", by.as_str())
    } else {
        format!("{} {name}", by.as_str())
    }
}

/// The stable JSON document of `du --json`: `by`, `today` (the daemon's day, days since the
/// Unix epoch), `retain_days`, `max_entries`, `journal_bytes`, `buckets` (the labels in
/// order), `groups` (name order, each `name` with its figures) and `total`. Figures are
/// `entries`, `entry_bytes`, `artifact_bytes` and `by_age` (an object keyed by bucket label).
fn document(by: GroupBy, usage: &proto::UsageResponse) -> Value {
    let mut total = Figures::default();
    let groups: Vec<Value> = usage
        .groups
        .iter()
        .map(|group| {
            let figures = Figures::of(group);
            total.add(&figures);
            let mut value = figures.json();
            value["name"] = json!(group.name);
            value
        })
        .collect();
    json!({
        "by": by.as_str(),
        "today": usage.today,
        "retain_days": usage.retain_days,
        "max_entries": usage.max_entries,
        "journal_bytes": usage.journal_bytes,
        "buckets": BUCKETS,
        "groups": groups,
        "total": total.json(),
    })
}

/// The text of `du`: a block per group, the total's block, then the daemon's limits.
fn text(by: GroupBy, usage: &proto::UsageResponse) -> String {
    let mut lines = Vec::new();
    let mut total = Figures::default();
    for group in &usage.groups {
        let figures = Figures::of(group);
        total.add(&figures);
        lines.extend(figures.lines(&group_title(by, &group.name)));
    }
    if usage.groups.is_empty() {
        lines.push("the cache holds no entries".to_owned());
    }
    let title = format!(
        "total ({} groups; journal file {})",
        usage.groups.len(),
        size_text(usage.journal_bytes)
    );
    lines.extend(total.lines(&title));
    let retention = match usage.retain_days {
        0 => "entries are kept however long unused (--retain-days 0)".to_owned(),
        days => format!(
            "entries expire {days} days after their last use (--retain-days; --retain may set \
             a namespace apart)"
        ),
    };
    let bound = match usage.max_entries {
        0 => "no bound on the number of entries (--max-entries 0)".to_owned(),
        max => {
            format!("at most {max} entries, the least recently used expiring first (--max-entries)")
        }
    };
    lines.push(format!("retention: {retention}"));
    lines.push(format!("bound: {bound}"));
    lines.join("\n")
}

/// `du`: asks the daemon for its usage grouped `by` and prints it.
pub async fn print(client: &Client, by: GroupBy, as_json: bool) -> anyhow::Result<()> {
    let usage = match client.usage(by.as_str()).await {
        Ok(usage) => usage,
        // A daemon older than lifecycle: say so, not a bare status.
        Err(ClientError::Rpc(status)) if status.code() == tonic::Code::Unimplemented => {
            anyhow::bail!(
                "this tunecached does not answer Usage (it has no lifecycle yet): upgrade the \
                 daemon to see what its cache holds"
            )
        }
        Err(error) => return Err(error).context("Usage"),
    };
    if as_json {
        println!("{}", document(by, &usage));
    } else {
        println!("{}", text(by, &usage));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, by_age: Vec<u64>) -> proto::UsageGroup {
        proto::UsageGroup {
            name: name.to_owned(),
            entries: by_age.iter().sum(),
            entry_bytes: 2048,
            artifact_bytes: 0,
            by_age,
        }
    }

    #[test]
    fn bars_scale_to_the_fullest_bucket_and_never_hide_a_count() {
        assert_eq!(bar(0, 10), "");
        assert_eq!(bar(10, 10).len(), BAR_WIDTH);
        assert_eq!(bar(5, 10).len(), BAR_WIDTH / 2);
        assert_eq!(bar(1, 1_000_000), "#");
        assert_eq!(bar(0, 0), "");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size_text(0), "0 B");
        assert_eq!(size_text(1023), "1023 B");
        assert_eq!(size_text(1536), "1.5 KiB");
        assert_eq!(size_text(3 << 30), "3.0 GiB");
    }

    #[test]
    fn the_document_has_every_bucket_and_the_total() {
        let usage = proto::UsageResponse {
            // A short by_age (an older or damaged answer) reads as zeros, not a shorter list.
            groups: vec![group("a", vec![3, 0, 0, 1, 0]), group("b", vec![2])],
            today: 20_000,
            retain_days: 90,
            max_entries: 10,
            journal_bytes: 7,
        };
        let doc = document(GroupBy::Namespace, &usage);
        assert_eq!(doc["by"], "namespace");
        assert_eq!(doc["groups"][1]["name"], "b");
        assert_eq!(doc["groups"][1]["by_age"]["older"], 0);
        assert_eq!(doc["total"]["entries"], 6);
        assert_eq!(doc["total"]["by_age"]["today"], 5);
        assert_eq!(doc["total"]["by_age"]["30-90d"], 1);
        assert_eq!(doc["total"]["entry_bytes"], 4096);
        let text = text(GroupBy::Namespace, &usage);
        assert!(
            text.contains("namespace a: 4 entries, 2.0 KiB in entries"),
            "{text}"
        );
        assert!(text.contains("retention: entries expire 90 days"), "{text}");
        assert!(text.contains("at most 10 entries"), "{text}");
    }
}
