//! Owns profiling a daemon while a benchmark measures it (issue 54's "profile first"): `perf
//! record` attached to the daemon's pid for one phase, sampling the CPU clock (the VMs the
//! benchmarks run on expose no hardware counters) with DWARF call graphs (the release build
//! keeps line tables, and Rust's std has no frame pointers), one file per phase, stopped with
//! SIGINT so that perf writes its file whole. Read a file with `perf report -i FILE
//! --no-children --sort symbol --stdio`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

/// Samples per second per CPU.
const FREQUENCY: &str = "499";
/// How long perf takes to attach: a phase that must be profiled from its start waits this long
/// after [`record_if`].
pub const ATTACH: Duration = Duration::from_millis(500);

/// A `perf record` running against one process.
pub struct PerfRecording {
    child: Child,
}

impl PerfRecording {
    /// Starts recording process `pid` into `path` (perf's own output beside it, `.log`).
    pub fn start(pid: u32, path: &Path) -> Result<Self> {
        let log = std::fs::File::create(path.with_extension("log"))
            .with_context(|| format!("creating {}", path.with_extension("log").display()))?;
        let child = Command::new("perf")
            .args(["record", "-e", "cpu-clock", "-F", FREQUENCY])
            .args(["--call-graph", "dwarf,8192", "-p", &pid.to_string(), "-o"])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting perf record (apt-get install linux-perf)")?;
        Ok(Self { child })
    }

    /// SIGINT, then waits for perf to write its file.
    pub fn stop(mut self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT)?;
        self.child.wait().context("waiting for perf")?;
        Ok(())
    }
}

/// Starts a recording when `dir` is given: `<dir>/<name>.perf.data`.
pub fn record_if(dir: Option<&Path>, pid: u32, name: &str) -> Result<Option<PerfRecording>> {
    dir.map(|dir| PerfRecording::start(pid, &dir.join(format!("{name}.perf.data"))))
        .transpose()
}

/// Stops a recording started by [`record_if`], if any.
pub fn stop(recording: Option<PerfRecording>) -> Result<()> {
    recording.map_or(Ok(()), PerfRecording::stop)
}
