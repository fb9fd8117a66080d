//! Who may use the socket. Two layers: the file system (socket mode 0660, and `--socket-group`
//! to hand the group to the ranks' group) and, per call, the caller's peer credentials
//! (`SO_PEERCRED`) against `--allow-uid` / `--allow-gid`. The daemon's own uid and root are
//! always allowed. Everyone else gets PERMISSION_DENIED, logged once per uid.
//!
//! The check guards the TuneCache service only: health and reflection stay open to anyone who
//! can connect, so a monitor or grpcurl can probe the daemon without being on the list; they
//! reveal no cache content.
//!
//! SO_PEERCRED carries the primary gid only, so a caller allowed through a supplementary group
//! is found in `/proc/<pid>/status`. That read is file I/O: it runs on the blocking pool with a
//! bounded wait, once per connection (the first call that needs it), never on the runtime.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use nix::unistd::{Gid, Group, Uid};
use tokio::net::unix::UCred;
use tokio::sync::OnceCell;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

use crate::error::{Error, Result};

/// The uids and gids whose processes may call TuneCache.
#[derive(Debug)]
pub struct AccessPolicy {
    uids: HashSet<u32>,
    gids: HashSet<u32>,
}

impl AccessPolicy {
    /// The daemon's own uid and root, plus the given uids and groups (names or gids).
    pub fn new(extra_uids: &[u32], groups: &[String]) -> Result<Self> {
        let mut uids: HashSet<u32> = extra_uids.iter().copied().collect();
        uids.insert(0);
        uids.insert(Uid::current().as_raw());
        let gids = groups
            .iter()
            .filter(|group| !group.trim().is_empty())
            .map(|group| resolve_group(group.trim()).map(Gid::as_raw))
            .collect::<Result<_>>()?;
        Ok(AccessPolicy { uids, gids })
    }

    /// Whether the caller of `request` is allowed, by uid, primary gid or supplementary
    /// group; a caller without kernel credentials is not.
    pub async fn allows_caller<T>(&self, request: &Request<T>) -> bool {
        let Some(peer) = request.extensions().get::<PeerInfo>() else {
            return false;
        };
        let Some(cred) = peer.uds.peer_cred else {
            return false;
        };
        self.allows(peer, cred.uid(), cred.gid()).await
    }

    /// The uids allowed, sorted, for messages.
    pub fn uid_list(&self) -> String {
        let mut uids: Vec<_> = self.uids.iter().collect();
        uids.sort();
        uids.iter()
            .map(|uid| uid.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Allowed by uid or primary gid, without looking further.
    fn allows_directly(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    async fn allows(&self, peer: &PeerInfo, uid: u32, gid: u32) -> bool {
        if self.allows_directly(uid, gid) {
            return true;
        }
        // Only looked up when a gid list is configured.
        !self.gids.is_empty()
            && peer
                .supplementary_groups()
                .await
                .is_some_and(|groups| groups.iter().any(|g| self.gids.contains(g)))
    }
}

/// Longest a call waits for the caller's `/proc/<pid>/status`; a read that takes longer
/// counts as no supplementary groups for this call, and the next call tries again.
const GROUPS_READ_BOUND: Duration = Duration::from_secs(2);

/// What a connection tells about its peer: the kernel's credentials from accept, and the
/// peer's supplementary groups once a call needed them. One per connection: tonic puts a
/// clone in every request's extensions.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    uds: UdsConnectInfo,
    groups: Arc<OnceCell<Option<Arc<[u32]>>>>,
}

impl PeerInfo {
    pub fn new(uds: UdsConnectInfo) -> Self {
        PeerInfo {
            uds,
            groups: Arc::default(),
        }
    }

    /// The peer's uid, from the kernel's credentials; `None` when it recorded none.
    pub fn uid(&self) -> Option<u32> {
        self.uds.peer_cred.map(|cred| cred.uid())
    }

    /// The peer's supplementary groups, read off the runtime on first use and kept for the
    /// connection; `None` when unknown (no pid, the process is gone, or the read timed out).
    async fn supplementary_groups(&self) -> Option<Arc<[u32]>> {
        let pid = self.uds.peer_cred.and_then(|cred| cred.pid())?;
        let read = || async move {
            let groups = tokio::task::spawn_blocking(move || supplementary_groups(pid));
            match tokio::time::timeout(GROUPS_READ_BOUND, groups).await {
                Ok(Ok(groups)) => Ok(groups.map(Arc::from)),
                Ok(Err(_)) | Err(_) => Err(()),
            }
        };
        self.groups
            .get_or_try_init(read)
            .await
            .ok()
            .cloned()
            .flatten()
    }
}

/// The supplementary groups of a process, from `/proc/<pid>/status`.
fn supplementary_groups(pid: i32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("Groups:"))?;
    Some(
        line["Groups:".len()..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// The caller's credentials (`SO_PEERCRED`), as the kernel recorded them when it connected.
pub fn peer_credentials<T>(request: &Request<T>) -> Option<UCred> {
    request
        .extensions()
        .get::<PeerInfo>()
        .and_then(|peer| peer.uds.peer_cred)
}

/// The per-call check: the policy and which refused uids were logged. Shared by every
/// connection's `Checked` service.
#[derive(Clone)]
pub struct PeerCheck {
    policy: Arc<AccessPolicy>,
    denied_uids_logged: Arc<Mutex<HashSet<u32>>>,
}

impl PeerCheck {
    pub fn new(policy: AccessPolicy) -> Self {
        PeerCheck {
            policy: Arc::new(policy),
            denied_uids_logged: Arc::default(),
        }
    }

    /// Wraps `inner` so that every call passes this check first.
    pub fn guard<S>(self, inner: S) -> Checked<S> {
        Checked { inner, check: self }
    }

    /// Admits the peer of a connection that is not gRPC (the descriptor handoff), under the
    /// same policy and logging as a call.
    pub async fn admit_peer(&self, peer: &PeerInfo) -> Result<()> {
        self.admit(Some(peer)).await
    }

    /// Admits the caller of one call, or says why not.
    async fn admit(&self, peer: Option<&PeerInfo>) -> Result<()> {
        let Some((peer, credentials)) =
            peer.and_then(|peer| peer.uds.peer_cred.map(|cred| (peer, cred)))
        else {
            return Err(Error::UnknownCaller);
        };
        let (uid, gid, pid) = (credentials.uid(), credentials.gid(), credentials.pid());
        if self.policy.allows(peer, uid, gid).await {
            return Ok(());
        }
        self.log_denial_once(uid, gid, pid);
        Err(Error::CallerNotAllowed { uid })
    }

    fn log_denial_once(&self, uid: u32, gid: u32, pid: Option<i32>) {
        let first_time = match self.denied_uids_logged.lock() {
            Ok(mut logged) => logged.insert(uid),
            // A panic elsewhere while holding the lock: log rather than stay silent.
            Err(_) => true,
        };
        if first_time {
            tracing::warn!(
                uid,
                gid,
                pid,
                "refused a caller not allowed by --allow-uid/--allow-gid (logged once per uid)"
            );
        }
    }
}

/// A gRPC service behind the peer check: a refused call is answered PERMISSION_DENIED and
/// never reaches `inner`.
#[derive(Clone)]
pub struct Checked<S> {
    inner: S,
    check: PeerCheck,
}

type CheckedFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Checked<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = CheckedFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone that was polled ready serves this call; the fresh one waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let check = self.check.clone();
        Box::pin(async move {
            match check.admit(request.extensions().get::<PeerInfo>()).await {
                Ok(()) => inner.call(request).await,
                Err(refusal) => Ok(Status::from(refusal).into_http()),
            }
        })
    }
}

impl<S: NamedService> NamedService for Checked<S> {
    const NAME: &'static str = S::NAME;
}

/// A group given by name or number.
fn resolve_group(name_or_gid: &str) -> Result<Gid> {
    if let Ok(gid) = name_or_gid.parse::<u32>() {
        return Ok(Gid::from_raw(gid));
    }
    match Group::from_name(name_or_gid) {
        Ok(Some(group)) => Ok(group.gid),
        _ => Err(Error::UnknownGroup(name_or_gid.to_owned())),
    }
}

/// `--socket-group`: gives the socket to `group` (its mode 0660 then lets the group connect).
pub fn apply_socket_group(socket: &Path, group: &str) -> Result<()> {
    let gid = resolve_group(group)?;
    nix::unistd::chown(socket, None, Some(gid))
        .map_err(|errno| Error::io("setting the socket's group", socket, errno.into()))?;
    tracing::info!(socket = %socket.display(), gid = gid.as_raw(), "socket group set");
    Ok(())
}
