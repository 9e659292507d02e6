#!/usr/bin/env bash
# Stop the test cluster started by start-test-cluster.sh: cancel all jobs,
# then stop slurmd, slurmctld and munged.  Errors are ignored.
STATE=${PD_SLURM_STATE:-/var/tmp/pd-slurm}

# Only talk to slurmctld if it answers: with it down, scancel retries for long.
if command -v scontrol >/dev/null && timeout 5 scontrol ping >/dev/null 2>&1; then
    timeout 10 scancel --partition=debug >/dev/null 2>&1
    sleep 1   # let slurmd kill the job steps before it goes away
fi

# Kill by pid file (only the daemons we started), wait for them to exit.
stop_pid() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    rm -f "$1"
}
stop_pid "$STATE/slurmd.pid"
stop_pid "$STATE/slurmctld.pid"
stop_pid /run/munge/munged.pid
exit 0
