# shellcheck shell=bash disable=SC2034  # the variables set here are the sourcing script's
# Sourced by tunecache-prolog.sh and tunecache-epilog.sh: their settings file, the per-user
# paths, the per-user lock that orders a prolog against an epilog, and the log.
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
LOG=/var/log/tunecache-slurm.log

# tunecache_log MESSAGE: to the log file, syslog and stderr (slurmd keeps a failed script's).
tunecache_log() {
    local line
    line="$(date '+%F %T') ${TUNECACHE_SCRIPT:-tunecache} job ${SLURM_JOB_ID:-?} user ${SLURM_JOB_USER:-?}: $*"
    printf '%s\n' "$line" >>"$LOG" 2>/dev/null || true
    command -v logger >/dev/null 2>&1 && logger -t tunecache-slurm -- "$line" 2>/dev/null
    printf '%s\n' "$line" >&2
}

# tunecache_load_settings DIR: reads the first settings file that exists; returns 1 (after
# logging why) when it is not root's alone or holds a line it does not understand.
tunecache_load_settings() {
    local candidate conf="" line key value owner mode
    for candidate in "$1/tunecache-slurm.conf" /etc/tunecache/slurm.conf; do
        if [[ -e "$candidate" || -L "$candidate" ]]; then conf="$candidate"; break; fi
    done
    TUNECACHE_CONF="${conf:-(none: built-in defaults)}"
    [[ -n "$conf" ]] || return 0
    if [[ -L "$conf" || ! -f "$conf" ]]; then
        tunecache_log "settings $conf: not a regular file (or a symlink); ignored"
        return 1
    fi
    read -r owner mode < <(stat -c '%u %a' -- "$conf")
    if [[ "$owner" != 0 ]] || (( 8#$mode & 8#022 )); then
        tunecache_log "settings $conf: owned by uid $owner with mode $mode; it must be root's, writable by root only"
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
            tunecache_log "settings $conf: cannot read the line '$line' (KEY=VALUE expected)"
            return 1
        fi
        value="${value#\"}"; value="${value%\"}"
        case "$key" in
            BIN | CLI | SOCKET_ROOT | STATE_ROOT | SHARED_DIR | CLUSTER_URL | EXTRA_FLAGS | IDLE_SECS | LOG)
                printf -v "$key" '%s' "$value" ;;
            *)
                tunecache_log "settings $conf: unknown key '$key'"
                return 1 ;;
        esac
    done <"$conf"
    [[ -n "$CLI" ]] || CLI="$(dirname -- "$BIN")/tunecache"
}

# tunecache_job_paths: the job user's socket and state directories, the marker directory and
# the per-user lock (a root-owned file outside the user's reach).
tunecache_job_paths() {
    job_user="${SLURM_JOB_USER:?must run under slurmd}"
    job_uid="${SLURM_JOB_UID:-$(id -u -- "$job_user")}"
    job_gid="${SLURM_JOB_GID:-$(id -g -- "$job_user")}"
    socket_dir="$SOCKET_ROOT/$job_user"
    socket="$socket_dir/tunecache.sock"
    state_dir="$STATE_ROOT/$job_user"
    jobs_dir="$SOCKET_ROOT/.jobs"
}

# tunecache_lock_user: holds the user's lock on fd 9 until the script exits, so a prolog never
# finds the daemon alive just before an epilog stops it. Bounded: 30 s.
tunecache_lock_user() {
    exec 9>>"$jobs_dir/$job_user.lock"
    flock -w 30 9
}

# as_job_user CMD...: runs CMD with the job user's uid, gid and groups.
as_job_user() {
    setpriv --reuid "$job_uid" --regid "$job_gid" --init-groups -- "$@"
}
