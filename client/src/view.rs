//! Owns which view a client reads in: the name of the job whose ranks must all see the same
//! result for a key (issue 27, docs/views.md), resolved from the environment so that ranks need
//! no code change. The daemon pins the first answer for a key within a view; an empty view is
//! none, and reads behave as without views.
//!
//! The first source that is set wins:
//!
//! 1. `TUNECACHE_VIEW`, taken as it is; set but empty turns views off, whatever follows;
//! 2. Slurm: `slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>`, or `slurm-<SLURM_JOB_ID>` outside a step;
//! 3. torchrun: `torchelastic-<TORCHELASTIC_RUN_ID>`, unless the id is torchrun's default
//!    `none` (its `--rdzv-id` default), which every job without `--rdzv-id` shares, so it names
//!    no job;
//! 4. the caller's explicit name (`Client::with_view`, the CLI's `--view`).
//!
//! The launcher's variables come before the explicit name so that one job's ranks agree even if
//! some of them were started with another `--view`.

/// The variable that names the view outright (empty: no view).
pub const VIEW_ENV: &str = "TUNECACHE_VIEW";
/// Slurm's job id, the same on every node of the job.
pub const SLURM_JOB_ID_ENV: &str = "SLURM_JOB_ID";
/// Slurm's step id, set inside an `srun` step.
pub const SLURM_STEP_ID_ENV: &str = "SLURM_STEP_ID";
/// torchrun's rendezvous id (`--rdzv-id`), the same on every node of the run.
pub const TORCHELASTIC_RUN_ID_ENV: &str = "TORCHELASTIC_RUN_ID";
/// torchrun's `--rdzv-id` when none is given: shared by unrelated runs, so not a view.
const TORCHRUN_DEFAULT_RUN_ID: &str = "none";

/// The view for a process whose environment `env` reads (`None`: unset), with `explicit` as the
/// last resort. Returns the empty string for no view.
pub fn resolve_view(env: impl Fn(&str) -> Option<String>, explicit: Option<&str>) -> String {
    if let Some(view) = env(VIEW_ENV) {
        return view;
    }
    // A launcher's variable set but empty names nothing; the next source decides.
    let set = |name: &str| env(name).filter(|value| !value.is_empty());
    if let Some(job) = set(SLURM_JOB_ID_ENV) {
        return match set(SLURM_STEP_ID_ENV) {
            Some(step) => format!("slurm-{job}.{step}"),
            None => format!("slurm-{job}"),
        };
    }
    if let Some(run) = set(TORCHELASTIC_RUN_ID_ENV).filter(|run| run != TORCHRUN_DEFAULT_RUN_ID) {
        return format!("torchelastic-{run}");
    }
    explicit.unwrap_or_default().to_owned()
}

/// [`resolve_view`] on this process's environment. A variable that is not valid Unicode counts
/// as unset.
pub fn view_from_env(explicit: Option<&str>) -> String {
    resolve_view(|name| std::env::var(name).ok(), explicit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolved(vars: &[(&str, &str)], explicit: Option<&str>) -> String {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        resolve_view(|name| env.get(name).cloned(), explicit)
    }

    const EVERY_SOURCE: &[(&str, &str)] = &[
        (VIEW_ENV, "my-view"),
        (SLURM_JOB_ID_ENV, "4242"),
        (SLURM_STEP_ID_ENV, "3"),
        (TORCHELASTIC_RUN_ID_ENV, "run-7"),
    ];

    #[test]
    fn tunecache_view_wins_over_every_other_source() {
        assert_eq!(resolved(EVERY_SOURCE, Some("explicit")), "my-view");
    }

    #[test]
    fn empty_tunecache_view_turns_views_off_even_with_later_sources_set() {
        let mut vars = EVERY_SOURCE.to_vec();
        vars[0] = (VIEW_ENV, "");
        assert_eq!(resolved(&vars, Some("explicit")), "");
    }

    #[test]
    fn slurm_job_and_step_come_second() {
        assert_eq!(
            resolved(&EVERY_SOURCE[1..], Some("explicit")),
            "slurm-4242.3"
        );
    }

    #[test]
    fn slurm_job_without_a_step_is_the_job_alone() {
        let vars = [
            (SLURM_JOB_ID_ENV, "4242"),
            (TORCHELASTIC_RUN_ID_ENV, "run-7"),
        ];
        assert_eq!(resolved(&vars, None), "slurm-4242");
        let empty_step = [(SLURM_JOB_ID_ENV, "4242"), (SLURM_STEP_ID_ENV, "")];
        assert_eq!(resolved(&empty_step, None), "slurm-4242");
    }

    #[test]
    fn a_slurm_step_without_a_job_names_nothing() {
        let vars = [(SLURM_STEP_ID_ENV, "3"), (TORCHELASTIC_RUN_ID_ENV, "run-7")];
        assert_eq!(resolved(&vars, None), "torchelastic-run-7");
    }

    #[test]
    fn torchrun_comes_third() {
        assert_eq!(
            resolved(&EVERY_SOURCE[3..], Some("explicit")),
            "torchelastic-run-7"
        );
    }

    #[test]
    fn torchrun_default_run_id_names_no_job() {
        let vars = [(TORCHELASTIC_RUN_ID_ENV, "none")];
        assert_eq!(resolved(&vars, Some("explicit")), "explicit");
        assert_eq!(resolved(&vars, None), "");
    }

    #[test]
    fn empty_launcher_variables_count_as_unset() {
        let vars = [(SLURM_JOB_ID_ENV, ""), (TORCHELASTIC_RUN_ID_ENV, "")];
        assert_eq!(resolved(&vars, Some("explicit")), "explicit");
    }

    #[test]
    fn the_explicit_name_is_the_last_resort() {
        assert_eq!(resolved(&[], Some("explicit")), "explicit");
        assert_eq!(resolved(&[], None), "");
    }
}
