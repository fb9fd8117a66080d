//! The commands that change the cache: `put` (a result, its files uploaded first, under a
//! lease when given one) and `forget`.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;
use tunecache_client::{proto, Client, TuneLease};

use crate::KeyArgs;

/// What `put` records.
pub struct PutArgs {
    pub key: KeyArgs,
    pub config: String,
    pub time_us: f64,
    pub tuned_by: String,
    pub lease_id: String,
    pub artifacts: Vec<(String, PathBuf)>,
}

/// `put`: uploads the files, then Records the result naming them.
pub async fn put(client: &Client, args: PutArgs, as_json: bool) -> anyhow::Result<()> {
    let PutArgs {
        key,
        config,
        time_us,
        tuned_by,
        lease_id,
        artifacts,
    } = args;
    // Uploaded before the Record: the daemon refuses a Record naming a blob it lacks.
    let artifacts = match client.put_artifacts(artifacts).await {
        Ok(artifacts) => artifacts,
        Err(error) => {
            // Nothing will be Recorded under the lease: give it up, as a failed tuning
            // does, so that a waiter tunes at once.
            if !lease_id.is_empty() {
                let _ = client.give_up_lease(lease_id).await;
            }
            return Err(anyhow::Error::new(error).context("uploading artifacts"));
        }
    };
    let (key, result) = (
        key.to_key(),
        proto::Result {
            config,
            time_us,
            tuned_by,
            tuned_at_unix_ms: tunecache_proto::unix_now_ms(),
            forget_epoch: 0,
            artifacts,
        },
    );
    let response = if lease_id.is_empty() {
        let entry = proto::Entry {
            key: Some(key),
            result: Some(result),
        };
        client.record(vec![entry]).await.context("record")?
    } else {
        // Under the lease: a failed Record gives it up, as every client does
        // (tunecache_client::tuning).
        let lease = TuneLease::from_parts(
            key,
            proto::Lease {
                lease_id,
                expires_in_ms: 0,
            },
        );
        client
            .finish_tune(lease, result)
            .await
            .map_err(|failed| failed.error)
            .context("record")?
    };
    if as_json {
        println!(
            "{}",
            json!({"stored": response.stored, "unchanged": response.unchanged})
        );
    } else if response.stored == 1 {
        println!("stored");
    } else {
        println!("unchanged (the cache holds a result at least as good)");
    }
    Ok(())
}

/// What `forget` forgets.
pub struct ForgetArgs {
    pub namespace: String,
    pub op: String,
    pub device: String,
    pub problem: String,
    pub rank: Option<u32>,
    pub only_if_config: Option<String>,
    pub only_if_time_us: Option<f64>,
}

/// `forget`: prints how many entries this node dropped.
pub async fn forget(client: &Client, args: ForgetArgs, as_json: bool) -> anyhow::Result<()> {
    let ForgetArgs {
        namespace,
        op,
        device,
        problem,
        rank,
        only_if_config,
        only_if_time_us,
    } = args;
    // clap makes the two --only-if flags come together; the daemon compares only the
    // config and time_us of `only_if`.
    let only_if = only_if_config
        .zip(only_if_time_us)
        .map(|(config, time_us)| proto::Result {
            config,
            time_us,
            ..Default::default()
        });
    let request = proto::ForgetRequest {
        namespace,
        op,
        device,
        problem,
        rank,
        only_if,
    };
    let forgotten = client.forget(request).await.context("forget")?;
    if as_json {
        println!("{}", json!({ "forgotten": forgotten }));
    } else {
        println!("forgotten {forgotten}");
    }
    Ok(())
}
