# Shared by start-test-cluster.sh, stop-test-cluster.sh and netfault.sh (sourced, not run): the
# simulated nodes of the multi-node test cluster, one network namespace each.
#
#   pd-nodeK   network namespace and host name of node K (1-based)
#   eth0       its one link, 198.18.0.K/24, inside its namespace
#   pd-vethK   the other end of that link, here, a port of bridge pdbr0 (198.18.0.254)
#
# Faults (netfault.sh) use what a stock kernel without sch_netem has: a rate is a tbf qdisc on
# both ends of the node's link (eth0 for what the node sends, pd-vethK for what it receives);
# cuts and random loss are nftables rules in the node's own namespace (table inet pdfault: the
# set `cut` holds the peers it cannot reach, chain `loss` drops a share of every packet).

STATE=${PD_SLURM_STATE:-/var/tmp/pd-slurm}
NET=198.18.0
BRIDGE=pdbr0
CTL_ADDR=$NET.254

node_index() {  # pd-node3 -> 3
    local k=${1#pd-node}
    [[ "$1" == pd-node* && "$k" =~ ^[0-9]+$ ]] || { echo "not a test node: '$1' (pd-node1, pd-node2, ...)" >&2; return 1; }
    echo "$k"
}
node_addr() { echo "$NET.$(node_index "$1")"; }
node_veth() { echo "pd-veth$(node_index "$1")"; }
# Run "$@" inside node $1: its network namespace, with its own host name (a UTS namespace),
# its own /etc/hosts (/etc/netns/NODE/hosts), and a sysfs of its own (which shows its own
# network devices, as `ip netns exec` mounts it) that keeps this host's cgroup file systems
# (slurmd reads them at start).
in_node() {
    local node=$1; shift
    nsenter --net="/run/netns/$node" unshare --mount --uts --propagation private -- sh -c '
        set -e
        mkdir -p /run/pd-cgroup
        mount --rbind /sys/fs/cgroup /run/pd-cgroup
        mount -t sysfs "$0" /sys
        mount --rbind /run/pd-cgroup /sys/fs/cgroup
        umount -l /run/pd-cgroup
        mount --bind "/etc/netns/$0/hosts" /etc/hosts
        hostname "$0"
        exec "$@"' "$node" "$@"
}
slurmd_pidfile() {  # the single-node cluster keeps its old file name
    if [ "$1" = "$(hostname -s)" ]; then echo "$STATE/slurmd.pid"; else echo "$STATE/slurmd-$1.pid"; fi
}
test_nodes() { ip netns list 2>/dev/null | awk '$1 ~ /^pd-node[0-9]+$/ {print $1}' | sort -V; }

# Create node $1 of $2 (its namespace, link, hosts file, qdiscs); idempotent for a missing node.
make_node() {
    local node=$1 n=$2 k veth addr i
    k=$(node_index "$node"); veth=$(node_veth "$node"); addr=$(node_addr "$node")
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    ip netns del "$node" 2>/dev/null || true
    ip link del "$veth" 2>/dev/null || true
    ip netns add "$node"
    ip link add "$veth" type veth peer name eth0 netns "$node"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$node" link set lo up
    ip -n "$node" addr add "$addr/24" dev eth0
    ip -n "$node" link set eth0 up
    # Debian's /etc/hosts: the node's own name on 127.0.1.1 (the classic that makes a worker
    # advertise a loopback address), every other node by its address.
    mkdir -p "/etc/netns/$node"
    {
        echo "127.0.0.1 localhost"
        echo "127.0.1.1 $node"
        echo "$CTL_ADDR $(hostname -s)"
        for ((i = 1; i <= n; i++)); do [ "$i" = "$k" ] || echo "$NET.$i pd-node$i"; done
    } > "/etc/netns/$node/hosts"
    echo "$node" > "/etc/netns/$node/hostname"
    ip netns exec "$node" nft -f - <<NFT
table inet pdfault {
    set cut { type ipv4_addr; }
    chain loss { }
    chain input { type filter hook input priority 0; ip saddr @cut drop; jump loss; }
    chain output { type filter hook output priority 0; ip daddr @cut drop; jump loss; }
}
NFT
}

# Run "$@" (a daemon, which forks into the background and returns) with stdin from /dev/null,
# stdout and stderr appended to file $1, and no other file descriptor of this script or its
# caller: a lock or pipe held around the script must not stay held for as long as the daemon
# runs (munged keeps whatever it inherits).
run_detached() {
    local log=$1 fd; shift
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            case $fd in 0|1|2) ;; *) eval "exec $fd>&-" ;; esac
        done
        "$@" </dev/null >>"$log" 2>&1   # not exec: "$@" may be a function (in_node)
    )
}

# Start node $1's slurmd inside it, detached.
# The core node $1's processes run on: this machine's cores in turn (node 1 the first, node 2 the
# next ...), as each real node has cores of its own. Slurm's task/none leaves a job the slurmd's
# affinity; without this, vLLM's CPU backend binds every node's engine to the same first core.
node_core() {
    local cores k
    read -ra cores <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
    k=$(node_index "$1")
    echo "${cores[$(( (k - 1) % ${#cores[@]} ))]}"
}
start_slurmd() {
    local enter
    enter=$(node_cgroup_enter "$1") || return 1
    run_detached "$STATE/slurmd-$1.out" in_node "$1" sh -c "$enter"'exec "$@"' sh \
        taskset -c "$(node_core "$1")" slurmd -N "$1"
}

# A node's own compute (start-test-cluster.sh --node-cpus F, kept in $STATE/node-cpus): node $1's
# slurmd, and so every job it starts, in a CPU cgroup of its own capped at F cores (a CFS quota:
# cgroup v1's cpu.cfs_quota_us, or v2's cpu.max). Without it the simulated nodes share this
# machine's cores, and a node whose engine idles gives its CPU to the busy engines of the others,
# which a real node's accelerator never does. node_cgroup_enter prints the shell command that
# moves the calling shell into node $1's cgroup (nothing without a cap); node_cgroups_remove
# removes them all.
CPU_V1=/sys/fs/cgroup/cpu
node_cgroup_dir() {
    if [ -f "$CPU_V1/cpu.cfs_quota_us" ]; then echo "$CPU_V1/$1"
    elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "/sys/fs/cgroup/$1"
    else return 1; fi
}
node_cgroup_enter() {
    local cpus dir quota
    cpus=$(cat "$STATE/node-cpus" 2>/dev/null) || return 0
    dir=$(node_cgroup_dir "$1") || { echo "testnet: no cgroup cpu controller here for --node-cpus" >&2; return 1; }
    quota=$(awk -v c="$cpus" 'BEGIN {print int(c * 100000)}')
    mkdir -p "$dir"
    if [ -f "$dir/cpu.cfs_quota_us" ]; then
        echo 100000 > "$dir/cpu.cfs_period_us"; echo "$quota" > "$dir/cpu.cfs_quota_us"
    else
        grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
        echo "$quota 100000" > "$dir/cpu.max"
    fi
    echo "echo \$\$ > $dir/cgroup.procs && "
}
node_cgroups_remove() {
    local d
    for d in "$CPU_V1"/pd-node[0-9]* /sys/fs/cgroup/pd-node[0-9]*; do
        [ -d "$d" ] && rmdir "$d" 2>/dev/null
    done
    return 0
}

# Kill every process inside node $1's namespace with SIGKILL (as on power loss).
kill_node_processes() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}
