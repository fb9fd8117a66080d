//! The connection to Redis and its state: connects in the background with backoff, hands
//! out cheap clones of the live connection, and drops it on the first failure or timeout so
//! that nothing queues behind a hung server. One log line per state change.
//!
//! Every failure path waits before the next connection (`backoff`: 100 ms doubling to 5 s,
//! jittered): a connection that fails right after it came up (a refused command, a damaged
//! key a caller did not expect) is retried less and less often, never in a loop; one that
//! stayed up for `backoff::HEALTHY_FOR` starts the backoff over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisFuture, RedisResult, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{TierError, TierResult};

/// Longest wait for a background command (publish, catch-up, bootstrap).
pub const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(2);

/// A background command with the background bound; a failure or timeout names `what` (the
/// follower's and the forget loop's commands alike).
pub async fn timed<T>(
    what: &str,
    future: impl std::future::Future<Output = RedisResult<T>>,
) -> TierResult<T> {
    match tokio::time::timeout(BACKGROUND_TIMEOUT, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(TierError::from(error).during(what)),
        Err(_) => Err(TierError::timed_out(what, BACKGROUND_TIMEOUT)),
    }
}
use super::backoff::{self, Backoff, MAX as BACKOFF_MAX};

/// A live connection: one server (through the connection manager) or a Redis Cluster.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Commands sent and reply bytes read until the tier's start is done (`startup_done`):
/// Stats `cluster_startup_commands` and `cluster_startup_bytes`. A daemon has one tier.
static COUNTING: AtomicBool = AtomicBool::new(true);
static STARTUP_COMMANDS: AtomicU64 = AtomicU64::new(0);
static STARTUP_BYTES: AtomicU64 = AtomicU64::new(0);

/// The commands and reply bytes counted so far.
pub fn startup_io() -> (u64, u64) {
    (
        STARTUP_COMMANDS.load(Ordering::Relaxed),
        STARTUP_BYTES.load(Ordering::Relaxed),
    )
}

/// The start is done: stops counting, returns the counts.
pub fn startup_done() -> (u64, u64) {
    COUNTING.store(false, Ordering::Relaxed);
    startup_io()
}

fn count_commands(n: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        STARTUP_COMMANDS.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The bytes of a reply's strings (what Redis sent, near enough).
fn reply_bytes(value: &Value) -> u64 {
    match value {
        Value::BulkString(bytes) => bytes.len() as u64,
        Value::SimpleString(text) => text.len() as u64,
        Value::Array(items) | Value::Set(items) => items.iter().map(reply_bytes).sum(),
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| reply_bytes(k) + reply_bytes(v))
            .sum(),
        _ => 8,
    }
}

fn counted<'a, T: Send + 'a>(
    n: usize,
    bytes: impl Fn(&T) -> u64 + Send + 'a,
    reply: RedisFuture<'a, T>,
) -> RedisFuture<'a, T> {
    if !COUNTING.load(Ordering::Relaxed) {
        return reply;
    }
    count_commands(n);
    Box::pin(async move {
        let reply = reply.await;
        if let Ok(value) = &reply {
            STARTUP_BYTES.fetch_add(bytes(value), Ordering::Relaxed);
        }
        reply
    })
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        };
        counted(1, reply_bytes, reply)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let reply = match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        };
        counted(
            count,
            |values: &Vec<Value>| values.iter().map(reply_bytes).sum(),
            reply,
        )
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A SCAN over every primary, a page (up to a thousand names) at a time, so a caller holds
/// one page, never every name.
pub struct ScanPages {
    /// Primaries still to scan; the last is being scanned.
    nodes: Vec<Option<(String, u16)>>,
    cursor: u64,
    pattern: String,
}

impl ScanPages {
    /// The next page of names; `None` when every primary is done.
    pub async fn next_page(&mut self, conn: &mut Conn) -> RedisResult<Option<Vec<String>>> {
        let Some(node) = self.nodes.last() else {
            return Ok(None);
        };
        let (next, names) = conn
            .scan_step(node.as_ref(), self.cursor, &self.pattern)
            .await?;
        self.cursor = next;
        if next == 0 {
            self.nodes.pop();
        }
        Ok(Some(names))
    }
}

impl Conn {
    /// Runs `cmd` on the node at `host:port` (cluster), or on the one server.
    pub async fn on_node(&mut self, node: Option<&(String, u16)>, cmd: &Cmd) -> RedisResult<Value> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    }),
                )
                .await
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Starts a SCAN of every name matching `pattern` on every primary (`ScanPages`).
    pub async fn scan_pages(&mut self, pattern: String) -> RedisResult<ScanPages> {
        Ok(ScanPages {
            nodes: self.scan_nodes().await?,
            cursor: 0,
            pattern,
        })
    }

    /// One SCAN step on `node` (see `scan_nodes`): the next cursor (0 when done) and the
    /// names matching `pattern`, up to a thousand at a time.
    async fn scan_step(
        &mut self,
        node: Option<&(String, u16)>,
        cursor: u64,
        pattern: &str,
    ) -> RedisResult<(u64, Vec<String>)> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = self.on_node(node, &scan).await?;
        redis::from_redis_value(&reply)
    }

    /// The primaries to SCAN: `[None]` for one server, every master's address for a cluster.
    pub async fn scan_nodes(&mut self) -> RedisResult<Vec<Option<(String, u16)>>> {
        let Conn::Cluster(_) = self else {
            return Ok(vec![None]);
        };
        let text: String = redis::cmd("CLUSTER").arg("NODES").query_async(self).await?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let flags = fields.get(2)?;
                if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                    return None;
                }
                let addr = fields.get(1)?.split('@').next()?;
                let (host, port) = addr.rsplit_once(':')?;
                Some(Some((host.to_owned(), port.parse().ok()?)))
            })
            .collect())
    }
}

/// Where the link stands, for Stats and health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    Connecting,
    Connected { cluster: bool },
    Down(String),
}

impl LinkState {
    pub fn describe(&self) -> String {
        match self {
            LinkState::Connecting => "connecting".to_owned(),
            LinkState::Connected { cluster: false } => "connected".to_owned(),
            LinkState::Connected { cluster: true } => "connected (redis cluster)".to_owned(),
            LinkState::Down(why) => format!("down: {why}"),
        }
    }
}

struct Current {
    conn: Option<Conn>,
    /// Bumped on every new connection, so a failure report about an old one is ignored.
    generation: u64,
    state: LinkState,
    /// When the live connection came up.
    connected_at: Option<Instant>,
    /// No new connection before this (the backoff after a failure).
    retry_at: Option<Instant>,
    backoff: Backoff,
}

pub struct Link {
    info: ConnectionInfo,
    shown_url: String,
    /// PEM roots for `rediss://` instead of the system's (`--cluster-tls-ca-file`).
    tls_ca: Option<Vec<u8>>,
    current: Mutex<Current>,
    /// Tells the connector to reconnect, and the followers that a new connection is up.
    changed: watch::Sender<u64>,
    pub counters: LinkCounters,
}

crate::report::stats_registry! {
    /// What the link counted.
    #[derive(Default)]
    pub struct LinkCounters {
        pub reconnects: AtomicU64 as cluster_reconnects => counter(60, "Reconnections to Redis."),
        /// Failed or timed-out Redis commands.
        pub errors: AtomicU64 as cluster_errors
            => counter(61, "Failed or timed-out Redis commands."),
    }
}

impl Link {
    pub fn new(info: ConnectionInfo, shown_url: String, tls_ca: Option<Vec<u8>>) -> Arc<Link> {
        Arc::new(Link {
            info,
            shown_url,
            tls_ca,
            current: Mutex::new(Current {
                conn: None,
                generation: 0,
                state: LinkState::Connecting,
                connected_at: None,
                retry_at: None,
                backoff: Backoff::new(super::random_u64()),
            }),
            changed: watch::channel(0).0,
            counters: LinkCounters::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        crate::sync::lock(&self.current)
    }

    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// A second connection of its own, for blocking reads that must not hold up the shared
    /// one (a multiplexed connection answers in order).
    pub async fn open_dedicated(&self) -> RedisResult<Conn> {
        match tokio::time::timeout(BACKGROUND_TIMEOUT * 2, self.connect()).await {
            Ok(result) => result.map(|(conn, _)| conn),
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::IoError,
                "connect timed out",
            ))),
        }
    }

    pub fn state(&self) -> LinkState {
        self.lock().state.clone()
    }

    /// The live connection and its generation, or `None` while there is none.
    pub fn conn(&self) -> Option<(Conn, u64)> {
        let current = self.lock();
        current.conn.clone().map(|c| (c, current.generation))
    }

    /// Resolves when a connection newer than `generation` is up.
    pub async fn wait_newer(&self, generation: u64) {
        let mut changes = self.changed.subscribe();
        let _ = changes.wait_for(|g| *g > generation).await;
    }

    /// A command on connection `generation` failed or timed out: drop that connection (its
    /// queued requests go with it) and reconnect.
    pub fn failed(&self, generation: u64, why: impl std::fmt::Display) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        let mut current = self.lock();
        if current.generation != generation || current.conn.is_none() {
            return;
        }
        current.conn = None;
        if current
            .connected_at
            .is_some_and(|at| at.elapsed() >= backoff::HEALTHY_FOR)
        {
            current.backoff.reset();
        }
        let wait = current.backoff.next_wait();
        current.retry_at = Some(Instant::now() + wait);
        let state = LinkState::Down(why.to_string());
        tracing::warn!(
            url = %self.shown_url,
            reason = %why,
            retry_in_ms = wait.as_millis() as u64,
            "cluster tier: lost the connection to redis; reconnecting"
        );
        current.state = state;
        drop(current);
        self.changed.send_modify(|_| {});
    }

    /// Keeps a connection up until `stop`: connects whenever there is none, after the
    /// backoff of the failure that dropped the last one.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut changes = self.changed.subscribe();
        loop {
            if self.lock().conn.is_none() {
                let retry_at = self.lock().retry_at.take();
                if let Some(at) = retry_at {
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = stop.cancelled() => return,
                    }
                }
                match tokio::time::timeout(BACKGROUND_TIMEOUT * 2, self.connect()).await {
                    Ok(Ok((conn, cluster))) => {
                        let generation = {
                            let mut current = self.lock();
                            current.generation += 1;
                            current.conn = Some(conn);
                            current.state = LinkState::Connected { cluster };
                            current.connected_at = Some(Instant::now());
                            current.generation
                        };
                        if generation > 1 {
                            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::info!(url = %self.shown_url, cluster, "cluster tier: connected to redis");
                        self.changed.send_replace(generation);
                    }
                    outcome => {
                        let why = match outcome {
                            Ok(Err(error)) => error.to_string(),
                            _ => format!("no answer within {:?}", BACKGROUND_TIMEOUT * 2),
                        };
                        {
                            let mut current = self.lock();
                            if !matches!(&current.state, LinkState::Down(_)) {
                                tracing::warn!(url = %self.shown_url, reason = %why, "cluster tier: redis unavailable; serving node-local, retrying with backoff");
                            }
                            current.state = LinkState::Down(why);
                            let wait = current.backoff.next_wait();
                            current.retry_at = Some(Instant::now() + wait);
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = changes.changed() => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Connects, and finds out whether the server is a Redis Cluster node.
    async fn connect(&self) -> RedisResult<(Conn, bool)> {
        let client = match &self.tls_ca {
            Some(pem) => redis::Client::build_with_tls(self.info.clone(), self.certificates(pem))?,
            None => redis::Client::open(self.info.clone())?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(BACKGROUND_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(BACKOFF_MAX.as_millis() as u64);
        let mut single = client.get_connection_manager_with_config(config).await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut single)
            .await?;
        // INFO and one SCRIPT LOAD a script: sent on the manager itself, counted here.
        count_commands(1 + super::scripts::COUNT);
        if !info.contains("cluster_enabled:1") {
            super::scripts::load_all(&mut single).await?;
            return Ok((Conn::Single(single), false));
        }
        drop(single);
        let mut builder = ClusterClient::builder(vec![self.info.clone()])
            .connection_timeout(BACKGROUND_TIMEOUT)
            .retries(2);
        if let Some(password) = &self.info.redis.password {
            builder = builder.password(password.clone());
        }
        if let Some(username) = &self.info.redis.username {
            builder = builder.username(username.clone());
        }
        if matches!(self.info.addr, ConnectionAddr::TcpTls { .. }) {
            builder = builder.tls(redis::TlsMode::Secure);
        }
        if let Some(pem) = &self.tls_ca {
            builder = builder.certs(self.certificates(pem));
        }
        let mut cluster = builder.build()?.get_async_connection().await?;
        super::scripts::load_all(&mut cluster).await?;
        Ok((Conn::Cluster(cluster), true))
    }
}

impl Link {
    fn certificates(&self, pem: &[u8]) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        }
    }
}

/// The URL as logs and Stats show it: scheme, user, address and db; never the password.
pub fn shown_url(info: &ConnectionInfo) -> String {
    let user = info
        .redis
        .username
        .as_deref()
        .map_or(String::new(), |u| format!("{u}@"));
    match &info.addr {
        ConnectionAddr::Tcp(host, port) => {
            format!("redis://{user}{host}:{port}/{}", info.redis.db)
        }
        ConnectionAddr::TcpTls { host, port, .. } => {
            format!("rediss://{user}{host}:{port}/{}", info.redis.db)
        }
        ConnectionAddr::Unix(path) => format!("redis+unix://{}", path.display()),
    }
}
