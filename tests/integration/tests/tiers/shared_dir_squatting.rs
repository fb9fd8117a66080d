//! Many users on one shared `v2/` over many passes, with real uids (daemons through
//! `setpriv`): another user's segments are counted, said once and never taken for name
//! squatting or a gap, however long a daemon runs; names another user plants in a node's own
//! numbering cost that node no republish and no hole; and each daemon's segments are its own
//! user's to read, the site-wide daemon's everyone's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tunecache_integration::shared_users::{
    as_user, make_sticky_v2, plant_segment, plant_segment_range, segments_of, setup, UserDaemon,
    ALICE, BOB, LIMIT, SITE,
};
use tunecache_integration::{eventually_blocking, wait, Lazy};

/// The passes after which a reader of the old rules gave up on a gap (`GAP_PASSES`), and
/// some more.
const MANY_PASSES: u64 = 6;

fn passes(daemon: &UserDaemon) -> u64 {
    daemon.counter("snapshot_passes")
}

/// Waits until `daemon` has made `more` passes over the shared directory from now.
fn wait_passes(daemon: &UserDaemon, more: u64) {
    let until = passes(daemon) + more;
    eventually_blocking(
        LIMIT,
        format!("{} makes {more} more passes", daemon.node),
        || passes(daemon) >= until,
    );
}

/// Puts `problem` and waits until it is in a segment of `daemon`'s.
fn put_and_publish(daemon: &UserDaemon, problem: &str) {
    let before = daemon.counter("own_entries_published");
    daemon.put(problem);
    let published = Lazy(|| format!("{} publishing {problem}:\n{}", daemon.node, daemon.log()));
    wait(LIMIT, published)
        .every(std::time::Duration::from_millis(100))
        .blocking(|| daemon.counter("own_entries_published") > before);
}

fn lines_with<'a>(log: &'a str, text: &str) -> Vec<&'a str> {
    log.lines().filter(|line| line.contains(text)).collect()
}

/// The segments under `node`'s name that `uid` owns.
fn owned_segments(v2: &Path, node: &str, uid: u32) -> Vec<PathBuf> {
    let mut owned: Vec<PathBuf> = segments_of(v2, node)
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == uid))
        .collect();
    owned.sort();
    owned
}

#[test]
fn other_users_segments_are_counted_and_never_squatting_however_many_passes() {
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
    // Two jobs each: two segments of every daemon's, so a reader that set the first aside
    // sees the second past it.
    for (daemon, first, second) in [
        (&site, "site-1", "site-2"),
        (&alice, "alice-a", "alice-b"),
        (&bob, "bob-a", "bob-b"),
    ] {
        put_and_publish(daemon, first);
        put_and_publish(daemon, second);
    }
    for daemon in [&site, &alice, &bob] {
        wait_passes(daemon, MANY_PASSES);
    }

    // Each user's entries reach that user's daemons only; the site daemon's reach both.
    for (daemon, has, lacks) in [
        (&alice, ["site-1", "site-2"], ["bob-a", "bob-b"]),
        (&bob, ["site-1", "site-2"], ["alice-a", "alice-b"]),
        (&site, ["site-1", "site-2"], ["alice-a", "bob-b"]),
    ] {
        for problem in has {
            eventually_blocking(LIMIT, format!("{} learns {problem}", daemon.node), || {
                daemon.holds(problem)
            });
        }
        for problem in lacks {
            assert!(!daemon.holds(problem), "{} serves {problem}", daemon.node);
        }
    }
    // Another user's files are counted, never squatting, never a gap or a restart, and
    // said once per owner however many there are.
    for (daemon, others) in [
        (&alice, vec![BOB]),
        (&bob, vec![ALICE]),
        (&site, vec![ALICE, BOB]),
    ] {
        let log = daemon.log();
        for wrong in [
            "name squatting",
            "restarted numbering",
            "are missing from the shared directory",
            "skipped until the file changes",
        ] {
            assert!(
                lines_with(&log, wrong).is_empty(),
                "{} logged {wrong:?}:\n{log}",
                daemon.node
            );
        }
        assert!(
            daemon.counter("snapshot_untrusted_files") >= 2 * others.len() as u64,
            "{}: {}",
            daemon.node,
            daemon.stats()
        );
        assert_eq!(
            daemon.counter("snapshot_squatted_files"),
            0,
            "{}",
            daemon.node
        );
        for uid in others {
            let said = lines_with(&log, &format!("files of uid {uid} in the shared v2/"));
            assert_eq!(said.len(), 1, "{} about uid {uid}:\n{log}", daemon.node);
            assert!(
                said[0].contains("\"level\":\"INFO\"") || said[0].contains(" INFO "),
                "{}",
                said[0]
            );
        }
    }

    // Private by default: each user's segments are theirs alone to read, the site daemon's
    // everyone's. Another user sees their names and sizes, nothing else.
    for (node, uid, mode) in [
        ("alice-1", ALICE, 0o600),
        ("bob-1", BOB, 0o600),
        ("site", SITE, 0o644),
    ] {
        let segments = owned_segments(&v2, node, uid);
        assert!(!segments.is_empty(), "no segment of {node}");
        for segment in segments {
            let found = std::fs::metadata(&segment).unwrap().permissions().mode() & 0o777;
            assert_eq!(found, mode, "{}: mode {found:o}", segment.display());
        }
    }
    let alices = owned_segments(&v2, "alice-1", ALICE);
    let read = as_user(BOB, "cat", &[alices[0].to_str().unwrap()]);
    assert!(!read.status.success(), "bob read alice's segment");
    let sites = owned_segments(&v2, "site", SITE);
    let read = as_user(BOB, "cat", &[sites[0].to_str().unwrap()]);
    assert!(
        read.status.success(),
        "bob cannot read the site daemon's segment: {read:?}"
    );
}

#[test]
fn names_planted_in_a_nodes_numbering_cost_it_no_republish_and_no_hole() {
    let Some((root, shared)) = setup(0o755) else {
        return;
    };
    let root = root.path();
    let v2 = make_sticky_v2(&shared);
    let mut alice = UserDaemon::start(root, ALICE, "alice-1", &shared, &[]);
    put_and_publish(&alice, "p1");
    put_and_publish(&alice, "p2");
    // Bob takes the name alice-1 would write next, and one reaching the last number a
    // segment name may have.
    plant_segment(root, &v2, BOB, "alice-1", 3, "bob-next");
    plant_segment_range(
        root,
        &v2,
        BOB,
        "alice-1",
        (4, u64::from(u32::MAX)),
        "bob-last",
    );
    wait_passes(&alice, 2);
    put_and_publish(&alice, "p3");
    let written = owned_segments(&v2, "alice-1", ALICE);
    assert_eq!(written.len(), 3, "{written:?}");

    // Three restarts on the same state directory: nothing is published again.
    for restart in 1..=3 {
        assert!(alice.terminate().success());
        alice = alice.restart(&shared, &[]);
        eventually_blocking(LIMIT, format!("restart {restart}: the first load"), || {
            passes(&alice) >= 2
        });
        assert_eq!(
            owned_segments(&v2, "alice-1", ALICE),
            written,
            "restart {restart} wrote segments again:\n{}",
            alice.log()
        );
        assert_eq!(
            alice.counter("own_entries_published"),
            3,
            "restart {restart}"
        );
    }

    // The node's next entries reach a daemon that never read it, with no gap waited out.
    put_and_publish(&alice, "p4");
    let next = UserDaemon::start(root, ALICE, "alice-2", &shared, &[]);
    for problem in ["p1", "p2", "p3", "p4"] {
        eventually_blocking(LIMIT, format!("alice-2 learns {problem}"), || {
            next.holds(problem)
        });
    }
    for problem in ["bob-next", "bob-last"] {
        assert!(
            !next.holds(problem) && !alice.holds(problem),
            "{problem} was read"
        );
    }
    let log = next.log();
    assert!(
        lines_with(&log, "are missing from the shared directory").is_empty(),
        "alice-2 found a hole in alice-1's numbering:\n{log}"
    );
    // The squatter under alice-1's own name is warned about once, and counted.
    assert!(
        alice.counter("snapshot_squatted_files") >= 2,
        "{}",
        alice.stats()
    );
    let log = alice.log();
    assert_eq!(
        lines_with(&log, "name squatting").len(),
        4,
        "one warning a run (the first and three restarts) about bob's files:\n{log}"
    );
}
