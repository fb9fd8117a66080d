//! The connection to the daemon: the gRPC channel over its Unix socket, which refuses a daemon
//! of an untrusted uid, and the [`Client`] made on it with its settings (deadline, view, mode,
//! descriptor handoff), the environment's read here, once per connect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tunecache_proto::limits::MAX_MESSAGE_BYTES;
use tunecache_proto::v1::tune_cache_client::TuneCacheClient;

use crate::{
    autostart, handoff, mode, socket_path, trusted_daemon_uids, view, ClientError, Mode, Result,
    DEFAULT_TIMEOUT,
};

#[derive(Clone)]
pub struct Client {
    pub(crate) inner: TuneCacheClient<Channel>,
    /// The same channel, for calls with a codec of their own
    /// ([`encoded_scan`](crate::encoded_scan)).
    pub(crate) channel: Channel,
    pub(crate) timeout: Duration,
    /// Sent in every Lookup, Scan and Resolve; empty for none.
    pub(crate) view: String,
    /// Tune, or replay: every Resolve sent with `replay`, no wait, no lease ([`crate::replay`]).
    pub(crate) mode: Mode,
    /// The descriptor handoff's socket, beside the gRPC socket ([`handoff`]); `None`: off.
    pub(crate) handoff: Option<std::sync::Arc<PathBuf>>,
    /// Hash every handed blob's copy too (`TUNECACHE_VERIFY=1`, [`Client::verify_handoffs`]).
    pub(crate) verify_handoffs: bool,
}

/// Opens a gRPC channel over the Unix socket at `path`. The `:authority` is `localhost`.
///
/// The daemon's uid is read from the connection itself (SO_PEERCRED), so the process checked
/// is the one answering, with no gap between check and connect: a socket served by a uid
/// other than the caller's, root's or one in `$TUNECACHE_TRUST_UID` is refused, named or not.
pub async fn connect_channel(path: &Path) -> Result<Channel> {
    let socket = path.to_path_buf();
    let trusted = trusted_daemon_uids();
    let refused: std::sync::Arc<std::sync::Mutex<Option<u32>>> = Default::default();
    let refused_in_connector = std::sync::Arc::clone(&refused);
    // The URI is required by the transport but unused: the connector below dials the socket.
    let connected = Endpoint::from_static("http://localhost")
        .connect_timeout(DEFAULT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            let trusted = trusted.clone();
            let refused = std::sync::Arc::clone(&refused_in_connector);
            async move {
                let stream = UnixStream::connect(socket).await?;
                let uid = stream.peer_cred()?.uid();
                if !trusted.contains(&uid) {
                    if let Ok(mut slot) = refused.lock() {
                        *slot = Some(uid);
                    }
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the daemon runs as uid {uid}, which this client does not trust"),
                    ));
                }
                Ok(TokioIo::new(stream))
            }
        }))
        .await;
    connected.map_err(|source| match refused.lock().ok().and_then(|slot| *slot) {
        Some(uid) => ClientError::UntrustedDaemon {
            path: path.to_path_buf(),
            uid,
            me: nix::unistd::geteuid().as_raw(),
        },
        None => ClientError::Connect {
            path: path.to_path_buf(),
            source,
        },
    })
}

impl Client {
    /// Connects to the daemon at `path`, reading in the view the environment names
    /// ([`view::view_from_env`]), in the mode it names ([`mode::mode_from_env`]: `tune` unless
    /// `TUNECACHE_MODE` says `replay`; [`ClientError::Mode`] for any other value).
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let mode = mode::mode_from_env(None)?;
        let channel = connect_channel(path.as_ref()).await?;
        Ok(Client {
            inner: TuneCacheClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            channel,
            timeout: DEFAULT_TIMEOUT,
            view: view::view_from_env(None),
            mode,
            handoff: handoff::socket_for(path.as_ref()).map(std::sync::Arc::new),
            verify_handoffs: handoff::verify_from_env(),
        })
    }

    /// Whether a blob handed as a descriptor is hashed as it is copied, and refused if its
    /// bytes changed after the daemon checked them (which a rank of the daemon's own uid can
    /// do). Off by default: the copy's size is checked. `TUNECACHE_VERIFY=1` turns it on.
    pub fn verify_handoffs(mut self, on: bool) -> Client {
        self.verify_handoffs = on;
        self
    }

    /// Streams every blob through GetArtifact, never taking a descriptor ([`handoff`]).
    pub fn without_handoff(mut self) -> Client {
        self.handoff = None;
        self
    }

    /// Connects to the daemon at the default socket (`$TUNECACHE_SOCKET`, then
    /// `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then `/tmp/tunecache-<uid>/...`), refusing
    /// a built-in default another user could have planted (see [`socket_path`]).
    /// With `TUNECACHE_AUTOSTART=1`, starts a daemon there if none answers.
    pub async fn connect_default() -> Result<Client> {
        Client::connect_auto(socket_path(None)?).await
    }

    /// [`Client::connect_or_start`] when `TUNECACHE_AUTOSTART=1`, else [`Client::connect`].
    pub async fn connect_auto(path: impl AsRef<Path>) -> Result<Client> {
        if autostart::enabled_by_env() {
            Client::connect_or_start(path).await
        } else {
            Client::connect(path).await
        }
    }

    /// Connects to the daemon at `path`, starting one (detached, exiting when idle) if none
    /// answers, and waits until it answers. Safe for all ranks of a node to call at once:
    /// exactly one daemon comes up (see [`autostart`]).
    pub async fn connect_or_start(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref();
        let answering = || async move {
            let client = Client::connect(path).await?;
            // Connected is not enough: the socket may belong to a daemon that is exiting.
            client.stats().await?;
            Ok::<_, ClientError>(client)
        };
        autostart::connect_or_start(path, autostart::DEFAULT_START_TIMEOUT, answering).await?
    }

    /// Sets the deadline of unary calls.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// Resolves the view again with `explicit` as the last resort: it is used only when neither
    /// `TUNECACHE_VIEW`, Slurm nor torchrun names one (see [`view`]), so that all ranks of a
    /// launched job agree. An empty `explicit` adds nothing.
    pub fn with_view(mut self, explicit: &str) -> Client {
        self.view = view::view_from_env(Some(explicit));
        self
    }

    /// Reads in exactly `view` (empty: none), a name resolved earlier with [`view::view_from_env`]:
    /// for a client connected later than it was configured (the Python binding connects on the
    /// first call), so that the environment at that later moment does not change its view.
    pub fn in_view(mut self, view: String) -> Client {
        self.view = view;
        self
    }

    /// The view this client reads in; empty for none.
    pub fn view(&self) -> &str {
        &self.view
    }

    /// Replays ([`Mode::Replay`]): every Resolve is sent with `replay`, never waits and never
    /// takes a lease, and a miss is answered at once. As [`Client::with_view`]'s name, this is the
    /// caller's explicit choice: `TUNECACHE_MODE`, when set, wins (see [`mode`]).
    pub fn replay(self) -> Client {
        self.with_mode(Mode::Replay)
    }

    /// Resolves the mode again with `explicit` as the last resort: `TUNECACHE_MODE`, when set,
    /// wins, so that every rank of a launched job agrees (see [`mode`]). An environment changed
    /// since the connect to a value that is no mode leaves `explicit`.
    pub fn with_mode(mut self, explicit: Mode) -> Client {
        self.mode = mode::mode_from_env(Some(explicit.name())).unwrap_or(explicit);
        self
    }

    /// Resolves in exactly `mode`, one resolved earlier with [`mode::mode_from_env`] (the Python
    /// binding's, made before it connects), whatever the environment says now.
    pub fn in_mode(mut self, mode: Mode) -> Client {
        self.mode = mode;
        self
    }

    /// Whether this client tunes or replays.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn raw(&self) -> TuneCacheClient<Channel> {
        self.inner.clone()
    }

    pub(crate) fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        request
    }
}
