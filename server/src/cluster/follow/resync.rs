//! Reading shards again from their entries in Redis (a gap or a restart in a stream, the
//! audit's differing shards, bootstrap): what beats this node's results is applied, and,
//! when asked, what Redis lacks or holds worse is queued for publishing again.

use super::*;
use crate::error::TierError;
use crate::model::lifecycle::Day;

impl Follower {
    /// Reads `shards` again from their entries in Redis and applies what beats this node's
    /// results. With `republish`, also queues this node's results of those shards that Redis
    /// lacks or holds worse.
    pub(super) async fn resync(
        &self,
        conn: &mut Conn,
        shards: &[Resync],
        republish: bool,
    ) -> Result<Resynced, Failure> {
        let mut known_through: [Option<u64>; SHARDS] = [None; SHARDS];
        for r in shards {
            let slot = &mut known_through[r.shard];
            *slot = Some(slot.map_or(r.known_through, |k| k.min(r.known_through)));
        }
        // One SCAN pass: over one shard's names, or over every name when several shards go.
        let pattern = match shards {
            [only] => self.cluster.redis.layout.entry_pattern(Some(only.shard)),
            _ => self.cluster.redis.layout.entry_pattern(None),
        };
        let mut pages = timed("listing cluster nodes", conn.scan_pages(pattern)).await?;
        let mut outcome = Resynced::default();
        let mut in_redis: HashMap<CacheKey, TunedResult> = HashMap::new();
        while let Some(names) = timed("scanning entries", pages.next_page(conn)).await? {
            let names: Vec<(String, CacheKey, u64)> = names
                .into_iter()
                .filter_map(
                    |name| match values::key_of_entry(&self.cluster.redis.layout, &name) {
                        Ok((key, shard)) => Some((name, key, known_through[shard]?)),
                        Err(why) => {
                            self.cluster
                                .observed
                                .refusals
                                .refuse(ReadFrom::Entries, &name, &why);
                            None
                        }
                    },
                )
                .collect();
            for chunk in names.chunks(READ_COUNT) {
                let entries = read_entries(&self.cluster, conn, chunk).await?;
                let current = self.cluster.store.current();
                let tombstones = self.cluster.store.tombstones();
                let mut apply = Vec::new();
                let mut forgotten = Vec::new();
                let settings = self.cluster.store.lifecycle();
                let today = settings.clock.today();
                for (key, result, seq, through, day) in entries {
                    let floor = tombstones.floor(&key.view());
                    if result.forget_epoch < floor {
                        // Published before the Forget reached its node: neither learned
                        // nor kept in Redis.
                        forgotten.push((key, floor));
                        continue;
                    }
                    let held = current.get(&key);
                    if merge(held.map(|e| e.to_pair().1).as_ref(), &result) == MergeOutcome::Replace
                    {
                        // Expired on arrival is no repair: the store drops it, and the
                        // tier deletes it from Redis (`apply_learned`).
                        let expired = super::super::lifecycle::expired_on_arrival(
                            &settings, held, &key, &result, day, today,
                        );
                        if through > 0 && seq <= through && expired.is_none() {
                            outcome.repaired += 1;
                        }
                        apply.push((key.clone(), result.clone(), day));
                    } else if held.is_some_and(|held| day > held.last_use()) {
                        // The same (or a worse) result, used later elsewhere: the day.
                        apply.push((key.clone(), result.clone(), day));
                    }
                    if republish {
                        in_redis.insert(key, result);
                    }
                }
                outcome.learned += u64::from(self.cluster.apply_learned(apply).await);
                if !forgotten.is_empty() {
                    super::super::forget::delete_forgotten(&self.cluster, conn, forgotten).await?;
                }
            }
        }
        if republish {
            let wanted: Vec<bool> = known_through.iter().map(Option::is_some).collect();
            let current = self.cluster.store.current();
            let unconfirmed = self.unconfirmed.clone();
            let (missing, withheld) = tokio::task::spawn_blocking(move || {
                let mut withheld = 0u64;
                let missing = current
                    .iter()
                    .filter_map(|entry| {
                        let (key, result) = entry.to_pair();
                        let text = Layout::key_text(&key);
                        let shard = Layout::shard_of_text(&text);
                        if !wanted[shard]
                            || merge(in_redis.get(&key), &result) != MergeOutcome::Replace
                        {
                            return None;
                        }
                        if unconfirmed.brought(shard, &text, &result) {
                            withheld += 1;
                            return None;
                        }
                        Some((key, result))
                    })
                    .collect::<Vec<_>>();
                (missing, withheld)
            })
            .await
            .map_err(|e| TierError::from(e).during("comparing with redis"))?;
            self.withheld(withheld);
            if !missing.is_empty() {
                tracing::warn!(
                    entries = missing.len(),
                    "cluster tier: redis lacks results this node holds; publishing them again"
                );
                self.cluster.queue_for_publish(missing);
            }
        }
        Ok(outcome)
    }

    /// `resync`, counted in Stats; returns the repairs.
    pub(super) async fn resync_counted(
        &mut self,
        conn: &mut Conn,
        shards: &[Resync],
        republish: bool,
    ) -> Result<u64, Failure> {
        if !self.start_done {
            for r in shards {
                self.reread_at_start[r.shard] = true;
            }
        }
        let outcome = self.resync(conn, shards, republish).await?;
        let counters = &self.cluster.counters;
        counters
            .audit_repaired
            .fetch_add(outcome.repaired, Ordering::Relaxed);
        counters
            .resync_entries
            .fetch_add(outcome.learned, Ordering::Relaxed);
        Ok(outcome.repaired)
    }
}

/// Reads the named entries: (key, result, the sequence number it was written at, the
/// `known_through` handed in with its name, and its last use, `u`). Each is checked like a
/// Record's entry (`values::entry_fields`): a refused or wrong-typed one is skipped alone.
async fn read_entries(
    cluster: &Cluster,
    conn: &Conn,
    names: &[(String, CacheKey, u64)],
) -> Result<Vec<(CacheKey, TunedResult, u64, u64, Day)>, Failure> {
    let reads = names.iter().map(|(name, _, _)| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("HMGET")
                .arg(name)
                .arg("t")
                .arg("c")
                .arg("b")
                .arg("a")
                .arg("s")
                .arg("u")
                .query_async::<Vec<Value>>(&mut conn)
                .await
        }
    });
    let replies = timed("reading entries", async { Ok(join_all(reads).await) }).await?;
    let mut entries = Vec::new();
    for ((name, key, through), reply) in names.iter().zip(replies) {
        let fields = match reply {
            Ok(fields) => fields,
            Err(error) if refusals::is_wrong_type(&error) => {
                cluster.redis.wrong_types.found(name);
                continue;
            }
            Err(error) => return Err(TierError::from(error).during("reading entries")),
        };
        if fields.first().is_some_and(|t| *t == Value::Nil) {
            continue; // deleted since the scan (a Forget)
        }
        match values::entry_fields(&fields) {
            Ok((result, seq, day)) => entries.push((key.clone(), result, seq, *through, day)),
            Err(why) => cluster
                .observed
                .refusals
                .refuse(ReadFrom::Entries, name, &why),
        }
    }
    Ok(entries)
}
