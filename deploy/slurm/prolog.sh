#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/tunecache-prolog.sh, PrologFlags=Alloc,Contain):
# starts one tunecached per node for the job's user before any rank runs, unless a daemon
# already answers on the socket (e.g. a systemd-managed one, or one left by a previous job).
# Runs as root on every allocated node; the daemon runs as the job's user so the ranks (same
# uid) pass its peer check and the journal stays the user's.
#
# Settings (environment of slurmd, or edit here):
#   TUNECACHE_BIN            daemon binary            (default: /usr/local/bin/tunecached)
#   TUNECACHE_SOCKET_ROOT    socket directory parent  (default: /run/tunecache-jobs)
#   TUNECACHE_STATE_ROOT     journal directory parent (default: /var/lib/tunecache-jobs; a node-local disk)
#   TUNECACHE_SHARED_DIR     shared-filesystem snapshot directory (optional)
#   TUNECACHE_IDLE_SECS      exit when idle (default: 900; the epilog stops it anyway)
#
# Ranks find the daemon through TUNECACHE_SOCKET; set it in the job (see docs/launchers.md):
#   export TUNECACHE_SOCKET=/run/tunecache-jobs/$SLURM_JOB_USER/tunecache.sock
set -euo pipefail

bin="${TUNECACHE_BIN:-/usr/local/bin/tunecached}"
user="${SLURM_JOB_USER:?prolog must run under slurmd}"
uid="${SLURM_JOB_UID:-$(id -u "$user")}"
gid="${SLURM_JOB_GID:-$(id -g "$user")}"
socket_dir="${TUNECACHE_SOCKET_ROOT:-/run/tunecache-jobs}/$user"
state_dir="${TUNECACHE_STATE_ROOT:-/var/lib/tunecache-jobs}/$user"
socket="$socket_dir/tunecache.sock"

install -d -m 0700 -o "$uid" -g "$gid" "$socket_dir" "$state_dir"

# Already serving? (a daemon of an earlier or concurrent job of the same user on this node)
if setpriv --reuid "$uid" --regid "$gid" --init-groups \
    "$(dirname "$bin")/tunecache" --socket "$socket" stats >/dev/null 2>&1; then
    exit 0
fi

args=(--socket "$socket" --state-dir "$state_dir" --exit-when-idle "${TUNECACHE_IDLE_SECS:-900}"
      --log-format json)
[[ -n "${TUNECACHE_SHARED_DIR:-}" ]] && args+=(--shared-dir "$TUNECACHE_SHARED_DIR")

# Detached (own session), outside the prolog's lifetime; the daemon's lock on <socket>.lock
# makes a concurrent start by a second job harmless (it exits "already serving").
setsid setpriv --reuid "$uid" --regid "$gid" --init-groups \
    "$bin" "${args[@]}" </dev/null >>"$state_dir/tunecached.log" 2>&1 &

# Wait (bounded) until it answers, so the first rank finds it.
for _ in $(seq 1 100); do
    [[ -S "$socket" ]] && exit 0
    sleep 0.1
done
echo "tunecache prolog: daemon did not come up on $socket; see $state_dir/tunecached.log" >&2
# Never fail the job because of its cache: ranks fall back to untuned defaults.
exit 0
