//! The `tunecached` binary as a child process of the test: started with the test's flags on
//! its socket and state directory, its stdout and stderr in a log file, stopped with real
//! signals (SIGTERM, SIGKILL) and killed if still running when dropped.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{bin, Faketime};

/// A `tunecached` process; the socket and state directory are the [`super::TestDaemon`]'s.
pub(super) struct ProcessDaemon {
    child: Option<Child>,
    socket: PathBuf,
    state_dir: PathBuf,
    pub(super) log_path: PathBuf,
    args: Vec<String>,
    nofile: Option<(u64, u64)>,
    faketime: Option<Faketime>,
}

impl ProcessDaemon {
    /// Spawns the daemon (it is not serving yet: see [`super::TestDaemon`]'s wait).
    pub(super) fn spawn(
        socket: PathBuf,
        state_dir: PathBuf,
        log_path: PathBuf,
        args: Vec<String>,
        nofile: Option<(u64, u64)>,
        faketime: Option<Faketime>,
    ) -> ProcessDaemon {
        let mut daemon = ProcessDaemon {
            child: None,
            socket,
            state_dir,
            log_path,
            args,
            nofile,
            faketime,
        };
        daemon.start();
        daemon
    }

    /// The command line this daemon runs with (socket and state dir included).
    pub(super) fn command(&self) -> Command {
        let mut command = Command::new(bin("tunecached"));
        command
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(&self.args)
            .env_remove("TUNECACHE_SOCKET")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        if let Some(faketime) = &self.faketime {
            faketime.apply(&mut command);
        }
        if let Some((soft, hard)) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: between fork and exec only setrlimit (async-signal-safe) runs, on the
            // child's own limit.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        command
    }

    /// Starts the process again with the same flags (it must have exited).
    pub(super) fn start(&mut self) {
        assert!(self.child.is_none(), "stop the daemon before restarting it");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("daemon log file");
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn tunecached");
        self.child = Some(child);
    }

    /// Why the daemon is no longer running, if it exited.
    pub(super) fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    pub(super) fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("daemon running").id() as i32)
    }

    /// Everything the daemon logged so far (all its runs in this directory).
    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub(super) fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("send {signal} to tunecached: {e}"));
    }

    /// Waits for the exit (at most `limit`; killed and a panic after that).
    pub(super) fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("daemon running");
        let exited = crate::wait(limit, "tunecached exiting")
            .every(Duration::from_millis(10))
            .try_blocking_some(|| child.try_wait().expect("wait for daemon"));
        let Some(status) = exited else {
            let _ = child.kill();
            panic!(
                "tunecached did not exit within {limit:?}; log:\n{}",
                self.log()
            );
        };
        self.child = None;
        status
    }
}

impl Drop for ProcessDaemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
