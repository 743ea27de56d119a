#!/usr/bin/env bash
# Builds the integration topology used by the tests and the demo:
#
#   NS_PAX (passengers)        NS_TRAIN (relay-agent)            NS_CLOUD (proxy)        NS_INET (origin)
#   pax0 10.66.0.2/24 ---- lan0 10.66.0.1/24
#   default via 10.66.0.1      car0 10.77.0.1/24 ----------- cpx0 10.77.0.2/24
#                              car1 10.77.1.1/24 ----------- cpx1 10.77.1.2/24
#                              ... one veth pair per carrier  inet0 10.99.0.1/24,
#                                                                  10.99.0.10/24
#
# - The train has NO route to 10.99.0.0/24 and no default route: the only
#   way from a passenger to an origin is through the relay-agent and proxy.
#   Passenger TCP is caught by `intercept.sh add PORT` (REDIRECT in the
#   train's PREROUTING, before routing, so no forwarding or route is needed).
#   IP forwarding stays off in the train, so nothing leaks around the relay.
# - The proxy listens on 0.0.0.0:PORT in NS_CLOUD. The relay's subflow i
#   binds to car<i> (SO_BINDTODEVICE) and connects to 10.77.<i>.2:PORT, so
#   each subflow rides its own link and `link.sh down <i>` kills only it.
# - Origin servers (testbed/origin) listen on 10.99.0.10 in NS_INET, on a
#   veth from NS_CLOUD's inet0 (10.99.0.1), where the proxy opens its
#   upstream connections. Other 10.99.0.x addresses get no ARP answer: an
#   origin that never answers (connect fails after ~3 s with EHOSTUNREACH).
# - Kernel MPTCP (for the kernel-mptcp transport and `mptcpize run iperf3`):
#   both ends have limits `subflow N add_addr_accepted N`; the train has a
#   `subflow` endpoint 10.77.<i>.1 dev car<i> for every i >= 1 (car0 carries
#   the initial subflow, whose remote is 10.77.0.2). The kernel binds each
#   extra subflow to car<i>; with no route for 10.77.0.2 on that device it
#   treats the address as on-link, and NS_CLOUD answers ARP for any of its
#   addresses on any interface, so the join reaches the proxy over link i.
#
# Env: PC_PREFIX, PC_CARRIERS, PC_STATE (see lib.sh); PC_SLOW_START_AFTER_IDLE
# (0 or 1; unset: the kernel's default, 1): net.ipv4.tcp_slow_start_after_idle
# in the train's and the cloud's namespace, where the relay's and the
# proxy's subflows live. Runs down.sh first, so
# it always starts from a clean slate. Writes $PC_STATE/netns.env (sourceable
# KEY=VALUE lines) and prints it.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=testbed/netns/lib.sh
source "$here/lib.sh"
pc_require_root

for tool in ip iptables; do
    command -v "$tool" >/dev/null || { echo "up.sh: $tool not found: run 'make setup'" >&2; exit 1; }
done

case ${PC_SLOW_START_AFTER_IDLE:-} in
    "" | 0 | 1) ;;
    *) echo "up.sh: PC_SLOW_START_AFTER_IDLE must be 0 or 1, got '$PC_SLOW_START_AFTER_IDLE'" >&2; exit 2 ;;
esac

"$here/down.sh"

# A half-built topology is worse than none: tests would fail in confusing
# ways. Undo everything if any step fails.
trap '"$here/down.sh" || true' ERR

for ns in "${PC_NAMESPACES[@]}"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done

# ---- passenger LAN
ip -n "$NS_PAX" link add "$PAX_IF" type veth peer name "$LAN_IF" netns "$NS_TRAIN"
ip -n "$NS_PAX" addr add "$PAX_ADDR/24" dev "$PAX_IF"
ip -n "$NS_TRAIN" addr add "$LAN_ADDR/24" dev "$LAN_IF"
ip -n "$NS_PAX" link set "$PAX_IF" up
ip -n "$NS_TRAIN" link set "$LAN_IF" up
ip -n "$NS_PAX" route add default via "$LAN_ADDR" dev "$PAX_IF"

# ---- carriers
for ((i = 0; i < PC_CARRIERS; i++)); do
    car=$(car_if "$i") cpx=$(cpx_if "$i")
    ip -n "$NS_TRAIN" link add "$car" type veth peer name "$cpx" netns "$NS_CLOUD"
    ip -n "$NS_TRAIN" addr add "$(car_addr "$i")/24" dev "$car"
    ip -n "$NS_CLOUD" addr add "$(cpx_addr "$i")/24" dev "$cpx"
    ip -n "$NS_TRAIN" link set "$car" up
    ip -n "$NS_CLOUD" link set "$cpx" up
done

# ---- origin ("Internet"): its own namespace, on-link with the proxy host.
ip -n "$NS_CLOUD" link add "$INET_IF" type veth peer name "$INET_PEER_IF" netns "$NS_INET"
ip -n "$NS_CLOUD" addr add "$INET_GW_ADDR/24" dev "$INET_IF"
ip -n "$NS_INET" addr add "$ORIGIN_ADDR/24" dev "$INET_PEER_IF"
ip -n "$NS_INET" link set "$INET_PEER_IF" up
ip -n "$NS_CLOUD" link set "$INET_IF" up

# ---- forwarding: explicit, so the intent does not depend on kernel defaults.
for ns in "${PC_NAMESPACES[@]}"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=0
done

# ---- slow start after idle (subflows are long-lived and idle between
# downloads; 1 collapses their congestion window after every idle RTO).
if [[ -n ${PC_SLOW_START_AFTER_IDLE:-} ]]; then
    for ns in "$NS_TRAIN" "$NS_CLOUD"; do
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle="$PC_SLOW_START_AFTER_IDLE"
    done
fi

# ---- kernel MPTCP
if [[ "$(ip netns exec "$NS_TRAIN" cat /proc/sys/net/mptcp/enabled 2>/dev/null || echo 0)" == 1 ]]; then
    for ns in "$NS_TRAIN" "$NS_CLOUD"; do
        ip -n "$ns" mptcp limits set subflow "$PC_CARRIERS" add_addr_accepted "$PC_CARRIERS"
    done
    for ((i = 1; i < PC_CARRIERS; i++)); do
        ip -n "$NS_TRAIN" mptcp endpoint add "$(car_addr "$i")" dev "$(car_if "$i")" subflow
    done
    mptcp=1
else
    echo "up.sh: warning: kernel MPTCP disabled; the kernel-mptcp transport will not work" >&2
    mptcp=0
fi

trap - ERR

# ---- address file
mkdir -p "$PC_STATE/run"
{
    echo "# written by testbed/netns/up.sh; source it"
    echo "PC_PREFIX=$PC_PREFIX"
    echo "PC_CARRIERS=$PC_CARRIERS"
    echo "PC_STATE=$PC_STATE"
    echo "NS_PAX=$NS_PAX"
    echo "NS_TRAIN=$NS_TRAIN"
    echo "NS_CLOUD=$NS_CLOUD"
    echo "NS_INET=$NS_INET"
    echo "PAX_IF=$PAX_IF"
    echo "PAX_ADDR=$PAX_ADDR"
    echo "LAN_IF=$LAN_IF"
    echo "LAN_ADDR=$LAN_ADDR"
    echo "ORIGIN_ADDR=$ORIGIN_ADDR"
    echo "ORIGIN_HTTP=http://$ORIGIN_ADDR:80"
    echo "ORIGIN_IPERF3=$ORIGIN_ADDR:5201"
    echo "ORIGIN_ECHO=$ORIGIN_ADDR:7"
    echo "MPTCP=$mptcp"
    cars=() cpxs=() car_addrs=() cpx_addrs=()
    for ((i = 0; i < PC_CARRIERS; i++)); do
        cars+=("$(car_if "$i")") cpxs+=("$(cpx_if "$i")")
        car_addrs+=("$(car_addr "$i")") cpx_addrs+=("$(cpx_addr "$i")")
    done
    # Space-separated, index i = carrier i.
    echo "CAR_IFS=\"${cars[*]}\""
    echo "CAR_ADDRS=\"${car_addrs[*]}\""
    echo "CPX_IFS=\"${cpxs[*]}\""
    echo "CPX_ADDRS=\"${cpx_addrs[*]}\""
} >"$PC_STATE/netns.env"
cat "$PC_STATE/netns.env"
