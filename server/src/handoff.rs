//! The descriptor handoff's door (the wire format is `tunecache_proto::handoff`), beside the
//! gRPC door (`rpc`): a rank on this node asks for a blob on the handoff socket, beside the
//! gRPC socket, and is handed a read-only descriptor of the daemon's file (`SCM_RIGHTS`). Its
//! bytes then reach the rank as fast as reading a local file: through HTTP/2, the same bytes
//! cost each side a frame per 16 KiB and two copies more (BENCHMARKS.md, Artifacts). What file
//! is handed, and when, is the store's (`artifacts::handoff`); this module owns the socket.
//!
//! It is a door of its own, not a part of `rpc`, because it speaks no gRPC; it is built as the
//! gRPC door is, from the daemon's one `ops::admission::Admission`:
//! - **Who** may ask: the callers GetArtifact admits (the same `PeerCheck`, checked at a
//!   connection's first request), each uid holding at most `--max-connections-per-uid` handoff
//!   connections (the same `ConnectionLimits`, counted and logged as for gRPC).
//! - **Activity**: every admitted request touches the same `ActivityClock` a gRPC call does,
//!   so ranks that only take descriptors keep `--exit-when-idle` from firing.
//! - **A cold blob** is fetched from the tiers before it is handed (`artifacts::handoff`),
//!   waiting at most `COLD_FETCH_WAIT`, as long as a GetArtifact that names no wait.
//! - **One exchange at a time** per connection, and a request sent before the previous answer
//!   was read is refused: a descriptor in flight is charged to the daemon's uid until its
//!   receiver takes it, so a caller that sends requests and never reads could otherwise pile
//!   up the daemon's descriptors in its socket. So each connection has at most one descriptor
//!   in flight; one that sends nothing for `--preface-timeout` is closed.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;
use tunecache_proto::handoff::{parse_request, Answer, REQUEST_BYTES};

use crate::artifacts::Artifacts;

/// How long a request for a cold blob (a held entry names it, this node lacks it) waits for
/// the tiers: a request carries no wait of its own, so the one GetArtifact takes when its
/// caller names none. The clients' handoff reads wait longer (`tunecache_client::handoff`).
const COLD_FETCH_WAIT: Duration =
    Duration::from_millis(tunecache_proto::artifact::DEFAULT_WAIT_MS as u64);
use crate::ops::admission::Admission;
use crate::ops::incoming::Connection;
use crate::tasks::Tasks;

/// Serves the handoff socket until the daemon stops: each connection on a task of its own.
pub async fn serve(
    artifacts: Arc<Artifacts>,
    listener: UnixListener,
    admission: Admission,
    tasks: Tasks,
) {
    let idle = admission.limits().preface_timeout;
    let mut incoming = admission.incoming(listener);
    let stop = tasks.stop_token();
    loop {
        let connection = tokio::select! {
            () = stop.cancelled() => return,
            next = incoming.next() => match next {
                Some(Ok(connection)) => connection,
                // Counted, logged and backed off by `Incoming`.
                Some(Err(_)) => continue,
                None => return,
            },
        };
        let (artifacts, admission, stop) = (artifacts.clone(), admission.clone(), stop.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                served = serve_connection(&artifacts, connection, &admission, idle) => {
                    if let Err(error) = served {
                        tracing::debug!(%error, "handoff connection ended");
                    }
                }
            }
        });
    }
}

/// One connection's exchanges, one at a time, until the peer closes it, is idle for `idle`
/// or is refused.
async fn serve_connection(
    artifacts: &Arc<Artifacts>,
    mut connection: Connection,
    admission: &Admission,
    idle: Duration,
) -> io::Result<()> {
    let mut admitted = false;
    loop {
        let mut line = [0u8; REQUEST_BYTES];
        match tokio::time::timeout(idle, connection.read_exact(&mut line)).await {
            Err(_) => return Ok(()),
            Ok(Err(error)) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(error)) => return Err(error),
            Ok(Ok(_)) => {}
        }
        // Checked at the first request, so that the refusal answers it.
        if !admitted {
            if let Err(refusal) = admission
                .check()
                .admit_peer(&connection.connect_info())
                .await
            {
                let answer = Answer::Refused(refusal.to_string());
                return send(connection.stream(), &answer, None).await;
            }
            admitted = true;
        }
        if unread_bytes(connection.stream()) != 0 {
            let answer =
                Answer::Refused("a request came before the previous answer was read".to_owned());
            return send(connection.stream(), &answer, None).await;
        }
        let digest = match parse_request(&line) {
            Ok(digest) => digest.to_owned(),
            Err(bad) => {
                let answer = Answer::Refused(format!("request: {bad}"));
                return send(connection.stream(), &answer, None).await;
            }
        };
        // An admitted request is a call like a gRPC one: the daemon is not idle.
        admission.activity().touch();
        match artifacts.open_for_handoff(&digest, COLD_FETCH_WAIT).await {
            Ok(Some((file, size))) => {
                send(
                    connection.stream(),
                    &Answer::Held { size },
                    Some(file.as_fd()),
                )
                .await?;
            }
            Ok(None) => send(connection.stream(), &Answer::NotHeld, None).await?,
            Err(error) => {
                let answer = Answer::Refused(format!("blob {digest}: {error}"));
                return send(connection.stream(), &answer, None).await;
            }
        }
    }
}

/// The bytes this side sent that the peer has not read yet (`SIOCOUTQ`: on a Unix socket they
/// stay charged to the sender until the receiver takes them). An error counts as unread.
fn unread_bytes(stream: &UnixStream) -> libc::c_int {
    let mut unread: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int through the pointer, which points at one.
    let done = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut unread) };
    if done == 0 {
        unread
    } else {
        libc::c_int::MAX
    }
}

/// Sends an answer line, with `fd` attached to its first byte.
async fn send(stream: &UnixStream, answer: &Answer, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let line = answer.encode();
    let fds: Vec<RawFd> = fd.iter().map(AsRawFd::as_raw_fd).collect();
    let mut sent = 0;
    while sent < line.len() {
        let rest = &line[sent..];
        let attach = sent == 0 && !fds.is_empty();
        sent += stream
            .async_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(rest)];
                let rights = [ControlMessage::ScmRights(&fds)];
                let cmsgs: &[ControlMessage] = if attach { &rights } else { &[] };
                sendmsg::<()>(
                    stream.as_raw_fd(),
                    &iov,
                    cmsgs,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(io::Error::from)
            })
            .await?;
    }
    Ok(())
}
