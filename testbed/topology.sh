#!/usr/bin/env bash
# The HSR topology in one command: namespaces, emulated carrier links replaying
# a generated (or Mahimahi) trip, origin servers, and a relay/proxy pair
# running one scheme.
#
#   testbed/topology.sh up --trip DIR [--scheme NAME] [--epoch-unix-ms MS]
#                          [--buffer-bytes N] [--seed N] [--failure-table FILE]
#                          [--no-pair] [--relay-arg ARG]... [--proxy-arg ARG]...
#                          [--forward-port PORT]... [--gpsd] [--cc NAME]
#   testbed/topology.sh down
#   testbed/topology.sh status
#
# PC_PREFIX picks the copy of the topology (namespaces <prefix>-pax, -train,
# -cloud; files under PC_STATE): several copies run side by side, one per
# scheme, each with its own emulator replaying the same trip in step when they
# share --epoch-unix-ms. The carrier count is the trip's (c<i>.down files).
#
#   <prefix>-pax    passengers (10.66.0.2, and 10.66.0.100-163 for more
#                   passengers), default route via the relay
#   <prefix>-train  relay-agent; lan0 10.66.0.1; car<i> 10.77.<i>.1 (TUN)
#   <prefix>-cloud  proxy on 10.77.<i>.2:4433; origin 10.99.0.10: nginx :80,
#                   iperf3 :5201, echo :7, DNS :53, IM echo :7100
#   root namespace  polycorn-emu (carrier i: car<i> <-> cpx<i> through the
#                   trip's c<i>.up / c<i>.down traces and c<i>.schedule)
#
# Schemes: every scheduler composition of the framework (`hrsch`, `minrtt`,
# `roundrobin`, `redundant`, `blest`, `ecf`, `single-path`, the ablations
# `minrtt+hpr` ...; and those in testbed/pipelines.toml; passed to relay and
# proxy as --scheduler), `kernel-mptcp` (the same binaries with
# --transport kernel-mptcp: one MPTCP connection whose subflows the kernel
# opens on every carrier and schedules itself), `kernel-mptcp-conn`
# (--transport kernel-mptcp-conn: each passenger connection its own MPTCP
# connection, as OpenMPTCProuter runs it, on the same MPTCP endpoints), and
# `direct-c<i>`: no relay and no proxy at all, the passengers' own TCP
# routed and masqueraded (nftables) by the train out of carrier i's emulated
# link straight to the origin, as train Wi-Fi does today: the baseline the
# tunnel has to beat. Its congestion control is the passenger's and the
# origin's kernel one, --cc NAME (default bbr, as the tunnel's subflows), set
# per route (`ip route ... congctl`) in the passengers' and the origin's
# namespaces: a namespace other than the host's may only pick the host's
# allowed algorithms as its default, a route may pick any loaded one.
#
# Radio: when the trip has an events.jsonl, the relay replays it (GPS fixes,
# serving cells, signal, handovers) in step with the emulator, whatever the
# scheme; --failure-table gives relay and proxy a failure-location table
# (only HRSCH's hof-reject uses it).
#
# --gpsd: positions from a real gpsd instead of the replay, as on a train.
# The trip's fixes become an NMEA log (polycorn-tracegen nmea, stamped from
# the epoch, from a second after start-up on) that gpsd's gpsfake plays in
# real time (one fix a second) inside the train namespace; the relay reads it
# with --gpsd and its replay leaves its own fixes out (handovers then carry no
# track position either), so HPR places the train by map matching onto the
# failure table's routes (the table needs them: failure-table --route).
#
# PC_EMU_LOSS_KEYING (time or packet) is passed to the emulator as
# --loss-keying (its default, time, gives every scheme replaying one trip the
# same loss realisation; packet reproduces results from before 2026-11-26).
#
# --relay-arg/--proxy-arg pass one more flag to the relay or the proxy (e.g.
# `--proxy-arg --kafka-brokers=127.0.0.1:29092`). --forward-port PORT makes
# 127.0.0.1:PORT inside the cloud namespace reach 127.0.0.1:PORT of the root
# namespace (testbed/netns/portfwd.py), so the proxy can use the Kafka broker
# that scripts/infra.sh runs there.
#
# Teardown: every process started here writes a pid file under
# $PC_STATE/run, and the emulator runs in its own process group, so `down`
# works after a crash of whatever called `up` (or of `up` itself): it stops
# the emulator (its TUN devices vanish with it), kills everything left in the
# three namespaces and deletes them. scripts/integration.sh checks that nothing
# leaks after a SIGKILL of the caller.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

usage() { sed -n '2,42p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "topology.sh: $*" >&2; exit 2; }

cmd=${1:-}
[[ -n $cmd ]] || { usage >&2; exit 2; }
shift

trip="" scheme=minrtt epoch="" buffer=3000000 seed=1 pair=1 table="" gpsd=0 cc="" direct=""
relay_extra=() proxy_extra=() forward_ports=()
while (($#)); do
    case $1 in
        --trip) trip=${2:?}; shift 2 ;;
        --scheme) scheme=${2:?}; shift 2 ;;
        --epoch-unix-ms) epoch=${2:?}; shift 2 ;;
        --buffer-bytes) buffer=${2:?}; shift 2 ;;
        --seed) seed=${2:?}; shift 2 ;;
        --failure-table) table=${2:?}; shift 2 ;;
        --no-pair) pair=0; shift ;;
        --gpsd) gpsd=1; shift ;;
        --cc) cc=${2:?}; shift 2 ;;
        --relay-arg) relay_extra+=("${2:?}"); shift 2 ;;
        --proxy-arg) proxy_extra+=("${2:?}"); shift 2 ;;
        --forward-port)
            [[ ${2:?} =~ ^[0-9]+$ ]] || die "--forward-port must be a port number, got '$2'"
            forward_ports+=("$2"); shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

if [[ $cmd == up ]]; then
    [[ -n $trip ]] || die "up needs --trip DIR"
    [[ -d $trip ]] || die "trip directory '$trip' does not exist"
    trip=$(cd "$trip" && pwd)
    n=0
    while [[ -f $trip/c$n.down ]]; do n=$((n + 1)); done
    ((n >= 1)) || die "no c0.down in $trip: not a trip directory (polycorn-tracegen generate writes one)"
    if [[ -n $table ]]; then
        [[ -f $table ]] || die "failure table '$table' does not exist"
        table=$(cd "$(dirname "$table")" && pwd)/$(basename "$table")
    fi
    # One epoch for the emulator and the relay's radio replay.
    [[ -n $epoch ]] || epoch=$(date +%s%3N)
    for ((i = 0; i < n; i++)); do
        for f in "c$i.up" "c$i.schedule"; do
            [[ -f $trip/$f ]] || die "$trip/$f missing"
        done
    done
    export PC_CARRIERS=$n
    [[ -z $epoch || $epoch =~ ^[0-9]+$ ]] || die "--epoch-unix-ms must be an integer, got '$epoch'"
    [[ $buffer =~ ^[0-9]+$ ]] || die "--buffer-bytes must be an integer, got '$buffer'"
    [[ $seed =~ ^[0-9]+$ ]] || die "--seed must be an integer, got '$seed'"
    if [[ $scheme =~ ^direct-c([0-9]+)$ ]]; then
        direct=${BASH_REMATCH[1]}
        ((direct < n)) || die "scheme $scheme: the trip has carriers 0..$((n - 1))"
        ((gpsd == 0)) || die "--gpsd needs a relay; scheme $scheme runs none"
        cc=${cc:-bbr}
        [[ $cc =~ ^[a-z0-9_]{1,15}$ ]] || die "--cc must name a kernel congestion control, got '$cc'"
        grep -qw -- "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control \
            || modprobe "tcp_$cc" 2>/dev/null \
            || die "--cc $cc: not a congestion control of this kernel ($(cat /proc/sys/net/ipv4/tcp_available_congestion_control))"
    elif [[ -n $cc ]]; then
        die "--cc is for the direct-c<i> schemes (the tunnel's schemes take --relay-arg/--proxy-arg --subflow-cc)"
    fi
fi

# shellcheck source=testbed/netns/lib.sh
source "$here/netns/lib.sh"
pc_require_root
BIN=${BIN:-$root/target/release}
# shellcheck source=testbed/netns/lib-pair.sh
source "$here/netns/lib-pair.sh"
IM_PORT=7100

run=$PC_STATE/run
logs=$PC_STATE/logs

# stop_emu: the emulator runs in the root namespace, so the namespace sweep of
# down.sh does not see it; its pid file (and, as a safety net, its command
# line naming our namespaces) finds it.
stop_emu() {
    local pids=() p
    if [[ -s $run/emu.pid ]]; then
        p=$(<"$run/emu.pid")
        [[ $p =~ ^[0-9]+$ ]] && pids+=("$p")
    fi
    mapfile -t -O "${#pids[@]}" pids < <(pgrep -f -- "polycorn-emu .*--train-ns $NS_TRAIN( |$)" || true)
    ((${#pids[@]})) || { rm -f "$run/emu.pid"; return 0; }
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    rm -f "$run/emu.pid"
}

start_portfwd() {
    ((${#forward_ports[@]})) || return 0
    mkdir -p "$run" "$logs"
    : >"$logs/portfwd.log"
    setsid python3 "$here/netns/portfwd.py" "$NS_CLOUD" "${forward_ports[@]}" </dev/null >>"$logs/portfwd.log" 2>&1 &
    echo $! >"$run/portfwd.pid"
    local i
    for ((i = 0; i < 50; i++)); do
        grep -q ready "$logs/portfwd.log" && return 0
        sleep 0.1
    done
    echo "topology.sh: the port forwarder did not come up:" >&2
    cat "$logs/portfwd.log" >&2
    return 1
}

stop_portfwd() {
    if [[ -s $run/portfwd.pid ]]; then
        kill -TERM "$(<"$run/portfwd.pid")" 2>/dev/null || true
        rm -f "$run/portfwd.pid"
    fi
}

# gpsfake runs in the train namespace (down.sh's sweep ends it); its control
# socket stays behind in /tmp.
GPSD_PORT=2947
stop_gpsfake() {
    if [[ -s $run/gpsfake.pid ]]; then
        local p
        p=$(<"$run/gpsfake.pid")
        kill -KILL -- "-$p" 2>/dev/null || true
        rm -f "/tmp/gpsfake-$p.sock" "$run/gpsfake.pid"
    fi
}

start_gpsfake() {
    [[ -f $trip/events.jsonl ]] || die "--gpsd needs the trip's events.jsonl"
    command -v gpsfake >/dev/null || die "--gpsd needs gpsfake (Debian: gpsd gpsd-clients; make setup)"
    local from=$(($(date +%s%3N) + 1500)) i
    mkdir -p "$run" "$logs"
    "$BIN/polycorn-tracegen" nmea --events "$trip" --epoch-unix-ms "$epoch" --from-unix-ms "$from" \
        --out "$PC_STATE/trip.nmea"
    : >"$logs/gpsfake.log"
    # -n: feed at once (a receiver does not wait for clients); -1: once;
    # -c 0.5: an RMC+GGA pair, one fix, a second.
    ip netns exec "$NS_TRAIN" setsid gpsfake -n -1 -q -c 0.5 -P "$GPSD_PORT" "$PC_STATE/trip.nmea" \
        </dev/null >>"$logs/gpsfake.log" 2>&1 &
    echo $! >"$run/gpsfake.pid"
    for ((i = 0; i < 100; i++)); do
        ip netns exec "$NS_TRAIN" bash -c "exec 3<>/dev/tcp/127.0.0.1/$GPSD_PORT" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "topology.sh: gpsd (gpsfake) did not listen on $GPSD_PORT:" >&2
    cat "$logs/gpsfake.log" >&2
    return 1
}

topology_down() {
    stop_emu
    stop_portfwd
    stop_gpsfake
    "$here/origin/stop.sh" 2>/dev/null || true
    "$here/netns/down.sh"
}

start_emu() {
    local args=(--train-ns "$NS_TRAIN" --cloud-ns "$NS_CLOUD" --carriers "$PC_CARRIERS" --replace
        --buffer-bytes "$buffer" --seed "$seed" --stats-interval 30)
    local i
    for ((i = 0; i < PC_CARRIERS; i++)); do
        args+=(--up-trace "$trip/c$i.up" --down-trace "$trip/c$i.down" --schedule "$trip/c$i.schedule")
    done
    [[ -n $epoch ]] && args+=(--epoch-unix-ms "$epoch")
    # The loss process's keying (polycorn-emu --loss-keying; default time).
    [[ -n ${PC_EMU_LOSS_KEYING:-} ]] && args+=(--loss-keying "$PC_EMU_LOSS_KEYING")
    mkdir -p "$run" "$logs"
    : >"$logs/emu.log"
    setsid "$BIN/polycorn-emu" "${args[@]}" </dev/null >>"$logs/emu.log" 2>&1 &
    echo $! >"$run/emu.pid"
    for ((i = 0; i < 100; i++)); do
        grep -q "ready" "$logs/emu.log" && return 0
        kill -0 "$(<"$run/emu.pid")" 2>/dev/null || break
        sleep 0.1
    done
    echo "topology.sh: the emulator did not come up:" >&2
    cat "$logs/emu.log" >&2
    return 1
}

# The TUN devices replaced the veths, so the MPTCP endpoints that up.sh bound
# to the old interfaces are re-created.
mptcp_endpoints() {
    ip netns exec "$NS_TRAIN" test "$(cat /proc/sys/net/mptcp/enabled 2>/dev/null || echo 0)" = 1 || return 0
    ip -n "$NS_TRAIN" mptcp endpoint flush
    local i
    for ((i = 1; i < PC_CARRIERS; i++)); do
        ip -n "$NS_TRAIN" mptcp endpoint add "$(car_addr "$i")" dev "$(car_if "$i")" subflow
    done
}

start_im_server() {
    mkdir -p "$run" "$logs"
    ip netns exec "$NS_INET" setsid "$BIN/polycorn-loadgen" im-server --listen "$ORIGIN_ADDR:$IM_PORT" \
        </dev/null >>"$logs/im-server.log" 2>&1 &
    echo $! >"$run/im-server.pid"
}

# direct_route I CC: passenger traffic forwarded by the train out of carrier I
# alone (TUN car<I>, so through the emulator), source-NATed to car<I>'s address
# as a mobile router does; the cloud answers that address over cpx<I>, the same
# carrier's downlink. Nothing else is forwarded: the train still has no path
# to the origin but carrier I.
direct_route() {
    local i=$1 cc=$2 car cpx
    car=$(car_if "$i") cpx=$(cpx_if "$i")
    ip netns exec "$NS_TRAIN" sysctl -qw net.ipv4.ip_forward=1
    # TUN is point-to-point: no next hop to resolve.
    ip -n "$NS_TRAIN" route replace default dev "$car"
    ip netns exec "$NS_TRAIN" nft -f - <<NFT
table ip pc_direct
delete table ip pc_direct
table ip pc_direct {
    chain forward {
        type filter hook forward priority filter; policy drop;
        iifname "$LAN_IF" oifname "$car" accept
        iifname "$car" oifname "$LAN_IF" ct state established,related accept
    }
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr 10.66.0.0/24 oifname "$car" masquerade
    }
}
NFT
    # The cloud forwards between carrier I and the origin's network, as the
    # Internet between a carrier and a server does.
    ip netns exec "$NS_CLOUD" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$NS_CLOUD" route replace "$(car_addr "$i")/32" dev "$cpx"
    # The senders' congestion control: the origin's (downloads) on its route back
    # to the masqueraded address, the passengers' (uploads, requests) on their
    # default route. Set on routes, so both ends of one connection use it.
    ip -n "$NS_INET" route replace "$(car_addr "$i")/32" via "$INET_GW_ADDR" dev "$INET_PEER_IF" congctl "$cc"
    ip -n "$NS_PAX" route replace default via "$LAN_ADDR" dev "$PAX_IF" congctl "$cc"
}

start_scheme_pair() {
    pair_pki
    local both=(--config "$here/pipelines.toml") relay=("${relay_extra[@]}") proxy=("${proxy_extra[@]}")
    [[ -n $table ]] && both+=(--failure-table "$table")
    [[ -f $trip/events.jsonl ]] && relay+=(--replay-events "$trip/events.jsonl" --replay-epoch-unix-ms "$epoch")
    if ((gpsd)); then
        start_gpsfake
        relay+=(--gpsd "127.0.0.1:$GPSD_PORT")
    fi
    # Every scheme starts with an empty telemetry spool: nothing left over
    # from the previous scheme's trip is resent during this one.
    rm -rf "$PC_STATE/spool/relay"
    case $scheme in
        kernel-mptcp)
            # The kernel schedules; the endpoint sees one path.
            start_proxy "${both[@]}" "${proxy[@]}" --scheduler minrtt --transport kernel-mptcp
            start_main_relay "${both[@]}" "${relay[@]}" --scheduler minrtt --transport kernel-mptcp
            wait_paths_up 1
            ;;
        kernel-mptcp-conn)
            # No session and no standing connection: ready when the proxy
            # listens (its /readyz answers once it does) and the relay serves.
            start_proxy "${both[@]}" "${proxy[@]}" --scheduler minrtt --transport kernel-mptcp-conn
            start_main_relay "${both[@]}" "${relay[@]}" --scheduler minrtt --transport kernel-mptcp-conn
            wait_http "$NS_CLOUD" "http://$PROXY_METRICS/readyz" 10 && wait_http "$NS_TRAIN" "http://$RELAY_METRICS/readyz" 10
            ;;
        quic-*)
            # The pipeline over QUIC subflows (each carrier falls back to TLS
            # on its own if its QUIC handshake fails).
            start_proxy "${both[@]}" "${proxy[@]}" --scheduler "${scheme#quic-}" --transport quic
            start_main_relay "${both[@]}" "${relay[@]}" --scheduler "${scheme#quic-}" --transport quic
            wait_paths_up 1
            ;;
        *)
            start_proxy "${both[@]}" "${proxy[@]}" --scheduler "$scheme" --transport tls
            start_main_relay "${both[@]}" "${relay[@]}" --scheduler "$scheme" --transport tls
            # A carrier in a blackout at start-up joins later: one is enough.
            wait_paths_up 1
            ;;
    esac
}

case $cmd in
    up)
        for b in polycorn-emu polycorn-relay polycorn-proxy polycorn-pki polycorn-loadgen polycorn-tracegen; do
            [[ -x $BIN/$b ]] || die "$BIN/$b not built: run 'cargo build --release --workspace'"
        done
        topology_down
        # Each `up` logs afresh: the relay and proxy append to their logs
        # (restarts within one topology), and a benchmark copies them per
        # run, so an earlier topology's lines must not be in them.
        rm -rf "$logs"
        # From here on, a failure leaves nothing behind.
        trap 'topology_down >/dev/null 2>&1 || true' ERR
        "$here/netns/up.sh" >/dev/null
        # More passengers: 10.66.0.100-163 on the passengers' interface (the
        # relay tells passengers apart by source address; the benchmark's
        # chat users each take one).
        for ((k = 100; k < 164; k++)); do
            ip -n "$NS_PAX" addr add "10.66.0.$k/24" dev "$PAX_IF"
        done
        "$here/origin/start.sh" >/dev/null
        start_im_server
        start_emu
        start_portfwd
        mptcp_endpoints
        if [[ -n $direct ]]; then
            # No relay, no proxy: --no-pair and the pair's flags do not apply.
            direct_route "$direct" "$cc"
        elif ((pair)); then
            if ! start_scheme_pair; then
                echo "topology.sh: the $scheme relay did not bring a path up; logs in $logs" >&2
                topology_down >/dev/null 2>&1 || true
                exit 1
            fi
        fi
        trap - ERR
        echo "topology $PC_PREFIX up: trip $trip, $PC_CARRIERS carriers, scheme $scheme${cc:+ ($cc)}${epoch:+, epoch $epoch}; state $PC_STATE"
        ;;
    down)
        topology_down
        ;;
    status)
        for ns in "${PC_NAMESPACES[@]}"; do
            if pc_ns_exists "$ns"; then echo "$ns: $(ip netns pids "$ns" | wc -l) processes"; else echo "$ns: absent"; fi
        done
        if [[ -s $run/emu.pid ]] && kill -0 "$(<"$run/emu.pid")" 2>/dev/null; then
            echo "emulator: pid $(<"$run/emu.pid")"
        else
            echo "emulator: not running"
        fi
        ;;
    *)
        usage >&2
        exit 2
        ;;
esac
