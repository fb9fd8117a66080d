#!/usr/bin/env bash
# Without prolog/epilog: inside a batch script, start one tunecached per node as a background
# job step, run the job, then stop the daemons. Usage in an sbatch script:
#
#   source deploy/slurm/tunecache-srun.sh     # starts the daemons, exports TUNECACHE_SOCKET
#   srun python train.py                      # ranks use the node's daemon
#   tunecache_stop                            # (also done on exit by the trap)
#
# Needs `--overlap` (Slurm >= 20.11) so the daemon step does not hold the CPUs the ranks need.
export TUNECACHE_SOCKET="${TUNECACHE_SOCKET:-/tmp/tunecache-$(id -u)-$SLURM_JOB_ID/tunecache.sock}"
tunecache_state="${TUNECACHE_STATE_DIR:-$HOME/.local/state/tunecache}"

srun --overlap --ntasks-per-node=1 --nodes="$SLURM_JOB_NUM_NODES" --kill-on-bad-exit=0 \
    --cpu-bind=none --mem=0 \
    tunecached --socket "$TUNECACHE_SOCKET" --state-dir "$tunecache_state" \
               --exit-when-idle 3600 --log-format json &
tunecache_step_pid=$!

# Wait until every node's daemon answers (one check per node).
srun --overlap --ntasks-per-node=1 --nodes="$SLURM_JOB_NUM_NODES" bash -c '
    for _ in $(seq 1 100); do tunecache stats >/dev/null 2>&1 && exit 0; sleep 0.1; done
    echo "tunecached not up on $(hostname)" >&2' || true

tunecache_stop() {
    # SIGTERM to the step reaches every daemon: drain, flush, remove the socket.
    kill -TERM "$tunecache_step_pid" 2>/dev/null || true
    wait "$tunecache_step_pid" 2>/dev/null || true
}
trap tunecache_stop EXIT
