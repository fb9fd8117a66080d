//! The shards' checkpoints (`checkpoint`) as the follower uses them: loaded at a node's first
//! bootstrap, each checked before any entry of it is used (its header against the shard's
//! record and live meta, its place in the stream, its parts, with a cluster key their MACs;
//! a rejected one is counted, logged, and its shard read from its entries), and rebuilt
//! under a lease from this node's memory.
//!
//! What a loaded checkpoint brought stays unconfirmed (each entry's digest, per shard) until
//! an audit finds the shard equal to Redis: until then the audit never publishes back a
//! result that came only from it (Stats `cluster_checkpoint_results_withheld`), so a
//! checkpoint Redis's entries do not bear out never spreads into Redis.

use std::collections::HashSet;

use super::*;
use crate::cluster::checkpoint::{Header, ShardRecord};
use crate::error::TierError;

/// What loaded checkpoints brought that no audit has borne out yet: per shard, the digest
/// (`keys::entry_digest`) of each entry its checkpoint brought.
#[derive(Clone)]
pub(super) struct Unconfirmed {
    layout: Layout,
    shards: Vec<Option<Arc<HashSet<u64>>>>,
}

impl Unconfirmed {
    pub(super) fn new(layout: Layout) -> Unconfirmed {
        Unconfirmed {
            layout,
            shards: vec![None; SHARDS],
        }
    }

    /// `shard` was loaded from a checkpoint whose entries have these digests.
    pub(super) fn brought_by(&mut self, shard: usize, digests: HashSet<u64>) {
        self.shards[shard] = Some(Arc::new(digests));
    }

    /// An audit found `shard` equal to Redis's count and digest: what its checkpoint
    /// brought is borne out.
    pub(super) fn confirm(&mut self, shard: usize) {
        self.shards[shard] = None;
    }

    /// Whether the result of key text `text` (in `shard`) is one an unconfirmed checkpoint
    /// brought.
    pub(super) fn brought(&self, shard: usize, text: &str, result: &TunedResult) -> bool {
        self.shards[shard].as_ref().is_some_and(|digests| {
            digests.contains(&entry_digest(
                &self.layout.entry_of_text(text),
                &encode_result(result),
            ))
        })
    }
}

/// A header hash and the shard's record: `CHECKPOINT_HEAD`'s reply.
fn shard_record(reply: &[Value]) -> (Option<&[u8]>, ShardRecord) {
    let number = |i: usize| {
        reply
            .get(i)
            .and_then(values::bytes)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|t| t.parse::<u64>().ok())
    };
    let text = |i: usize| {
        reply
            .get(i)
            .and_then(values::bytes)
            .and_then(|b| std::str::from_utf8(b).ok())
            .map(str::to_owned)
    };
    let record = ShardRecord {
        header_seq: number(0),
        live: (
            number(3).unwrap_or(0),
            number(4).unwrap_or(0),
            text(5).unwrap_or_else(|| format_digest(0)),
        ),
        checkpoint: match (number(6), number(7), text(8)) {
            (Some(seq), Some(count), Some(digest)) => Some((seq, count, digest)),
            _ => None,
        },
    };
    (reply.get(2).and_then(values::bytes), record)
}

impl Follower {
    /// Reads and checks every shard's checkpoint and applies the good ones: per shard the
    /// place to follow its stream from (`None`: read its entries), and how many entries they
    /// brought.
    pub(super) async fn load_checkpoints(
        &mut self,
        conn: &mut Conn,
    ) -> Result<(Vec<Option<Place>>, u64), Failure> {
        let headers = self.read_headers(conn).await?;
        let layout = self.cluster.redis.layout.clone();
        // Each checkpoint's parts, and the message at its id, all at once.
        let reads = headers.iter().map(|header| {
            let mut conn = conn.clone();
            let stem = layout.checkpoint_part_stem(header.shard);
            let names: Vec<String> = (0..header.parts.len())
                .map(|i| format!("{stem}{}:{i}", header.seq))
                .collect();
            let mut at_id = redis::cmd("XRANGE");
            at_id
                .arg(layout.log(header.shard))
                .arg(&header.id)
                .arg(&header.id)
                .arg("COUNT")
                .arg(1);
            async move {
                let parts = if names.is_empty() {
                    Ok(Vec::new())
                } else {
                    redis::cmd("MGET")
                        .arg(&names)
                        .query_async::<Vec<Option<Vec<u8>>>>(&mut conn)
                        .await
                };
                let message = at_id.query_async::<Value>(&mut conn).await;
                (names, parts, message)
            }
        });
        let replies = timed("reading checkpoint parts", async {
            Ok(join_all(reads).await)
        })
        .await?;
        let mut from_checkpoints: Vec<Option<Place>> = vec![None; SHARDS];
        let mut loaded = 0u64;
        for (header, (names, parts, message)) in headers.into_iter().zip(replies) {
            let shard = header.shard;
            let placed = match message {
                Ok(reply) => checkpoint::check_place(&header, &values::messages_of(&reply)),
                Err(error) if refusals::is_wrong_type(&error) => {
                    self.cluster.redis.wrong_types.found(&layout.log(shard));
                    Err(TierError::refused(
                        "its shard's stream holds the wrong type",
                    ))
                }
                // Redis refused the id (a server error, not a lost connection).
                Err(error) if error.code().is_some() => {
                    Err(TierError::from(error).during("its id"))
                }
                Err(error) => {
                    return Err(TierError::from(error).during("reading checkpoint places"))
                }
            };
            if let Err(why) = placed {
                self.reject_checkpoint(shard, &why);
                continue;
            }
            let parts = match parts {
                Ok(parts) => parts,
                Err(error) => return Err(TierError::from(error).during("reading checkpoint parts")),
            };
            let missing: Vec<String> = names
                .iter()
                .zip(&parts)
                .filter(|(_, part)| part.is_none())
                .map(|(name, _)| name.clone())
                .collect();
            let Some(parts) = parts.into_iter().collect::<Option<Vec<Vec<u8>>>>() else {
                let why = self.missing_parts(conn, &missing).await?;
                self.reject_checkpoint(shard, why);
                continue;
            };
            let (verifying, key) = (layout.clone(), self.cluster.tuning.key.clone());
            let checked = tokio::task::spawn_blocking(move || {
                checkpoint::verify(&verifying, &header, &parts, key.as_ref())
                    .map(|decoded| (header, decoded))
            })
            .await
            .map_err(|e| TierError::from(e).during("checking a checkpoint"))?;
            let (header, decoded) = match checked {
                Ok(checked) => checked,
                Err(why) => {
                    self.reject_checkpoint(shard, &why);
                    continue;
                }
            };
            let tombstones = self.cluster.store.tombstones();
            let live: Vec<(CacheKey, TunedResult)> = decoded
                .entries
                .into_iter()
                .filter(|(key, result)| result.forget_epoch >= tombstones.floor(&key.view()))
                .collect();
            for batch in live.chunks(APPLY_BATCH) {
                // Checkpoints carry no last use: the entries count as used on arrival (the
                // stream's tail after the checkpoint brings the uses since).
                let batch = batch
                    .iter()
                    .map(|(key, result)| (key.clone(), result.clone(), 0))
                    .collect();
                loaded += u64::from(self.cluster.apply_learned(batch).await);
            }
            self.unconfirmed.brought_by(shard, decoded.digests);
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

    /// Every shard's checkpoint header that parses and agrees with the shard's record
    /// (`checkpoint::check_record`), read with it in one step; the others rejected.
    async fn read_headers(&mut self, conn: &Conn) -> Result<Vec<Header>, Failure> {
        let layout = self.cluster.redis.layout.clone();
        let reads = (0..SHARDS).map(|shard| {
            let mut conn = conn.clone();
            let mut invocation = scripts::CHECKPOINT_HEAD.prepare_invoke();
            invocation
                .key(layout.checkpoint(shard))
                .key(layout.meta(shard));
            async move { invocation.invoke_async::<Vec<Value>>(&mut conn).await }
        });
        let replies = timed("reading the checkpoints", async {
            Ok(join_all(reads).await)
        })
        .await?;
        let epoch = self.epoch.clone();
        let key = self.cluster.tuning.key.clone();
        let mut headers = Vec::new();
        for (shard, reply) in replies.into_iter().enumerate() {
            let reply = match reply {
                Ok(reply) => reply,
                Err(error) if refusals::is_wrong_type(&error) => {
                    let (header, meta) = (layout.checkpoint(shard), layout.meta(shard));
                    self.cluster
                        .redis
                        .wrong_types
                        .found(refusals::wrong_typed_key(&error, &[&header, &meta]));
                    continue;
                }
                Err(error) => return Err(TierError::from(error).during("reading the checkpoints")),
            };
            let (text, record) = shard_record(&reply);
            let Some(text) = text else {
                continue; // none yet
            };
            let parsed = checkpoint::parse_header(
                text,
                self.cluster.prefix(),
                shard,
                epoch.as_deref(),
                key.as_ref(),
            )
            .and_then(|header| checkpoint::check_record(&header, &record).map(|()| header));
            match parsed {
                Ok(header) => {
                    self.checkpoints[shard] = Some((header.seq, header.count));
                    headers.push(header);
                }
                Err(why) => self.reject_checkpoint(shard, &why),
            }
        }
        Ok(headers)
    }

    /// Why parts of a checkpoint read as missing: each is asked its type, and one of
    /// another type than a string is listed (`MGET` answers nil for it, naming nothing).
    async fn missing_parts(
        &self,
        conn: &mut Conn,
        names: &[String],
    ) -> Result<&'static str, Failure> {
        let mut why = "a part is missing";
        for name in names {
            let kind: String = timed(
                "asking a checkpoint part's type",
                redis::cmd("TYPE").arg(name).query_async(conn),
            )
            .await?;
            if kind != "none" && kind != "string" {
                self.cluster.redis.wrong_types.found(name);
                why = "a part holds the wrong type";
            }
        }
        Ok(why)
    }

    /// The audit kept back `results` it had only from unconfirmed checkpoints: a genuine
    /// checkpoint never holds a result that beats Redis's entry of its key.
    pub(super) fn withheld(&self, results: u64) {
        if results == 0 {
            return;
        }
        self.cluster
            .counters
            .checkpoint_results_withheld
            .fetch_add(results, Ordering::Relaxed);
        tracing::warn!(
            results,
            "cluster tier: results this node has only from a checkpoint beat redis's entries, \
             which no genuine checkpoint does; not publishing them (Stats \
             cluster_checkpoint_results_withheld)"
        );
    }

    pub(super) fn reject_checkpoint(&self, shard: usize, why: impl std::fmt::Display) {
        self.cluster
            .counters
            .checkpoints_rejected
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            shard,
            reason = %refusals::shown(&why.to_string()),
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
        let every = self.cluster.tuning.checkpoint_every;
        let half_stream = (self.cluster.tuning.stream_max_len / 2).max(1);
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
        let layout = self.cluster.redis.layout.clone();
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
                Ok(Err(error)) if refusals::is_wrong_type(&error) => {
                    self.cluster
                        .redis
                        .wrong_types
                        .found(&layout.checkpoint(shard));
                    continue;
                }
                Ok(Err(error)) => return Err(TierError::from(error).during("reading a checkpoint")),
                Err(_) => return Err(TierError::no_answer("reading a checkpoint")),
            };
            let header = fields.get(1).and_then(values::bytes).and_then(|text| {
                checkpoint::parse_header(
                    text,
                    self.cluster.prefix(),
                    shard,
                    Some(&epoch),
                    self.cluster.tuning.key.as_ref(),
                )
                .ok()
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
            let lease = layout.checkpoint_lease(shard);
            let mut invocation = scripts::CHECKPOINT_LEASE.prepare_invoke();
            invocation
                .key(&lease)
                .arg(&token)
                .arg(CHECKPOINT_LEASE.as_millis() as u64);
            match tokio::time::timeout(BACKGROUND_TIMEOUT, invocation.invoke_async::<i64>(conn))
                .await
            {
                Ok(Ok(1)) => {
                    self.cluster.redis.wrong_types.fixed(&lease);
                    leased.push(shard);
                }
                Ok(Ok(_)) => {
                    self.cluster.redis.wrong_types.fixed(&lease);
                }
                Ok(Err(error)) if refusals::is_wrong_type(&error) => {
                    self.cluster.redis.wrong_types.found(&lease);
                }
                Ok(Err(error)) => {
                    return Err(TierError::from(error).during("taking a checkpoint lease"))
                }
                Err(_) => return Err(TierError::no_answer("taking a checkpoint lease")),
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
        let layout = self.cluster.redis.layout.clone();
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
            let (building, key) = (layout.clone(), self.cluster.tuning.key.clone());
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
                let origin = checkpoint::Origin {
                    prefix: &prefix,
                    shard,
                    epoch: &epoch_owned,
                    seq,
                    id: &id,
                    built_by: &node,
                };
                checkpoint::build(&building, &origin, key.as_ref(), &entries)
            })
            .await
            .map_err(|e| TierError::from(e).during("building a checkpoint"))?;
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
                .map_err(|e| TierError::refused_by(e).during("encoding a checkpoint header"))?;
            let now_seq = self
                .places
                .as_ref()
                .map_or(seq, |places| places[shard].seq.max(seq));
            let mut invocation = scripts::CHECKPOINT.prepare_invoke();
            invocation
                .key(layout.checkpoint(shard))
                .key(layout.checkpoint_lease(shard))
                .key(layout.meta(shard));
            for name in &names {
                invocation.key(name);
            }
            invocation
                .arg(token)
                .arg(seq)
                .arg(names.len())
                .arg(header)
                .arg(&stem)
                .arg(now_seq)
                .arg(built.header.count)
                .arg(&built.header.digest);
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
                -3 => tracing::warn!(
                    shard,
                    seq,
                    "cluster tier: a checkpoint built here disagrees with the shard's count and \
                     digest in redis; not swapped in"
                ),
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
