//! Which socket a client dials and which daemon it trusts there: the socket path's
//! resolution (a built-in default another user could have planted is refused) and the uids
//! whose daemon this process talks to.

use std::path::{Path, PathBuf};

use crate::{ClientError, Result};

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
/// [`connect_channel`](crate::connect_channel) makes the same check on every connection it opens.
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
