#!/usr/bin/env bash
# Break or shape one simulated node of the multi-node test cluster
# (slurm/start-test-cluster.sh --nodes N), as a test or a person reproducing a failure would:
#
#   netfault.sh NODE lost               the node is gone as on power loss: its link goes down,
#                                       then every process in its namespace (slurmd and the
#                                       workers included) is killed with SIGKILL
#   netfault.sh NODE back               link up again and a fresh slurmd (Slurm returns the node
#                                       to service when it registers: ReturnToService=2)
#   netfault.sh NODE cut PEER [SECONDS] drop every packet between NODE and PEER (both ways), for
#                                       SECONDS (then healed by itself) or until `heal`
#   netfault.sh NODE heal [PEER]        end NODE's cuts (with PEER, only that one)
#   netfault.sh NODE rate MBIT          shape NODE's link to MBIT Mbit/s each way (tbf)
#   netfault.sh NODE loss PCT           drop PCT% of NODE's packets, each way, at random (nftables)
#   netfault.sh NODE delay MS           add MS ms each way (netem; refused where the kernel
#                                       has no sch_netem, as on the project's machines)
#   netfault.sh NODE clear              rate, loss and delay back to none (cuts stay: `heal`)
#   netfault.sh NODE show               the node's link state, counters, qdiscs and rules
#
# NODE and PEER are pd-node1 ... pd-nodeN. Exit 2: bad arguments; 3: not possible here.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/testnet.sh
. "$HERE/testnet.sh"

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
NODE=$1 ACTION=$2; shift 2
node_index "$NODE" >/dev/null || exit 2
ip netns list | awk '{print $1}' | grep -qx "$NODE" \
    || { echo "netfault: no node $NODE here (start it with slurm/start-test-cluster.sh --nodes N)" >&2; exit 2; }
VETH=$(node_veth "$NODE")
number() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "netfault: $ACTION needs a number, not '$1'" >&2; exit 2; }; }

# tbf on both ends: the node's eth0 shapes what it sends, the bridge port what it receives.
# Burst: 10 ms of traffic (at least 32 KiB), as tbf needs more than rate/HZ to reach its rate.
set_rate() {
    local mbit=$1 burst
    burst=$(awk -v m="$mbit" 'BEGIN {b = m * 1e6 / 8 / 100; print int(b < 32768 ? 32768 : b)}')
    ip netns exec "$NODE" tc qdisc replace dev eth0 root tbf rate "${mbit}mbit" burst "$burst" latency 100ms
    tc qdisc replace dev "$VETH" root tbf rate "${mbit}mbit" burst "$burst" latency 100ms
}
clear_shape() {
    ip netns exec "$NODE" tc qdisc del dev eth0 root 2>/dev/null || true
    tc qdisc del dev "$VETH" root 2>/dev/null || true
    ip netns exec "$NODE" nft flush chain inet pdfault loss
}
cut_one() {  # drop NODE <-> PEER in both namespaces
    ip netns exec "$1" nft add element inet pdfault cut "{ $(node_addr "$2") }"
}
heal_one() {
    ip netns exec "$1" nft delete element inet pdfault cut "{ $(node_addr "$2") }" 2>/dev/null || true
}

case $ACTION in
    lost)
        ip link set "$VETH" down
        ip -n "$NODE" link set eth0 down
        kill_node_processes "$NODE"
        rm -f "$(slurmd_pidfile "$NODE")"
        ;;
    back)
        kill_node_processes "$NODE"
        ip link set "$VETH" up
        ip -n "$NODE" link set eth0 up
        ip -n "$NODE" addr replace "$(node_addr "$NODE")/24" dev eth0
        start_slurmd "$NODE"
        ;;
    cut)
        [ $# -ge 1 ] || usage
        PEER=$1
        node_index "$PEER" >/dev/null || exit 2
        [ "$PEER" != "$NODE" ] || { echo "netfault: cut needs another node than $NODE" >&2; exit 2; }
        cut_one "$NODE" "$PEER"; cut_one "$PEER" "$NODE"
        if [ $# -ge 2 ]; then
            number "$2"
            # Heal by itself later, detached from the caller (no file of it held open).
            setsid bash -c 'sleep "$1"; exec "$2" "$3" heal "$4"' _ "$2" "${BASH_SOURCE[0]}" "$NODE" "$PEER" \
                </dev/null >/dev/null 2>&1 &
        fi
        ;;
    heal)
        if [ $# -ge 1 ]; then
            heal_one "$NODE" "$1"; heal_one "$1" "$NODE"
        else
            for peer in $(test_nodes); do [ "$peer" = "$NODE" ] || heal_one "$peer" "$NODE"; done
            ip netns exec "$NODE" nft flush set inet pdfault cut
        fi
        ;;
    rate)
        [ $# -ge 1 ] || usage; number "$1"
        set_rate "$1"
        ;;
    loss)
        [ $# -ge 1 ] || usage; number "$1"
        ip netns exec "$NODE" nft flush chain inet pdfault loss
        awk -v p="$1" 'BEGIN {exit !(p > 0)}' && \
            ip netns exec "$NODE" nft add rule inet pdfault loss numgen random mod 10000 "<" \
                "$(awk -v p="$1" 'BEGIN {print int(p * 100)}')" drop
        ;;
    delay)
        [ $# -ge 1 ] || usage; number "$1"
        if ! ip netns exec "$NODE" tc qdisc replace dev eth0 root netem delay "${1}ms" 2>/dev/null; then
            echo "netfault: delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks" >&2
            exit 3
        fi
        tc qdisc replace dev "$VETH" root netem delay "${1}ms"
        ;;
    clear)
        clear_shape
        ;;
    show)
        ip -n "$NODE" -s link show eth0
        ip netns exec "$NODE" tc qdisc show dev eth0
        tc qdisc show dev "$VETH"
        ip netns exec "$NODE" nft list table inet pdfault
        ;;
    *) usage ;;
esac
