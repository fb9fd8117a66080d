//! What the CLI's tests share: a real `tunecached` of the test's own, on its own socket and
//! state directory, found next to the CLI in the target directory (or in
//! `$TUNECACHE_BIN_DIR`); without it a test is skipped, except under CI.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `tunecached` of this test on its own socket and state directory, killed on drop.
pub struct Daemon {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn daemon_binary() -> Option<PathBuf> {
    let dir = std::env::var_os("TUNECACHE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // The CLI is <target>/<profile>/tunecache, as the daemon built with it is.
            Path::new(env!("CARGO_BIN_EXE_tunecache"))
                .parent()
                .expect("the CLI lives in a directory")
                .to_path_buf()
        });
    let binary = dir.join("tunecached");
    if binary.is_file() {
        return Some(binary);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is required under CI: build it with `cargo build --workspace --bins`",
        binary.display()
    );
    eprintln!(
        "SKIPPED: {} not found (cargo build -p tunecache-server)",
        binary.display()
    );
    None
}

pub fn start_daemon(test: &str) -> Option<Daemon> {
    let binary = daemon_binary()?;
    let dir = std::env::temp_dir().join(format!("tc-cli-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let socket = dir.join("s.sock");
    let log = std::fs::File::create(dir.join("daemon.log")).expect("daemon log");
    let child = Command::new(binary)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--tuner", "off"])
        .env_remove("TUNECACHE_SOCKET")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("daemon log"))
        .stderr(log)
        .spawn()
        .expect("start tunecached");
    let daemon = Daemon { child, dir, socket };
    let deadline = Instant::now() + Duration::from_secs(30);
    let answers = |daemon: &Daemon| {
        Command::new(env!("CARGO_BIN_EXE_tunecache"))
            .arg("--socket")
            .arg(&daemon.socket)
            .arg("stats")
            .output()
            .is_ok_and(|output| output.status.success())
    };
    while !answers(&daemon) {
        assert!(
            Instant::now() < deadline,
            "tunecached did not answer within 30 s; log:\n{}",
            std::fs::read_to_string(daemon.dir.join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(daemon)
}
