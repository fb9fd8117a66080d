//! Where a request's bytes are read and checked: inline when small, on the blocking pool when
//! larger than `OFF_RUNTIME_BYTES`, so that one caller's large request never holds a runtime
//! worker for its whole decode. Both doors of Lookup and Record (`routes`, `service`) read
//! through here.

use prost::bytes::Bytes;
use tonic::Status;

/// Requests larger than this are read and checked on the blocking pool. A 10,000-key Lookup
/// of typical keys is about 1 MiB and 15 ms of decoding and validation.
pub const OFF_RUNTIME_BYTES: usize = 256 * 1024;

/// Runs `read` on the request's bytes: inline when small, else on the blocking pool.
pub(crate) async fn off_runtime_if_large<T: Send + 'static>(
    request: Bytes,
    read: impl FnOnce(&Bytes) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    if request.len() <= OFF_RUNTIME_BYTES {
        return read(&request);
    }
    tokio::task::spawn_blocking(move || read(&request))
        .await
        .map_err(|error| Status::internal(format!("reading the request failed: {error}")))?
}
