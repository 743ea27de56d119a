#!/usr/bin/env bash
# Integration tests of the HSR testbed: the topology runner on emulated links
# replaying a generated trip, its teardown after a crash and after Ctrl-C,
# and `make bench-hsr` end to end on its smallest profile (ci). Ends with
# "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

BIN=${BIN:-$root/target/release}
export BIN
for b in polycorn-emu polycorn-relay polycorn-proxy polycorn-pki polycorn-loadgen polycorn-tracegen; do
    [[ -x $BIN/$b ]] || cargo build --release --locked --workspace
done

pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else ko "$name"; fi; }

WORK=$(mktemp -d /tmp/polycorn-ithsr.XXXXXX)
P=pcith
cleanup() {
    PC_PREFIX=$P testbed/topology.sh down >/dev/null 2>&1 || true
    PC_PREFIX=${P}a testbed/topology.sh down >/dev/null 2>&1 || true
    PC_PREFIX=${P}b testbed/topology.sh down >/dev/null 2>&1 || true
    PC_PREFIX=${P}c testbed/topology.sh down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/polycorn-tracegen" generate --route-seed 1 --trip-seed 3 --duration-s 120 --carriers 2 --out "$WORK/trip" >/dev/null

# leftovers PREFIX: prints whatever of a topology survives (namespaces,
# processes naming it, TUN devices in the root namespace); empty when clean.
leftovers() {
    local p=$1
    local ns
    for ns in /run/netns/"$p"-*; do [[ -e $ns ]] && echo "namespace ${ns#/run/netns/}"; done
    pgrep -af -- "$p-(train|cloud|pax)|polycorn-state-$p" | grep -v pgrep || true
    ip -o link show type tun 2>/dev/null | grep -E ': (pe[0-9]+[tc][0-9]+|car[0-9]+|cpx[0-9]+)[:@]' || true
}

PAX() { ip netns exec "$P-pax" "$@"; }

topology_carries_traffic() {
    PC_PREFIX=$P testbed/topology.sh up --trip "$WORK/trip" --scheme minrtt >/dev/null || return 1
    # Through relay, emulated links and proxy to the origin and back.
    local got want
    got=$(PAX curl -fsS --max-time 60 http://10.99.0.10/files/bench-256KB.bin | sha256sum | cut -d' ' -f1)
    want=$(sha256sum /tmp/polycorn-state-$P/origin/www/files/bench-256KB.bin | cut -d' ' -f1)
    [[ $got == "$want" ]] || return 1
    # The carriers really are the emulator's TUN devices.
    ip -n "$P-train" -d link show car0 | grep -q tun
}
check "topology.sh up: a passenger download crosses relay, emulated links and proxy intact" topology_carries_traffic

teardown_after_sigkill() {
    # The caller of `up` dies without any cleanup (SIGKILL); `down` must still
    # remove everything it started.
    (PC_PREFIX=$P testbed/topology.sh up --trip "$WORK/trip" --scheme kernel-mptcp >/dev/null && exec sleep 1000) &
    local runner=$! i
    for ((i = 0; i < 300; i++)); do
        [[ $(ps -o comm= --ppid "$runner" 2>/dev/null) == sleep || $(ps -o comm= -p "$runner") == sleep ]] && break
        sleep 0.1
    done
    [[ -n $(leftovers "$P") ]] || return 1 # it really was up
    kill -KILL "$runner"
    wait "$runner" 2>/dev/null || true
    PC_PREFIX=$P testbed/topology.sh down >/dev/null
    local left
    left=$(leftovers "$P")
    [[ -z $left ]] || { echo "left behind: $left"; return 1; }
}
check "after a SIGKILL of its caller, topology.sh down leaves no namespace, process or TUN device" teardown_after_sigkill

# gps_only_holds_like_the_replay: issue 21. The same trip and oracle table
# (with the trip's route line) on three topologies side by side: one
# replaying track_m, one GPS only (--replay-gps-only: the proxy places the
# train by map matching onto the table's route), and one on a real gpsd
# (topology.sh --gpsd: gpsfake plays the trip's fixes as NMEA in real time,
# the relay reads gpsd and its replay sends no fixes). The proxy's hof-reject
# must hold a carrier as often (at least once) and for about as long
# (within 20 %) on each.
gps_only_holds_like_the_replay() {
    local t=$WORK/gps-trip epoch p
    "$BIN/polycorn-tracegen" generate --preset pc-gateway-300 --route-seed 7 --trip-seed 1001 \
        --duration-s 420 --carriers 2 --out "$t" >/dev/null || return 1
    "$BIN/polycorn-tracegen" failure-table --events "$t" --out "$WORK/gps-table.json" \
        --min-failures 1 --min-failure-rate 0 --route "$t/route.geojson" 2>/dev/null || return 1
    epoch=$(date +%s%3N)
    PC_PREFIX=${P}a testbed/topology.sh up --trip "$t" --scheme hrsch --epoch-unix-ms "$epoch" \
        --failure-table "$WORK/gps-table.json" >/dev/null || return 1
    PC_PREFIX=${P}b testbed/topology.sh up --trip "$t" --scheme hrsch --epoch-unix-ms "$epoch" \
        --failure-table "$WORK/gps-table.json" --relay-arg --replay-gps-only >/dev/null || return 1
    PC_PREFIX=${P}c testbed/topology.sh up --trip "$t" --scheme hrsch --epoch-unix-ms "$epoch" \
        --failure-table "$WORK/gps-table.json" --gpsd >/dev/null || return 1
    for p in ${P}a ${P}b ${P}c; do
        ip netns exec "$p-pax" timeout 400 bash -c \
            'while :; do curl -s -o /dev/null --max-time 120 http://10.99.0.10/files/100MiB.bin; done' &
    done
    wait
    local -A held rej
    for p in ${P}a ${P}b ${P}c; do
        ip netns exec "$p-cloud" curl -fsS --max-time 5 http://127.0.0.1:9464/metrics >"$WORK/$p.metrics" || return 1
        rej[$p]=$(awk '/schedulerlet="hof-reject",event="rejections"}/ {print int($2)}' "$WORK/$p.metrics")
        held[$p]=$(awk '/schedulerlet="hof-reject",event="held_ms"}/ {print int($2)}' "$WORK/$p.metrics")
    done
    for p in ${P}a ${P}b ${P}c; do PC_PREFIX=$p testbed/topology.sh down >/dev/null 2>&1 || true; done
    echo "  hof-reject on the proxy: replay ${rej[${P}a]} holds, ${held[${P}a]} ms; GPS only ${rej[${P}b]} holds, ${held[${P}b]} ms; gpsd ${rej[${P}c]} holds, ${held[${P}c]} ms"
    ((rej[${P}a] > 0)) || return 1
    for p in ${P}b ${P}c; do
        ((rej[$p] == rej[${P}a])) || return 1
        ((held[$p] * 10 >= held[${P}a] * 8 && held[$p] * 10 <= held[${P}a] * 12)) || return 1
    done
}
check "GPS only: the proxy places a --replay-gps-only train, and one reading a real gpsd (gpsfake playing the trip as NMEA), by map matching onto the table's route and holds carriers as with the replayed track positions" gps_only_holds_like_the_replay

bench_ci_runs() {
    BENCH_PREFIX=hbit BENCH_WORK=$WORK/bench PROFILE=ci SCHEMES="minrtt hrsch kernel-mptcp kernel-mptcp-conn" bash scripts/bench-hsr.sh \
        >"$WORK/bench.log" 2>&1 || { tail -30 "$WORK/bench.log"; return 1; }
    local out=$WORK/bench/out/hsr.json
    # Every scheme has results for every size, and minrtt's ratio to itself is 1.
    jq -e '.profile == "ci" and (.bulk | keys | length) == 4
        and ([.bulk[] | .["256KB"].n, .["1MB"].n, .["4MB"].n] | min) >= 1
        and .bulk.minrtt.overall.ratio_vs_minrtt == 1
        and (.im | keys | length) == 4' "$out" >/dev/null || { cat "$out"; return 1; }
    # hrsch ran with the stand-in failure table and the relay's radio replay:
    # the proxy loaded the table, got the train's telemetry and exports
    # hof-reject's counters.
    local m
    m=$(echo "$WORK"/bench/run-ci/hsr/*/hrsch/logs/proxy.metrics)
    jq -e '.failure_table.previous_trips >= 1' "$WORK/bench/run-ci/run.json" >/dev/null || return 1
    grep -q '^polycorn_failure_table_loads_total{} 1' "$m" || { echo "no table in $m"; return 1; }
    grep -Eq '^polycorn_telemetry_received_records_total\{\} [1-9]' "$m" || { echo "no telemetry in $m"; return 1; }
    grep -q 'schedulerlet="hof-reject",event="rejections"' "$m" || { echo "no hof-reject counters in $m"; return 1; }
    # The backlog phase: an always-busy download for every scheme, with bytes,
    # in the report.
    jq -e '[.backlog.minrtt, .backlog.hrsch, .backlog["kernel-mptcp"], .backlog["kernel-mptcp-conn"]]
        | all(.n >= 1 and .bytes > 0)' "$out" >/dev/null \
        || { jq '.backlog, .notes' "$out"; return 1; }
    # The concurrency phase (1, 10, 100 passengers) and the budget sweep
    # report every scheme, and no endpoint's budget peak exceeded its budget.
    jq -e '(.concurrency | keys) == ["1", "10", "100"]
        and ([.concurrency[] | .minrtt.goodput_mbps_total] | all(. > 0))
        and ([.concurrency["100"].minrtt.jain] | all(. > 0 and . <= 1))
        and (.budget_sweep | length) >= 2
        and ([.budget_sweep[] | .minrtt.backlog_goodput_mbps] | all(. > 0))
        and .budget_check.ok == true' "$out" >/dev/null \
        || { jq '{concurrency, budget_sweep, budget_check}' "$out"; return 1; }
    local k left=
    for k in 0 1 2 3 4 5 6 7; do left+=$(leftovers "hbit$k"); done
    [[ -z $left ]] || { echo "left behind: $left"; return 1; }
}
check "make bench-hsr PROFILE=ci: minrtt, hrsch (with a stand-in failure table and the radio replay), kernel-mptcp and kernel-mptcp-conn side by side, results for every size, the backlog, concurrency and budget-sweep phases, no budget exceeded, nothing left behind" bench_ci_runs

bench_interrupted_cleans_up() {
    # A background job of a script starts with SIGINT ignored; give it back
    # the default, as a terminal's Ctrl-C would find it.
    BENCH_PREFIX=hbit BENCH_WORK=$WORK/bench-int PROFILE=ci SCHEMES="minrtt kernel-mptcp" env --default-signal=INT bash scripts/bench-hsr.sh \
        >"$WORK/bench-int.log" 2>&1 &
    local pid=$! i
    for ((i = 0; i < 600; i++)); do
        grep -q "load from trip time" "$WORK/bench-int.log" && break
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    sleep 2
    kill -INT "$pid"
    local rc=0
    wait "$pid" || rc=$?
    ((rc != 0)) || return 1
    local left
    left=$(leftovers hbit0)$(leftovers hbit1)
    [[ -z $left ]] || { echo "left behind: $left"; return 1; }
}
check "Ctrl-C during make bench-hsr tears every topology down" bench_interrupted_cleans_up

echo
echo "integration-hsr: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
