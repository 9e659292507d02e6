#!/usr/bin/env bash
# Stop the test cluster started by start-test-cluster.sh, single- or multi-node: cancel all
# jobs, stop every slurmd, slurmctld and munged, and remove the simulated nodes (every process
# in their namespaces, the namespaces, their links, the bridge, their /etc/netns files and,
# under --node-cpus, their CPU cgroups; the qdiscs go with the links). Errors are ignored: it is
# idempotent and safe after any crash.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/testnet.sh
. "$HERE/testnet.sh"

# Only talk to slurmctld if it answers: with it down, scancel retries for long.
if command -v scontrol >/dev/null && timeout 5 scontrol ping >/dev/null 2>&1; then
    timeout 10 scancel --user=root >/dev/null 2>&1
    sleep 1   # let slurmd kill the job steps before it goes away
fi

# Kill by pid file (only the daemons we started), wait for them to exit.
stop_pid() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || { rm -f "$1"; return 0; }
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    rm -f "$1"
}
for f in "$STATE"/slurmd.pid "$STATE"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
stop_pid "$STATE/slurmctld.pid"
stop_pid /run/munge/munged.pid

for node in $(test_nodes); do
    kill_node_processes "$node"
    ip netns del "$node" 2>/dev/null
done
for veth in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^pd-veth[0-9]+$'); do
    ip link del "$veth" 2>/dev/null
done
ip link del "$BRIDGE" 2>/dev/null
rm -rf /etc/netns/pd-node[0-9]*
node_cgroups_remove
rm -f "$STATE/nodes" "$STATE/node-cpus"
exit 0
