//! A daemon owned by a test, of either kind behind one API: the `tunecached` binary as a
//! process ([`DaemonOptions::process`]), or `tunecache_server::server::run` inside the test
//! process ([`DaemonOptions::in_process`]). Both are built from the same flags, on a socket and
//! state directory in the test's directory, answer on the same socket path, and are waited on
//! until they serve; a test switches kinds by changing one call.
//!
//! A test needs the process when it crosses the process boundary: signals to the daemon
//! (SIGKILL, SIGSTOP, SIGTERM), its exit status or stderr, its log lines, its fd limit or
//! memory, its children, or running it as another uid. Those methods ([`TestDaemon::kill`],
//! [`TestDaemon::log`], [`TestDaemon::pid`]...) panic on an in-process daemon, saying so.

mod in_process;
mod process;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Parser;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tunecache_client::{proto, Client};

use crate::{wait, Faketime, Lazy};

use in_process::InProcessDaemon;
use process::ProcessDaemon;

/// How long a daemon may take to start serving.
const START_LIMIT: Duration = Duration::from_secs(20);
/// How long a wait on a fact in Stats ([`TestDaemon::wait_for_stats`]) may take: generous, for
/// a loaded 2-core machine; a fact that never comes fails the test at this deadline.
pub const FACT_LIMIT: Duration = Duration::from_secs(60);

/// Which kind of daemon a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The `tunecached` binary, a child process of the test.
    Process,
    /// `server::run` on a runtime and thread of its own inside the test process.
    InProcess,
}

/// Options for starting a daemon. `dir` holds the socket, the state and (for a process) the
/// log. Finish with [`DaemonOptions::process`] or [`DaemonOptions::in_process`].
pub struct DaemonOptions {
    pub dir: PathBuf,
    pub args: Vec<String>,
    pub state_dir: Option<PathBuf>,
    /// RLIMIT_NOFILE (soft, hard) a daemon process starts with, set in the child only (the
    /// test process's own limit stays as it is); `None` inherits this process's. Process only.
    pub nofile: Option<(u64, u64)>,
    /// The daemon process's wall clock off by this (libfaketime): what it records is dated
    /// then. Process only.
    pub faketime: Option<Faketime>,
}

impl DaemonOptions {
    pub fn new(dir: &Path) -> Self {
        DaemonOptions {
            dir: dir.to_path_buf(),
            args: Vec::new(),
            state_dir: None,
            nofile: None,
            faketime: None,
        }
    }

    /// Starts the daemon process with its wall clock off by `faketime` (see
    /// [`DaemonOptions::faketime`]).
    pub fn faketime(mut self, faketime: Faketime) -> Self {
        self.faketime = Some(faketime);
        self
    }

    /// Starts the daemon process with RLIMIT_NOFILE `soft`:`hard` (see
    /// [`DaemonOptions::nofile`]).
    pub fn nofile(mut self, soft: u64, hard: u64) -> Self {
        self.nofile = Some((soft, hard));
        self
    }

    /// The state directory, instead of `dir/state`.
    pub fn state_dir(mut self, state_dir: &Path) -> Self {
        self.state_dir = Some(state_dir.to_path_buf());
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the `tunecached` binary and waits until it serves.
    pub async fn process(self) -> TestDaemon {
        self.start(Kind::Process).await
    }

    /// Starts `server::run` inside this process and waits until it serves.
    pub async fn in_process(self) -> TestDaemon {
        self.start(Kind::InProcess).await
    }

    /// Starts a daemon of `kind` and waits until it serves.
    pub async fn start(self, kind: Kind) -> TestDaemon {
        let socket = self.dir.join("tunecache.sock");
        let state_dir = self
            .state_dir
            .clone()
            .unwrap_or_else(|| self.dir.join("state"));
        let runner = match kind {
            Kind::Process => Runner::Process(ProcessDaemon::spawn(
                socket.clone(),
                state_dir.clone(),
                self.dir.join("daemon.log"),
                self.args,
                self.nofile,
                self.faketime,
            )),
            Kind::InProcess => {
                assert!(
                    self.nofile.is_none(),
                    "an fd limit of its own needs a daemon process: start it with .process()"
                );
                assert!(
                    self.faketime.is_none(),
                    "a clock of its own needs a daemon process: start it with .process()"
                );
                let config = config_from_flags(&socket, &state_dir, &self.args);
                Runner::InProcess(Box::new(InProcessDaemon::start(config)))
            }
        };
        let mut daemon = TestDaemon {
            socket,
            state_dir,
            runner,
        };
        daemon.wait_serving().await;
        daemon
    }
}

/// The `Config` `tunecached` would parse from these flags (and the environment's `TUNECACHE_*`
/// twins, as the binary reads them). The tuner worker is the workspace's `tunecache-tuner`
/// unless `--tuner` is given: the binary's default (next to itself) is next to the test here.
fn config_from_flags(socket: &Path, state_dir: &Path, args: &[String]) -> tunecache_server::Config {
    let mut argv: Vec<std::ffi::OsString> = vec![
        "tunecached".into(),
        "--socket".into(),
        socket.into(),
        "--state-dir".into(),
        state_dir.into(),
    ];
    argv.extend(args.iter().map(Into::into));
    let names_tuner = args
        .iter()
        .any(|arg| arg == "--tuner" || arg.starts_with("--tuner="));
    if !names_tuner {
        argv.push("--tuner".into());
        argv.push(crate::bin_dir().join("tunecache-tuner").into());
    }
    tunecache_server::Config::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("tunecached flags {argv:?}: {e}"))
}

/// The tracing subscriber of in-process daemons: `RUST_LOG` (default info) into the test's
/// captured output, shown when a test fails. Installed once per test process.
pub(crate) fn init_test_tracing() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

enum Runner {
    Process(ProcessDaemon),
    InProcess(Box<InProcessDaemon>),
}

/// A running daemon owned by a test. A process still running when dropped is SIGKILLed; an
/// in-process one is stopped through its shutdown future.
pub struct TestDaemon {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    runner: Runner,
}

impl TestDaemon {
    /// Options for a daemon in `dir`.
    pub fn builder(dir: &Path) -> DaemonOptions {
        DaemonOptions::new(dir)
    }

    /// A daemon process in `dir` with default flags.
    pub async fn process(dir: &Path) -> TestDaemon {
        DaemonOptions::new(dir).process().await
    }

    /// An in-process daemon in `dir` with default flags.
    pub async fn in_process(dir: &Path) -> TestDaemon {
        DaemonOptions::new(dir).in_process().await
    }

    pub fn kind(&self) -> Kind {
        match self.runner {
            Runner::Process(_) => Kind::Process,
            Runner::InProcess(_) => Kind::InProcess,
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.socket)
            .await
            .expect("connect to daemon")
    }

    pub async fn stats(&self) -> proto::StatsResponse {
        let stats = self.client().await.stats().await;
        stats.unwrap_or_else(|e| panic!("Stats: {e} (daemon gone?); {}", self.diagnostics()))
    }

    /// Polls Stats (every 20 ms) until `done` holds, and returns those Stats; fails naming
    /// `what` and the last Stats after [`FACT_LIMIT`].
    pub async fn wait_for_stats(
        &self,
        what: &str,
        done: impl Fn(&proto::StatsResponse) -> bool,
    ) -> proto::StatsResponse {
        let client = &self.client().await;
        let last = &std::sync::Mutex::new(None);
        let done = &done;
        let what = Lazy(|| {
            format!(
                "{}: {what}; last Stats: {:?}; {}",
                self.socket.display(),
                last.lock().unwrap(),
                self.diagnostics()
            )
        });
        wait(FACT_LIMIT, what)
            .until_some_async(move || async move {
                let stats = client.stats().await.unwrap_or_else(|e| {
                    panic!("Stats: {e} (daemon gone?); {}", self.diagnostics())
                });
                if done(&stats) {
                    return Some(stats);
                }
                *last.lock().unwrap() = Some(stats);
                None
            })
            .await
    }

    /// Waits until the daemon has finished `more` shared-directory passes (load, then publish;
    /// failed ones too) beyond those finished now: every file in the directory now has been
    /// met at least `more - 1` times since.
    pub async fn wait_for_snapshot_passes(&self, more: u64) -> proto::StatsResponse {
        let before = self.stats().await.snapshot_passes;
        self.wait_for_stats(&format!("{more} more snapshot passes"), |s| {
            s.snapshot_passes >= before + more
        })
        .await
    }

    async fn wait_serving(&mut self) {
        // The daemon this test started must answer, not another one on the path.
        let expected = match &self.runner {
            Runner::Process(daemon) => daemon.pid().as_raw() as u32,
            Runner::InProcess(_) => std::process::id(),
        };
        let socket = &self.socket;
        let runner = &mut self.runner;
        let answered = wait(START_LIMIT, "the daemon serving")
            .try_until_some_async(|| {
                match &mut *runner {
                    Runner::Process(daemon) => {
                        if let Some(status) = daemon.exited() {
                            panic!(
                                "tunecached exited early with {status}; log:\n{}",
                                daemon.log()
                            );
                        }
                    }
                    Runner::InProcess(daemon) => {
                        if let Some(error) = daemon.exited() {
                            panic!("the in-process daemon stopped before serving: {error}");
                        }
                    }
                }
                async move {
                    let client = Client::connect(socket).await.ok()?;
                    Some(client.stats().await.ok()?.daemon_pid)
                }
            })
            .await;
        let Some(pid) = answered else {
            panic!(
                "the daemon did not serve within {START_LIMIT:?}; {}",
                self.diagnostics()
            );
        };
        assert_eq!(
            pid,
            expected,
            "another daemon answers on {}",
            socket.display()
        );
    }

    /// A clean stop, as at the end of a job: SIGTERM to a process (it must exit 0), the
    /// shutdown future of an in-process daemon (`run` must return Ok, and its runtime be shut
    /// down). Returns how long it took.
    pub async fn stop(&mut self) -> Duration {
        let started = Instant::now();
        match &mut self.runner {
            Runner::Process(daemon) => {
                daemon.signal(Signal::SIGTERM);
                let status = daemon.wait_exit(Duration::from_secs(30));
                assert!(
                    status.success(),
                    "SIGTERM exit: {status}; log:\n{}",
                    daemon.log()
                );
            }
            Runner::InProcess(daemon) => {
                if let Err(error) = daemon.stop() {
                    panic!("the in-process daemon did not stop cleanly: {error}");
                }
            }
        }
        started.elapsed()
    }

    /// Starts the daemon again with the same socket, state dir and flags (it must have
    /// stopped) and waits until it serves.
    pub async fn restart(&mut self) {
        match &mut self.runner {
            Runner::Process(daemon) => daemon.start(),
            Runner::InProcess(daemon) => {
                assert!(!daemon.is_running(), "stop the daemon before restarting it");
                daemon.restart();
            }
        }
        self.wait_serving().await;
    }

    /// For a failure message: the log of a process, or where an in-process daemon's log went.
    pub fn diagnostics(&self) -> String {
        match &self.runner {
            Runner::Process(daemon) => format!("log:\n{}", daemon.log()),
            Runner::InProcess(_) => {
                "in-process daemon: its log is in this test's captured output".to_owned()
            }
        }
    }

    // --- Only a process has these. ---

    fn process_only(&self, what: &str) -> &ProcessDaemon {
        match &self.runner {
            Runner::Process(daemon) => daemon,
            Runner::InProcess(_) => panic!(
                "{what} needs a daemon process: start this test's daemon with .process() \
                 (an in-process daemon shares the test's pid, signals and log)"
            ),
        }
    }

    fn process_only_mut(&mut self, what: &str) -> &mut ProcessDaemon {
        match &mut self.runner {
            Runner::Process(daemon) => daemon,
            Runner::InProcess(_) => panic!(
                "{what} needs a daemon process: start this test's daemon with .process() \
                 (an in-process daemon shares the test's pid, signals and log)"
            ),
        }
    }

    /// The command line this daemon process runs with (socket and state dir included).
    pub fn command(&self) -> Command {
        self.process_only("TestDaemon::command").command()
    }

    pub fn pid(&self) -> Pid {
        self.process_only("TestDaemon::pid").pid()
    }

    /// Everything the daemon process logged so far (all its runs in this directory).
    pub fn log(&self) -> String {
        self.process_only("TestDaemon::log").log()
    }

    /// The file the daemon process logs to.
    pub fn log_path(&self) -> PathBuf {
        self.process_only("TestDaemon::log_path").log_path.clone()
    }

    /// The daemon's resident memory (VmRSS from /proc/<pid>/status), in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.status_kib("VmRSS:") * 1024
    }

    /// The daemon's peak resident memory since it started (VmHWM from /proc/<pid>/status), in
    /// bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.status_kib("VmHWM:") * 1024
    }

    fn status_kib(&self, field: &str) -> u64 {
        let pid = self.process_only("the daemon's memory").pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("the daemon is still running");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|number| number.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// Sends SIGTERM and waits for the exit (at most `limit`); returns status and time taken.
    pub fn terminate(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let daemon = self.process_only_mut("SIGTERM");
        let started = Instant::now();
        daemon.signal(Signal::SIGTERM);
        let status = daemon.wait_exit(limit);
        (status, started.elapsed())
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill(&mut self) {
        let daemon = self.process_only_mut("SIGKILL");
        daemon.signal(Signal::SIGKILL);
        daemon.wait_exit(Duration::from_secs(10));
    }

    /// Waits (at most `limit`) for the daemon process to exit on its own, e.g. on
    /// --exit-when-idle.
    pub fn wait_for_exit(&mut self, limit: Duration) -> ExitStatus {
        self.process_only_mut("an exit status").wait_exit(limit)
    }
}
