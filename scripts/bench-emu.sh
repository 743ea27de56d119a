#!/usr/bin/env bash
# Ceiling of the link emulator (testbed/emu, polycorn-emu) on this machine.
#
# Builds its own namespace testbed (PC_PREFIX=pcemu), replaces the carrier veths
# with polycorn-emu links at a constant rate (default 100 Mbit/s per carrier and
# direction, 1 ms one-way delay, 2 MB droptail buffer per direction), and runs
# one iperf3 TCP flow per carrier at the same time: iperf3 servers in the cloud
# namespace bound to cpx<i> (10.77.<i>.2), clients in the train namespace bound
# to car<i> (10.77.<i>.1). Cases: 4 carriers and 1 carrier, downlink (-R, the
# cloud sends) and uplink. For each case it records the per-carrier receiver
# goodput, the total, the retransmissions, and the emulator's CPU time
# (utime + stime of /proc/<pid>/stat over the iperf3 window) as % of one core.
#
# Writes bench/out/emu.json and prints a table. Everything it creates (namespaces,
# emulator, iperf3) is torn down on exit, on errors and on Ctrl-C.
#
# Then the same with a much higher link rate (EMU_STRESS_RATE_MBIT, 1000 Mbit/s per
# carrier, downlink only), where the emulator (or the machine) rather than the
# emulated link is the bottleneck: that is the ceiling proper.
#
# Env: EMU_SECONDS (20, per case), EMU_RATE_MBIT (100), EMU_STRESS_RATE_MBIT
# (1000; 0 skips those cases), EMU_DELAY_MS (1),
# EMU_BUFFER_BYTES (2000000), EMU_CC (cubic), BENCH_OUT (bench/out),
# PC_PREFIX (pcemu).
set -euo pipefail
cd "$(dirname "$0")/.."

export PC_PREFIX=${PC_PREFIX:-pcemu}
export PC_CARRIERS=4
# shellcheck source=testbed/netns/lib.sh
source testbed/netns/lib.sh
pc_require_root

SECS=${EMU_SECONDS:-20}
RATE=${EMU_RATE_MBIT:-100}
STRESS=${EMU_STRESS_RATE_MBIT:-1000}
DELAY=${EMU_DELAY_MS:-1}
BUFFER=${EMU_BUFFER_BYTES:-2000000}
CC=${EMU_CC:-cubic}
OUT=${BENCH_OUT:-bench/out}
WORK=$PC_STATE/bench-emu
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)
PORT0=5401

for tool in iperf3 jq ip; do
    command -v "$tool" >/dev/null || { echo "bench-emu: $tool not found: run 'make setup'" >&2; exit 1; }
done

log() { echo "bench-emu: $*" >&2; }

EMU_PID=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $EMU_PID ]] && kill -0 "$EMU_PID" 2>/dev/null; then
        kill -TERM "$EMU_PID" 2>/dev/null || true
        wait "$EMU_PID" 2>/dev/null || true
    fi
    testbed/netns/down.sh || true
    exit "$rc"
}
trap cleanup EXIT
trap 'log interrupted; exit 130' INT TERM

if ! cargo build --release --locked -p polycorn-emu; then
    [[ -x target/release/polycorn-emu ]] || exit 1
    log "warning: cargo build failed (workspace being edited?); using the existing target/release/polycorn-emu"
fi
mkdir -p "$WORK" "$OUT"
# A private copy: another build of target/release during the run must not swap it.
cp target/release/polycorn-emu "$WORK/polycorn-emu"

emu_ticks() { # utime + stime of the emulator, all threads
    local s
    s=$(cat "/proc/$EMU_PID/stat")
    s=${s##*) }
    awk '{ print $12 + $13 }' <<<"$s"
}

machine_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }

# start_topology N RATE: namespaces with N carriers, veths replaced by the emulator.
start_topology() {
    local n=$1 rate=$2 i
    PC_CARRIERS=$n testbed/netns/up.sh >/dev/null
    "$WORK/polycorn-emu" --train-ns "$NS_TRAIN" --cloud-ns "$NS_CLOUD" --carriers "$n" --replace \
        --rate-mbit "$rate" --delay-ms "$DELAY" --buffer-bytes "$BUFFER" \
        >"$WORK/emu.out" 2>"$WORK/emu-$n.err" &
    EMU_PID=$!
    for ((i = 0; i < 100; i++)); do
        grep -q ready "$WORK/emu.out" 2>/dev/null && break
        kill -0 "$EMU_PID" 2>/dev/null || { cat "$WORK/emu-$n.err" >&2; return 1; }
        sleep 0.1
    done
    grep -q ready "$WORK/emu.out" || { log "emulator not ready"; return 1; }
    for ((i = 0; i < n; i++)); do
        ip netns exec "$NS_TRAIN" ping -c 1 -W 2 "$(cpx_addr "$i")" >/dev/null
        ip netns exec "$NS_CLOUD" iperf3 -s -D -B "$(cpx_addr "$i")" -p $((PORT0 + i)) \
            --pidfile "$WORK/iperf3-s$i.pid"
    done
    sleep 0.5
}

stop_topology() {
    kill -TERM "$EMU_PID" 2>/dev/null || true
    wait "$EMU_PID" 2>/dev/null || true
    EMU_PID=
    testbed/netns/down.sh
}

# run_case N RATE DIR: one iperf3 flow per carrier, all at once; appends a JSON object to $WORK/cases.jsonl.
run_case() {
    local n=$1 rate=$2 dir=$3 i rflag=() t0 t1 m0 m1 pids=()
    [[ $dir == down ]] && rflag=(-R)
    log "$n carrier(s), $dir, ${SECS}s, $rate Mbit/s each"
    t0=$(emu_ticks)
    m0=$(machine_busy_ticks)
    for ((i = 0; i < n; i++)); do
        timeout $((SECS + 30)) ip netns exec "$NS_TRAIN" iperf3 -c "$(cpx_addr "$i")" -B "$(car_addr "$i")" -p $((PORT0 + i)) \
            -t "$SECS" -C "$CC" -J "${rflag[@]}" >"$WORK/iperf-$n-$dir-$i.json" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do
        wait "$i"
    done
    t1=$(emu_ticks)
    m1=$(machine_busy_ticks)
    local per=() retr=()
    for ((i = 0; i < n; i++)); do
        per+=("$(jq '.end.sum_received.bits_per_second / 1e6 * 100 | round / 100' "$WORK/iperf-$n-$dir-$i.json")")
        retr+=("$(jq '.end.sum_sent.retransmits // 0' "$WORK/iperf-$n-$dir-$i.json")")
    done
    jq -n -c --argjson n "$n" --arg dir "$dir" --argjson rate "$rate" --argjson delay "$DELAY" \
        --argjson buffer "$BUFFER" --arg cc "$CC" --argjson secs "$SECS" \
        --argjson per "[$(IFS=,; echo "${per[*]}")]" --argjson retr "[$(IFS=,; echo "${retr[*]}")]" \
        --argjson emu_ticks $((t1 - t0)) --argjson machine_ticks $((m1 - m0)) --argjson hz "$HZ" --argjson ncpu "$NCPU" '{
            carriers: $n, direction: $dir, rate_mbit: $rate, delay_ms: $delay, buffer_bytes: $buffer,
            cc: $cc, seconds: $secs, per_carrier_mbps: $per,
            total_mbps: (($per | add) * 100 | round / 100),
            retransmits: $retr,
            emu_cpu_pct_of_core: ($emu_ticks / $hz / $secs * 100 | round),
            machine_cpu_pct_all_cores: ($machine_ticks / $hz / $secs / $ncpu * 100 | round)
        }' >>"$WORK/cases.jsonl"
}

: >"$WORK/cases.jsonl"
for n in 4 1; do
    start_topology "$n" "$RATE"
    run_case "$n" "$RATE" down
    run_case "$n" "$RATE" up
    stop_topology
done
if ((STRESS > 0)); then
    for n in 4 1; do
        start_topology "$n" "$STRESS"
        run_case "$n" "$STRESS" down
        stop_topology
    done
fi

jq -s --argjson ncpu "$NCPU" --arg kernel "$(uname -r)" --arg cpu "$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)" '{
    what: "polycorn-emu ceiling: one iperf3 TCP flow per carrier, all carriers at once (scripts/bench-emu.sh)",
    machine: { cpus: $ncpu, model: $cpu, kernel: $kernel },
    cases: .
}' "$WORK/cases.jsonl" >"$OUT/emu.json"

printf '%-9s %-6s %-5s %-34s %9s %8s %10s\n' carriers rate dir "per-carrier Mbit/s" "total" "emu CPU" "machine"
jq -r '.cases[] | [(.carriers | tostring), (.rate_mbit | tostring), .direction, (.per_carrier_mbps | map(tostring) | join(" ")),
    (.total_mbps | tostring), ((.emu_cpu_pct_of_core | tostring) + "%"),
    ((.machine_cpu_pct_all_cores | tostring) + "%")] | @tsv' "$OUT/emu.json" |
    while IFS=$'\t' read -r c r d p t e m; do
        printf '%-9s %-6s %-5s %-34s %9s %8s %10s\n' "$c" "$r" "$d" "$p" "$t" "$e" "$m"
    done
log "wrote $OUT/emu.json"
