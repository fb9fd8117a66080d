#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/tunecache-epilog.sh, beside tunecache-prolog.sh):
# stops the job user's tunecached on this node when this was the user's last job here.
# SIGTERM drains calls, publishes what the node has not yet published (shared directory,
# Redis; at most 3 s) and removes the socket; the journal stays in STATE_ROOT for the next job.
#
# "The user's last job here" is read from per-job marker files that the prolog writes, not
# from squeue: an epilog must not call the controller (Slurm's advice), and markers need no
# node name either.
set -uo pipefail
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
TUNECACHE_SCRIPT=tunecache-epilog
# shellcheck source-path=SCRIPTDIR source=tunecache-slurm-lib.sh
source "$here/tunecache-slurm-lib.sh" || exit 0
tunecache_load_settings "$here" || exit 0
tunecache_job_paths
[[ -d "$jobs_dir" && ! -L "$jobs_dir" ]] || exit 0      # no prolog ran on this node

tunecache_lock_user || { tunecache_log "the user's lock is busy for 30 s; the daemon is left to its idle exit"; exit 0; }
rm -f -- "$jobs_dir/$job_user.$SLURM_JOB_ID"
shopt -s nullglob
others=("$jobs_dir/$job_user".[0-9]*)
(( ${#others[@]} == 0 )) || exit 0                     # another job of the user still runs here

# The daemon that holds the user's state directory wrote "pid P serving S" into its lock file.
# That file is the user's, so the pid is checked: a live process of the job's uid running BIN.
read -r _ pid _ served <"$state_dir/daemon.lock" 2>/dev/null || exit 0
[[ "$pid" =~ ^[0-9]+$ && "$served" == "$socket" ]] || exit 0
is_the_daemon() {
    [[ -d /proc/$pid && "$(stat -c %u "/proc/$pid" 2>/dev/null)" == "$job_uid" &&
        "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$BIN")" ]]
}
is_the_daemon || exit 0
kill -TERM "$pid" 2>/dev/null || exit 0
for _ in $(seq 1 150); do                               # up to 15 s: drain (7 s) and last publish (3 s)
    is_the_daemon || exit 0
    sleep 0.1
done
tunecache_log "tunecached (pid $pid) did not exit within 15 s of SIGTERM; killed (acknowledged records are in its journal)"
kill -KILL "$pid" 2>/dev/null
exit 0
