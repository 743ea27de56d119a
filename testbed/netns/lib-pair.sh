# shellcheck shell=bash
# Start and stop a relay-agent/proxy pair on the namespace testbed. Sourced
# by the integration tests, the demo and the data-plane benchmark, so all
# three run the same binaries the same way. Needs testbed/netns/lib.sh
# sourced first (PC_PREFIX, NS_*, PC_STATE, ...).

BIN=${BIN:-target/release}
PKI_DIR="$PC_STATE/pki"
TRAIN_ID=${TRAIN_ID:-train-0001}
PROXY_PORT=4433
PROXY_METRICS=127.0.0.1:9464
RELAY_METRICS=127.0.0.1:9465
RELAY_TPROXY_PORT=15001
RELAY_SOCKS=10.66.0.1:1080
# The testbed's "Internet", where the origin servers listen (NS_INET,
# on-link with the proxy host's inet0, testbed/netns/up.sh): a private
# network, which the proxy's default destination policy refuses. start_proxy
# re-opens it, and only it, with --allow (the rest of 10.0.0.0/8, loopback,
# ... stay refused); the proxy host's own 10.99.0.1 in it stays refused.
ORIGIN_NET=10.99.0.0/24

# Development certificates: the served train, and a second train the proxy
# must refuse.
pair_pki() {
    mkdir -p "$PKI_DIR"
    "$BIN/polycorn-pki" dev --out "$PKI_DIR" --train "$TRAIN_ID" --train train-0099 >/dev/null
}

# start_proxy [extra flags...]
start_proxy() {
    mkdir -p "$PC_STATE/run" "$PC_STATE/logs"
    ip netns exec "$NS_CLOUD" "$BIN/polycorn-proxy" --train-id "$TRAIN_ID" --listen "0.0.0.0:$PROXY_PORT" \
        --ca "$PKI_DIR/ca.crt" --cert "$PKI_DIR/proxy.crt" --key "$PKI_DIR/proxy.key" \
        --metrics-listen "$PROXY_METRICS" --allow "$ORIGIN_NET" "$@" >>"$PC_STATE/logs/proxy.log" 2>&1 &
    echo $! >"$PC_STATE/run/proxy.pid"
}

# relay_paths: one --path per carrier of the testbed, or PC_SUBFLOWS_PER_CARRIER
# (default 1) of them: the first one of every carrier first, so that path k
# is still carrier k for the radio replay and pin-path, then the extra ones
# (carrier-<i>-<k>).
relay_paths() {
    local i k n=${PC_SUBFLOWS_PER_CARRIER:-1}
    for ((i = 0; i < PC_CARRIERS; i++)); do
        printf -- '--path carrier-%s=car%s@10.77.%s.2:%s ' "$i" "$i" "$i" "$PROXY_PORT"
    done
    for ((k = 1; k < n; k++)); do
        for ((i = 0; i < PC_CARRIERS; i++)); do
            printf -- '--path carrier-%s-%s=car%s@10.77.%s.2:%s ' "$i" "$k" "$i" "$i" "$PROXY_PORT"
        done
    done
}

# start_relay NAME TRAIN [extra flags...]: NAME names the log, pid and
# telemetry spool ($PC_STATE/spool/NAME, kept across restarts of the relay).
start_relay() {
    local name=$1 train=$2
    shift 2
    mkdir -p "$PC_STATE/run" "$PC_STATE/logs"
    # shellcheck disable=SC2046  # relay_paths yields separate flags on purpose
    ip netns exec "$NS_TRAIN" "$BIN/polycorn-relay" --train-id "$train" $(relay_paths) \
        --ca "$PKI_DIR/ca.crt" --cert "$PKI_DIR/$train.crt" --key "$PKI_DIR/$train.key" \
        --proxy-name proxy.polycorn --telemetry-spool "$PC_STATE/spool/$name" "$@" >>"$PC_STATE/logs/$name.log" 2>&1 &
    echo $! >"$PC_STATE/run/$name.pid"
}

# The usual relay: transparent capture on the passenger LAN, SOCKS5, and
# passengers' DNS answered by the origin's resolver through the tunnel.
start_main_relay() {
    start_relay relay "$TRAIN_ID" --listen-transparent "0.0.0.0:$RELAY_TPROXY_PORT" --lan-interface lan0 \
        --listen-socks "$RELAY_SOCKS" --listen-dns 0.0.0.0:5353 --dns-upstream "$ORIGIN_ADDR:53" \
        --metrics-listen "$RELAY_METRICS" "$@"
}

# wait_http NS URL SECONDS: poll until the URL answers 200.
wait_http() {
    local ns=$1 url=$2 secs=$3 i
    for ((i = 0; i < secs * 10; i++)); do
        if ip netns exec "$ns" curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# wait_paths_up N: the relay reports N subflows up.
wait_paths_up() {
    local want=$1 i n
    for ((i = 0; i < 100; i++)); do
        # Before the relay listens, curl fails: that is "0 up", not an error
        # (callers may run under set -e).
        n=$({ ip netns exec "$NS_TRAIN" curl -fsS --max-time 1 "http://$RELAY_METRICS/metrics" 2>/dev/null || true; } |
            awk '/^polycorn_path_up\{/ && $2 == 1 {c++} END {print c + 0}')
        [[ $n -ge $want ]] && return 0
        sleep 0.1
    done
    return 1
}

stop_pid() {
    local f="$PC_STATE/run/$1.pid" pid
    [[ -f $f ]] || return 0
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
}

stop_pair() {
    stop_pid relay
    stop_pid proxy
}
