//! Publishes this node's improved results: drains the publish queue in batches and runs the
//! merge script for each entry (all of a batch in flight at once on the multiplexed
//! connection, i.e. pipelined). The script stores a better result and appends it to its
//! shard's stream in one atomic step, so a batch that timed out and is sent again can never
//! leave a result stored but unannounced: Redis ran each script wholly or not at all, and a
//! rerun finds its own result there and changes nothing. A result Redis already beats comes
//! back and is learned here. Between batches it drains the lifecycle's queues (`lifecycle`):
//! last uses to carry, expired entries to delete.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;
use redis::Value;
use tokio_util::sync::CancellationToken;

use super::keys::{encode_day, encode_result, Layout};
use super::link::{Conn, BACKGROUND_TIMEOUT};
use super::refusals::{self, ReadFrom};
use super::values;
use super::{scripts, Cluster};
use crate::error::{TierError, TierResult};
use crate::model::entry::{CacheKey, TunedResult};

/// Entries per batch: one round of merge scripts.
const BATCH: usize = 256;

pub async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut seen_generation = 0;
    loop {
        let Some((conn, generation)) = cluster.redis.link.conn() else {
            wait_reconnect(&cluster, seen_generation, &stop).await;
            if stop.is_cancelled() {
                return;
            }
            continue;
        };
        seen_generation = generation;
        if cluster.queue.republish_all.swap(false, Ordering::Relaxed) {
            cluster
                .queue
                .publishing
                .store(usize::MAX, Ordering::Relaxed);
            let outcome = republish_all(&cluster, conn.clone()).await;
            cluster.queue.publishing.store(0, Ordering::Relaxed);
            if let Err(why) = outcome {
                cluster.queue.republish_all.store(true, Ordering::Relaxed);
                cluster.redis.link.failed(generation, &why);
                wait_reconnect(&cluster, generation, &stop).await;
                if stop.is_cancelled() {
                    return;
                }
                continue;
            }
        }
        let forgets = take_forgets(&cluster);
        if !forgets.is_empty() {
            if let Err(why) = super::forget::publish(&cluster, &conn, &forgets).await {
                put_back_forgets(&cluster, forgets);
                cluster.redis.link.failed(generation, &why);
                wait_reconnect(&cluster, generation, &stop).await;
                if stop.is_cancelled() {
                    return;
                }
                continue;
            }
        }
        if let Err(why) = super::lifecycle::drain(&cluster, &conn).await {
            cluster.redis.link.failed(generation, &why);
            wait_reconnect(&cluster, generation, &stop).await;
            if stop.is_cancelled() {
                return;
            }
            continue;
        }
        let batch: Vec<(CacheKey, TunedResult)> = {
            let mut pending = cluster.lock_pending();
            let keys: Vec<CacheKey> = pending.entries.keys().take(BATCH).cloned().collect();
            let batch: Vec<_> = keys
                .into_iter()
                .filter_map(|k| pending.entries.remove_entry(&k))
                .collect();
            // Counted while the queue's lock is held, so the queue and this count are never
            // both empty while a result is on its way.
            cluster
                .queue
                .publishing
                .store(batch.len(), Ordering::Relaxed);
            batch
        };
        if batch.is_empty() {
            let forgets_waiting = !crate::sync::lock(&cluster.queue.forgets).is_empty();
            if forgets_waiting || !cluster.lifecycle.is_empty() {
                continue;
            }
            tokio::select! {
                () = cluster.queue.wake.notified() => {}
                () = stop.cancelled() => return,
            }
            continue;
        }
        let outcome = publish_batch(&cluster, conn, &batch).await;
        if let Err(why) = outcome {
            // Put the batch back unless newer (better) results replaced it meanwhile.
            {
                let mut pending = cluster.lock_pending();
                for (key, result) in batch {
                    pending.entries.entry(key).or_insert(result);
                }
                cluster.queue.publishing.store(0, Ordering::Relaxed);
            }
            cluster.redis.link.failed(generation, &why);
            wait_reconnect(&cluster, generation, &stop).await;
            if stop.is_cancelled() {
                return;
            }
        } else {
            cluster.queue.publishing.store(0, Ordering::Relaxed);
        }
    }
}

fn take_forgets(cluster: &Cluster) -> Vec<crate::model::forget::Tombstone> {
    std::mem::take(&mut *crate::sync::lock(&cluster.queue.forgets))
}

/// Puts tombstones that failed to publish back in front of any queued meanwhile.
fn put_back_forgets(cluster: &Cluster, forgets: Vec<crate::model::forget::Tombstone>) {
    let mut pending = crate::sync::lock(&cluster.queue.forgets);
    let newer = std::mem::replace(&mut *pending, forgets);
    pending.extend(newer);
}

async fn wait_reconnect(cluster: &Cluster, generation: u64, stop: &CancellationToken) {
    tokio::select! {
        () = cluster.redis.link.wait_newer(generation) => {}
        () = stop.cancelled() => {}
    }
}

/// Publishes every entry of the store: after a flushed or replaced server, or a queue
/// overflow.
async fn republish_all(cluster: &Arc<Cluster>, conn: Conn) -> TierResult<()> {
    // Tombstones first: a node bootstrapping meanwhile never takes a forgotten entry for live.
    let tombstones: Vec<_> = cluster.store.tombstones().iter().collect();
    if !tombstones.is_empty() {
        super::forget::publish(cluster, &conn, &tombstones).await?;
    }
    // Redis may have lost the blobs with the entries.
    crate::sync::lock(&cluster.blobs.published).forget_all();
    let map = cluster.store.current();
    tracing::info!(
        entries = map.len(),
        "cluster tier: republishing this node's winners"
    );
    let mut batch = Vec::with_capacity(BATCH);
    for entry in map.iter() {
        batch.push(entry.to_pair());
        if batch.len() == BATCH {
            publish_batch(cluster, conn.clone(), &batch).await?;
            cluster
                .counters
                .republished
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.clear();
        }
    }
    if !batch.is_empty() {
        publish_batch(cluster, conn, &batch).await?;
        cluster
            .counters
            .republished
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

async fn publish_batch(
    cluster: &Arc<Cluster>,
    conn: Conn,
    batch: &[(CacheKey, TunedResult)],
) -> TierResult<()> {
    // The blobs first: a node that learns an entry can fetch what it names.
    let named = batch.iter().flat_map(|(_, result)| {
        result
            .artifacts
            .view()
            .iter()
            .map(|a| (a.sha256.to_owned(), a.size))
            .collect::<Vec<_>>()
    });
    super::blobs::publish_named(cluster, &conn, named).await?;
    let layout: &Layout = &cluster.redis.layout;
    let node = cluster.node_id();
    let max_len = cluster.tuning.stream_max_len;
    // Each result goes with its key's last use here: Redis keeps the later of it and its own.
    let held = cluster.store.current();
    let merges = batch.iter().map(|(key, result)| {
        let mut conn = conn.clone();
        let day = held.get(key).map_or(0, |entry| entry.last_use());
        let [t, c, b, a] = encode_result(result);
        let text = Layout::key_text(key);
        let shard = Layout::shard_of_text(&text);
        let mut invocation = scripts::MERGE.prepare_invoke();
        invocation
            .key(layout.entry_of_text(&text))
            .key(layout.lease_of_text(&text))
            .key(layout.log(shard))
            .key(layout.meta(shard))
            .arg(t)
            .arg(c)
            .arg(b)
            .arg(a)
            .arg(text)
            .arg(&node)
            .arg(max_len)
            .arg(encode_day(day));
        async move { invocation.invoke_async::<Value>(&mut conn).await }
    });
    let replies = tokio::time::timeout(BACKGROUND_TIMEOUT, join_all(merges))
        .await
        .map_err(|_| TierError::unavailable("publishing timed out"))?;
    let mut stored = 0u64;
    let mut already = 0u64;
    let mut better_there = Vec::new();
    for ((key, _), reply) in batch.iter().zip(replies) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) if refusals::is_wrong_type(&error) => {
                // The entry, its shard's stream or meta holds another type: this result
                // cannot go to Redis until it is repaired; the audit publishes it then.
                let text = Layout::key_text(key);
                let shard = Layout::shard_of_text(&text);
                let names = [
                    layout.entry_of_text(&text),
                    layout.log(shard),
                    layout.meta(shard),
                ];
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                cluster
                    .redis
                    .wrong_types
                    .found(refusals::wrong_typed_key(&error, &names));
                continue;
            }
            Err(error) => return Err(TierError::from(error)),
        };
        match reply {
            Value::Int(1) => stored += 1,
            Value::Int(0) => already += 1,
            Value::Array(fields) => match values::result_of_values(&fields)
                .and_then(|winner| Ok((winner, values::day(fields.get(4))?)))
            {
                Ok((winner, day)) => better_there.push((key.clone(), winner, day)),
                Err(why) => cluster.observed.refusals.refuse(
                    ReadFrom::Entries,
                    &layout.entry_of_text(&Layout::key_text(key)),
                    &why,
                ),
            },
            other => {
                return Err(TierError::refused(format!(
                    "unexpected reply to the merge script: {other:?}"
                )))
            }
        }
    }
    let counters = &cluster.counters;
    counters.published.fetch_add(stored, Ordering::Relaxed);
    counters
        .publish_already
        .fetch_add(already, Ordering::Relaxed);
    if !better_there.is_empty() {
        cluster.apply_learned(better_there).await;
    }
    Ok(())
}
