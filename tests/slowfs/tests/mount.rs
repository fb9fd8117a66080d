//! Integration tests of the `slowfs` binary on a real FUSE mount: latency is applied, data
//! written through the mount lands in the backing dir, locks work, a hang (SIGUSR1 or
//! SIGSTOP) blocks operations until released, and SIGTERM unmounts. Each test skips, with a
//! printed reason, when `/dev/fuse` is absent, except under CI, where it fails.
//!
//! Note: once slowfs has read a request, the caller waits in uninterruptible sleep (as on a
//! hard NFS mount), so a blocked operation must be released before the test ends; the
//! mount guard's Drop always releases (SIGCONT, and SIGTERM clears the hang) first.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tunecache_slowfs::is_fuse_mounted;

const LATENCY: Duration = Duration::from_millis(50);

/// Whether slowfs can mount here. Outside CI a machine without FUSE skips with a reason;
/// under CI (`CI` set) that fails instead, so a CI image without /dev/fuse cannot pass these
/// tests without running them.
fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "/dev/fuse is absent, and CI is set: the slowfs tests must run under CI \
         (FUSE kernel support; in a container, --device /dev/fuse)"
    );
    println!("SKIPPED: /dev/fuse is absent on this machine; slowfs cannot mount");
    false
}

/// A running `slowfs --foreground` on a fresh temp backing dir and mountpoint.
struct MountedSlowFs {
    child: Child,
    backing: PathBuf,
    mountpoint: PathBuf,
    /// slowfs's stderr: what it says it did on each signal.
    log: PathBuf,
    _dirs: tempfile::TempDir,
}

impl MountedSlowFs {
    fn start(latency: Duration) -> Self {
        let dirs = tempfile::tempdir().expect("tempdir");
        let backing = dirs.path().join("backing");
        let mountpoint = dirs.path().join("mnt");
        fs::create_dir(&backing).expect("mkdir backing");
        fs::create_dir(&mountpoint).expect("mkdir mnt");
        let log = dirs.path().join("slowfs.log");
        let stderr = fs::File::create(&log).expect("slowfs log");
        let child = Command::new(env!("CARGO_BIN_EXE_slowfs"))
            .arg(&backing)
            .arg(&mountpoint)
            .arg("--latency-ms")
            .arg(latency.as_millis().to_string())
            .arg("--foreground")
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn slowfs");
        let mounted = Self {
            child,
            backing,
            mountpoint,
            log,
            _dirs: dirs,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_fuse_mounted(&mounted.mountpoint) {
            assert!(
                Instant::now() < deadline,
                "slowfs did not mount within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mounted
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("send signal to slowfs");
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    /// Waits (at most 10 s) until `hang` has landed: the process is stopped (SIGSTOP), or
    /// slowfs said it now hangs every operation (SIGUSR1).
    fn wait_hung(&self, hang: Signal) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let landed = || match hang {
            Signal::SIGSTOP => {
                let stat =
                    fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
                // The state follows the parenthesised command name.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    == Some("T")
            }
            _ => fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains("every operation now hangs"),
        };
        while !landed() {
            assert!(
                Instant::now() < deadline,
                "{hang} did not land within 10 s; slowfs said:\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, then waits up to `limit` for the process to exit; returns whether it did.
    fn terminate(&mut self, limit: Duration) -> bool {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGCONT);
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for MountedSlowFs {
    fn drop(&mut self) {
        if !self.terminate(Duration::from_secs(10)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_fuse_mounted(&self.mountpoint) {
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Runs `op` in a thread; returns a receiver for its result.
fn in_thread<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(op());
    });
    receiver
}

#[test]
fn every_operation_pays_the_latency_and_data_lands_in_backing_dir() {
    if !fuse_available() {
        return;
    }
    let slowfs = MountedSlowFs::start(LATENCY);
    let target = slowfs.mountpoint.join("cache.json");
    let temp = slowfs.mountpoint.join("cache.json.tmp");

    // The cache writers' pattern: temp file, fsync, rename over the target.
    let mut file = fs::File::create(&temp).expect("create through mount");
    file.write_all(b"{\"rank_0\": {}}").expect("write");
    file.sync_all().expect("fsync");
    drop(file);
    fs::rename(&temp, &target).expect("rename through mount");

    let started = Instant::now();
    let through_mount = fs::read(&target).expect("read through mount");
    let read_took = started.elapsed();
    assert_eq!(through_mount, b"{\"rank_0\": {}}");
    assert!(
        read_took >= LATENCY,
        "open+read+close took {read_took:?}, less than one {LATENCY:?} latency"
    );
    let started = Instant::now();
    fs::metadata(&target).expect("stat through mount");
    let stat_took = started.elapsed();
    assert!(
        stat_took >= LATENCY,
        "stat took {stat_took:?} < {LATENCY:?}"
    );

    assert_eq!(
        fs::read(slowfs.backing.join("cache.json")).expect("read backing"),
        b"{\"rank_0\": {}}"
    );
    assert!(!slowfs.backing.join("cache.json.tmp").exists());
    let listed: Vec<_> = fs::read_dir(&slowfs.mountpoint)
        .expect("readdir through mount")
        .map(|entry| entry.expect("dir entry").file_name())
        .collect();
    assert_eq!(listed, vec![std::ffi::OsString::from("cache.json")]);
}

#[test]
fn locks_exclude_each_other_on_the_mount() {
    if !fuse_available() {
        return;
    }
    let slowfs = MountedSlowFs::start(Duration::from_millis(1));
    let lock_path = slowfs.mountpoint.join("cache.json.lock");
    let first = fs::File::create(&lock_path).expect("create lock file");
    let second = fs::File::open(&lock_path).expect("open lock file again");
    // flock locks belong to the open file description, so two opens in one process conflict.
    // SAFETY: flock on fds owned by live Files.
    assert_eq!(unsafe { libc::flock(first.as_raw_fd(), libc::LOCK_EX) }, 0);
    let contended = unsafe { libc::flock(second.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(
        contended, -1,
        "second flock must fail while the first holds it"
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    assert_eq!(unsafe { libc::flock(first.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert_eq!(
        unsafe { libc::flock(second.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
}

fn assert_hang_blocks_until_released(hang: Signal, release: Signal) {
    let slowfs = MountedSlowFs::start(Duration::from_millis(1));
    let file = slowfs.mountpoint.join("data");
    fs::write(&file, b"payload").expect("write before the hang");

    slowfs.signal(hang);
    // The op starts once the hang is in place.
    slowfs.wait_hung(hang);
    let blocked_read = in_thread(move || fs::read(&file));
    assert!(
        matches!(
            blocked_read.recv_timeout(Duration::from_millis(700)),
            Err(mpsc::RecvTimeoutError::Timeout)
        ),
        "a read finished while slowfs was hung ({hang})"
    );
    slowfs.signal(release);
    let released = blocked_read
        .recv_timeout(Duration::from_secs(10))
        .expect("read still blocked 10 s after release");
    assert_eq!(released.expect("read after release"), b"payload");
}

#[test]
fn sigusr1_hangs_operations_until_toggled_back() {
    if !fuse_available() {
        return;
    }
    assert_hang_blocks_until_released(Signal::SIGUSR1, Signal::SIGUSR1);
}

#[test]
fn sigstop_hangs_operations_until_sigcont() {
    if !fuse_available() {
        return;
    }
    assert_hang_blocks_until_released(Signal::SIGSTOP, Signal::SIGCONT);
}

#[test]
fn sigterm_unmounts_and_exits() {
    if !fuse_available() {
        return;
    }
    let mut slowfs = MountedSlowFs::start(Duration::from_millis(1));
    fs::write(slowfs.mountpoint.join("kept"), b"x").expect("write");
    assert!(
        slowfs.terminate(Duration::from_secs(10)),
        "slowfs did not exit on SIGTERM"
    );
    assert!(
        !is_fuse_mounted(&slowfs.mountpoint),
        "still mounted after SIGTERM"
    );
    assert!(slowfs.backing.join("kept").exists());
}
