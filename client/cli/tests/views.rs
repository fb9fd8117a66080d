//! Owns the CLI's view tests against the real daemon (issue 27): `--view` as the last resort
//! after `TUNECACHE_VIEW`, `TUNECACHE_VIEW=` turning views off, and the output of `view list`
//! and `view end`. The daemon is `tunecached` next to the CLI in the target directory (or in
//! `$TUNECACHE_BIN_DIR`); without it the tests are skipped, except under CI.

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{start_daemon, Daemon};

/// The launcher variables the CLI reads a view from: removed, so that the runner's own job
/// (a Slurm allocation, torchrun) names no view here.
const VIEW_VARIABLES: [&str; 4] = [
    "TUNECACHE_VIEW",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID",
];

/// The CLI against `daemon` with `env` set on top of an environment naming no view.
fn cli(daemon: &Daemon, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tunecache"));
    command.arg("--socket").arg(&daemon.socket).args(args);
    for name in VIEW_VARIABLES {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    command.output().expect("run tunecache")
}

/// The CLI's stdout, after asserting it succeeded.
fn cli_ok(daemon: &Daemon, env: &[(&str, &str)], args: &[&str]) -> String {
    let output = cli(daemon, env, args);
    assert!(
        output.status.success(),
        "tunecache {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const KEY: [&str; 8] = [
    "--namespace",
    "clitest",
    "--op",
    "views",
    "--device",
    "cpu|clitest",
    "--problem",
    "p1",
];

fn put(daemon: &Daemon, config: &str, time_us: &str) {
    let mut args = vec!["put"];
    args.extend(KEY);
    args.extend(["--config", config, "--time-us", time_us]);
    assert_eq!(cli_ok(daemon, &[], &args).trim(), "stored");
}

/// The config `get --json` answers, in whatever view `env` and `view_arg` name.
fn config_read(daemon: &Daemon, env: &[(&str, &str)], view_arg: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend(view_arg);
    args.push("get");
    args.extend(KEY);
    let hit: Value = serde_json::from_str(&cli_ok(daemon, env, &args)).expect("get --json");
    hit["result"]["config"].clone()
}

fn views(daemon: &Daemon) -> Vec<(String, u64)> {
    let list: Value =
        serde_json::from_str(&cli_ok(daemon, &[], &["view", "list", "--json"])).expect("json");
    let Value::Array(list) = list else {
        panic!("view list --json is not an array: {list}");
    };
    list.iter()
        .map(|view| {
            assert!(view["idle_ms"].is_u64(), "{view}");
            (
                view["name"].as_str().expect("name").to_owned(),
                view["pins"].as_u64().expect("pins"),
            )
        })
        .collect()
}

#[test]
fn view_flag_is_the_last_resort_and_view_list_and_end_show_what_they_did() {
    let Some(daemon) = start_daemon("views") else {
        return;
    };
    put(&daemon, r#"{"r":1}"#, "30");
    let first = serde_json::json!({"r": 1});
    let better = serde_json::json!({"r": 2});

    // --view pins r1 in job-1; TUNECACHE_VIEW wins over --view (job-2); TUNECACHE_VIEW= reads
    // without a view even with --view given.
    assert_eq!(config_read(&daemon, &[], &["--view", "job-1"]), first);
    assert_eq!(
        config_read(
            &daemon,
            &[("TUNECACHE_VIEW", "job-2")],
            &["--view", "job-1"]
        ),
        first
    );
    assert_eq!(
        config_read(&daemon, &[("SLURM_JOB_ID", "77")], &["--view", "job-1"]),
        first
    );
    put(&daemon, r#"{"r":2}"#, "20");
    assert_eq!(config_read(&daemon, &[], &["--view", "job-1"]), first);
    assert_eq!(
        config_read(&daemon, &[("TUNECACHE_VIEW", "job-2")], &[]),
        first
    );
    assert_eq!(config_read(&daemon, &[("SLURM_JOB_ID", "77")], &[]), first);
    assert_eq!(
        config_read(&daemon, &[("TUNECACHE_VIEW", "")], &["--view", "job-1"]),
        better
    );
    assert_eq!(config_read(&daemon, &[], &["--view", "job-3"]), better);

    let mut listed = views(&daemon);
    listed.sort();
    let expected = [("job-1", 1), ("job-2", 1), ("job-3", 1), ("slurm-77", 1)]
        .map(|(name, pins)| (name.to_owned(), pins));
    assert_eq!(listed, expected);
    let text = cli_ok(&daemon, &[], &["view", "list"]);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(header, ["VIEW", "UID", "PINS", "IDLE"]);
    let job_1 = lines
        .find(|line| line.starts_with("job-1 "))
        .unwrap_or_else(|| panic!("no job-1 line in:\n{text}"));
    let fields: Vec<&str> = job_1.split_whitespace().collect();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() }.to_string();
    assert_eq!(fields[..3], ["job-1", uid.as_str(), "1"], "{job_1}");

    assert_eq!(
        cli_ok(&daemon, &[], &["view", "end", "job-1"]).trim(),
        "ended view job-1: 1 pins dropped"
    );
    let again: Value =
        serde_json::from_str(&cli_ok(&daemon, &[], &["--json", "view", "end", "job-1"]))
            .expect("json");
    assert_eq!(
        again,
        serde_json::json!({"name": "job-1", "ended": false, "pins_dropped": 0})
    );
    assert!(!views(&daemon).iter().any(|(name, _)| name == "job-1"));
    // Ended, job-1 pins afresh: the winner now.
    assert_eq!(config_read(&daemon, &[], &["--view", "job-1"]), better);
    // An empty name is refused before the daemon is asked.
    assert!(!cli(&daemon, &[], &["view", "end", ""]).status.success());
}
