//! The daemon's Unix socket: parent directory, one-daemon-per-socket guard, stale-socket
//! removal, bind, permissions, and removal of the socket when the daemon exits; or, under
//! socket activation, the socket systemd passed, which the daemon neither binds nor removes.

use std::fs::{DirBuilder, File, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// Mode of the socket: owner and group may connect.
const SOCKET_MODE: u32 = 0o660;

/// Removes the socket when dropped (if the daemon created it), and holds the instance guard
/// until then.
pub struct SocketGuard {
    path: PathBuf,
    // An advisory lock on `<socket>.lock` held for the daemon's lifetime. It only makes
    // "is another daemon starting on this socket?" race-free when many ranks auto-start a
    // daemon at once; no cache data is ever behind a lock. `None` for an inherited socket:
    // its owner (systemd) already runs one service per socket.
    _instance: Option<Flock<File>>,
    // False for an inherited socket: it belongs to whoever passed it, and must outlive this
    // process so the next activation finds it.
    remove_on_drop: bool,
}

impl SocketGuard {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if !self.remove_on_drop {
            return;
        }
        if let Err(error) = std::fs::remove_file(&self.path) {
            if error.kind() != ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), %error, "could not remove socket");
            }
        }
    }
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut lock_path = socket.as_os_str().to_owned();
    lock_path.push(".lock");
    PathBuf::from(lock_path)
}

/// Opens `<socket>.lock` without following a symbolic link: a link planted there must not
/// make the daemon create or truncate a file elsewhere. In the default location the file is
/// opened relative to the checked directory handle (`openat`), so the directory checked is the
/// directory used.
fn instance_guard(socket: &Path, private_dir: Option<&File>) -> Result<Flock<File>> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;

    let lock_path = lock_path(socket);
    let flags = OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mode = Mode::from_bits_truncate(0o600);
    let opened = match (private_dir, lock_path.file_name()) {
        (Some(dir), Some(name)) => nix::fcntl::openat(dir, name, flags, mode),
        _ => nix::fcntl::open(&lock_path, flags, mode),
    };
    let file = File::from(opened.map_err(|errno| {
        let error = std::io::Error::from(errno);
        let context = if errno == nix::errno::Errno::ELOOP {
            "refusing to follow a symbolic link for the instance guard"
        } else {
            "opening instance guard"
        };
        Error::io(context, &lock_path, error)
    })?);
    Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| Error::AlreadyServing(socket.to_path_buf()))
}

/// Removes a socket file nobody answers on. A live daemon on it is an error.
fn remove_stale_socket(path: &Path) -> Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(Error::io("inspecting socket path", path, error)),
    };
    if !metadata.file_type().is_socket() {
        return Err(Error::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Error::AlreadyServing(path.to_path_buf())),
        Err(_) => {
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(|e| Error::io("removing stale socket", path, e))
        }
    }
}

/// Prepares the socket's directory, takes the instance guard, clears a stale socket, binds and
/// sets mode 0660. Must run inside the tokio runtime.
///
/// The built-in default location (`/tmp/tunecache-<uid>`, `$XDG_RUNTIME_DIR/tunecache`), however
/// the daemon was told about it, gets a private directory: created with mode 0700, and refused
/// when another uid owns it, group or others may write it, or it is a symbolic link. Any other
/// path is the admin's choice: its parents are created (0750) if missing and used as they are.
pub fn bind(path: &Path) -> Result<(tokio::net::UnixListener, SocketGuard)> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let private_dir = match parent {
        Some(dir) if path == tunecache_proto::socket_path::fallback_socket_path() => {
            if let Some(above) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                DirBuilder::new()
                    .recursive(true)
                    .create(above)
                    .map_err(|e| Error::io("creating socket directory", above, e))?;
            }
            Some(tunecache_proto::socket_path::open_private_dir(dir)?)
        }
        Some(dir) => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(|e| Error::io("creating socket directory", dir, e))?;
            None
        }
        None => None,
    };
    let instance = instance_guard(path, private_dir.as_ref())?;
    remove_stale_socket(path)?;
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| Error::io("binding socket", path, e))?;
    let guard = SocketGuard {
        path: path.to_path_buf(),
        _instance: Some(instance),
        remove_on_drop: true,
    };
    std::fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| Error::io("setting socket permissions", path, e))?;
    Ok((register(listener, path)?, guard))
}

/// Hands a bound listener to the runtime (non-blocking).
fn register(
    listener: std::os::unix::net::UnixListener,
    path: &Path,
) -> Result<tokio::net::UnixListener> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("configuring socket", path, e))?;
    tokio::net::UnixListener::from_std(listener)
        .map_err(|e| Error::io("registering socket", path, e))
}

/// Binds a second socket at `path` beside the daemon's socket `main` (the descriptor
/// handoff): the same mode and group as `main`, a stale one removed first, removed on exit.
/// Call only once `main` is bound or adopted, so this daemon is the one serving there.
pub fn bind_beside(main: &Path, path: &Path) -> Result<(tokio::net::UnixListener, SocketGuard)> {
    use std::os::unix::fs::MetadataExt;
    remove_stale_socket(path)?;
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| Error::io("binding socket", path, e))?;
    let guard = SocketGuard {
        path: path.to_path_buf(),
        _instance: None,
        remove_on_drop: true,
    };
    let main_meta = std::fs::metadata(main).map_err(|e| Error::io("inspecting socket", main, e))?;
    std::os::unix::fs::chown(path, None, Some(main_meta.gid()))
        .map_err(|e| Error::io("setting the socket's group", path, e))?;
    std::fs::set_permissions(path, Permissions::from_mode(main_meta.mode() & 0o777))
        .map_err(|e| Error::io("setting socket permissions", path, e))?;
    Ok((register(listener, path)?, guard))
}

/// Serves on a listening socket someone else bound and owns (socket activation): no guard, no
/// permissions change, no removal on exit.
pub fn adopt(
    listener: std::os::unix::net::UnixListener,
) -> Result<(tokio::net::UnixListener, SocketGuard)> {
    let path = listener
        .local_addr()
        .ok()
        .and_then(|addr| addr.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("configuring inherited socket", &path, e))?;
    let listener = tokio::net::UnixListener::from_std(listener)
        .map_err(|e| Error::io("registering inherited socket", &path, e))?;
    let guard = SocketGuard {
        path,
        _instance: None,
        remove_on_drop: false,
    };
    Ok((listener, guard))
}

/// The socket to serve on: the one systemd passed if any (`--socket` is then ignored, as
/// is `--socket-group`: the socket unit's `SocketGroup=` governs), else `path`, bound here and
/// given to `socket_group` when one is named.
pub fn listen(
    path: &Path,
    socket_group: Option<&str>,
) -> Result<(tokio::net::UnixListener, SocketGuard)> {
    if let Some(inherited) = crate::ops::systemd::inherited_listener()? {
        let (listener, guard) = adopt(inherited)?;
        tracing::info!(
            socket = %guard.path().display(),
            "serving on the socket passed by systemd (socket activation)"
        );
        if guard.path() != path {
            tracing::debug!(
                configured = %path.display(),
                "the configured socket path is not used under socket activation"
            );
        }
        return Ok((listener, guard));
    }
    let (listener, guard) = bind(path)?;
    if let Some(group) = socket_group {
        crate::ops::access::apply_socket_group(guard.path(), group)?;
    }
    Ok((listener, guard))
}
