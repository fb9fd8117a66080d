//! The Slurm launchers of `deploy/slurm/` on a real single-node Slurm (munged, slurmctld and
//! slurmd started by the tests, see `tunecache_integration::slurm`), with jobs run as
//! `nobody`: the prolog and epilog (one daemon for overlapping jobs, stopped after the last,
//! entries kept in the journal and in the shared directory by the time the epilog returns,
//! a missing binary costing nothing), and the srun wrapper (one daemon per node, stopped by
//! SIGTERM, a squatted socket directory failing the start).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunecache_integration::slurm::{repo_root, text, wrapper_dir, Slurm, SlurmOptions, JOB_UID};
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
        let log =
            std::fs::read_to_string(wrapper_dir(*job).join("tunecached.log")).unwrap_or_default();
        assert!(
            log.contains("SIGTERM received") && log.contains("tunecached stopped"),
            "job {job}'s daemon was not stopped by SIGTERM: {log}"
        );
        assert!(
            daemon_pids_on(&wrapper_dir(*job)).is_empty(),
            "job {job}'s daemon is left"
        );
    }
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
            "tunecache-slurm-lib.sh",
            "tunecache-srun.sh",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "shellcheck: {}", text(&output));
}
