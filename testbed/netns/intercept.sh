#!/usr/bin/env bash
# Reference passenger interception for the train namespace, the capturing
# part of the rules the relay-agent installs itself at start-up (the relay
# also closes the gateway's own services to passengers and checks their
# source addresses: crates/capture/src/rules.rs):
#
#   intercept.sh add PORT   every TCP connection arriving from the passenger
#                           LAN (iif lan0), whatever its destination, is
#                           redirected to 0.0.0.0:PORT in NS_TRAIN; the
#                           listener reads the passenger's intended
#                           destination with getsockopt(SOL_IP,
#                           SO_ORIGINAL_DST=80). UDP to port 443 (QUIC) from
#                           the LAN is rejected with ICMP port unreachable,
#                           so browsers fall back to TCP at once instead of
#                           after a QUIC timeout.
#   intercept.sh del PORT   removes both again.
#   intercept.sh show       lists what is installed.
#
# The REDIRECT runs in nat PREROUTING, before the routing decision, so it
# works although the train has neither a route to the origin nor IP
# forwarding. The UDP reject is in nftables because iptables' REJECT target
# is not allowed in PREROUTING, and without forwarding the packet would never
# reach INPUT or FORWARD; nftables' reject is (Debian 12's iptables uses the
# nf_tables backend as well, so both land in the same ruleset).
#
# Idempotent: add twice installs once, del when absent is a no-op.
set -euo pipefail
# shellcheck source=testbed/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pc_require_root

usage() { echo "usage: $(basename "$0") add|del PORT | show" >&2; exit 2; }

NFT_TABLE=pc_intercept

action=${1:-}
[[ $action == show ]] || { [[ $# -eq 2 ]] || usage; }
pc_ns_exists "$NS_TRAIN" || { echo "intercept.sh: namespace $NS_TRAIN does not exist: run testbed/netns/up.sh" >&2; exit 1; }

in_train() { ip netns exec "$NS_TRAIN" "$@"; }

redirect_rule() {
    local port=$1
    echo "PREROUTING -i $LAN_IF -p tcp -j REDIRECT --to-ports $port"
}

case $action in
add)
    port=$2
    if [[ ! $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then usage; fi
    # shellcheck disable=SC2046  # the rule is meant to be word-split
    in_train iptables -t nat -C $(redirect_rule "$port") 2>/dev/null \
        || in_train iptables -t nat -A $(redirect_rule "$port")
    # Rebuilt from scratch each time so repeated adds never stack rules.
    in_train nft -f - <<NFT
table inet $NFT_TABLE
delete table inet $NFT_TABLE
table inet $NFT_TABLE {
    chain prerouting {
        type filter hook prerouting priority filter; policy accept;
        iifname "$LAN_IF" udp dport 443 reject with icmpx type port-unreachable
    }
}
NFT
    ;;
del)
    port=$2
    [[ $port =~ ^[0-9]+$ ]] || usage
    # shellcheck disable=SC2046
    while in_train iptables -t nat -C $(redirect_rule "$port") 2>/dev/null; do
        in_train iptables -t nat -D $(redirect_rule "$port")
    done
    # The reject belongs to interception as a whole; drop it only when no
    # REDIRECT from the LAN is left.
    if ! in_train iptables -t nat -S PREROUTING | grep -q -- "-i $LAN_IF -p tcp -j REDIRECT"; then
        in_train nft delete table inet "$NFT_TABLE" 2>/dev/null || true
    fi
    ;;
show)
    in_train iptables -t nat -S PREROUTING
    in_train nft list table inet "$NFT_TABLE" 2>/dev/null || echo "# no table inet $NFT_TABLE"
    ;;
*) usage ;;
esac
