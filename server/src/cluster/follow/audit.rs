//! The follower's audit: every shard's entry count and digest in Redis against this node's,
//! the shards that differ read again, broken streams retried.

use super::*;
use crate::error::TierError;

impl Follower {
    /// Compares every shard's entry count and digest in Redis with this node's, at a moment
    /// when this node has read the shard's stream through its newest message and has nothing
    /// of its own waiting to be published; reads again the shards that differ.
    pub(super) async fn audit(&mut self, conn: &mut Conn, why: &str) -> Result<(), Failure> {
        let started = Instant::now();
        self.cluster.counters.audits.fetch_add(1, Ordering::Relaxed);
        self.retry_broken(conn).await?;
        let shards: Vec<usize> = (0..SHARDS).filter(|&s| !self.broken[s]).collect();
        let (differing, _, unsettled) = self.compare(conn, &shards).await?;
        self.cluster
            .counters
            .audit_differing
            .fetch_add(differing.len() as u64, Ordering::Relaxed);
        let repaired = if differing.is_empty() {
            0
        } else {
            self.resync_counted(conn, &differing, true).await?
        };
        if repaired > 0 {
            tracing::warn!(
                repaired,
                "cluster tier: audit found results redis announced that never reached this node"
            );
        }
        tracing::debug!(
            why,
            differing = differing.len(),
            unsettled,
            repaired,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "cluster tier: audit done"
        );
        Ok(())
    }

    /// The comparison of the audit for `shards`: those that differ (to read again), those
    /// found equal (with the moment: Redis's sequence number, this node's place and cache),
    /// and how many found no quiet moment.
    pub(super) async fn compare(
        &mut self,
        conn: &mut Conn,
        shards: &[usize],
    ) -> Result<(Vec<Resync>, Vec<Settled>, usize), Failure> {
        let mut unsettled: Vec<usize> = shards.to_vec();
        let mut differing: Vec<Resync> = Vec::new();
        let mut equal: Vec<Settled> = Vec::new();
        for _ in 0..AUDIT_ATTEMPTS {
            if unsettled.is_empty() {
                break;
            }
            self.cluster
                .wait_publish_idle(tokio::time::Instant::now() + AUDIT_DRAIN)
                .await;
            let before = self.metas(conn, &unsettled).await?;
            let targets: Vec<(usize, u64)> = unsettled
                .iter()
                .copied()
                .zip(before.iter().map(|m| m.seq))
                .collect();
            self.catch_up(conn, &targets).await?;
            // The results to compare first, then whether any of them still waits to be
            // published: one that does makes the shard differ for now, not for good.
            let current = self.cluster.store.current();
            let publish_quiet = self.cluster.publish_idle();
            let local = self.local_digests(Arc::clone(&current)).await?;
            let after = self.metas(conn, &unsettled).await?;
            let mut still = Vec::new();
            for ((shard, meta), earlier) in unsettled.iter().copied().zip(after).zip(&before) {
                if self.broken[shard] {
                    continue; // its meta holds the wrong type: tried again next audit
                }
                // Compared only if Redis took no write in the shard while this node read its
                // stream and summed its results, and none of this node's own was on its way.
                // A message the stream lacks (trimmed, deleted) cannot be read, so the sums
                // differ and the shard is read again from its entries.
                if !publish_quiet || meta.seq != earlier.seq {
                    tracing::debug!(
                        shard,
                        publish_quiet,
                        seq = meta.seq,
                        earlier = earlier.seq,
                        "cluster tier: audit: shard busy"
                    );
                    still.push(shard);
                    continue;
                }
                let (count, digest) = &local[shard];
                if meta.count != *count || meta.digest != *digest {
                    tracing::info!(
                        shard,
                        redis_entries = meta.count,
                        local_entries = count,
                        "cluster tier: audit: this node and redis differ; reading the shard again"
                    );
                    differing.push(Resync {
                        shard,
                        known_through: meta.seq,
                    });
                    continue;
                }
                // Equal to Redis's record of its entries: what a checkpoint brought is borne
                // out.
                self.unconfirmed.confirm(shard);
                if let Some(place) = self
                    .places
                    .as_ref()
                    .and_then(|places| places.get(shard))
                    .filter(|place| place.seq == meta.seq)
                {
                    equal.push(Settled {
                        shard,
                        seq: meta.seq,
                        id: place.id.clone(),
                        current: Arc::clone(&current),
                    });
                }
            }
            unsettled = still;
        }
        Ok((differing, equal, unsettled.len()))
    }

    /// Shards marked broken whose keys read as their types again: followed from now on,
    /// after reading them again from their entries.
    pub(super) async fn retry_broken(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let broken: Vec<usize> = (0..SHARDS).filter(|&s| self.broken[s]).collect();
        if broken.is_empty() || self.places.is_none() {
            return Ok(());
        }
        let places = self.positions(conn, &broken).await?;
        let mut mended = Vec::new();
        for (shard, place) in broken.into_iter().zip(places) {
            if self.broken[shard] {
                continue;
            }
            let layout = &self.cluster.redis.layout;
            self.cluster.redis.wrong_types.fixed(&layout.log(shard));
            self.cluster.redis.wrong_types.fixed(&layout.meta(shard));
            if let Some(places) = &mut self.places {
                places[shard] = place;
            }
            mended.push(Resync {
                shard,
                known_through: 0,
            });
        }
        if !mended.is_empty() {
            self.resync_counted(conn, &mended, true).await?;
        }
        Ok(())
    }

    pub(super) async fn metas(
        &mut self,
        conn: &Conn,
        shards: &[usize],
    ) -> Result<Vec<Meta>, Failure> {
        let reads = shards.iter().map(|&shard| {
            let mut conn = conn.clone();
            let mut invocation = scripts::META.prepare_invoke();
            invocation.key(self.cluster.redis.layout.meta(shard));
            async move {
                invocation
                    .invoke_async::<(u64, u64, String)>(&mut conn)
                    .await
            }
        });
        let replies = timed("reading the shard digests", async {
            Ok(join_all(reads).await)
        })
        .await?;
        let mut metas = Vec::with_capacity(shards.len());
        for (&shard, reply) in shards.iter().zip(replies) {
            match reply {
                Ok((seq, count, digest)) => metas.push(Meta { seq, count, digest }),
                Err(error) if refusals::is_wrong_type(&error) => {
                    // Never equal to a real one: the shard stays unsettled this round.
                    self.cluster
                        .redis
                        .wrong_types
                        .found(&self.cluster.redis.layout.meta(shard));
                    self.broken[shard] = true;
                    metas.push(Meta {
                        seq: u64::MAX,
                        count: u64::MAX,
                        digest: String::new(),
                    });
                }
                Err(error) => {
                    return Err(TierError::from(error).during("reading the shard digests"))
                }
            }
        }
        Ok(metas)
    }

    /// Reads the streams (without blocking) until this node's place in each (shard,
    /// sequence number) of `targets` is at least that number, or nothing more comes.
    pub(super) async fn catch_up(
        &mut self,
        conn: &mut Conn,
        targets: &[(usize, u64)],
    ) -> Result<(), Failure> {
        loop {
            let behind = match &self.places {
                Some(places) => targets
                    .iter()
                    .any(|&(shard, seq)| places.get(shard).is_some_and(|p| p.seq < seq)),
                None => false,
            };
            if !behind || self.read_streams(conn, None).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Each shard's entry count and digest over this node's results, off the runtime.
    pub(super) async fn local_digests(
        &self,
        current: Arc<crate::wire::stored::EntryMap>,
    ) -> Result<Vec<(u64, String)>, Failure> {
        let layout = self.cluster.redis.layout.clone();
        tokio::task::spawn_blocking(move || {
            let mut shards = vec![(0u64, 0u64); SHARDS];
            for entry in current.iter() {
                let (key, result) = entry.to_pair();
                let text = Layout::key_text(&key);
                let shard = &mut shards[Layout::shard_of_text(&text)];
                shard.0 += 1;
                shard.1 ^= entry_digest(&layout.entry_of_text(&text), &encode_result(&result));
            }
            shards
                .into_iter()
                .map(|(count, digest)| (count, format_digest(digest)))
                .collect()
        })
        .await
        .map_err(|e| TierError::from(e).during("computing digests"))
    }
}
