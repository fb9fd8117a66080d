//! `tunecache._native.Client`: one daemon connection of `tunecache-client`, made on the first
//! call (creating a client only resolves and checks the socket), shared by every thread of the
//! process, and made anew in a forked child (the parent's is left untouched, see
//! [`crate::runtime`]). Each method runs one Rust client call on the process runtime with the
//! GIL released and converts its answer into the package's Python objects.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::sync::OnceCell;
use tunecache_client::{proto as v1, Client as RustClient, ClientError};

use crate::errors::client_error;
use crate::leases::{lease_to_finish, KeptRecord, TuneFinish, TuneLease, TuneStart};
use crate::messages::{
    Artifact, Entry, Key, Message, RecordResponse, ResolveResponse, TunedResult,
};
use crate::runtime::{run, run_serving, Event};
use crate::tuning;

/// The connection of one process: made once, by whichever call comes first.
struct Connection {
    pid: u32,
    cell: Arc<OnceCell<RustClient>>,
}

#[pyclass(module = "tunecache._native", name = "Client", frozen)]
pub struct NativeClient {
    path: PathBuf,
    timeout: Duration,
    /// The view resolved when the client was made (the explicit `Client(view=...)` as the last
    /// resort), as `client.view` shows it and every Lookup, Scan and Resolve sends it.
    view: String,
    connection: Mutex<Connection>,
}

/// What a call needs on the runtime: the socket, the deadline, and the process's connection.
#[derive(Clone)]
pub struct CallContext {
    path: PathBuf,
    timeout: Duration,
    view: String,
    cell: Arc<OnceCell<RustClient>>,
}

impl CallContext {
    /// The connected client (connecting, or auto-starting a daemon with TUNECACHE_AUTOSTART=1,
    /// on first use), with `timeout` as its unary deadline. A failed connect is tried again by
    /// the next call.
    pub async fn client(&self, timeout: Option<Duration>) -> Result<RustClient, ClientError> {
        let client = self
            .cell
            .get_or_try_init(|| async {
                let client = RustClient::connect_auto(&self.path).await?;
                Ok::<_, ClientError>(client.in_view(self.view.clone()))
            })
            .await?;
        Ok(client.clone().with_timeout(timeout.unwrap_or(self.timeout)))
    }
}

fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(seconds) => Duration::try_from_secs_f64(seconds)
            .map(Some)
            .map_err(|_| PyValueError::new_err(format!("timeout must be >= 0, got {seconds}"))),
    }
}

/// A deadline for what the Rust client gives no deadline of its own (a whole Scan).
async fn within<T>(
    limit: Option<Duration>,
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match limit {
        None => call.await,
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer,
            Err(_) => Err(ClientError::Rpc(tonic::Status::deadline_exceeded(
                "Deadline Exceeded",
            ))),
        },
    }
}

/// A Scan chunk on its way to the calling thread: as it arrived, or decoded by the runtime
/// thread (see `scan`).
enum ScanChunk {
    Encoded(tonic::codegen::Bytes),
    Decoded(Vec<v1::Entry>),
}

fn decode_chunk(chunk: tonic::codegen::Bytes) -> Result<Vec<v1::Entry>, ClientError> {
    <v1::ScanResponse as prost::Message>::decode(chunk)
        .map(|response| response.entries)
        .map_err(|error| {
            ClientError::Rpc(tonic::Status::internal(format!(
                "a Scan chunk does not decode: {error}"
            )))
        })
}

pub fn entries_to_py(py: Python<'_>, entries: Vec<v1::Entry>) -> PyResult<Bound<'_, PyList>> {
    let converted = entries
        .into_iter()
        .map(|entry| Entry::from_proto(py, entry))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, converted)
}

impl NativeClient {
    pub fn context(&self, _py: Python<'_>) -> PyResult<CallContext> {
        // Taken with the GIL held and never across a release of it: a fork cannot find it held.
        let mut connection = self
            .connection
            .lock()
            .map_err(|_| PyRuntimeError::new_err("tunecache: the client's state is poisoned"))?;
        let pid = std::process::id();
        if connection.pid != pid {
            // A forked child: the parent's connection belongs to a runtime that does not exist
            // here. Leave it untouched and connect afresh.
            let inherited = std::mem::replace(
                &mut *connection,
                Connection {
                    pid,
                    cell: Arc::new(OnceCell::new()),
                },
            );
            std::mem::forget(inherited);
        }
        Ok(CallContext {
            path: self.path.clone(),
            timeout: self.timeout,
            view: self.view.clone(),
            cell: Arc::clone(&connection.cell),
        })
    }

    fn call<T, F, Fut>(&self, py: Python<'_>, call: F) -> PyResult<T>
    where
        T: Send + 'static,
        F: FnOnce(CallContext) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>> + Send + 'static,
    {
        let context = self.context(py)?;
        run(py, call(context))?.map_err(|error| client_error(py, error))
    }
}

#[pymethods]
impl NativeClient {
    /// `socket`: a path (trusted as given); None: `$TUNECACHE_SOCKET`, else the default path,
    /// which is refused when another user could have planted it (UntrustedSocketError). A
    /// daemon answering there as an untrusted uid is refused at once (UntrustedDaemonError);
    /// nothing answering is not an error until a call is made. `view`: the view's last resort
    /// (see `tunecache_client::view`); Lookup, Scan and Resolve read in the resolved view.
    #[new]
    #[pyo3(signature = (socket=None, timeout=tunecache_client::DEFAULT_TIMEOUT.as_secs_f64(), view=None))]
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        timeout: f64,
        view: Option<String>,
    ) -> PyResult<Self> {
        let timeout = seconds(Some(timeout))?.unwrap_or(tunecache_client::DEFAULT_TIMEOUT);
        let path =
            tunecache_client::socket_path(socket).map_err(|error| client_error(py, error))?;
        let probed = path.clone();
        py.detach(|| tunecache_client::check_daemon_uid(&probed))
            .map_err(|error| client_error(py, error))?;
        // Resolved now, on the calling thread with the GIL (Python's os.environ writes hold it
        // too): the environment when the client is made decides, as before.
        let view = tunecache_client::view::view_from_env(view.as_deref());
        Ok(NativeClient {
            path,
            timeout,
            view,
            connection: Mutex::new(Connection {
                pid: std::process::id(),
                cell: Arc::new(OnceCell::new()),
            }),
        })
    }

    #[getter]
    fn socket_path(&self) -> String {
        self.path.display().to_string()
    }

    /// The view Lookup, Scan and Resolve read in (empty: none).
    #[getter]
    fn view(&self) -> String {
        self.view.clone()
    }

    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout.as_secs_f64()
    }

    /// Drops this process's connection; the next call connects again.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut connection = self
            .connection
            .lock()
            .map_err(|_| PyRuntimeError::new_err("tunecache: the client's state is poisoned"))?;
        let pid = std::process::id();
        let previous = std::mem::replace(
            &mut *connection,
            Connection {
                pid,
                cell: Arc::new(OnceCell::new()),
            },
        );
        if previous.pid == pid {
            // Dropped on this thread: the channel's worker task ends on the runtime.
            drop(previous);
        } else {
            std::mem::forget(previous);
        }
        let _ = py;
        Ok(())
    }

    /// The cached entries among `keys` (hits only, in request order).
    #[pyo3(signature = (keys, timeout=None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = keys
            .try_iter()?
            .map(|key| Key::extract_any(&key?))
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = seconds(timeout)?;
        let hits = self.call(py, move |context| async move {
            context.client(timeout).await?.lookup(keys).await
        })?;
        entries_to_py(py, hits)
    }

    /// Stores entries; with a lease_id completes that lease (no entries: gives it up).
    #[pyo3(signature = (entries, lease_id=String::new(), timeout=None))]
    fn record(
        &self,
        py: Python<'_>,
        entries: &Bound<'_, PyAny>,
        lease_id: String,
        timeout: Option<f64>,
    ) -> PyResult<RecordResponse> {
        let entries = entries
            .try_iter()?
            .map(|entry| Entry::extract_any(&entry?))
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = seconds(timeout)?;
        let response = self.call(py, move |context| async move {
            context
                .client(timeout)
                .await?
                .record_with_lease(entries, lease_id)
                .await
        })?;
        Ok(RecordResponse {
            stored: response.stored,
            unchanged: response.unchanged,
        })
    }

    /// Every matching entry, one list per chunk the daemon streamed; `timeout` covers the
    /// whole stream.
    #[pyo3(signature = (namespace=String::new(), device=String::new(), rank=None, timeout=None))]
    fn scan<'py>(
        &self,
        py: Python<'py>,
        namespace: String,
        device: String,
        rank: Option<u32>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let limit = seconds(timeout)?;
        let filter = v1::ScanRequest {
            namespace,
            device,
            rank,
            // The client's view (scan_stream fills it in).
            view: String::new(),
        };
        // Each chunk arrives encoded and is decoded (without the GIL) and made into Python
        // objects on this thread, while the runtime thread receives the next: the decoding, the
        // larger part of a Scan's client work, overlaps the transfer instead of following it on
        // the thread that reads the socket. A chunk that arrives while this thread still has
        // one waiting is decoded by the runtime thread itself, so that when the daemon sends
        // faster than one thread decodes, both threads decode.
        let context = self.context(py)?;
        let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let taken = Arc::clone(&waiting);
        let mut converted: Vec<Py<PyList>> = Vec::new();
        let streamed = run_serving(
            py,
            move |chunks| async move {
                use std::sync::atomic::Ordering;
                let stream_all = async {
                    let client = context.client(None).await?;
                    let mut stream = client.scan_encoded(filter).await?;
                    while let Some(chunk) = stream.message().await? {
                        let chunk = if waiting.load(Ordering::Acquire) > 0 {
                            ScanChunk::Decoded(decode_chunk(chunk)?)
                        } else {
                            ScanChunk::Encoded(chunk)
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
            |py, chunk: ScanChunk| {
                let entries = match chunk {
                    ScanChunk::Decoded(entries) => entries,
                    ScanChunk::Encoded(bytes) => py
                        .detach(move || decode_chunk(bytes))
                        .map_err(|error| client_error(py, error))?,
                };
                converted.push(entries_to_py(py, entries)?.unbind());
                taken.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                Ok(())
            },
        )?;
        streamed.map_err(|error| client_error(py, error))?;
        PyList::new(py, converted)
    }

    /// The daemon's counters, as a Message with StatsResponse's field names.
    #[pyo3(signature = (timeout=None))]
    fn stats(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let timeout = seconds(timeout)?;
        let stats = self.call(py, move |context| async move {
            context.client(timeout).await?.stats().await
        })?;
        let fields = pythonize::pythonize(py, &stats)
            .map_err(|error| PyRuntimeError::new_err(format!("tunecache: stats: {error}")))?;
        Ok(Message::new("StatsResponse", fields.cast_into::<PyDict>()?))
    }

    /// The node tuner's devices.
    #[pyo3(signature = (timeout=None))]
    fn devices<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Vec<Message>> {
        let timeout = seconds(timeout)?;
        let devices = self.call(py, move |context| async move {
            context.client(timeout).await?.devices().await
        })?;
        devices
            .into_iter()
            .map(|device| {
                let fields = PyDict::new(py);
                fields.set_item("backend", device.backend)?;
                fields.set_item("name", device.name)?;
                fields.set_item("compute_capability", device.compute_capability)?;
                fields.set_item("memory_bytes", device.memory_bytes)?;
                fields.set_item("driver_version", device.driver_version)?;
                fields.set_item("cuda_version", device.cuda_version)?;
                fields.set_item("fingerprint", device.fingerprint)?;
                Ok(Message::new("Device", fields))
            })
            .collect()
    }

    /// Publishes this node's new contributions to the shared directory now.
    #[pyo3(signature = (timeout=None))]
    fn snapshot(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let timeout = seconds(timeout)?;
        let snapshot = self.call(py, move |context| async move {
            context.client(timeout).await?.snapshot().await
        })?;
        let fields = PyDict::new(py);
        fields.set_item("path", snapshot.path)?;
        fields.set_item("entries", snapshot.entries)?;
        fields.set_item("bytes", snapshot.bytes)?;
        fields.set_item("duration_ms", snapshot.duration_ms)?;
        fields.set_item("skipped_unchanged", snapshot.skipped_unchanged)?;
        Ok(Message::new("SnapshotResponse", fields))
    }

    /// Forgets results on every node; answers how many entries this node dropped.
    /// `only_if`: (config, time_us) of the winner the key must still have.
    #[pyo3(signature = (namespace, op=String::new(), device=String::new(), problem=String::new(), rank=None, only_if=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn forget(
        &self,
        py: Python<'_>,
        namespace: String,
        op: String,
        device: String,
        problem: String,
        rank: Option<u32>,
        only_if: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let only_if = match only_if {
            Some(result) => {
                let result = TunedResult::extract_any(result)?;
                // Only what the daemon compares: a Result read back (with its tuned_by and
                // forget_epoch) can be passed as it is.
                Some(v1::Result {
                    config: result.config,
                    time_us: result.time_us,
                    ..Default::default()
                })
            }
            None => None,
        };
        let request = v1::ForgetRequest {
            namespace,
            op,
            device,
            problem,
            rank,
            only_if,
        };
        let timeout = seconds(timeout)?;
        self.call(py, move |context| async move {
            context.client(timeout).await?.forget(request).await
        })
    }

    /// Resolve's answer (hit, tune_here or miss) in the client's view; the deadline is wait_ms
    /// plus the timeout.
    #[pyo3(signature = (key, wait_ms, can_tune=true, lease_ms=0, timeout=None))]
    fn resolve(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        wait_ms: u64,
        can_tune: bool,
        lease_ms: u64,
        timeout: Option<f64>,
    ) -> PyResult<ResolveResponse> {
        use tunecache_client::Resolution;
        let key = Key::extract_any(key)?;
        let options = tunecache_client::ResolveOptions {
            wait: Duration::from_millis(wait_ms),
            can_tune,
            lease: Duration::from_millis(lease_ms),
        };
        let timeout = seconds(timeout)?;
        let resolution = self.call(py, move |context| async move {
            context.client(timeout).await?.resolve(key, options).await
        })?;
        use v1::resolve_response::Outcome;
        let outcome = match resolution {
            Resolution::Hit(result) => Outcome::Hit(result),
            Resolution::TuneHere(lease) => Outcome::TuneHere(lease),
            Resolution::Miss(reason) => Outcome::Miss(v1::Miss { reason }),
        };
        ResolveResponse::from_proto(
            py,
            v1::ResolveResponse {
                outcome: Some(outcome),
            },
        )
    }

    /// The views this node holds pins for (name, pins, idle_ms), most recently read first.
    #[pyo3(signature = (timeout=None))]
    fn list_views(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<Message>> {
        let timeout = seconds(timeout)?;
        let views = self.call(py, move |context| async move {
            context.client(timeout).await?.list_views().await
        })?;
        views
            .into_iter()
            .map(|view| {
                let fields = PyDict::new(py);
                fields.set_item("name", view.name)?;
                fields.set_item("uid", view.uid)?;
                fields.set_item("pins", view.pins)?;
                fields.set_item("idle_ms", view.idle_ms)?;
                Ok(Message::new("ViewInfo", fields))
            })
            .collect()
    }

    /// Ends view `name` on this node (and in Redis with the cluster tier); answers `ended` and
    /// `pins_dropped`.
    #[pyo3(signature = (name, timeout=None))]
    fn end_view(&self, py: Python<'_>, name: String, timeout: Option<f64>) -> PyResult<Message> {
        let timeout = seconds(timeout)?;
        let ended = self.call(py, move |context| async move {
            context.client(timeout).await?.end_view(&name).await
        })?;
        let fields = PyDict::new(py);
        fields.set_item("ended", ended.ended)?;
        fields.set_item("pins_dropped", ended.pins_dropped)?;
        Ok(Message::new("EndViewResponse", fields))
    }

    /// The rank flow of `tunecache-client` (`get_or_tune_traced`): Resolve; when told to tune,
    /// `tune()` runs here, on the calling thread, and returns `(config_text, time_us, tuned_by,
    /// tuned_at_unix_ms)`, or with a fifth element the artifacts the result names; its result is Recorded with the lease, or the lease is given up when
    /// it raises (the exception is raised again once the lease is given up). Answers a
    /// `RankOutcome`.
    #[pyo3(signature = (key, tune, wait_ms, can_tune=true, lease_ms=0))]
    fn resolve_tune_record(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        tune: Py<PyAny>,
        wait_ms: u64,
        can_tune: bool,
        lease_ms: u64,
    ) -> PyResult<tuning::RankOutcome> {
        let key = Key::extract_any(key)?;
        let options = tunecache_client::ResolveOptions {
            wait: Duration::from_millis(wait_ms),
            can_tune,
            lease: Duration::from_millis(lease_ms),
        };
        let context = self.context(py)?;
        tuning::resolve_tune_record(py, context, key, options, tune)
    }

    /// Resolves `key` in the client's view: a TuneStart whose `kind` is "hit", "tune" (with the
    /// lease to tune under) or "miss". The deadline is wait_ms plus the timeout.
    #[pyo3(signature = (key, wait_ms, can_tune=true, lease_ms=0, timeout=None))]
    fn begin_tune(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        wait_ms: u64,
        can_tune: bool,
        lease_ms: u64,
        timeout: Option<f64>,
    ) -> PyResult<TuneStart> {
        let key = Key::extract_any(key)?;
        let options = tunecache_client::ResolveOptions {
            wait: Duration::from_millis(wait_ms),
            can_tune,
            lease: Duration::from_millis(lease_ms),
        };
        let timeout = seconds(timeout)?;
        let start = self.call(py, move |context| async move {
            context
                .client(timeout)
                .await?
                .begin_tune(key, options)
                .await
        })?;
        TuneStart::from_rust(py, start)
    }

    /// Records `result` (a Result, or a mapping of its fields) under `lease`, which ends it. A
    /// failed Record gives the lease up, except past its deadline (the Rust client's rule);
    /// the TuneFinish answered says what happened. Raises ValueError for a lease ended already.
    #[pyo3(signature = (lease, result, timeout=None))]
    fn finish_tune(
        &self,
        py: Python<'_>,
        lease: &Bound<'_, TuneLease>,
        result: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<TuneFinish> {
        let result = TunedResult::extract_any(result)?;
        let timeout = seconds(timeout)?;
        let held = lease_to_finish(lease.get())?;
        let context = self.context(py)?;
        let finished = run(py, async move {
            match context.client(timeout).await {
                Ok(client) => Ok(client.finish_tune(held, result).await),
                Err(error) => Err(error),
            }
        })?
        .map_err(|error| client_error(py, error))?;
        Ok(TuneFinish::from_rust(py, finished))
    }

    /// Gives `lease` up without a result (tuning failed), so the next waiter tunes at once.
    /// Answers False when the lease was ended already (nothing is sent), True otherwise; raises
    /// RpcError when the daemon could not be told (the lease then expires).
    #[pyo3(signature = (lease, timeout=None))]
    fn abandon(
        &self,
        py: Python<'_>,
        lease: &Bound<'_, TuneLease>,
        timeout: Option<f64>,
    ) -> PyResult<bool> {
        let Some(held) = lease.get().take()? else {
            return Ok(false);
        };
        let timeout = seconds(timeout)?;
        self.call(py, move |context| async move {
            context.client(timeout).await?.abandon(held).await
        })?;
        Ok(true)
    }

    /// Uploads the file at `path` (PutArtifact; the Rust client's `put_artifact`: hashed, then
    /// streamed in 1 MiB chunks). Answers a StoredArtifact Message: `sha256`, `size` and
    /// `already_held`.
    #[pyo3(signature = (path, timeout=None))]
    fn put_artifact(
        &self,
        py: Python<'_>,
        path: PathBuf,
        timeout: Option<f64>,
    ) -> PyResult<Message> {
        let timeout = seconds(timeout)?;
        let stored = self.call(py, move |context| async move {
            context.client(timeout).await?.put_artifact(path).await
        })?;
        let fields = PyDict::new(py);
        fields.set_item("sha256", stored.sha256)?;
        fields.set_item("size", stored.size)?;
        fields.set_item("already_held", stored.already_held)?;
        Ok(Message::new("StoredArtifact", fields))
    }

    /// Uploads each `(name, path)` of `files` (a mapping name -> path, or an iterable of
    /// pairs) and answers the list of Artifact that name them, for a Result's `artifacts`
    /// (the Rust client's `put_artifacts`: names checked, unique and at most 64 before
    /// anything is uploaded).
    #[pyo3(signature = (files, timeout=None))]
    fn put_artifacts(
        &self,
        py: Python<'_>,
        files: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyList>> {
        let pairs = match files.cast::<pyo3::types::PyMapping>() {
            Ok(mapping) => mapping.items()?.into_any(),
            Err(_) => files.clone(),
        };
        let files = pairs
            .try_iter()?
            .map(|pair| pair?.extract::<(String, PathBuf)>())
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = seconds(timeout)?;
        let artifacts = self.call(py, move |context| async move {
            context.client(timeout).await?.put_artifacts(files).await
        })?;
        Artifact::list_to_py(py, &artifacts)
    }

    /// Writes each file `entry` names (an Entry, or a Result, or their mappings) into the
    /// existing directory `dir` as `dir/<name>`, verified against its digest, by a temporary
    /// file and a rename (the Rust client's `fetch_artifacts`); answers the paths written.
    /// Raises ArtifactError for a name or digest refused, or bytes that are not the blob
    /// named (its temporary file is deleted).
    #[pyo3(signature = (entry, dir, timeout=None))]
    fn fetch_artifacts(
        &self,
        py: Python<'_>,
        entry: &Bound<'_, PyAny>,
        dir: PathBuf,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PathBuf>> {
        let artifacts = if let Ok(result) = entry.cast::<TunedResult>() {
            result.borrow().to_proto().artifacts
        } else if let Ok(entry) = entry.cast::<Entry>() {
            Entry::extract_any(entry.as_any())?
                .result
                .map(|result| result.artifacts)
                .unwrap_or_default()
        } else {
            let is_entry = match entry.cast::<pyo3::types::PyMapping>() {
                Ok(mapping) => mapping.contains("result")? || mapping.contains("key")?,
                Err(_) => entry.hasattr("result")?,
            };
            if is_entry {
                Entry::extract_any(entry)?
                    .result
                    .map(|result| result.artifacts)
                    .unwrap_or_default()
            } else {
                TunedResult::extract_any(entry)?.artifacts
            }
        };
        let timeout = seconds(timeout)?;
        self.call(py, move |context| async move {
            context
                .client(timeout)
                .await?
                .fetch_artifact_list(&artifacts, dir)
                .await
        })
    }

    /// Which of `digests` this node cannot serve (StatArtifacts).
    #[pyo3(signature = (digests, timeout=None))]
    fn stat_artifacts(
        &self,
        py: Python<'_>,
        digests: Vec<String>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<String>> {
        let timeout = seconds(timeout)?;
        self.call(py, move |context| async move {
            context.client(timeout).await?.stat_artifacts(digests).await
        })
    }

    /// Records `entries`, keeping every valid one: an entry the daemon refuses is set aside
    /// and the rest sent again, a batch over the daemon's message size is halved (the Rust
    /// client's `record_keeping_valid`). Answers a KeptRecord; raises RpcError only for a
    /// failure that is not the entries' (the daemon away).
    #[pyo3(signature = (entries, timeout=None))]
    fn record_keeping_valid(
        &self,
        py: Python<'_>,
        entries: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<KeptRecord> {
        let entries = entries
            .try_iter()?
            .map(|entry| Entry::extract_any(&entry?))
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = seconds(timeout)?;
        let kept = self.call(py, move |context| async move {
            context
                .client(timeout)
                .await?
                .record_keeping_valid(entries)
                .await
        })?;
        KeptRecord::from_rust(py, kept)
    }
}
