#!/usr/bin/env bash
# Slurm Prolog: starts one tunecached per node for the job's user before any rank runs, unless
# one already answers on the user's socket (a concurrent or earlier job of the same user).
#   slurm.conf:  Prolog=/etc/slurm/tunecache-prolog.sh
#                Epilog=/etc/slurm/tunecache-epilog.sh
#                PrologFlags=Alloc       (the prolog runs at allocation, before the first step)
# Copy tunecache-slurm-lib.sh beside this script; settings: tunecache-slurm.conf beside it, or
# /etc/tunecache/slurm.conf (see deploy/slurm/tunecache-slurm.conf).
#
# Runs as root on every allocated node. The daemon runs as the job's user, so the ranks (same
# uid) pass its peer check and it passes theirs, and the journal stays the user's.
# Ranks find it through TUNECACHE_SOCKET=$SOCKET_ROOT/$SLURM_JOB_USER/tunecache.sock, which
# tunecache-task-prolog.sh (TaskProlog=) exports for every task.
#
# A problem here never fails the job or drains the node: the script logs why (LOG, syslog,
# stderr) and exits 0, and the ranks run with untuned defaults (the clients fall back when no
# daemon answers). Once a daemon answers, what it reports wrong (`tunecache stats --problems`:
# no v2/, squatting, snapshot errors, ...) goes to LOG too, each cause once an hour. The
# daemon logs to $STATE_ROOT/<user>/tunecached.log.
set -uo pipefail
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
TUNECACHE_SCRIPT=tunecache-prolog
# shellcheck source-path=SCRIPTDIR source=tunecache-slurm-lib.sh
source "$here/tunecache-slurm-lib.sh" || exit 0
tunecache_load_settings "$here" || exit 0
tunecache_job_paths

for program in "$BIN" "$CLI"; do
    if [[ ! -x "$program" ]]; then
        tunecache_log err "$program is missing or not executable (BIN= and CLI= in $TUNECACHE_CONF); the job runs without tunecache"
        exit 0
    fi
done
for dir in "$SOCKET_ROOT" "$STATE_ROOT" "$jobs_dir" "$marker_dir" "$socket_dir" "$state_dir"; do
    if [[ -L "$dir" ]]; then
        tunecache_log err "$dir is a symbolic link; refusing it, the job runs without tunecache"
        exit 0
    fi
done
# The roots and the marker directories are root's, so no user can take another user's
# directory inside them; the user's own are the user's alone (0700: journal, log, socket).
if ! install -d -m 0755 -o root -g root "$SOCKET_ROOT" "$STATE_ROOT" "$jobs_dir" "$marker_dir" ||
    ! install -d -m 0700 -o "$job_uid" -g "$job_gid" "$socket_dir" "$state_dir"; then
    tunecache_log err "cannot create $socket_dir or $state_dir; the job runs without tunecache"
    exit 0
fi

tunecache_lock_user || { tunecache_log err "the user's lock is busy for 30 s; the job runs without tunecache"; exit 0; }
tunecache_move_old_markers
# This job's marker: the epilog stops the daemon when the user's last job on the node ends,
# and the daemon counts no idle time while a marked job runs here (--job-markers).
: >"$marker_dir/$SLURM_JOB_ID"

# The daemon's log is the user's file, so it is handled as the user, never as root (the user
# may have made it a symbolic link). Bounded: copied to .1 and emptied once over the limit
# (copy and truncate, so a daemon still writing to it goes on at its start).
# shellcheck disable=SC2016  # expanded by the user's shell
as_job_user /bin/sh -c 'log=$1 max=$2
    size=$(stat -c %s -- "$log" 2>/dev/null) || exit 0
    [ "$size" -le "$max" ] || { cp -f -- "$log" "$log.1" && : >"$log"; }' \
    tunecache-log "$daemon_log" "$DAEMON_LOG_MAX_BYTES" 2>/dev/null

# serving_with_problems: whether the user's daemon answers; its problems (if any) go to LOG.
# One Stats call either way.
serving_with_problems() {
    local problems
    problems="$(as_job_user "$CLI" --socket "$socket" stats --problems 2>/dev/null)" || return 1
    [[ -z "$problems" ]] || tunecache_report_problems <<<"$problems"
    return 0
}
if serving_with_problems; then
    exit 0                                             # already serving
fi

args=(--socket "$socket" --state-dir "$state_dir" --exit-when-idle "$IDLE_SECS"
      --job-markers "$marker_dir" --log-format json)
[[ -n "$SHARED_DIR" ]] && args+=(--shared-dir "$SHARED_DIR")
[[ -n "$CLUSTER_URL" ]] && args+=(--cluster-url "$CLUSTER_URL")
# shellcheck disable=SC2206  # EXTRA_FLAGS is split on spaces, as its comment says
[[ -n "$EXTRA_FLAGS" ]] && args+=($EXTRA_FLAGS)

log_offset="$(as_job_user stat -c %s -- "$daemon_log" 2>/dev/null || echo 0)"

# The daemon's last log lines, since it was started here: read as the user, stripped of
# control characters and cut short, so that the user's file can neither fake nor flood LOG.
daemon_log_tail() {
    as_job_user tail -c +"$((log_offset + 1))" -- "$daemon_log" 2>/dev/null | tail -n 8 |
        tr -d '\000-\010\013-\037' | cut -c 1-400 | sed 's/^/    | /'
}

# Detached (own session), outside the prolog's lifetime, without the lock's fd 9. The log is
# opened by the user's shell, not by root: the state directory is the user's to plant links in.
# shellcheck disable=SC2016  # expanded by the user's shell
setsid setpriv --reuid "$job_uid" --regid "$job_gid" --init-groups -- \
    /bin/sh -c 'log=$1; shift; exec "$@" >>"$log" 2>&1' tunecached "$daemon_log" \
    "$BIN" "${args[@]}" </dev/null >/dev/null 2>&1 9>&- &
daemon_pid=$!

# Until it answers, so the first rank finds it; at most 10 s. The spawned process is checked
# on every turn (50 ms), so a daemon that exits at once (a bad flag, a refused setting) costs
# the job about that, not the whole wait.
deadline=$(( ${EPOCHREALTIME/./} + 10000000 ))
while (( ${EPOCHREALTIME/./} < deadline )); do
    if [[ -S "$socket" ]] && serving_with_problems; then
        exit 0
    fi
    if ! tunecache_alive "$daemon_pid"; then
        wait "$daemon_pid"
        status=$?
        tunecache_log err "tunecached exited with status $status before it answered on $socket; the job runs without it. Its last lines ($daemon_log):
$(daemon_log_tail)"
        exit 0
    fi
    sleep 0.05
done
tunecache_log err "tunecached (pid $daemon_pid) did not answer on $socket within 10 s; the job runs without it (the daemon goes on starting). Its last lines ($daemon_log):
$(daemon_log_tail)"
exit 0
