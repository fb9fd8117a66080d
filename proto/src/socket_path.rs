//! Where the node daemon's Unix socket lives when nobody says otherwise.
//!
//! The daemon and every client (Rust, Python, the CLI) resolve it the same way, so a rank
//! started with no configuration finds the daemon its launcher started.

use std::path::PathBuf;

/// Environment variable that names the socket for daemon and clients alike.
pub const SOCKET_ENV: &str = "TUNECACHE_SOCKET";

/// `$TUNECACHE_SOCKET`, then `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then
/// `/tmp/tunecache-<uid>/tunecache.sock`.
pub fn default_socket_path() -> PathBuf {
    if let Some(path) = non_empty_env(SOCKET_ENV) {
        return PathBuf::from(path);
    }
    fallback_socket_path()
}

/// The default when `$TUNECACHE_SOCKET` is not set (used by flag parsers that read the
/// variable themselves).
pub fn fallback_socket_path() -> PathBuf {
    if let Some(runtime_dir) = non_empty_env("XDG_RUNTIME_DIR") {
        return PathBuf::from(runtime_dir)
            .join("tunecache")
            .join("tunecache.sock");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/tunecache-{uid}/tunecache.sock"))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}
