//! Owns starting and stopping a real `tunecached` process for the benchmarks: where the
//! workspace binaries are, the daemon's command line (socket and state on local disk, an
//! optional shared directory), waiting until it answers, and reading its memory from
//! `/proc/<pid>/status` (and resetting its peak).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tunecache_client::Client;

/// Longest a daemon may take to answer after it was spawned (replaying a big journal or
/// loading a 1M-entry snapshot happens before it serves).
pub const READY_LIMIT: Duration = Duration::from_secs(120);
/// How long a daemon gets to exit after SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tunecached exited early ({status}); log {log}")]
    ExitedEarly { status: String, log: PathBuf },
    #[error("tunecached did not answer within {0:?}")]
    NotReady(Duration),
    #[error("no {field} in /proc/{pid}/status")]
    NoMemoryField { pid: u32, field: &'static str },
    #[error("tunecached is not running")]
    NotRunning,
}

/// Where workspace binary `name` is: `$TUNECACHE_BIN_DIR/<name>`, else beside the running
/// executable, else one directory up (test binaries live in `target/<profile>/deps`).
pub fn workspace_binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("TUNECACHE_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let beside = exe_dir.join(name);
    if beside.exists() {
        return beside;
    }
    exe_dir
        .parent()
        .map(|up| up.join(name))
        .filter(|up| up.exists())
        .unwrap_or(beside)
}

/// Removes every `TUNECACHE_*` variable of the caller's environment from `command`: the daemon
/// and the CLI read their flags from it too.
pub fn without_tunecache_env(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TUNECACHE_") {
            command.env_remove(&name);
        }
    }
}

/// How to start one daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub binary: PathBuf,
    /// Local directory holding the socket, the state directory and the log.
    pub work_dir: PathBuf,
    pub node_name: String,
    pub shared_dir: Option<PathBuf>,
    pub snapshot_interval_s: u64,
    /// Further flags (e.g. the cluster tier's).
    pub extra_args: Vec<String>,
}

/// Memory of a process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: peak resident.
    pub hwm_kib: u64,
}

/// A running `tunecached`; killed if still running when dropped.
#[derive(Debug)]
pub struct DaemonProcess {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log_path: PathBuf,
    pub spawned_at: Instant,
}

impl DaemonProcess {
    /// Spawns the daemon; call [`DaemonProcess::wait_ready`] before using it.
    pub fn spawn(config: &DaemonConfig) -> Result<Self, DaemonError> {
        std::fs::create_dir_all(&config.work_dir).map_err(|source| DaemonError::Io {
            path: config.work_dir.clone(),
            source,
        })?;
        let socket = config.work_dir.join("tunecache.sock");
        let log_path = config.work_dir.join("tunecached.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| DaemonError::Io {
                path: log_path.clone(),
                source,
            })?;
        let log_for_stdout = log.try_clone().map_err(|source| DaemonError::Io {
            path: log_path.clone(),
            source,
        })?;
        let mut command = Command::new(&config.binary);
        command
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(config.work_dir.join("state"))
            .arg("--node-name")
            .arg(&config.node_name)
            .arg("--tuner")
            .arg("off")
            .arg("--snapshot-interval")
            .arg(config.snapshot_interval_s.to_string());
        if let Some(shared_dir) = &config.shared_dir {
            command.arg("--shared-dir").arg(shared_dir);
        }
        command.args(&config.extra_args);
        // The daemon reads every flag from the environment too; keep the caller's out.
        without_tunecache_env(&mut command);
        let child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log_for_stdout)
            .stderr(log)
            .spawn()
            .map_err(|source| DaemonError::Spawn {
                binary: config.binary.clone(),
                source,
            })?;
        Ok(Self {
            child: Some(child),
            socket,
            log_path,
            spawned_at: Instant::now(),
        })
    }

    /// Waits until the daemon answers Stats; returns a connected client.
    pub async fn wait_ready(&mut self) -> Result<Client, DaemonError> {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            let child = self.child.as_mut().ok_or(DaemonError::NotRunning)?;
            if let Ok(Some(status)) = child.try_wait() {
                return Err(DaemonError::ExitedEarly {
                    status: status.to_string(),
                    log: self.log_path.clone(),
                });
            }
            if let Ok(client) = Client::connect(&self.socket).await {
                if client.stats().await.is_ok() {
                    return Ok(client.with_timeout(Duration::from_secs(60)));
                }
            }
            if Instant::now() > deadline {
                return Err(DaemonError::NotReady(READY_LIMIT));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn pid(&self) -> Result<u32, DaemonError> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or(DaemonError::NotRunning)
    }

    /// The daemon's resident and peak resident memory now.
    pub fn memory(&self) -> Result<ProcessMemory, DaemonError> {
        process_memory(self.pid()?)
    }

    /// SIGKILL: no chance to flush; the state directory stays for the next spawn.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within a few seconds.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// VmRSS and VmHWM of process `pid`.
pub fn process_memory(pid: u32) -> Result<ProcessMemory, DaemonError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path).map_err(|source| DaemonError::Io {
        path: path.clone(),
        source,
    })?;
    let field = |name: &'static str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .ok_or(DaemonError::NoMemoryField { pid, field: name })
    };
    Ok(ProcessMemory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// Resets the peak resident memory (VmHWM) of process `pid` to its resident memory now
/// (`/proc/<pid>/clear_refs`, 5), so that a later [`process_memory`] gives the peak since.
pub fn reset_peak_memory(pid: u32) -> Result<(), DaemonError> {
    let path = PathBuf::from(format!("/proc/{pid}/clear_refs"));
    std::fs::write(&path, "5").map_err(|source| DaemonError::Io { path, source })
}
