//! Who may use the socket. Two layers: the file system (socket mode 0660, and `--socket-group`
//! to hand the group to the ranks' group) and, per call, the caller's peer credentials
//! (`SO_PEERCRED`) against `--allow-uid` / `--allow-gid`. The daemon's own uid and root are
//! always allowed. Everyone else gets PERMISSION_DENIED, logged once per uid.
//!
//! The check guards the TuneCache service only: health and reflection stay open to anyone who
//! can connect, so a monitor or grpcurl can probe the daemon without being on the list; they
//! reveal no cache content.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use nix::unistd::{Gid, Group, Uid};
use tokio::net::unix::UCred;
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

    fn allows(&self, uid: u32, gid: u32, pid: Option<i32>) -> bool {
        if self.uids.contains(&uid) || self.gids.contains(&gid) {
            return true;
        }
        // SO_PEERCRED carries the primary gid only; a rank whose allowed group is a
        // supplementary one is found through /proc (only read when a gid list is configured).
        !self.gids.is_empty()
            && pid
                .and_then(supplementary_groups)
                .is_some_and(|groups| groups.iter().any(|g| self.gids.contains(g)))
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
        .get::<UdsConnectInfo>()
        .and_then(|info| info.peer_cred)
}

/// The per-call check, as a tonic interceptor on the TuneCache service.
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

impl tonic::service::Interceptor for PeerCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(credentials) = peer_credentials(&request) else {
            return Err(Status::permission_denied(
                "tunecached cannot tell who the caller is (no peer credentials)",
            ));
        };
        let (uid, gid, pid) = (credentials.uid(), credentials.gid(), credentials.pid());
        if self.policy.allows(uid, gid, pid) {
            return Ok(request);
        }
        self.log_denial_once(uid, gid, pid);
        Err(Status::permission_denied(format!(
            "uid {uid} may not use this tunecached; ask its operator to add --allow-uid {uid} \
             or --allow-gid with one of your groups"
        )))
    }
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
