//! Owns mounting and unmounting a slowfs filesystem for the suite: a backing directory and a
//! mountpoint under a local directory, `slowfs` started detached (it prints its pid once
//! mounted), and SIGTERM plus a lazy-unmount fallback when done.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long slowfs gets to unmount after SIGTERM.
const UNMOUNT_LIMIT: Duration = Duration::from_secs(10);

/// A mounted slowfs; unmounted when dropped.
pub struct SlowMount {
    pid: i32,
    mountpoint: PathBuf,
}

fn is_mounted(mountpoint: &Path) -> bool {
    let wanted = mountpoint.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .map(|mounts| {
            mounts
                .lines()
                .any(|line| line.split_whitespace().nth(1) == Some(wanted.as_ref()))
        })
        .unwrap_or(false)
}

impl SlowMount {
    /// Mounts `<root>/backing` on `<root>/mnt` with `latency_ms` per operation.
    pub fn mount(binary: &Path, root: &Path, latency_ms: u64, threads: usize) -> Result<Self> {
        if !Path::new("/dev/fuse").exists() {
            bail!("/dev/fuse does not exist");
        }
        if !binary.exists() {
            bail!(
                "{} not found (cargo build -p tunecache-slowfs)",
                binary.display()
            );
        }
        let backing = root.join("backing");
        let mountpoint = root.join("mnt");
        for dir in [&backing, &mountpoint] {
            std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
        }
        // The detached child keeps stderr for its log; a pipe there would never reach EOF,
        // so it goes to a file beside the mount.
        let log_path = root.join("slowfs.log");
        let log =
            std::fs::File::create(&log_path).with_context(|| log_path.display().to_string())?;
        let output = Command::new(binary)
            .arg(&backing)
            .arg(&mountpoint)
            .arg("--latency-ms")
            .arg(latency_ms.to_string())
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(Stdio::null())
            .stderr(log)
            .output()
            .with_context(|| format!("running {}", binary.display()))?;
        if !output.status.success() {
            bail!(
                "slowfs failed ({}): {}",
                output.status,
                std::fs::read_to_string(&log_path)
                    .unwrap_or_default()
                    .trim()
            );
        }
        let pid: i32 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .context("slowfs did not print its pid")?;
        Ok(Self { pid, mountpoint })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for SlowMount {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + UNMOUNT_LIMIT;
        while Instant::now() < deadline && is_mounted(&self.mountpoint) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if is_mounted(&self.mountpoint) {
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
