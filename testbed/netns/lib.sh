# shellcheck shell=bash disable=SC2034  # variables are for the scripts that source this
# Names and addresses of the namespace testbed, shared by every script in
# testbed/ and scripts/. Source it; it defines variables and helpers only.
#
# Everything is derived from two knobs so that parallel test runs can each
# build their own copy of the topology without colliding:
#   PC_PREFIX    namespace name prefix (default "pc")
#   PC_CARRIERS  number of carrier links (default 2, 1..8: the kernel's
#                MPTCP path manager accepts at most 8 subflows)
# and one for files:
#   PC_STATE     pid files, logs, served files (default /tmp/polycorn-state,
#                or /tmp/polycorn-state-<prefix> for a non-default prefix)

PC_PREFIX=${PC_PREFIX:-pc}
PC_CARRIERS=${PC_CARRIERS:-2}

if [[ ! $PC_PREFIX =~ ^[a-z][a-z0-9]{0,9}$ ]]; then
    echo "PC_PREFIX must be 1-10 lower-case letters/digits starting with a letter, got '$PC_PREFIX'" >&2
    exit 2
fi
if [[ ! $PC_CARRIERS =~ ^[1-8]$ ]]; then
    echo "PC_CARRIERS must be 1..8, got '$PC_CARRIERS'" >&2
    exit 2
fi

if [[ $PC_PREFIX == pc ]]; then
    PC_STATE=${PC_STATE:-/tmp/polycorn-state}
else
    PC_STATE=${PC_STATE:-/tmp/polycorn-state-$PC_PREFIX}
fi

NS_TRAIN="$PC_PREFIX-train"   # relay-agent; gateway of the passenger LAN
NS_CLOUD="$PC_PREFIX-cloud"   # proxy
NS_INET="$PC_PREFIX-inet"     # the "Internet": origin servers
NS_PAX="$PC_PREFIX-pax"       # passengers' devices
PC_NAMESPACES=("$NS_PAX" "$NS_TRAIN" "$NS_CLOUD" "$NS_INET")

# Passenger LAN: pax0 (in NS_PAX) <-> lan0 (in NS_TRAIN).
PAX_IF=pax0
PAX_ADDR=10.66.0.2
LAN_IF=lan0
LAN_ADDR=10.66.0.1

# Origin ("Internet servers"): inet0 in NS_CLOUD (the proxy host's address
# on its upstream network) <-> inet0x in NS_INET (the origin). The origin
# has a host of its own, as on the Internet: the proxy refuses its own
# host's addresses, so an origin local to NS_CLOUD would be unreachable.
INET_IF=inet0
INET_PEER_IF=inet0x
INET_GW_ADDR=10.99.0.1
ORIGIN_ADDR=10.99.0.10

# Carrier i (0-based): car<i> in NS_TRAIN, 10.77.<i>.1 <-> cpx<i> in NS_CLOUD,
# 10.77.<i>.2.
car_if() { echo "car$1"; }
cpx_if() { echo "cpx$1"; }
car_addr() { echo "10.77.$1.1"; }
cpx_addr() { echo "10.77.$1.2"; }

pc_require_root() {
    [[ $(id -u) -eq 0 ]] || { echo "$(basename "$0"): must run as root (network namespaces)" >&2; exit 1; }
}

pc_ns_exists() { [[ -e "/run/netns/$1" ]]; }
