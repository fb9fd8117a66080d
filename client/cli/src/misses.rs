//! `tunecache misses`: the keys asked in replay that had no answer (ListMisses), per view:
//! what staging must tune next (issue 52, docs/bundles.md).

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client, DEFAULT_TIMEOUT};

use crate::entry_output::{key_json, key_line};
use crate::stats::age_text;

/// Asks the daemon for the misses of `view` (`None`: every view the caller may see).
async fn list_misses(
    client: &Client,
    view: Option<&str>,
) -> anyhow::Result<Vec<proto::ViewMisses>> {
    let mut request = tonic::Request::new(proto::ListMissesRequest {
        view: view.unwrap_or_default().to_owned(),
    });
    request.set_timeout(DEFAULT_TIMEOUT);
    match client.raw().list_misses(request).await {
        Ok(answer) => Ok(answer.into_inner().views),
        // A daemon older than replay: say so, not a bare status.
        Err(status) if status.code() == tonic::Code::Unimplemented => anyhow::bail!(
            "this tunecached does not answer ListMisses (it has no replay yet): upgrade the \
             daemon to list the keys replay missed"
        ),
        Err(status) => Err(status).context("ListMisses"),
    }
}

fn view_json(view: &proto::ViewMisses) -> Value {
    let keys: Vec<Value> = view
        .keys
        .iter()
        .map(|missed| {
            json!({
                "key": missed.key.as_ref().map_or(Value::Null, key_json),
                "count": missed.count,
                "first_unix_ms": missed.first_unix_ms,
                "last_unix_ms": missed.last_unix_ms,
            })
        })
        .collect();
    json!({"view": view.view, "uid": view.uid, "keys": keys, "left_out": view.left_out})
}

/// `misses`: one block per view, one line per key missed.
pub async fn print(client: &Client, view: Option<&str>, as_json: bool) -> anyhow::Result<()> {
    let views = list_misses(client, view).await?;
    if as_json {
        println!("{}", Value::Array(views.iter().map(view_json).collect()));
        return Ok(());
    }
    if views.is_empty() {
        eprintln!("no misses recorded on this node");
        return Ok(());
    }
    for view in &views {
        let name = if view.view.is_empty() {
            "(no view)".to_owned()
        } else {
            format!("view {}", view.view)
        };
        let left_out = match view.left_out {
            0 => String::new(),
            n => format!(", {n} more left out"),
        };
        println!(
            "{name} (uid {}): {} keys missed{left_out}",
            view.uid,
            view.keys.len()
        );
        for missed in &view.keys {
            let key = missed
                .key
                .as_ref()
                .map_or_else(|| "(no key)".to_owned(), key_line);
            println!(
                "  {key}: {} times, first {} ago, last {} ago",
                missed.count,
                age_text(missed.first_unix_ms),
                age_text(missed.last_unix_ms)
            );
        }
    }
    Ok(())
}
