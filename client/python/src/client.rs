//! `tunecache._native.Client`, the package's `tunecache.Client` (`tunecache/client.py` adds
//! only what is Python by nature: the context manager and `get_or_tune`'s logging): one daemon
//! connection of `tunecache-client`, made on the first call (creating a client only resolves
//! and checks the socket), shared by every thread of the process, and made anew in a forked
//! child (the parent's is left untouched, see [`crate::runtime`]). Each call is declared here
//! once, with its Python signature, defaults and documentation: it reads its arguments
//! ([`crate::args`]), runs one Rust client call on the process runtime with the GIL released,
//! and converts the answer into the package's Python objects. A Scan's streaming is
//! [`crate::scan`]'s.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::sync::OnceCell;
use tunecache_client::{proto as v1, Client as RustClient, ClientError, Mode};

use crate::answers::{Message, RecordResponse, ResolveResponse};
use crate::args::{self, seconds, WholeMs, DEFAULT_SCAN_TIMEOUT_S, DEFAULT_WAIT_MS};
use crate::errors::client_error;
use crate::leases::{lease_to_finish, KeptRecord, TuneFinish, TuneLease, TuneStart};
use crate::messages::{Artifact, TunedResult};
use crate::runtime::run;
use crate::scan::Scan;
use crate::tuning;

/// The connection of one process: made once, by whichever call comes first.
struct Connection {
    pid: u32,
    cell: Arc<OnceCell<RustClient>>,
}

impl Connection {
    fn new() -> Self {
        Connection {
            pid: std::process::id(),
            cell: Arc::new(OnceCell::new()),
        }
    }
}

/// One connection to tunecached, made on the first call. Thread-safe and fork-safe: a forked
/// child (a DataLoader worker, a multiprocessing fork) gets its own connection on its first
/// call. Every call releases the GIL while it waits, and Ctrl-C interrupts it. Every call has a
/// deadline: `timeout` seconds unless the call says otherwise.
///
/// `Client(socket=None, timeout=5.0, view=None, mode=None)`. `socket`: the daemon's socket; by default
/// $TUNECACHE_SOCKET, else the default path, whose directory is checked first
/// (UntrustedSocketError). On every path the daemon, if one answers, must run as the caller,
/// root or a uid in $TUNECACHE_TRUST_UID (UntrustedDaemonError); nothing answering is not an
/// error until a call is made.
///
/// `view`: the job's view, used only when the environment names none ($TUNECACHE_VIEW, then
/// Slurm's job and step, then torchrun's run id; see tunecache.view). Within a view the first
/// answer for a key is pinned: every rank of the job reads the same result. The resolved name is
/// `client.view` (empty: no view); Lookup, Scan and Resolve read in it.
///
/// `mode`: "tune" (the default) or "replay", used only when $TUNECACHE_MODE is unset or empty
/// (the environment wins, as for the view, so a launcher puts every rank of a job in replay);
/// any other value raises ValueError. In replay (`client.mode`), every Resolve (resolve,
/// begin_tune, resolve_tune_record, get_or_tune, the drop-ins) serves only what is cached: it
/// never waits and never takes a lease, whatever wait_ms and can_tune say, and a miss is
/// answered at once, logged once per key per process (logger "tunecache.replay") and counted
/// by the daemon under the view (ListMisses).
#[pyclass(module = "tunecache._native", name = "Client", frozen, subclass)]
pub struct NativeClient {
    path: PathBuf,
    timeout: Duration,
    /// The view resolved when the client was made (the explicit `Client(view=...)` as the last
    /// resort), as `client.view` shows it and every Lookup, Scan and Resolve sends it.
    view: String,
    /// The mode resolved when the client was made (the explicit `Client(mode=...)` as the last
    /// resort), as `client.mode` shows it and every Resolve is sent in.
    mode: Mode,
    connection: Mutex<Connection>,
}

/// What a call needs on the runtime: the socket, the deadline, and the process's connection.
#[derive(Clone)]
pub struct CallContext {
    path: PathBuf,
    timeout: Duration,
    view: String,
    mode: Mode,
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
                Ok::<_, ClientError>(client.in_view(self.view.clone()).in_mode(self.mode))
            })
            .await?;
        Ok(client.clone().with_timeout(timeout.unwrap_or(self.timeout)))
    }
}

pub fn entries_to_py(py: Python<'_>, entries: Vec<v1::Entry>) -> PyResult<Bound<'_, PyList>> {
    let converted = entries
        .into_iter()
        .map(|entry| crate::entry::Entry::from_proto(py, entry))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, converted)
}

impl NativeClient {
    fn connection(&self) -> PyResult<std::sync::MutexGuard<'_, Connection>> {
        // Taken with the GIL held and never across a release of it: a fork cannot find it held.
        self.connection
            .lock()
            .map_err(|_| PyRuntimeError::new_err("tunecache: the client's state is poisoned"))
    }

    pub fn context(&self, _py: Python<'_>) -> PyResult<CallContext> {
        let mut connection = self.connection()?;
        if connection.pid != std::process::id() {
            // A forked child: the parent's connection belongs to a runtime that does not exist
            // here. Leave it untouched and connect afresh.
            std::mem::forget(std::mem::replace(&mut *connection, Connection::new()));
        }
        Ok(CallContext {
            path: self.path.clone(),
            timeout: self.timeout,
            view: self.view.clone(),
            mode: self.mode,
            cell: Arc::clone(&connection.cell),
        })
    }

    /// Runs `call` with this process's client (deadline `timeout`, else the client's) on the
    /// process runtime, the GIL released; its error as the package's exception.
    fn call<T, F, Fut>(&self, py: Python<'_>, timeout: Option<f64>, call: F) -> PyResult<T>
    where
        T: Send + 'static,
        F: FnOnce(RustClient) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, ClientError>> + Send + 'static,
    {
        let timeout = seconds(timeout)?;
        let context = self.context(py)?;
        run(
            py,
            async move { call(context.client(timeout).await?).await },
        )?
        .map_err(|error| client_error(py, error))
    }
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (socket=None, timeout=tunecache_client::DEFAULT_TIMEOUT.as_secs_f64(), view=None, mode=None))]
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        timeout: f64,
        view: Option<String>,
        mode: Option<String>,
    ) -> PyResult<Self> {
        let timeout = seconds(Some(timeout))?.unwrap_or(tunecache_client::DEFAULT_TIMEOUT);
        // Before the socket: a mode that is no mode is the caller's error, daemon or not.
        let mode = tunecache_client::mode::mode_from_env(mode.as_deref())
            .map_err(|unknown| client_error(py, unknown.into()))?;
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
            mode,
            connection: Mutex::new(Connection::new()),
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

    /// "tune" or "replay": how every Resolve of this client is sent (see the class doc).
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode.name()
    }

    /// The deadline of a call, in seconds, unless the call says otherwise.
    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout.as_secs_f64()
    }

    /// Drops this process's connection; the next call connects again.
    fn close(&self) -> PyResult<()> {
        let previous = std::mem::replace(&mut *self.connection()?, Connection::new());
        if previous.pid == std::process::id() {
            // Dropped on this thread: the channel's worker task ends on the runtime.
            drop(previous);
        } else {
            std::mem::forget(previous);
        }
        Ok(())
    }

    /// The cached entries among `keys` (hits only, in request order), in the client's view.
    #[pyo3(signature = (keys, timeout=None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = args::keys(keys)?;
        let hits = self.call(
            py,
            timeout,
            |client| async move { client.lookup(keys).await },
        )?;
        entries_to_py(py, hits)
    }

    /// Stores entries (a lower time_us wins over what the cache holds). With the lease_id from
    /// Resolve it completes that lease; with a lease_id and no entries it gives the lease up.
    /// Answers a RecordResponse (`stored`, `unchanged`).
    #[pyo3(signature = (entries, lease_id=String::new(), timeout=None))]
    fn record(
        &self,
        py: Python<'_>,
        entries: &Bound<'_, PyAny>,
        lease_id: String,
        timeout: Option<f64>,
    ) -> PyResult<RecordResponse> {
        let entries = args::entries(entries)?;
        let response = self.call(py, timeout, |client| async move {
            client.record_with_lease(entries, lease_id).await
        })?;
        Ok(RecordResponse {
            stored: response.stored,
            unchanged: response.unchanged,
        })
    }

    /// Yields the matching entries chunk by chunk (a list of Entry per chunk), from the first
    /// iteration on; empty filters match everything. With `rank`, only the entries shared by
    /// all ranks and that rank's own (what a rank loads at start). In the client's view. The
    /// deadline covers the whole stream. With `lazy=True`, the Scan runs now and answers a
    /// read-only mapping from key to Entry (`ScanView`) that keeps the bytes received and
    /// decodes an entry when it is first read.
    #[pyo3(signature = (namespace=String::new(), device=String::new(), timeout=Some(DEFAULT_SCAN_TIMEOUT_S), rank=None, lazy=false))]
    fn scan(
        slf: &Bound<'_, Self>,
        namespace: String,
        device: String,
        timeout: Option<f64>,
        rank: Option<u32>,
        lazy: bool,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let filter = v1::ScanRequest {
            namespace,
            device,
            rank,
            // The client's view (scan_stream fills it in).
            view: String::new(),
        };
        let limit = seconds(timeout)?;
        if lazy {
            let view = crate::scan::scan_view(py, slf.get(), filter, limit)?;
            return Ok(Py::new(py, view)?.into_any());
        }
        Ok(Py::new(py, Scan::new(slf.clone().unbind(), filter, limit))?.into_any())
    }

    /// The daemon's counters (the fields of tunecache.v1.StatsResponse as attributes).
    #[pyo3(signature = (timeout=None))]
    fn stats(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let stats = self.call(py, timeout, |client| async move { client.stats().await })?;
        Message::of(py, "StatsResponse", &stats)
    }

    /// The node tuner's devices (the fields of tunecache.v1.Device as attributes).
    #[pyo3(signature = (timeout=None))]
    fn devices(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<Message>> {
        let devices = self.call(py, timeout, |client| async move { client.devices().await })?;
        Message::list_of(py, "Device", &devices)
    }

    /// Publishes this node's new contributions to the shared directory now (the fields of
    /// tunecache.v1.SnapshotResponse as attributes).
    #[pyo3(signature = (timeout=None))]
    fn snapshot(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let snapshot = self.call(py, timeout, |client| async move { client.snapshot().await })?;
        Message::of(py, "SnapshotResponse", &snapshot)
    }

    /// Forgets results on every node, for good; returns how many entries this node dropped.
    /// Without `only_if`, every entry of `namespace` whose op, device and problem equal the
    /// non-empty ones given (`rank=None`: the shared entries and every rank's own), which only
    /// an administrator may do (root, the daemon's own uid, its --admin-uid / --admin-gid;
    /// anyone else gets PERMISSION_DENIED). With `only_if` (a Result, or a mapping with its
    /// `config` text and `time_us`), the one key named (op, device and problem all given;
    /// `rank=None`: the shared entry), and only while its winner has exactly that config and
    /// time_us: how a caller who may Record reports a config it found broken without dropping a
    /// better result recorded since. Raises RpcError, like the other calls.
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
        // Only what the daemon compares: a Result read back (with its tuned_by and
        // forget_epoch) can be passed as it is.
        let only_if = only_if
            .map(TunedResult::extract_any)
            .transpose()?
            .map(|result| v1::Result {
                config: result.config,
                time_us: result.time_us,
                ..Default::default()
            });
        let request = v1::ForgetRequest {
            namespace,
            op,
            device,
            problem,
            rank,
            only_if,
        };
        self.call(
            py,
            timeout,
            |client| async move { client.forget(request).await },
        )
    }

    /// The views this node holds pins for (ViewInfo: name, pins, idle_ms, uid), most recently
    /// read first.
    #[pyo3(signature = (timeout=None))]
    fn list_views(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<Message>> {
        let views = self.call(
            py,
            timeout,
            |client| async move { client.list_views().await },
        )?;
        Message::list_of(py, "ViewInfo", &views)
    }

    /// Ends view `name` on this node (and, with the cluster tier, in Redis): its pins are
    /// dropped and the next read in it pins afresh. An administrator's act, like a scope
    /// Forget. Answers `ended` (the view existed on this node) and `pins_dropped`.
    #[pyo3(signature = (name, timeout=None))]
    fn end_view(&self, py: Python<'_>, name: String, timeout: Option<f64>) -> PyResult<Message> {
        let ended = self.call(
            py,
            timeout,
            |client| async move { client.end_view(&name).await },
        )?;
        Message::of(py, "EndViewResponse", &ended)
    }

    /// Asks for key's result in the client's view: `hit` (use it), `tune_here` (tune, then
    /// record with tune_here.lease_id) or `miss` (use a fallback); `WhichOneof("outcome")` says
    /// which. The daemon may hold the call up to wait_ms (at most 600000), so the deadline is
    /// wait_ms plus the usual timeout.
    #[pyo3(signature = (key, wait_ms=WholeMs(DEFAULT_WAIT_MS), can_tune=true, lease_ms=WholeMs(0), timeout=None))]
    fn resolve(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        wait_ms: WholeMs,
        can_tune: bool,
        lease_ms: WholeMs,
        timeout: Option<f64>,
    ) -> PyResult<ResolveResponse> {
        let (key, options) = args::resolve_request(key, wait_ms, can_tune, lease_ms)?;
        let resolution = self.call(py, timeout, move |client| async move {
            client.resolve(key, options).await
        })?;
        ResolveResponse::from_rust(py, resolution)
    }

    /// The rank flow of `tunecache-client` (`get_or_tune_traced`): Resolve; when told to tune,
    /// `tune()` runs here, on the calling thread, and returns `(config_text, time_us, tuned_by,
    /// tuned_at_unix_ms)`, or with a fifth element the artifacts the result names; its result
    /// is Recorded with the lease, or the lease is given up when it raises (the exception is
    /// raised again once the lease is given up). Answers a `RankOutcome`.
    #[pyo3(signature = (key, tune, wait_ms=WholeMs(DEFAULT_WAIT_MS), can_tune=true, lease_ms=WholeMs(0)))]
    fn resolve_tune_record(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        tune: Py<PyAny>,
        wait_ms: WholeMs,
        can_tune: bool,
        lease_ms: WholeMs,
    ) -> PyResult<tuning::RankOutcome> {
        let (key, options) = args::resolve_request(key, wait_ms, can_tune, lease_ms)?;
        tuning::resolve_tune_record(py, self.context(py)?, key, options, tune)
    }

    // --- the split lease, for callers with a tuning loop of their own (the drop-ins' base) ----

    /// Resolves key in the client's view, as the Rust client's `begin_tune`: a TuneStart whose
    /// `kind` is "hit" (`result`), "tune" (`lease`: tune now, then end the lease with
    /// finish_tune or abandon) or "miss" (`reason`). The deadline is wait_ms plus the timeout.
    /// Raises RpcError when the daemon cannot be asked.
    #[pyo3(signature = (key, wait_ms=WholeMs(DEFAULT_WAIT_MS), can_tune=true, lease_ms=WholeMs(0), timeout=None))]
    fn begin_tune(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        wait_ms: WholeMs,
        can_tune: bool,
        lease_ms: WholeMs,
        timeout: Option<f64>,
    ) -> PyResult<TuneStart> {
        let (key, options) = args::resolve_request(key, wait_ms, can_tune, lease_ms)?;
        let start = self.call(py, timeout, move |client| async move {
            client.begin_tune(key, options).await
        })?;
        TuneStart::from_rust(py, start)
    }

    /// Records `result` (a Result, or a mapping of its fields) under `lease` (from begin_tune),
    /// which ends it. Answers a TuneFinish: `error` None when Recorded; else the RpcError,
    /// `refused` (the daemon refused the result itself) and `lease` ("given_up", "kept" after a
    /// deadline, when the Record may still land, or "give_up_failed"): the Rust client's rule,
    /// the same for every caller. Raises RpcError only when the daemon cannot be reached at
    /// all, ValueError for a lease ended already. `also`: more entries (Entry objects or
    /// mappings) Recorded in the same Record, under the same lease (a lease that stands for
    /// several keys).
    #[pyo3(signature = (lease, result, timeout=None, also=None))]
    fn finish_tune(
        &self,
        py: Python<'_>,
        lease: &Bound<'_, TuneLease>,
        result: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        also: Option<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<TuneFinish> {
        let result = TunedResult::extract_any(result)?;
        let also = also
            .unwrap_or_default()
            .iter()
            .map(|entry| crate::entry::Entry::extract_any(entry))
            .collect::<PyResult<Vec<_>>>()?;
        let held = lease_to_finish(lease.get())?;
        let finished = self.call(py, timeout, |client| async move {
            Ok::<_, ClientError>(client.finish_tune_with(held, result, also).await)
        })?;
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
        self.call(
            py,
            timeout,
            |client| async move { client.abandon(held).await },
        )?;
        Ok(true)
    }

    // --- artifacts: the files beside a result (a compiled kernel, a module) -------------------

    /// Uploads the file at `path` to the node's artifact store (hashed, then streamed in 1 MiB
    /// chunks; never read whole into memory). Answers `sha256`, `size` and `already_held`; a
    /// Result names it with `Artifact(name=..., sha256=..., size=...)` (or use put_artifacts).
    /// The daemon collects a blob no entry names after its grace period, so Record the result
    /// naming it soon after.
    #[pyo3(signature = (path, timeout=None))]
    fn put_artifact(
        &self,
        py: Python<'_>,
        path: PathBuf,
        timeout: Option<f64>,
    ) -> PyResult<Message> {
        let stored = self.call(py, timeout, |client| async move {
            client.put_artifact(path).await
        })?;
        let fields = PyDict::new(py);
        fields.set_item("sha256", stored.sha256)?;
        fields.set_item("size", stored.size)?;
        fields.set_item("already_held", stored.already_held)?;
        Ok(Message::new("StoredArtifact", fields))
    }

    /// Uploads each file of `files` ({name: path}, or (name, path) pairs) and answers the list
    /// of Artifact naming them, for `Result(artifacts=...)`. Names are 1-128 bytes of
    /// [A-Za-z0-9._-], not "." or "..", unique, at most 64 (checked before anything is
    /// uploaded: ArtifactError).
    #[pyo3(signature = (files, timeout=None))]
    fn put_artifacts(
        &self,
        py: Python<'_>,
        files: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyList>> {
        let files = args::named_paths(files)?;
        let artifacts = self.call(py, timeout, |client| async move {
            client.put_artifacts(files).await
        })?;
        Artifact::list_to_py(py, &artifacts)
    }

    /// Writes each file `entry` (an Entry, or its Result, or their mappings) names into the
    /// existing directory `dir` as `dir/<name>`, each verified against its digest as it is
    /// written to a temporary file, then renamed; answers the paths written (str). On the
    /// daemon's node a held blob is copied from the descriptor the daemon hands over. Raises
    /// ArtifactError for a name or digest refused or bytes that are not the blob named (its
    /// temporary file is deleted), RpcError when the daemon cannot serve a blob (NOT_FOUND),
    /// OSError for the directory.
    #[pyo3(signature = (entry, dir, timeout=None))]
    fn fetch_artifacts(
        &self,
        py: Python<'_>,
        entry: &Bound<'_, PyAny>,
        dir: PathBuf,
        timeout: Option<f64>,
    ) -> PyResult<Vec<OsString>> {
        let artifacts = args::artifacts_of(entry)?;
        let written = self.call(py, timeout, |client| async move {
            client.fetch_artifact_list(&artifacts, dir).await
        })?;
        Ok(written.into_iter().map(PathBuf::into_os_string).collect())
    }

    /// Which of `digests` (lowercase hex SHA-256) this node cannot serve (StatArtifacts).
    #[pyo3(signature = (digests, timeout=None))]
    fn stat_artifacts(
        &self,
        py: Python<'_>,
        digests: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<String>> {
        let digests = args::strings(digests)?;
        self.call(py, timeout, |client| async move {
            client.stat_artifacts(digests).await
        })
    }

    /// Records `entries` keeping every valid one (the Rust client's rule: an entry the daemon
    /// refuses is set aside and the rest sent again, a batch over its message size is halved).
    /// Answers a KeptRecord: `stored`, `unchanged` and `refused`, a list of `(index, entry,
    /// RpcError)`; raises RpcError only for a failure that is not the entries' (the daemon
    /// away).
    #[pyo3(signature = (entries, timeout=None))]
    fn record_keeping_valid(
        &self,
        py: Python<'_>,
        entries: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<KeptRecord> {
        let entries = args::entries(entries)?;
        let kept = self.call(py, timeout, |client| async move {
            client.record_keeping_valid(entries).await
        })?;
        KeptRecord::from_rust(py, kept)
    }
}
