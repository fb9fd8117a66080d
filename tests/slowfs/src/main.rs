//! The `slowfs` binary: mounts a [`tunecache_slowfs::SlowFs`] passthrough of BACKING_DIR on
//! MOUNTPOINT and owns its process lifecycle: daemonizing (unless `--foreground`), the
//! signal thread (SIGUSR1 toggles "hang every operation", SIGTERM/SIGINT/SIGHUP unmount and
//! exit) and the FUSE worker threads.
//!
//! A SIGSTOPped slowfs needs no code: nobody answers the kernel, so every operation on the
//! mount blocks until SIGCONT, like a stalled NFS server.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use tunecache_slowfs::{mount_config, OpGate, SlowFs};

/// FUSE passthrough that adds latency to every operation and hangs on SIGUSR1.
#[derive(Debug, Parser)]
#[command(name = "slowfs", version)]
struct Args {
    /// Directory whose contents the mount mirrors.
    backing_dir: PathBuf,
    /// Empty directory to mount on.
    mountpoint: PathBuf,
    /// Milliseconds every FUSE operation sleeps before it runs.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Stay in the foreground instead of detaching once mounted.
    #[arg(long)]
    foreground: bool,
    /// FUSE worker threads: how many operations may be in flight (sleeping) at once.
    #[arg(long, default_value_t = 32)]
    threads: usize,
    /// Kernel attribute/entry cache lifetime in ms; 0 sends every lookup and stat to us.
    #[arg(long, default_value_t = 0)]
    attr_ttl_ms: u64,
    /// Start with every operation hung (SIGUSR1 releases).
    #[arg(long)]
    start_hung: bool,
    /// Let users other than the mounting one use the mount (needs user_allow_other for non-root).
    #[arg(long)]
    allow_other: bool,
}

/// Writes a diagnostic line to stderr; a closed stderr (detached daemon) must not kill us.
fn log(message: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "slowfs[{}]: {message}",
        std::process::id()
    );
}

/// The write end of the pipe a detached child uses to tell its parent it mounted (or why not).
struct ReadyPipe(OwnedFd);

impl ReadyPipe {
    fn send(self, message: &[u8]) {
        let mut file = std::fs::File::from(self.0);
        let _ = file.write_all(message);
    }
}

/// Forks; the parent waits for the child's mount result and exits, printing the child's pid.
/// Must run before any thread is started (fork copies only the calling thread).
fn daemonize() -> Result<ReadyPipe> {
    let (read_end, write_end) = nix::unistd::pipe().context("pipe")?;
    // SAFETY: called from main before any other thread exists, so the child is consistent.
    match unsafe { nix::unistd::fork() }.context("fork")? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(write_end);
            let mut answer = Vec::new();
            std::fs::File::from(read_end)
                .read_to_end(&mut answer)
                .context("reading the child's mount result")?;
            if answer == b"ok" {
                println!("{child}");
                std::process::exit(0);
            }
            bail!(
                "slowfs child {child} failed: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            nix::unistd::setsid().context("setsid")?;
            let dev_null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .context("open /dev/null")?;
            // stdin/stdout to /dev/null so the caller's pipe closes; stderr stays for logs.
            // SAFETY: dup2 on valid fds; replaces fds 0 and 1, which nothing else holds.
            unsafe {
                libc::dup2(dev_null.as_raw_fd(), 0);
                libc::dup2(dev_null.as_raw_fd(), 1);
            }
            Ok(ReadyPipe(write_end))
        }
    }
}

fn shutdown_signals() -> [Signal; 3] {
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP]
}

fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGUSR1);
    for signal in shutdown_signals() {
        set.add(signal);
    }
    set
}

/// Waits for signals forever: SIGUSR1 toggles the hang, a shutdown signal releases any hung
/// operation and unmounts (lazily if the mount is busy), which ends the session loop.
fn signal_loop(gate: Arc<OpGate>, mut unmounter: fuser::SessionUnmounter, mountpoint: PathBuf) {
    let signals = handled_signals();
    loop {
        let signal = match signals.wait() {
            Ok(signal) => signal,
            Err(errno) => {
                log(&format!("sigwait failed: {errno}"));
                continue;
            }
        };
        if signal == Signal::SIGUSR1 {
            let now_hung = gate.toggle_hung();
            log(if now_hung {
                "SIGUSR1: every operation now hangs"
            } else {
                "SIGUSR1: operations released"
            });
            continue;
        }
        log(&format!("{signal}: unmounting {}", mountpoint.display()));
        gate.set_hung(false);
        if let Err(err) = unmounter.unmount() {
            log(&format!("unmount failed ({err}); detaching lazily"));
            if let Err(errno) = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH) {
                log(&format!("lazy unmount failed: {errno}"));
            }
            // A detached but still-busy mount keeps the session loop alive; exiting closes
            // /dev/fuse, which aborts the connection so its users get ENOTCONN, not a hang.
            std::process::exit(0);
        }
        // The session loop normally ends right after the unmount; don't wait on it forever.
        std::thread::sleep(Duration::from_secs(5));
        log("session loop did not stop after unmount; exiting");
        std::process::exit(0);
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let ready_pipe = if args.foreground {
        None
    } else {
        Some(daemonize()?)
    };
    // Block the handled signals before any thread starts, so every thread inherits the mask
    // and only the signal thread's sigwait receives them.
    handled_signals()
        .thread_block()
        .context("blocking signals")?;

    let gate = Arc::new(OpGate::new(Duration::from_millis(args.latency_ms)));
    gate.set_hung(args.start_hung);
    let mounted = SlowFs::new(
        &args.backing_dir,
        gate.clone(),
        Duration::from_millis(args.attr_ttl_ms),
    )
    .context("backing directory")
    .and_then(|filesystem| {
        fuser::Session::new(
            filesystem,
            &args.mountpoint,
            &mount_config(args.threads, args.allow_other),
        )
        .with_context(|| format!("mounting on {}", args.mountpoint.display()))
    });
    let mut session = match mounted {
        Ok(session) => session,
        Err(err) => {
            if let Some(pipe) = ready_pipe {
                pipe.send(format!("{err:#}").as_bytes());
            }
            return Err(err);
        }
    };
    log(&format!(
        "mounted {} on {} (latency {} ms, {} threads{})",
        args.backing_dir.display(),
        args.mountpoint.display(),
        args.latency_ms,
        args.threads,
        if args.start_hung { ", hung" } else { "" }
    ));
    if let Some(pipe) = ready_pipe {
        pipe.send(b"ok");
    }

    let unmounter = session.unmount_callable();
    let signal_gate = gate.clone();
    let mountpoint = args.mountpoint.clone();
    std::thread::Builder::new()
        .name("slowfs-signals".to_string())
        .spawn(move || signal_loop(signal_gate, unmounter, mountpoint))
        .context("spawning the signal thread")?;

    session.run().context("FUSE session")?;
    log(&format!(
        "unmounted; {} operations served",
        gate.ops_passed()
    ));
    Ok(())
}
