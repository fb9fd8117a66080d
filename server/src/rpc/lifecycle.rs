//! The lifecycle's RPCs (docs/lifecycle.md): Usage (`tunecache du`), what the cache holds
//! per group and how long ago it was used; Prune (`tunecache prune`), an administrator's
//! expiry of what has not been used for some days, on every node.

use tonic::Status;
use tunecache_proto::v1;

use crate::model::forget::{ForgetAsk, ForgetScope};
use crate::store::expiry::{plan_prune, usage};
use crate::store::{Store, UsageBy};

/// Keys a Prune answer lists; the count covers the rest.
pub const PRUNE_LISTED: usize = 10_000;
/// Forgets a Prune has in flight at once: the writer plans up to 256 queued together.
const PRUNE_IN_FLIGHT: usize = 256;

/// Usage: the current version of the cache, grouped as asked.
pub fn usage_of(store: &Store, request: v1::UsageRequest) -> Result<v1::UsageResponse, Status> {
    let by = match request.by.as_str() {
        "" | "namespace" => UsageBy::Namespace,
        "device" => UsageBy::Device,
        "op" => UsageBy::Op,
        other => {
            return Err(crate::model::validate::InvalidField::new(
                "by",
                format!("{other:?}: expected namespace, device or op"),
            )
            .into())
        }
    };
    let settings = store.lifecycle();
    let today = settings.clock.today();
    let groups = usage(&store.current(), by, today)
        .into_iter()
        .map(|(name, usage)| v1::UsageGroup {
            name,
            entries: usage.entries,
            entry_bytes: usage.entry_bytes,
            artifact_bytes: usage.artifact_bytes,
            by_age: usage.by_age.to_vec(),
        })
        .collect();
    Ok(v1::UsageResponse {
        groups,
        today,
        retain_days: settings.retention.days_for(""),
        max_entries: settings.max_entries,
        journal_bytes: store
            .counters()
            .journal_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Prune, for an administrator: forgets each key unused for `unused_for_days` (only while
/// its result is still the one judged), so every node drops it and a later Record revives
/// it. A dry run lists the same keys and forgets none.
pub async fn prune(store: &Store, request: v1::PruneRequest) -> Result<v1::PruneResponse, Status> {
    let today = store.today();
    let doomed = plan_prune(
        &store.current(),
        today,
        request.unused_for_days,
        &request.namespace,
        &request.device,
    );
    let keys = doomed
        .iter()
        .take(PRUNE_LISTED)
        .map(|entry| entry.key().to_key().into())
        .collect();
    let count = doomed.len() as u64;
    if !request.dry_run {
        for batch in doomed.chunks(PRUNE_IN_FLIGHT) {
            let forgets = batch.iter().map(|entry| {
                let (key, result) = entry.views();
                store.forget(ForgetAsk {
                    scope: ForgetScope::exact(&key.to_key()),
                    only_if: Some((result.config.to_owned(), result.time_us)),
                })
            });
            for forgotten in futures::future::join_all(forgets).await {
                forgotten?;
            }
        }
        tracing::warn!(
            unused_for_days = request.unused_for_days,
            namespace = request.namespace,
            device = request.device,
            count,
            "prune: expired on every node what was unused"
        );
    }
    Ok(v1::PruneResponse { keys, count })
}
