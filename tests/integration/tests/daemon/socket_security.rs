//! The default socket location against a hostile local user, with the real daemon and CLI:
//! a default directory another uid (65534, chown as root) created first, one others may write,
//! one that is a symbolic link, a socket owned by uid 65534, and a symbolic link planted for the
//! instance-guard lock file.
//!
//! The default location is pointed at a temporary directory through `$XDG_RUNTIME_DIR`
//! (`$XDG_RUNTIME_DIR/tunecache/tunecache.sock`), exactly as on a node where it is set; with it
//! unset the same rule applies to `/tmp/tunecache-<uid>`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use tunecache_client::Client;
use tunecache_integration::{
    bin, entry, eventually_blocking, require_root, test_key, wait, DaemonOptions, TestDaemon,
};

const NOBODY: u32 = 65534;

/// A daemon on the default location under `runtime_dir`: no `--socket`, no
/// `$TUNECACHE_SOCKET`, no systemd directory.
fn spawn_default_daemon(runtime_dir: &Path, state_dir: &Path) -> Child {
    Command::new(bin("tunecached"))
        .arg("--state-dir")
        .arg(state_dir)
        .env("XDG_RUNTIME_DIR", runtime_dir)
        .env_remove("TUNECACHE_SOCKET")
        .env_remove("RUNTIME_DIRECTORY")
        .env_remove("STATE_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tunecached")
}

/// Waits (at most 20 s) for a daemon that must refuse to start; returns its stderr.
fn expect_refusal(mut child: Child, socket: &Path) -> String {
    let exited = wait(Duration::from_secs(20), "the daemon refusing to start")
        .try_blocking_some(|| child.try_wait().unwrap());
    if exited.is_none() {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!(
            "the daemon served on {} instead of refusing it; log:\n{}",
            socket.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "the daemon exited with success");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The CLI with the default socket under `runtime_dir`.
fn cli_on_default(runtime_dir: &Path, args: &[&str]) -> Output {
    Command::new(bin("tunecache"))
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime_dir)
        .env_remove("TUNECACHE_SOCKET")
        .env_remove("TUNECACHE_AUTOSTART")
        .stdin(Stdio::null())
        .output()
        .expect("run tunecache")
}

const GET_ARGS: &[&str] = &[
    "get",
    "--namespace",
    "test",
    "--op",
    "gemm",
    "--device",
    "test-device",
    "--problem",
    "planted",
];

fn runtime_dir(temp: &tempfile::TempDir) -> PathBuf {
    let runtime = temp.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    // Like /run/user/<uid> or /tmp: others may traverse it.
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    runtime
}

#[test]
fn daemon_refuses_a_default_directory_another_user_created() {
    if !require_root("chown to uid 65534") {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    let squatted = runtime.join("tunecache");
    std::fs::create_dir(&squatted).unwrap();
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&squatted, Some(NOBODY), Some(NOBODY)).unwrap();

    let socket = squatted.join("tunecache.sock");
    let stderr = expect_refusal(
        spawn_default_daemon(&runtime, &temp.path().join("state")),
        &socket,
    );
    assert!(
        stderr.contains(&squatted.display().to_string())
            && stderr.contains("owned by uid 65534")
            && stderr.contains("mode 0755"),
        "the refusal names the path, the owner and the mode:\n{stderr}"
    );
    assert!(
        !socket.exists(),
        "nothing was bound in the squatted directory"
    );
    assert!(
        !squatted.join("tunecache.sock.lock").exists(),
        "no lock file was created in the squatted directory"
    );
}

#[test]
fn daemon_refuses_a_writable_or_symlinked_default_directory() {
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    let default_dir = runtime.join("tunecache");

    // Our own directory, but anyone may add or swap entries in it.
    std::fs::create_dir(&default_dir).unwrap();
    std::fs::set_permissions(&default_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stderr = expect_refusal(
        spawn_default_daemon(&runtime, &temp.path().join("state")),
        &default_dir.join("tunecache.sock"),
    );
    assert!(
        stderr.contains(&default_dir.display().to_string()) && stderr.contains("mode 0777"),
        "{stderr}"
    );
    std::fs::remove_dir(&default_dir).unwrap();

    // A symbolic link to a private directory elsewhere.
    let elsewhere = temp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &default_dir).unwrap();
    let stderr = expect_refusal(
        spawn_default_daemon(&runtime, &temp.path().join("state")),
        &default_dir.join("tunecache.sock"),
    );
    assert!(
        stderr.contains(&default_dir.display().to_string()) && stderr.contains("symbolic link"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing was created through the link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_directory_is_created_private_and_the_cli_uses_it() {
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    let mut child = KillOnDrop(spawn_default_daemon(&runtime, &temp.path().join("state")));
    let child = &mut child.0;
    let socket = runtime.join("tunecache").join("tunecache.sock");
    let client = wait(Duration::from_secs(20), "an answer on the default socket")
        .until_some_async(|| {
            let socket = &socket;
            let exited = child.try_wait().unwrap();
            async move {
                if let Ok(client) = Client::connect(socket).await {
                    if client.stats().await.is_ok() {
                        return Some(client);
                    }
                }
                if let Some(status) = exited {
                    panic!("tunecached exited with {status}");
                }
                None
            }
        })
        .await;
    let mode = std::fs::metadata(runtime.join("tunecache")).unwrap().mode() & 0o7777;
    assert_eq!(
        mode, 0o700,
        "the default directory is private, got {mode:04o}"
    );

    client
        .record(vec![entry(
            test_key("gemm", "planted"),
            "{\"ours\":1}",
            1.0,
            "t",
        )])
        .await
        .unwrap();
    let output = cli_on_default(&runtime, GET_ARGS);
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("ours"),
        "the CLI reaches its own daemon on the default path: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Kills the daemon when the test ends, also when it fails.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A daemon (run by the test as root, which serves any path it is given) on the default
/// socket path under `runtime`, in a directory another user made; it holds a forged entry.
async fn planted_daemon(temp: &tempfile::TempDir, runtime: &Path, dir_owner: u32) -> TestDaemon {
    let planted_dir = runtime.join("tunecache");
    std::fs::create_dir(&planted_dir).unwrap();
    std::fs::set_permissions(&planted_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&planted_dir, Some(dir_owner), Some(dir_owner)).unwrap();
    // In-process: what is tested is the CLI's check of the path, not the daemon.
    let daemon = DaemonOptions::new(&planted_dir)
        .state_dir(&temp.path().join("state"))
        .in_process()
        .await;
    assert_eq!(daemon.socket, planted_dir.join("tunecache.sock"));
    daemon
        .client()
        .await
        .record(vec![entry(
            test_key("gemm", "planted"),
            "{\"evil\":true}",
            0.001,
            "squatter",
        )])
        .await
        .unwrap();
    daemon
}

fn assert_cli_refuses(runtime: &Path, refused: &Path, why: &str) {
    let output = cli_on_default(runtime, GET_ARGS);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stdout.contains("evil"),
        "the CLI was served the planted entry: {stdout}"
    );
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains(&refused.display().to_string()) && stderr.contains(why),
        "the refusal names {} and says {why:?}: {stderr}",
        refused.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_refuses_a_default_directory_owned_by_another_user() {
    if !require_root("chown to uid 65534") {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    let daemon = planted_daemon(&temp, &runtime, NOBODY).await;
    assert_cli_refuses(&runtime, &runtime.join("tunecache"), "owned by uid 65534");

    // A path named explicitly is trusted: the same socket works with --socket.
    let output = Command::new(bin("tunecache"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(GET_ARGS)
        .env_remove("TUNECACHE_SOCKET")
        .output()
        .unwrap();
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("evil"),
        "an explicit --socket is not checked: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_refuses_a_default_socket_owned_by_another_user() {
    if !require_root("chown to uid 65534") {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    // The directory is ours (root's); the socket in it belongs to uid 65534.
    let daemon = planted_daemon(&temp, &runtime, 0).await;
    std::fs::set_permissions(
        runtime.join("tunecache"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::os::unix::fs::lchown(&daemon.socket, Some(NOBODY), Some(NOBODY)).unwrap();
    assert_cli_refuses(&runtime, &daemon.socket, "owned by uid 65534");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_planted_for_the_lock_file_is_not_followed() {
    let temp = tempfile::tempdir().unwrap();
    // A directory the admin chose (explicit --socket), where someone planted the lock file as
    // a link to a file they want created.
    let dir = temp.path().join("admin");
    std::fs::create_dir(&dir).unwrap();
    let target = temp.path().join("created-through-the-link");
    let socket = dir.join("tunecache.sock");
    std::os::unix::fs::symlink(&target, dir.join("tunecache.sock.lock")).unwrap();
    let child = Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(temp.path().join("state"))
        .env_remove("TUNECACHE_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = expect_refusal(child, &socket);
    assert!(
        !target.exists(),
        "the daemon created a file through the planted link"
    );
    assert!(
        stderr.contains("symbolic link") && stderr.contains("tunecache.sock.lock"),
        "{stderr}"
    );
}

#[test]
fn autostart_on_the_default_path_makes_a_private_directory_and_never_a_squatted_one() {
    if !require_root("chown to uid 65534") {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let runtime = runtime_dir(&temp);
    let autostart = |args: &[&str]| {
        Command::new(bin("tunecache"))
            .args(args)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("TUNECACHE_AUTOSTART", "1")
            .env("TUNECACHE_DAEMON_BIN", bin("tunecached"))
            .env("TUNECACHE_STATE_DIR", temp.path().join("state"))
            .env("TUNECACHE_EXIT_WHEN_IDLE", "2")
            .env_remove("TUNECACHE_SOCKET")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let default_dir = runtime.join("tunecache");

    // Squatted: refused before any daemon is started.
    std::fs::create_dir(&default_dir).unwrap();
    std::os::unix::fs::chown(&default_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let output = autostart(&["stats"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("owned by uid 65534"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&default_dir).unwrap().count(),
        0,
        "nothing was started or logged in the squatted directory"
    );
    std::fs::remove_dir(&default_dir).unwrap();

    // Free: auto-start creates it private and the daemon accepts it.
    let output = autostart(&["stats"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mode = std::fs::metadata(&default_dir).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o700, "auto-start made {mode:04o}");
}

/// A socket whose daemon runs as another uid is refused by the client even when named
/// (`--socket`): the uid comes from the connection (SO_PEERCRED), so there is no gap between
/// the check and the connect. `$TUNECACHE_TRUST_UID` admits a daemon account on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_socket_served_by_another_uid_is_refused_unless_trusted() {
    use std::os::unix::fs::PermissionsExt;
    if !tunecache_integration::require_root("running a daemon as uid 65534") {
        return;
    }
    let Some(setpriv) = tunecache_integration::require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = dir.path().join("run");
    let state = dir.path().join("state");
    for d in [&run, &state] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let socket = run.join("other.sock");
    let mut daemon = std::process::Command::new(setpriv)
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(tunecache_integration::bin("tunecached"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .args(["--tuner", "off"])
        .env_remove("TUNECACHE_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually_blocking(
        Duration::from_secs(10),
        "the daemon as 65534 binding",
        || socket.exists(),
    );
    let refused = tunecache_integration::cli(&socket, &["stats"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a daemon of uid 65534 was trusted"
    );
    assert!(stderr.contains("runs as uid 65534"), "{stderr}");
    let trusted = std::process::Command::new(tunecache_integration::bin("tunecache"))
        .arg("--socket")
        .arg(&socket)
        .arg("stats")
        .env("TUNECACHE_TRUST_UID", "65534")
        .output()
        .unwrap();
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
}
