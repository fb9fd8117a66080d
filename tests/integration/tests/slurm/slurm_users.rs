//! Many users on one node and one shared directory, on a real single-node Slurm (see
//! `tunecache_integration::slurm`), with the prolog's daemons of `nobody` and of a second real
//! user, and a site-wide daemon: each user's entries reach only that user's daemons and the
//! site daemon's reach both, however many passes a daemon makes over another user's segments
//! (counted, never squatting); a segment a user names after another's node is squatting,
//! counted and reported to LOG; each user's segments and journal are that user's alone to
//! read, the site daemon's segments everyone's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use tunecache_integration::slurm::{text, JobUser, Slurm, SlurmOptions};
use tunecache_integration::slurm_jobs::{line_after, JOB_LIMIT};
use tunecache_integration::{bin, eventually_blocking};

/// A valid segment named as `node`'s (sequence 16) with one entry `problem`, put into `v2`
/// by `user` (through `setpriv`, so the file is really theirs).
fn plant_segment(user: &JobUser, dir: &Path, v2: &Path, node: &str, problem: &str) {
    let document = serde_json::json!({
        "format": "tunecache-snapshot", "version": 2, "node": node,
        "first_seq": 16, "last_seq": 16, "written_at_unix_ms": 0, "entry_count": 1,
        "entries": [{"namespace": "users", "op": "gemm", "device": "d", "problem": problem,
                     "config": "{\"planted\":1}", "time_us": 0.5, "tuned_by": "planted",
                     "tuned_at_unix_ms": 1}]
    });
    let source = dir.join(format!("planted-{problem}.json"));
    std::fs::write(&source, serde_json::to_vec(&document).unwrap()).unwrap();
    let target = v2.join(format!("{node}.{0:016x}-{0:016x}.seg.json", 16));
    let copied = Command::new("setpriv")
        .args([
            "--reuid",
            &user.uid.to_string(),
            "--regid",
            &user.gid.to_string(),
        ])
        .args(["--clear-groups", "cp"])
        .arg(&source)
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "cp as {}: {}",
        user.name,
        text(&copied)
    );
}

/// A job script that waits for its daemon's sixth pass over the shared directory (past the
/// three after which a reader of the old rules gave up on a gap), then says which of
/// `problems` it has and prints its Stats.
fn probe_job(problems: &[&str]) -> String {
    let mut script = String::from(
        "#!/bin/bash\n\
         for _ in $(seq 1 300); do tunecache --json stats | grep -Eq '\"snapshot_passes\":([6-9]|[1-9][0-9])' && break; sleep 0.1; done\n",
    );
    for problem in problems {
        script += &format!(
            "tunecache get --namespace users --op gemm --device d --problem {problem} >/dev/null 2>&1 \
             && echo 'has {problem}' || echo 'lacks {problem}'\n"
        );
    }
    script + "echo \"stats: $(tunecache --json stats)\"\n"
}

fn stat_of(output: &str, name: &str) -> u64 {
    let stats: serde_json::Value = serde_json::from_str(&line_after(output, "stats:"))
        .unwrap_or_else(|e| panic!("stats in the job output ({e}): {output}"));
    stats[name].as_u64().unwrap_or(0)
}

#[test]
fn two_users_with_one_shared_dir_each_get_their_own_entries_and_the_site_daemons() {
    const SITE_UID: u32 = 4300;
    let dir = tempfile::Builder::new()
        .prefix("tc-slurm-users-")
        .tempdir_in("/tmp")
        .unwrap();
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
    };
    mode(dir.path(), 0o755);
    // As docs/launchers.md has the administrator set it up: root's, with every user's v2/
    // root's and sticky.
    let shared = dir.path().join("shared");
    let v2 = shared.join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    mode(&shared, 0o755);
    mode(&v2, 0o1777);
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        tunecache_settings: vec![
            format!("SHARED_DIR={}", shared.display()),
            format!("EXTRA_FLAGS=--shared-dir-writer-uid {SITE_UID} --snapshot-interval 1"),
        ],
        ..Default::default()
    }) else {
        return;
    };
    let bob = slurm.add_user();
    let nobody = JobUser::nobody();

    // A site-wide daemon (its own account) publishes a result every user may read.
    let site_home = dir.path().join("site");
    std::fs::create_dir(&site_home).unwrap();
    std::os::unix::fs::chown(&site_home, Some(SITE_UID), Some(SITE_UID)).unwrap();
    let site_socket = site_home.join("tunecache.sock");
    let mut site = Command::new("setpriv")
        .args([
            "--reuid",
            &SITE_UID.to_string(),
            "--regid",
            &SITE_UID.to_string(),
        ])
        .args(["--clear-groups", "--"])
        .arg(bin("tunecached"))
        .arg("--socket")
        .arg(&site_socket)
        .arg("--state-dir")
        .arg(site_home.join("state"))
        .arg("--shared-dir")
        .arg(&shared)
        .args([
            "--node-name",
            "site",
            "--tuner",
            "off",
            "--shared-dir-public",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let site_cli = |args: &[&str]| {
        Command::new(bin("tunecache"))
            .arg("--socket")
            .arg(&site_socket)
            .args(args)
            .env("TUNECACHE_TRUST_UID", SITE_UID.to_string())
            .output()
            .unwrap()
    };
    eventually_blocking(JOB_LIMIT, "the site daemon serves", || {
        site_cli(&["stats"]).status.success()
    });
    let put = site_cli(&[
        "put",
        "--namespace",
        "users",
        "--op",
        "gemm",
        "--device",
        "d",
        "--problem",
        "from-site",
        "--config",
        "{}",
        "--time-us",
        "1",
    ]);
    assert!(put.status.success(), "{}", text(&put));
    // Its last publish at shutdown puts the entry in v2/.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(site.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(site.wait().unwrap().success());

    // Both users run a job at once, each recording two entries of their own, published apart:
    // two segments each, so a reader that sets the first aside sees the second past it.
    let work = slurm.work.display().to_string();
    let env = [("WORK", work.as_str())];
    let first_job = |slurm: &mut Slurm, user: &JobUser, peer: &str| {
        slurm.submit_as(
            user,
            &format!("first-{}", user.name),
            &format!(
                "#!/bin/bash\ntouch $WORK/{me}.up\n\
                 for _ in $(seq 1 300); do [[ -e $WORK/{peer}.up ]] && break; sleep 0.1; done\n\
                 tunecache put --namespace users --op gemm --device d --problem by-{me} --config '{{}}' --time-us 1\n\
                 for _ in $(seq 1 100); do tunecache --json stats | grep -q '\"own_entries_published\":1,' && break; sleep 0.1; done\n\
                 tunecache put --namespace users --op gemm --device d --problem by-{me}-2 --config '{{}}' --time-us 1\n\
                 echo \"stats: $(tunecache --json stats)\"\n",
                me = user.name
            ),
            &["-n1"],
            &env,
        )
    };
    let nobody_first = first_job(&mut slurm, &nobody, &bob.name);
    let bob_first = first_job(&mut slurm, &bob, "nobody");
    let nobody_output = slurm.wait_done(nobody_first, JOB_LIMIT);
    let bob_output = slurm.wait_done(bob_first, JOB_LIMIT);
    assert!(nobody_output.contains("stored") && bob_output.contains("stored"));
    let stats: serde_json::Value =
        serde_json::from_str(&line_after(&nobody_output, "stats:")).unwrap();
    let nobody_node = stats["node_name"].as_str().unwrap().to_owned();

    // Bob names a segment after nobody's node, with an entry of his own.
    plant_segment(&bob, dir.path(), &v2, &nobody_node, "squatted");

    // Each user's next daemon: their own entry and the site's, nothing of the other user's.
    let problems = [
        "by-nobody".to_owned(),
        format!("by-{}", bob.name),
        "from-site".to_owned(),
        "squatted".to_owned(),
    ];
    let problems: Vec<&str> = problems.iter().map(String::as_str).collect();
    let nobody_next = slurm.submit_as(&nobody, "next-nobody", &probe_job(&problems), &["-n1"], &[]);
    let bob_next = slurm.submit_as(&bob, "next-bob", &probe_job(&problems), &["-n1"], &[]);
    let nobody_output = slurm.wait_done(nobody_next, JOB_LIMIT);
    let bob_output = slurm.wait_done(bob_next, JOB_LIMIT);
    for wanted in [
        "has by-nobody".to_owned(),
        "has from-site".to_owned(),
        format!("lacks by-{}", bob.name),
        "lacks squatted".to_owned(),
    ] {
        assert!(
            nobody_output.contains(&wanted),
            "nobody's next job: no {wanted:?}\n{nobody_output}"
        );
    }
    for wanted in [
        format!("has by-{}", bob.name),
        "has from-site".to_owned(),
        "lacks by-nobody".to_owned(),
    ] {
        assert!(
            bob_output.contains(&wanted),
            "bob's next job: no {wanted:?}\n{bob_output}"
        );
    }
    // The segment under nobody's name is counted, as a name conflict and as squatting.
    assert!(
        stat_of(&nobody_output, "snapshot_name_conflicts") >= 1
            && stat_of(&nobody_output, "snapshot_squatted_files") >= 1,
        "nobody's daemon did not count bob's segment under its name: {nobody_output}"
    );
    // Nobody's segments, however many passes bob's daemon made over them, are another user's
    // cache to it: counted, never squatting, never a restart.
    assert!(
        stat_of(&bob_output, "snapshot_untrusted_files") >= 2
            && stat_of(&bob_output, "snapshot_squatted_files") == 0,
        "bob's daemon: {bob_output}"
    );
    let bob_log = std::fs::read_to_string(slurm.state_root.join(&bob.name).join("tunecached.log"))
        .unwrap_or_default();
    // (Bob's own planted segment, at 16, is his: his daemon reads it across the numbers
    // before it, which is no other user's doing.)
    for wrong in ["name squatting", "restarted numbering"] {
        assert!(
            !bob_log.contains(wrong),
            "bob's daemon logged {wrong:?}:\n{bob_log}"
        );
    }
    // Each user's segments are theirs alone to read; the site daemon's are everyone's.
    let segments = |node_prefix: &str, uid: u32| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&v2)
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(node_prefix) && n.ends_with(".seg.json"))
                    && std::fs::metadata(p).is_ok_and(|m| m.uid() == uid)
            })
            .collect()
    };
    let nobodys = segments(&format!("{nobody_node}."), nobody.uid);
    let sites = segments("site.", SITE_UID);
    assert!(!nobodys.is_empty() && !sites.is_empty());
    for (files, mode) in [(&nobodys, 0o600), (&sites, 0o644)] {
        for file in files {
            let found = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
            assert_eq!(found, mode, "{}: mode {found:o}", file.display());
        }
    }
    let as_bob = |file: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid",
                &bob.uid.to_string(),
                "--regid",
                &bob.gid.to_string(),
            ])
            .args(["--clear-groups", "cat"])
            .arg(file)
            .output()
            .unwrap()
    };
    assert!(
        !as_bob(&nobodys[0]).status.success(),
        "bob read nobody's segment"
    );
    assert!(
        as_bob(&sites[0]).status.success(),
        "bob cannot read the site daemon's segment"
    );
    // Neither nobody's state directory (journal, log) nor anything in it.
    let nobody_state = slurm.state_root.join("nobody");
    assert!(!as_bob(&nobody_state.join("tunecached.log"))
        .status
        .success());
    // LOG tells the administrator of the squatting under nobody's node, and of nothing else.
    let log = slurm.script_log();
    assert!(
        log.lines()
            .all(|line| line.contains("user nobody: tunecached")
                && line.contains("reports squatting")),
        "the prolog or epilog complained: {log}"
    );
}
