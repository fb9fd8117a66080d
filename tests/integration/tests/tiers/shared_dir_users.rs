//! One shared directory for many users, with real uids (daemons started through `setpriv`):
//! a root-owned sticky `v2/` (mode 1777) serves each user's daemons that user's own entries
//! and a site-wide daemon's, and nobody else's; a segment another user names after a node is
//! ignored and counted; nobody can remove another user's segment. A daemon never makes `v2/`
//! its own inside a directory every user may write, a last publish at shutdown names what
//! really stopped it, and a key file that is not private stops the start, as ssh refuses one.

use std::os::unix::fs::PermissionsExt;
use std::process::{Output, Stdio};

use tunecache_integration::eventually_blocking;
use tunecache_integration::shared_users::{
    as_user, make_sticky_v2, plant_segment, segments_of, setup, UserDaemon, ALICE, BOB, LIMIT, SITE,
};

#[test]
fn a_sticky_v2_serves_each_user_their_own_entries_and_the_site_daemons_and_counts_squatters() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    let v2 = make_sticky_v2(&shared);
    let site_uid = SITE.to_string();
    let trust_site = ["--shared-dir-writer-uid", site_uid.as_str()];
    let site = UserDaemon::start(root, SITE, "site", &shared, &[]);
    let alice = UserDaemon::start(root, ALICE, "alice-1", &shared, &trust_site);
    let bob = UserDaemon::start(root, BOB, "bob-1", &shared, &trust_site);
    site.put("from-site");
    alice.put("from-alice");
    bob.put("from-bob");
    for daemon in [&site, &alice, &bob] {
        eventually_blocking(LIMIT, format!("{} publishes", daemon.node), || {
            daemon.counter("own_entries_published") == 1
        });
    }
    eventually_blocking(
        LIMIT,
        "alice's daemon learns the site daemon's entry",
        || alice.holds("from-site"),
    );

    // Bob names segments after Alice's node and after the site daemon's.
    plant_segment(root, &v2, BOB, "alice-1", 0x10, "squat-alice");
    plant_segment(root, &v2, BOB, "site", 0x10, "squat-site");
    eventually_blocking(
        LIMIT,
        "alice's daemon counts the segment under its name",
        || {
            alice.counter("snapshot_name_conflicts") >= 1
                && alice.counter("snapshot_untrusted_files") >= 1
        },
    );
    // Nobody but a file's owner may remove or rename it in a sticky directory.
    let alice_segment = segments_of(&v2, "alice-1")
        .into_iter()
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == ALICE)
        })
        .expect("alice's own segment");
    let removed = as_user(BOB, "rm", &["-f", alice_segment.to_str().unwrap()]);
    assert!(!removed.status.success(), "bob removed alice's segment");
    assert!(alice_segment.exists());

    // Each user's next daemon (another node, a fresh state directory) gets that user's
    // entries and the site daemon's, and nothing of the other user's or planted.
    let alice_next = UserDaemon::start(root, ALICE, "alice-2", &shared, &trust_site);
    let bob_next = UserDaemon::start(root, BOB, "bob-2", &shared, &trust_site);
    eventually_blocking(
        LIMIT,
        "alice's next daemon gets alice's and the site's entries",
        || alice_next.holds("from-alice") && alice_next.holds("from-site"),
    );
    eventually_blocking(
        LIMIT,
        "bob's next daemon gets bob's and the site's entries",
        || bob_next.holds("from-bob") && bob_next.holds("from-site"),
    );
    for (daemon, foreign) in [
        (&alice, ["from-bob", "squat-alice", "squat-site"]),
        (&alice_next, ["from-bob", "squat-alice", "squat-site"]),
        // Bob's planted files are his own: his daemons may read them.
        (&bob_next, ["from-alice", "from-alice", "from-alice"]),
        (&site, ["from-alice", "from-bob", "squat-site"]),
    ] {
        for problem in foreign {
            assert!(!daemon.holds(problem), "{} serves {problem}", daemon.node);
        }
    }
    // Another user's segments are counted and said once; the squatted names are warned about
    // once for their owner, however many files.
    eventually_blocking(LIMIT, "alice's daemon counts both squatted names", || {
        alice.counter("snapshot_squatted_files") >= 2
            && alice.counter("snapshot_untrusted_files") >= 3
    });
    let log = alice.log();
    let squatting: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("name squatting"))
        .collect();
    assert!(
        squatting.len() == 1 && squatting[0].contains(&format!("uid {BOB}")),
        "alice's daemon did not warn once about bob's squatting:\n{log}"
    );
    assert!(
        !log.contains("skipped until the file changes") && !log.contains("bob-1."),
        "another user's segments were warned about one by one:\n{log}"
    );
}

#[test]
fn a_daemon_does_not_make_v2_its_own_in_a_directory_every_user_may_write() {
    let Some((root, shared)) = setup(0o1777) else {
        return;
    };
    let alice = UserDaemon::start(root.path(), ALICE, "alice-1", &shared, &[]);
    eventually_blocking(LIMIT, "alice's daemon says who must make v2/", || {
        alice.stats()["last_snapshot_error"]
            .as_str()
            .is_some_and(|e| e.contains("install -d -m 1777 -o root -g root"))
    });
    assert!(
        !shared.join("v2").exists(),
        "a user's daemon made v2/, which would lock every other user out"
    );
}

#[test]
fn the_last_publish_at_shutdown_names_why_the_shared_directory_was_refused() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    // Bob's daemon made v2/ its own 0755, as daemons did before v2/ was the admin's to make.
    let v2 = shared.join("v2");
    std::fs::create_dir(&v2).unwrap();
    std::os::unix::fs::chown(&v2, Some(BOB), Some(BOB)).unwrap();
    let mut alice = UserDaemon::start(root.path(), ALICE, "alice-1", &shared, &[]);
    alice.put("unpublished");
    eventually_blocking(LIMIT, "alice's daemon refuses bob's v2/", || {
        alice.stats()["last_snapshot_error"]
            .as_str()
            .is_some_and(|e| e.contains("refusing to use"))
    });
    assert!(alice.terminate().success());
    let log = alice.log();
    let last = log
        .lines()
        .find(|line| line.contains("last publish at shutdown"))
        .unwrap_or_else(|| panic!("no last publish line:\n{log}"));
    assert!(
        last.contains("refusing to use") && last.contains(&format!("owned by uid {BOB}")),
        "the last publish does not name the refused v2/: {last}"
    );
    assert!(!last.contains("has not finished"), "{last}");
}

#[test]
fn a_key_file_that_is_not_private_stops_the_start_naming_its_owner_and_mode() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    make_sticky_v2(&shared);
    let key = root.join("shared.key");
    std::fs::write(&key, "a-site-secret-of-32-bytes-012345\n").unwrap();
    let key_arg = key.to_str().unwrap();
    let start_as = |uid: u32, node: &str| -> Output {
        let home = root.join(node);
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        let mut command = UserDaemon::command(
            uid,
            &home,
            &shared,
            node,
            &["--shared-dir-key-file", key_arg],
        );
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A refused key stops the start at once; a daemon that serves is stopped here.
        eventually_blocking(LIMIT, format!("{node} exiting or serving"), || {
            child.try_wait().unwrap().is_some() || home.join("tunecache.sock").exists()
        });
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        child.wait_with_output().unwrap()
    };
    let refused = |output: &Output, names: &[&str]| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "started with the key: {stderr}");
        for name in names {
            assert!(
                stderr.contains(name),
                "the refusal does not say {name:?}: {stderr}"
            );
        }
    };

    // Readable by every user: whoever reads it can forge segments every node accepts.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = start_as(0, "root-644");
    refused(&output, &[key_arg, "owner uid 0, mode 0644", "chmod 600"]);
    // Private, but another user's.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(ALICE), Some(ALICE)).unwrap();
    let output = start_as(0, "root-alices");
    refused(
        &output,
        &[key_arg, &format!("owner uid {ALICE}, mode 0600")],
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let output = start_as(ALICE, "alice-640");
    refused(&output, &[key_arg, "mode 0640"]);
    // Private and the daemon's own: it serves.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let output = start_as(ALICE, "alice-600");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("a key must be private") && stderr.contains("tunecached stopped"),
        "a private key of its own was refused: {stderr}"
    );
}
