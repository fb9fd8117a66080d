//! How an entry is printed: one line for people, or a JSON object for scripts.

use serde_json::{json, Value};
use tunecache_client::proto;

pub fn key_json(key: &proto::Key) -> Value {
    json!({
        "namespace": key.namespace,
        "op": key.op,
        "device": key.device,
        "problem": key.problem,
        "rank": key.rank,
    })
}

fn artifact_json(artifact: &proto::Artifact) -> Value {
    json!({"name": artifact.name, "sha256": artifact.sha256, "size": artifact.size})
}

pub fn entry_json(entry: &proto::Entry) -> Value {
    let key = entry.key.as_ref().map(key_json).unwrap_or(Value::Null);
    let result = entry.result.as_ref().map_or(Value::Null, |r| {
        json!({
            // The daemon only stores valid JSON configs; fall back to the text regardless.
            "config": serde_json::from_str::<Value>(&r.config).unwrap_or_else(|_| Value::String(r.config.clone())),
            "time_us": r.time_us,
            "tuned_by": r.tuned_by,
            "tuned_at_unix_ms": r.tuned_at_unix_ms,
            "artifacts": r.artifacts.iter().map(artifact_json).collect::<Vec<_>>(),
        })
    });
    json!({ "key": key, "result": result })
}

/// A key for people: `namespace/op [device] problem (shared)`, or `(rank N)`.
pub fn key_line(k: &proto::Key) -> String {
    let rank = k
        .rank
        .map_or_else(|| "shared".to_owned(), |n| format!("rank {n}"));
    format!(
        "{}/{} [{}] {} ({})",
        k.namespace, k.op, k.device, k.problem, rank
    )
}

pub fn entry_line(entry: &proto::Entry) -> String {
    let (Some(k), Some(r)) = (&entry.key, &entry.result) else {
        return String::from("(incomplete entry)");
    };
    let mut line = format!(
        "{}: {} in {:.3} us by {}",
        key_line(k),
        r.config,
        r.time_us,
        r.tuned_by
    );
    if !r.artifacts.is_empty() {
        let files: Vec<String> = r
            .artifacts
            .iter()
            .map(|a| format!("{} ({} bytes, sha256 {})", a.name, a.size, a.sha256))
            .collect();
        line.push_str(&format!("; artifacts: {}", files.join(", ")));
    }
    line
}
