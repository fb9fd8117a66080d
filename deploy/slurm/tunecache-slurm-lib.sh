# shellcheck shell=bash disable=SC2034  # the variables set here are the sourcing script's
# Sourced by tunecache-prolog.sh, tunecache-epilog.sh and tunecache-task-prolog.sh: their
# settings file, the per-user paths, the per-user lock that orders a prolog against an epilog,
# the log, which process is the user's daemon, which job markers are stale, and what of the
# daemon's health reaches LOG.
#
# Job markers and the lock live in a directory per uid, $SOCKET_ROOT/.jobs/<uid>/ (root's,
# 0755, so the user's daemon can read it: --job-markers), one file per job named by its id.
# Keyed by uid and compared whole, no user name can reach another user's markers or lock.
#
# Slurm gives a prolog or epilog only SLURM_* variables (no PATH), so nothing here is read from
# the environment: the settings come from tunecache-slurm.conf beside the scripts, else
# /etc/tunecache/slurm.conf. The scripts run as root, so that file must be root's alone, and
# it is parsed as KEY=VALUE lines, never executed.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

BIN=/usr/local/bin/tunecached
CLI=
SOCKET_ROOT=/run/tunecache-jobs
STATE_ROOT=/var/lib/tunecache-jobs
SHARED_DIR=
CLUSTER_URL=
EXTRA_FLAGS=
IDLE_SECS=900
LOG=/var/log/tunecache/tunecache-slurm.log
# The daemon's own log ($STATE_ROOT/<user>/tunecached.log) is copied to tunecached.log.1 and
# emptied by the prolog once it is larger than this: at most twice this, plus what one
# daemon writes between two of the user's jobs.
DAEMON_LOG_MAX_BYTES=1048576

# tunecache_log LEVEL MESSAGE: to the log file (its directory made if missing), to syslog
# when the node has one, at that priority (err, warning, notice, info), and to stderr.
tunecache_log() {
    local level=$1 line
    shift
    line="$(date '+%F %T') ${TUNECACHE_SCRIPT:-tunecache} job ${SLURM_JOB_ID:-?} user ${SLURM_JOB_USER:-?}: $*"
    if [[ -n "$LOG" ]]; then
        [[ -d "${LOG%/*}" ]] || install -d -m 0755 -- "${LOG%/*}" 2>/dev/null
        printf '%s\n' "$line" 2>/dev/null >>"$LOG"
    fi
    if [[ -S /dev/log ]] && command -v logger >/dev/null 2>&1; then
        logger -t tunecache-slurm -p "user.$level" -- "$line" 2>/dev/null
    fi
    printf '%s\n' "$line" >&2
}

# tunecache_load_settings DIR: reads the first settings file that exists; returns 1 (after
# logging why) when it is not root's alone or holds a line it does not understand. The
# refusal of a line goes to the file's LOG (a root-only file's LOG is the admin's word); that
# of a file others may write goes to the built-in LOG, since its lines may be anyone's.
tunecache_load_settings() {
    local candidate conf="" line key value owner mode refused=""
    for candidate in "$1/tunecache-slurm.conf" /etc/tunecache/slurm.conf; do
        if [[ -e "$candidate" || -L "$candidate" ]]; then conf="$candidate"; break; fi
    done
    TUNECACHE_CONF="${conf:-(none: built-in defaults)}"
    [[ -n "$conf" ]] || return 0
    if [[ -L "$conf" || ! -f "$conf" ]]; then
        tunecache_log err "settings $conf: not a regular file (or a symlink); ignored"
        return 1
    fi
    read -r owner mode < <(stat -c '%u %a' -- "$conf")
    if [[ "$owner" != 0 ]] || (( 8#$mode & 8#022 )); then
        tunecache_log err "settings $conf: owned by uid $owner with mode $mode; it must be root's, writable by root only"
        return 1
    fi
    while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"
        line="${line#"${line%%[![:space:]]*}"}"
        line="${line%"${line##*[![:space:]]}"}"
        [[ -z "$line" ]] && continue
        key="${line%%=*}"
        value="${line#*=}"
        if [[ "$line" != *=* ]]; then
            [[ -n "$refused" ]] || refused="cannot read the line '$line' (KEY=VALUE expected)"
            continue
        fi
        value="${value#\"}"; value="${value%\"}"
        case "$key" in
            BIN | CLI | SOCKET_ROOT | STATE_ROOT | SHARED_DIR | CLUSTER_URL | EXTRA_FLAGS | IDLE_SECS | LOG | DAEMON_LOG_MAX_BYTES)
                printf -v "$key" '%s' "$value" ;;
            *)
                [[ -n "$refused" ]] || refused="unknown key '$key'" ;;
        esac
    done <"$conf"
    if [[ -n "$refused" ]]; then
        tunecache_log err "settings $conf: $refused; the job runs without tunecache"
        return 1
    fi
    [[ -n "$CLI" ]] || CLI="$(dirname -- "$BIN")/tunecache"
}

# tunecache_job_paths: the job user's socket and state directories, and the directory of the
# user's job markers and lock (root's, outside the user's reach), keyed by uid.
tunecache_job_paths() {
    job_user="${SLURM_JOB_USER:?must run under slurmd}"
    job_uid="${SLURM_JOB_UID:-$(id -u -- "$job_user")}"
    job_gid="${SLURM_JOB_GID:-$(id -g -- "$job_user")}"
    socket_dir="$SOCKET_ROOT/$job_user"
    socket="$socket_dir/tunecache.sock"
    state_dir="$STATE_ROOT/$job_user"
    daemon_log="$state_dir/tunecached.log"
    jobs_dir="$SOCKET_ROOT/.jobs"
    marker_dir="$jobs_dir/$job_uid"
}

# tunecache_move_old_markers: markers of the layout before per-uid directories
# ($SOCKET_ROOT/.jobs/<user>.<jobid>), of exactly this user, are moved into the user's
# directory, so a job that started before an upgrade keeps its daemon. Only names whose part
# after "<user>." is all digits are this user's ("bob.7.94" is user bob.7's, not bob's).
tunecache_move_old_markers() {
    local old rest
    shopt -s nullglob
    for old in "$jobs_dir/$job_user".*; do
        rest="${old#"$jobs_dir/$job_user."}"
        [[ "$rest" =~ ^[0-9]+$ && -f "$old" && ! -L "$old" ]] && mv -f -- "$old" "$marker_dir/$rest"
    done
}

# tunecache_marked_jobs: the ids of the user's job markers on this node, one a line.
tunecache_marked_jobs() {
    local marker
    shopt -s nullglob
    for marker in "$marker_dir"/*; do
        marker="${marker##*/}"
        [[ "$marker" =~ ^[0-9]+$ ]] && printf '%s\n' "$marker"
    done
}

# tunecache_lock_user: holds the user's lock on fd 9 until the script exits, so a prolog never
# finds the daemon alive just before an epilog stops it. Bounded: 30 s.
tunecache_lock_user() {
    exec 9>>"$marker_dir/lock"
    flock -w 30 9
}

# as_job_user CMD...: runs CMD with the job user's uid, gid and groups.
as_job_user() {
    setpriv --reuid "$job_uid" --regid "$job_gid" --init-groups -- "$@"
}

# tunecache_alive PID: the process exists and is not a zombie.
tunecache_alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ -n "$stat" && "${stat:0:1}" != Z ]]
}

# tunecache_daemon_pid: prints the pid of the daemon that holds the user's state directory
# and serves the user's socket; returns 1 when there is none. The pid is the one the daemon
# wrote into daemon.lock, and it counts only if that process runs as the job's uid and holds
# the flock on that very file (/proc/locks): not the binary's path, which an upgrade replaces
# under a running daemon (/proc/PID/exe then reads "... (deleted)").
tunecache_daemon_pid() {
    local lock="$state_dir/daemon.lock" pid served dev inode major minor
    [[ -f "$lock" && ! -L "$lock" ]] || return 1
    read -r _ pid _ served <"$lock" 2>/dev/null || return 1
    [[ "$pid" =~ ^[0-9]+$ && "$served" == "$socket" ]] || return 1
    tunecache_alive "$pid" || return 1
    [[ "$(stat -c %u "/proc/$pid" 2>/dev/null)" == "$job_uid" ]] || return 1
    read -r dev inode < <(stat -c '%d %i' -- "$lock") || return 1
    # st_dev as the kernel prints it in /proc/locks: hex major:minor.
    major=$(( (dev >> 8) & 0xfff ))
    minor=$(( (dev & 0xff) | ((dev >> 12) & 0xfff00) ))
    grep -Eq "^[0-9]+: FLOCK +ADVISORY +WRITE +$pid +$(printf '%02x:%02x' "$major" "$minor"):$inode " \
        /proc/locks || return 1
    printf '%s\n' "$pid"
}

# tunecache_running_jobs: the ids of the jobs with a step on this node (`scontrol listpids`,
# which asks this node's slurmstepds, not the controller), one a line. Bounded: 2 s.
tunecache_running_jobs() {
    timeout 2 scontrol listpids 2>/dev/null | awk 'NR > 1 && $2 ~ /^[0-9]+$/ { print $2 }' | sort -u
}

# tunecache_reconcile_markers: removes (and logs) the user's markers whose job is gone from
# this node. A job with a step here (scontrol listpids) is running; for the rest (a job between
# steps, or one whose epilog never ran) the controller is asked once (squeue, the user's jobs
# on this node that are not finished, bounded: 2 s). When it does not answer, every marker is
# kept.
tunecache_reconcile_markers() {
    local job here listed suspects=()
    here="$(tunecache_running_jobs)"
    while IFS= read -r job; do
        [[ -n "$job" ]] || continue
        grep -qx -- "$job" <<<"$here" || suspects+=("$job")
    done < <(tunecache_marked_jobs)
    (( ${#suspects[@]} )) || return 0
    if ! listed="$(timeout 2 squeue -h -u "$job_uid" -w "${SLURMD_NODENAME:-$(hostname -s)}" \
        -t CONFIGURING,RUNNING,SUSPENDED,COMPLETING,STOPPED -o %A 2>/dev/null)"; then
        tunecache_log warning "squeue did not answer within 2 s; the markers of jobs ${suspects[*]} are kept"
        return 0
    fi
    for job in "${suspects[@]}"; do
        grep -qx -- "$job" <<<"$listed" && continue
        rm -f -- "$marker_dir/$job"
        tunecache_log notice "removed the stale marker of job $job (no step on this node, and squeue lists it nowhere here: its epilog never ran)"
    done
}

# tunecache_report_problems: the daemon's problems (`tunecache stats --problems` lines, CAUSE
# TAB MESSAGE, on stdin) to LOG, each cause at most once an hour for this user (a stamp file
# per cause in the user's marker directory).
tunecache_report_problems() {
    local cause message stamp said
    while IFS=$'\t' read -r cause message; do
        [[ "$cause" =~ ^[a-z][a-z-]{0,31}$ ]] || continue
        stamp="$marker_dir/logged.$cause"
        said="$(stat -c %Y -- "$stamp" 2>/dev/null)" || said=0
        (( EPOCHSECONDS - said < 3600 )) && continue
        : >"$stamp"
        # The message is the daemon's, which the user runs: cut short, control characters out.
        message="$(printf '%s' "$message" | tr -d '\000-\037' | cut -c 1-600)"
        tunecache_log warning "tunecached ($socket) reports $cause: $message (said once an hour; tunecache stats shows the rest)"
    done
}
