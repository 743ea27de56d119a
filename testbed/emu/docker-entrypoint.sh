#!/usr/bin/env bash
# The link emulator's container (testbed/emu/Dockerfile): the train of the
# docker-compose testbed. Inside one container:
#
#   this container's netns, named `train`     car<i> 10.77.<i>.1 (TUN); the
#     (the relay-agent joins it:              relay binds subflow i to car<i>
#      network_mode: service:emu)             and dials 10.77.<i>.2:4433
#   netns `cloud` (made here)                 cpx<i> 10.77.<i>.2 (TUN); subflows
#                                             to 10.77.<i>.2:PORT are DNATed to
#                                             the proxy container, masqueraded
#                                             out through a veth (clo1 10.78.0.2)
#   polycorn-emu                              carrier i: car<i> <-> cpx<i>
#                                             through the trip's traces/schedules
#
# and this netns masquerades what comes out of the veth (clo0 10.78.0.1) to
# the compose network. So every byte between relay and proxy crosses the
# emulated carrier links, as on the namespace testbed (testbed/topology.sh).
#
# Environment: POLYCORN_EMU_TRIP (trip directory, default the image's),
# POLYCORN_EMU_PROXY_HOST (default proxy), POLYCORN_EMU_PROXY_PORT (4433),
# POLYCORN_EMU_EPOCH_DIR (where the trip's epoch is written for the relay's
# radio replay, default /run/polycorn-trip: a volume shared with the relay),
# POLYCORN_EMU_START_DELAY_MS (the trip starts this long after the
# emulator, default 10000, so the relay is up at time 0), POLYCORN_EMU_ARGS
# (more polycorn-emu flags, e.g. "--buffer-bytes 3000000", or
# "--loss-keying packet" for the per-packet loss chain of earlier results;
# the default keys random loss by time, see testbed/emu/README.md).
set -euo pipefail

trip=${POLYCORN_EMU_TRIP:-/usr/share/polycorn/trip}
proxy_host=${POLYCORN_EMU_PROXY_HOST:-proxy}
port=${POLYCORN_EMU_PROXY_PORT:-4433}
epoch_dir=${POLYCORN_EMU_EPOCH_DIR:-/run/polycorn-trip}
delay_ms=${POLYCORN_EMU_START_DELAY_MS:-10000}
log() { echo "emu-entrypoint: $*" >&2; }

n=0
while [[ -f $trip/c$n.down ]]; do n=$((n + 1)); done
((n >= 1)) || { log "no c0.down in $trip: not a trip directory"; exit 2; }

# The proxy's address on the compose network (it may still be starting).
proxy_ip=""
for ((i = 0; i < 120; i++)); do
    proxy_ip=$(getent ahostsv4 "$proxy_host" | awk 'NR == 1 {print $1}') || true
    [[ -n $proxy_ip ]] && break
    sleep 0.5
done
[[ -n $proxy_ip ]] || { log "cannot resolve the proxy host '$proxy_host'"; exit 1; }

mkdir -p /run/netns /run/polycorn-emu
ip netns attach train $$
ip netns add cloud
ip link add clo0 type veth peer name clo1 netns cloud
ip addr add 10.78.0.1/30 dev clo0
ip link set clo0 up
ip -n cloud link set lo up
ip -n cloud addr add 10.78.0.2/30 dev clo1
ip -n cloud link set clo1 up
ip -n cloud route add default via 10.78.0.1
# This netns forwards for the cloud side (compose: sysctls net.ipv4.ip_forward=1).
[[ $(cat /proc/sys/net/ipv4/ip_forward) == 1 ]] || echo 1 >/proc/sys/net/ipv4/ip_forward
ip netns exec cloud nft -f - <<EOF
table ip polycorn_emu {
    chain pre {
        type nat hook prerouting priority dstnat;
        ip daddr 10.77.0.0/16 tcp dport $port dnat to $proxy_ip:$port
    }
    chain post {
        type nat hook postrouting priority srcnat;
        oifname "clo1" masquerade
    }
}
EOF
nft -f - <<EOF
table ip polycorn_emu {
    chain post {
        type nat hook postrouting priority srcnat;
        ip saddr 10.78.0.0/30 oifname != "clo0" masquerade
    }
}
EOF

args=(--train-ns train --cloud-ns cloud --carriers "$n" --stats-interval 30)
for ((i = 0; i < n; i++)); do
    args+=(--up-trace "$trip/c$i.up" --down-trace "$trip/c$i.down")
    [[ -f $trip/c$i.schedule ]] && args+=(--schedule "$trip/c$i.schedule")
done
epoch=$(($(date +%s%3N) + delay_ms))
mkdir -p "$epoch_dir"
echo "$epoch" >"$epoch_dir/epoch.tmp" && mv "$epoch_dir/epoch.tmp" "$epoch_dir/epoch"
echo "$n" >/run/polycorn-emu/carriers
log "trip $trip: $n carriers, epoch $epoch; subflows to 10.77.<i>.2:$port go to $proxy_host ($proxy_ip)"
# shellcheck disable=SC2086  # POLYCORN_EMU_ARGS is a list of flags
exec polycorn-emu "${args[@]}" --epoch-unix-ms "$epoch" ${POLYCORN_EMU_ARGS:-}
