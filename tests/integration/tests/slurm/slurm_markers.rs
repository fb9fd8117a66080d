//! The Slurm prolog's job markers on a real single-node Slurm (see
//! `tunecache_integration::slurm`): a marker whose epilog never ran is reconciled (also one
//! of the layout before per-uid directories), one of a job without a step here is kept while
//! squeue lists it, a user whose name extends another's (`<user>.7`) reaches none of that
//! user's markers or lock, and the daemon does not exit idle while a job of its user runs on
//! the node, however long the job goes without a call, yet still exits after a job whose
//! epilog never ran.

use std::time::{Duration, Instant};

use tunecache_integration::slurm::{text, tool_path, JobUser, Slurm, SlurmOptions, JOB_UID};
use tunecache_integration::slurm_jobs::JOB_LIMIT;
use tunecache_integration::{daemon_pids_on, eventually_blocking};

#[test]
fn a_stale_marker_is_reconciled_by_the_next_epilog_and_the_daemon_exits() {
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        ..Default::default()
    }) else {
        return;
    };
    // The markers of jobs whose epilog never ran (slurmd restarted): jobs 7 and 8 never ran
    // here (this cluster's ids start far above). 8's is in the layout before per-uid
    // directories (<user>.<job>): moved in, then reconciled like the other.
    let jobs = slurm.socket_root.join(".jobs");
    let markers = jobs.join(JOB_UID.to_string());
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::write(markers.join("7"), "").unwrap();
    std::fs::write(jobs.join("nobody.8"), "").unwrap();
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
    for left in [markers.join("7"), markers.join("8"), jobs.join("nobody.8")] {
        assert!(
            !left.exists(),
            "the stale marker {} is left",
            left.display()
        );
    }
    let log = slurm.script_log();
    for stale in [7, 8] {
        assert!(
            log.contains(&format!(
                "tunecache-epilog job {job} user nobody: removed the stale marker of job {stale}"
            )),
            "the epilog did not say it removed the stale marker of job {stale}: {log}"
        );
    }
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
    eventually_blocking(JOB_LIMIT, "the held job's daemon", || {
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
        .join(format!(".jobs/{JOB_UID}/{held_job}"))
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

/// `salloc --no-shell -n1` as `user`: an allocation with no step; its job id.
fn hold_allocation(slurm: &Slurm, user: &JobUser) -> u32 {
    let held = slurm
        .command("setpriv")
        .args([
            "--reuid",
            &user.uid.to_string(),
            "--regid",
            &user.gid.to_string(),
        ])
        .args([
            "--clear-groups",
            "salloc",
            "--no-shell",
            "-n1",
            "-J",
            "held",
        ])
        .current_dir(&slurm.work)
        .env("PATH", tool_path())
        .output()
        .unwrap();
    assert!(held.status.success(), "salloc: {}", text(&held));
    String::from_utf8_lossy(&held.stderr)
        .split("Granted job allocation ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no job id from salloc: {}", text(&held)))
}

#[test]
fn a_user_whose_name_extends_anothers_reaches_none_of_their_markers_or_lock() {
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        ..Default::default()
    }) else {
        return;
    };
    let bob = slurm.add_user();
    let bob7 = slurm.add_user_named(&format!("{}.7", bob.name));
    // bob.7 holds a job on the node; bob runs one and it ends.
    let held = hold_allocation(&slurm, &bob7);
    eventually_blocking(JOB_LIMIT, "bob.7's daemon", || {
        daemon_pids_on(&slurm.prolog_socket_of(&bob7)).len() == 1
    });
    let jobs = slurm.socket_root.join(".jobs");
    let bob7_marker = jobs.join(format!("{}/{held}", bob7.uid));
    let work = slurm.work.display().to_string();
    let job = slurm.submit_as(
        &bob,
        "bob",
        "#!/bin/bash\ntouch $WORK/bob.up\n\
         for _ in $(seq 1 600); do [[ -e $WORK/bob.release ]] && break; sleep 0.1; done\n\
         srun -n1 true\n",
        &["-n1"],
        &[("WORK", work.as_str())],
    );
    // bob's lock as his prolog left it, to compare after his epilog.
    eventually_blocking(JOB_LIMIT, "bob's job runs", || {
        slurm.work.join("bob.up").exists()
    });
    let bob_lock = jobs.join(format!("{}/lock", bob.uid));
    let inode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
    };
    let lock_before = inode(&bob_lock);
    std::fs::write(slurm.work.join("bob.release"), "").unwrap();
    slurm.wait_done(job, JOB_LIMIT);
    assert!(
        daemon_pids_on(&slurm.prolog_socket_of(&bob)).is_empty(),
        "bob's epilog did not stop bob's daemon: {}",
        slurm.logs()
    );
    let log = slurm.script_log();
    assert!(
        !log.contains("removed the stale marker"),
        "an epilog took another user's marker or lock for stale: {log}"
    );
    assert!(
        bob7_marker.exists(),
        "bob.7's marker is not where it should be, or bob's epilog removed it"
    );
    assert_eq!(daemon_pids_on(&slurm.prolog_socket_of(&bob7)).len(), 1);
    assert!(lock_before.is_some(), "bob's lock is not in his directory");
    assert_eq!(inode(&bob_lock), lock_before, "bob's lock was replaced");
    let cancel = slurm
        .command("scancel")
        .arg(held.to_string())
        .output()
        .unwrap();
    assert!(cancel.status.success(), "{}", text(&cancel));
    slurm.wait_done(held, JOB_LIMIT);
    assert!(daemon_pids_on(&slurm.prolog_socket_of(&bob7)).is_empty());
}

#[test]
fn the_daemon_stays_while_its_users_job_runs_and_exits_idle_after_a_job_whose_epilog_never_ran() {
    const IDLE_SECS: u64 = 5;
    // No epilog at all: every job ends as one whose epilog never ran, so only the idle exit
    // stops the daemon, and the job's marker stays behind.
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        task_prolog: true,
        without_epilog: true,
        tunecache_settings: vec![format!("IDLE_SECS={IDLE_SECS}")],
        ..Default::default()
    }) else {
        return;
    };
    let job = slurm.submit(
        "quiet",
        "#!/bin/bash\n\
         tunecache put --namespace idle --op o --device d --problem p --config '{}' --time-us 1\n\
         sleep 8\n\
         tunecache get --namespace idle --op o --device d --problem p\n\
         echo \"get: $?\"\n",
        &["-n1"],
        &[],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    let ended = Instant::now();
    assert!(
        output.contains("get: 0") && output.contains("p (shared): {}"),
        "the job's second call, after 8 s without one, was not answered: {output}\n{}",
        std::fs::read_to_string(slurm.state_root.join("nobody/tunecached.log")).unwrap_or_default()
    );
    let socket = slurm.prolog_socket();
    assert!(
        slurm
            .socket_root
            .join(format!(".jobs/{JOB_UID}/{job}"))
            .exists(),
        "the marker of the job whose epilog never ran"
    );
    // IDLE_SECS after the job ended, plus one check (IDLE_SECS / 4), plus this machine's load.
    eventually_blocking(
        Duration::from_secs(IDLE_SECS + 10),
        "the daemon's idle exit",
        || daemon_pids_on(&socket).is_empty(),
    );
    eprintln!(
        "the daemon exited {:.1} s after its job ended (IDLE_SECS={IDLE_SECS})",
        ended.elapsed().as_secs_f64()
    );
    let log =
        std::fs::read_to_string(slurm.state_root.join("nobody/tunecached.log")).unwrap_or_default();
    assert!(
        log.contains("jobs of this user still run on this node; staying")
            && log.contains("no client called for --exit-when-idle; exiting"),
        "{log}"
    );
}
