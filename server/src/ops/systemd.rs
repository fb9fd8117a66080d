//! Life under systemd, all of it a no-op elsewhere: a listening socket passed by socket
//! activation (`LISTEN_FDS`/`LISTEN_PID`, fd 3), and `sd_notify` messages: READY=1 once serving, a STATUS=
//! line kept current, WATCHDOG=1 pings when the unit sets `WatchdogSec=`, STOPPING=1 on the way
//! out.

use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use nix::sys::socket::{getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike};
use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::model::entry::unix_now_ms;
use crate::report::StatsProbe;

/// How often STATUS= is refreshed when no watchdog asks for more.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// The listening Unix stream socket systemd (or `systemd-socket-activate`) passed, if any.
/// Only the first passed fd is used; more are logged and ignored.
pub fn inherited_listener() -> Result<Option<UnixListener>> {
    let mut fds = sd_notify::listen_fds().map_err(|e| {
        Error::InheritedSocket(format!("LISTEN_FDS/LISTEN_PID are set but unusable: {e}"))
    })?;
    let count = fds.len();
    let Some(fd) = fds.next() else {
        return Ok(None);
    };
    if count > 1 {
        tracing::warn!(
            count,
            "systemd passed several sockets; serving on the first (fd 3) only"
        );
    }
    check_listening_unix_stream(fd)?;
    // SAFETY: systemd hands fd 3 to this process to own; it is checked to be a listening Unix
    // stream socket above, and nothing else in the daemon uses it.
    Ok(Some(unsafe { UnixListener::from_raw_fd(fd) }))
}

fn check_listening_unix_stream(fd: RawFd) -> Result<()> {
    // SAFETY: the fd stays open for this whole function (nothing closes it here).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let wrong = |what: String| Error::InheritedSocket(format!("fd {fd} {what}"));
    let family = getsockname::<nix::sys::socket::SockaddrStorage>(fd)
        .map_err(|e| wrong(format!("is not a socket: {e}")))?
        .family();
    if family != Some(AddressFamily::Unix) {
        return Err(wrong(format!(
            "is a {family:?} socket; tunecached serves on a Unix socket (ListenStream=/path)"
        )));
    }
    let kind = getsockopt(&borrowed, sockopt::SockType).map_err(|e| wrong(e.to_string()))?;
    if kind != SockType::Stream {
        return Err(wrong(format!("is a {kind:?} socket, not a stream socket")));
    }
    let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(|e| wrong(e.to_string()))?;
    if !listening {
        return Err(wrong(
            "is not listening (socket units for tunecached need Accept=no)".to_owned(),
        ));
    }
    Ok(())
}

fn notify(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::debug!(%error, "sd_notify failed");
    }
}

/// The one-line STATUS= text: entries, last snapshot (when snapshots are on), tuner queue.
fn status_line(stats: &tunecache_proto::v1::StatsResponse) -> String {
    let mut line = format!("serving {} entries", stats.entries);
    if stats.last_snapshot_unix_ms > 0 {
        let age_s = (unix_now_ms() - stats.last_snapshot_unix_ms).max(0) / 1000;
        line.push_str(&format!("; last snapshot {age_s} s ago"));
    } else if !stats.shared_dir.is_empty() {
        line.push_str("; no snapshot yet");
    }
    if stats.snapshot_errors > 0 {
        line.push_str(&format!("; {} snapshot errors", stats.snapshot_errors));
    }
    if stats.tuner_queue_depth > 0 {
        line.push_str(&format!("; tuner queue {}", stats.tuner_queue_depth));
    }
    line
}

/// READY=1 with a first STATUS=; call once the gRPC server is accepting calls.
pub async fn notify_ready(probe: &StatsProbe) {
    let status = probe
        .read()
        .await
        .map_or_else(|| "serving".to_owned(), |stats| status_line(&stats));
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

pub fn notify_stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// Keeps STATUS= current and, when the unit sets `WatchdogSec=`, pings WATCHDOG=1 at half the
/// interval. Each ping is sent by a runtime task after a Stats read (store and coordinator
/// counters), so a daemon whose runtime is wedged stops pinging and systemd restarts it.
/// Returns at once when not running under systemd.
pub async fn report_status(probe: StatsProbe, stop: CancellationToken) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    let interval = watchdog.map_or(STATUS_INTERVAL, |timeout| {
        (timeout / 2).min(STATUS_INTERVAL)
    });
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let Some(stats) = probe.read().await else {
            continue;
        };
        let status = status_line(&stats);
        if watchdog.is_some() {
            notify(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
        } else {
            notify(&[NotifyState::Status(&status)]);
        }
    }
}
