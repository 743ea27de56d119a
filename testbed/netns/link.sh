#!/usr/bin/env bash
# Breaks and repairs one carrier link mid-test:
#
#   link.sh down <i>    car<i> and cpx<i> administratively down: sockets bound
#                       to car<i> see errors at once (a lost modem / SIM).
#   link.sh up <i>      both ends up again; the connected routes come back
#                       with the addresses.
#   link.sh drop <i>    interfaces stay up but every packet on carrier i is
#                       silently dropped in both directions (a failed
#                       handover: nothing errors, the path just goes dark).
#   link.sh undrop <i>  removes the drop rules.
#   link.sh status      one line per carrier.
#
# <i> is the 0-based carrier index (car0 = first carrier).
set -euo pipefail
# shellcheck source=testbed/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pc_require_root

usage() { echo "usage: $(basename "$0") down|up|drop|undrop <carrier index 0..$((PC_CARRIERS - 1))> | status" >&2; exit 2; }

# Only link.sh's own rules carry this comment, so undrop never removes a
# rule a test added for another reason.
TAG=pc-link-drop

drop_rules() {
    local ifname=$1
    echo "INPUT -i $ifname -m comment --comment $TAG -j DROP"
    echo "OUTPUT -o $ifname -m comment --comment $TAG -j DROP"
}

action=${1:-}
[[ -n $action ]] || usage
if ! pc_ns_exists "$NS_TRAIN" || ! pc_ns_exists "$NS_CLOUD"; then
    echo "link.sh: testbed $PC_PREFIX is not up: run testbed/netns/up.sh" >&2
    exit 1
fi

if [[ $action == status ]]; then
    for ((i = 0; i < PC_CARRIERS; i++)); do
        car=$(car_if "$i") cpx=$(cpx_if "$i")
        t=$(ip -n "$NS_TRAIN" -br link show "$car" | awk '{print $2}')
        c=$(ip -n "$NS_CLOUD" -br link show "$cpx" | awk '{print $2}')
        d=no
        ip netns exec "$NS_TRAIN" iptables -S INPUT | grep -q -- "-i $car .*$TAG" && d=yes
        echo "carrier $i: $car=$t $cpx=$c dropped=$d"
    done
    exit 0
fi

[[ $# -eq 2 && $2 =~ ^[0-9]+$ ]] || usage
i=$2
((i < PC_CARRIERS)) || usage
car=$(car_if "$i") cpx=$(cpx_if "$i")

case $action in
down)
    ip -n "$NS_TRAIN" link set "$car" down
    ip -n "$NS_CLOUD" link set "$cpx" down
    ;;
up)
    ip -n "$NS_TRAIN" link set "$car" up
    ip -n "$NS_CLOUD" link set "$cpx" up
    ;;
drop)
    for pair in "$NS_TRAIN:$car" "$NS_CLOUD:$cpx"; do
        ns=${pair%%:*} ifname=${pair#*:}
        while read -r rule; do
            # shellcheck disable=SC2086  # the rule is meant to be word-split
            ip netns exec "$ns" iptables -C $rule 2>/dev/null \
                || ip netns exec "$ns" iptables -I $rule
        done < <(drop_rules "$ifname")
    done
    ;;
undrop)
    for pair in "$NS_TRAIN:$car" "$NS_CLOUD:$cpx"; do
        ns=${pair%%:*} ifname=${pair#*:}
        while read -r rule; do
            # shellcheck disable=SC2086
            while ip netns exec "$ns" iptables -C $rule 2>/dev/null; do
                ip netns exec "$ns" iptables -D $rule
            done
        done < <(drop_rules "$ifname")
    done
    ;;
*) usage ;;
esac
