#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/tunecache-epilog.sh, beside tunecache-prolog.sh):
# stops the job user's tunecached on this node when this was the user's last job here.
# SIGTERM drains calls, publishes what the node has not yet published (shared directory,
# Redis; at most 3 s) and removes the socket; the journal stays in STATE_ROOT for the next job.
#
# "The user's last job here" is read from the per-job markers that the prolog writes in the
# user's directory, $SOCKET_ROOT/.jobs/<uid>/<jobid> (by uid, names compared whole: no other
# user's name reaches them). A marker whose job is gone from the node (its epilog never ran:
# slurmd restarted, a node rebooted) is found and removed here: a job with a step on this
# node (`scontrol listpids`, answered by the node's own slurmstepds) keeps its marker; for any
# other the controller is asked once (`squeue`, bounded: 2 s), and only when a marker looks
# stale, so the controller hears from an epilog rarely.
set -uo pipefail
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
TUNECACHE_SCRIPT=tunecache-epilog
# shellcheck source-path=SCRIPTDIR source=tunecache-slurm-lib.sh
source "$here/tunecache-slurm-lib.sh" || exit 0
tunecache_load_settings "$here" || exit 0
tunecache_job_paths
[[ -d "$marker_dir" && ! -L "$marker_dir" ]] || exit 0  # no prolog of this user ran here

tunecache_lock_user || { tunecache_log warning "the user's lock is busy for 30 s; the daemon is left to its idle exit"; exit 0; }
tunecache_move_old_markers
rm -f -- "$marker_dir/$SLURM_JOB_ID"
tunecache_reconcile_markers
[[ -z "$(tunecache_marked_jobs)" ]] || exit 0            # another job of the user still runs here

# The daemon that holds the user's state directory: the pid in its daemon.lock, running as the
# user and holding that lock (a replaced binary still counts).
pid="$(tunecache_daemon_pid)" || exit 0
kill -TERM "$pid" 2>/dev/null || exit 0
for _ in $(seq 1 150); do                               # up to 15 s: drain (7 s) and last publish (3 s)
    tunecache_alive "$pid" || exit 0
    sleep 0.1
done
tunecache_log warning "tunecached (pid $pid) did not exit within 15 s of SIGTERM; killed (acknowledged records are in its journal; see $daemon_log)"
kill -KILL "$pid" 2>/dev/null
exit 0
