//! The follower's start-up (issue 38): the stream places saved beside the journal, restored
//! and saved again; the shards' checkpoints, loaded, rejected and rebuilt under a lease.

use super::*;

impl Follower {
    /// Takes the places saved in the state directory, if the journal replayed whole and they
    /// were made under this prefix; the first connection checks them against Redis.
    pub(super) async fn restore_places(&mut self) {
        let Some(dir) = self.cluster.state_dir.clone() else {
            return;
        };
        let prefix = self.cluster.prefix().to_owned();
        let read = tokio::task::spawn_blocking(move || places::read(&dir, &prefix)).await;
        let saved = match read {
            Ok(Ok(Some(saved))) => saved,
            Ok(Ok(None)) => return,
            Ok(Err(why)) => {
                tracing::warn!(%why, "cluster tier: saved stream places unusable; reading every shard");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cluster tier: reading the saved stream places failed");
                return;
            }
        };
        if !self.cluster.places_trusted {
            tracing::warn!(
                "cluster tier: the journal was damaged; not trusting the saved stream places"
            );
            return;
        }
        self.places = Some(
            saved
                .shards
                .iter()
                .map(|p| Place {
                    id: p.id.clone(),
                    seq: p.seq,
                })
                .collect(),
        );
        self.epoch = Some(saved.epoch);
        self.restored = true;
    }

    /// The start is over: the places are saved, then Stats and one log line say what it
    /// cost.
    pub(super) async fn finish_start(&mut self) {
        if self.start_done {
            return;
        }
        self.start_done = true;
        self.save_places(true).await;
        let counters = &self.cluster.counters;
        let reread = self.reread_at_start.iter().filter(|&&r| r).count() as u64;
        counters.shards_reread.fetch_add(reread, Ordering::Relaxed);
        let restored = self.restored && counters.places_restored.load(Ordering::Relaxed) > 0;
        let resumed = if restored || counters.checkpoints_loaded.load(Ordering::Relaxed) > 0 {
            SHARDS as u64 - reread
        } else {
            0
        };
        counters
            .shards_resumed
            .fetch_add(resumed, Ordering::Relaxed);
        let elapsed = self.started.elapsed();
        counters
            .startup_ms
            .store(elapsed.as_millis() as u64, Ordering::Relaxed);
        let (commands, bytes) = super::super::link::startup_done();
        counters.startup_commands.store(commands, Ordering::Relaxed);
        counters.startup_bytes.store(bytes, Ordering::Relaxed);
        self.cluster.bootstrapped.store(true, Ordering::Relaxed);
        tracing::info!(
            restored_places = self.restored,
            shards_resumed = resumed,
            shards_read_again = reread,
            checkpoints_loaded = counters.checkpoints_loaded.load(Ordering::Relaxed),
            redis_commands = commands,
            redis_bytes = bytes,
            elapsed_ms = elapsed.as_millis() as u64,
            "cluster tier: start done"
        );
    }

    /// The places now, as the file holds them; `None` before there are any.
    pub(super) fn saved_form(&self) -> Option<(Vec<Place>, SavedPlaces)> {
        let (current, epoch) = (self.places.as_ref()?, self.epoch.as_ref()?);
        let saved = SavedPlaces::new(
            self.cluster.prefix(),
            epoch,
            current
                .iter()
                .map(|p| SavedPlace {
                    id: p.id.clone(),
                    seq: p.seq,
                })
                .collect(),
        );
        Some((current.clone(), saved))
    }

    /// Saves the places (at most every `PERSIST_EVERY`, when they moved, or at once with
    /// `now`): the entries of every message behind them were applied, and the journal is
    /// synced before the file claims them (`Cluster::save_places`). Also hands them to the
    /// last save at shutdown.
    pub(super) async fn save_places(&mut self, now: bool) {
        let Some(dir) = self.cluster.state_dir.clone() else {
            return;
        };
        if self.cluster.places_unsafe.load(Ordering::Relaxed) {
            if self.saved.take().is_some() || now {
                let _ = tokio::task::spawn_blocking(move || places::remove(&dir)).await;
            }
            *crate::sync::lock(&self.cluster.latest_places) = None;
            return;
        }
        let Some((current, saved)) = self.saved_form() else {
            return;
        };
        *crate::sync::lock(&self.cluster.latest_places) = Some(saved.clone());
        if self.saved.as_ref() == Some(&current)
            || (!now && self.saved_at.elapsed() < PERSIST_EVERY)
        {
            return;
        }
        self.saved_at = Instant::now();
        match self.cluster.save_places(saved).await {
            Ok(()) => self.saved = Some(current),
            Err(why) => tracing::debug!(%why, "cluster tier: stream places not saved"),
        }
    }

    /// Reads and checks every shard's checkpoint (`checkpoint::verify`) and applies the good
    /// ones: per shard the place to follow its stream from (`None`: read its entries), and
    /// how many entries they brought.
    pub(super) async fn load_checkpoints(
        &mut self,
        conn: &Conn,
        positions: &[Place],
    ) -> Result<(Vec<Option<Place>>, u64), Failure> {
        let layout = self.cluster.layout.clone();
        let reads = (0..SHARDS).map(|shard| {
            let mut conn = conn.clone();
            let name = layout.checkpoint(shard);
            async move {
                redis::cmd("HMGET")
                    .arg(name)
                    .arg("seq")
                    .arg("n")
                    .arg("h")
                    .query_async::<Vec<Value>>(&mut conn)
                    .await
            }
        });
        let replies = timed("reading the checkpoints", async {
            Ok(join_all(reads).await)
        })
        .await?;
        let epoch = self.epoch.clone();
        let mut headers: Vec<(usize, checkpoint::Header)> = Vec::new();
        for (shard, reply) in replies.into_iter().enumerate() {
            let fields = match reply {
                Ok(fields) => fields,
                Err(error) if values::is_wrong_type(&error) => {
                    self.cluster.wrong_types.found(&layout.checkpoint(shard));
                    continue;
                }
                Err(error) => return Err(format!("reading the checkpoints: {error}")),
            };
            let Some(text) = fields.get(2).and_then(values::bytes) else {
                continue; // none yet
            };
            match checkpoint::parse_header(text, self.cluster.prefix(), shard, epoch.as_deref()) {
                Ok(header) if header.seq > positions[shard].seq => {
                    self.reject_checkpoint(shard, "newer than its shard (redis lost writes?)");
                }
                Ok(header) => {
                    self.checkpoints[shard] = Some((header.seq, header.count));
                    headers.push((shard, header));
                }
                Err(why) => self.reject_checkpoint(shard, &why),
            }
        }
        let gets = headers.iter().map(|(shard, header)| {
            let mut conn = conn.clone();
            let stem = layout.checkpoint_part_stem(*shard);
            let names: Vec<String> = (0..header.parts.len())
                .map(|i| format!("{stem}{}:{i}", header.seq))
                .collect();
            async move {
                if names.is_empty() {
                    return Ok(Vec::new());
                }
                redis::cmd("MGET")
                    .arg(names)
                    .query_async::<Vec<Option<Vec<u8>>>>(&mut conn)
                    .await
            }
        });
        let parts = timed("reading checkpoint parts", async {
            Ok(join_all(gets).await)
        })
        .await?;
        let mut from_checkpoints: Vec<Option<Place>> = vec![None; SHARDS];
        let mut loaded = 0u64;
        for ((shard, header), parts) in headers.into_iter().zip(parts) {
            let parts = match parts {
                Ok(parts) => parts,
                Err(error) if values::is_wrong_type(&error) => {
                    self.reject_checkpoint(shard, "a part holds the wrong type");
                    continue;
                }
                Err(error) => return Err(format!("reading checkpoint parts: {error}")),
            };
            let Some(parts) = parts.into_iter().collect::<Option<Vec<Vec<u8>>>>() else {
                self.reject_checkpoint(shard, "a part is missing");
                continue;
            };
            let verifying = layout.clone();
            let checked = tokio::task::spawn_blocking(move || {
                checkpoint::verify(&verifying, &header, &parts).map(|entries| (header, entries))
            })
            .await
            .map_err(|e| format!("checking a checkpoint: {e}"))?;
            let (header, entries) = match checked {
                Ok(checked) => checked,
                Err(why) => {
                    self.reject_checkpoint(shard, &why);
                    continue;
                }
            };
            let tombstones = self.cluster.store.tombstones();
            let live: Vec<(CacheKey, TunedResult)> = entries
                .into_iter()
                .filter(|(key, result)| result.forget_epoch >= tombstones.floor(&key.view()))
                .collect();
            for batch in live.chunks(APPLY_BATCH) {
                loaded += u64::from(self.cluster.apply_learned(batch.to_vec()).await);
            }
            self.cluster
                .counters
                .checkpoints_loaded
                .fetch_add(1, Ordering::Relaxed);
            from_checkpoints[shard] = Some(Place {
                id: header.id,
                seq: header.seq,
            });
        }
        Ok((from_checkpoints, loaded))
    }

    pub(super) fn reject_checkpoint(&self, shard: usize, why: &str) {
        self.cluster
            .counters
            .checkpoints_rejected
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            shard,
            reason = %values::shown(why),
            "cluster tier: rejected a shard's checkpoint; reading the shard's entries instead"
        );
    }

    /// Rebuilds the checkpoints of shards whose streams moved more than the threshold past
    /// them, each under its lease, from this node's own entries at a moment they equal
    /// Redis's (`compare`), with compare-and-set on the sequence number.
    pub(super) async fn build_checkpoints(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let (Some(places), Some(epoch)) = (self.places.clone(), self.epoch.clone()) else {
            return Ok(());
        };
        let every = self.cluster.checkpoint_every;
        let half_stream = (self.cluster.stream_max_len / 2).max(1);
        let threshold = |count: u64| {
            if every > 0 {
                every
            } else {
                (count / 10).clamp(256.min(half_stream), half_stream)
            }
        };
        let stale = |checkpoints: &[Option<(u64, u64)>; SHARDS], shard: usize| {
            let (seq, count) = checkpoints[shard].unwrap_or((0, 0));
            places[shard].seq >= seq + threshold(count)
        };
        let candidates: Vec<usize> = (0..SHARDS)
            .filter(|&s| !self.broken[s] && places[s].seq > 0 && stale(&self.checkpoints, s))
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        // Another node may have built them meanwhile: look before taking a lease.
        let layout = self.cluster.layout.clone();
        for &shard in &candidates {
            let fields: Vec<Value> = match tokio::time::timeout(
                BACKGROUND_TIMEOUT,
                redis::cmd("HMGET")
                    .arg(layout.checkpoint(shard))
                    .arg("seq")
                    .arg("h")
                    .query_async(conn),
            )
            .await
            {
                Ok(Ok(fields)) => fields,
                Ok(Err(error)) if values::is_wrong_type(&error) => {
                    self.cluster.wrong_types.found(&layout.checkpoint(shard));
                    continue;
                }
                Ok(Err(error)) => return Err(format!("reading a checkpoint: {error}")),
                Err(_) => return Err("reading a checkpoint: no answer".to_owned()),
            };
            let header = fields.get(1).and_then(values::bytes).and_then(|text| {
                checkpoint::parse_header(text, self.cluster.prefix(), shard, Some(&epoch)).ok()
            });
            if let Some(header) = header {
                self.checkpoints[shard] = Some((header.seq, header.count));
            }
        }
        let token = format!(
            "{}/{:016x}",
            self.cluster.node_id(),
            super::super::random_u64()
        );
        let mut leased = Vec::new();
        for shard in candidates
            .into_iter()
            .filter(|&s| stale(&self.checkpoints, s))
        {
            let taken: Value = timed(
                "taking a checkpoint lease",
                redis::cmd("SET")
                    .arg(layout.checkpoint_lease(shard))
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(CHECKPOINT_LEASE.as_millis() as u64)
                    .query_async(conn),
            )
            .await?;
            if taken == Value::Okay {
                leased.push(shard);
            }
        }
        if leased.is_empty() {
            return Ok(());
        }
        let outcome = self.build_leased(conn, &leased, &epoch, &token).await;
        for &shard in &leased {
            let mut invocation = scripts::RELEASE.prepare_invoke();
            invocation.key(layout.checkpoint_lease(shard)).arg(&token);
            let _ = timed(
                "releasing a checkpoint lease",
                invocation.invoke_async::<i64>(conn),
            )
            .await;
        }
        outcome
    }

    pub(super) async fn build_leased(
        &mut self,
        conn: &mut Conn,
        shards: &[usize],
        epoch: &str,
        token: &str,
    ) -> Result<(), Failure> {
        let settled = self.compare(conn, shards).await?.1;
        let layout = self.cluster.layout.clone();
        for Settled {
            shard,
            seq,
            id,
            current,
        } in settled
        {
            let (prefix, epoch_owned, node) = (
                self.cluster.prefix().to_owned(),
                epoch.to_owned(),
                self.cluster.node_id(),
            );
            let building = layout.clone();
            let built = tokio::task::spawn_blocking(move || {
                let entries: Vec<(String, [String; 4])> = current
                    .iter()
                    .filter_map(|entry| {
                        let (key, result) = entry.to_pair();
                        let text = Layout::key_text(&key);
                        (Layout::shard_of_text(&text) == shard)
                            .then(|| (text, encode_result(&result)))
                    })
                    .collect();
                checkpoint::build(
                    &building,
                    &prefix,
                    shard,
                    &epoch_owned,
                    seq,
                    &id,
                    &node,
                    &entries,
                )
            })
            .await
            .map_err(|e| format!("building a checkpoint: {e}"))?;
            let built = match built {
                Ok(built) => built,
                Err(why) => {
                    tracing::warn!(shard, %why, "cluster tier: could not build a checkpoint");
                    continue;
                }
            };
            let stem = layout.checkpoint_part_stem(shard);
            let names: Vec<String> = (0..built.parts.len())
                .map(|i| format!("{stem}{seq}:{i}"))
                .collect();
            let writes = names.iter().zip(&built.parts).map(|(name, part)| {
                let mut conn = conn.clone();
                let mut set = redis::cmd("SET");
                set.arg(name)
                    .arg(part.as_slice())
                    .arg("PX")
                    .arg(CHECKPOINT_PART_TTL.as_millis() as u64);
                async move { set.query_async::<()>(&mut conn).await }
            });
            timed("writing checkpoint parts", async {
                join_all(writes)
                    .await
                    .into_iter()
                    .collect::<Result<Vec<()>, _>>()
            })
            .await?;
            let header = serde_json::to_string(&built.header)
                .map_err(|e| format!("encoding a checkpoint header: {e}"))?;
            let now_seq = self
                .places
                .as_ref()
                .map_or(seq, |places| places[shard].seq.max(seq));
            let mut invocation = scripts::CHECKPOINT.prepare_invoke();
            invocation
                .key(layout.checkpoint(shard))
                .key(layout.checkpoint_lease(shard));
            for name in &names {
                invocation.key(name);
            }
            invocation
                .arg(token)
                .arg(seq)
                .arg(names.len())
                .arg(header)
                .arg(&stem)
                .arg(now_seq);
            match timed(
                "swapping a checkpoint in",
                invocation.invoke_async::<i64>(conn),
            )
            .await?
            {
                1 => {
                    self.cluster
                        .counters
                        .checkpoints_built
                        .fetch_add(1, Ordering::Relaxed);
                    self.checkpoints[shard] = Some((seq, built.header.count));
                    tracing::info!(
                        shard,
                        seq,
                        entries = built.header.count,
                        bytes = built.parts.iter().map(Vec::len).sum::<usize>(),
                        "cluster tier: built a shard's checkpoint"
                    );
                }
                outcome => tracing::debug!(
                    shard,
                    seq,
                    outcome,
                    "cluster tier: a newer checkpoint is there, or the lease ran out"
                ),
            }
        }
        Ok(())
    }
}
