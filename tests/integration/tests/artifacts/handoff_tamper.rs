//! A handed descriptor stays read-only, against real daemons and real uids (issue 50): its
//! file has no write bit and is the daemon's, so a rank of another uid can neither `fchmod` it
//! nor reopen it writable through `/proc/self/fd`; a rank of the daemon's own uid, which can
//! change the daemon's files, finds the mode set back before the next handoff; and a client
//! verifying handed blobs (`TUNECACHE_VERIFY=1`) refuses one changed under its copy.

use std::path::Path;
use std::time::Duration;

use tunecache_integration::blobs::{self, Content};
use tunecache_integration::{require_root, require_tool, wait, Lazy, TestDaemon, FACT_LIMIT};
use tunecache_proto::handoff::socket_path;

const MIB: u64 = 1024 * 1024;

/// The daemon's own uid in the descriptor tests: not root, so the file mode is all that stands
/// between a rank of that uid and the blob (root's ranks pass every mode anyway).
const DAEMON_UID: u32 = 4340;
const OTHER_UID: u32 = 65534;

/// `tunecached` running as `DAEMON_UID` (through setpriv), in a directory of its own; killed
/// when dropped.
struct DaemonAs {
    child: std::process::Child,
    socket: std::path::PathBuf,
    home: std::path::PathBuf,
}

impl DaemonAs {
    fn start(setpriv: &Path, home: &Path, args: &[&str]) -> DaemonAs {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir(home).unwrap();
        std::os::unix::fs::chown(home, Some(DAEMON_UID), Some(DAEMON_UID)).unwrap();
        std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = std::fs::File::create(home.join("daemon.log")).unwrap();
        let socket = home.join("tunecache.sock");
        let child = std::process::Command::new(setpriv)
            .args(["--reuid", &DAEMON_UID.to_string()])
            .args(["--regid", &DAEMON_UID.to_string(), "--clear-groups", "--"])
            .arg(tunecache_integration::bin("tunecached"))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(home.join("state"))
            .args(args)
            .env_remove("TUNECACHE_SOCKET")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("setpriv tunecached");
        let mut daemon = DaemonAs {
            child,
            socket,
            home: home.to_path_buf(),
        };
        let log = daemon.home.join("daemon.log");
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait(
            FACT_LIMIT,
            Lazy(|| format!("the daemon serving:\n{}", log())),
        )
        .every(Duration::from_millis(50))
        .blocking(|| {
            if daemon.cli(setpriv, &["stats"]).status.success() {
                return true;
            }
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("the daemon exited with {status}:\n{}", daemon.log());
            }
            false
        });
        daemon
    }

    /// The CLI on this daemon as its own uid (which it trusts).
    fn cli(&self, setpriv: &Path, args: &[&str]) -> std::process::Output {
        std::process::Command::new(setpriv)
            .args(["--reuid", &DAEMON_UID.to_string()])
            .args(["--regid", &DAEMON_UID.to_string(), "--clear-groups", "--"])
            .arg(tunecache_integration::bin("tunecache"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for DaemonAs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rank's attempts on a handed descriptor, in Python's own calls: the answer line, the
/// file's mode, whether `/proc/self/fd/N` reopens it writable, and whether `fchmod` 0666
/// works (it is left done when it does).
const PYTHON_TAMPERER: &str = r#"
import errno, os, socket, stat, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
msg, fds, _, _ = socket.recv_fds(s, 256, 4)
print(msg.decode().strip())
fd = fds[0]
print(oct(stat.S_IMODE(os.fstat(fd).st_mode)))
try:
    os.close(os.open("/proc/self/fd/%d" % fd, os.O_RDWR))
    print("reopened writable")
except OSError as e:
    print("not reopened: " + errno.errorcode[e.errno])
try:
    os.fchmod(fd, 0o666)
    print("fchmod done")
except OSError as e:
    print("fchmod refused: " + errno.errorcode[e.errno])
"#;

fn tamper_as(setpriv: &Path, uid: u32, socket: &Path, digest: &str) -> Vec<String> {
    let output = std::process::Command::new(setpriv)
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string()])
        .args([
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            PYTHON_TAMPERER,
        ])
        .arg(socket_path(socket))
        .arg(digest)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Issue 50, finding 8: a handed descriptor is of a file with no write bit, owned by the
/// daemon. A rank of another uid can neither fchmod it nor reopen it writable through
/// `/proc/self/fd`; a rank of the daemon's own uid cannot reopen it writable either, and
/// though it can fchmod its own uid's file (docs/artifacts.md says so), the next handoff has
/// the mode back to 0444 before anyone else is handed the file.
#[tokio::test]
async fn a_handed_descriptor_cannot_be_made_writable_by_a_rank_of_another_uid() {
    if !require_root("acting as other uids") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    if !Path::new("/usr/bin/python3").is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "/usr/bin/python3 is required under CI"
        );
        eprintln!("SKIPPED: no /usr/bin/python3");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = DaemonAs::start(
        &setpriv,
        &dir.path().join("daemon"),
        &["--allow-uid", &OTHER_UID.to_string()],
    );
    std::fs::set_permissions(
        socket_path(&daemon.socket),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let content = Content::new(55, MIB + 9);
    let file = dir.path().join("k.so");
    std::fs::write(&file, content.bytes()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let artifact = format!("k.so={}", file.display());
    let put = daemon.cli(
        &setpriv,
        &[
            "put",
            "--namespace",
            "test",
            "--op",
            "matmul",
            "--device",
            "test-device",
            "--problem",
            "read-only",
            "--config",
            "{}",
            "--time-us",
            "1",
            "--artifact",
            &artifact,
        ],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let held = format!("held {}", content.size);
    let digest = content.digest();

    let other = tamper_as(&setpriv, OTHER_UID, &daemon.socket, &digest);
    assert_eq!(
        other,
        [
            &held,
            "0o444",
            "not reopened: EACCES",
            "fchmod refused: EPERM"
        ],
        "another uid's rank"
    );
    let own = tamper_as(&setpriv, DAEMON_UID, &daemon.socket, &digest);
    assert_eq!(
        own,
        [&held, "0o444", "not reopened: EACCES", "fchmod done"],
        "a rank of the daemon's own uid"
    );
    let after = tamper_as(&setpriv, OTHER_UID, &daemon.socket, &digest);
    assert_eq!(
        after,
        [
            &held,
            "0o444",
            "not reopened: EACCES",
            "fchmod refused: EPERM"
        ],
        "another uid's rank, after the daemon's uid changed the mode"
    );
}

/// An AsyncWrite that, on its first write, flips the byte at `at` of the file at `path` in
/// place: what a rank of the daemon's uid can do to a blob while another rank copies it
/// from its handed descriptor.
struct ChangingWriter {
    path: std::path::PathBuf,
    at: u64,
    changed: bool,
    bytes: Vec<u8>,
}

impl tokio::io::AsyncWrite for ChangingWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if !self.changed {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.path)?;
            let mut byte = [0u8; 1];
            file.read_exact_at(&mut byte, self.at)?;
            file.write_all_at(&[byte[0] ^ 0x01], self.at)?;
            self.changed = true;
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A blob changed in place while a rank copies it from its descriptor (the daemon checked it
/// when it handed it; a rank of the daemon's uid can change it after): a client verifying
/// handed blobs (`TUNECACHE_VERIFY=1`) refuses the copy; one that does not takes the changed
/// bytes, which is why docs/artifacts.md says to verify where ranks of the daemon's uid are
/// not trusted.
#[tokio::test]
async fn a_verifying_client_detects_a_blob_changed_under_its_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path()).in_process().await;
    let client = daemon.client().await;
    let blob_path = |content: Content| {
        daemon
            .state_dir
            .join("artifacts/blobs")
            .join(content.digest())
    };
    let checked = Content::new(56, 3 * MIB);
    let unchecked = Content::new(57, 3 * MIB);
    blobs::held_entry(&client, "verified", checked, "k.so").await;
    blobs::held_entry(&client, "unverified", unchecked, "k.so").await;
    let at = 2 * MIB + 5;

    let mut writer = ChangingWriter {
        path: blob_path(checked),
        at,
        changed: false,
        bytes: Vec::new(),
    };
    let refused = client
        .clone()
        .verify_handoffs(true)
        .get_artifact(&checked.digest(), &mut writer)
        .await;
    assert!(writer.changed, "the blob was not changed under the copy");
    let error = refused.expect_err("a changed handed blob was taken");
    assert!(error.to_string().contains(&checked.digest()), "{error}");

    let mut writer = ChangingWriter {
        path: blob_path(unchecked),
        at,
        changed: false,
        bytes: Vec::new(),
    };
    let size = client
        .clone()
        .verify_handoffs(false)
        .get_artifact(&unchecked.digest(), &mut writer)
        .await
        .expect("without verification the copy is taken");
    assert_eq!(size, unchecked.size);
    let mut expected = unchecked.bytes();
    expected[at as usize] ^= 0x01;
    assert!(
        writer.bytes == expected,
        "the unverified copy is the changed file"
    );
    assert_eq!(daemon.stats().await.artifact_handoffs, 2);
}
