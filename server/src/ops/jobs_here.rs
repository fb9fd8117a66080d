//! Which of this user's Slurm jobs still run on this node, for `--exit-when-idle`
//! (`--job-markers DIR`): the prolog leaves one marker per job in DIR, a file named by the
//! job id, and the epilog removes it. A marker's job counts as running while a process of
//! this daemon's uid outside the daemon's own session (the daemon and its tuner inherited
//! the first job's environment) carries `SLURM_JOB_ID=<id>` in its environment: the batch
//! script, a step's tasks, anything they started. A marker whose epilog never ran (slurmd
//! died with the job) names no live process, so the idle exit stays the fallback for it.
//!
//! Blocking (`/proc` and DIR are read): the idle timer runs it off the async runtime.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Markers read at most: more than any node runs jobs of one user.
const MAX_MARKERS: usize = 4096;
/// Bytes of a process's environment read at most (Linux keeps it in the first pages).
const MAX_ENVIRON_BYTES: u64 = 256 * 1024;

/// The job markers of this daemon's user on this node.
#[derive(Clone, Debug)]
pub struct JobMarkers {
    dir: PathBuf,
}

impl JobMarkers {
    pub fn new(dir: PathBuf) -> JobMarkers {
        JobMarkers { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ids of the marked jobs that still have a process on this node, sorted. A missing
    /// directory marks no job.
    pub fn running(&self) -> io::Result<Vec<String>> {
        let marked = match fs::read_dir(&self.dir) {
            Ok(entries) => job_ids(
                entries
                    .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                    .take(MAX_MARKERS),
            ),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        if marked.is_empty() {
            return Ok(marked);
        }
        let uid = nix::unistd::geteuid().as_raw();
        let own_session = nix::unistd::getsid(None).map(|sid| sid.as_raw()).ok();
        let mut running = Vec::new();
        for entry in fs::read_dir("/proc")?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let proc_dir = Path::new("/proc").join(pid.to_string());
            // Gone since the listing, or another user's: not this user's job.
            if !fs::metadata(&proc_dir).is_ok_and(|m| m.uid() == uid) {
                continue;
            }
            let Ok(stat) = fs::read_to_string(proc_dir.join("stat")) else {
                continue;
            };
            if own_session.is_some() && session_of(&stat) == own_session {
                continue;
            }
            let Ok(environ) = read_environ(&proc_dir) else {
                continue;
            };
            if let Some(job) = job_in_environ(&environ, &marked) {
                if !running.iter().any(|seen: &String| seen == job) {
                    running.push(job.to_owned());
                }
            }
        }
        running.sort();
        Ok(running)
    }
}

fn read_environ(proc_dir: &Path) -> io::Result<Vec<u8>> {
    let mut environ = Vec::new();
    File::open(proc_dir.join("environ"))?
        .take(MAX_ENVIRON_BYTES)
        .read_to_end(&mut environ)?;
    Ok(environ)
}

/// The job ids among marker names: names of digits only (anything else in the directory,
/// such as the prolog's lock, is no marker), sorted.
pub fn job_ids(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut ids: Vec<String> = names
        .into_iter()
        .filter(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    ids.sort();
    ids
}

/// The session id in the text of `/proc/PID/stat` (the fourth field after the command,
/// which is in parentheses and may hold anything, so it is found from the last `)`).
pub fn session_of(stat: &str) -> Option<i32> {
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(3)?.parse().ok()
}

/// The job among `jobs` that an environment block (`NAME=value` entries separated by NUL)
/// names as `SLURM_JOB_ID`.
pub fn job_in_environ<'a>(environ: &[u8], jobs: &'a [String]) -> Option<&'a str> {
    let value = environ
        .split(|byte| *byte == 0)
        .find_map(|entry| entry.strip_prefix(b"SLURM_JOB_ID="))?;
    jobs.iter()
        .find(|job| job.as_bytes() == value)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_digits_are_markers() {
        let names = ["94", "lock", "7", "", "94.1", "logged.squatting", "0012"];
        assert_eq!(
            job_ids(names.map(str::to_owned)),
            vec!["0012".to_owned(), "7".to_owned(), "94".to_owned()]
        );
    }

    #[test]
    fn the_session_is_read_past_any_command_name() {
        assert_eq!(session_of("123 (bash) S 1 123 456 0 -1"), Some(456));
        // A command may hold spaces and parentheses.
        assert_eq!(session_of("7 (a) b (c) S 1 7 99 0"), Some(99));
        assert_eq!(session_of("7 (x) S"), None);
        assert_eq!(session_of("garbage"), None);
    }

    #[test]
    fn a_process_belongs_to_the_job_its_environment_names_exactly() {
        let jobs = vec!["94".to_owned(), "7".to_owned()];
        let environ = b"PATH=/bin\0SLURM_JOB_ID=94\0SLURM_STEP_ID=0\0";
        assert_eq!(job_in_environ(environ, &jobs), Some("94"));
        // Another job, a longer id, a variable that merely ends the same way: none of these.
        assert_eq!(job_in_environ(b"SLURM_JOB_ID=8\0", &jobs), None);
        assert_eq!(job_in_environ(b"SLURM_JOB_ID=794\0", &jobs), None);
        assert_eq!(job_in_environ(b"MY_SLURM_JOB_ID=94\0", &jobs), None);
        assert_eq!(job_in_environ(b"SLURM_JOB_ID=7", &jobs), Some("7"));
        assert_eq!(job_in_environ(b"", &jobs), None);
    }

    #[test]
    fn a_missing_directory_marks_no_job_and_a_marker_without_a_process_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let markers = JobMarkers::new(dir.path().join("missing"));
        assert!(markers.running().unwrap().is_empty());
        // No process of this uid carries this id (the largest a job id can be).
        fs::write(dir.path().join("4294967295"), b"").unwrap();
        fs::write(dir.path().join("lock"), b"").unwrap();
        let markers = JobMarkers::new(dir.path().to_path_buf());
        assert!(markers.running().unwrap().is_empty());
    }

    #[test]
    fn a_marked_job_runs_while_a_process_outside_this_session_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let job = format!("{}", 4_000_000_000u32 - std::process::id());
        fs::write(dir.path().join(&job), b"").unwrap();
        let markers = JobMarkers::new(dir.path().to_path_buf());
        // In this test's own session it is the daemon's own (as its tuner would be).
        let mut same_session = std::process::Command::new("sleep")
            .arg("30")
            .env("SLURM_JOB_ID", &job)
            .spawn()
            .unwrap();
        assert!(markers.running().unwrap().is_empty());
        let _ = same_session.kill();
        let _ = same_session.wait();
        // A session of its own, as a job's processes have.
        let Ok(mut job_process) = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .env("SLURM_JOB_ID", &job)
            .spawn()
        else {
            return;
        };
        let mut found = Vec::new();
        for _ in 0..100 {
            found = markers.running().unwrap();
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = job_process.kill();
        let _ = job_process.wait();
        assert_eq!(found, vec![job]);
    }
}
