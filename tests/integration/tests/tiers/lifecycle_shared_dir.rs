//! Last uses across the shared directory (docs/lifecycle.md, docs/snapshot-format.md): a key
//! read only on node B is kept on node A too, because B's use travels in B's next segment,
//! and a key read on neither expires on both.
//!
//! The days have to differ, so the daemons run under `faketime` (libfaketime) with their
//! clocks moved on: day 0 A records, day 20 B's rank reads one key, day 40 both judge with
//! `--retain-days 30`. Without the use from B, A's copy would have expired by its own record
//! date. libfaketime (the `faketime` package) is required: a missing one fails the test, which
//! cannot run without it. It is preloaded into the daemon itself (`LD_PRELOAD`, `FAKETIME`)
//! rather than run through the `faketime` command, which forks and would not pass signals on.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tunecache_client::{proto, Client};
use tunecache_integration::{bin, entry, eventually, test_key};

const LIMIT: Duration = Duration::from_secs(30);

/// libfaketime, where the `faketime` package puts it; the test fails without it.
fn libfaketime() -> PathBuf {
    let lib_dirs = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|dir| Some(dir.ok()?.path()))
        .chain(["/usr/local/lib".into(), "/usr/lib64".into()]);
    lib_dirs
        .map(|dir| dir.join("faketime").join("libfaketime.so.1"))
        .find(|candidate| candidate.is_file())
        .expect("libfaketime is required for this test: apt-get install faketime")
}

/// A `tunecached` process whose clock runs `days_ahead` days ahead of the real one; killed if
/// still running when dropped.
struct FakedNode {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl FakedNode {
    /// Starts node `name` (state in `root/name`) on `shared`, and waits until it serves.
    async fn start(root: &Path, shared: &Path, name: &str, days_ahead: u32) -> FakedNode {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("tunecache.sock");
        let log = dir.join("daemon.log");
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin("tunecached"))
            .env("LD_PRELOAD", libfaketime())
            .env("FAKETIME", format!("+{days_ahead}d"))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--shared-dir")
            .arg(shared)
            .args(["--node-name", name, "--snapshot-interval", "1"])
            .args(["--retain-days", "30", "--lifecycle-flush-ms", "100"])
            .env_remove("TUNECACHE_SOCKET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn tunecached");
        let node = FakedNode { child, socket, log };
        let what = format!("{name} serving on day +{days_ahead}");
        eventually(LIMIT, &what, || async {
            match Client::connect(&node.socket).await {
                Ok(client) => client.stats().await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
        node
    }

    async fn client(&self) -> Client {
        Client::connect(&self.socket).await.expect("connect")
    }

    async fn stats(&self) -> proto::StatsResponse {
        self.client().await.stats().await.expect("Stats")
    }

    /// Reads what is new in the shared directory and publishes, now.
    async fn snapshot(&self) {
        let mut request = tonic::Request::new(proto::SnapshotRequest {});
        request.set_timeout(LIMIT);
        let client = self.client().await;
        let answered = client.raw().snapshot(request).await;
        answered.unwrap_or_else(|e| panic!("Snapshot RPC: {e}; log:\n{}", self.log()));
    }

    /// The problems of `keys` this node holds.
    async fn holds(&self, keys: &[proto::Key]) -> Vec<String> {
        let hits = self.client().await.lookup(keys.to_vec()).await.unwrap();
        let mut problems: Vec<String> = hits
            .into_iter()
            .filter_map(|hit| Some(hit.key?.problem))
            .collect();
        problems.sort();
        problems
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and waits for a clean exit.
    fn stop(mut self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit {status}; log:\n{}", self.log());
                return;
            }
            assert!(started.elapsed() < LIMIT, "no exit; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FakedNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_on_one_node_is_kept_on_every_node_and_one_read_nowhere_expires_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let read_on_b = test_key("gemm", "read-on-b");
    let read_nowhere = test_key("gemm", "read-nowhere");
    let keys = [read_on_b.clone(), read_nowhere.clone()];

    // Day 0: A records both keys; B learns them from A's segment.
    let a = FakedNode::start(root.path(), &shared, "node-a", 0).await;
    let b = FakedNode::start(root.path(), &shared, "node-b", 0).await;
    a.client()
        .await
        .record(vec![
            entry(read_on_b.clone(), r#"{"tile":1}"#, 1.0, "node-a"),
            entry(read_nowhere.clone(), r#"{"tile":2}"#, 1.0, "node-a"),
        ])
        .await
        .unwrap();
    a.snapshot().await;
    eventually(LIMIT, "B learns both keys", || async {
        b.stats().await.entries == 2
    })
    .await;
    let both = vec!["read-nowhere".to_owned(), "read-on-b".to_owned()];
    assert_eq!(a.holds(&keys).await, both);
    a.stop();
    b.stop();

    // Day 20: a rank reads one key on B only; B's next segment carries the use, and A,
    // which holds the key, takes the later day.
    let a = FakedNode::start(root.path(), &shared, "node-a", 20).await;
    let b = FakedNode::start(root.path(), &shared, "node-b", 20).await;
    assert_eq!(b.holds(&keys[..1]).await, vec!["read-on-b".to_owned()]);
    let published = b.client().await;
    eventually(LIMIT, "B publishes its use", || async {
        published
            .stats()
            .await
            .is_ok_and(|stats| stats.snapshot_last_uses_published >= 1)
    })
    .await;
    eventually(LIMIT, "A reads B's segment", || async {
        a.stats().await.peer_segments_loaded >= 1
    })
    .await;
    // A pass that began after the read has finished merging it (and journalled the day).
    a.snapshot().await;
    let segments: Vec<String> = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("node-b.") && name.ends_with(".seg.json"))
        .collect();
    assert_eq!(segments.len(), 1, "B published only its use: {segments:?}");
    let document: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared.join("v2").join(&segments[0])).unwrap())
            .unwrap();
    assert_eq!(document["entries"].as_array().map(Vec::len), Some(0));
    let used = document["used"].as_array().expect("a used list");
    assert_eq!(used.len(), 1, "{document}");
    assert_eq!(used[0]["problem"], "read-on-b");
    assert_eq!(used[0]["tuned_by"], "node-a", "the full entry travels");
    assert!(used[0]["last_used_day"].as_u64().is_some(), "{document}");
    a.stop();
    b.stop();

    // Day 40, retention 30 days: the key B read on day 20 lives on both nodes; the one
    // nobody read since day 0 is gone from both, and A's own segments, read back at start,
    // do not bring it back.
    let a = FakedNode::start(root.path(), &shared, "node-a", 40).await;
    let b = FakedNode::start(root.path(), &shared, "node-b", 40).await;
    for (name, node) in [("A", &a), ("B", &b)] {
        eventually(LIMIT, format!("{name} finishes a pass"), || async {
            node.stats().await.snapshot_passes >= 1
        })
        .await;
        node.snapshot().await;
    }
    for (name, node) in [("A", &a), ("B", &b)] {
        assert_eq!(
            node.holds(&keys).await,
            vec!["read-on-b".to_owned()],
            "{name} on day 40; log:\n{}",
            node.log()
        );
        assert_eq!(node.stats().await.entries, 1, "{name}");
    }
    a.stop();
    b.stop();
}
