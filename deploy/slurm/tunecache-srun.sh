# shellcheck shell=bash
# Without prolog/epilog: source this in a batch script to start one tunecached per node of the
# job as an overlapping job step, and stop them when the script ends:
#
#   source /path/to/tunecache-srun.sh || exit 1   # starts the daemons, exports TUNECACHE_SOCKET
#   srun python train.py                          # ranks use their node's daemon
#   tunecache_stop                                # optional: also done by the EXIT trap
#
# Settings (environment, all optional):
#   TUNECACHE_BIN, TUNECACHE_CLI   daemon and CLI (default: tunecached, tunecache on PATH)
#   TUNECACHE_SOCKET_DIR           this job's directory on every node (default
#                                  /tmp/tunecache-<uid>-<job>), removed when the job stops them
#   TUNECACHE_STATE_DIR            journal parent; each node keeps <it>/<node> (default
#                                  ~/.local/state/tunecache), 0700, the daemon's log included
#                                  (<it>/<node>/tunecached.log). A node whose directory another
#                                  job's daemon holds, or where it cannot be made (no writable
#                                  home), journals in this job's directory, for this job only:
#                                  that journal goes with the directory when the job ends, so
#                                  its entries outlive the job only in --shared-dir (or Redis).
#   TUNECACHE_DAEMON_FLAGS         more daemon flags, split on spaces (e.g. --shared-dir DIR)
#
# What it guarantees: exactly one daemon per node (--ntasks equal to the node count); a socket
# directory this job created, 0700 and its own, on every node (a directory someone else made
# first fails the start, loudly); readiness proven by each daemon's Stats (this uid, and the pid
# the step started); a daemon that stops before it serves has its last log lines and its log's
# path printed; at the end SIGTERM to each daemon alone (drain, last publish, socket removed; it
# stops its tuner itself), then the job's directory removed. Nothing is cancelled or
# interrupted, so the job's output holds no error line of srun's. The daemon lives as long as
# its step (no idle exit: a job quiet for hours keeps it).
# Needs Slurm >= 20.11 (--overlap, so the daemon step does not hold the ranks' CPUs).

tunecache_bin="${TUNECACHE_BIN:-tunecached}"
tunecache_cli="${TUNECACHE_CLI:-tunecache}"
tunecache_socket_dir="${TUNECACHE_SOCKET_DIR:-/tmp/tunecache-$(id -u)-${SLURM_JOB_ID:?tunecache-srun.sh runs inside a Slurm job}}"
tunecache_state_base="${TUNECACHE_STATE_DIR:-${HOME:-/nonexistent}/.local/state/tunecache}"
export TUNECACHE_SOCKET="$tunecache_socket_dir/tunecache.sock"

# One task per node, as its own step: the explicit --ntasks overrides the job's SLURM_NTASKS,
# which srun would otherwise inherit (and start one daemon per task). Not bound to the ranks'
# CPUs, where the site binds at all (under task/none srun would only warn about the flag).
tunecache_per_node=(--overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES"
                    --ntasks-per-node=1 --kill-on-bad-exit=0)
if ! timeout 2 scontrol show config 2>/dev/null | grep -Eq '^TaskPlugin +=( +task/none)? *$'; then
    tunecache_per_node+=(--cpu-bind=none)
fi

# The daemon step's task: make the socket directory (mkdir fails on one that exists: nobody
# else's may be used), pick the state directory (0700: the journal and log are this user's
# alone), note the pid and the step, run the daemon, and remove the job's directory once it
# has stopped. A daemon that stops before it served (the ready task marks `served`) has its
# last log lines and the log's path printed, and the task ends quietly: the start's failure
# is then said once, by this wrapper.
# shellcheck disable=SC2016  # expanded by the task's shell
tunecache_node_task='
dir=$1 state_base=$2 bin=$3; shift 3
node=${SLURMD_NODENAME:-$(hostname -s)}
if ! mkdir -m 0700 -- "$dir" 2>/dev/null; then
    read -r owner mode kind < <(stat -c "%u %a %F" -- "$dir" 2>/dev/null)
    if [[ -L $dir || $owner != $(id -u) || $mode != 700 || $kind != directory ]]; then
        echo "tunecache-srun: on $node, $dir exists and is not this user'"'"'s private directory (owner uid ${owner:-?}, mode ${mode:-?}, ${kind:-?}); another user may have made it first. Set TUNECACHE_SOCKET_DIR to a directory of your own (or have its owner or an administrator remove it)" >&2
        exit 3
    fi
fi
state=$state_base/$node
log=$state/tunecached.log
if ! mkdir -p -m 0700 -- "$state" 2>/dev/null || ! chmod 0700 -- "$state" 2>/dev/null ||
    ! : >>"$log" 2>/dev/null; then
    echo "tunecache-srun: on $node, $state cannot be made (set TUNECACHE_STATE_DIR to a writable directory); this job journals in $dir/state and keeps it only for this job" >&2
    state=$dir/state log=$dir/tunecached.log
else
    # The daemon keeps fd 8 and with it this lock as long as it runs: a second job on the node
    # finds the lock taken at once (no gap between a test and the daemon'"'"'s own lock).
    exec 8>>"$state/wrapper.lock"
    if ! flock -n 8; then
        exec 8>&-
        echo "tunecache-srun: on $node, $state belongs to another job'"'"'s daemon; this job journals in $dir/state, which goes when the job ends (its entries outlive it only in --shared-dir)" >&2
        state=$dir/state
    fi
    # Bounded: copied to .1 and emptied once over 1 MiB (the daemon appends, so it goes on at
    # the start of the emptied file).
    if [[ $(stat -c %s -- "$log") -gt 1048576 ]]; then cp -f -- "$log" "$log.1" && : >"$log"; fi
fi
offset=$(stat -c %s -- "$log" 2>/dev/null || echo 0)
echo "$SLURM_STEP_ID" >"$dir/step"
"$bin" --socket "$dir/tunecache.sock" --state-dir "$state" \
    --log-format json "$@" >>"$log" 2>&1 </dev/null &
daemon=$!
echo "$daemon" >"$dir/daemon.pid"
wait "$daemon"
status=$?
exec 8>&-
if [[ ! -e $dir/served ]]; then
    {
        echo "tunecache-srun: on $node, tunecached exited with status $status before it served; its last lines ($log):"
        tail -c +"$((offset + 1))" -- "$log" 2>/dev/null | tail -n 8 | cut -c 1-400 | sed "s/^/    | /"
    } >&2
    status=0
fi
rm -rf -- "$dir"
exit "$status"
'
# shellcheck disable=SC2086  # TUNECACHE_DAEMON_FLAGS is split on spaces, as documented
srun "${tunecache_per_node[@]}" --job-name=tunecached \
    bash -c "$tunecache_node_task" tunecache-node "$tunecache_socket_dir" "$tunecache_state_base" \
    "$tunecache_bin" ${TUNECACHE_DAEMON_FLAGS:-} &
tunecache_step_pid=$!

# SIGTERM to each node's daemon alone, by the pid its task noted, from a step of one task per
# node: not `scancel --signal`, which signals every process of the step (the tuner worker
# too) and has slurmstepd print a CANCELLED line into the job's output, and not a signal to
# srun, which would end the step with SIGKILL.
# shellcheck disable=SC2016  # expanded by the task's shell
tunecache_term_task='
pid=$(cat -- "$1/daemon.pid" 2>/dev/null) && kill -TERM "$pid" 2>/dev/null
exit 0
'
tunecache_stop() {
    trap - EXIT
    local step
    step="$(cat -- "$tunecache_socket_dir/step" 2>/dev/null)"
    if [[ "$step" =~ ^[0-9]+$ ]] && kill -0 "$tunecache_step_pid" 2>/dev/null; then
        srun "${tunecache_per_node[@]}" --job-name=tunecache-stop \
            bash -c "$tunecache_term_task" tunecache-stop "$tunecache_socket_dir"
        for _ in $(seq 1 200); do                 # 20 s: drain (7 s) and last publish (3 s)
            kill -0 "$tunecache_step_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$tunecache_step_pid" 2>/dev/null; then
            echo "tunecache-srun: a daemon did not stop within 20 s of SIGTERM; cancelling its step" >&2
            scancel "$SLURM_JOB_ID.$step" 2>/dev/null
        fi
    fi
    wait "$tunecache_step_pid" 2>/dev/null
    return 0
}
trap tunecache_stop EXIT

# Ready when every node's daemon answers Stats as this uid with the pid its task wrote: the
# daemon we started, not one someone else serves on the path (the CLI also refuses a daemon of
# another uid by the connection's peer credentials). Each node's task says `ready` or `failed`
# and ends quietly: failed at once when the daemon is gone (its task says why), after 30 s
# when it does not answer.
# shellcheck disable=SC2016
tunecache_ready_task='
dir=$1 cli=$2 node=${SLURMD_NODENAME:-$(hostname -s)} seen=
for _ in $(seq 1 300); do
    if [[ -e $dir || -L $dir ]]; then
        read -r owner mode < <(stat -c "%u %a" -- "$dir" 2>/dev/null)
        if [[ -L $dir || $owner != $(id -u) || $mode != 700 ]]; then
            echo "tunecache-ready: failed on $node"   # not this job'"'"'s: its task says so
            exit 0
        fi
        seen=1
    elif [[ -n $seen ]]; then
        echo "tunecache-ready: failed on $node"       # removed: the daemon has stopped
        exit 0
    fi
    pid=$(cat -- "$dir/daemon.pid" 2>/dev/null)
    stats=$("$cli" --socket "$dir/tunecache.sock" --json stats 2>/dev/null)
    if [[ -n $pid && $stats == *"\"daemon_pid\":$pid,"* && $stats == *"\"daemon_uid\":$(id -u)"[,}]* ]]; then
        : >"$dir/served"
        echo "tunecache-ready: ready on $node"
        exit 0
    fi
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
        echo "tunecache-ready: failed on $node"
        exit 0
    fi
    sleep 0.1
done
echo "tunecache-srun: on $node, the daemon started for this job did not answer on $dir/tunecache.sock within 30 s; see its tunecached.log (in TUNECACHE_STATE_DIR/$node, or $dir)" >&2
echo "tunecache-ready: failed on $node"
exit 0
'
tunecache_ready="$(srun "${tunecache_per_node[@]}" bash -c "$tunecache_ready_task" tunecache-ready \
    "$tunecache_socket_dir" "$tunecache_cli")"
if [[ "$(grep -c '^tunecache-ready: ready on ' <<<"$tunecache_ready")" != "$SLURM_JOB_NUM_NODES" ]]; then
    tunecache_stop
    echo "tunecache-srun: tunecached is not serving on every node (why is said above); ranks will use untuned defaults" >&2
    # shellcheck disable=SC2317  # exit only when run instead of sourced
    return 1 2>/dev/null || exit 1
fi
