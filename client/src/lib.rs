//! Thin async client for the `tunecached` node daemon.
//!
//! `Client::connect` opens the daemon's Unix socket; every call carries a deadline so a
//! rank never hangs on the cache. The generated gRPC client is available through
//! [`Client::raw`] for anything this wrapper does not cover.
//!
//! A client reads in the view its environment names (see [`view`]): the job's ranks then all see
//! the same result for a key, the first one any of them read.
//!
//! The policies every client needs are here, once, and the Python binding exposes them: tuning
//! under the daemon's lease ([`tuning`]: `begin_tune`, `finish_tune`, `abandon`, and the rank
//! flow [`Client::get_or_tune`] built on them) and storing a batch so that every valid entry is
//! kept ([`record`]: `record_keeping_valid`), and moving a result's artifacts, the files a tuner
//! built, to and from the daemon, verified by their digests ([`artifacts`]: `put_artifact`,
//! `put_artifacts`, `fetch_artifacts`, `get_artifact`, `stat_artifacts`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tunecache_proto::limits::MAX_MESSAGE_BYTES;
use tunecache_proto::v1::{self, tune_cache_client::TuneCacheClient};

pub mod artifacts;
pub mod autostart;
pub mod encoded_scan;
mod fetch;
mod handed;
pub mod handoff;
pub mod opening;
pub mod record;
pub mod tuning;
pub mod view;

pub use artifacts::{StoredArtifact, DEFAULT_ARTIFACT_TIMEOUT};
pub use record::{KeptRecord, RefusedEntry};
pub use tuning::{FinishFailed, LeaseAfterFailure, TuneLease, TuneStart};

pub use tunecache_proto::socket_path::{default_socket_path, UntrustedSocket};
pub use tunecache_proto::v1 as proto;

/// Default deadline of unary calls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline of a whole Scan.
pub const DEFAULT_SCAN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach tunecached at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{} ({:?})", .0.message(), .0.code())]
    Rpc(tonic::Status),
    #[error("auto-start: {0}")]
    Autostart(#[from] autostart::AutostartError),
    /// The default socket location is not private to the caller (see [`socket_path`]).
    #[error(transparent)]
    UntrustedSocket(#[from] UntrustedSocket),
    /// The daemon answering on the socket runs as a uid the caller does not trust.
    #[error(
        "refusing the daemon at {}: it runs as uid {uid}, not as this user ({me}) or root; \
         another user may have put it there. To trust that uid (e.g. the system unit's \
         `tunecache` user), set {TRUST_UID_ENV}={uid}",
        path.display()
    )]
    UntrustedDaemon { path: PathBuf, uid: u32, me: u32 },
    /// A local file operation of an artifact's upload or fetch failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An artifact refused by this client: a name or digest the contract does not allow
    /// (`tunecache_proto::artifact`), or bytes the daemon sent that are not the blob named.
    #[error("artifact refused: {0}")]
    Artifact(String),
}

/// Extra daemon uids a client trusts besides its own and root's (comma-separated), for a
/// daemon run by another account, e.g. the system unit's `tunecache` user.
pub const TRUST_UID_ENV: &str = "TUNECACHE_TRUST_UID";

/// The uids whose daemon this process talks to: its own, root, and `$TUNECACHE_TRUST_UID`.
pub(crate) fn trusted_daemon_uids() -> Vec<u32> {
    let mut uids = vec![nix::unistd::geteuid().as_raw(), 0];
    if let Ok(list) = std::env::var(TRUST_UID_ENV) {
        uids.extend(list.split(',').filter_map(|u| u.trim().parse::<u32>().ok()));
    }
    uids
}

/// Refuses a daemon that runs as an untrusted uid, before any request is made: connects to
/// `path` once, reads the answering process's uid (SO_PEERCRED) and closes again. Returns that
/// uid, or `None` when nothing answers there (the calls then fail as usual). Blocking, for
/// callers that check when a client is made rather than on its first call (the Python binding);
/// [`connect_channel`] makes the same check on every connection it opens.
pub fn check_daemon_uid(path: &Path) -> Result<Option<u32>> {
    let Ok(stream) = std::os::unix::net::UnixStream::connect(path) else {
        return Ok(None);
    };
    let uid =
        match nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials) {
            Ok(credentials) => credentials.uid(),
            Err(_) => return Ok(None),
        };
    if trusted_daemon_uids().contains(&uid) {
        Ok(Some(uid))
    } else {
        Err(ClientError::UntrustedDaemon {
            path: path.to_path_buf(),
            uid,
            me: nix::unistd::geteuid().as_raw(),
        })
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Rpc(status)
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// The socket to use: `explicit` when given, else `$TUNECACHE_SOCKET`, else the built-in
/// default (`$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then `/tmp/tunecache-<uid>/...`).
///
/// A named path is trusted. The built-in default is refused when another user could have
/// planted it: its directory and the socket, where they exist, must be owned by the caller's
/// uid or root, the directory must not be writable by group or others, and neither may be a
/// symbolic link.
pub fn socket_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    use tunecache_proto::socket_path::{check_default_socket, resolve_socket_path, Origin};
    if let Some(path) = explicit {
        return Ok(path);
    }
    let (path, origin) = resolve_socket_path();
    if origin == Origin::Default {
        check_default_socket(&path)?;
    }
    Ok(path)
}

#[derive(Clone)]
pub struct Client {
    inner: TuneCacheClient<Channel>,
    /// The same channel, for calls with a codec of their own ([`encoded_scan`]).
    channel: Channel,
    timeout: Duration,
    /// Sent in every Lookup, Scan and Resolve; empty for none.
    view: String,
    /// The descriptor handoff's socket, beside the gRPC socket ([`handoff`]); `None`: off.
    handoff: Option<std::sync::Arc<PathBuf>>,
    /// Hash every handed blob's copy too (`TUNECACHE_VERIFY=1`, [`Client::verify_handoffs`]).
    verify_handoffs: bool,
}

/// Opens a gRPC channel over the Unix socket at `path`. The `:authority` is `localhost`.
///
/// The daemon's uid is read from the connection itself (SO_PEERCRED), so the process checked
/// is the one answering, with no gap between check and connect: a socket served by a uid
/// other than the caller's, root's or one in `$TUNECACHE_TRUST_UID` is refused, named or not.
pub async fn connect_channel(path: &Path) -> Result<Channel> {
    let socket = path.to_path_buf();
    let trusted = trusted_daemon_uids();
    let refused: std::sync::Arc<std::sync::Mutex<Option<u32>>> = Default::default();
    let refused_in_connector = std::sync::Arc::clone(&refused);
    // The URI is required by the transport but unused: the connector below dials the socket.
    let connected = Endpoint::from_static("http://localhost")
        .connect_timeout(DEFAULT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            let trusted = trusted.clone();
            let refused = std::sync::Arc::clone(&refused_in_connector);
            async move {
                let stream = UnixStream::connect(socket).await?;
                let uid = stream.peer_cred()?.uid();
                if !trusted.contains(&uid) {
                    if let Ok(mut slot) = refused.lock() {
                        *slot = Some(uid);
                    }
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the daemon runs as uid {uid}, which this client does not trust"),
                    ));
                }
                Ok(TokioIo::new(stream))
            }
        }))
        .await;
    connected.map_err(|source| match refused.lock().ok().and_then(|slot| *slot) {
        Some(uid) => ClientError::UntrustedDaemon {
            path: path.to_path_buf(),
            uid,
            me: nix::unistd::geteuid().as_raw(),
        },
        None => ClientError::Connect {
            path: path.to_path_buf(),
            source,
        },
    })
}

impl Client {
    /// Connects to the daemon at `path`, reading in the view the environment names
    /// ([`view::view_from_env`]).
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let channel = connect_channel(path.as_ref()).await?;
        Ok(Client {
            inner: TuneCacheClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            channel,
            timeout: DEFAULT_TIMEOUT,
            view: view::view_from_env(None),
            handoff: handoff::socket_for(path.as_ref()).map(std::sync::Arc::new),
            verify_handoffs: handoff::verify_from_env(),
        })
    }

    /// Whether a blob handed as a descriptor is hashed as it is copied, and refused if its
    /// bytes changed after the daemon checked them (which a rank of the daemon's own uid can
    /// do). Off by default: the copy's size is checked. `TUNECACHE_VERIFY=1` turns it on.
    pub fn verify_handoffs(mut self, on: bool) -> Client {
        self.verify_handoffs = on;
        self
    }

    /// Streams every blob through GetArtifact, never taking a descriptor ([`handoff`]).
    pub fn without_handoff(mut self) -> Client {
        self.handoff = None;
        self
    }

    /// Connects to the daemon at the default socket (`$TUNECACHE_SOCKET`, then
    /// `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then `/tmp/tunecache-<uid>/...`), refusing
    /// a built-in default another user could have planted (see [`socket_path`]).
    /// With `TUNECACHE_AUTOSTART=1`, starts a daemon there if none answers.
    pub async fn connect_default() -> Result<Client> {
        Client::connect_auto(socket_path(None)?).await
    }

    /// [`Client::connect_or_start`] when `TUNECACHE_AUTOSTART=1`, else [`Client::connect`].
    pub async fn connect_auto(path: impl AsRef<Path>) -> Result<Client> {
        if autostart::enabled_by_env() {
            Client::connect_or_start(path).await
        } else {
            Client::connect(path).await
        }
    }

    /// Connects to the daemon at `path`, starting one (detached, exiting when idle) if none
    /// answers, and waits until it answers. Safe for all ranks of a node to call at once:
    /// exactly one daemon comes up (see [`autostart`]).
    pub async fn connect_or_start(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref();
        let answering = || async move {
            let client = Client::connect(path).await?;
            // Connected is not enough: the socket may belong to a daemon that is exiting.
            client.stats().await?;
            Ok::<_, ClientError>(client)
        };
        autostart::connect_or_start(path, autostart::DEFAULT_START_TIMEOUT, answering).await?
    }

    /// Sets the deadline of unary calls.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// Resolves the view again with `explicit` as the last resort: it is used only when neither
    /// `TUNECACHE_VIEW`, Slurm nor torchrun names one (see [`view`]), so that all ranks of a
    /// launched job agree. An empty `explicit` adds nothing.
    pub fn with_view(mut self, explicit: &str) -> Client {
        self.view = view::view_from_env(Some(explicit));
        self
    }

    /// Reads in exactly `view` (empty: none), a name resolved earlier with [`view::view_from_env`]:
    /// for a client connected later than it was configured (the Python binding connects on the
    /// first call), so that the environment at that later moment does not change its view.
    pub fn in_view(mut self, view: String) -> Client {
        self.view = view;
        self
    }

    /// The view this client reads in; empty for none.
    pub fn view(&self) -> &str {
        &self.view
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn raw(&self) -> TuneCacheClient<Channel> {
        self.inner.clone()
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        request
    }

    /// Looks keys up in this client's view; returns the hits only, in request order.
    pub async fn lookup(&self, keys: Vec<v1::Key>) -> Result<Vec<v1::Entry>> {
        let message = v1::LookupRequest {
            keys,
            view: self.view.clone(),
        };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.lookup(request).await }
        });
        Ok(answer.await?.into_inner().hits)
    }

    /// Records results; the daemon keeps, per key, the best under its merge rule.
    pub async fn record(&self, entries: Vec<v1::Entry>) -> Result<v1::RecordResponse> {
        self.record_with_lease(entries, String::new()).await
    }

    /// Records results that complete the lease `Resolve` handed out.
    pub async fn record_with_lease(
        &self,
        entries: Vec<v1::Entry>,
        lease_id: String,
    ) -> Result<v1::RecordResponse> {
        let message = v1::RecordRequest { entries, lease_id };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.record(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Every entry matching the filter (empty = everything), read chunk by chunk, in this
    /// client's view.
    pub async fn scan(&self, namespace: &str, device: &str) -> Result<Vec<v1::Entry>> {
        self.scan_with(v1::ScanRequest {
            namespace: namespace.to_owned(),
            device: device.to_owned(),
            rank: None,
            // scan_with fills in this client's view.
            view: String::new(),
        })
        .await
    }

    /// What rank `rank` loads at start: the shared entries and its own, of one namespace
    /// (and device, unless empty), in this client's view.
    pub async fn scan_for_rank(
        &self,
        namespace: &str,
        device: &str,
        rank: u32,
    ) -> Result<Vec<v1::Entry>> {
        self.scan_with(v1::ScanRequest {
            namespace: namespace.to_owned(),
            device: device.to_owned(),
            rank: Some(rank),
            // scan_with fills in this client's view.
            view: String::new(),
        })
        .await
    }

    /// Scan with any filter the contract offers, in the filter's view, or this client's when the
    /// filter names none.
    pub async fn scan_with(&self, mut filter: v1::ScanRequest) -> Result<Vec<v1::Entry>> {
        if filter.view.is_empty() {
            filter.view.clone_from(&self.view);
        }
        let answer = opening::call(filter, DEFAULT_SCAN_TIMEOUT, |request| {
            let mut inner = self.inner.clone();
            async move { inner.scan(request).await }
        });
        let mut stream = answer.await?.into_inner();
        let mut entries = Vec::new();
        while let Some(chunk) = stream.message().await? {
            entries.extend(chunk.entries);
        }
        Ok(entries)
    }

    /// The node's tuning devices; `fingerprint` is the `Key.device` the node tuner answers.
    pub async fn devices(&self) -> Result<Vec<v1::Device>> {
        let answer = opening::call(v1::DevicesRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.devices(request).await }
        });
        Ok(answer.await?.into_inner().devices)
    }

    pub async fn stats(&self) -> Result<v1::StatsResponse> {
        let answer = opening::call(v1::StatsRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.stats(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Publishes this node's new contributions to the shared directory now.
    pub async fn snapshot(&self) -> Result<v1::SnapshotResponse> {
        let answer = opening::call(v1::SnapshotRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.snapshot(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Ends the lease `Resolve` handed out without a result (a Record with the lease and no
    /// entries), so the next waiter that can tune gets it at once.
    pub async fn give_up_lease(&self, lease_id: String) -> Result<v1::RecordResponse> {
        self.record_with_lease(Vec::new(), lease_id).await
    }

    /// Forgets results on every node (see `ForgetRequest`): a scope (an administrator's act),
    /// or one exact key `only_if` its winner is still the given result. Answers how many
    /// entries this node dropped.
    pub async fn forget(&self, forget: v1::ForgetRequest) -> Result<u32> {
        let answer = opening::call(forget, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.forget(request).await }
        });
        Ok(answer.await?.into_inner().forgotten)
    }

    /// The views this node holds (every uid's for an administrator, else the caller's own),
    /// in (uid, name) order, read page by page.
    pub async fn list_views(&self) -> Result<Vec<v1::ViewInfo>> {
        let mut views = Vec::new();
        let mut after = String::new();
        loop {
            let message = v1::ListViewsRequest { limit: 0, after };
            let answer = opening::call(message, self.timeout, |request| {
                let mut inner = self.inner.clone();
                async move { inner.list_views(request).await }
            });
            let page = answer.await?.into_inner();
            views.extend(page.views);
            if page.next.is_empty() {
                return Ok(views);
            }
            after = page.next;
        }
    }

    /// Ends the view `name` on this node (and, with the cluster tier, in Redis): its pins are
    /// dropped and the next read in it pins afresh. An administrator's act.
    pub async fn end_view(&self, name: &str) -> Result<v1::EndViewResponse> {
        let message = v1::EndViewRequest {
            name: name.to_owned(),
        };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.end_view(request).await }
        });
        Ok(answer.await?.into_inner())
    }
}

/// What `Resolve` told the caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Cached, or tuned by someone else while the caller waited.
    Hit(v1::Result),
    /// The caller tunes it now, then records with this lease.
    TuneHere(v1::Lease),
    /// Nobody will have a result in time; the reason says why. Use the default tactic.
    Miss(String),
}

/// How a rank resolves a key.
#[derive(Debug, Clone, Copy)]
pub struct ResolveOptions {
    /// How long to wait for someone else's result.
    pub wait: Duration,
    /// Whether this caller can tune the problem itself.
    pub can_tune: bool,
    /// How long tuning takes at most, if this caller gets the lease (zero: daemon default).
    pub lease: Duration,
}

impl Default for ResolveOptions {
    fn default() -> Self {
        ResolveOptions {
            wait: Duration::from_secs(120),
            can_tune: true,
            lease: Duration::ZERO,
        }
    }
}

/// How the rank flow ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RankOutcome {
    /// Cached, or tuned by another rank or the node's tuner.
    Cached(v1::Result),
    /// This rank tuned it and recorded the result.
    Tuned(v1::Result),
    /// No result: use the fallback (default tactic). The reason says why.
    Fallback(String),
}

impl RankOutcome {
    /// The result, if any; `None` means use the fallback.
    pub fn result(&self) -> Option<&v1::Result> {
        match self {
            RankOutcome::Cached(result) | RankOutcome::Tuned(result) => Some(result),
            RankOutcome::Fallback(_) => None,
        }
    }
}

fn millis_u32(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}

impl Client {
    /// Asks the daemon for `key` in this client's view: a hit, a lease to tune it here, or a
    /// miss after waiting.
    pub async fn resolve(&self, key: v1::Key, options: ResolveOptions) -> Result<Resolution> {
        use v1::resolve_response::Outcome;
        let message = v1::ResolveRequest {
            key: Some(key),
            wait_ms: millis_u32(options.wait),
            can_tune: options.can_tune,
            lease_ms: millis_u32(options.lease),
            view: self.view.clone(),
        };
        let answer = opening::call(message, options.wait + self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.resolve(request).await }
        });
        let response = answer.await?.into_inner();
        Ok(match response.outcome {
            Some(Outcome::Hit(result)) => Resolution::Hit(result),
            Some(Outcome::TuneHere(lease)) => Resolution::TuneHere(lease),
            Some(Outcome::Miss(miss)) => Resolution::Miss(miss.reason),
            None => Resolution::Miss("the daemon sent no outcome".to_owned()),
        })
    }

    /// The whole rank flow: resolve; if told to tune, run `tune` and record its result
    /// with the lease (or give the lease up if `tune` fails); on a miss, fall back. Errors
    /// talking to the daemon also fall back: a rank never fails because of its cache.
    ///
    /// Files beside the config (a compiled kernel): `tune` uploads them and names them in the
    /// result's `artifacts`, `result.artifacts = client.put_artifacts([("kernel.cubin", path)])
    /// .await?`, since a Record may name only blobs the node holds. A rank that gets the
    /// result (cached or tuned) writes them out with [`Client::fetch_artifacts`].
    pub async fn get_or_tune<F, Fut, E>(
        &self,
        key: v1::Key,
        options: ResolveOptions,
        tune: F,
    ) -> RankOutcome
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<v1::Result, E>>,
        E: std::fmt::Display,
    {
        self.get_or_tune_traced(key, options, tune).await.0
    }

    /// [`Client::get_or_tune`], also answering each daemon call that failed on the way, for a
    /// caller that reports them (the Python binding logs them, once per process).
    ///
    /// The flow is [`Client::begin_tune`], `tune`, then [`Client::finish_tune`] (or
    /// [`Client::abandon`] when `tune` fails). A Record the daemon refuses as invalid
    /// (`INVALID_ARGUMENT`: a config over 64 KiB, or not JSON) is a fallback: no other rank will
    /// ever get that result, and a rank that used it would disagree with its peers. Any other
    /// failed Record keeps the tuned result. What becomes of the lease then is
    /// [`tuning::gives_up_after`]'s rule.
    pub async fn get_or_tune_traced<F, Fut, E>(
        &self,
        key: v1::Key,
        options: ResolveOptions,
        tune: F,
    ) -> (RankOutcome, Vec<FlowFailure>)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<v1::Result, E>>,
        E: std::fmt::Display,
    {
        let mut failures = Vec::new();
        let lease = match self.begin_tune(key, options).await {
            Ok(TuneStart::Hit(result)) => return (RankOutcome::Cached(result), failures),
            Ok(TuneStart::Miss(reason)) => return (RankOutcome::Fallback(reason), failures),
            Ok(TuneStart::Tune(lease)) => lease,
            Err(error) => {
                let reason = format!("tunecache unavailable: {error}");
                failures.push(FlowFailure {
                    call: FlowCall::Resolve,
                    error,
                });
                return (RankOutcome::Fallback(reason), failures);
            }
        };
        let result = match tune().await {
            Ok(result) => result,
            Err(error) => {
                if let Err(give_up) = self.abandon(lease).await {
                    failures.push(FlowFailure {
                        call: FlowCall::GiveUpLease,
                        error: give_up,
                    });
                }
                return (
                    RankOutcome::Fallback(format!("tuning failed: {error}")),
                    failures,
                );
            }
        };
        let failed = match self.finish_tune(lease, result.clone()).await {
            Ok(_) => return (RankOutcome::Tuned(result), failures),
            Err(failed) => failed,
        };
        let outcome = if failed.refused() {
            let message = match &failed.error {
                ClientError::Rpc(status) => status.message().to_owned(),
                other => other.to_string(),
            };
            RankOutcome::Fallback(format!("the daemon refused the tuned result: {message}"))
        } else {
            RankOutcome::Tuned(result)
        };
        let FinishFailed { error, lease } = failed;
        failures.push(FlowFailure {
            call: FlowCall::Record,
            error,
        });
        if let LeaseAfterFailure::GiveUpFailed(give_up) = lease {
            failures.push(FlowFailure {
                call: FlowCall::GiveUpLease,
                error: give_up,
            });
        }
        (outcome, failures)
    }
}

/// Which daemon call of the rank flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowCall {
    Resolve,
    /// The Record of the tuned result, with the lease.
    Record,
    /// The Record with the lease and no entries that gives the lease up.
    GiveUpLease,
}

/// A daemon call of the rank flow that failed; the flow went on (see
/// [`Client::get_or_tune_traced`]).
#[derive(Debug)]
pub struct FlowFailure {
    pub call: FlowCall,
    pub error: ClientError,
}

/// Whether a call ran past its deadline: the daemon's DEADLINE_EXCEEDED, or this client's own
/// timeout, which tonic reports as CANCELLED "Timeout expired" (`tonic::TimeoutExpired`).
pub fn past_deadline(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::DeadlineExceeded
        || (status.code() == tonic::Code::Cancelled
            && status.message() == tonic::TimeoutExpired(()).to_string())
}

/// The index of the entry a Record's INVALID_ARGUMENT refused, read from the status's
/// `google.rpc.BadRequest` detail (its field path is `entries[<index>]...`); `None` when the
/// status names no entry. A caller drops that entry and sends the rest again.
pub fn refused_entry_index(status: &tonic::Status) -> Option<usize> {
    use tonic_types::StatusExt;
    if status.code() != tonic::Code::InvalidArgument {
        return None;
    }
    status
        .get_details_bad_request()?
        .field_violations
        .iter()
        .find_map(|violation| {
            let rest = violation.field.strip_prefix("entries[")?;
            rest[..rest.find(']')?].parse().ok()
        })
}

/// Builds a key; `rank: None` is the entry shared by all ranks.
pub fn key(namespace: &str, op: &str, device: &str, problem: &str, rank: Option<u32>) -> v1::Key {
    v1::Key {
        namespace: namespace.to_owned(),
        op: op.to_owned(),
        device: device.to_owned(),
        problem: problem.to_owned(),
        rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_deadline_is_the_daemons_deadline_or_this_clients_own_timer() {
        assert!(past_deadline(&tonic::Status::deadline_exceeded("late")));
        // What tonic reports when the client's own request timeout fires.
        assert!(past_deadline(&tonic::Status::cancelled(
            tonic::TimeoutExpired(()).to_string()
        )));
        assert!(!past_deadline(&tonic::Status::cancelled(
            "the caller went away"
        )));
        assert!(!past_deadline(&tonic::Status::unavailable(
            "Timeout expired"
        )));
    }
}
