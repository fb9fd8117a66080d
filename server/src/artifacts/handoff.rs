//! The descriptor handoff (the wire format is `tunecache_proto::handoff`): a rank on this node
//! asks for a held blob on the handoff socket, beside the gRPC socket, and is handed a
//! read-only descriptor of the daemon's file (`SCM_RIGHTS`). Its bytes then reach the rank as
//! fast as reading a local file: through HTTP/2, the same bytes cost each side a frame per
//! 16 KiB and two copies more (BENCHMARKS.md, Artifacts).
//!
//! - **What is handed** is what GetArtifact would stream: the file was hashed whole to its
//!   digest as this very file (the index's stamp: device, inode, size, mtime, ctime), hashed
//!   here first otherwise. A file that does not match is dropped and answered `not-held`, and
//!   the client's GetArtifact then fetches the blob again from the tiers. The daemon writes a
//!   blob only by a rename of a new file, never in place, so a handed file stays as hashed.
//! - **Read-only for its receiver**: the file is mode 0444 and the daemon's (`disk`), so a
//!   rank of another uid can neither `fchmod` it nor reopen it writable through
//!   `/proc/self/fd`. A rank of the daemon's own uid can change its mode, as it can change any
//!   of that uid's files: a handed file found with another mode is set back to 0444 first
//!   (which changes its ctime, so it is hashed again), and the clients check its size, and its
//!   digest with `TUNECACHE_VERIFY=1` (docs/artifacts.md).
//! - **Who** may ask: the callers GetArtifact admits (`ops::access`, checked at a
//!   connection's first request), each uid holding at most `--max-connections-per-uid` handoff connections
//!   (`ops::incoming`, counted and logged as for gRPC). A connection has one exchange at a time,
//!   and a request sent before the previous answer was read is refused: a descriptor in flight
//!   is charged to the daemon's uid until its receiver takes it, so a caller that sends
//!   requests and never reads could otherwise pile up the daemon's descriptors in its socket.
//!   So each connection has at most one descriptor in flight; one that sends nothing for
//!   `--preface-timeout` is closed.
//! - **Nothing waits on the runtime**: opening and hashing run on the blocking pool with the
//!   store's bounded wait.

use std::fs::File;
use std::io::{self, IoSlice, Seek};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;
use tunecache_proto::handoff::{parse_request, Answer, REQUEST_BYTES};

use super::{add, disk, Artifacts};
use crate::error::Error;
use crate::ops::access::PeerCheck;
use crate::ops::incoming::{Connection, Incoming};
use crate::ops::limits::ConnectionLimits;
use crate::tasks::Tasks;

/// What a handoff open found.
enum Opened {
    File(File),
    /// Gone, the wrong size, or bytes that do not hash to the digest.
    Bad,
}

impl Artifacts {
    /// Opens held blob `digest` to hand its descriptor over, with its size: `None` when this
    /// node does not hold it now (the caller streams it instead, which fetches it), or its file
    /// turned out not to be the blob (dropped, counted, fetched again by that stream).
    pub async fn open_for_handoff(
        self: &Arc<Self>,
        digest: &str,
    ) -> Result<Option<(File, u64)>, Error> {
        let Some(blob) = crate::sync::lock(&self.index).blob(digest).cloned() else {
            return Ok(None);
        };
        let path = self.dir.path_of(digest);
        let (artifacts, name, size) = (Arc::clone(self), digest.to_owned(), blob.size);
        let opened = Self::blocking("opening a blob to hand it over", move || {
            let Ok(mut file) = File::open(&path) else {
                return Ok(Opened::Bad);
            };
            let mut metadata = file.metadata()?;
            if !disk::has_blob_mode(&metadata) {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(disk::BLOB_MODE))?;
                metadata = file.metadata()?;
            }
            let stamp = disk::stamp_of(&metadata);
            if stamp.len != size {
                return Ok(Opened::Bad);
            }
            if crate::sync::lock(&artifacts.index).must_hash(&name, &stamp) {
                let (hashed, len) = disk::hash_open(&mut file)?;
                if hashed != name || len != size {
                    return Ok(Opened::Bad);
                }
                crate::sync::lock(&artifacts.index).served_whole(&name, stamp);
                // The receiver shares this file offset: it starts at the first byte.
                file.rewind()?;
            }
            Ok(Opened::File(file))
        })
        .await?;
        match opened {
            Opened::File(file) => {
                add(&self.counters.fetches_local, 1);
                add(&self.counters.handoffs, 1);
                add(&self.counters.bytes_served, size);
                Ok(Some((file, size)))
            }
            Opened::Bad => {
                self.drop_corrupt(digest).await;
                Ok(None)
            }
        }
    }
}

/// Serves the handoff socket until the daemon stops: each connection on a task of its own.
pub async fn serve(
    artifacts: Arc<Artifacts>,
    listener: UnixListener,
    limits: Arc<ConnectionLimits>,
    check: PeerCheck,
    tasks: Tasks,
) {
    let idle = limits.preface_timeout;
    let mut incoming = Incoming::new(listener, limits);
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
        let (artifacts, check, stop) = (artifacts.clone(), check.clone(), stop.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                served = serve_connection(&artifacts, connection, &check, idle) => {
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
    check: &PeerCheck,
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
            if let Err(refusal) = check.admit_peer(&connection.connect_info()).await {
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
        match artifacts.open_for_handoff(&digest).await {
            Ok(Some((file, size))) => {
                use std::os::fd::AsFd;
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
