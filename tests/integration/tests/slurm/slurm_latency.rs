//! What the prolog costs a job, measured on the test Slurm (not a timed test: it prints, and
//! is run by hand, `cargo test -p tunecache-integration --test slurm slurm_latency:: -- --ignored
//! --nocapture`). From allocation (slurmctld's `sched: Allocate` line) to the first task's
//! start, for: no prolog at all, the prolog starting the user's daemon, and the prolog
//! finding it serving (another job of the user holds it).

use std::time::Duration;

use tunecache_integration::eventually_blocking;
use tunecache_integration::slurm::{Slurm, SlurmOptions};

const JOB_LIMIT: Duration = Duration::from_secs(90);
/// Jobs measured for each case; `TUNECACHE_LATENCY_SAMPLES` overrides it.
fn samples() -> usize {
    std::env::var("TUNECACHE_LATENCY_SAMPLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(7)
}

/// Submits a job that prints when its first task started; allocation to that, in seconds.
fn first_task_delay(slurm: &mut Slurm, name: &str) -> f64 {
    let job = slurm.submit(
        name,
        "#!/bin/bash\necho \"started $(date +%s.%N)\"\n",
        &["-n1"],
        &[],
    );
    let output = slurm.wait_done(job, JOB_LIMIT);
    let started: f64 = output
        .lines()
        .find_map(|line| line.strip_prefix("started "))
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no start time: {output}"));
    started - slurm.allocated_at(job)
}

fn summary(label: &str, mut delays: Vec<f64>) {
    delays.sort_by(f64::total_cmp);
    let median = delays[delays.len() / 2];
    eprintln!(
        "{label:<34} median {:>4.0} ms  min {:>4.0} ms  max {:>4.0} ms  ({} jobs)",
        median * 1e3,
        delays[0] * 1e3,
        delays[delays.len() - 1] * 1e3,
        delays.len()
    );
}

#[test]
#[ignore = "a measurement, run by hand"]
fn prolog_latency_from_allocation_to_the_first_task() {
    // No prolog.
    let Some(mut slurm) = Slurm::start(SlurmOptions::default()) else {
        return;
    };
    let delays = (0..samples())
        .map(|i| first_task_delay(&mut slurm, &format!("none{i}")))
        .collect();
    summary("no prolog", delays);
    drop(slurm);

    // The prolog and epilog: each job starts a daemon (the epilog stopped the last one).
    let Some(mut slurm) = Slurm::start(SlurmOptions {
        prolog_and_epilog: true,
        ..Default::default()
    }) else {
        return;
    };
    let delays = (0..samples())
        .map(|i| first_task_delay(&mut slurm, &format!("start{i}")))
        .collect();
    summary("prolog starts the daemon", delays);

    // A job of the user holds the daemon: each measured job finds it serving.
    let work = slurm.work.display().to_string();
    let holder = slurm.submit(
        "holder",
        "#!/bin/bash\ntouch $WORK/held\nfor _ in $(seq 1 1200); do [[ -e $WORK/release ]] && break; sleep 0.1; done\n",
        &["-n1"],
        &[("WORK", work.as_str())],
    );
    let held = slurm.work.join("held");
    eventually_blocking(JOB_LIMIT, "the holding job starting", || held.exists());
    let delays = (0..samples())
        .map(|i| first_task_delay(&mut slurm, &format!("serving{i}")))
        .collect();
    summary("prolog finds the daemon serving", delays);
    std::fs::write(slurm.work.join("release"), "").unwrap();
    slurm.wait_done(holder, JOB_LIMIT);
}
