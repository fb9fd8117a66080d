#!/usr/bin/env bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/tunecache-task-prolog.sh, beside
# tunecache-prolog.sh): tells every task where its node's daemon is, so users add nothing to
# their job scripts. slurmstepd runs it as the job's user before each task and takes the lines
# it prints as `export NAME=value` into the task's environment.
#
# Prints `export TUNECACHE_SOCKET=$SOCKET_ROOT/<user>/tunecache.sock` when the prolog's daemon
# serves there, and nothing when the user set TUNECACHE_SOCKET already or there is no socket
# (the clients then use their default, or run with untuned defaults). Reads the settings the
# prolog reads; prints nothing else, not even an error (stdout is the task's environment).
set -uo pipefail
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
TUNECACHE_SCRIPT=tunecache-task-prolog
# shellcheck source-path=SCRIPTDIR source=tunecache-slurm-lib.sh
source "$here/tunecache-slurm-lib.sh" 2>/dev/null || exit 0
LOG=                                                   # the task's user may not write it
tunecache_load_settings "$here" 2>/dev/null || exit 0
[[ -z "${TUNECACHE_SOCKET:-}" ]] || exit 0
socket="$SOCKET_ROOT/${SLURM_JOB_USER:-$(id -un)}/tunecache.sock"
[[ -S "$socket" ]] && printf 'export TUNECACHE_SOCKET=%s\n' "$socket"
exit 0
