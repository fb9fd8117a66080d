#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/tunecache-epilog.sh): stops the job user's
# tunecached on this node when the user has no other job here. SIGTERM drains calls and
# flushes the journal (the journal stays in TUNECACHE_STATE_ROOT for the next job).
set -euo pipefail

user="${SLURM_JOB_USER:?epilog must run under slurmd}"
socket="${TUNECACHE_SOCKET_ROOT:-/run/tunecache-jobs}/$user/tunecache.sock"

# Other jobs of this user still on the node keep the daemon (squeue lists this job too).
others=$(squeue --noheader --nodelist="$(hostname -s)" --user="$user" --format=%i 2>/dev/null \
    | grep -vx "${SLURM_JOB_ID:-}" | wc -l || true)
if [[ "${others:-0}" -gt 0 ]]; then
    exit 0
fi

# The daemon is the tunecached process whose command line names this socket.
pids=$(pgrep -u "$user" -f -- "tunecached --socket $socket( |$)" || true)
for pid in $pids; do
    kill -TERM "$pid" 2>/dev/null || true
done
for _ in $(seq 1 150); do          # up to 15 s: drain (7 s) and journal flush
    [[ -z "$(pgrep -u "$user" -f -- "tunecached --socket $socket( |$)" || true)" ]] && exit 0
    sleep 0.1
done
for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done   # acknowledged records are durable
exit 0
