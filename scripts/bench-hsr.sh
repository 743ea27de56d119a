#!/usr/bin/env bash
# make bench-hsr: every scheme side by side on the same emulated HSR trips.
#
#   PROFILE=demo|ci|short|full|long|precision|recovery scripts/bench-hsr.sh
#
# For each link set and trip, one copy of the topology per scheme
# (testbed/topology.sh, prefixes hb0, hb1, ...) is built; all their emulators
# share one wall-clock epoch, so every scheme sees the same capacity, delay,
# loss and handover realisation at the same moment. Then one load generator
# per topology runs the same plan (same seed), in phases (PHASES, below):
#   bulk         downloads of 256 KB, 1 MB and 4 MB at random points of a window;
#   im           instant messaging with 10, 20 and 30 users;
#   backlog      one backlogged download, requests back to back across
#                BACKLOG_S seconds, so that every handover failure in that
#                window gets a recovery measurement (and, against
#                single-path-c0/-c1, the best single carrier per trip);
#   concurrency  CONC_USERS (1, 10, 100) concurrent backlogged passengers in
#                turn, CONC_S seconds each, each passenger its own source
#                address; per window the relay's and proxy's peak RSS (VmHWM,
#                reset at the window's start) and metrics snapshots;
#   sweep        (hsr only) after each trip's main pass, the trip replayed
#                again for the SWEEP_SCHEMES (default minrtt hrsch, those in
#                SCHEMES), one topology per scheme and memory budget
#                (SWEEP_MIB, --mem-budget of relay and proxy), side by side:
#                one backlogged download of SWEEP_S seconds each.
# bench/polycorn_bench turns the records into ratios, oracle comparisons,
# tables and plots.
#
# Link sets:
#   hsr       trips from polycorn-tracegen (preset pc-gateway-300, 2 carriers)
#             on REPORT seeds: route seed 7, trip seeds 1001.. Development and
#             tuning use route seeds 1-3 / trip seeds 1..99 (the v2 failure model's
#             fit, unit tests); results are never reported on those.
#   mahimahi  the real LTE traces of testbed/traces/mahimahi (T-Mobile and
#             Verizon, driving; GPL-3.0 data, see its README) as carriers 0
#             and 1, 30 ms one-way delay, no random loss, no scheduled
#             blackouts (set MAHIMAHI_DIR to use another copy).
#   driving   two longer real driving traces of the same collection, AT&T LTE
#             (786 s) and T-Mobile UMTS (928 s), as carriers 0 and 1, 30 ms
#             one-way delay, no random loss: real outages (21 and 32 gaps of
#             1 s or more in their downlinks) on two unequal carriers. Trip k
#             starts both traces DRIVING_STEP_S x k seconds in (rotated, so
#             each trip sees another stretch of road); 1 trip in short and
#             full, 3 in long.
#
# Failure-location table (HRSCH's handover-failure-aware path rejection): the
# trainer learns it from TABLE_TRIPS (default 20) PREVIOUS trips of the same
# route (trip seeds 901..), never from a trip being measured; those trips go
# through Kafka and ingest into a fresh LinkDB first (make_table). Every
# scheme gets the table and the radio replay; only hof-reject uses it. The
# closed loop, trip after trip, is scripts/bench-loop.sh.
#
# Environment: PROFILE (default short), SCHEMES (space-separated, must
# include minrtt; default all below, precision: minrtt hrsch; a scheme
# NAME@oracle, NAME@broad, NAME@early or NAME@mean runs pipeline NAME with
# another failure table, and NAME~CC with congestion control CC on its
# subflows instead of the default, e.g. minrtt~cubic; see up_topology),
# BENCH_PREFIX
# (topology prefix, default hb), LINK_SETS (default: the profile's),
# BENCH_WORK (raw runs, default /tmp/polycorn-bench-hsr), BENCH_OUT (default
# bench/out; the demo and ci profiles write only under BENCH_WORK), PLOTS
# (directory for PNGs), SWEEP_SCHEMES (schemes of the budget sweep),
# TRIP_PARALLEL (trips at once, default 1, precision 11), SEGMENT_TRACE (1:
# relay and proxy of the main pass write a segment trace, --trace-dir, into
# each scheme's run directory; bench/polycorn_bench/stalls.py reads it).
#
# Diagnostics (development only; any of these makes the run a diagnostic
# one: its results go under BENCH_WORK/out, never bench/out, and run.json
# says "diagnostic"): ROUTE_SEED (default 7; development uses 1),
# TRIP_SEED_BASE (measured trips are BASE+1.., default 1000),
# TABLE_SEED_BASE (previous trips for the table, BASE+1.., default 900),
# HSR_TRIPS (trips of the hsr set), BENCH_SLOT_S (seconds per download
# slot), TABLE=previous|truth|none (truth: an oracle table built from the
# measured trip's own events by `polycorn-tracegen failure-table`, every
# failed cell, for an upper bound on hof-reject; none: no table),
# PHASES (a subset of: bulk im backlog concurrency sweep; default the
# profile's), CONC_USERS, CONC_S, SWEEP_MIB, SWEEP_S, TRACEGEN_PRESET
# (default pc-gateway-300), PC_EMU_LOSS_KEYING (the emulator's
# --loss-keying, default time) and LOAD_START_S (trip time of the load's
# start in seconds, or auto: as soon as every topology is up; default 45 in
# precision, 120 in short, full and long, auto in ci and demo). Results from before 2026-11-26 were
# measured on TRACEGEN_PRESET=pc-gateway-300-v1 PC_EMU_LOSS_KEYING=packet.
# Ctrl-C or any failure tears every topology down.
set -euo pipefail
# Bash reads a script while it runs it, so an edit to this file during a
# run of hours (a checkout, a commit in this tree) would make the running
# one read garbage: run a private snapshot instead (removed at once; bash
# keeps it open), with the repository root passed along.
if [[ ${POLYCORN_BENCH_HSR_SNAPSHOT:-} != "$0" ]]; then
    snapshot=$(mktemp "${TMPDIR:-/tmp}/bench-hsr.XXXXXX")
    cp "$0" "$snapshot"
    POLYCORN_BENCH_HSR_ROOT=$(cd "$(dirname "$0")/.." && pwd) POLYCORN_BENCH_HSR_SNAPSHOT=$snapshot \
        exec bash "$snapshot" "$@"
fi
rm -f "$0"
cd "$POLYCORN_BENCH_HSR_ROOT"
root=$(pwd)

PROFILE=${PROFILE:-short}
# The commit the run starts from (HEAD at the end may be later: others work
# in this tree while a full run takes hours).
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
BIN=${BIN:-$root/target/release}
export BIN
WORK=${BENCH_WORK:-/tmp/polycorn-bench-hsr}
MAHIMAHI_DIR=${MAHIMAHI_DIR:-$root/testbed/traces/mahimahi}
DRIVING_TRACES=(ATT-LTE-driving TMobile-UMTS-driving)
DRIVING_STEP_S=240
# hrsch and its ablations (one HRSCH mechanism added to minrtt each), hrsch
# with extended reinjection at k = 1 and 2 (testbed/pipelines.toml), the
# baselines.
# single-path-c0/-c1: each carrier alone (pin-path), for the best single
# carrier per trip. minrtt+opp/pen/stale/hol, hrsch+hol and hrsch+stale: the head-of-line
# schedulerlets (crates/core/src/sched/hol.rs), each alone and all three,
# for their ablation. hrsch+: the default pipeline (hrsch+stale with the
# tail rules, issue 20); hrsch+lead100: the default pipeline with a longer
# lead for hof-reject, and hrsch@mean: hrsch with the trainer's table at
# the failures' mean, the paper's rule (the trainer places them at their
# 10th percentile by default since 2026-11-27, after the full run of that
# day measured hrsch@early against hrsch on bulk downloads and chat).
DEFAULT_SCHEMES="minrtt hrsch minrtt+hpr minrtt+tpr minrtt+ori minrtt+er hrsch-k1 hrsch-k2 roundrobin redundant blest ecf single-path single-path-c0 single-path-c1 kernel-mptcp kernel-mptcp-conn minrtt+opp minrtt+pen minrtt+stale minrtt+hol hrsch+hol hrsch+stale hrsch+ hrsch+lead100 hrsch@mean"
ORIGIN=10.99.0.10
DIAGNOSTIC=0
for v in ROUTE_SEED TRIP_SEED_BASE TABLE_SEED_BASE HSR_TRIPS BENCH_SLOT_S TABLE PHASES CONC_USERS CONC_S SWEEP_MIB SWEEP_S TRACEGEN_PRESET PC_EMU_LOSS_KEYING LOAD_START_S; do
    [[ -n ${!v:-} ]] && DIAGNOSTIC=1
done
ROUTE_SEED=${ROUTE_SEED:-7}
PRESET=${TRACEGEN_PRESET:-pc-gateway-300}
TRIP_SEED_BASE=${TRIP_SEED_BASE:-1000}
TABLE_SEED_BASE=${TABLE_SEED_BASE:-900}
TABLE=${TABLE:-previous}
HSR_TRIPS_ENV=${HSR_TRIPS:-}
TABLE_TRIPS=${TABLE_TRIPS:-20}
LOAD_SEED=424242
CARRIERS=2

log() { printf 'bench-hsr: %s\n' "$*" >&2; }
die() { printf 'bench-hsr: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces)"

# Profile: per_size downloads per size and trip, IM messages per user and
# mean gap, trips per link set, link sets, backlogged-download seconds,
# seconds per concurrency window, budget-sweep budgets (MiB) and seconds,
# phases.
# Slots of 15 s in the reported profiles: with 7.5 s, half the 4 MB
# downloads timed out, and censoring at the timeout hid differences
# between schemes (docs/results.md, "Development-route diagnostics").
# ci and demo keep short slots for speed. The budget sweep chooses a
# default, so it runs on the development route (PHASES=sweep ROUTE_SEED=1,
# a diagnostic), never on the held-out trips of the full profile.
# full and long leave out the concurrency windows: with 23 schemes they
# overload 2 cores (docs/results.md, "Limits"); PHASES=concurrency (a
# diagnostic, fewer SCHEMES) runs them on their own.
# long: full's load on 31 held-out trips (trip seeds 1001-1031) and the
# Mahimahi pair, without the concurrency windows (with 22 schemes they
# overload 2 cores: docs/results.md, "Limits"); meant to be left running
# (overnight): about 10 h 40 min on 2 cores with the 22 default schemes,
# 19.5-20 min per trip (1095 s of load plus 72-99 s of warm-up and teardown,
# as the full run of 2026-11-25 spent per trip). 31 trips bring the overall
# hrsch/minrtt interval to a half-width of about 0.05 even when trips, not
# downloads, are resampled (docs/benchmarks.md, "Precision"). Like full, it
# writes bench/out unless BENCH_OUT says otherwise.
# precision: the headline ratio alone, hrsch against minrtt (SCHEMES may
# add others), in full's bulk phase on the same 31 held-out trips, run
# TRIP_PARALLEL (default 11) trips at once: the bulk phase keeps two cores
# far from busy (about 80 % idle with 22 topologies), so 22 topologies of
# 11 trips cost the wall time of one. About 27.5 min on 2 cores (3 waves of
# about 8 min and the failure table); it writes hsr-precision.json and
# hsr-precision.md, never hsr.json, so it can run three times for the
# run-to-run variation (polycorn_bench.runs) in one sitting.
# recovery: goodput after failed handovers alone (the backlog phase), for
# an interval that resolves it: one backlogged download from trip time 45 s
# for 1200 s (about 18 failed handovers per trip on 2 carriers, against 6
# in full's 300 s) on 16 held-out trips, 4 at once (24 saturated
# topologies with the six default schemes), 4 waves of about 21 min:
# 4 trips gave 68 windows and a 95 % interval of -28/+40 %, 16 bring it
# to about +-20 %. The schemes: hrsch with the learned table (failures at
# their 10th percentile, the trainer's default since 2026-11-27), with
# the paper's mean (hrsch@mean), and with the trip's oracle table
# (hrsch@oracle), the default pipeline, and the default pipeline with a
# longer HPR lead (hrsch+lead100); the two runs of 2026-11-26/27 had a
# mean-placed table as hrsch's and hrsch@early (then) or hrsch@broad
# (lower thresholds, before) beside it. Writes
# hsr-recovery.json and hsr-recovery.md, never hsr.json.
ALL_PHASES="bulk im backlog concurrency sweep"
case $PROFILE in
    ci) PER_SIZE=2 MESSAGES=5 GAP_MS=300 HSR_TRIPS=1 DEF_SETS="hsr" SLOT_S=6 IM_WIN_S=12 USERS="10" BACKLOG_S=15 DEF_LOAD_START=auto
        DEF_CONC_S=8 DEF_SWEEP_MIB="8 64" DEF_SWEEP_S=10 DEF_PHASES=$ALL_PHASES ;;
    demo) PER_SIZE=5 MESSAGES=15 GAP_MS=500 HSR_TRIPS=1 DEF_SETS="hsr" SLOT_S=7 IM_WIN_S=20 USERS="10 20 30" BACKLOG_S=30 DEF_LOAD_START=auto
        DEF_CONC_S=20 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=30 DEF_PHASES="bulk im backlog" ;;
    short) PER_SIZE=6 MESSAGES=30 GAP_MS=500 HSR_TRIPS=1 DRIVING_TRIPS=1 DEF_SETS="hsr mahimahi driving" SLOT_S=15 IM_WIN_S=25 USERS="10 20 30" BACKLOG_S=120 DEF_LOAD_START=120
        DEF_CONC_S=30 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=60 DEF_PHASES="bulk im backlog concurrency" ;;
    full) PER_SIZE=10 MESSAGES=100 GAP_MS=1000 HSR_TRIPS=5 DRIVING_TRIPS=1 DEF_SETS="hsr mahimahi driving" SLOT_S=15 IM_WIN_S=115 USERS="10 20 30" BACKLOG_S=300 DEF_LOAD_START=120
        DEF_CONC_S=60 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=180 DEF_PHASES="bulk im backlog" ;;
    long) PER_SIZE=10 MESSAGES=100 GAP_MS=1000 HSR_TRIPS=31 DRIVING_TRIPS=3 DEF_SETS="hsr mahimahi driving" SLOT_S=15 IM_WIN_S=115 USERS="10 20 30" BACKLOG_S=300 DEF_LOAD_START=120
        DEF_CONC_S=60 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=180 DEF_PHASES="bulk im backlog" ;;
    precision) PER_SIZE=10 MESSAGES=100 GAP_MS=1000 HSR_TRIPS=31 DEF_SETS="hsr" SLOT_S=15 IM_WIN_S=115 USERS="10 20 30" BACKLOG_S=300 DEF_LOAD_START=45
        DEF_CONC_S=60 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=180 DEF_PHASES="bulk"
        DEFAULT_SCHEMES="minrtt hrsch" DEF_PARALLEL=11 RESULT=hsr-precision ;;
    recovery) PER_SIZE=10 MESSAGES=100 GAP_MS=1000 HSR_TRIPS=16 DEF_SETS="hsr" SLOT_S=15 IM_WIN_S=115 USERS="10 20 30" BACKLOG_S=1200 DEF_LOAD_START=45
        DEF_CONC_S=60 DEF_SWEEP_MIB="8 16 32 64" DEF_SWEEP_S=180 DEF_PHASES="backlog"
        DEFAULT_SCHEMES="minrtt hrsch hrsch@oracle hrsch@mean hrsch+ hrsch+lead100" DEF_PARALLEL=4 RESULT=hsr-recovery ;;
    *) die "PROFILE must be demo, ci, short, full, long, precision or recovery, got '$PROFILE'" ;;
esac
read -r -a SCHEMES <<<"${SCHEMES:-$DEFAULT_SCHEMES}"
[[ " ${SCHEMES[*]} " == *" minrtt "* ]] || die "SCHEMES must include minrtt (the reference of every ratio)"
for s in "${SCHEMES[@]}"; do
    [[ $s != *@* || $s == *@oracle || $s == *@broad || $s == *@early || $s == *@mean ]] \
        || die "scheme '$s': the only table suffixes are @oracle, @broad, @early and @mean"
    [[ ${s%@*} != *~* || ${s%@*} =~ ^[^~]+~[a-z0-9_]{1,15}$ ]] \
        || die "scheme '$s': a congestion-control suffix is ~NAME, one kernel algorithm (e.g. minrtt~cubic)"
done
# Trips of a link set run in waves of TRIP_PARALLEL, each trip its own block
# of topologies (prefixes BENCH_PREFIX<slot x topologies + i>) and its own
# epoch; results do not depend on it, the machine's load does (see
# docs/benchmarks.md, "Trips in parallel").
TRIP_PARALLEL=${TRIP_PARALLEL:-${DEF_PARALLEL:-1}}
SEGMENT_TRACE=${SEGMENT_TRACE:-0}
[[ $SEGMENT_TRACE == [01] ]] || die "SEGMENT_TRACE must be 0 or 1, got '$SEGMENT_TRACE'"
[[ $TRIP_PARALLEL =~ ^[1-9][0-9]*$ ]] || die "TRIP_PARALLEL must be a positive integer, got '$TRIP_PARALLEL'"
RESULT=${RESULT:-hsr}
# The trip time (s) at which the load starts: fixed in the reported
# profiles, so that two runs put every download at the same place of the
# trip and differ only by the machine (before 2026-11-26 it was "as soon as
# every topology is up", 16-24 s with 22 topologies, which moved every
# download by up to 8 s between runs); auto in ci and demo.
LOAD_START_S=${LOAD_START_S:-$DEF_LOAD_START}
[[ $LOAD_START_S == auto || $LOAD_START_S =~ ^[1-9][0-9]*$ ]] || die "LOAD_START_S must be a number of seconds or auto, got '$LOAD_START_S'"
HSR_TRIPS=${HSR_TRIPS_ENV:-$HSR_TRIPS}
read -r -a PHASE_LIST <<<"${PHASES:-$DEF_PHASES}"
((${#PHASE_LIST[@]})) || die "PHASES is empty (a subset of: $ALL_PHASES)"
for ph in "${PHASE_LIST[@]}"; do
    [[ " $ALL_PHASES " == *" $ph "* ]] || die "unknown phase '$ph' in PHASES (a subset of: $ALL_PHASES)"
done
# has_phase NAME: NAME is one of the selected phases.
has_phase() { [[ " ${PHASE_LIST[*]} " == *" $1 "* ]]; }
# Concurrency: users per window (each its own passenger, source address
# CONC_SOURCE_BASE + u; topology.sh adds 10.66.0.100-163, the rest are added
# below), seconds per window, and a pause between windows for the snapshots.
CONC_S=${CONC_S:-$DEF_CONC_S}
read -r -a CONC_COUNTS <<<"${CONC_USERS:-1 10 100}"
CONC_SOURCE_BASE=10.66.0.100
CONC_GAP_S=3
for u in "${CONC_COUNTS[@]}"; do
    if ! [[ $u =~ ^[1-9][0-9]*$ ]] || ((u > 154)); then die "CONC_USERS must be integers 1..154, got '$u'"; fi
done
[[ $CONC_S =~ ^[1-9][0-9]*$ ]] || die "CONC_S must be a positive integer, got '$CONC_S'"
# Budget sweep: relay and proxy --mem-budget in MiB, seconds of backlog.
read -r -a SWEEP_BUDGETS <<<"${SWEEP_MIB:-$DEF_SWEEP_MIB}"
SWEEP_S=${SWEEP_S:-$DEF_SWEEP_S}
for m in "${SWEEP_BUDGETS[@]}"; do
    [[ $m =~ ^[1-9][0-9]*$ ]] || die "SWEEP_MIB must be positive integers (MiB), got '$m'"
done
[[ $SWEEP_S =~ ^[1-9][0-9]*$ ]] || die "SWEEP_S must be a positive integer, got '$SWEEP_S'"
[[ $TABLE =~ ^(previous|truth|none)$ ]] || die "TABLE must be previous, truth or none, got '$TABLE'"
for v in ROUTE_SEED TRIP_SEED_BASE TABLE_SEED_BASE; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
if [[ -n ${BENCH_SLOT_S:-} ]]; then
    [[ $BENCH_SLOT_S =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "BENCH_SLOT_S must be a number of seconds, got '$BENCH_SLOT_S'"
    SLOT_S=$BENCH_SLOT_S
fi
[[ $HSR_TRIPS =~ ^[1-9][0-9]*$ ]] || die "HSR_TRIPS must be a positive integer, got '$HSR_TRIPS'"
read -r -a LINK_SETS <<<"${LINK_SETS:-$DEF_SETS}"
read -r -a USER_COUNTS <<<"$USERS"
N_SIZES=3
BULK_S=0 IM_S=0 CONC_TOTAL_S=0
has_phase bulk && BULK_S=$(awk -v n="$PER_SIZE" -v s="$SLOT_S" -v k="$N_SIZES" 'BEGIN { printf "%d", n * k * s + 0.999 }')
has_phase im && IM_S=$((IM_WIN_S * ${#USER_COUNTS[@]}))
has_phase backlog || BACKLOG_S=0
has_phase concurrency && CONC_TOTAL_S=$(((CONC_S + CONC_GAP_S) * ${#CONC_COUNTS[@]}))
# The sweep's schemes: SWEEP_SCHEMES, or those of minrtt and hrsch that run.
SWEEP_UNITS=() SWEEP_LIST=()
if has_phase sweep; then
    if [[ -n ${SWEEP_SCHEMES:-} ]]; then
        read -r -a SWEEP_LIST <<<"$SWEEP_SCHEMES"
    else
        SWEEP_LIST=()
        for s in minrtt hrsch; do
            [[ " ${SCHEMES[*]} " == *" $s "* ]] && SWEEP_LIST+=("$s")
        done
    fi
    for m in "${SWEEP_BUDGETS[@]}"; do
        for s in "${SWEEP_LIST[@]}"; do SWEEP_UNITS+=("$m:$s"); done
    done
fi
# Topologies come up during the first seconds of the trip (warm-up); the
# load starts once all are up. The trip is generated long enough for the
# longest warm-up allowed (and for the sweep's replay of its start). 22
# topologies took 99 s on two busy cores; a longer allowance costs only
# generated trip length, not run time.
MAX_WARMUP_S=180
[[ $LOAD_START_S == auto ]] || ((LOAD_START_S <= MAX_WARMUP_S)) || die "LOAD_START_S must be at most $MAX_WARMUP_S s (the trip is generated for that warm-up), got $LOAD_START_S"
TRIP_S=$((MAX_WARMUP_S + BULK_S + IM_S + BACKLOG_S + CONC_TOTAL_S + 15))
((TRIP_S >= MAX_WARMUP_S + SWEEP_S + 15)) || TRIP_S=$((MAX_WARMUP_S + SWEEP_S + 15))
# Topologies per trip: the schemes of the main pass, or the sweep's units;
# TRIP_PARALLEL trips at once.
N_TOPO=${#SCHEMES[@]}
((${#SWEEP_UNITS[@]} > N_TOPO)) && N_TOPO=${#SWEEP_UNITS[@]}
N_TOPO_ALL=$((N_TOPO * TRIP_PARALLEL))
# The backlogged download fetches this origin file (testbed/origin/make-files.sh) again and again.
BACKLOG_PATH=/files/100MiB.bin
BACKLOG_SIZE=104857600

if [[ $PROFILE == demo || $PROFILE == ci || $DIAGNOSTIC == 1 ]]; then
    OUT=${BENCH_OUT:-$WORK/out}
else
    OUT=${BENCH_OUT:-bench/out}
fi
PLOTS=${PLOTS:-$OUT/plots-$PROFILE}

for b in polycorn-emu polycorn-relay polycorn-proxy polycorn-pki polycorn-loadgen polycorn-tracegen; do
    [[ -x $BIN/$b ]] || die "$BIN/$b missing: run 'make build'"
done
command -v uv >/dev/null || die "uv not found: run 'make setup'"

RUN=$WORK/run-$PROFILE
rm -rf "$RUN"
mkdir -p "$RUN" "$OUT"

# Topology prefixes: ${BENCH_PREFIX}0, 1, ... (another run, e.g. the
# integration tests, uses another BENCH_PREFIX).
BENCH_PREFIX=${BENCH_PREFIX:-hb}
[[ $BENCH_PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "BENCH_PREFIX must be 1-8 lower-case letters/digits, got '$BENCH_PREFIX'"
# With TRIP_PARALLEL, trip slot k uses the block BASE = k x N_TOPO: topology
# i of the running trip is BENCH_PREFIX<BASE + i> (run_trip sets BASE).
BASE=0
prefix_of() { echo "$BENCH_PREFIX$((BASE + $1))"; }

ALL_DOWN_DONE=0
# all_down [COUNT]: tear down topologies 0..COUNT-1 of the block at BASE
# (default: the trip's N_TOPO).
all_down() {
    local i pids=() count=${1:-$N_TOPO}
    # In parallel: each takes a few seconds (processes get SIGTERM and time
    # to exit before SIGKILL).
    for ((i = 0; i < count; i++)); do
        PC_PREFIX=$(prefix_of "$i") testbed/topology.sh down >/dev/null 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done
}
# Kernel TCP memory: the concurrency phase keeps N_TOPO x 100 downloads busy
# at once on one kernel (2,200 with 22 schemes), far more TCP memory than a
# train or a proxy pod ever holds, and tcp_mem is global, not per namespace:
# at its limit the kernel stalls every socket, carriers included (the first
# 22-scheme full run: every scheme's 100-passenger window moved almost
# nothing, both carriers declared dead, with the links idle). Raise it for
# the run (pressure at a quarter of RAM, the limit at three eighths) and
# restore it on exit.
TCP_MEM_SAVED=$(cat /proc/sys/net/ipv4/tcp_mem)
raise_tcp_mem() {
    local pages low pressure high
    pages=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 4))
    read -r low pressure high <<<"$TCP_MEM_SAVED"
    ((pages / 4 > pressure)) && pressure=$((pages / 4))
    ((pages * 3 / 8 > high)) && high=$((pages * 3 / 8))
    if echo "$low $pressure $high" 2>/dev/null >/proc/sys/net/ipv4/tcp_mem; then
        log "tcp_mem $TCP_MEM_SAVED -> $(cat /proc/sys/net/ipv4/tcp_mem) (pages) for the run"
    else
        log "WARNING: cannot raise tcp_mem ($TCP_MEM_SAVED pages): many concurrent passengers may stall every socket"
    fi
}
on_exit() {
    local rc=$? j
    echo "$TCP_MEM_SAVED" >/proc/sys/net/ipv4/tcp_mem 2>/dev/null || true
    # The per-scheme load sequences first, so none starts a new step in a
    # namespace being deleted.
    for j in $(jobs -p); do kill "$j" 2>/dev/null || true; done
    # Every block any trip slot may have used.
    ((ALL_DOWN_DONE)) || { log "tearing down"; BASE=0 all_down "$N_TOPO_ALL"; }
    drop_table_db
    exit "$rc"
}
trap on_exit EXIT
raise_tcp_mem
trap 'log "interrupted"; exit 130' INT TERM

now_ms() { date +%s%3N; }

# rotate_trace FILE OFFSET_MS OUT: a Mahimahi trace started OFFSET_MS in, as
# its player would reach it, every opportunity and the period kept
# (polycorn_bench.links, Trace.rotated).
rotate_trace() {
    uv run --project bench --locked --quiet python -m polycorn_bench.links rotate "$1" "$2" "$3" \
        || die "cannot cut $1 at $2 ms"
}

# make_trip LINK_SET INDEX DIR: the link files of one trip; prints its id.
make_trip() {
    local set=$1 k=$2 dir=$3
    case $set in
        hsr)
            local ts=$((TRIP_SEED_BASE + 1 + k))
            "$BIN/polycorn-tracegen" generate --preset "$PRESET" --route-seed "$ROUTE_SEED" \
                --trip-seed "$ts" --duration-s "$TRIP_S" --carriers "$CARRIERS" --out "$dir" >/dev/null
            ;;
        mahimahi)
            mkdir -p "$dir"
            local i name
            local names=(TMobile-LTE-short Verizon-LTE-short)
            for i in 0 1; do
                name=${names[$i]}
                cp "$MAHIMAHI_DIR/$name.up" "$dir/c$i.up"
                cp "$MAHIMAHI_DIR/$name.down" "$dir/c$i.down"
                printf '# %s, Mahimahi LTE trace: constant delay, no loss, no blackouts\ndelay 0 30\n' \
                    "$name" >"$dir/c$i.schedule"
            done
            ;;
        driving)
            mkdir -p "$dir"
            local i name off=$((DRIVING_STEP_S * k * 1000))
            for i in 0 1; do
                name=${DRIVING_TRACES[$i]}
                rotate_trace "$MAHIMAHI_DIR/$name.up" "$off" "$dir/c$i.up"
                rotate_trace "$MAHIMAHI_DIR/$name.down" "$off" "$dir/c$i.down"
                printf '# %s from %d ms, Mahimahi driving trace: constant delay, no loss, no scheduled blackouts\ndelay 0 30\n' \
                    "$name" "$off" >"$dir/c$i.schedule"
            done
            ;;
    esac
}

trip_ids() {
    local set=$1 k n
    case $set in
        hsr) n=$HSR_TRIPS ;;
        mahimahi) n=1 ;;
        driving) n=${DRIVING_TRIPS:-1} ;;
    esac
    for ((k = 0; k < n; k++)); do
        case $set in
            hsr) echo "r$ROUTE_SEED-t$((TRIP_SEED_BASE + 1 + k))" ;;
            mahimahi) echo "tmobile-verizon" ;;
            driving) echo "att-umts-$((DRIVING_STEP_S * k))s" ;;
        esac
    done
}

# make_table: the failure-location table the trainer learns from previous
# trips of the route (seeds TABLE_SEED_BASE+1..+TABLE_TRIPS, 901..920 by
# default; measured trips are TRIP_SEED_BASE+1.., 1001.. by default), through
# the fleet's real path: each trip's telemetry into Kafka (polycorn-ingest
# produce-testbed), polycorn-ingest into a fresh LinkDB (scripts/trainer_fleet.py
# load checks every count), then `polycorn-trainer run --once` with its
# default thresholds; the table is the one it published in LinkDB.
make_table() {
    uv sync --all-packages --locked --quiet
    bash scripts/infra.sh up pg kafka >/dev/null
    local env db url
    env=$(bash scripts/infra.sh env)
    eval "$env"
    db=linkdb_bench_hsr_$$
    url=${POLYCORN_DATABASE_URL%/*}/$db
    psql "${POLYCORN_DATABASE_URL%/*}/postgres" -qc "CREATE DATABASE $db"
    TABLE_DB=$db
    uv run --all-packages --locked --quiet polycorn-linkdb --url "$url" upgrade 2>/dev/null
    uv run --all-packages --locked --quiet python scripts/trainer_fleet.py load --route-seed "$ROUTE_SEED" \
        --trip-seeds "$((TABLE_SEED_BASE + 1))-$((TABLE_SEED_BASE + TABLE_TRIPS))" --duration-s "$TRIP_S" \
        --carriers "$CARRIERS" --preset "$PRESET" --tracegen "$BIN/polycorn-tracegen" --database-url "$url" \
        --work "$RUN/table-trips" --out "$RUN/table-fleet.json" >"$RUN/table-load.log" 2>&1 \
        || die "loading the previous trips into LinkDB failed: $RUN/table-load.log"
    trainer_table "$url" ""
    [[ -s $RUN/failure-table.json ]] || die "the trainer published no table (no cell met its thresholds): $RUN/trainer.json"
    log "failure-location table: $(jq '.entries | length' "$RUN/failure-table.json") cells, learned by the trainer from $TABLE_TRIPS previous trips"
    # The same trainer on the same LinkDB with other parameters, for the
    # schemes NAME@broad (lower thresholds: a cell enters with 2 failures
    # and a 10 % failure share, instead of 3 and 20 %), NAME@early (each
    # cell's failure placed at the 10th percentile of its failures along the
    # direction of travel: the trainer's default since 2026-11-27, so the
    # same as the run's table now) and NAME@mean (at their mean, the
    # paper's rule and the default before).
    local name args
    for name in broad early mean; do
        uses_table "$name" || continue
        case $name in
            broad) args=(--min-failures 2 --min-failure-rate 0.1) ;;
            early) args=(--location-quantile 0.1) ;;
            mean) args=(--location-quantile mean) ;;
        esac
        trainer_table "$url" "-$name" "${args[@]}"
        log "$name failure-location table (${args[*]}): $(jq '.entries | length' "$RUN/failure-table-$name.json") cells"
    done
}

# trainer_table URL SUFFIX TRAINER-ARGS...: `polycorn-trainer run --once` on
# LinkDB URL with TRAINER-ARGS; the table it published into
# RUN/failure-table<SUFFIX>.json, its summary and log beside it.
trainer_table() {
    local url=$1 suffix=$2
    shift 2
    "$root/.venv/bin/polycorn-trainer" --log-level WARNING run --once --database-url "$url" --bootstrap "" \
        "$@" --summary-json "$RUN/trainer$suffix.json" 2>"$RUN/trainer$suffix.log" \
        || die "the trainer${*:+ ($*)} failed: $RUN/trainer$suffix.log"
    psql "$url" -Atc "SELECT body FROM failure_tables ORDER BY version DESC LIMIT 1" >"$RUN/failure-table$suffix.json"
}

# uses_table NAME: whether a scheme NAME@... of SCHEMES asks for that table.
uses_table() {
    [[ " ${SCHEMES[*]} " == *"@$1 "* ]]
}
drop_table_db() {
    [[ -n ${TABLE_DB:-} ]] || return 0
    psql "${POLYCORN_DATABASE_URL%/*}/postgres" -qc "DROP DATABASE IF EXISTS $TABLE_DB WITH (FORCE)" >/dev/null 2>&1 || true
}

# mem_reset PREFIX: reset the relay's and the proxy's peak RSS (VmHWM) to
# their current RSS (/proc/PID/clear_refs 5, Linux >= 4.0), so that VmHWM
# read later is the peak since now.
mem_reset() {
    local state=/tmp/polycorn-state-$1 name pid
    for name in relay proxy; do
        pid=$(cat "$state/run/$name.pid" 2>/dev/null) || continue
        echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || true
    done
}

# mem_snapshot PREFIX DIR N: after concurrency window N, the relay's and the
# proxy's VmHWM and VmRSS (kB) into DIR/concurrency-N.mem.json, and their
# metrics into DIR/logs/concurrency-N.{relay,proxy}.metrics.
mem_snapshot() {
    local p=$1 dir=$2 n=$3 state=/tmp/polycorn-state-$1 name pid hwm rss json=""
    for name in relay proxy; do
        hwm=null rss=null pid=null
        if pid=$(cat "$state/run/$name.pid" 2>/dev/null) && [[ -r /proc/$pid/status ]]; then
            hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")
            rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
        else
            pid=null
        fi
        json+="${json:+, }\"$name\": {\"pid\": $pid, \"vm_hwm_kb\": ${hwm:-null}, \"vm_rss_kb\": ${rss:-null}}"
    done
    printf '{"users": %s, %s}\n' "$n" "$json" >"$dir/concurrency-$n.mem.json"
    mkdir -p "$dir/logs"
    ip netns exec "$p-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics >"$dir/logs/concurrency-$n.relay.metrics" 2>/dev/null || true
    ip netns exec "$p-cloud" curl -fsS --max-time 2 http://127.0.0.1:9464/metrics >"$dir/logs/concurrency-$n.proxy.metrics" 2>/dev/null || true
}

# run_load DIR SCHEME_INDEX EPOCH START_S LINK_SET: the whole plan of one scheme.
run_load() {
    local dir=$1 i=$2 epoch=$3 start=$4 set=$5
    local ns p
    p=$(prefix_of "$i")
    ns="$p-pax"
    local t=$start u
    if has_phase bulk; then
        t=$(awk -v a="$start" -v b="$BULK_S" 'BEGIN { printf "%d", a + b }')
        ip netns exec "$ns" "$BIN/polycorn-loadgen" bulk --origin "$ORIGIN:80" --epoch-unix-ms "$epoch" \
            --seed "$LOAD_SEED" --window-s "$start:$t" --per-size "$PER_SIZE" \
            --out "$dir/bulk.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: bulk exited with $?"
    fi
    if has_phase im; then
        for u in "${USER_COUNTS[@]}"; do
            ip netns exec "$ns" "$BIN/polycorn-loadgen" im --server "$ORIGIN:7100" --epoch-unix-ms "$epoch" \
                --seed "$((LOAD_SEED + u))" --users "$u" --messages "$MESSAGES" --mean-gap-ms "$GAP_MS" \
                --start-s "$t" --deadline-s "$((t + IM_WIN_S - 1))" --source-base 10.66.0.100 \
                --out "$dir/im-$u.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: im $u exited with $?"
            t=$((t + IM_WIN_S))
        done
    fi
    # Every link set: recovery after handover failures (hsr) and the
    # comparison with the best single carrier (both sets).
    if ((BACKLOG_S > 0)); then
        ip netns exec "$ns" "$BIN/polycorn-loadgen" backlog --origin "$ORIGIN:80" --epoch-unix-ms "$epoch" \
            --window-s "$t:$((t + BACKLOG_S))" --path "$BACKLOG_PATH" --size "$BACKLOG_SIZE" \
            --out "$dir/backlog.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: backlog exited with $?"
        t=$((t + BACKLOG_S))
    fi
    if has_phase concurrency; then
        for u in "${CONC_COUNTS[@]}"; do
            t=$((t + CONC_GAP_S))
            mem_reset "$p"
            ip netns exec "$ns" "$BIN/polycorn-loadgen" backlog --origin "$ORIGIN:80" --epoch-unix-ms "$epoch" \
                --window-s "$t:$((t + CONC_S))" --path "$BACKLOG_PATH" --size "$BACKLOG_SIZE" \
                --users "$u" --source-base "$CONC_SOURCE_BASE" \
                --out "$dir/concurrency-$u.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: concurrency $u exited with $?"
            mem_snapshot "$p" "$dir" "$u"
            t=$((t + CONC_S))
        done
    fi
}

# extra_passengers PREFIX: the source addresses of the concurrency phase
# beyond the 10.66.0.100-163 that topology.sh adds.
extra_passengers() {
    local ns="$1-pax" max=0 u k
    for u in "${CONC_COUNTS[@]}"; do ((u > max)) && max=$u; done
    for ((k = 164; k < 100 + max; k++)); do
        ip -n "$ns" addr add "10.66.0.$k/24" dev pax0 2>/dev/null || true
    done
}

# collect DIR SCHEME_INDEX: logs and final metrics of a scheme's topology.
collect() {
    local dir=$1 i=$2 p state
    p=$(prefix_of "$i")
    state=/tmp/polycorn-state-$p
    mkdir -p "$dir/logs"
    ip netns exec "$p-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics >"$dir/logs/relay.metrics" 2>/dev/null || true
    ip netns exec "$p-cloud" curl -fsS --max-time 2 http://127.0.0.1:9464/metrics >"$dir/logs/proxy.metrics" 2>/dev/null || true
    # The emulator prints its per-link stats on SIGTERM (at teardown), so its
    # log is copied after all_down.
    cp "$state"/logs/*.log "$dir/logs/" 2>/dev/null || true
}

# up_topology INDEX SCHEME EPOCH K TDIR WHAT [topology.sh flags...]: one copy
# of the topology replaying the trip TDIR/trip (table: TABLE_ARGS).
# A scheme NAME@oracle is the pipeline NAME with the trip's oracle table
# (run_trip) instead of the run's, NAME@broad, NAME@early and NAME@mean
# with the trainer's table at other parameters (make_table): side by side,
# paired. A scheme NAME~CC (before any @table) runs NAME with relay and
# proxy --subflow-cc CC, so congestion controls compare in one run.
up_topology() {
    local i=$1 scheme=$2 epoch=$3 k=$4 tdir=$5 what=$6
    shift 6
    local table=("${TABLE_ARGS[@]}") file=""
    case $scheme in
        *@oracle) file=$tdir/failure-table-truth.json ;;
        *@broad) file=$RUN/failure-table-broad.json ;;
        *@early) file=$RUN/failure-table-early.json ;;
        *@mean) file=$RUN/failure-table-mean.json ;;
    esac
    if [[ $scheme == *@* ]]; then
        table=()
        [[ $tdir == "$RUN/hsr/"* && -f $file ]] && table=(--failure-table "$file")
    fi
    local pipeline=${scheme%@*} cc=()
    if [[ $pipeline == *~* ]]; then
        cc=(--relay-arg "--subflow-cc=${pipeline#*~}" --proxy-arg "--subflow-cc=${pipeline#*~}")
        pipeline=${pipeline%%~*}
    fi
    PC_PREFIX=$(prefix_of "$i") testbed/topology.sh up --trip "$tdir/trip" --scheme "$pipeline" "${cc[@]}" \
        --epoch-unix-ms "$epoch" --seed "$((LOAD_SEED + k))" "${table[@]}" "$@" >/dev/null \
        || die "$what: topology for $scheme failed (logs: /tmp/polycorn-state-$(prefix_of "$i")/logs)"
}

# warm_up EPOCH: trip time (s) at which the load starts, once every topology
# is up: LOAD_START_S when set (a fixed trip time, so that a rerun puts
# every download at the same place of the trip), else as soon as they are.
warm_up() {
    local warm
    warm=$((($(now_ms) - $1) / 1000 + 5))
    ((warm < 15)) && warm=15
    ((warm <= MAX_WARMUP_S)) || die "topologies took ${warm}s to come up (more than $MAX_WARMUP_S s)"
    if [[ $LOAD_START_S != auto ]]; then
        if ((warm > LOAD_START_S)); then
            log "WARNING: topologies took ${warm}s to come up, later than LOAD_START_S=$LOAD_START_S: the load starts at ${warm}s, so this trip's downloads sit elsewhere than in other runs"
        else
            warm=$LOAD_START_S
        fi
    fi
    echo "$warm"
}

# run_trip LINK_SET K TRIP SLOT: one trip on the SLOT-th block of topologies.
run_trip() {
    local set=$1 k=$2 id=$3
    BASE=$(($4 * N_TOPO))
    local tdir=$RUN/$set/$id
    mkdir -p "$tdir"
    make_trip "$set" "$k" "$tdir/trip"
    TABLE_ARGS=()
    if [[ $set == hsr ]] && { [[ $TABLE == truth ]] || uses_table oracle; }; then
        # Oracle: every cell where this very trip fails (TABLE=truth, a
        # diagnostic, or the schemes NAME@oracle).
        "$BIN/polycorn-tracegen" failure-table --events "$tdir/trip/events.jsonl" --min-failures 1 \
            --min-failure-rate 0 --out "$tdir/failure-table-truth.json" >/dev/null
        log "$set/$id: oracle failure table, $(jq '.entries | length' "$tdir/failure-table-truth.json") cells"
    fi
    if [[ $set == hsr && $TABLE == previous ]]; then
        TABLE_ARGS=(--failure-table "$RUN/failure-table.json")
    elif [[ $set == hsr && $TABLE == truth ]]; then
        TABLE_ARGS=(--failure-table "$tdir/failure-table-truth.json")
    fi
    # PHASES with the sweep alone: no main pass.
    if has_phase bulk || has_phase im || has_phase backlog || has_phase concurrency; then
        run_main "$set" "$k" "$id"
    fi
    if [[ $set == hsr ]] && ((${#SWEEP_UNITS[@]})); then
        run_sweep "$set" "$k" "$id"
    fi
}

# run_main LINK_SET K TRIP: every scheme side by side, the selected phases
# one after the other, on the block at BASE (run_trip).
run_main() {
    local set=$1 k=$2 id=$3
    local tdir=$RUN/$set/$id epoch i
    epoch=$(now_ms)
    log "$set/$id: building ${#SCHEMES[@]} topologies (epoch $epoch)"
    for i in "${!SCHEMES[@]}"; do
        local trace_args=()
        if ((SEGMENT_TRACE)); then
            trace_args=(--relay-arg "--trace-dir=$tdir/${SCHEMES[$i]}/trace" --proxy-arg "--trace-dir=$tdir/${SCHEMES[$i]}/trace")
        fi
        up_topology "$i" "${SCHEMES[$i]}" "$epoch" "$k" "$tdir" "$set/$id" "${trace_args[@]}"
        has_phase concurrency && extra_passengers "$(prefix_of "$i")"
    done
    local warm
    warm=$(warm_up "$epoch")
    local plan=""
    has_phase bulk && plan+="; $((PER_SIZE * N_SIZES)) downloads in ${BULK_S}s"
    has_phase im && plan+="; IM ${USER_COUNTS[*]} users"
    ((BACKLOG_S > 0)) && plan+="; a backlogged download for ${BACKLOG_S}s"
    has_phase concurrency && plan+="; ${CONC_COUNTS[*]} concurrent passengers, ${CONC_S}s each"
    log "$set/$id: load from trip time ${warm}s: ${plan#; }"
    local pids=()
    for i in "${!SCHEMES[@]}"; do
        mkdir -p "$tdir/${SCHEMES[$i]}"
        run_load "$tdir/${SCHEMES[$i]}" "$i" "$epoch" "$warm" "$set" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    for i in "${!SCHEMES[@]}"; do collect "$tdir/${SCHEMES[$i]}" "$i"; done
    printf '{"link_set": "%s", "trip": "%s", "epoch_unix_ms": %s, "load_start_s": %s}\n' \
        "$set" "$id" "$epoch" "$warm" >"$tdir/timing.json"
    all_down
    for i in "${!SCHEMES[@]}"; do
        cp "/tmp/polycorn-state-$(prefix_of "$i")/logs/emu.log" "$tdir/${SCHEMES[$i]}/logs/" 2>/dev/null || true
    done
}

# run_sweep LINK_SET K TRIP: the trip replayed again from its start, one
# topology per sweep scheme and budget (relay and proxy --mem-budget), side
# by side; each runs one backlogged download of SWEEP_S seconds. Records in
# TRIP/sweep/<MiB>/<scheme>/ (backlog.jsonl, logs/).
run_sweep() {
    local set=$1 k=$2 id=$3
    local tdir=$RUN/$set/$id epoch i m s bytes dir warm
    epoch=$(now_ms)
    log "$set/$id: budget sweep, ${#SWEEP_UNITS[@]} topologies (${SWEEP_BUDGETS[*]} MiB x ${SWEEP_LIST[*]}; epoch $epoch)"
    for i in "${!SWEEP_UNITS[@]}"; do
        m=${SWEEP_UNITS[$i]%%:*} s=${SWEEP_UNITS[$i]#*:}
        bytes=$((m * 1048576))
        up_topology "$i" "$s" "$epoch" "$k" "$tdir" "$set/$id sweep ${m} MiB" \
            --relay-arg "--mem-budget=$bytes" --proxy-arg "--mem-budget=$bytes"
    done
    warm=$(warm_up "$epoch")
    log "$set/$id: sweep load from trip time ${warm}s: a backlogged download for ${SWEEP_S}s"
    local pids=()
    for i in "${!SWEEP_UNITS[@]}"; do
        m=${SWEEP_UNITS[$i]%%:*} s=${SWEEP_UNITS[$i]#*:}
        dir=$tdir/sweep/$m/$s
        mkdir -p "$dir"
        ip netns exec "$(prefix_of "$i")-pax" "$BIN/polycorn-loadgen" backlog --origin "$ORIGIN:80" \
            --epoch-unix-ms "$epoch" --window-s "$warm:$((warm + SWEEP_S))" --path "$BACKLOG_PATH" \
            --size "$BACKLOG_SIZE" --out "$dir/backlog.jsonl" >>"$dir/loadgen.log" 2>&1 \
            || log "$dir: backlog exited with $?" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    for i in "${!SWEEP_UNITS[@]}"; do
        m=${SWEEP_UNITS[$i]%%:*} s=${SWEEP_UNITS[$i]#*:}
        collect "$tdir/sweep/$m/$s" "$i"
    done
    printf '{"link_set": "%s", "trip": "%s", "epoch_unix_ms": %s, "load_start_s": %s}\n' \
        "$set" "$id" "$epoch" "$warm" >"$tdir/sweep/timing.json"
    all_down
    for i in "${!SWEEP_UNITS[@]}"; do
        m=${SWEEP_UNITS[$i]%%:*} s=${SWEEP_UNITS[$i]#*:}
        cp "/tmp/polycorn-state-$(prefix_of "$i")/logs/emu.log" "$tdir/sweep/$m/$s/logs/" 2>/dev/null || true
    done
}

sets_json=""
for set in "${LINK_SETS[@]}"; do
    if [[ $set == mahimahi ]]; then
        for f in {TMobile,Verizon}-LTE-short.{up,down}; do
            [[ -f $MAHIMAHI_DIR/$f ]] || die "Mahimahi trace $MAHIMAHI_DIR/$f is missing"
        done
    fi
    if [[ $set == driving ]]; then
        for f in "${DRIVING_TRACES[@]}"; do
            [[ -f $MAHIMAHI_DIR/$f.up && -f $MAHIMAHI_DIR/$f.down ]] || die "Mahimahi trace $MAHIMAHI_DIR/$f.{up,down} is missing"
        done
    fi
    [[ $set == hsr || $set == mahimahi || $set == driving ]] || die "unknown link set '$set' (hsr, mahimahi, driving)"
    [[ $set == hsr && $TABLE == previous && ! -f $RUN/failure-table.json ]] && make_table
    mapfile -t ids < <(trip_ids "$set")
    if ((TRIP_PARALLEL == 1)); then
        for k in "${!ids[@]}"; do run_trip "$set" "$k" "${ids[$k]}" 0; done
    else
        # Waves of TRIP_PARALLEL trips, each in the background on its own
        # block of topologies; a failed trip fails the run (on_exit tears
        # every block down).
        for ((w = 0; w < ${#ids[@]}; w += TRIP_PARALLEL)); do
            log "$set: trips $((w + 1))-$((w + TRIP_PARALLEL < ${#ids[@]} ? w + TRIP_PARALLEL : ${#ids[@]})) of ${#ids[@]} at once"
            wave=()
            for ((k = w; k < w + TRIP_PARALLEL && k < ${#ids[@]}; k++)); do
                run_trip "$set" "$k" "${ids[$k]}" "$((k - w))" &
                wave+=("$!:${ids[$k]}")
            done
            for j in "${wave[@]}"; do
                wait "${j%%:*}" || die "$set/${j#*:} failed (its log lines above)"
            done
        done
    fi
    case $set in
        hsr)
            desc="polycorn-tracegen $PRESET, $CARRIERS carriers, route seed $ROUTE_SEED, held-out trip seeds"
            ((DIAGNOSTIC)) && desc="DIAGNOSTIC: polycorn-tracegen $PRESET, $CARRIERS carriers, route seed $ROUTE_SEED, trip seeds from $((TRIP_SEED_BASE + 1)), slot ${SLOT_S}s, table $TABLE"
            ;;
        mahimahi) desc="Mahimahi LTE driving traces (T-Mobile, Verizon), 30 ms one-way delay, no loss" ;;
        driving) desc="Mahimahi driving traces (AT&T LTE, T-Mobile UMTS), started ${DRIVING_STEP_S} s apart per trip, 30 ms one-way delay, no loss" ;;
    esac
    sets_json+="${sets_json:+, }\"$set\": {\"trips\": $(printf '%s\n' "${ids[@]}" | jq -R . | jq -s -c .), \"description\": \"$desc\"}"
done
ALL_DOWN_DONE=1
[[ -n $sets_json ]] || die "no link set ran"

sizes_json='{"256KB": 262144, "1MB": 1048576, "4MB": 4194304}'
users_json=$(printf '%s\n' "${USER_COUNTS[@]}" | jq -s -c 'map(tonumber)')
schemes_json=$(printf '%s\n' "${SCHEMES[@]}" | jq -R . | jq -s -c .)
phases_json=$(printf '%s\n' "${PHASE_LIST[@]}" | jq -R . | jq -s -c .)
sets_list_json=$(printf '%s\n' "${LINK_SETS[@]}" | jq -R . | jq -s -c .)
conc_json=$(printf '%s\n' "${CONC_COUNTS[@]}" | jq -s -c 'map(tonumber)')
sweep_mib_json=$(printf '%s\n' "${SWEEP_BUDGETS[@]}" | jq -s -c 'map(tonumber)')
sweep_schemes_json=$( ((${#SWEEP_LIST[@]})) && printf '%s\n' "${SWEEP_LIST[@]}" | jq -R . | jq -s -c . || echo '[]')
cat >"$RUN/run.json" <<EOF
{"profile": "$PROFILE", "diagnostic": $( ((DIAGNOSTIC)) && echo true || echo false), "commit": "$COMMIT",
 "schemes": $schemes_json,
 "bulk": {"per_size": $PER_SIZE, "sizes": $sizes_json, "slot_s": $SLOT_S},
 "im": {"users": $users_json, "messages": $MESSAGES, "mean_gap_ms": $GAP_MS},
 "phases": $phases_json,
 "backlog": {"seconds": $BACKLOG_S, "path": "$BACKLOG_PATH", "link_sets": $sets_list_json},
 "concurrency": $(if has_phase concurrency; then printf '{"users": %s, "seconds": %s, "source_base": "%s", "path": "%s", "link_sets": %s}' \
    "$conc_json" "$CONC_S" "$CONC_SOURCE_BASE" "$BACKLOG_PATH" "$sets_list_json"; else echo null; fi),
 "sweep": $(if ((${#SWEEP_UNITS[@]})); then printf '{"mib": %s, "schemes": %s, "seconds": %s, "path": "%s", "link_sets": ["hsr"], "flags": "relay and proxy --mem-budget"}' \
    "$sweep_mib_json" "$sweep_schemes_json" "$SWEEP_S" "$BACKLOG_PATH"; else echo null; fi),
 "buffer_bytes": 3000000, "load_seed": $LOAD_SEED, "trip_parallel": $TRIP_PARALLEL, "segment_trace": $([[ $SEGMENT_TRACE == 1 ]] && echo true || echo false), "load_start_s": $([[ $LOAD_START_S == auto ]] && echo '"auto"' || echo "$LOAD_START_S"),
 "failure_table": $(if [[ -f $RUN/failure-table.json ]]; then jq -c --arg r "$ROUTE_SEED" --arg n "$TABLE_TRIPS" \
    --arg b "$TABLE_SEED_BASE" '{learned_by: "polycorn-trainer (defaults), previous trips through Kafka and ingest into LinkDB", route_seed: ($r|tonumber), previous_trips: ($n|tonumber), trip_seeds: "\(($b|tonumber) + 1)..\(($b|tonumber) + ($n|tonumber))", entries: (.entries|length)}' \
    "$RUN/failure-table.json"; else echo null; fi),
 "link_sets": {$sets_json}}
EOF

log "analysing $RUN"
mkdir -p "$PLOTS"
uv run --project bench --locked --quiet python -m polycorn_bench.hsr "$RUN" \
    --out "$OUT/$RESULT.json" --md "$OUT/$RESULT.md" --plots "$PLOTS"
log "results: $OUT/$RESULT.json, $OUT/$RESULT.md, plots in $PLOTS; raw records in $RUN"
