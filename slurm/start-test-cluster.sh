#!/usr/bin/env bash
# Bring up a real Slurm (munged + slurmctld + slurmd) on this machine, for tests and CI.
# Must run as root.  Idempotent: if the cluster is already up and healthy with the same
# number of nodes it does nothing; if it is half up or shaped otherwise, it is restarted.
#
#   bash slurm/start-test-cluster.sh [--nodes N] [--node-cpus F]
#
# --nodes 1 (default): one node, this host itself (NodeAddr 127.0.0.1), as it always was.
# --nodes N (N >= 2): N simulated nodes pd-node1 ... pd-nodeN, each a network namespace of the
#   same name with its own host name (a UTS namespace: `hostname` says pd-nodeK), its own
#   /etc/hosts (Debian's layout: its own name on 127.0.1.1, the other nodes by address), and
#   one link: eth0 inside, 198.18.0.K/24, a veth pair to the bridge pdbr0 (198.18.0.254, the
#   controller's address in this namespace). 198.18.0.0/15 is reserved for network tests
#   (RFC 2544): no route leads out of the bridge, there is no NAT and no default route, so
#   nothing beyond these namespaces is ever reached. Every node runs its own `slurmd -N
#   pd-nodeK` inside its namespace; slurmctld runs here and reaches them over the bridge. All
#   nodes share the file system (as a cluster shares its parallel file system) and munge's
#   socket. Each node has 1 CPU for Slurm (one task each) and feature "ib". Partitions: debug
#   (default, every node, PriorityTier 2), prefill (the first half of the nodes, preemptible:
#   PriorityTier 1, PreemptMode=REQUEUE under PreemptType=preempt/partition_prio) and decode
#   (the second half, PriorityTier 2, never preempted). slurm/netfault.sh shapes and breaks
#   the links and nodes; slurm/stop-test-cluster.sh removes all of it.
# --node-cpus F (with --nodes N >= 2): each node's processes capped at F cores in all (a CPU cgroup
#   per node, testnet.sh's node_cgroup_enter), as a real node's compute is its own: without it the
#   nodes share this machine's cores and an idle node's share goes to the busy ones (the elastic
#   pools' benchmark, BENCHMARKS.md, needs the cap). Default: no cap.
#
#   PD_SLURM_STATE   state/spool/log dir (default /var/tmp/pd-slurm)
set -euo pipefail

STATE=${PD_SLURM_STATE:-/var/tmp/pd-slurm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=/etc/slurm/slurm.conf   # where Debian's slurm looks by default
TIMEOUT=60
NODES=1
NODE_CPUS=
while [ $# -gt 0 ]; do
    case $1 in
        --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
        --nodes=*) NODES=${1#--nodes=}; shift ;;
        --node-cpus) NODE_CPUS=${2:?--node-cpus needs a number}; shift 2 ;;
        --node-cpus=*) NODE_CPUS=${1#--node-cpus=}; shift ;;
        *) echo "start-test-cluster: unknown argument $1 (usage: start-test-cluster.sh [--nodes N]" \
                "[--node-cpus F])" >&2; exit 2 ;;
    esac
done
[[ "$NODES" =~ ^[1-9][0-9]?$ ]] && [ "$NODES" -le 64 ] \
    || { echo "start-test-cluster: --nodes must be 1..64, not '$NODES'" >&2; exit 2; }
if [ -n "$NODE_CPUS" ]; then
    [[ "$NODE_CPUS" =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v c="$NODE_CPUS" 'BEGIN {exit !(c >= 0.01)}' \
        || { echo "start-test-cluster: --node-cpus must be a number of cores >= 0.01, not '$NODE_CPUS'" >&2; exit 2; }
    [ "$NODES" -ge 2 ] || { echo "start-test-cluster: --node-cpus needs --nodes 2 or more" >&2; exit 2; }
fi

[ "$(id -u)" = 0 ] || { echo "start-test-cluster: must run as root" >&2; exit 1; }
# shellcheck source=slurm/testnet.sh
. "$HERE/testnet.sh"
if [ "$NODES" = 1 ]; then
    NODE_NAMES=$(hostname -s)
else
    NODE_NAMES=$(for ((k = 1; k <= NODES; k++)); do echo "pd-node$k"; done)
fi

alive() { local pid; pid=$(cat "$1" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; }

# Run daemon NAME ("$@", which forks into the background and returns) detached
# (testnet.sh's run_detached: no file of this script or its caller held open, output appended to
# $STATE/NAME.out); stop here when it fails to start.
start_daemon() {
    local name=$1; shift
    run_detached "$STATE/$name.out" "$@" || {
        echo "start-test-cluster: $name did not start ($*); $STATE/$name.out:" >&2
        tail -n 20 "$STATE/$name.out" >&2 || true
        exit 1
    }
}

# Healthy = our daemons run, munge round-trips, and the node is usable.  (The
# pid check matters: slurmctld keeps reporting a dead slurmd's node as idle
# for SlurmdTimeout.)
healthy() {
    [ "$(cat "$STATE/nodes" 2>/dev/null)" = "$NODES" ] || return 1
    [ "$(cat "$STATE/node-cpus" 2>/dev/null)" = "$NODE_CPUS" ] || return 1
    alive "$STATE/slurmctld.pid" || return 1
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || return 1
    local node st
    for node in $NODE_NAMES; do
        alive "$(slurmd_pidfile "$node")" || return 1
        st=$(timeout 10 sinfo -h -n "$node" -o %T 2>/dev/null) || return 1
        [[ "$st" =~ ^(idle|mixed|allocated|completing|planned)$ ]] || return 1
    done
}

summary() {
    if [ "$NODES" = 1 ]; then
        echo "slurm: up (node $NODE_NAMES, partition debug, feature ib)"
    else
        echo "slurm: up ($NODES nodes pd-node1..pd-node$NODES on bridge $BRIDGE $NET.0/24," \
             "partitions debug, prefill, decode; feature ib)"
    fi
}

if command -v sinfo >/dev/null && [ -f "$CONF" ] && healthy; then
    summary; exit 0
fi

# --- packages (only if missing) -------------------------------------------
# One apt-get for whatever is missing; several nodes also need nftables (netfault.sh's cuts
# and loss) and iperf3 (to measure a link).
missing=()
for cmd in slurmctld slurmd munged sbatch; do
    command -v "$cmd" >/dev/null || { missing+=(slurm-wlm munge); break; }
done
if [ "$NODES" -gt 1 ]; then
    command -v nft >/dev/null || missing+=(nftables)
    command -v iperf3 >/dev/null || missing+=(iperf3)
fi
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Anything left over (stale or half-started daemons) goes first.
"$HERE/stop-test-cluster.sh" >/dev/null 2>&1 || true

# --- munge ------------------------------------------------------------------
mkdir -p "$STATE"
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
# --force: override munged's refusal over a leftover socket (after kill -9)
# or "insecure" dir permissions, both common in containers.
start_daemon munged runuser -u munge -- munged --force

# --- slurm.conf -------------------------------------------------------------
# A cold start is a new cluster: no job of the last one survives. slurmctld would recover them
# from its saved state and requeue them (JobRequeue=1), and they would take the nodes from the
# caller (a suite run on a machine whose /var/tmp outlived an earlier run's cluster found every
# node "allocated" to jobs whose processes were long gone).
rm -rf "$STATE/ctld" "$STATE/spool"
mkdir -p "$STATE/ctld" "$STATE/spool" /etc/slurm
rm -f "$STATE/nodes" "$STATE/node-cpus"
CPUS=$(nproc)
# slurmd drains a node whose configured RealMemory exceeds what it finds, so
# stay below the currently available memory; keep at least 256 MB.
MEM=$(free -m | awk '/^Mem:/ {m = $7 - 512; print (m < 256 ? 256 : m)}')

if [ "$NODES" = 1 ]; then
    CTL_HOST="$NODE_NAMES(127.0.0.1)"
    SLURMD_FILES="SlurmdSpoolDir=$STATE/spool
SlurmdPidFile=$STATE/slurmd.pid
SlurmdLogFile=$STATE/slurmd.log"
    NODE_LINES="NodeName=$NODE_NAMES NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM Feature=ib State=UNKNOWN"
    PART_LINES="PartitionName=debug Nodes=$NODE_NAMES Default=YES MaxTime=INFINITE State=UP"
else
    CTL_HOST="$(hostname -s)($CTL_ADDR)"
    # One slurmd per node on one file system: each its own spool, pid and log file (%n: the
    # node name).
    SLURMD_FILES="SlurmdSpoolDir=$STATE/spool/%n
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmdLogFile=$STATE/slurmd-%n.log
# A node that stops answering (netfault.sh lost) is marked down within ~20 s, not 300.
SlurmdTimeout=20
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE"
    NODE_LINES=""
    for ((k = 1; k <= NODES; k++)); do
        NODE_LINES+="NodeName=pd-node$k NodeAddr=$NET.$k NodeHostname=pd-node$k CPUs=1 RealMemory=$MEM Feature=ib State=UNKNOWN"$'\n'
    done
    half=$((NODES / 2))
    PART_LINES="PartitionName=debug Nodes=pd-node[1-$NODES] Default=YES MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PartitionName=prefill Nodes=pd-node[1-$half] MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=decode Nodes=pd-node[$((half + 1))-$NODES] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
fi

cat > "$CONF" <<EOF
# Generated by pd-pipeline slurm/start-test-cluster.sh --nodes $NODES -- do not edit.
ClusterName=pdtest
SlurmctldHost=$CTL_HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire+1 s before it may start again (default 120).
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
$SLURMD_FILES
# No cgroups in containers: plain /proc based tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
# Re-check pending jobs every few seconds (defaults 60/30 s): requeued and
# newly eligible jobs start quickly.
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# No accounting daemon: sacct fails (submitit then reports state UNKNOWN).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
MaxArraySize=1001
KillWait=5
# Finished jobs stay visible to "scontrol show job" for 5 minutes.
MinJobAge=300
$NODE_LINES
$PART_LINES
EOF

# --- nodes and daemons ------------------------------------------------------
if [ "$NODES" = 1 ]; then
    start_daemon slurmctld slurmctld
    start_daemon slurmd slurmd -N "$NODE_NAMES"   # explicit: hostname may be an FQDN
else
    for node in $NODE_NAMES; do make_node "$node" "$NODES"; mkdir -p "$STATE/spool/$node"; done
    [ -z "$NODE_CPUS" ] || echo "$NODE_CPUS" > "$STATE/node-cpus"   # read by start_slurmd
    # slurmctld and every slurmd cold-start together (Slurm's multi-node emulation recipe).
    start_daemon slurmctld slurmctld
    for node in $NODE_NAMES; do start_slurmd "$node"; done
fi
echo "$NODES" > "$STATE/nodes"

fail() {
    echo "start-test-cluster: $*" >&2
    for f in "$STATE/slurmctld.log" "$STATE"/slurmd*.log "$STATE"/*.out; do
        echo "--- tail $f" >&2; tail -n 20 "$f" >&2 2>/dev/null || true
    done
    exit 1
}

for ((i = 0; i < TIMEOUT; i++)); do
    st=$(timeout 5 sinfo -h -n "$(echo $NODE_NAMES | tr ' ' ,)" -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
    [ "$st" = "idle " ] && { summary; exit 0; }
    sleep 1
done
fail "nodes not idle after ${TIMEOUT}s (states: '${st:-no answer}')"
