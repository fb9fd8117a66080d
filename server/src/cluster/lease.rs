//! Cross-node single-flight: the cluster lease on a missing key. Taken with SET NX PX and a
//! random token (inside a script that first checks for a stored result), renewed while the
//! local lease or tuner job lives, released by compare-and-delete. Correctness never depends
//! on it: it only saves duplicate tunings.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio_util::sync::CancellationToken;

use super::keys::Layout;
use super::refusals;
use super::scripts;
use super::values;
use super::Cluster;
use crate::model::entry::{CacheKey, TunedResult};

/// What asking the cluster for a key's lease found.
pub enum Claim {
    /// This node holds the cluster lease now; it lasts while the guard lives.
    Acquired(ClusterLease),
    /// Another node holds it; ask again after `retry_in`.
    HeldBy { holder: String, retry_in: Duration },
    /// The cluster already has a result (this node had not learned it yet).
    Found(TunedResult),
    /// Redis did not answer in time or is down: coordinate node-locally.
    Unavailable(String),
}

/// A cluster lease held by this node. Dropping it releases the lease (compare-and-delete);
/// `keep_for_result` instead lets the publish of the result delete it, so no other node can
/// take the lease between the local result and its arrival in Redis.
pub struct ClusterLease {
    cluster: Arc<Cluster>,
    key: CacheKey,
    token: String,
    renewal: CancellationToken,
    release: bool,
}

impl ClusterLease {
    pub fn keep_for_result(mut self) {
        self.release = false;
    }
}

impl Drop for ClusterLease {
    fn drop(&mut self) {
        self.renewal.cancel();
        if !self.release {
            return;
        }
        let cluster = Arc::clone(&self.cluster);
        let lease = cluster.redis.layout.lease(&self.key);
        let token = std::mem::take(&mut self.token);
        let tasks = cluster.tasks.clone();
        tasks.spawn(async move {
            let Some((mut conn, generation)) = cluster.redis.link.conn() else {
                return; // it expires on its own
            };
            let mut invocation = scripts::RELEASE.prepare_invoke();
            invocation.key(&lease).arg(token);
            let release = invocation.invoke_async::<i64>(&mut conn);
            match tokio::time::timeout(super::link::BACKGROUND_TIMEOUT, release).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => cluster.command_failed(generation, &error, &[&lease]),
                Err(_) => cluster
                    .redis
                    .link
                    .failed(generation, "lease release timed out"),
            }
        });
    }
}

impl Cluster {
    /// Asks for the cluster lease on `key`, waiting at most the cluster timeout.
    pub async fn claim(self: &Arc<Self>, key: &CacheKey) -> Claim {
        let Some((mut conn, generation)) = self.redis.link.conn() else {
            self.counters
                .lease_fallbacks
                .fetch_add(1, Ordering::Relaxed);
            return Claim::Unavailable(format!("redis is {}", self.redis.link.state().describe()));
        };
        let token = self.new_token();
        let ttl_ms = self.tuning.lease_ttl.as_millis() as u64;
        let text = Layout::key_text(key);
        let mut invocation = scripts::ACQUIRE.prepare_invoke();
        invocation
            .key(self.redis.layout.entry_of_text(&text))
            .key(self.redis.layout.lease_of_text(&text))
            .arg(&token)
            .arg(ttl_ms);
        let reply = tokio::time::timeout(
            self.tuning.timeout,
            invocation.invoke_async::<Value>(&mut conn),
        )
        .await;
        let reply = match reply {
            Ok(Ok(reply)) => {
                self.observed.slow_claims.store(0, Ordering::Relaxed);
                reply
            }
            Ok(Err(error)) => {
                self.counters
                    .lease_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                let (entry, lease) = (
                    self.redis.layout.entry_of_text(&text),
                    self.redis.layout.lease_of_text(&text),
                );
                self.command_failed(generation, &error, &[&entry, &lease]);
                return Claim::Unavailable(if refusals::is_wrong_type(&error) {
                    "a key of this entry in redis holds the wrong type".to_owned()
                } else {
                    error.to_string()
                });
            }
            Err(_) => {
                self.counters
                    .lease_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                // One slow answer may be load; a few in a row is a hung server.
                if self.observed.slow_claims.fetch_add(1, Ordering::Relaxed) + 1 >= 3 {
                    self.redis
                        .link
                        .failed(generation, "no answer within the cluster timeout");
                }
                return Claim::Unavailable(format!(
                    "redis did not answer within {} ms",
                    self.tuning.timeout.as_millis()
                ));
            }
        };
        match parse_claim(reply) {
            Some(ParsedClaim::Acquired) => {
                self.counters
                    .leases_acquired
                    .fetch_add(1, Ordering::Relaxed);
                let renewal = self.tasks.stop_token().child_token();
                self.tasks.spawn(renew(
                    Arc::clone(self),
                    self.redis.layout.lease(key),
                    token.clone(),
                    renewal.clone(),
                ));
                Claim::Acquired(ClusterLease {
                    cluster: Arc::clone(self),
                    key: key.clone(),
                    token,
                    renewal,
                    release: true,
                })
            }
            Some(ParsedClaim::Held { holder, pttl_ms }) => {
                self.counters
                    .leases_held_elsewhere
                    .fetch_add(1, Ordering::Relaxed);
                let holder = holder.split('/').next().unwrap_or_default().to_owned();
                let retry_in = Duration::from_millis(
                    pttl_ms.clamp(5, self.tuning.lease_ttl.as_millis() as i64) as u64 + 5,
                );
                Claim::HeldBy { holder, retry_in }
            }
            Some(ParsedClaim::Hit(result)) => Claim::Found(result),
            None => {
                self.counters
                    .lease_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                Claim::Unavailable("unexpected reply to the lease script".to_owned())
            }
        }
    }

    /// `<node name>/<random>`: the node is shown to waiters, the random part makes it unique.
    fn new_token(&self) -> String {
        let n = self.token_counter.fetch_add(1, Ordering::Relaxed);
        format!("{}/{:016x}{n:x}", self.node_name, self.instance)
    }
}

enum ParsedClaim {
    Acquired,
    Held { holder: String, pttl_ms: i64 },
    Hit(TunedResult),
}

fn text(value: &Value) -> Option<String> {
    redis::from_redis_value::<String>(value).ok()
}

fn parse_claim(reply: Value) -> Option<ParsedClaim> {
    let Value::Array(items) = reply else {
        return None;
    };
    match text(items.first()?)?.as_str() {
        "acquired" => Some(ParsedClaim::Acquired),
        "held" => Some(ParsedClaim::Held {
            holder: text(items.get(1)?)?,
            pttl_ms: redis::from_redis_value::<i64>(items.get(2)?).ok()?,
        }),
        "hit" => Some(ParsedClaim::Hit(
            values::result(
                &text(items.get(1)?)?,
                &text(items.get(2)?)?,
                &text(items.get(3)?)?,
                &text(items.get(4)?)?,
            )
            .ok()?,
        )),
        _ => None,
    }
}

/// Extends the lease every third of its length until cancelled or lost.
async fn renew(cluster: Arc<Cluster>, lease: String, token: String, stop: CancellationToken) {
    let every = cluster.tuning.lease_ttl / 3;
    let ttl_ms = cluster.tuning.lease_ttl.as_millis() as u64;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let Some((mut conn, generation)) = cluster.redis.link.conn() else {
            continue; // try again next period; if it lapses, another node may tune too
        };
        let mut invocation = scripts::RENEW.prepare_invoke();
        invocation.key(&lease).arg(&token).arg(ttl_ms);
        let renewal = invocation.invoke_async::<i64>(&mut conn);
        match tokio::time::timeout(super::link::BACKGROUND_TIMEOUT, renewal).await {
            Ok(Ok(1)) => {}
            Ok(Ok(_)) => return, // lost (expired, or the key got a result): nothing to keep
            Ok(Err(error)) => cluster.command_failed(generation, &error, &[&lease]),
            Err(_) => cluster
                .redis
                .link
                .failed(generation, "lease renewal timed out"),
        }
    }
}
