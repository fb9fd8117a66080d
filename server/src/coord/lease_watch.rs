//! A lease's end without a result: it expires, or the process holding it exits (watched
//! with a pidfd, so a crashed rank's lease passes on at once instead of at expiry).

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::flights::LeaseEnd;
use super::Coordinator;
use crate::model::entry::CacheKey;

/// Opens a pidfd for `pid`: readable once the process exits (zombie or reaped).
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until `pid` exits. Never returns if the process cannot be watched.
async fn process_exit(pid: Option<i32>) {
    let Some(fd) = pid.and_then(pidfd_open) else {
        return std::future::pending().await;
    };
    // SAFETY: the AsyncFd owns the only handle to this freshly opened pidfd, so the fd
    // stays valid and unshared for as long as it is registered.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(async_fd) => {
            let _ = async_fd.readable().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// Ends the lease when it expires or its holder process exits, unless `stop` fires first
/// (the lease completed or passed on: the flight dropped its guard).
pub(super) async fn watch_lease(
    coordinator: Arc<Coordinator>,
    key: CacheKey,
    lease_id: String,
    pid: Option<i32>,
    length: Duration,
    stop: CancellationToken,
) {
    let deadline = Instant::now() + length;
    let why = tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep_until(deadline.into()) => LeaseEnd::Expired,
        () = process_exit(pid) => LeaseEnd::HolderDied,
    };
    coordinator.lease_ended(&key, &lease_id, why);
}
