//! The shared blob directory `v2/artifacts/` under many users, with real uids (daemons started
//! through `setpriv`) on one shared directory set up as docs/launchers.md says: a user who
//! makes `v2/artifacts/` before any daemon, or plants names where blobs are looked for, can
//! neither silence a node's publishing nor keep a blob from the other nodes; it is reported,
//! each failure counted and shown in health; and no user's daemon owns the directory every
//! user's blobs live in.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tonic_health::pb::health_check_response::ServingStatus;
use tunecache_integration::blobs::Content;
use tunecache_integration::eventually_blocking;
use tunecache_integration::shared_users::{
    as_user, make_roots, make_sticky_v2, setup, UserDaemon, LIMIT, SITE,
};

/// The daemon's user, an attacker and a bystander: allowed, non-admin uids.
const DAVE: u32 = 4310;
const MALLORY: u32 = 4311;
const BOB: u32 = 4312;
/// Stats: names squatted where blobs are looked for.
const SQUATTED: &str = "artifact_shared_dir_squatted";

/// Writes `content` to `root/<name>` (readable by root's CLI) and answers `NAME=PATH`.
fn artifact_file(root: &Path, name: &str, content: Content) -> String {
    let path = root.join(name);
    std::fs::write(&path, content.bytes()).unwrap();
    format!("{name}={}", path.display())
}

/// The snapshots health of `daemon`, asked by root.
fn snapshots_health(daemon: &UserDaemon) -> i32 {
    std::env::set_var("TUNECACHE_TRUST_UID", format!("{DAVE},{MALLORY},{BOB}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        let channel = tunecache_client::connect_channel(&daemon.socket())
            .await
            .unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "tunecache.v1.TuneCache/snapshots".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    })
}

/// `daemon` fetches `problem`'s artifacts into a new directory and they are `contents`, byte
/// for byte; or the CLI's output when it cannot.
fn fetched(
    daemon: &UserDaemon,
    root: &Path,
    problem: &str,
    contents: &[(&str, Content)],
) -> Result<(), String> {
    let dir = tempfile::tempdir_in(root).unwrap();
    let output = daemon.fetch_artifacts(problem, dir.path());
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    for (name, content) in contents {
        let got = std::fs::read(dir.path().join(name)).map_err(|e| format!("{name}: {e}"))?;
        assert!(got == content.bytes(), "{name}: other bytes were served");
    }
    Ok(())
}

fn log_lines(daemon: &UserDaemon, needles: &[&str]) -> usize {
    daemon
        .log()
        .lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .count()
}

/// Finding 1: another user made `v2/artifacts/` before any daemon. The node still publishes
/// every entry, the blob's failure is counted, named, logged once and shown in health, the
/// other node's NOT_FOUND says what is true, and once the administrator makes the directory
/// the blob goes out without anything new to publish.
#[test]
fn a_squatted_blob_directory_is_reported_and_every_entry_is_still_published() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    let v2 = make_sticky_v2(&shared);
    let blobs = v2.join("artifacts");
    let made = as_user(MALLORY, "mkdir", &["-m", "755", blobs.to_str().unwrap()]);
    assert!(made.status.success(), "{made:?}");

    let dave = UserDaemon::start(root, DAVE, "dave-1", &shared, &[]);
    let content = Content::new(50, 70_000);
    dave.put("plain");
    dave.put_with("with-blob", &[artifact_file(root, "k.so", content)]);
    eventually_blocking(LIMIT, "dave's node publishes both entries", || {
        dave.counter("own_entries_published") == 2
    });
    eventually_blocking(
        LIMIT,
        "the refused blob directory is counted and named",
        || {
            let error = dave.text("last_snapshot_error");
            dave.counter("snapshot_errors") >= 1
                && error.contains("v2/artifacts")
                && error.contains(&format!("owned by uid {MALLORY}"))
        },
    );
    assert!(dave.counter(SQUATTED) >= 1, "{}", dave.stats());
    eventually_blocking(LIMIT, "dave's node shows it in health", || {
        snapshots_health(&dave) == ServingStatus::NotServing as i32
    });
    // Retried every pass, logged once.
    let passes = dave.counter("snapshot_passes");
    eventually_blocking(LIMIT, "a few passes more", || {
        dave.counter("snapshot_passes") >= passes + 3
    });
    assert_eq!(
        log_lines(&dave, &["refusing to use", "artifacts"]),
        1,
        "{}",
        dave.log()
    );

    // Dave's other node gets both entries; the blob is nowhere, and it says so.
    let dave_next = UserDaemon::start(root, DAVE, "dave-2", &shared, &[]);
    eventually_blocking(LIMIT, "dave's next node gets both entries", || {
        dave_next.holds("plain") && dave_next.holds("with-blob")
    });
    let refused = fetched(&dave_next, root, "with-blob", &[("k.so", content)]).unwrap_err();
    assert!(
        refused.contains("no tier could give a blob with this digest")
            && !refused.contains("held by no entry"),
        "{refused}"
    );

    // The administrator makes it as the docs say: the pending blob goes out, nothing new
    // recorded.
    std::fs::remove_dir(&blobs).unwrap();
    make_roots(&blobs, 0o1777);
    eventually_blocking(LIMIT, "dave's next node serves the right bytes", || {
        fetched(&dave_next, root, "with-blob", &[("k.so", content)]).is_ok()
    });
    eventually_blocking(LIMIT, "dave's node is healthy again", || {
        snapshots_health(&dave) == ServingStatus::Serving as i32
    });
}

/// Finding 2: names planted where a blob would go (wrong bytes, a symbolic link to
/// /etc/shadow, a FIFO, a 100 GiB sparse file under the flat names older daemons used, and
/// the publisher's own `<uid>/` made by another user) are reported, never obeyed: every entry
/// is published and the other node serves the right bytes of every blob.
#[test]
fn planted_names_are_reported_and_never_keep_a_blob_from_the_other_nodes() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    let v2 = make_sticky_v2(&shared);
    let blobs = make_roots(&v2.join("artifacts"), 0o1777);
    let contents: Vec<(String, Content)> = (0..4)
        .map(|i| (format!("k{i}.so"), Content::new(60 + i, 40_000 + i)))
        .collect();
    let planted = |i: usize| blobs.join(contents[i].1.digest());
    let wrong = root.join("wrong");
    std::fs::write(&wrong, Content::new(99, contents[0].1.size).bytes()).unwrap();
    let as_mallory = |program: &str, args: &[&str]| {
        let done = as_user(MALLORY, program, args);
        assert!(done.status.success(), "{program} {args:?}: {done:?}");
    };
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    as_mallory("cp", &[wrong.to_str().unwrap(), &path(&planted(0))]);
    as_mallory("ln", &["-s", "/etc/shadow", &path(&planted(1))]);
    as_mallory("mkfifo", &[&path(&planted(2))]);
    as_mallory("truncate", &["-s", "100G", &path(&planted(3))]);
    let dave_dir = blobs.join(DAVE.to_string());
    as_mallory("mkdir", &["-m", "755", &path(&dave_dir)]);
    as_mallory(
        "cp",
        &[
            wrong.to_str().unwrap(),
            &path(&dave_dir.join(contents[0].1.digest())),
        ],
    );

    let dave = UserDaemon::start(root, DAVE, "dave-1", &shared, &[]);
    dave.put("plain");
    for (i, (name, content)) in contents.iter().enumerate() {
        dave.put_with(&format!("blob-{i}"), &[artifact_file(root, name, *content)]);
    }
    eventually_blocking(LIMIT, "dave's node publishes every entry", || {
        dave.counter("own_entries_published") == 5
    });
    let dave_next = UserDaemon::start(root, DAVE, "dave-2", &shared, &[]);
    for (i, (name, content)) in contents.iter().enumerate() {
        let problem = format!("blob-{i}");
        eventually_blocking(LIMIT, format!("dave's next node gets {problem}"), || {
            dave_next.holds(&problem)
        });
        let got = fetched(&dave_next, root, &problem, &[(name, *content)]);
        assert!(got.is_ok(), "{problem}: {got:?}");
    }
    // The squatted `<uid>/` is reported once, by name, and costs no error.
    assert!(dave.counter(SQUATTED) >= 1, "{}", dave.stats());
    assert_eq!(
        log_lines(&dave, &["squatted", &format!("artifacts/{DAVE}")]),
        1,
        "{}",
        dave.log()
    );
    assert_eq!(dave.counter("snapshot_errors"), 0, "{}", dave.stats());
    assert_eq!(snapshots_health(&dave), ServingStatus::Serving as i32);
    // None of the planted names was replaced or followed.
    assert!(std::fs::symlink_metadata(planted(1))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::metadata(planted(3)).unwrap().uid(), MALLORY);
}

/// Finding 3: no user's daemon makes `v2/artifacts/`, which would be that user's (free to
/// delete every other user's blobs, or lock them out); one an older daemon made is refused by
/// every user's daemon; in the one the administrator makes, each user's blobs are safe from
/// the others.
#[test]
fn no_users_daemon_owns_the_blob_directory_of_every_user() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    let v2 = make_sticky_v2(&shared);
    let blobs = v2.join("artifacts");
    let dave = UserDaemon::start(root, DAVE, "dave-1", &shared, &[]);
    let dave_blob = Content::new(70, 30_000);
    dave.put_with("dave-blob", &[artifact_file(root, "d.so", dave_blob)]);
    eventually_blocking(LIMIT, "dave's node publishes its entry", || {
        dave.counter("own_entries_published") == 1
    });
    eventually_blocking(
        LIMIT,
        "dave's node says who must make the blob directory",
        || {
            let error = dave.text("last_snapshot_error");
            error.contains("install -d -m 1777 -o root -g root") && error.contains("v2/artifacts")
        },
    );
    assert!(
        !blobs.exists(),
        "a user's daemon made v2/artifacts/: {:?}",
        std::fs::metadata(&blobs).map(|m| (m.uid(), m.mode()))
    );

    // As an older daemon made it: dave's, shared and sticky. Bob's daemon refuses it, and so
    // does dave's own.
    make_roots(&blobs, 0o1777);
    std::os::unix::fs::chown(&blobs, Some(DAVE), Some(DAVE)).unwrap();
    let bob = UserDaemon::start(root, BOB, "bob-1", &shared, &[]);
    let bob_blob = Content::new(71, 20_000);
    bob.put_with("bob-blob", &[artifact_file(root, "b.so", bob_blob)]);
    for (daemon, why) in [
        (&bob, format!("owned by uid {DAVE}")),
        (&dave, "mode 1777".to_owned()),
    ] {
        eventually_blocking(
            LIMIT,
            format!("{} refuses dave's blob directory", daemon.node),
            || {
                let error = daemon.text("last_snapshot_error");
                error.contains("refusing to use")
                    && error.contains("artifacts")
                    && error.contains(&why)
            },
        );
    }
    eventually_blocking(LIMIT, "bob's node publishes its entry", || {
        bob.counter("own_entries_published") == 1
    });

    // Made the administrator's as docs/launchers.md says: each user's blobs in a directory of
    // that user's, which nobody else can remove or rename.
    std::os::unix::fs::chown(&blobs, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bob_file = blobs.join(BOB.to_string()).join(bob_blob.digest());
    let dave_file = blobs.join(DAVE.to_string()).join(dave_blob.digest());
    eventually_blocking(LIMIT, "both blobs are published", || {
        bob_file.is_file() && dave_file.is_file()
    });
    assert_eq!(std::fs::metadata(&bob_file).unwrap().uid(), BOB);
    // Private by default: bob's blobs are bob's alone to read (issue 56, finding 5).
    let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o7777;
    assert_eq!(
        (mode(&blobs.join(BOB.to_string())), mode(&bob_file)),
        (0o700, 0o600),
        "bob's blob directory and blob"
    );
    let read = as_user(DAVE, "cat", &[bob_file.to_str().unwrap()]);
    assert!(!read.status.success(), "dave read bob's blob: {read:?}");
    let removed = as_user(DAVE, "rm", &["-f", bob_file.to_str().unwrap()]);
    let renamed = as_user(
        DAVE,
        "mv",
        &[
            blobs.join(BOB.to_string()).to_str().unwrap(),
            blobs.join("taken").to_str().unwrap(),
        ],
    );
    assert!(
        !removed.status.success() && !renamed.status.success() && bob_file.is_file(),
        "dave took bob's blob: {removed:?} {renamed:?}"
    );
    let bob_next = UserDaemon::start(root, BOB, "bob-2", &shared, &[]);
    eventually_blocking(LIMIT, "bob's next node serves bob's blob", || {
        bob_next.holds("bob-blob")
            && fetched(&bob_next, root, "bob-blob", &[("b.so", bob_blob)]).is_ok()
    });

    // A site-wide daemon (`--shared-dir-public`) publishes for every user to read.
    let site = UserDaemon::start(root, SITE, "site-1", &shared, &["--shared-dir-public"]);
    let site_blob = Content::new(72, 10_000);
    site.put_with("site-blob", &[artifact_file(root, "s.so", site_blob)]);
    let site_file = blobs.join(SITE.to_string()).join(site_blob.digest());
    eventually_blocking(LIMIT, "the site daemon's blob is published", || {
        site_file.is_file()
    });
    assert_eq!(
        (mode(&blobs.join(SITE.to_string())), mode(&site_file)),
        (0o755, 0o644),
        "the site daemon's blob directory and blob"
    );
    let read = as_user(BOB, "cat", &[site_file.to_str().unwrap()]);
    assert!(
        read.status.success(),
        "bob could not read the site's blob: {read:?}"
    );
}
