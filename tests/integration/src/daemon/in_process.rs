//! `tunecache_server::server::run` inside the test process, like mini-redis's
//! `start_server`: the same `Config` the binary parses from the same flags, bound with
//! `server::bind` on the test's socket, and stopped through `run`'s shutdown future.
//!
//! The daemon gets a runtime of its own on a thread of its own, built as `tunecached`'s main
//! builds it (`--runtime`), so nothing the test does on its runtime (a blocking CLI call, a
//! current-thread runtime, a paused clock) can starve or stop the daemon, and a stop is
//! complete only when that runtime has shut down: every task and blocking thread of the daemon
//! has ended, not only `run`'s future.
//!
//! What an in-process daemon shares with the test process: its tracing subscriber (the
//! daemon's log goes to the test's captured output; a test that asserts a log line starts a
//! process), its pid, uid and fd limit (`run` raises the soft RLIMIT_NOFILE to the hard one)
//! and its environment (`TUNECACHE_*` variables are flags, as for the binary).

use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::oneshot;
use tunecache_server::config::{Config, RuntimeFlavor};

/// How long a stop may take: `run` drains calls for at most 7 s and gives its tasks 2 s, and
/// the last publish at shutdown at most 3 s more.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// A daemon thread serving until it is told to stop.
pub(super) struct InProcessDaemon {
    config: Config,
    running: Option<Running>,
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    /// `run`'s outcome, sent once the daemon's runtime has shut down.
    outcome: mpsc::Receiver<Result<(), String>>,
    thread: std::thread::JoinHandle<()>,
}

impl InProcessDaemon {
    pub(super) fn start(config: Config) -> InProcessDaemon {
        crate::daemon::init_test_tracing();
        let mut daemon = InProcessDaemon {
            config,
            running: None,
        };
        daemon.restart();
        daemon
    }

    /// Runs the daemon again with the same `Config` (it must have stopped).
    pub(super) fn restart(&mut self) {
        assert!(
            self.running.is_none(),
            "stop the daemon before restarting it"
        );
        let config = self.config.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let (done, outcome) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tunecached-in-test".into())
            .spawn(move || {
                let result = serve(config, stopped);
                let _ = done.send(result);
            })
            .expect("spawn the in-process daemon's thread");
        self.running = Some(Running {
            stop: Some(stop),
            outcome,
            thread,
        });
    }

    /// `run`'s error if the daemon stopped on its own (before it was told to).
    pub(super) fn exited(&mut self) -> Option<String> {
        let running = self.running.as_mut()?;
        let outcome = match running.outcome.try_recv() {
            Ok(outcome) => outcome,
            Err(mpsc::TryRecvError::Empty) => return None,
            Err(mpsc::TryRecvError::Disconnected) => Err(panic_message(self.running.take())),
        };
        self.running = None;
        Some(match outcome {
            Ok(()) => "server::run returned Ok before it was told to stop".to_owned(),
            Err(error) => error,
        })
    }

    /// Resolves `run`'s shutdown future and waits until the daemon's runtime has shut down;
    /// `run`'s outcome.
    pub(super) fn stop(&mut self) -> Result<(), String> {
        let mut running = self.running.take().expect("the daemon is running");
        if let Some(stop) = running.stop.take() {
            let _ = stop.send(());
        }
        match running.outcome.recv_timeout(STOP_LIMIT) {
            Ok(outcome) => {
                let _ = running.thread.join();
                outcome
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(panic_message(Some(running))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("the daemon did not stop within {STOP_LIMIT:?}"))
            }
        }
    }

    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        if self.running.is_some() {
            // A clean stop, as at the end of a job; an error here is the test's to report.
            if let Err(error) = self.stop() {
                eprintln!("the in-process daemon did not stop cleanly: {error}");
            }
        }
    }
}

/// The daemon thread: `tunecached`'s runtime, `bind`, then `run` until `stopped` resolves.
fn serve(config: Config, stopped: oneshot::Receiver<()>) -> Result<(), String> {
    let mut builder = match config.runtime {
        RuntimeFlavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        RuntimeFlavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = builder
        .enable_all()
        .thread_name("tunecached")
        .build()
        .map_err(|e| format!("building the daemon's runtime: {e}"))?;
    let outcome = runtime.block_on(async move {
        let socket = tunecache_server::server::bind(&config)?;
        tunecache_server::server::run(config, socket, async move {
            let _ = stopped.await;
        })
        .await
    });
    // Waits for the daemon's blocking tasks too: after this nothing of it runs.
    drop(runtime);
    outcome.map_err(|e| e.to_string())
}

/// What the daemon thread panicked with (it dropped its outcome sender unsent).
fn panic_message(running: Option<Running>) -> String {
    let Some(running) = running else {
        return "the daemon thread is gone".to_owned();
    };
    match running.thread.join() {
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a non-string panic".to_owned());
            format!("the daemon thread panicked: {text}")
        }
        Ok(()) => "the daemon thread ended without an outcome".to_owned(),
    }
}
