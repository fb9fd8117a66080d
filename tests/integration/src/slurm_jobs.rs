//! What the Slurm launcher tests share about jobs: the time a job may take, a step that
//! records from every task, waiting on a file, a labelled line of a job's output,
//! and the logs of a wrapper's daemons.

use std::path::Path;
use std::time::Duration;

use crate::{eventually_blocking, Lazy};

/// How long a test job may take.
pub const JOB_LIMIT: Duration = Duration::from_secs(90);

/// A job step that records `problem`'s result from every task, named after the task's rank.
pub const PUT_FROM_EVERY_TASK: &str = r#"srun bash -c 'tunecache put --namespace slurm --op gemm --device cpu --problem "$0-$SLURM_PROCID" --config "{\"rank\":$SLURM_PROCID}" --time-us 1'"#;

/// Waits (bounded) until `path` exists.
pub fn wait_for_file(path: &Path, limit: Duration) {
    eventually_blocking(
        limit,
        Lazy(|| format!("{} appearing", path.display())),
        || path.exists(),
    );
}

/// The rest of the job output's first line that starts with `label`, trimmed.
pub fn line_after(output: &str, label: &str) -> String {
    output
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` line in the job output:\n{output}"))
        .trim()
        .to_owned()
}

/// The daemon log(s) under a wrapper's state base: `<base>/<node>/tunecached.log`.
pub fn node_log(state_base: &Path) -> String {
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
