//! Auto-start, as sccache does it: a client that finds no daemon on its socket starts one and
//! waits until it answers. Turned on with `TUNECACHE_AUTOSTART=1` (see
//! [`Client::connect_default`](crate::Client::connect_default) and
//! [`Client::connect_or_start`](crate::Client::connect_or_start)).
//!
//! Race-free when all ranks of a node do it at once: each may spawn a `tunecached`, but the
//! daemon takes an exclusive lock on `<socket>.lock` before binding, so exactly one serves and
//! the others exit at once ("already serving"). Clients just retry connecting until one answers,
//! and spawn again only if the daemon they started is gone and still nothing answers (e.g. the
//! previous daemon was just exiting on idle).
//!
//! The daemon is started detached (its own session, so a terminal's hang-up or Ctrl-C does not
//! reach it), with `--exit-when-idle` so it goes away when the job is done. It logs to
//! `<socket dir>/tunecached.log`. It is spawned through tokio, which reaps it on the caller's
//! runtime when it exits: no thread is started for that (a Python rank has exactly one).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// `1` (or `true`/`yes`) turns auto-start on.
pub const AUTOSTART_ENV: &str = "TUNECACHE_AUTOSTART";
/// The daemon binary to start; default: `tunecached` next to this executable, else on PATH.
pub const DAEMON_BIN_ENV: &str = "TUNECACHE_DAEMON_BIN";
/// The daemon's own env twin of `--exit-when-idle`; when set it is inherited as is.
const EXIT_WHEN_IDLE_ENV: &str = "TUNECACHE_EXIT_WHEN_IDLE";
/// Idle timeout of an auto-started daemon, in seconds, unless `TUNECACHE_EXIT_WHEN_IDLE` says.
pub const DEFAULT_IDLE_SECS: u64 = 600;
/// How long a client waits for a daemon to answer after starting one.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
const DAEMON_NAME: &str = "tunecached";

#[derive(Debug, thiserror::Error)]
pub enum AutostartError {
    #[error(
        "no {DAEMON_NAME} to auto-start: not next to this program, not on PATH; \
         set {DAEMON_BIN_ENV}"
    )]
    NoDaemonBinary,
    #[error("starting {}: {source}", binary.display())]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating the socket directory {}: {source}", dir.display())]
    SocketDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    UntrustedSocket(#[from] tunecache_proto::socket_path::UntrustedSocket),
    #[error(
        "started {DAEMON_NAME}, but nothing answered on {} within {timeout:?}; see {}",
        socket.display(),
        log.display()
    )]
    NoAnswer {
        socket: PathBuf,
        timeout: Duration,
        log: PathBuf,
    },
}

/// Whether `TUNECACHE_AUTOSTART` asks for auto-start.
pub fn enabled_by_env() -> bool {
    std::env::var(AUTOSTART_ENV).is_ok_and(|value| {
        matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// `$TUNECACHE_DAEMON_BIN`, else `tunecached` next to the running executable, else on PATH.
pub fn daemon_binary() -> Option<PathBuf> {
    if let Some(configured) = std::env::var_os(DAEMON_BIN_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(configured));
    }
    let beside_us = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(DAEMON_NAME)))
        .filter(|candidate| candidate.is_file());
    beside_us.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(DAEMON_NAME))
                .find(|candidate| candidate.is_file())
        })
    })
}

/// Where an auto-started daemon logs: next to its socket.
pub fn log_path(socket: &Path) -> PathBuf {
    socket
        .parent()
        .unwrap_or(Path::new("."))
        .join("tunecached.log")
}

/// Spawns a detached daemon on `socket`.
fn spawn_daemon(binary: &Path, socket: &Path) -> Result<Child, AutostartError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

    let dir = socket.parent().unwrap_or(Path::new("."));
    if socket == tunecache_proto::socket_path::fallback_socket_path() {
        // The built-in default: private (0700), and refused if another user got there first,
        // exactly as the daemon will check it.
        tunecache_proto::socket_path::open_private_dir(dir)?;
    } else {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|source| AutostartError::SocketDir {
                dir: dir.to_path_buf(),
                source,
            })?;
    }
    // Never through a symbolic link: the log must not append to a file someone pointed it at.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log_path(socket))
        .map_err(|source| AutostartError::Spawn {
            binary: binary.to_path_buf(),
            source,
        })?;
    let log_for_stderr = log.try_clone().map_err(|source| AutostartError::Spawn {
        binary: binary.to_path_buf(),
        source,
    })?;
    let mut command = Command::new(binary);
    command
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_for_stderr);
    if std::env::var_os(EXIT_WHEN_IDLE_ENV).is_none() {
        command.arg(format!("--exit-when-idle={DEFAULT_IDLE_SECS}"));
    }
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().map_err(|source| AutostartError::Spawn {
        binary: binary.to_path_buf(),
        source,
    })
}

/// Leaves a started daemon to tokio, which reaps it when it exits (a dropped child that was not
/// killed is reaped in the background by the runtime's signal driver), so neither a loser of the
/// start race nor the winner (when it exits on idle) stays a zombie of this process.
fn reap_in_background(child: Child) {
    drop(child);
}

/// Tries `connect` until it succeeds, starting a daemon whenever none of ours is running.
pub(crate) async fn connect_or_start<T, E, F, Fut>(
    socket: &Path,
    timeout: Duration,
    mut connect: F,
) -> Result<Result<T, E>, AutostartError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let first = connect().await;
    if first.is_ok() {
        return Ok(first);
    }
    let binary = daemon_binary().ok_or(AutostartError::NoDaemonBinary)?;
    let deadline = Instant::now() + timeout;
    let mut ours: Option<Child> = None;
    let mut pause = Duration::from_millis(10);
    loop {
        let still_running = match ours.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        };
        if !still_running {
            // Lost the race (another daemon serves, or is about to), or first attempt.
            ours = Some(spawn_daemon(&binary, socket)?);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
        let attempt = connect().await;
        if attempt.is_ok() {
            if let Some(child) = ours {
                reap_in_background(child);
            }
            return Ok(attempt);
        }
        if Instant::now() >= deadline {
            if let Some(child) = ours {
                reap_in_background(child);
            }
            return Err(AutostartError::NoAnswer {
                socket: socket.to_path_buf(),
                timeout,
                log: log_path(socket),
            });
        }
    }
}
