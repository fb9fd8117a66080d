//! The srun wrapper (`deploy/slurm/tunecache-srun.sh`) on a real single-node Slurm (see
//! `tunecache_integration::slurm`): one daemon per node, stopped by SIGTERM to the daemon
//! alone, quietly, nothing left in /tmp; a squatted socket directory fails the start; a daemon
//! that stops before it serves is explained in the job's output (its error, its log's path)
//! without srun's interrupt lines; the state directory is the user's alone.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use tunecache_integration::slurm::{repo_root, text, wrapper_dir, Slurm, SlurmOptions, JOB_UID};
use tunecache_integration::slurm_jobs::{node_log, wait_for_file, JOB_LIMIT, PUT_FROM_EVERY_TASK};
use tunecache_integration::{bin, daemon_pids_on};

/// A batch script that starts the wrapper, waits (bounded) for `peer`'s job to be up too, so
/// that two such jobs overlap, records from every task and stops the daemons.
fn wrapper_job(peer: &str, me: &str) -> String {
    let wrapper = repo_root().join("deploy/slurm/tunecache-srun.sh");
    format!(
        "#!/bin/bash\nsource {} || exit 1\n\
         echo \"daemons: $(pgrep -c -f -- \"tunecached --socket $TUNECACHE_SOCKET\")\"\n\
         touch $WORK/{me}.up\n\
         for _ in $(seq 1 300); do [[ -e $WORK/{peer}.up ]] && break; sleep 0.1; done\n\
         {} {me}\n\
         tunecache_stop\n\
         echo \"socket after stop: $(test -S \"$TUNECACHE_SOCKET\" && echo present || echo absent)\"\n",
        wrapper.display(),
        PUT_FROM_EVERY_TASK.replace("$0", me)
    )
}

#[test]
fn the_srun_wrapper_starts_one_daemon_per_node_and_stops_it_with_sigterm() {
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let work = slurm.work.display().to_string();
    let state = slurm.work.join("state").display().to_string();
    let env = [
        ("WORK", work.as_str()),
        ("TUNECACHE_STATE_DIR", state.as_str()),
    ];
    // Two jobs of 2 tasks each on the one node, at the same time, with one state directory.
    let first = slurm.submit("w1", &wrapper_job("w2", "w1"), &["-n2"], &env);
    let second = slurm.submit("w2", &wrapper_job("w1", "w2"), &["-n2"], &env);
    let outputs = [
        slurm.wait_done(first, JOB_LIMIT),
        slurm.wait_done(second, JOB_LIMIT),
    ];
    for (job, output) in [first, second].iter().zip(&outputs) {
        assert!(
            output.contains("daemons: 1\n"),
            "job {job} did not start exactly one daemon: {output}"
        );
        assert_eq!(
            output.matches("stored").count(),
            2,
            "job {job}'s records: {output}"
        );
        assert!(
            output.contains("socket after stop: absent"),
            "job {job}: {output}"
        );
        assert!(
            daemon_pids_on(&wrapper_dir(*job)).is_empty(),
            "job {job}'s daemon is left"
        );
        // Quiet: no CANCELLED line from slurmstepd, no cpu-bind warning from srun.
        for line in output.lines() {
            let lower = line.to_lowercase();
            assert!(
                !lower.contains("error")
                    && !lower.contains("cancelled")
                    && !lower.contains("cpu binding"),
                "job {job}'s output has a complaint: {line}\n{output}"
            );
        }
        assert!(
            !wrapper_dir(*job).exists(),
            "job {job} left {} behind",
            wrapper_dir(*job).display()
        );
    }
    // Both daemons logged to the node's state directory: each stopped by SIGTERM, and each
    // stopped its tuner itself (no warning that it died).
    let log = node_log(&slurm.work.join("state"));
    assert_eq!(
        (
            log.matches("SIGTERM received").count(),
            log.matches("tunecached stopped").count()
        ),
        (2, 2),
        "the daemons were not both stopped by SIGTERM: {log}"
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("\"WARN\"") || line.contains("\"ERROR\""))
        .collect();
    assert!(warnings.is_empty(), "the daemons complained: {warnings:#?}");
    // The state directory is shared safely: the job that came second journals on its own.
    let private = outputs
        .iter()
        .filter(|output| output.contains("belongs to another job's daemon"))
        .count();
    assert_eq!(
        private, 1,
        "exactly one job should have found the state directory taken: {outputs:?}"
    );
    let node_dirs: Vec<_> = std::fs::read_dir(slurm.work.join("state"))
        .unwrap()
        .collect();
    assert_eq!(node_dirs.len(), 1, "one state directory per node");
}

#[test]
fn a_squatted_wrapper_socket_directory_fails_the_start_and_no_rank_reaches_the_squatter() {
    const SQUATTER: &str = "4242";
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let wrapper = repo_root().join("deploy/slurm/tunecache-srun.sh");
    let script = format!(
        "#!/bin/bash\nif source {}; then echo 'wrapper: started'; else echo 'wrapper: failed'; fi\n\
         srun -n1 tunecache put --namespace squat --op o --device d --problem p --config '{{\"secret\":1}}' --time-us 1\n\
         echo \"put: $?\"\n",
        wrapper.display()
    );
    // Held, so the squatter can take the job's predictable directory before it starts.
    let job = slurm.submit("squatted", &script, &["-n1", "--hold"], &[]);
    let dir = wrapper_dir(job);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    nix::unistd::chown(
        &dir,
        Some(nix::unistd::Uid::from_raw(4242)),
        Some(nix::unistd::Gid::from_raw(4242)),
    )
    .unwrap();
    let socket = dir.join("tunecache.sock");
    let mut squatter = Command::new("setpriv")
        .args(["--reuid", SQUATTER, "--regid", SQUATTER, "--clear-groups"])
        .arg(bin("tunecached"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join("squatter-state"))
        .args(["--allow-uid", &JOB_UID.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&socket, JOB_LIMIT);
    // Open to everyone, as a squatter would leave it (the daemon makes it 0660).
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let release = slurm
        .command("scontrol")
        .args(["release", &job.to_string()])
        .output()
        .unwrap();
    assert!(
        release.status.success(),
        "scontrol release: {}",
        text(&release)
    );
    let output = slurm.wait_done(job, JOB_LIMIT);

    assert!(
        output.contains("wrapper: failed"),
        "the wrapper started on a squatted directory: {output}"
    );
    assert!(
        output.contains(&format!(
            "{} exists and is not this user's private directory (owner uid {SQUATTER}, mode 777",
            dir.display()
        )),
        "the failure does not name the directory and its owner: {output}"
    );
    // The squatter's directory is not this user's to remove: they are told what they can do.
    assert!(
        output.contains("Set TUNECACHE_SOCKET_DIR") && !output.contains("Remove it"),
        "{output}"
    );
    assert!(
        output.contains("refusing the daemon") && output.contains("put: 2"),
        "the rank's client did not refuse the squatter's daemon: {output}"
    );
    let stats = Command::new(bin("tunecache"))
        .arg("--socket")
        .arg(&socket)
        .args(["--json", "stats"])
        .env("TUNECACHE_TRUST_UID", SQUATTER)
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("squatter's stats");
    assert_eq!(
        (stats["records"].as_u64(), stats["lookups"].as_u64()),
        (Some(0), Some(0)),
        "a rank reached the squatter's daemon: {stats}"
    );
    let _ = squatter.kill();
    let _ = squatter.wait();
}

#[test]
fn the_srun_wrapper_without_a_writable_home_journals_in_the_job_directory() {
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let wrapper = repo_root().join("deploy/slurm/tunecache-srun.sh");
    let job = slurm.submit(
        "homeless",
        &format!(
            "#!/bin/bash\nsource {} || exit 1\n\
             {} homeless\ntunecache_stop\necho stopped\n",
            wrapper.display(),
            PUT_FROM_EVERY_TASK.replace("$0", "homeless")
        ),
        &["-n2"],
        &[("HOME", "/nonexistent")],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    assert_eq!(output.matches("stored").count(), 2, "{output}");
    assert!(
        output.contains("this job journals in") && output.contains("stopped"),
        "{output}"
    );
    assert!(!wrapper_dir(job).exists(), "the job's directory is left");
}

#[test]
fn a_daemon_that_stops_before_it_serves_is_explained_in_the_jobs_output() {
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let wrapper = repo_root().join("deploy/slurm/tunecache-srun.sh");
    let state = slurm.work.join("bad-flag-state");
    let state_text = state.display().to_string();
    let job = slurm.submit(
        "bad-flag",
        &format!(
            "#!/bin/bash\nif source {}; then echo 'wrapper: started'; else echo 'wrapper: failed'; fi\n",
            wrapper.display()
        ),
        &["-n2"],
        &[
            ("TUNECACHE_DAEMON_FLAGS", "--fsync sometimes"),
            ("TUNECACHE_STATE_DIR", state_text.as_str()),
        ],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    assert!(output.contains("wrapper: failed"), "{output}");
    let log = state.join(&slurm.node).join("tunecached.log");
    for wanted in [
        "tunecached exited with status 2 before it served".to_owned(),
        format!("its last lines ({}):", log.display()),
        "invalid value 'sometimes' for '--fsync".to_owned(),
        "tunecached is not serving on every node".to_owned(),
    ] {
        assert!(
            output.contains(&wanted),
            "no {wanted:?} in the job's output:\n{output}"
        );
    }
    for noise in [
        "srun: interrupt",
        "forcing job termination",
        "Exited with exit code",
    ] {
        assert!(
            !output.contains(noise),
            "{noise:?} in the job's output:\n{output}"
        );
    }
    assert!(!wrapper_dir(job).exists(), "the job's directory is left");
}

#[test]
fn the_wrappers_state_directory_is_the_users_alone() {
    const OTHER_USER: &str = "4243";
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let wrapper = repo_root().join("deploy/slurm/tunecache-srun.sh");
    // Where a home's ~/.local/state/tunecache would be, made as users' homes are (0755).
    let base = slurm.work.join("home-state");
    let base_text = base.display().to_string();
    let job = slurm.submit(
        "private",
        &format!(
            "#!/bin/bash\nsource {} || exit 1\n{} private\ntunecache_stop\n",
            wrapper.display(),
            PUT_FROM_EVERY_TASK.replace("$0", "private")
        ),
        &["-n1"],
        &[("TUNECACHE_STATE_DIR", base_text.as_str())],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    assert!(output.contains("stored"), "{output}");
    let node_dir = base.join(&slurm.node);
    let mode = std::fs::metadata(&node_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}: mode {mode:o}", node_dir.display());
    // Another user reads neither the journal nor the daemon's log, nor lists the directory.
    for args in [
        vec!["ls", node_dir.to_str().unwrap()],
        vec!["cat", node_dir.join("tunecached.log").to_str().unwrap()],
        vec!["sh", "-c", &format!("cat {}/*", node_dir.display())],
    ] {
        let read = Command::new("setpriv")
            .args([
                "--reuid",
                OTHER_USER,
                "--regid",
                OTHER_USER,
                "--clear-groups",
            ])
            .args(&args)
            .output()
            .unwrap();
        assert!(
            !read.status.success(),
            "another user ran {args:?}: {}",
            text(&read)
        );
    }
    // A directory an earlier wrapper made 0755 is made private at the next start.
    std::fs::set_permissions(&node_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = slurm.submit(
        "private-again",
        &format!(
            "#!/bin/bash\nsource {} || exit 1\ntunecache_stop\n",
            wrapper.display()
        ),
        &["-n1"],
        &[("TUNECACHE_STATE_DIR", base_text.as_str())],
    );
    slurm.wait_done(job, JOB_LIMIT);
    let mode = std::fs::metadata(&node_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}: mode {mode:o}", node_dir.display());
}
