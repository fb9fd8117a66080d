//! The artifact descriptor handoff against real daemons: a rank on the node is handed a
//! read-only descriptor of a held blob and gets its exact bytes without a GetArtifact stream;
//! a blob whose file changed is hashed again and never handed; the socket admits whom
//! GetArtifact admits, bounds each uid's connections, and names what is wrong with a request.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use tunecache_client::handoff::Handoff;
use tunecache_integration::blobs::{self, Content};
use tunecache_integration::{require_root, require_tool, shared_node, TestDaemon};
use tunecache_proto::handoff::socket_path;

const MIB: u64 = 1024 * 1024;

/// One raw exchange on the handoff socket: the answer line, as sent.
fn exchange(stream: &mut UnixStream, request: &[u8]) -> String {
    stream.write_all(request).unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

#[tokio::test]
async fn a_rank_on_the_node_is_handed_a_held_blob_and_gets_its_exact_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path()).in_process().await;
    let client = daemon.client().await;
    let content = Content::new(51, 5 * MIB + 3);
    let entry = blobs::held_entry(&client, "handed", content, "kernel.so").await;

    // fetch_artifacts: the file is the blob, byte for byte, and it came as a descriptor.
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let written = client.fetch_artifacts(&entry, &out).await.unwrap();
    assert_eq!(written, vec![out.join("kernel.so")]);
    assert!(
        std::fs::read(&written[0]).unwrap() == content.bytes(),
        "the bytes differ"
    );
    let stats = daemon.stats().await;
    assert_eq!(
        (
            stats.artifact_handoffs,
            stats.artifact_fetches_local,
            stats.artifact_bytes_served
        ),
        (1, 1, content.size)
    );

    // get_artifact into a writer: the same, a second handoff.
    let mut got = Vec::new();
    let size = client
        .get_artifact(&content.digest(), &mut got)
        .await
        .unwrap();
    assert_eq!(size, content.size);
    assert!(got == content.bytes(), "the bytes differ");
    // Turned off, the same call streams it: no new handoff, one more local fetch.
    let mut streamed = Vec::new();
    client
        .clone()
        .without_handoff()
        .get_artifact(&content.digest(), &mut streamed)
        .await
        .unwrap();
    assert!(streamed == got, "the streamed bytes differ");
    let stats = daemon.stats().await;
    assert_eq!(
        (stats.artifact_handoffs, stats.artifact_fetches_local),
        (2, 3)
    );

    // The descriptor is read-only and starts at the blob's first byte, every time.
    let mut handoff = Handoff::connect(
        &socket_path(&daemon.socket),
        &[nix::unistd::geteuid().as_raw()],
        Duration::from_secs(5),
    )
    .await
    .expect("the handoff socket answers");
    for _ in 0..2 {
        let (mut file, size) = handoff
            .open(&content.digest(), Some(content.size))
            .unwrap()
            .expect("held");
        assert_eq!(size, content.size);
        let mut head = vec![0u8; 4096];
        file.read_exact(&mut head).unwrap();
        assert!(head[..] == content.bytes()[..4096]);
        assert!(file.write_all(b"x").is_err(), "the descriptor is writable");
    }
    // A size other than the entry's is not taken: the caller streams and hears why.
    assert!(handoff
        .open(&content.digest(), Some(content.size + 1))
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_blob_changed_in_place_is_hashed_again_and_never_handed() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path()).in_process().await;
    let client = daemon.client().await;
    let content = Content::new(52, 3 * MIB + 1);
    blobs::held_entry(&client, "changed", content, "k.so").await;
    // Handed twice: the first hashes the file whole and stamps it, the second trusts the stamp.
    for _ in 0..2 {
        let mut got = Vec::new();
        client
            .get_artifact(&content.digest(), &mut got)
            .await
            .unwrap();
        assert!(got == content.bytes());
    }
    assert_eq!(daemon.stats().await.artifact_handoffs, 2);
    // One byte flipped in place: same inode and length, a new change time.
    let path = daemon
        .state_dir
        .join("artifacts/blobs")
        .join(content.digest());
    let mut bytes = content.bytes();
    bytes[2 * MIB as usize] ^= 0x01;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut file| file.write_all(&bytes))
        .unwrap();
    let mut got = Vec::new();
    let refused = client.get_artifact(&content.digest(), &mut got).await;
    assert!(refused.is_err(), "a changed blob was served");
    assert!(
        got.is_empty(),
        "{} bytes of a changed blob reached the caller",
        got.len()
    );
    let stats = daemon.stats().await;
    assert_eq!(
        (
            stats.artifact_handoffs,
            stats.artifact_digest_failures,
            stats.artifact_blobs_held
        ),
        (2, 1, 0)
    );
    assert!(!path.exists(), "the changed blob is dropped from the store");
}

/// The bytes waiting in `stream`'s receive queue (FIONREAD).
fn queued_bytes(stream: &UnixStream) -> usize {
    let mut queued: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at one.
    let done = unsafe {
        nix::libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            nix::libc::FIONREAD,
            &mut queued,
        )
    };
    assert_eq!(done, 0, "FIONREAD");
    usize::try_from(queued).unwrap_or(0)
}

#[tokio::test]
async fn a_bad_request_is_named_a_blob_not_held_is_said_and_each_uid_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path())
        .args(["--max-connections-per-uid", "4"])
        .in_process()
        .await;
    let client = daemon.client().await;
    let content = Content::new(53, MIB);
    blobs::held_entry(&client, "raw", content, "k.so").await;
    let handoff = socket_path(&daemon.socket);

    let mut first = UnixStream::connect(&handoff).unwrap();
    let unknown = "0".repeat(64);
    assert_eq!(
        exchange(&mut first, format!("{unknown}\n").as_bytes()),
        "not-held"
    );
    // The connection stays for the next exchange.
    assert_eq!(
        exchange(&mut first, format!("{}\n", content.digest()).as_bytes()),
        format!("held {}", content.size)
    );
    let upper = content.digest().to_uppercase();
    assert_eq!(
        exchange(&mut first, format!("{upper}\n").as_bytes()),
        format!(
            "refused request: digest: byte {:#04x} at {}: a digest is lowercase hex",
            upper.bytes().find(|b| b.is_ascii_uppercase()).unwrap(),
            upper.find(|c: char| c.is_ascii_uppercase()).unwrap()
        )
    );
    // Refused: the daemon closed it.
    let mut rest = Vec::new();
    first.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    drop(first);

    // A second request sent before the first answer is read (only peeked at: it is there, its
    // descriptor in flight) is refused, so no caller piles up descriptors it never takes.
    let mut piling = UnixStream::connect(&handoff).unwrap();
    let request = format!("{}\n", content.digest());
    piling.write_all(request.as_bytes()).unwrap();
    let mut peeked = [0u8; 1];
    nix::sys::socket::recv(
        std::os::fd::AsRawFd::as_raw_fd(&piling),
        &mut peeked,
        nix::sys::socket::MsgFlags::MSG_PEEK,
    )
    .unwrap();
    piling.write_all(request.as_bytes()).unwrap();
    // Reading now could take the first answer before the daemon looks: wait until the second
    // answer is queued behind it (FIONREAD counts both; a peek stops at the descriptor).
    let first_answer = format!("held {}\n", content.size).len();
    let waited = std::time::Instant::now();
    while queued_bytes(&piling) <= first_answer {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no second answer"
        );
        std::thread::yield_now();
    }
    let mut answers = String::new();
    piling.read_to_string(&mut answers).unwrap();
    assert_eq!(
        answers,
        format!(
            "held {}\nrefused a request came before the previous answer was read\n",
            content.size
        )
    );
    drop(piling);

    // Four handoff connections of this uid are held; a fifth is closed at once and counted,
    // while gRPC, a socket of its own, still answers.
    let refused_before = client.stats().await.unwrap().connections_refused_per_uid;
    let mut held: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&handoff).unwrap())
        .collect();
    for stream in &mut held {
        assert_eq!(
            exchange(stream, format!("{}\n", content.digest()).as_bytes()),
            format!("held {}", content.size)
        );
    }
    let mut fifth = UnixStream::connect(&handoff).unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = fifth.write_all(format!("{}\n", content.digest()).as_bytes());
    let mut answer = Vec::new();
    let _ = fifth.read_to_end(&mut answer);
    assert!(
        answer.is_empty(),
        "the fifth connection was served: {answer:?}"
    );
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.connections_refused_per_uid, refused_before + 1);
    assert_eq!(stats.artifact_handoffs, 6);
}

/// A raw handoff exchange as uid 65534, in Python's own `socket.recv_fds`: the answer line,
/// how many descriptors came, the first 16 bytes read through one, and whether it could write.
const PYTHON_PEER: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
msg, fds, _, _ = socket.recv_fds(s, 256, 4)
print(msg.decode().strip())
print(len(fds))
if fds:
    print(os.read(fds[0], 16).hex())
    try:
        os.write(fds[0], b"x")
        print("writable")
    except OSError:
        print("read-only")
"#;

fn handoff_as_nobody(setpriv: &Path, python: &Path, socket: &Path, digest: &str) -> Vec<String> {
    let output = std::process::Command::new(setpriv)
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(python)
        .args(["-c", PYTHON_PEER])
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

#[tokio::test]
async fn the_handoff_admits_whom_get_artifact_admits() {
    if !require_root("acting as uid 65534") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    // The system's Python: one that uid 65534 can run (not a shim under /root).
    let python = Path::new("/usr/bin/python3");
    if !python.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "/usr/bin/python3 is required under CI"
        );
        eprintln!("SKIPPED: no /usr/bin/python3");
        return;
    }
    let content = Content::new(54, 2 * MIB);
    let head: String = content.bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for (allowed, args) in [(false, vec![]), (true, vec!["--allow-uid", "65534"])] {
        let node = dir.path().join(if allowed { "allowed" } else { "denied" });
        std::fs::create_dir(&node).unwrap();
        let daemon = TestDaemon::builder(&node).args(args).process().await;
        use std::os::unix::fs::PermissionsExt;
        for open in [dir.path(), node.as_path()] {
            std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let handoff = socket_path(&daemon.socket);
        std::fs::set_permissions(&handoff, std::fs::Permissions::from_mode(0o666)).unwrap();
        let client = daemon.client().await;
        blobs::held_entry(&client, "access", content, "k.so").await;
        let lines = handoff_as_nobody(&setpriv, python, &daemon.socket, &content.digest());
        if allowed {
            assert_eq!(
                lines,
                [
                    format!("held {}", content.size),
                    "1".to_owned(),
                    head.clone(),
                    "read-only".to_owned()
                ]
            );
            assert_eq!(daemon.stats().await.artifact_handoffs, 1);
        } else {
            assert_eq!(lines.len(), 2, "{lines:?}");
            assert!(
                lines[0].starts_with("refused uid 65534 may not use this tunecached"),
                "{lines:?}"
            );
            assert_eq!(lines[1], "0", "a descriptor was handed to a refused uid");
            assert_eq!(daemon.stats().await.artifact_handoffs, 0);
        }
    }
}

/// Handoff requests are calls like any other for `--exit-when-idle`: a daemon whose ranks only
/// take descriptors stays while they do, and goes once they stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_requests_keep_an_idle_exiting_daemon_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::builder(dir.path())
        .args(["--exit-when-idle", "1"])
        .process()
        .await;
    let content = Content::new(55, MIB);
    {
        let client = daemon.client().await;
        blobs::held_entry(&client, "idle", content, "k.so").await;
    }
    let mut handoff = Handoff::connect(
        &socket_path(&daemon.socket),
        &[nix::unistd::geteuid().as_raw()],
        Duration::from_secs(5),
    )
    .await
    .expect("the handoff socket answers");
    // Three times the idle time of nothing but handoff requests: each one must be answered
    // by a daemon still serving.
    let busy = std::time::Instant::now();
    let mut handed = 0u32;
    while busy.elapsed() < Duration::from_secs(3) {
        let answer = handoff.open(&content.digest(), Some(content.size));
        assert!(
            matches!(answer, Ok(Some(_))),
            "handoff {handed} after {:?} was not answered ({answer:?}): the daemon quit under \
             handoff traffic; log:\n{}",
            busy.elapsed(),
            daemon.log()
        );
        handed += 1;
        // A rank's pace between blobs; the next request is the fact waited on.
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(handoff);
    // Once the ranks stop, the daemon goes as it would after its last gRPC call.
    let status = daemon.wait_for_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}; log:\n{}", daemon.log());
}

/// A blob this node does not hold yet but a held entry names (a cold blob, here only in the
/// shared directory) is fetched from the tiers by the handoff itself and then handed, on the
/// first fetch: no GetArtifact stream.
#[tokio::test]
async fn a_cold_blob_is_fetched_from_the_tiers_and_handed_on_first_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "node-a", 3600, &[])
        .in_process()
        .await;
    let b = shared_node(&dir.path().join("b"), &shared, "node-b", 3600, &[])
        .in_process()
        .await;
    let (ca, cb) = (a.client().await, b.client().await);
    let content = Content::new(56, 3 * MIB + 7);
    let entry = blobs::held_entry(&ca, "cold", content, "cold.so").await;
    ca.snapshot().await.expect("a publishes");
    cb.snapshot().await.expect("b loads");
    let before = b.stats().await;
    assert_eq!(
        (before.artifact_blobs_held, before.artifact_handoffs),
        (0, 0),
        "b holds the blob before it is asked for"
    );

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let written = cb.fetch_artifacts(&entry, &out).await.unwrap();
    assert!(
        std::fs::read(&written[0]).unwrap() == content.bytes(),
        "the bytes differ"
    );
    let stats = b.stats().await;
    assert_eq!(
        (
            stats.artifact_fetches_shared_dir,
            stats.artifact_handoffs,
            stats.artifact_fetches_local,
            stats.artifact_blobs_held
        ),
        (1, 1, 1, 1),
        "the cold blob was not handed on its first fetch"
    );
}

/// A handoff socket that hands `content` from a file of its own and counts the connections it
/// accepted; it takes the place of the daemon's at `path`.
struct CountingHandoff {
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingHandoff {
    fn serve(path: &Path, content: Content, file: &Path) -> CountingHandoff {
        use std::os::fd::AsRawFd;
        std::fs::write(file, content.bytes()).unwrap();
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (counted, file) = (accepted.clone(), file.to_path_buf());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let file = file.clone();
                std::thread::spawn(move || {
                    let mut request = [0u8; tunecache_proto::handoff::REQUEST_BYTES];
                    while stream.read_exact(&mut request).is_ok() {
                        let asked = std::str::from_utf8(&request[..64]).unwrap_or("");
                        if asked != content.digest() {
                            let _ = stream.write_all(b"not-held\n");
                            continue;
                        }
                        let blob = std::fs::File::open(&file).unwrap();
                        let line = format!("held {}\n", content.size);
                        let fds = [blob.as_raw_fd()];
                        let sent = nix::sys::socket::sendmsg::<()>(
                            stream.as_raw_fd(),
                            &[std::io::IoSlice::new(line.as_bytes())],
                            &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
                            nix::sys::socket::MsgFlags::empty(),
                            None,
                        );
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        CountingHandoff { accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A process keeps one handoff connection per socket and takes every blob on it, whichever
/// call, clone or client asks: no connection (and accept, and peer check) per blob.
#[tokio::test]
async fn a_process_takes_every_blob_on_one_handoff_connection() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path()).in_process().await;
    let client = daemon.client().await;
    let content = Content::new(57, MIB + 5);
    let entry = blobs::held_entry(&client, "reused", content, "k.so").await;
    let counting = CountingHandoff::serve(
        &socket_path(&daemon.socket),
        content,
        &dir.path().join("handed-blob"),
    );

    for _ in 0..3 {
        let mut got = Vec::new();
        client
            .get_artifact(&content.digest(), &mut got)
            .await
            .unwrap();
        assert!(got == content.bytes(), "the bytes differ");
    }
    let mut got = Vec::new();
    client
        .clone()
        .get_artifact(&content.digest(), &mut got)
        .await
        .unwrap();
    let other_client = daemon.client().await;
    for round in 0..2 {
        let out = dir.path().join(format!("out-{round}"));
        std::fs::create_dir(&out).unwrap();
        let written = other_client.fetch_artifacts(&entry, &out).await.unwrap();
        assert!(std::fs::read(&written[0]).unwrap() == content.bytes());
    }
    // Every blob was handed (none streamed), all on the one connection.
    assert_eq!(daemon.stats().await.artifact_fetches_local, 0);
    assert_eq!(counting.accepted(), 1, "a handoff connection per call");
}
