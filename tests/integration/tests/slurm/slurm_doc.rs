//! docs/launchers.md's Slurm steps stay true: the ```sh blocks between its `slurm-steps`
//! markers run in order, as written, on a real single-node Slurm (see
//! `tunecache_integration::slurm`) that starts without any tunecache line in its slurm.conf
//! but with a site's own `PrologFlags=Contain`. The admin's blocks run as root in one bash
//! session from the repository's root, with the first block's locations set to temporary ones
//! (its variables take what is set before it), and then again, as an administrator does after
//! an upgrade, with edits to the settings file in between: both flags are in force, each
//! script is named once, and the edits are kept. The last block, the first job, runs as
//! `nobody`, as any user would run it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tunecache_integration::slurm::{repo_root, text, tool_path, Slurm, SlurmOptions};
use tunecache_integration::{bin_dir, daemon_pids_on, sh_blocks, wait, Lazy};

/// The ```sh blocks between `<!-- slurm-steps: begin` and `<!-- slurm-steps: end -->`.
fn slurm_steps(doc: &str) -> Vec<String> {
    let begin = doc
        .find("<!-- slurm-steps: begin")
        .expect("docs/launchers.md has no slurm-steps begin marker");
    let end = doc[begin..]
        .find("<!-- slurm-steps: end -->")
        .expect("docs/launchers.md has no slurm-steps end marker");
    sh_blocks(&doc[begin..begin + end])
}

#[test]
fn the_slurm_steps_of_the_launchers_doc_take_a_new_node_to_its_first_job() {
    let doc = std::fs::read_to_string(repo_root().join("docs/launchers.md")).unwrap();
    let steps = slurm_steps(&doc);
    assert!(
        steps.len() >= 5,
        "expected the admin's steps and a first job: {steps:?}"
    );
    let Some(slurm) = Slurm::start(SlurmOptions {
        slurm_conf_lines: vec!["PrologFlags=Contain".to_owned()],
        ..Default::default()
    }) else {
        return;
    };
    let conf_text = std::fs::read_to_string(&slurm.conf).unwrap();
    assert!(
        !conf_text.contains("Prolog=") && conf_text.contains("PrologFlags=Contain"),
        "the cluster starts without a prolog, with the site's PrologFlags"
    );
    let root = slurm.dir.path();
    let prefix = root.join("prefix");
    let log = root.join("log/tunecache/tunecache-slurm.log");
    let shared = root.join("shared");
    let slurm_etc = slurm.conf.parent().unwrap().to_path_buf();
    let (first_job, admin) = steps.split_last().unwrap();

    // The admin's steps, as root; then again, after the admin edited the settings file.
    let mut script = String::from("set -euo pipefail\n");
    for block in admin {
        script.push_str(block);
    }
    let run_steps = || {
        let reads_before = slurmd_config_reads(root);
        let output = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(repo_root())
            .env("PREFIX", &prefix)
            .env("BUILD", bin_dir())
            .env("SLURM_ETC", &slurm_etc)
            .env("SOCKET_ROOT", &slurm.socket_root)
            .env("STATE_ROOT", &slurm.state_root)
            .env("LOG", &log)
            .env("SHARED_DIR", &shared)
            .env("SLURM_CONF", &slurm.conf)
            .output()
            .unwrap();
        assert!(
            output.status.success() && output.stderr.is_empty(),
            "the admin's steps failed or complained: {}",
            text(&output)
        );
        wait_for_prolog(&slurm, root, reads_before);
    };
    run_steps();
    let settings = slurm_etc.join("tunecache-slurm.conf");
    let edited = std::fs::read_to_string(&settings)
        .unwrap()
        .replace("IDLE_SECS=900", "IDLE_SECS=600")
        .replace(
            "#EXTRA_FLAGS=--shared-dir-writer-uid 990",
            "EXTRA_FLAGS=--snapshot-interval 5",
        );
    std::fs::write(&settings, &edited).unwrap();
    run_steps();
    let kept = std::fs::read_to_string(&settings).unwrap();
    for line in ["IDLE_SECS=600", "EXTRA_FLAGS=--snapshot-interval 5"] {
        assert!(
            kept.lines().any(|l| l == line),
            "running the steps again lost {line:?}:\n{kept}"
        );
    }
    let conf_text = std::fs::read_to_string(&slurm.conf).unwrap();
    for key in ["Prolog=", "Epilog=", "TaskProlog=", "PrologFlags="] {
        let lines: Vec<&str> = conf_text.lines().filter(|l| l.starts_with(key)).collect();
        assert_eq!(lines.len(), 1, "{key} in slurm.conf:\n{conf_text}");
    }
    let in_force = slurm
        .command("scontrol")
        .args(["show", "config"])
        .output()
        .unwrap();
    let in_force = String::from_utf8_lossy(&in_force.stdout);
    let flags = in_force
        .lines()
        .find(|l| l.starts_with("PrologFlags"))
        .unwrap_or_default();
    assert!(
        flags.contains("Alloc") && flags.contains("Contain"),
        "PrologFlags in force: {flags:?}"
    );
    // Every user's v2/ and blob directory are root's and sticky: no user's daemon makes either.
    for dir in ["v2", "v2/artifacts"] {
        let made = std::fs::metadata(shared.join(dir)).unwrap();
        assert_eq!(
            (made.uid(), made.mode() & 0o7777),
            (0, 0o1777),
            "{dir} as the steps made it"
        );
    }

    // The first job, as a user.
    let output = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["bash", "-c"])
        .arg(format!("set -euo pipefail\n{first_job}"))
        .current_dir(&slurm.work)
        .env_clear()
        .env(
            "PATH",
            format!("{}:{}", prefix.join("bin").display(), tool_path()),
        )
        .env("HOME", &slurm.work)
        .env("SLURM_CONF", &slurm.conf)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the first job failed: {}\n{}",
        text(&output),
        slurm.logs()
    );
    assert_eq!(stdout.matches("stored").count(), 2, "{stdout}");
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("rank-{rank} (shared): {{\"tile\":64}}")),
            "the second job did not read rank {rank}'s entry: {stdout}"
        );
    }
    // Each job's epilog stopped its daemon (srun returns before its job's epilog has run), and
    // the last publish reached the shared directory.
    let outlived = Lazy(|| format!("no daemon outliving its jobs: {}", slurm.logs()));
    wait(Duration::from_secs(30), outlived)
        .every(Duration::from_millis(100))
        .blocking(|| daemon_pids_on(&slurm.socket_root).is_empty() && queue_is_empty(&slurm));
    let published = std::fs::read_dir(shared.join("v2"))
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .collect::<String>();
    assert!(
        published.contains("rank-1"),
        "nothing published: {published}"
    );
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.is_empty(),
        "the prolog or epilog complained: {logged}"
    );
}

fn queue_is_empty(slurm: &Slurm) -> bool {
    slurm
        .command("squeue")
        .args(["-h", "-o", "%i"])
        .output()
        .is_ok_and(|output| output.status.success() && output.stdout.is_empty())
}

/// How often slurmd has read its configuration: it logs this line each time (at start and
/// on every reconfigure).
fn slurmd_config_reads(root: &Path) -> usize {
    std::fs::read_to_string(root.join("log/slurmd.log"))
        .unwrap_or_default()
        .matches("CPU frequency setting not configured for this node")
        .count()
}

/// `scontrol reconfigure` reaches slurmd asynchronously: waits (bounded) until slurmd's log
/// shows it read the configuration again, so the first job meets the prolog.
fn wait_for_prolog(slurm: &Slurm, root: &Path, reads_before: usize) {
    let reconfigured = Lazy(|| format!("slurmd reconfiguring:\n{}", slurm.logs()));
    wait(Duration::from_secs(30), reconfigured)
        .every(Duration::from_millis(100))
        .blocking(|| slurmd_config_reads(root) > reads_before);
}
