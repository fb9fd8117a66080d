//! The Slurm launchers of `deploy/slurm/` on a real single-node Slurm (munged, slurmctld and
//! slurmd started by the tests, see `tunecache_integration::slurm`), with jobs run as
//! `nobody` and a second real user: the prolog and epilog (one daemon for overlapping jobs,
//! stopped after the last, entries kept in the journal and in the shared directory by the time
//! the epilog returns, a missing binary or a daemon that exits at once costing the job
//! nothing, an upgraded binary and a stale marker still stopping the daemon, two users sharing
//! one shared directory without reaching each other's cache), and the srun wrapper (one daemon
//! per node, stopped by SIGTERM to the daemon alone, quietly, nothing left in /tmp, a squatted
//! socket directory failing the start).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunecache_integration::slurm::{
    repo_root, text, wrapper_dir, JobUser, Slurm, SlurmOptions, JOB_UID,
};
use tunecache_integration::{bin, daemon_pids_on};

const JOB_LIMIT: Duration = Duration::from_secs(90);

/// A job step that records `problem`'s result from every task, named after the task's rank.
const PUT_FROM_EVERY_TASK: &str = r#"srun bash -c 'tunecache put --namespace slurm --op gemm --device cpu --problem "$0-$SLURM_PROCID" --config "{\"rank\":$SLURM_PROCID}" --time-us 1'"#;

fn wait_for_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn daemon_pid_line(output: &str, label: &str) -> String {
    output
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` line in the job output:\n{output}"))
        .trim()
        .to_owned()
}

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
        daemon_pid_line(&output_a, "daemon after b:"),
        daemon_pid_line(&output_b, "daemon in b:"),
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
        daemon_pid_line(&output_c, "daemon in c:"),
        daemon_pid_line(&output_a, "daemon after b:"),
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
    let started: f64 = daemon_pid_line(&output, "started")
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
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
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
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
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
fn a_settings_file_others_may_write_is_refused_and_the_prolog_exits_at_once() {
    // Run as slurmd runs it: as root, with only SLURM_* variables. No Slurm needed.
    let dir = tempfile::tempdir().unwrap();
    for script in ["tunecache-prolog.sh", "tunecache-slurm-lib.sh"] {
        std::fs::copy(
            repo_root().join("deploy/slurm").join(script),
            dir.path().join(script),
        )
        .unwrap();
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

/// The daemon log(s) under a wrapper's state base: `<base>/<node>/tunecached.log`.
fn node_log(state_base: &Path) -> String {
    let mut all = String::new();
    for node in std::fs::read_dir(state_base)
        .into_iter()
        .flatten()
        .flatten()
    {
        all += &std::fs::read_to_string(node.path().join("tunecached.log")).unwrap_or_default();
    }
    all
}

/// Waits (bounded) until `check` holds; panics naming `what`.
fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
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
        let started: f64 = daemon_pid_line(&output, "started")
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
        std::fs::copy(bin(name), &temp).unwrap();
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
fn a_stale_marker_is_reconciled_by_the_next_epilog_and_the_daemon_exits() {
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        ..Default::default()
    }) else {
        return;
    };
    // The marker of a job whose epilog never ran (slurmd restarted): job 7 never ran here
    // (this cluster's ids start far above).
    let jobs = slurm.socket_root.join(".jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::write(jobs.join("nobody.7"), "").unwrap();
    let job = slurm.submit(
        "after-stale",
        "#!/bin/bash\ntunecache put --namespace stale --op o --device d --problem p --config '{}' --time-us 1\n",
        &["-n1"],
        &[],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    assert!(output.contains("stored"), "the job's put: {output}");
    assert!(
        daemon_pids_on(&slurm.prolog_socket()).is_empty(),
        "the stale marker kept the daemon alive: {}",
        slurm.logs()
    );
    assert!(!jobs.join("nobody.7").exists(), "the stale marker is left");
    let log = slurm.script_log();
    assert!(
        log.contains(&format!(
            "tunecache-epilog job {job} user nobody: removed the stale marker of job 7"
        )),
        "the epilog did not say it removed the stale marker: {log}"
    );
}

#[test]
fn a_marker_of_a_job_without_a_step_here_is_kept_while_squeue_lists_it() {
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        ..Default::default()
    }) else {
        return;
    };
    // An allocation with no step at all (salloc --no-shell): the prolog ran, `scontrol
    // listpids` knows no step of it, and only squeue says it still runs here.
    let held = slurm
        .command("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["salloc", "--no-shell", "-n1", "-J", "held"])
        .current_dir(&slurm.work)
        .env("PATH", tunecache_integration::slurm::tool_path())
        .output()
        .unwrap();
    assert!(held.status.success(), "salloc: {}", text(&held));
    let held_job: u32 = String::from_utf8_lossy(&held.stderr)
        .split("Granted job allocation ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no job id from salloc: {}", text(&held)));
    wait_until("the held job's daemon", JOB_LIMIT, || {
        daemon_pids_on(&slurm.prolog_socket()).len() == 1
    });
    let short = slurm.submit("short", "#!/bin/bash\ntrue\n", &["-n1"], &[]);
    slurm.wait_done(short, JOB_LIMIT);
    assert_eq!(
        daemon_pids_on(&slurm.prolog_socket()).len(),
        1,
        "the short job's epilog stopped the daemon the held job may use: {}",
        slurm.logs()
    );
    assert!(slurm
        .socket_root
        .join(format!(".jobs/nobody.{held_job}"))
        .exists());
    let cancel = slurm
        .command("scancel")
        .arg(held_job.to_string())
        .output()
        .unwrap();
    assert!(cancel.status.success(), "{}", text(&cancel));
    slurm.wait_done(held_job, JOB_LIMIT);
    assert!(daemon_pids_on(&slurm.prolog_socket()).is_empty());
    let log = slurm.script_log();
    assert!(log.is_empty(), "the prolog or epilog complained: {log}");
}

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

/// A job script that waits for its daemon's first pass over the shared directory, then says
/// which of `problems` it has and prints its Stats.
fn probe_job(problems: &[&str]) -> String {
    let mut script = String::from(
        "#!/bin/bash\n\
         for _ in $(seq 1 200); do tunecache --json stats | grep -q '\"snapshot_passes\":[1-9]' && break; sleep 0.1; done\n",
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
    let stats: serde_json::Value = serde_json::from_str(&daemon_pid_line(output, "stats:"))
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
        .args(["--node-name", "site", "--tuner", "off"])
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
    wait_until("the site daemon serves", JOB_LIMIT, || {
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

    // Both users run a job at once, each recording an entry of their own.
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
        serde_json::from_str(&daemon_pid_line(&nobody_output, "stats:")).unwrap();
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
    // The segment under nobody's name is counted, as a name conflict and as untrusted.
    assert!(
        stat_of(&nobody_output, "snapshot_name_conflicts") >= 1
            && stat_of(&nobody_output, "snapshot_untrusted_files") >= 1,
        "nobody's daemon did not count bob's segment under its name: {nobody_output}"
    );
    let log = slurm.script_log();
    assert!(log.is_empty(), "the prolog or epilog complained: {log}");
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
fn a_refused_settings_line_is_logged_to_the_files_log_in_a_directory_made_for_it() {
    // Run as slurmd runs it: as root, with only SLURM_* variables. No Slurm needed.
    let dir = tempfile::tempdir().unwrap();
    for script in ["tunecache-prolog.sh", "tunecache-slurm-lib.sh"] {
        std::fs::copy(
            repo_root().join("deploy/slurm").join(script),
            dir.path().join(script),
        )
        .unwrap();
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
        std::fs::copy(
            repo_root().join("deploy/slurm").join(script),
            dir.path().join(script),
        )
        .unwrap();
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
