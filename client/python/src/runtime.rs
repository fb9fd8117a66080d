//! The one background thread of a process, and how a Python call waits for it.
//!
//! Every daemon call runs as a task on one current-thread tokio runtime, on one thread the
//! first call starts (importing the package starts nothing). The calling thread waits for the
//! task's answer with the GIL released, so other Python threads run meanwhile, and wakes every
//! [`SIGNAL_CHECK_INTERVAL`] to run the interpreter's signal handlers: a Ctrl-C raises
//! `KeyboardInterrupt` at once and aborts the task, which drops its request, so the daemon
//! sees the caller leave (its stream is reset) instead of answering nobody.
//!
//! Fork: a forked child has a copy of this state but not the thread that ran it. The state
//! records the pid that made it; a child sees another pid, leaks the parent's runtime handle
//! untouched (dropping or using it could take a lock that the parent's thread held at the fork)
//! and starts its own thread on its first call. The state's mutex is only taken with the GIL
//! held and never held across a GIL release, and `os.fork()` runs with the GIL, so no other
//! thread can hold it at a fork.

use std::future::Future;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Handle;

/// How often a waiting call runs Python's signal handlers: Ctrl-C interrupts within this
/// (the target is 100 ms).
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

struct ProcessRuntime {
    pid: u32,
    handle: Handle,
}

static RUNTIME: Mutex<Option<ProcessRuntime>> = Mutex::new(None);

/// This process's runtime, started on first use (and again in a forked child).
fn handle(_py: Python<'_>) -> PyResult<Handle> {
    // The GIL token is the proof that no other thread can hold the lock at a fork.
    let mut slot = RUNTIME
        .lock()
        .map_err(|_| PyRuntimeError::new_err("tunecache: the runtime state is poisoned"))?;
    let pid = std::process::id();
    if let Some(runtime) = slot.as_ref() {
        if runtime.pid == pid {
            return Ok(runtime.handle.clone());
        }
    }
    if let Some(inherited) = slot.take() {
        // The parent's: its thread does not exist here. Never touch it.
        std::mem::forget(inherited);
    }
    let handle = start_thread()?;
    *slot = Some(ProcessRuntime {
        pid,
        handle: handle.clone(),
    });
    Ok(handle)
}

fn start_thread() -> PyResult<Handle> {
    let (started, handle) = mpsc::channel();
    std::thread::Builder::new()
        .name("tunecache".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => {
                    let _ = started.send(Ok(runtime.handle().clone()));
                    // Runs the process's tasks until it exits.
                    runtime.block_on(std::future::pending::<()>());
                }
                Err(error) => {
                    let _ = started.send(Err(error));
                }
            }
        })
        .map_err(|error| {
            PyRuntimeError::new_err(format!("tunecache: cannot start its thread: {error}"))
        })?;
    match handle.recv() {
        Ok(Ok(handle)) => Ok(handle),
        Ok(Err(error)) => Err(PyRuntimeError::new_err(format!(
            "tunecache: cannot start its runtime: {error}"
        ))),
        Err(_) => Err(PyRuntimeError::new_err(
            "tunecache: its thread ended before it started",
        )),
    }
}

/// What a task sends the thread that waits for it.
pub enum Event<T, R> {
    /// The task's answer.
    Done(T),
    /// Work only the calling thread may do (a Python callback), mid-task.
    Request(R),
}

/// Sends a task's requests to the waiting thread.
pub type Requests<T, R> = mpsc::Sender<Event<T, R>>;

/// Runs `task` on the process runtime and waits for its answer (see the module doc).
pub fn run<T, F>(py: Python<'_>, task: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    run_serving(
        py,
        |_requests: Requests<T, std::convert::Infallible>| task,
        |_, never| match never {},
    )
}

/// Runs the task that `build` makes on the process runtime; while waiting, answers each of its
/// requests on this thread, with the GIL, through `serve`. An error from `serve` or a signal
/// handler (KeyboardInterrupt) aborts the task and is raised.
pub fn run_serving<T, R, B, F, S>(py: Python<'_>, build: B, mut serve: S) -> PyResult<T>
where
    T: Send + 'static,
    R: Send + 'static,
    B: FnOnce(Requests<T, R>) -> F,
    F: Future<Output = T> + Send + 'static,
    S: FnMut(Python<'_>, R) -> PyResult<()>,
{
    let runtime = handle(py)?;
    let (events, received) = mpsc::channel();
    let task = build(events.clone());
    let task = runtime.spawn(async move {
        let answer = task.await;
        let _ = events.send(Event::Done(answer));
    });
    let mut received = received;
    loop {
        // The receiver moves into the GIL-free closure and back (a borrowed one is not Send).
        let (event, receiver) = py.detach(move || {
            let event = received.recv_timeout(SIGNAL_CHECK_INTERVAL);
            (event, received)
        });
        received = receiver;
        match event {
            Ok(Event::Done(answer)) => {
                // What the Rust client logged meanwhile, written here, with the GIL.
                crate::logs::forward(py);
                return Ok(answer);
            }
            Ok(Event::Request(request)) => {
                if let Err(error) = serve(py, request) {
                    task.abort();
                    return Err(error);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(interrupted) = py.check_signals() {
                    task.abort();
                    return Err(interrupted);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "tunecache: a call ended without an answer (its task was dropped)",
                ))
            }
        }
    }
}
