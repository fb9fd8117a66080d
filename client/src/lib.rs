//! Thin async client for the `tunecached` node daemon.
//!
//! `Client::connect` opens the daemon's Unix socket; every call carries a deadline so a
//! rank never hangs on the cache. The generated gRPC client is available through
//! [`Client::raw`] for anything this wrapper does not cover.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tunecache_proto::v1::{self, tune_cache_client::TuneCacheClient};

pub use tunecache_proto::socket_path::default_socket_path;
pub use tunecache_proto::v1 as proto;

/// Default deadline of unary calls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline of a whole Scan.
pub const DEFAULT_SCAN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach tunecached at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{}: {}", .0.code(), .0.message())]
    Rpc(#[from] tonic::Status),
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[derive(Clone)]
pub struct Client {
    inner: TuneCacheClient<Channel>,
    timeout: Duration,
}

/// Opens a gRPC channel over the Unix socket at `path`. The `:authority` is `localhost`.
pub async fn connect_channel(path: &Path) -> Result<Channel> {
    let socket = path.to_path_buf();
    // The URI is required by the transport but unused: the connector below dials the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(DEFAULT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

impl Client {
    /// Connects to the daemon at `path`.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let channel = connect_channel(path.as_ref()).await?;
        Ok(Client {
            inner: TuneCacheClient::new(channel)
                .max_decoding_message_size(256 * 1024 * 1024)
                .max_encoding_message_size(256 * 1024 * 1024),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Connects to the daemon at the default socket (`$TUNECACHE_SOCKET`, then
    /// `$XDG_RUNTIME_DIR/tunecache/tunecache.sock`, then `/tmp/tunecache-<uid>/...`).
    pub async fn connect_default() -> Result<Client> {
        Client::connect(default_socket_path()).await
    }

    /// Sets the deadline of unary calls.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn raw(&self) -> TuneCacheClient<Channel> {
        self.inner.clone()
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        request
    }

    /// Looks keys up; returns the hits only, in request order.
    pub async fn lookup(&self, keys: Vec<v1::Key>) -> Result<Vec<v1::Entry>> {
        let request = self.request(v1::LookupRequest { keys }, self.timeout);
        Ok(self.inner.clone().lookup(request).await?.into_inner().hits)
    }

    /// Records results; the daemon keeps, per key, the best under its merge rule.
    pub async fn record(&self, entries: Vec<v1::Entry>) -> Result<v1::RecordResponse> {
        self.record_with_lease(entries, String::new()).await
    }

    /// Records results that complete the lease `Resolve` handed out.
    pub async fn record_with_lease(
        &self,
        entries: Vec<v1::Entry>,
        lease_id: String,
    ) -> Result<v1::RecordResponse> {
        let request = self.request(v1::RecordRequest { entries, lease_id }, self.timeout);
        Ok(self.inner.clone().record(request).await?.into_inner())
    }

    /// Every entry matching the filter (empty = everything), read chunk by chunk.
    pub async fn scan(&self, namespace: &str, device: &str) -> Result<Vec<v1::Entry>> {
        let request = self.request(
            v1::ScanRequest {
                namespace: namespace.to_owned(),
                device: device.to_owned(),
            },
            DEFAULT_SCAN_TIMEOUT,
        );
        let mut stream = self.inner.clone().scan(request).await?.into_inner();
        let mut entries = Vec::new();
        while let Some(chunk) = stream.message().await? {
            entries.extend(chunk.entries);
        }
        Ok(entries)
    }

    pub async fn stats(&self) -> Result<v1::StatsResponse> {
        let request = self.request(v1::StatsRequest {}, self.timeout);
        Ok(self.inner.clone().stats(request).await?.into_inner())
    }
}

/// Builds a key; `rank: None` is the entry shared by all ranks.
pub fn key(namespace: &str, op: &str, device: &str, problem: &str, rank: Option<u32>) -> v1::Key {
    v1::Key {
        namespace: namespace.to_owned(),
        op: op.to_owned(),
        device: device.to_owned(),
        problem: problem.to_owned(),
        rank,
    }
}
