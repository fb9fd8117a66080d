//! Where the node daemon's Unix socket lives when nobody says otherwise, and which default
//! locations may be trusted.
//!
//! The daemon and every client (Rust, Python, the CLI) resolve it the same way, so a rank
//! started with no configuration finds the daemon its launcher started.
//!
//! The default location can be squatted: on a node without `$XDG_RUNTIME_DIR` (most Slurm
//! nodes) it is `/tmp/tunecache-<uid>`, a name any local user can create first. So, as
//! ssh-agent does for its socket and systemd for runtime directories, the default location is
//! only used when it is private:
//! - the daemon creates the directory with mode 0700 and refuses one that its own uid does not
//!   own, that group or others may write, or that is a symbolic link ([`open_private_dir`]);
//! - a client refuses a directory or socket owned by anyone but itself or root, a directory
//!   group or others may write, and a symbolic link for either ([`check_default_socket`]).
//!
//! A path someone named (`--socket`, `$TUNECACHE_SOCKET`, a systemd unit) is trusted: the
//! admin chose that directory.

use std::fs::{File, Metadata};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Environment variable that names the socket for daemon and clients alike.
pub const SOCKET_ENV: &str = "TUNECACHE_SOCKET";

/// Mode bits that let someone other than the owner add, remove or rename entries.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// How a socket path was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named by the user or admin (flag, `$TUNECACHE_SOCKET`, systemd): trusted as is.
    Explicit,
    /// The built-in default: checked for squatting before use.
    Default,
}

/// Why a default socket location is refused.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedSocket {
    #[error(
        "refusing {}: it is a symbolic link (the default socket location must not be one; \
         remove it, or name a socket with --socket or ${SOCKET_ENV})",
        path.display()
    )]
    Symlink { path: PathBuf },
    #[error("refusing {}: not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error(
        "refusing {}: owned by uid {owner} (mode {mode:04o}), expected {expected}; another \
         user may have created it first: remove it, or name a socket with --socket or \
         ${SOCKET_ENV}",
        path.display()
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        mode: u32,
        expected: String,
    },
    #[error(
        "refusing {}: mode {mode:04o} (owner uid {owner}) lets group or others write it; \
         `chmod go-w` it, or name a socket with --socket or ${SOCKET_ENV}",
        path.display()
    )]
    Writable {
        path: PathBuf,
        owner: u32,
        mode: u32,
    },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `$TUNECACHE_SOCKET`, then `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then
/// `/tmp/tunecache-<uid>/tunecache.sock`.
pub fn default_socket_path() -> PathBuf {
    resolve_socket_path().0
}

/// [`default_socket_path`], and whether it came from `$TUNECACHE_SOCKET` (explicit) or is the
/// built-in default (to be checked with [`check_default_socket`]).
pub fn resolve_socket_path() -> (PathBuf, Origin) {
    match non_empty_env(SOCKET_ENV) {
        Some(path) => (PathBuf::from(path), Origin::Explicit),
        None => (fallback_socket_path(), Origin::Default),
    }
}

/// The default when `$TUNECACHE_SOCKET` is not set (used by flag parsers that read the
/// variable themselves).
pub fn fallback_socket_path() -> PathBuf {
    if let Some(runtime_dir) = non_empty_env("XDG_RUNTIME_DIR") {
        return PathBuf::from(runtime_dir)
            .join("tunecache")
            .join("tunecache.sock");
    }
    PathBuf::from(format!("/tmp/tunecache-{}/tunecache.sock", real_uid()))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn real_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses `metadata` of `path` unless one of `owners` owns it and, for a directory, neither
/// group nor others may write it.
fn check_owner_and_mode(
    path: &Path,
    metadata: &Metadata,
    owners: &[u32],
) -> Result<(), UntrustedSocket> {
    let (owner, mode) = (metadata.uid(), metadata.mode() & 0o7777);
    if !owners.contains(&owner) {
        let expected = match owners {
            [only] => format!("uid {only}"),
            _ => format!(
                "uid {}",
                owners
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        };
        return Err(UntrustedSocket::Owner {
            path: path.to_path_buf(),
            owner,
            mode,
            expected,
        });
    }
    if metadata.is_dir() && mode & WRITABLE_BY_OTHERS != 0 {
        return Err(UntrustedSocket::Writable {
            path: path.to_path_buf(),
            owner,
            mode,
        });
    }
    Ok(())
}

/// Creates `dir` with mode 0700 if it is missing (its parent must exist), then opens it without
/// following a symbolic link and checks the open directory (fstat, so nothing can be swapped
/// between check and use): owned by this process's effective uid and writable by nobody else.
/// The daemon's rule for the default socket directory. Returns the open directory, for
/// `openat`-style use of the files in it.
pub fn open_private_dir(dir: &Path) -> Result<File, UntrustedSocket> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(UntrustedSocket::Io {
                what: "creating socket directory",
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir);
    let handle = match opened {
        Ok(handle) => handle,
        // O_NOFOLLOW on a symlink fails with ELOOP; O_DIRECTORY on one (or on a file) may
        // fail with ENOTDIR first. Say which it is.
        Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            let is_link = std::fs::symlink_metadata(dir)
                .is_ok_and(|metadata| metadata.file_type().is_symlink());
            return Err(if is_link {
                UntrustedSocket::Symlink {
                    path: dir.to_path_buf(),
                }
            } else {
                UntrustedSocket::NotADirectory {
                    path: dir.to_path_buf(),
                }
            });
        }
        Err(source) => {
            return Err(UntrustedSocket::Io {
                what: "opening socket directory",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let metadata = handle.metadata().map_err(|source| UntrustedSocket::Io {
        what: "inspecting socket directory",
        path: dir.to_path_buf(),
        source,
    })?;
    check_owner_and_mode(dir, &metadata, &[effective_uid()])?;
    Ok(handle)
}

/// A client's rule for the default socket: its directory and the socket itself, where they
/// exist, must be owned by the caller's uid or root and must not be symbolic links, and the
/// directory must not be writable by group or others. A missing directory or socket passes
/// (connecting then finds no daemon, or auto-start creates a private one).
///
/// Apply it to the built-in default only ([`Origin::Default`]); a path someone named is
/// trusted.
pub fn check_default_socket(socket: &Path) -> Result<(), UntrustedSocket> {
    let owners = [real_uid(), 0];
    let dir = socket
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    for path in [dir, socket] {
        let metadata = match std::fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(UntrustedSocket::Io {
                    what: "inspecting",
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        if metadata.file_type().is_symlink() {
            return Err(UntrustedSocket::Symlink {
                path: path.to_path_buf(),
            });
        }
        if path == dir && !metadata.is_dir() {
            return Err(UntrustedSocket::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        check_owner_and_mode(path, &metadata, &owners)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dir_is_created_0700() {
        let temp = tempfile::tempdir().unwrap();
        let temp = temp.path();
        let dir = temp.join("sock");
        open_private_dir(&dir).expect("created");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // A second call accepts what the first created.
        open_private_dir(&dir).expect("reopened");
    }

    #[test]
    fn writable_or_linked_dirs_are_refused() {
        let temp = tempfile::tempdir().unwrap();
        let temp = temp.path();
        let dir = temp.join("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = open_private_dir(&dir).unwrap_err();
        assert!(
            matches!(error, UntrustedSocket::Writable { mode: 0o777, .. }),
            "{error}"
        );
        let error = check_default_socket(&dir.join("tunecache.sock")).unwrap_err();
        assert!(matches!(error, UntrustedSocket::Writable { .. }), "{error}");

        let link = temp.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let error = open_private_dir(&link).unwrap_err();
        assert!(matches!(error, UntrustedSocket::Symlink { .. }), "{error}");
        let error = check_default_socket(&link.join("tunecache.sock")).unwrap_err();
        assert!(matches!(error, UntrustedSocket::Symlink { .. }), "{error}");
    }

    #[test]
    fn missing_default_socket_passes_the_client_check() {
        let temp = tempfile::tempdir().unwrap();
        let temp = temp.path();
        check_default_socket(&temp.join("absent").join("tunecache.sock")).expect("missing dir");
        check_default_socket(&temp.join("tunecache.sock")).expect("missing socket");
    }
}
