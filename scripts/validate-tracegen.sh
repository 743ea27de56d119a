#!/usr/bin/env bash
# Link-level validation of the HSR trace generator (testbed/tracegen) against
# the published numbers of hsr-facts §15.8, written to
# bench/out/tracegen-validation.txt (and printed). docs/hsr-model.md explains
# every row.
#
# 1. Fleets (deterministic: fixed seeds, 600 s trips, 2 carriers):
#    - pc-gateway-300 (default preset): 3 routes x 12 passes = 36 trips: route
#      seed 1 with trip seeds 1..12, route 2 with 13..24, route 3 with 25..36.
#      Item 9 (cells with >= 1 failure) needs repeated passes of one route; PC's
#      figure is for about 12 passes per <cell, direction>, hence 12 trips per
#      route. Three routes, pooled, keep one route's drawn per-cell propensities
#      from dominating items 8 and 9. Trip seeds differ between routes because
#      the per-trip processes (fading, delay, outcomes) depend on the trip seed
#      only: equal trip seeds on two routes would repeat the same fading.
#    - m19-phone-300: route 1 x trip seeds 1..6 (smaller check).
#    - m19-phone-350: route 1 x trip seeds 1..6; item 7's published quantiles
#      (M19 Fig. 12) are for 350 km/h, so this is the like-for-like check.
#    `polycorn-tracegen validate` checks items 1-11 and 13 on each fleet.
# 2. Item 12 (RTO share under BBR iPerf, PC §2.2): real TCP through
#    polycorn-emu. For each of the first VAL_TCP_TRIPS trips of the pc fleet
#    (route 1) and each carrier, its own namespace testbed (PC_PREFIX
#    pcv<trip>c<carrier>, one carrier), polycorn-emu --replace driven by that
#    carrier's traces and schedule, and one iperf3 -R (downlink) flow with BBR
#    (CUBIC, labelled, if the kernel has no BBR) for VAL_TCP_SECONDS. All run
#    concurrently (independent carriers, one sender per namespace, so the
#    namespace's nstat counters are that flow's). The RTO counters come from
#    nstat and from tcp_info (testbed/tracegen/tools/tcp_rto_poll.py).
#    Everything is torn down on exit, errors and Ctrl-C included.
#
# Env: VAL_TCP (1; 0 skips item 12), VAL_TCP_TRIPS (2), VAL_TCP_SECONDS (300),
# VAL_DIR (/tmp/polycorn-tracegen-validation, generated trips), BENCH_OUT
# (bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."

VAL_TCP=${VAL_TCP:-1}
TCP_TRIPS=${VAL_TCP_TRIPS:-2}
TCP_SECS=${VAL_TCP_SECONDS:-300}
DIR=${VAL_DIR:-/tmp/polycorn-tracegen-validation}
OUT=${BENCH_OUT:-bench/out}
RESULT=$OUT/tracegen-validation.txt
DURATION=600
PC_ROUTES=(1 2 3)
PC_TRIPS_PER_ROUTE=12
M19_TRIPS=$(seq 1 6)
BIN=target/release/polycorn-tracegen
EMU=target/release/polycorn-emu
PORT=5201

log() { echo "validate-tracegen: $*" >&2; }

# Never validate binaries that are not the current sources' (a failed build
# leaves the last ones in target/release).
if ! cargo build --release --locked -p polycorn-tracegen -p polycorn-emu; then
    log "FAILED: cargo build of polycorn-tracegen and polycorn-emu failed; nothing validated"
    exit 1
fi
mkdir -p "$DIR" "$OUT"
WORK=$DIR/tcp
# Private copies: another build of target/release during the run must not swap them.
mkdir -p "$WORK"
cp "$BIN" "$EMU" "$WORK/"
BIN=$WORK/polycorn-tracegen
EMU=$WORK/polycorn-emu

# ---- fleets
gen() { # preset route trip
    local d=$DIR/$1/r$2-t$3
    [[ -f $d/trip.json ]] && return 0
    "$BIN" generate --preset "$1" --route-seed "$2" --trip-seed "$3" --duration-s "$DURATION" --carriers 2 --out "$d"
}
pc_dirs=() m19_300_dirs=() m19_350_dirs=()
for r in "${PC_ROUTES[@]}"; do
    for ((t = (r - 1) * PC_TRIPS_PER_ROUTE + 1; t <= r * PC_TRIPS_PER_ROUTE; t++)); do
        gen pc-gateway-300 "$r" "$t"
        pc_dirs+=("$DIR/pc-gateway-300/r$r-t$t")
    done
done
for t in $M19_TRIPS; do
    gen m19-phone-300 1 "$t"
    gen m19-phone-350 1 "$t"
    m19_300_dirs+=("$DIR/m19-phone-300/r1-t$t")
    m19_350_dirs+=("$DIR/m19-phone-350/r1-t$t")
done

{
    echo "# polycorn-tracegen validation against hsr-facts §15.8 ($(date -u +%Y-%m-%dT%H:%MZ), scripts/validate-tracegen.sh)"
    echo "# generator: $("$BIN" --version)"
    echo
    echo "== pc-gateway-300: route seeds ${PC_ROUTES[*]} x $PC_TRIPS_PER_ROUTE trips each (trip seeds 1..12, 13..24, 25..36), ${DURATION} s, 2 carriers (c0 = A, c1 = B)"
    "$BIN" validate "${pc_dirs[@]}"
    echo
    echo "== m19-phone-300: route 1 x trip seeds 1..6, ${DURATION} s, 2 carriers"
    echo "   (M19 presets use the PC capacity marginals and the M19-BBR RTT fit for both carriers: rows 1, 2, 4, 5 compare against PC, see docs/hsr-model.md)"
    "$BIN" validate "${m19_300_dirs[@]}"
    echo
    echo "== m19-phone-350: route 1 x trip seeds 1..6, ${DURATION} s, 2 carriers (item 7's published quantiles are for 350 km/h)"
    "$BIN" validate "${m19_350_dirs[@]}"
} >"$RESULT.tmp"

# ---- item 12: BBR iperf3 through polycorn-emu
PREFIXES=()
JOBS=()
cleanup() {
    local rc=$? p f
    trap - EXIT INT TERM
    for p in "${JOBS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for f in "$WORK"/*.emu.pid; do
        [[ -f $f ]] || continue
        kill -TERM "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
    for p in "${PREFIXES[@]}"; do
        PC_PREFIX=$p PC_CARRIERS=1 testbed/netns/down.sh || true
    done
    rm -f "$RESULT.tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'log interrupted; exit 130' INT TERM

# tcp_run TRIP_DIR CARRIER PREFIX CC: one BBR (or CUBIC) downlink flow; writes $WORK/PREFIX.{json,nstat,poll}.
tcp_run() {
    local d=$1 c=$2 p=$3 cc=$4 train=$3-train cloud=$3-cloud i
    PC_PREFIX=$p PC_CARRIERS=1 testbed/netns/up.sh >/dev/null
    "$EMU" --train-ns "$train" --cloud-ns "$cloud" --carriers 1 --replace \
        --down-trace "$d/c$c.down" --up-trace "$d/c$c.up" --schedule "$d/c$c.schedule" \
        --buffer-bytes 4000000 --seed "$((c + 1))" >"$WORK/$p.emu.out" 2>"$WORK/$p.emu.err" &
    echo $! >"$WORK/$p.emu.pid"
    for ((i = 0; i < 100; i++)); do
        grep -q ready "$WORK/$p.emu.out" 2>/dev/null && break
        sleep 0.1
    done
    grep -q ready "$WORK/$p.emu.out" || { log "$p: emulator not ready"; cat "$WORK/$p.emu.err" >&2; return 1; }
    for ns in "$train" "$cloud"; do
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
    done
    ip netns exec "$cloud" iperf3 -s -D -B 10.77.0.2 -p "$PORT" --pidfile "$WORK/$p.iperf3.pid"
    sleep 0.5
    ip netns exec "$cloud" python3 testbed/tracegen/tools/tcp_rto_poll.py "$PORT" "$((TCP_SECS + 3))" 0.02 \
        >"$WORK/$p.poll" &
    local poll=$!
    local rc=0
    timeout $((TCP_SECS + 60)) ip netns exec "$train" iperf3 -c 10.77.0.2 -B 10.77.0.1 -p "$PORT" \
        -t "$TCP_SECS" -R -C "$cc" -J >"$WORK/$p.json" || rc=$?
    wait "$poll" || { log "$p: tcp_rto_poll.py failed"; rc=1; }
    # iperf3 -J reports its own errors in the JSON too; a run without data is no run.
    if ((rc != 0)) || ! jq -e '(.error == null) and (.end.sum_received.bytes > 0)' "$WORK/$p.json" >/dev/null 2>&1; then
        log "$p: iperf3 failed (exit status $rc): $(jq -r '.error // "no result"' "$WORK/$p.json" 2>/dev/null || echo "no JSON output") (see $WORK/$p.json)"
        return 1
    fi
    # Absolute values (-a): a namespace's counters start at 0 when it is created,
    # and the history file nstat keeps is shared between namespaces (-s: not updated).
    ip netns exec "$cloud" nstat -asz --json >"$WORK/$p.nstat"
    kill -TERM "$(cat "$WORK/$p.emu.pid")" 2>/dev/null || true
    rm -f "$WORK/$p.emu.pid"
}

if [[ $VAL_TCP == 1 ]]; then
    if [[ $(id -u) -ne 0 ]] || ! command -v iperf3 >/dev/null || ! command -v nstat >/dev/null; then
        echo "12 skipped: needs root, iperf3 and nstat" >>"$RESULT.tmp"
    else
        cc=bbr
        # Asking for BBR in a throwaway namespace loads its module without
        # changing this machine's default (which new namespaces inherit).
        grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control \
            || unshare -n sysctl -qw net.ipv4.tcp_congestion_control=bbr 2>/dev/null || true
        if ! grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control; then
            cc=cubic
            log "BBR not available in this kernel: falling back to CUBIC (labelled in the results)"
        fi
        log "item 12: $TCP_TRIPS trip(s) x 2 carriers, ${TCP_SECS} s of $cc iperf3 each, all at once"
        rm -f "$WORK"/pcv*
        for ((t = 1; t <= TCP_TRIPS; t++)); do
            for c in 0 1; do
                p=pcv${t}c$c
                PREFIXES+=("$p")
                tcp_run "$DIR/pc-gateway-300/r1-t$t" "$c" "$p" "$cc" &
                JOBS+=($!)
            done
        done
        tcp_failed=0
        for j in "${JOBS[@]}"; do
            wait "$j" || tcp_failed=$((tcp_failed + 1))
        done
        if ((tcp_failed > 0)); then
            # Item 12 would be computed from missing or partial flows.
            log "FAILED: $tcp_failed of ${#JOBS[@]} iperf3 runs of item 12 failed (messages above); $RESULT not written"
            exit 1
        fi
        JOBS=()
        python3 testbed/tracegen/tools/rto_report.py "$WORK" "$DIR/pc-gateway-300" "$TCP_SECS" "$cc" >>"$RESULT.tmp"
    fi
else
    echo "12 not run (VAL_TCP=0)" >>"$RESULT.tmp"
fi

mv "$RESULT.tmp" "$RESULT"
cat "$RESULT"
log "wrote $RESULT"
