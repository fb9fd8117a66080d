//! Accepted connections, before tonic sees them: the accept loop that backs off when
//! accept(2) fails (out of descriptors) instead of spinning, the per-uid connection cap, and
//! the deadline for the HTTP/2 preface.
//!
//! tonic retries a failed accept at once, so a daemon out of descriptors would spin a core
//! and never get them back; and nothing in hyper closes a connection that never speaks. Both
//! are bounded here, for a bound socket and a socket-activated one alike.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use crate::ops::limits::ConnectionLimits;

/// The client connection preface every HTTP/2 connection starts with.
const HTTP2_PREFACE_BYTES: usize = 24;
/// First pause after a failed accept; doubled on each failure in a row, up to the maximum.
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Connections open per uid, shared by the accept loop and the connections' slots.
type UidCounts = Arc<Mutex<HashMap<u32, usize>>>;

/// The stream of connections tonic serves.
pub struct Incoming {
    listener: UnixListener,
    limits: Arc<ConnectionLimits>,
    per_uid: UidCounts,
    backoff: Option<Pin<Box<Sleep>>>,
    next_backoff: Duration,
}

impl Incoming {
    pub fn new(listener: UnixListener, limits: Arc<ConnectionLimits>) -> Self {
        Incoming {
            listener,
            limits,
            per_uid: UidCounts::default(),
            backoff: None,
            next_backoff: ACCEPT_BACKOFF_START,
        }
    }

    /// Takes a slot for `stream`'s uid, or None when that uid holds the maximum.
    fn admit(&self, stream: &UnixStream) -> Option<ConnectionSlot> {
        // Without credentials (not on Linux Unix sockets) the connection is not capped;
        // the per-call peer check refuses it anyway.
        let uid = stream.peer_cred().ok().map(|cred| cred.uid());
        if let Some(uid) = uid {
            let mut per_uid = crate::sync::lock(&self.per_uid);
            let open = per_uid.entry(uid).or_default();
            if *open >= self.limits.max_per_uid {
                drop(per_uid);
                self.refuse(uid, stream);
                return None;
            }
            *open += 1;
        }
        self.limits.counters.open.fetch_add(1, Ordering::Relaxed);
        Some(ConnectionSlot {
            uid,
            per_uid: self.per_uid.clone(),
            limits: self.limits.clone(),
        })
    }

    fn refuse(&self, uid: u32, stream: &UnixStream) {
        let counters = &self.limits.counters;
        counters.refused_per_uid.fetch_add(1, Ordering::Relaxed);
        if self
            .limits
            .logged
            .first(format!("connections of uid {uid}"))
        {
            let pid = stream.peer_cred().ok().and_then(|cred| cred.pid());
            tracing::warn!(
                uid,
                pid,
                limit = self.limits.max_per_uid,
                "closed a connection: this uid already holds --max-connections-per-uid \
                 connections (logged once per uid; Stats counts each as \
                 connections_refused_per_uid)"
            );
        }
    }

    /// Counts and logs (once per cause) a failed accept, and arms the back-off.
    fn accept_failed(&mut self, error: &io::Error) {
        let limits = &self.limits;
        limits
            .counters
            .accept_errors
            .fetch_add(1, Ordering::Relaxed);
        let cause = error
            .raw_os_error()
            .map_or_else(|| error.kind().to_string(), |errno| errno.to_string());
        if limits.logged.first(format!("accept errno {cause}")) {
            tracing::warn!(
                %error,
                open_connections = limits.counters.open.load(Ordering::Relaxed),
                nofile_soft_limit = limits.nofile.soft,
                "accepting a connection failed; backing off (up to {ACCEPT_BACKOFF_MAX:?}) \
                 until it succeeds (logged once per cause; Stats counts each as accept_errors)"
            );
        }
        self.backoff = Some(Box::pin(tokio::time::sleep(self.next_backoff)));
        self.next_backoff = (self.next_backoff * 2).min(ACCEPT_BACKOFF_MAX);
    }
}

/// Errors about one connection that went away before it was accepted: try the next at once.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(backoff) = self.backoff.as_mut() {
                std::task::ready!(backoff.as_mut().poll(cx));
                self.backoff = None;
            }
            match std::task::ready!(self.listener.poll_accept(cx)) {
                Ok((stream, _)) => {
                    self.next_backoff = ACCEPT_BACKOFF_START;
                    // Over the cap: `stream` is dropped here, which closes it.
                    if let Some(slot) = self.admit(&stream) {
                        let preface = Preface::new(self.limits.clone());
                        return Poll::Ready(Some(Ok(Connection {
                            stream,
                            preface: Some(preface),
                            _slot: slot,
                        })));
                    }
                }
                Err(error) if is_connection_error(&error) => {}
                Err(error) => self.accept_failed(&error),
            }
        }
    }
}

/// One connection's place in the per-uid count, given back when the connection closes.
struct ConnectionSlot {
    uid: Option<u32>,
    per_uid: UidCounts,
    limits: Arc<ConnectionLimits>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.limits.counters.open.fetch_sub(1, Ordering::Relaxed);
        let Some(uid) = self.uid else {
            return;
        };
        let mut per_uid = crate::sync::lock(&self.per_uid);
        if let Some(open) = per_uid.get_mut(&uid) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                per_uid.remove(&uid);
            }
        }
    }
}

/// The deadline for a new connection's HTTP/2 preface, until its bytes have arrived.
struct Preface {
    deadline: Pin<Box<Sleep>>,
    received: usize,
    limits: Arc<ConnectionLimits>,
}

impl Preface {
    fn new(limits: Arc<ConnectionLimits>) -> Self {
        Preface {
            deadline: Box::pin(tokio::time::sleep(limits.preface_timeout)),
            received: 0,
            limits,
        }
    }

    fn timed_out(&self) -> io::Error {
        let limits = &self.limits;
        limits
            .counters
            .preface_timeouts
            .fetch_add(1, Ordering::Relaxed);
        if limits.logged.first("preface timeout") {
            tracing::warn!(
                timeout = ?limits.preface_timeout,
                "closed a connection that sent no HTTP/2 preface in time (--preface-timeout; \
                 logged once; Stats counts each as preface_timeouts)"
            );
        }
        io::Error::new(
            io::ErrorKind::TimedOut,
            "no HTTP/2 preface within --preface-timeout",
        )
    }
}

/// An accepted connection: the socket, its preface deadline and its per-uid slot.
pub struct Connection {
    stream: UnixStream,
    /// `None` once the preface has arrived.
    preface: Option<Preface>,
    _slot: ConnectionSlot,
}

impl Connection {
    /// The socket itself, for what goes around the byte stream (the descriptor handoff's
    /// `SCM_RIGHTS`).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

impl Connected for Connection {
    type ConnectInfo = crate::ops::access::PeerInfo;

    /// Asked once per connection; every call on it gets a clone (see `access::PeerInfo`).
    fn connect_info(&self) -> Self::ConnectInfo {
        crate::ops::access::PeerInfo::new(self.stream.connect_info())
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(preface) = this.preface.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                preface.received += buf.filled().len() - before;
                if preface.received >= HTTP2_PREFACE_BYTES {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match preface.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(preface.timed_out())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
