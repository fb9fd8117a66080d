//! `tunecache prune`: an administrator expires now, on every node, what has not been used for
//! some days (Prune, docs/lifecycle.md), or with `--dry-run` lists what would expire. Each key
//! is printed, then the count.

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client, ClientError};

use crate::entry_output::{key_json, key_line};

/// What `prune` expires.
pub struct PruneArgs {
    /// Entries whose last use is more than this many days ago.
    pub unused_for_days: u32,
    /// Only this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// Only this Key.device (`None`: every device).
    pub device: Option<String>,
    pub dry_run: bool,
}

/// `prune`: the keys expired (or that would be) and their count. A refusal (not an
/// administrator: PERMISSION_DENIED) is the command's error, so it exits non-zero with the
/// daemon's message.
pub async fn run(client: &Client, args: PruneArgs, as_json: bool) -> anyhow::Result<()> {
    let request = proto::PruneRequest {
        unused_for_days: args.unused_for_days,
        namespace: args.namespace.unwrap_or_default(),
        device: args.device.unwrap_or_default(),
        dry_run: args.dry_run,
    };
    let pruned = match client.prune(request.clone()).await {
        Ok(pruned) => pruned,
        // A daemon older than lifecycle: say so, not a bare status.
        Err(ClientError::Rpc(status)) if status.code() == tonic::Code::Unimplemented => {
            anyhow::bail!(
                "this tunecached does not answer Prune (it has no lifecycle yet): upgrade the \
                 daemon to prune it"
            )
        }
        Err(error) => return Err(error).context("prune"),
    };
    if as_json {
        println!("{}", document(&request, &pruned));
    } else {
        println!("{}", text(&request, &pruned));
    }
    Ok(())
}

/// Keys the daemon counted but left out of its answer (it lists at most 10,000).
fn left_out(pruned: &proto::PruneResponse) -> u64 {
    pruned.count.saturating_sub(pruned.keys.len() as u64)
}

/// The JSON of `prune --json`: what was asked, `keys` (in key order), `count` and
/// `left_out`.
fn document(request: &proto::PruneRequest, pruned: &proto::PruneResponse) -> Value {
    json!({
        "dry_run": request.dry_run,
        "unused_for_days": request.unused_for_days,
        "namespace": request.namespace,
        "device": request.device,
        "keys": pruned.keys.iter().map(key_json).collect::<Vec<_>>(),
        "count": pruned.count,
        "left_out": left_out(pruned),
    })
}

/// One line per key, then what was done: "expired N" or, on a dry run, "would expire N".
fn text(request: &proto::PruneRequest, pruned: &proto::PruneResponse) -> String {
    let mut lines: Vec<String> = pruned.keys.iter().map(key_line).collect();
    if left_out(pruned) > 0 {
        lines.push(format!("... and {} more not listed", left_out(pruned)));
    }
    let verb = if request.dry_run {
        "would expire"
    } else {
        "expired"
    };
    let mut scope = Vec::new();
    if !request.namespace.is_empty() {
        scope.push(format!("namespace {}", request.namespace));
    }
    if !request.device.is_empty() {
        scope.push(format!("device {}", request.device));
    }
    let scope = if scope.is_empty() {
        String::new()
    } else {
        format!(" of {}", scope.join(", "))
    };
    lines.push(format!(
        "{verb} {} entries{scope} unused for more than {} days",
        pruned.count, request.unused_for_days
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_says_what_would_expire_and_counts_the_unlisted() {
        let request = proto::PruneRequest {
            unused_for_days: 30,
            namespace: "ns".to_owned(),
            device: String::new(),
            dry_run: true,
        };
        let pruned = proto::PruneResponse {
            keys: vec![tunecache_client::key("ns", "gemm", "d", "p", Some(1))],
            count: 3,
        };
        let said = text(&request, &pruned);
        assert_eq!(
            said,
            "ns/gemm [d] p (rank 1)\n... and 2 more not listed\n\
             would expire 3 entries of namespace ns unused for more than 30 days"
        );
        let doc = document(&request, &pruned);
        assert_eq!(doc["left_out"], 2);
        assert_eq!(doc["keys"][0]["op"], "gemm");
        assert_eq!(doc["dry_run"], true);
    }
}
