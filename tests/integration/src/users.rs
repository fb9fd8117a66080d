//! Daemons of real users on one shared directory: a `tunecached` started through `setpriv` as
//! a uid the test picks (no account needed), with its socket, state and log in a directory of
//! its own, driven by root's CLI; and the shared directory those tests set up, as root, the
//! way docs/launchers.md has the administrator do it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{bin, require_root, require_tool};

/// How long a user-daemon test waits for a fact.
pub const LIMIT: Duration = Duration::from_secs(20);

/// A daemon running as `uid`, with its socket, state and log in a directory of its own.
pub struct UserDaemon {
    pub uid: u32,
    pub node: String,
    pub home: PathBuf,
    child: Option<Child>,
}

impl UserDaemon {
    pub fn command(uid: u32, home: &Path, shared: &Path, node: &str, extra: &[&str]) -> Command {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string()])
            .args(["--clear-groups", "--"])
            .arg(bin("tunecached"))
            .arg("--socket")
            .arg(home.join("tunecache.sock"))
            .arg("--state-dir")
            .arg(home.join("state"))
            .arg("--shared-dir")
            .arg(shared)
            .args(["--node-name", node, "--snapshot-interval", "1"])
            .args(extra)
            .env_remove("TUNECACHE_SOCKET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        command
    }

    /// Starts it in `root/<node>` (made for `uid`, 0700) and waits until it answers.
    pub fn start(root: &Path, uid: u32, node: &str, shared: &Path, extra: &[&str]) -> UserDaemon {
        let home = root.join(node);
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        let log = std::fs::File::create(home.join("daemon.log")).unwrap();
        let child = Self::command(uid, &home, shared, node, extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("setpriv tunecached");
        let mut daemon = UserDaemon {
            uid,
            node: node.to_owned(),
            home,
            child: Some(child),
        };
        let deadline = Instant::now() + LIMIT;
        while !daemon.cli(&["stats"]).status.success() {
            if let Some(status) = daemon.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{node} exited with {status}:\n{}", daemon.log());
            }
            assert!(
                Instant::now() < deadline,
                "{node} did not serve:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    pub fn socket(&self) -> PathBuf {
        self.home.join("tunecache.sock")
    }

    /// The CLI on this daemon, run by root, trusting the daemon's uid.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin("tunecache"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .env("TUNECACHE_TRUST_UID", self.uid.to_string())
            .env_remove("TUNECACHE_VIEW")
            .output()
            .unwrap()
    }

    /// The key `problem` of these tests, as the CLI's arguments.
    fn key_args(problem: &str) -> [&str; 8] {
        [
            "--namespace",
            "users",
            "--op",
            "gemm",
            "--device",
            "d",
            "--problem",
            problem,
        ]
    }

    /// Records a result for `problem` naming the files `artifacts` (`NAME=PATH`), uploaded
    /// first.
    pub fn put_with(&self, problem: &str, artifacts: &[String]) {
        let config = format!("{{\"by\":\"{}\"}}", self.node);
        let mut args: Vec<&str> = vec!["put"];
        args.extend(Self::key_args(problem));
        args.extend(["--config", &config, "--time-us", "1"]);
        for artifact in artifacts {
            args.extend(["--artifact", artifact.as_str()]);
        }
        let output = self.cli(&args);
        assert!(output.status.success(), "put on {}: {output:?}", self.node);
    }

    pub fn put(&self, problem: &str) {
        self.put_with(problem, &[]);
    }

    pub fn holds(&self, problem: &str) -> bool {
        let mut args = vec!["get"];
        args.extend(Self::key_args(problem));
        self.cli(&args).status.success()
    }

    /// `get --artifacts-to dir` of `problem`: the CLI's output.
    pub fn fetch_artifacts(&self, problem: &str, dir: &Path) -> Output {
        let mut args = vec!["get"];
        args.extend(Self::key_args(problem));
        args.extend(["--artifacts-to", dir.to_str().unwrap()]);
        self.cli(&args)
    }

    pub fn stats(&self) -> serde_json::Value {
        let output = self.cli(&["--json", "stats"]);
        serde_json::from_slice(&output.stdout).unwrap_or_default()
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.stats()[name].as_u64().unwrap_or(0)
    }

    pub fn text(&self, name: &str) -> String {
        self.stats()[name].as_str().unwrap_or_default().to_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default()
    }

    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not stop", self.node);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for UserDaemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `check` holds, at most [`LIMIT`].
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !check() {
        assert!(Instant::now() < deadline, "not within {LIMIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A temporary root every test uid may enter, with `shared/` (root's, `mode`) in it; `None`
/// (the test is skipped) without root or `setpriv`.
pub fn setup(mode: u32) -> Option<(tempfile::TempDir, PathBuf)> {
    if !require_root("running daemons as other uids") || require_tool("setpriv", None).is_none() {
        return None;
    }
    let root = tempfile::Builder::new()
        .prefix("tc-users-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).unwrap();
    Some((root, shared))
}

/// A directory root owns, with `mode` (set explicitly: the umask may clear bits of it).
pub fn make_roots(dir: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir.to_path_buf()
}

/// `v2/` as docs/launchers.md has the administrator make it: root's, mode 1777.
pub fn make_sticky_v2(shared: &Path) -> PathBuf {
    make_roots(&shared.join("v2"), 0o1777)
}

/// Runs `program args` as `uid` (no groups).
pub fn as_user(uid: u32, program: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string()])
        .args(["--clear-groups", "--", program])
        .args(args)
        .output()
        .unwrap()
}
