//! `Client.scan`'s answer, [`Scan`]: an iterator of chunks (a list of Entry per chunk the
//! daemon streamed) that runs the Scan when it is first iterated, as the generator the package
//! returned before did. The chunks arrive encoded and are decoded (without the GIL) and made
//! into Python objects on the calling thread while the runtime thread receives the next: the
//! decoding, the larger part of a Scan's client work, overlaps the transfer instead of following
//! it on the thread that reads the socket. A chunk that arrives while the calling thread still
//! has one waiting is decoded by the runtime thread itself, so that when the daemon sends faster
//! than one thread decodes, both threads decode.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyList;
use tunecache_client::{proto as v1, ClientError};

use crate::client::{entries_to_py, NativeClient};
use crate::errors::client_error;
use crate::runtime::{run, run_serving, Event};
use crate::scan_view::{ScanIndex, ScanView};

/// The matching entries, chunk by chunk; the Scan runs on the first `next()`.
#[pyclass(module = "tunecache._native", name = "Scan")]
pub struct Scan {
    /// The client and the Scan to run, until it ran.
    pending: Option<(Py<NativeClient>, v1::ScanRequest, Option<Duration>)>,
    chunks: std::vec::IntoIter<Py<PyList>>,
}

#[pymethods]
impl Scan {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyList>>> {
        if let Some((client, filter, limit)) = self.pending.take() {
            self.chunks = scan(py, client.get(), filter, limit)?.into_iter();
        }
        Ok(self.chunks.next())
    }
}

impl Scan {
    pub fn new(client: Py<NativeClient>, filter: v1::ScanRequest, limit: Option<Duration>) -> Self {
        Scan {
            pending: Some((client, filter, limit)),
            chunks: Vec::new().into_iter(),
        }
    }
}

/// A Scan chunk on its way to the calling thread: as it arrived, or decoded by the runtime
/// thread (see the module doc).
enum Chunk {
    Encoded(tonic::codegen::Bytes),
    Decoded(Vec<v1::Entry>),
}

pub fn decode_chunk(chunk: impl prost::bytes::Buf) -> Result<Vec<v1::Entry>, ClientError> {
    <v1::ScanResponse as prost::Message>::decode(chunk)
        .map(|response| response.entries)
        .map_err(|error| {
            ClientError::Rpc(tonic::Status::internal(format!(
                "a Scan chunk does not decode: {error}"
            )))
        })
}

/// A deadline for what the Rust client gives no deadline of its own (a whole Scan).
async fn within<T>(
    limit: Option<Duration>,
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match limit {
        None => call.await,
        Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(ClientError::Rpc(tonic::Status::deadline_exceeded(
                "Deadline Exceeded",
            )))
        }),
    }
}

/// Runs the Scan `filter` to its end (within `limit`); answers its chunks.
fn scan(
    py: Python<'_>,
    client: &NativeClient,
    filter: v1::ScanRequest,
    limit: Option<Duration>,
) -> PyResult<Vec<Py<PyList>>> {
    let context = client.context(py)?;
    let waiting = Arc::new(AtomicUsize::new(0));
    let taken = Arc::clone(&waiting);
    let mut converted = Vec::new();
    let streamed = run_serving(
        py,
        move |chunks| async move {
            let stream_all = async {
                let client = context.client(None).await?;
                let mut stream = client.scan_encoded(filter).await?;
                while let Some(chunk) = stream.message().await? {
                    let chunk = if waiting.load(Ordering::Acquire) > 0 {
                        Chunk::Decoded(decode_chunk(chunk)?)
                    } else {
                        Chunk::Encoded(chunk)
                    };
                    waiting.fetch_add(1, Ordering::AcqRel);
                    if chunks.send(Event::Request(chunk)).is_err() {
                        break;
                    }
                }
                Ok(())
            };
            within(limit, stream_all).await
        },
        |py, chunk: Chunk| {
            let entries = match chunk {
                Chunk::Decoded(entries) => entries,
                Chunk::Encoded(bytes) => py
                    .detach(move || decode_chunk(bytes))
                    .map_err(|error| client_error(py, error))?,
            };
            converted.push(entries_to_py(py, entries)?.unbind());
            taken.fetch_sub(1, Ordering::AcqRel);
            Ok(())
        },
    )?;
    streamed.map_err(|error| client_error(py, error))?;
    Ok(converted)
}

/// Runs the Scan `filter` to its end (within `limit`), keeping its chunks as received and
/// indexing their keys on the runtime thread as they arrive: `Client.scan(..., lazy=True)`.
pub fn scan_view(
    py: Python<'_>,
    client: &NativeClient,
    filter: v1::ScanRequest,
    limit: Option<Duration>,
) -> PyResult<ScanView> {
    let context = client.context(py)?;
    let received = run(py, async move {
        let receive_all = async {
            let client = context.client(None).await?;
            let mut stream = client.scan_encoded(filter).await?;
            let mut index = ScanIndex::default();
            while let Some(chunk) = stream.message().await? {
                index.add_chunk(chunk).ok_or_else(|| {
                    ClientError::Rpc(tonic::Status::internal("a Scan chunk does not decode"))
                })?;
            }
            Ok(index)
        };
        within(limit, receive_all).await
    })?;
    let index = received.map_err(|error| client_error(py, error))?;
    Ok(ScanView::new(index))
}
