//! A real single-node Slurm for the launcher tests: its own munged, slurmctld and slurmd on
//! free ports under one temporary directory, with `deploy/slurm/`'s prolog and epilog wired
//! in the way docs/launchers.md tells an administrator to. Several clusters can run at once
//! (each test starts its own): they differ in ports, node name, state and job ids.
//!
//! Plugins: `select/cons_tres`, `proctrack/linuxproc`, `task/none`, no accounting, so no
//! cgroups are needed. Jobs run as `nobody` (uid 65534), or as a second real user the cluster
//! creates for a test ([`Slurm::add_user`]), submitted through `setpriv`.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::redis::free_port;
use crate::{bin, daemon_pids_on, eventually_blocking, require_root, require_tool, wait, Lazy};

/// The unprivileged job user.
pub const JOB_UID: u32 = 65534;

/// A user jobs run as.
#[derive(Clone, Debug)]
pub struct JobUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl JobUser {
    /// `nobody`, who exists on every system.
    pub fn nobody() -> JobUser {
        JobUser {
            name: "nobody".to_owned(),
            uid: JOB_UID,
            gid: JOB_UID,
        }
    }
}

/// What a test wants from the cluster.
#[derive(Default)]
pub struct SlurmOptions {
    /// Lines for `tunecache-slurm.conf` after the defaults (BIN, SOCKET_ROOT, STATE_ROOT, LOG).
    pub tunecache_settings: Vec<String>,
    /// Wire the prolog and epilog (`Prolog=`, `Epilog=`, `PrologFlags=Alloc`).
    pub prolog_and_epilog: bool,
    /// Also wire the task prolog (`TaskProlog=`), which exports `TUNECACHE_SOCKET`.
    pub task_prolog: bool,
    /// With `prolog_and_epilog`, leave the epilog out: every job ends as one whose epilog
    /// never ran (slurmd died with it).
    pub without_epilog: bool,
    /// More lines for slurm.conf (e.g. a site's own `PrologFlags=Contain`).
    pub slurm_conf_lines: Vec<String>,
}

/// One running Slurm; everything is stopped and removed on drop.
pub struct Slurm {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// Socket directories' parent for the prolog (`SOCKET_ROOT`).
    pub socket_root: PathBuf,
    /// Journal directories' parent for the prolog (`STATE_ROOT`).
    pub state_root: PathBuf,
    /// The prolog's and epilog's own log (`LOG`).
    pub script_log: PathBuf,
    /// World-writable (sticky) directory for job scripts, their output and test files.
    pub work: PathBuf,
    /// `version` of `sinfo -V`, e.g. "slurm-wlm 22.05.8".
    pub version: String,
    /// The node's name (`SLURMD_NODENAME`).
    pub node: String,
    daemons: Vec<(&'static str, Child)>,
    jobs: Vec<u32>,
    /// Users this cluster created; removed on drop.
    users: Vec<String>,
}

impl Slurm {
    /// Starts munged, slurmctld and slurmd and waits until the node is idle. `None` (the test
    /// is skipped) when Slurm or munge is missing outside CI or the tests are not root; under
    /// CI that fails instead.
    pub fn start(options: SlurmOptions) -> Option<Slurm> {
        let tools = [
            "munged",
            "slurmctld",
            "slurmd",
            "sbatch",
            "squeue",
            "scontrol",
            "setpriv",
        ];
        let mut paths = Vec::new();
        for tool in tools {
            paths.push(require_tool(tool, None)?);
        }
        if !require_root("running slurmd and jobs as another user") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("tc-slurm-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        chmod(dir.path(), 0o755);
        let root = dir.path().to_path_buf();
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        let node = format!("tc{slurmd_port}");
        let host = nix::unistd::gethostname()
            .expect("hostname")
            .to_string_lossy()
            .split('.')
            .next()
            .unwrap_or("localhost")
            .to_owned();
        for sub in ["munge", "state", "spool", "log", "scripts"] {
            std::fs::create_dir(root.join(sub)).expect("create dir");
        }
        chmod(&root.join("munge"), 0o755);
        let work = root.join("work");
        std::fs::create_dir(&work).expect("create work dir");
        chmod(&work, 0o1777);

        // munged: a key of its own, its socket where every uid may connect.
        let key = root.join("munge/munge.key");
        std::fs::write(&key, random_bytes(1024)).expect("write munge key");
        chmod(&key, 0o400);
        let munge_socket = root.join("munge/munge.socket");
        let mut daemons = Vec::new();
        let munged = Command::new(&paths[0])
            .args(["-F", "--force", "--num-threads=2"])
            .arg(format!("--socket={}", munge_socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!(
                "--log-file={}",
                root.join("log/munged.log").display()
            ))
            .arg(format!(
                "--pid-file={}",
                root.join("munge/munged.pid").display()
            ))
            .arg(format!(
                "--seed-file={}",
                root.join("munge/munged.seed").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start munged");
        daemons.push(("munged", munged));
        eventually_blocking(Duration::from_secs(10), "munged's socket", || {
            munge_socket.exists()
        });

        // The prolog's scripts and settings, copied as an administrator would.
        let scripts = root.join("scripts");
        let deploy = repo_root().join("deploy/slurm");
        for script in [
            "tunecache-prolog.sh",
            "tunecache-epilog.sh",
            "tunecache-task-prolog.sh",
            "tunecache-slurm-lib.sh",
        ] {
            if deploy.join(script).exists() {
                crate::copy_executable(&deploy.join(script), &scripts.join(script));
            }
        }
        let socket_root = root.join("run");
        let state_root = root.join("lib");
        let script_log = root.join("log/tunecache-slurm.log");
        let mut settings = vec![
            format!("BIN={}", bin("tunecached").display()),
            format!("SOCKET_ROOT={}", socket_root.display()),
            format!("STATE_ROOT={}", state_root.display()),
            format!("LOG={}", script_log.display()),
            "IDLE_SECS=120".to_owned(),
        ];
        settings.extend(options.tunecache_settings);
        let settings_file = scripts.join("tunecache-slurm.conf");
        std::fs::write(&settings_file, settings.join("\n") + "\n").expect("write settings");
        chmod(&settings_file, 0o644);

        let conf = root.join("slurm.conf");
        let mut lines = vec![
            "ClusterName=tunecache".to_owned(),
            format!("SlurmctldHost={host}(127.0.0.1)"),
            format!("SlurmctldPort={ctld_port}"),
            format!("SlurmdPort={slurmd_port}"),
            "SlurmUser=root".to_owned(),
            "SlurmdUser=root".to_owned(),
            "AuthType=auth/munge".to_owned(),
            "CredType=cred/munge".to_owned(),
            format!("AuthInfo=socket={}", munge_socket.display()),
            format!("StateSaveLocation={}", root.join("state").display()),
            format!("SlurmdSpoolDir={}", root.join("spool").display()),
            format!("SlurmctldPidFile={}", root.join("slurmctld.pid").display()),
            format!("SlurmdPidFile={}", root.join("slurmd.pid").display()),
            format!("SlurmctldLogFile={}", root.join("log/slurmctld.log").display()),
            format!("SlurmdLogFile={}", root.join("log/slurmd.log").display()),
            "ProctrackType=proctrack/linuxproc".to_owned(),
            "TaskPlugin=task/none".to_owned(),
            "SelectType=select/cons_tres".to_owned(),
            "SelectTypeParameters=CR_Core".to_owned(),
            "MpiDefault=none".to_owned(),
            "JobAcctGatherType=jobacct_gather/none".to_owned(),
            "AccountingStorageType=accounting_storage/none".to_owned(),
            "ReturnToService=2".to_owned(),
            "SlurmdParameters=config_overrides".to_owned(),
            // Job ids of their own, so that the wrapper's /tmp/tunecache-<uid>-<job> of two
            // clusters running at once never meet.
            format!("FirstJobId={}", u32::from(slurmd_port) * 100),
            "SchedulerParameters=sched_min_interval=100000".to_owned(),
            format!(
                "NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=8 Sockets=1 \
                 CoresPerSocket=8 ThreadsPerCore=1 State=UNKNOWN"
            ),
            format!("PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"),
        ];
        if options.prolog_and_epilog {
            lines.push(format!(
                "Prolog={}",
                scripts.join("tunecache-prolog.sh").display()
            ));
            if !options.without_epilog {
                lines.push(format!(
                    "Epilog={}",
                    scripts.join("tunecache-epilog.sh").display()
                ));
            }
            lines.push("PrologFlags=Alloc".to_owned());
        }
        if options.task_prolog {
            lines.push(format!(
                "TaskProlog={}",
                scripts.join("tunecache-task-prolog.sh").display()
            ));
        }
        lines.extend(options.slurm_conf_lines);
        std::fs::write(&conf, lines.join("\n") + "\n").expect("write slurm.conf");

        let slurmctld = Command::new(&paths[1])
            .args(["-D", "-i", "-f"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start slurmctld");
        daemons.push(("slurmctld", slurmctld));
        let slurmd = Command::new(&paths[2])
            .args(["-D", "-f"])
            .arg(&conf)
            .args(["-N", &node])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start slurmd");
        daemons.push(("slurmd", slurmd));

        let mut slurm = Slurm {
            dir,
            conf,
            socket_root,
            state_root,
            script_log,
            work,
            version: String::new(),
            node,
            daemons,
            jobs: Vec::new(),
            users: Vec::new(),
        };
        let mut last_state = None;
        let idle = wait(Duration::from_secs(60), "the Slurm node becoming idle")
            .every(Duration::from_millis(200))
            .try_blocking_some(|| {
                let state = slurm
                    .command("sinfo")
                    .args(["-h", "-N", "-o", "%t"])
                    .output();
                let state = state.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
                if state.as_deref().is_ok_and(|s| s == "idle") {
                    return Some(());
                }
                slurm.assert_daemons_alive();
                last_state = Some(state);
                None
            });
        if idle.is_none() {
            panic!(
                "the Slurm node did not become idle within 60 s (state {last_state:?}); logs:\n{}",
                slurm.logs()
            );
        }
        let version = slurm.command("sinfo").arg("-V").output().expect("sinfo -V");
        slurm.version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        Some(slurm)
    }

    /// A Slurm client command (`srun`, `squeue`, ...) pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", &self.conf);
        command
    }

    /// Creates a real user for this cluster's jobs (`tcs<port>`, a system account without a
    /// home), removed when the cluster is dropped.
    pub fn add_user(&mut self) -> JobUser {
        let name = format!("tcs{}", self.node.trim_start_matches("tc"));
        self.add_user_named(&name)
    }

    /// [`Slurm::add_user`] with the name `name` (which `useradd` allows to hold a dot).
    pub fn add_user_named(&mut self, name: &str) -> JobUser {
        let name = name.to_owned();
        let output = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home"])
            .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
            .arg(&name)
            .output()
            .expect("run useradd");
        assert!(output.status.success(), "useradd {name}: {}", text(&output));
        self.users.push(name.clone());
        let id = |flag: &str| -> u32 {
            let output = Command::new("id").args([flag, &name]).output().expect("id");
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse()
                .expect("a numeric id")
        };
        JobUser {
            uid: id("-u"),
            gid: id("-g"),
            name,
        }
    }

    /// Writes `script` to the work directory and submits it with `sbatch` as the job user,
    /// from the work directory, with `args` (e.g. "-n4") and `env` added to the environment
    /// the job inherits. Returns the job id; its output goes to `out.<id>`.
    pub fn submit(&mut self, name: &str, script: &str, args: &[&str], env: &[(&str, &str)]) -> u32 {
        self.submit_as(&JobUser::nobody(), name, script, args, env)
    }

    /// [`Slurm::submit`] as `user`.
    pub fn submit_as(
        &mut self,
        user: &JobUser,
        name: &str,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> u32 {
        let path = self.work.join(format!("{name}.sh"));
        crate::write_executable(&path, script);
        let mut command = self.command("setpriv");
        command
            .args(["--reuid", &user.uid.to_string()])
            .args(["--regid", &user.gid.to_string()])
            .args(["--clear-groups", "sbatch"])
            .args(["--parsable", "-o"])
            .arg(self.work.join("out.%j"))
            .args(args)
            .arg(&path)
            .current_dir(&self.work)
            .env("HOME", &self.work)
            .env("PATH", tool_path());
        for (key, value) in env {
            command.env(key, value);
        }
        let output = command.output().expect("run sbatch");
        assert!(output.status.success(), "sbatch failed: {}", text(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let id = stdout
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("sbatch printed no job id: {stdout}"));
        self.jobs.push(id);
        id
    }

    /// Waits until `job` has left the queue, epilog included (a job stays COMPLETING until
    /// its epilog returns), and returns its output.
    pub fn wait_done(&self, job: u32, limit: Duration) -> String {
        let last_state = RefCell::new(String::new());
        let left = Lazy(|| {
            format!(
                "job {job} leaving the queue (still {}); output:\n{}\nlogs:\n{}",
                last_state.borrow(),
                self.output(job),
                self.logs()
            )
        });
        wait(limit, left)
            .every(Duration::from_millis(100))
            .blocking(|| {
                let output = self
                    .command("squeue")
                    .args(["-h", "-j", &job.to_string(), "-o", "%T"])
                    .output()
                    .expect("squeue");
                let state = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                let gone = output.status.success() && state.is_empty();
                *last_state.borrow_mut() = state;
                gone
            });
        self.output(job)
    }

    /// What job `job` printed so far.
    pub fn output(&self, job: u32) -> String {
        std::fs::read_to_string(self.work.join(format!("out.{job}"))).unwrap_or_default()
    }

    /// The job user's socket under the prolog's `SOCKET_ROOT`.
    pub fn prolog_socket(&self) -> PathBuf {
        self.prolog_socket_of(&JobUser::nobody())
    }

    /// `user`'s socket under the prolog's `SOCKET_ROOT`.
    pub fn prolog_socket_of(&self, user: &JobUser) -> PathBuf {
        self.socket_root.join(&user.name).join("tunecache.sock")
    }

    /// When slurmctld allocated `job` (its log's `sched: Allocate JobId=<job>` line, or the
    /// backfill scheduler's `_start_job: Started JobId=<job>`), in
    /// seconds since the epoch: what a job's start is measured from, since the scheduler
    /// itself only allocates on its tick (about once a second here).
    pub fn allocated_at(&self, job: u32) -> f64 {
        let log = std::fs::read_to_string(self.dir.path().join("log/slurmctld.log"))
            .expect("slurmctld's log");
        // The main scheduler says "sched: Allocate", the backfill scheduler "_start_job: Started".
        let needles = [
            format!("] sched: Allocate JobId={job} "),
            format!("] sched/backfill: _start_job: Started JobId={job} "),
        ];
        let stamp = log
            .lines()
            .find(|line| needles.iter().any(|needle| line.contains(needle)))
            .and_then(|line| line.strip_prefix('[')?.split(']').next())
            .unwrap_or_else(|| {
                let about: Vec<&str> = log
                    .lines()
                    .filter(|line| line.contains(&format!("JobId={job} ")))
                    .collect();
                panic!("no allocation of job {job} in slurmctld's log: {about:#?}")
            })
            .to_owned();
        // slurmctld logs local time with milliseconds; date(1) reads it the same way.
        let output = Command::new("date")
            .args(["-d", &stamp, "+%s.%N"])
            .output()
            .expect("date");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("date could not read {stamp:?}"))
    }

    /// What the prolog and epilog logged so far (`LOG`).
    pub fn script_log(&self) -> String {
        std::fs::read_to_string(&self.script_log).unwrap_or_default()
    }

    /// The tails of the daemons' logs and of the prolog's, for a failure message.
    pub fn logs(&self) -> String {
        let root = self.dir.path();
        let mut all = String::new();
        for log in ["log/slurmctld.log", "log/slurmd.log", "log/munged.log"] {
            let text = std::fs::read_to_string(root.join(log)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            all += &format!(
                "--- {log}\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        all += &format!(
            "--- prolog/epilog log\n{}",
            std::fs::read_to_string(&self.script_log).unwrap_or_default()
        );
        all
    }

    fn assert_daemons_alive(&mut self) {
        let mut dead = Vec::new();
        for (name, child) in &mut self.daemons {
            if let Ok(Some(status)) = child.try_wait() {
                dead.push(format!("{name} exited with {status}"));
            }
        }
        assert!(
            dead.is_empty(),
            "{}; logs:\n{}",
            dead.join(", "),
            self.logs()
        );
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // slurmd first (it holds the steps), then the controller, then munge.
        for (_, child) in self.daemons.iter_mut().rev() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            // A grace period to exit on SIGTERM, killed after it.
            let _ = wait(Duration::from_secs(10), "a Slurm daemon exiting")
                .every(Duration::from_millis(50))
                .try_blocking_some(|| (!matches!(child.try_wait(), Ok(None))).then_some(()));
            let _ = child.kill();
            let _ = child.wait();
        }
        // Daemons a prolog or a wrapper left (a failed test) go too, with their directories.
        let mut places = vec![self.dir.path().to_path_buf()];
        places.extend(self.jobs.iter().map(|job| wrapper_dir(*job)));
        for place in &places {
            for pid in daemon_pids_on(place) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for job in &self.jobs {
            let _ = std::fs::remove_dir_all(wrapper_dir(*job));
        }
        for user in &self.users {
            let _ = Command::new("userdel").args(["--force", user]).output();
        }
    }
}

/// The srun wrapper's default socket directory for `job` run by the job user.
pub fn wrapper_dir(job: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/tunecache-{JOB_UID}-{job}"))
}

/// PATH for jobs: the workspace's binaries first, then the system's.
pub fn tool_path() -> String {
    format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        crate::bin_dir().display()
    )
}

/// The repository's root (deploy/ lives there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/integration is two levels down")
        .to_path_buf()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn random_bytes(count: usize) -> Vec<u8> {
    let mut bytes = vec![0; count];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    bytes
}

/// stdout and stderr of a finished command, for a failure message.
pub fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
