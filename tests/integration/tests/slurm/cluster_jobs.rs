//! The Slurm prolog and epilog of `deploy/slurm/` on a real single-node Slurm (munged,
//! slurmctld and slurmd started by the tests, see `tunecache_integration::slurm`), with jobs
//! run as `nobody`: one daemon for overlapping jobs, stopped after the last, entries kept in
//! the journal and in the shared directory by the time the epilog returns, a missing binary,
//! a refused settings file or a daemon that exits at once costing the job nothing, and an
//! upgraded binary still stopped. Markers and the idle exit: `slurm_markers`; many users:
//! `slurm_users`; the srun wrapper: `slurm_wrapper`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunecache_integration::slurm::{repo_root, text, Slurm, SlurmOptions};
use tunecache_integration::slurm_jobs::{
    line_after, wait_for_file, JOB_LIMIT, PUT_FROM_EVERY_TASK,
};
use tunecache_integration::{bin, copy_executable, daemon_pids_on};

#[test]
fn prolog_and_epilog_serve_overlapping_jobs_from_one_daemon_and_keep_their_entries() {
    let shared = tempfile::Builder::new()
        .prefix("tc-slurm-shared-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    // Every user's v2/, made by the administrator: root's, sticky (a user's daemon does not
    // make it in a directory every user may write).
    let v2 = shared.path().join("v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::set_permissions(&v2, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        tunecache_settings: vec![format!("SHARED_DIR={}", shared.path().display())],
        ..Default::default()
    }) else {
        return;
    };
    eprintln!("running {}", slurm.version);
    let socket_root = slurm.socket_root.display().to_string();
    let work = slurm.work.display().to_string();
    let env = [
        ("SOCKET_ROOT", socket_root.as_str()),
        ("WORK", work.as_str()),
    ];
    // As docs/launchers.md tells a user: the socket from $SLURM_JOB_USER.
    let preamble =
        "#!/bin/bash\nexport TUNECACHE_SOCKET=$SOCKET_ROOT/$SLURM_JOB_USER/tunecache.sock\n";
    let stats_pid = r#"tunecache --json stats | grep -o '"daemon_pid":[0-9]*'"#;

    // Job A records from 4 ranks, then stays until job B has come and gone.
    let job_a = slurm.submit(
        "a",
        &format!(
            "{preamble}{} job-a\ntouch $WORK/a.running\n\
             for _ in $(seq 1 600); do [[ -e $WORK/b.done ]] && break; sleep 0.1; done\n\
             echo \"daemon after b: $({stats_pid})\"\n",
            PUT_FROM_EVERY_TASK.replace("$0", "job-a")
        ),
        &["-n4"],
        &env,
    );
    wait_for_file(&slurm.work.join("a.running"), JOB_LIMIT);
    // Job B starts while A runs: its 4 ranks read A's entries and add their own.
    let job_b = slurm.submit(
        "b",
        &format!(
            "{preamble}{} job-b\n\
             srun bash -c 'tunecache get --namespace slurm --op gemm --device cpu --problem job-a-$SLURM_PROCID'\n\
             echo \"daemon in b: $({stats_pid})\"\n",
            PUT_FROM_EVERY_TASK.replace("$0", "job-b")
        ),
        &["-n4"],
        &env,
    );
    let output_b = slurm.wait_done(job_b, JOB_LIMIT);
    assert_eq!(
        output_b.matches("stored").count(),
        4,
        "job b's records: {output_b}"
    );
    for rank in 0..4 {
        assert!(
            output_b.contains(&format!("job-a-{rank} (shared): {{\"rank\":{rank}}}")),
            "job b did not read job a's rank {rank}: {output_b}"
        );
    }
    // B's epilog left the daemon: A still runs on this node.
    let socket = slurm.prolog_socket();
    assert_eq!(
        daemon_pids_on(&socket).len(),
        1,
        "one daemon while job a runs"
    );
    std::fs::write(slurm.work.join("b.done"), "").unwrap();
    let output_a = slurm.wait_done(job_a, JOB_LIMIT);
    assert_eq!(
        output_a.matches("stored").count(),
        4,
        "job a's records: {output_a}"
    );
    assert_eq!(
        line_after(&output_a, "daemon after b:"),
        line_after(&output_b, "daemon in b:"),
        "jobs a and b were not served by one daemon"
    );

    // The last epilog stopped the daemon, and its last publish put all 8 entries in the
    // shared directory before the epilog returned.
    assert!(
        daemon_pids_on(&socket).is_empty(),
        "a daemon is left after the last job: {:?}\n{}",
        daemon_pids_on(&socket),
        slurm.logs()
    );
    assert!(!socket.exists(), "the socket is left behind");
    let mut published = String::new();
    for file in std::fs::read_dir(shared.path().join("v2")).expect("the shared directory's v2/") {
        published += &std::fs::read_to_string(file.unwrap().path()).unwrap_or_default();
    }
    for job in ["job-a", "job-b"] {
        for rank in 0..4 {
            assert!(
                published.contains(&format!("\"{job}-{rank}\"")),
                "{job}-{rank} is not in the shared directory when the epilog returned: {published}"
            );
        }
    }

    // The next job's daemon (a new one) replays the journal: all 8 entries.
    let job_c = slurm.submit(
        "c",
        &format!(
            "{preamble}tunecache scan --namespace slurm\necho \"daemon in c: $({stats_pid})\"\n"
        ),
        &["-n1"],
        &env,
    );
    let output_c = slurm.wait_done(job_c, JOB_LIMIT);
    assert_eq!(
        output_c.matches(" (shared): ").count(),
        8,
        "job c's scan: {output_c}"
    );
    assert_ne!(
        line_after(&output_c, "daemon in c:"),
        line_after(&output_a, "daemon after b:"),
        "job c was served by the old daemon"
    );
    let log = std::fs::read_to_string(&slurm.script_log).unwrap_or_default();
    assert!(log.is_empty(), "the prolog or epilog complained: {log}");
}

#[test]
fn a_prolog_without_its_binary_logs_why_and_does_not_hold_the_job() {
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        tunecache_settings: vec!["BIN=/nonexistent/tunecached".to_owned()],
        ..Default::default()
    }) else {
        return;
    };
    let submitted = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let job = slurm.submit(
        "nobin",
        "#!/bin/bash\necho \"started $(date +%s.%N)\"\n",
        &["-n1"],
        &[],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    let started: f64 = line_after(&output, "started")
        .parse()
        .expect("a start time");
    // The old prolog waited 10 s for a daemon that could never come.
    assert!(
        started - submitted < 5.0,
        "the job started {:.1} s after submission: the prolog held it",
        started - submitted
    );
    let log = std::fs::read_to_string(&slurm.script_log).unwrap_or_default();
    assert!(
        log.contains("/nonexistent/tunecached is missing or not executable")
            && log.contains(&format!("job {job}")),
        "the prolog did not say why the job has no daemon: {log:?}"
    );
    assert!(daemon_pids_on(&slurm.socket_root).is_empty());
}

#[test]
fn a_settings_file_others_may_write_is_refused_and_the_prolog_exits_at_once() {
    // Run as slurmd runs it: as root, with only SLURM_* variables. No Slurm needed.
    let dir = tempfile::tempdir().unwrap();
    for script in ["tunecache-prolog.sh", "tunecache-slurm-lib.sh"] {
        copy_executable(
            &repo_root().join("deploy/slurm").join(script),
            &dir.path().join(script),
        );
    }
    let settings = dir.path().join("tunecache-slurm.conf");
    std::fs::write(
        &settings,
        format!(
            "BIN={}\nSOCKET_ROOT={}/run\n",
            bin("tunecached").display(),
            dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &settings,
        std::os::unix::fs::PermissionsExt::from_mode(0o664),
    )
    .unwrap();
    let started = Instant::now();
    let output = Command::new(dir.path().join("tunecache-prolog.sh"))
        .env_clear()
        .env("SLURM_JOB_USER", "nobody")
        .env("SLURM_JOB_ID", "7")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "a prolog failure would drain the node: {}",
        text(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "settings {}: owned by uid 0 with mode 664",
            settings.display()
        )),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the prolog waited"
    );
    assert!(
        !dir.path().join("run").exists(),
        "the prolog went on with a refused settings file"
    );
    // In the LOG docs/launchers.md names (its LOG= line may be anyone's, so not that one).
    let documented =
        std::fs::read_to_string("/var/log/tunecache/tunecache-slurm.log").unwrap_or_default();
    assert!(
        documented.contains(&format!("settings {}: owned by uid 0", settings.display())),
        "the refusal is not in /var/log/tunecache/tunecache-slurm.log"
    );
}

#[test]
fn the_slurm_scripts_pass_shellcheck() {
    let Some(shellcheck) = tunecache_integration::require_tool("shellcheck", Some("SHELLCHECK"))
    else {
        return;
    };
    let dir = repo_root().join("deploy/slurm");
    let output = Command::new(shellcheck)
        .arg("-x")
        .args([
            "tunecache-prolog.sh",
            "tunecache-epilog.sh",
            "tunecache-task-prolog.sh",
            "tunecache-slurm-lib.sh",
            "tunecache-srun.sh",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "shellcheck: {}", text(&output));
}

#[test]
fn a_daemon_that_exits_at_once_does_not_hold_the_job_and_log_holds_its_error() {
    // An invalid value: the daemon exits at once with clap's error.
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        tunecache_settings: vec!["EXTRA_FLAGS=--fsync sometimes".to_owned()],
        ..Default::default()
    }) else {
        return;
    };
    let mut delays = Vec::new();
    for attempt in 0..2 {
        let job = slurm.submit(
            &format!("badflag{attempt}"),
            "#!/bin/bash\necho \"started $(date +%s.%N)\"\n",
            &["-n1"],
            &[],
        );
        let output = slurm.wait_done(job, JOB_LIMIT);
        let started: f64 = line_after(&output, "started")
            .parse()
            .expect("a start time");
        delays.push(started - slurm.allocated_at(job));
        let log = slurm.script_log();
        let entry = log
            .split(&format!("job {job} user nobody: "))
            .nth(1)
            .unwrap_or_else(|| panic!("job {job} left nothing in LOG: {log}"));
        assert!(
            entry.starts_with("tunecached exited with status 2 before it answered")
                && entry.contains("invalid value 'sometimes' for '--fsync"),
            "LOG does not hold the daemon's own error: {log}"
        );
    }
    eprintln!("allocation to first task with a daemon that exits at once: {delays:.3?} s");
    // The old prolog polled the socket for 10 s (12 s to the first task). The issue's 1 s is
    // met on an idle machine (0.21-0.29 s, docs/launchers.md); the bound here is the one a
    // loaded 2-core CI machine still keeps, and still far below the old prolog's 10 s hold.
    for delay in &delays {
        assert!(*delay < 4.0, "the prolog held the job: {delays:?} s");
    }
    assert!(daemon_pids_on(&slurm.socket_root).is_empty());
}

/// A copy of the workspace's daemon, CLI and tuner in `dir` (as an admin installs them).
fn install_binaries(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for name in ["tunecached", "tunecache", "tunecache-tuner"] {
        let target = dir.join(name);
        let temp = dir.join(format!(".{name}.new"));
        copy_executable(&bin(name), &temp);
        // Renamed over the old one, as `install` and package managers do: a daemon running the
        // old file keeps it, and /proc/PID/exe then reads "... (deleted)".
        std::fs::rename(&temp, &target).unwrap();
    }
}

#[test]
fn an_upgrade_of_the_binary_mid_job_still_lets_the_epilog_stop_the_old_daemon() {
    let binaries = tempfile::Builder::new()
        .prefix("tc-slurm-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        binaries.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    install_binaries(binaries.path());
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        tunecache_settings: vec![format!(
            "BIN={}",
            binaries.path().join("tunecached").display()
        )],
        ..Default::default()
    }) else {
        return;
    };
    let work = slurm.work.display().to_string();
    let job = slurm.submit(
        "upgrade",
        "#!/bin/bash\ntunecache --json stats | grep -o '\"daemon_pid\":[0-9]*'\n\
         touch $WORK/upgrade.running\n\
         for _ in $(seq 1 600); do [[ -e $WORK/upgraded ]] && break; sleep 0.1; done\n\
         tunecache put --namespace up --op o --device d --problem p --config '{}' --time-us 1\n",
        &["-n1"],
        &[("WORK", work.as_str())],
    );
    wait_for_file(&slurm.work.join("upgrade.running"), JOB_LIMIT);
    let socket = slurm.prolog_socket();
    let pids = daemon_pids_on(&socket);
    assert_eq!(pids.len(), 1, "one daemon for the job: {pids:?}");
    install_binaries(binaries.path());
    let exe = std::fs::read_link(format!("/proc/{}/exe", pids[0])).unwrap();
    assert!(
        exe.to_string_lossy().ends_with(" (deleted)"),
        "the upgrade did not replace the running binary: {exe:?}"
    );
    std::fs::write(slurm.work.join("upgraded"), "").unwrap();
    let output = slurm.wait_done(job, JOB_LIMIT);
    assert!(output.contains("stored"), "the job's put: {output}");
    assert!(
        daemon_pids_on(&socket).is_empty(),
        "the epilog left the old daemon running: {:?}\n{}",
        daemon_pids_on(&socket),
        slurm.logs()
    );
    let daemon_log =
        std::fs::read_to_string(slurm.state_root.join("nobody/tunecached.log")).unwrap();
    assert!(
        daemon_log.contains("SIGTERM received"),
        "not stopped by SIGTERM: {daemon_log}"
    );
}

#[test]
fn a_refused_settings_line_is_logged_to_the_files_log_in_a_directory_made_for_it() {
    // Run as slurmd runs it: as root, with only SLURM_* variables. No Slurm needed.
    let dir = tempfile::tempdir().unwrap();
    for script in ["tunecache-prolog.sh", "tunecache-slurm-lib.sh"] {
        copy_executable(
            &repo_root().join("deploy/slurm").join(script),
            &dir.path().join(script),
        );
    }
    let log = dir.path().join("logs/not-yet/tunecache-slurm.log");
    let settings = dir.path().join("tunecache-slurm.conf");
    std::fs::write(
        &settings,
        format!(
            "BIN={}\nSOCKET_ROOT={}/run\nSHARD_DIR=/typo\nLOG={}\n",
            bin("tunecached").display(),
            dir.path().display(),
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &settings,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let output = Command::new(dir.path().join("tunecache-prolog.sh"))
        .env_clear()
        .env("SLURM_JOB_USER", "nobody")
        .env("SLURM_JOB_ID", "7")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains(&format!(
            "tunecache-prolog job 7 user nobody: settings {}: unknown key 'SHARD_DIR'",
            settings.display()
        )),
        "the refusal is not in the settings' LOG ({}): {logged:?}; stderr: {}",
        log.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!dir.path().join("run").exists(), "the prolog went on");
}

#[test]
fn a_prolog_run_with_a_daemon_that_exits_at_once_returns_at_once() {
    // As slurmd runs it, timed alone: the daemon exits on a bad flag.
    if !tunecache_integration::require_root("running the prolog as slurmd does") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tc-prolog-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for script in ["tunecache-prolog.sh", "tunecache-slurm-lib.sh"] {
        copy_executable(
            &repo_root().join("deploy/slurm").join(script),
            &dir.path().join(script),
        );
    }
    let settings = dir.path().join("tunecache-slurm.conf");
    std::fs::write(
        &settings,
        format!(
            "BIN={}\nSOCKET_ROOT={root}/run\nSTATE_ROOT={root}/lib\nLOG={root}/log\n\
             EXTRA_FLAGS=--fsync sometimes\n",
            bin("tunecached").display(),
            root = dir.path().display(),
        ),
    )
    .unwrap();
    let mut times = Vec::new();
    for job in 0..3 {
        let started = Instant::now();
        let output = Command::new(dir.path().join("tunecache-prolog.sh"))
            .env_clear()
            .env("SLURM_JOB_USER", "nobody")
            .env("SLURM_JOB_ID", job.to_string())
            .output()
            .unwrap();
        times.push(started.elapsed());
        assert!(output.status.success(), "{}", text(&output));
    }
    eprintln!("prolog with a daemon that exits at once: {times:?}");
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert_eq!(log.matches("invalid value 'sometimes'").count(), 3, "{log}");
    // The old prolog polled the socket for 10 s whatever the daemon did.
    for time in &times {
        assert!(*time < Duration::from_secs(2), "{times:?}");
    }
}
