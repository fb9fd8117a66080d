//! Cluster-wide view pins: the first node to pin a key for a view wins, atomically (the
//! `PIN` script), and every node answers that view with it. A pin is the result's four
//! encoded fields (`keys::encode_result`) as a JSON array, in one hash per view that lives
//! for the view's idle time after its last pin or refresh.
//!
//! Bounded like the cluster lease: each call waits at most the cluster timeout, and Redis
//! slow or away is an error the caller answers with a node-local pin (`views`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::keys::{encode_at_artifacts, encode_epoch_time, Layout};
use super::scripts;
use super::values;
use super::Cluster;
use crate::error::{TierError, TierResult};
use crate::wire::stored::StoredEntry;

/// Pins per script call: one call is one round trip and one short stretch of Redis's time,
/// and one Scan chunk (`scan::CHUNK_ENTRIES`) is one call.
const PINS_PER_CALL: usize = crate::store::scan::CHUNK_ENTRIES;
/// Time a call may take beyond the cluster timeout, per pin: Redis runs the script for a few
/// µs per pin (4.2 µs measured), so a call of 1,024 pins must not be held to the timeout of
/// one key's claim (docs/bench/views.md).
const TIME_PER_PIN: Duration = Duration::from_micros(20);

/// Redis failed part way: the pins of the first `settled.len()` candidates, and why.
pub struct PinFailure {
    pub settled: Vec<StoredEntry>,
    pub why: TierError,
}

/// A proposal of one pin: the key's text, the encoded pin, and the pin it may replace.
struct Proposal {
    key_text: String,
    value: String,
    replace: String,
}

/// The result's four Redis fields (`keys::encode_result`) as a JSON array, written from the
/// stored record without decoding it into owned strings first.
fn encode_pin(entry: &StoredEntry) -> String {
    let result = entry.result();
    let fields = (
        encode_epoch_time(result.forget_epoch, result.time_us),
        result.config,
        result.tuned_by,
        encode_at_artifacts(result.tuned_at_unix_ms, result.artifacts),
    );
    // A JSON array of four strings: serializing it cannot fail.
    serde_json::to_string(&fields).unwrap_or_default()
}

/// One key's answer to PIN: `None` when its pin is the one proposed, else the pin it has.
fn parse_reply(value: redis::Value) -> TierResult<Option<String>> {
    match value {
        redis::Value::Int(0) => Ok(None),
        other => redis::from_redis_value::<String>(&other)
            .map(Some)
            .map_err(|e| TierError::refused(format!("unexpected reply to the pin script: {e}"))),
    }
}

/// A pin read back from Redis, checked like a learned result; `None` if corrupt.
fn decode_pin(entry: &StoredEntry, text: &str) -> Option<StoredEntry> {
    let [t, c, b, a]: [String; 4] = serde_json::from_str(text).ok()?;
    let result = values::result(&t, &c, &b, &a).ok()?;
    Some(StoredEntry::from_views(&entry.key(), &result.view()))
}

impl Cluster {
    /// Proposes `candidates` as `view`'s pins and returns, in order, the pin each key has in
    /// the cluster now: the candidate, or the one another node made first. A pin Redis holds
    /// that `forgotten` says a Forget removed is replaced by the candidate (compare-and-set).
    /// `ttl` keeps the view's hash alive. `Err` when Redis is away, slow or answers nonsense,
    /// with the pins of the keys Redis did answer for before (the first ones, in order).
    pub async fn pin_in_view(
        self: &Arc<Self>,
        view: &str,
        candidates: &[StoredEntry],
        ttl: Duration,
        forgotten: impl Fn(&StoredEntry) -> bool,
    ) -> Result<Vec<StoredEntry>, PinFailure> {
        let hash = self.redis.layout.view(view);
        let mut pins = Vec::with_capacity(candidates.len());
        for chunk in candidates.chunks(PINS_PER_CALL) {
            let proposals: Vec<Proposal> = chunk
                .iter()
                .map(|entry| Proposal {
                    key_text: Layout::key_text(&entry.key().to_key()),
                    value: encode_pin(entry),
                    replace: String::new(),
                })
                .collect();
            let replies = match self.propose(&hash, &proposals, ttl).await {
                Ok(replies) => replies,
                Err(why) => return Err(PinFailure { settled: pins, why }),
            };
            let mut stale = Vec::new();
            for (i, (entry, (proposal, reply))) in chunk
                .iter()
                .zip(proposals.into_iter().zip(replies))
                .enumerate()
            {
                let Some(reply) = reply else {
                    pins.push(entry.clone());
                    continue;
                };
                match decode_pin(entry, &reply) {
                    Some(pin) if !forgotten(&pin) => pins.push(pin),
                    // Removed by a Forget this node knows, or corrupt: replace it.
                    _ => {
                        pins.push(entry.clone());
                        stale.push((
                            i,
                            Proposal {
                                replace: reply,
                                ..proposal
                            },
                        ));
                    }
                }
            }
            if !stale.is_empty() {
                let base = pins.len() - chunk.len();
                let (at, proposals): (Vec<usize>, Vec<Proposal>) = stale.into_iter().unzip();
                let replies = match self.propose(&hash, &proposals, ttl).await {
                    Ok(replies) => replies,
                    Err(why) => {
                        pins.truncate(base);
                        return Err(PinFailure { settled: pins, why });
                    }
                };
                for (i, reply) in at.into_iter().zip(replies) {
                    let Some(reply) = reply else {
                        continue; // replaced by the candidate, already in place
                    };
                    if let Some(pin) = decode_pin(&chunk[i], &reply).filter(|p| !forgotten(p)) {
                        pins[base + i] = pin;
                    }
                }
            }
        }
        Ok(pins)
    }

    /// One PIN call, within the cluster timeout (plus Redis's time for the pins): for each
    /// proposal `None` if it is the pin now, else the pin Redis holds.
    async fn propose(
        &self,
        hash: &str,
        proposals: &[Proposal],
        ttl: Duration,
    ) -> TierResult<Vec<Option<String>>> {
        let Some((mut conn, generation)) = self.redis.link.conn() else {
            return Err(TierError::unavailable(format!(
                "redis is {}",
                self.redis.link.state().describe()
            )));
        };
        let mut invocation = scripts::PIN.prepare_invoke();
        invocation.key(hash).arg(ttl.as_millis().max(1) as u64);
        for proposal in proposals {
            invocation
                .arg(&proposal.key_text)
                .arg(&proposal.value)
                .arg(&proposal.replace);
        }
        let call = invocation.invoke_async::<Vec<redis::Value>>(&mut conn);
        let budget = self.tuning.timeout + TIME_PER_PIN * proposals.len() as u32;
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(replies)) if replies.len() == proposals.len() => {
                self.observed.slow_claims.store(0, Ordering::Relaxed);
                replies.into_iter().map(parse_reply).collect()
            }
            Ok(Ok(_)) => Err(TierError::refused("unexpected reply to the pin script")),
            Ok(Err(error)) => {
                self.command_failed(generation, &error, &[hash]);
                Err(TierError::from(error))
            }
            Err(_) => {
                // One slow answer may be load; a few in a row is a hung server.
                if self.observed.slow_claims.fetch_add(1, Ordering::Relaxed) + 1 >= 3 {
                    self.redis
                        .link
                        .failed(generation, "no answer within the cluster timeout");
                }
                Err(TierError::unavailable(format!(
                    "redis did not answer within {} ms",
                    budget.as_millis()
                )))
            }
        }
    }

    /// Keeps the pins of `views` alive in Redis for `ttl` (views read on this node from its
    /// own pins, which need no call, would otherwise expire there while still in use).
    pub async fn refresh_views(&self, views: &[String], ttl: Duration) {
        let Some((mut conn, generation)) = self.redis.link.conn() else {
            return;
        };
        let mut pipe = redis::pipe();
        for view in views {
            pipe.cmd("PEXPIRE")
                .arg(self.redis.layout.view(view))
                .arg(ttl.as_millis().max(1) as u64)
                .ignore();
        }
        let call = pipe.query_async::<()>(&mut conn);
        match tokio::time::timeout(super::link::BACKGROUND_TIMEOUT, call).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => self.redis.link.failed(generation, error),
            Err(_) => self.redis.link.failed(generation, "view refresh timed out"),
        }
    }

    /// Deletes `view`'s pins in Redis (an operator ended it). `Err` when Redis is away.
    pub async fn end_view(&self, view: &str) -> TierResult<()> {
        let Some((mut conn, generation)) = self.redis.link.conn() else {
            return Err(TierError::unavailable(format!(
                "redis is {}",
                self.redis.link.state().describe()
            )));
        };
        let mut delete = redis::cmd("DEL");
        delete.arg(self.redis.layout.view(view));
        let call = delete.query_async::<i64>(&mut conn);
        match tokio::time::timeout(self.tuning.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => {
                self.redis.link.failed(generation, &error);
                Err(TierError::from(error))
            }
            Err(_) => Err(TierError::unavailable(format!(
                "redis did not answer within {} ms",
                self.tuning.timeout.as_millis()
            ))),
        }
    }
}
