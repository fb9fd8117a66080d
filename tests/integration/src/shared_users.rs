//! Daemons of several real users on one shared directory, for the tests of many users
//! sharing it (`shared_dir_users`, `shared_dir_squatting`): each daemon runs as its uid
//! through `setpriv`, in a home of its own; segments are planted as a user would, by copying
//! a file in as that user.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use crate::{bin, require_root, require_tool, wait, Lazy};

/// The users of these tests: a site-wide daemon's account and two users.
pub const SITE: u32 = 4300;
pub const ALICE: u32 = 4301;
pub const BOB: u32 = 4302;
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
            // The site account's daemon is the site-wide one: its segments are every user's
            // to read (set through the environment, which daemons before the flag ignore).
            .env(
                "TUNECACHE_SHARED_DIR_PUBLIC",
                if uid == SITE { "true" } else { "false" },
            )
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
        Self::start_in(home, uid, node, shared, extra)
    }

    /// Starts it again in the home (state directory, log) it had, once it has stopped.
    pub fn restart(self, shared: &Path, extra: &[&str]) -> UserDaemon {
        assert!(self.child.is_none(), "{} still runs", self.node);
        Self::start_in(self.home.clone(), self.uid, &self.node, shared, extra)
    }

    fn start_in(home: PathBuf, uid: u32, node: &str, shared: &Path, extra: &[&str]) -> UserDaemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("daemon.log"))
            .unwrap();
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
        let log = daemon.home.join("daemon.log");
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait(LIMIT, Lazy(|| format!("{node} serving:\n{}", log())))
            .every(Duration::from_millis(50))
            .blocking(|| {
                if daemon.cli(&["stats"]).status.success() {
                    return true;
                }
                if let Some(status) = daemon.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!("{node} exited with {status}:\n{}", daemon.log());
                }
                false
            });
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
        wait(LIMIT, Lazy(|| format!("{} stopping", self.node)))
            .blocking_some(|| child.try_wait().unwrap())
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

/// A temporary root every test uid may enter, with `shared/` (root's, `mode`) in it.
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

/// `uid` puts a valid segment named as `node`'s (sequence `seq`) with one entry `problem`
/// into `v2`, as that user: the file is really theirs.
pub fn plant_segment(root: &Path, v2: &Path, uid: u32, node: &str, seq: u64, problem: &str) {
    plant_segment_range(root, v2, uid, node, (seq, seq), problem);
}

/// [`plant_segment`] covering the sequence numbers `first..=last`.
pub fn plant_segment_range(
    root: &Path,
    v2: &Path,
    uid: u32,
    node: &str,
    (seq, last): (u64, u64),
    problem: &str,
) {
    let document = serde_json::json!({
        "format": "tunecache-snapshot", "version": 2, "node": node,
        "first_seq": seq, "last_seq": last, "written_at_unix_ms": 0, "entry_count": 1,
        "entries": [{"namespace": "users", "op": "gemm", "device": "d", "problem": problem,
                     "config": "{\"planted\":1}", "time_us": 0.5, "tuned_by": "planted",
                     "tuned_at_unix_ms": 1}]
    });
    let source = root.join(format!("planted-{node}-{seq}-{last}.json"));
    std::fs::write(&source, serde_json::to_vec(&document).unwrap()).unwrap();
    let target = v2.join(format!("{node}.{seq:016x}-{last:016x}.seg.json"));
    let copied = as_user(
        uid,
        "cp",
        &[source.to_str().unwrap(), target.to_str().unwrap()],
    );
    assert!(copied.status.success(), "cp as {uid}: {copied:?}");
}

pub fn segments_of(v2: &Path, node: &str) -> Vec<PathBuf> {
    std::fs::read_dir(v2)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{node}.")) && n.ends_with(".seg.json"))
        })
        .collect()
}
