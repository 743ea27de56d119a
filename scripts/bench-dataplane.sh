#!/usr/bin/env bash
# Data-plane benchmark: throughput, CPU per GB, request/response latency and
# memory of the relay-agent/proxy pair on the namespace testbed, side by
# side with plain TCP and kernel MPTCP. What each number means: bench/README.md.
#
# Builds its own testbed (PC_PREFIX=pcbench, 4 carriers), runs every scheme
# once per repetition, interleaved, so that machine noise hits them alike,
# then runs the scheduler decision micro-benchmark (cargo bench) and writes
# bench/out/dataplane.json and bench/out/dataplane.md. Tears everything down
# whatever happens, Ctrl-C included.
#
# Env: BENCH_REPS (3), BENCH_SECONDS (5, per iperf3 run), BENCH_CONNS (1000),
# BENCH_RTTS (2000), BENCH_MPTCP_SUBFLOWS (2), BENCH_DECISION (1; 0 skips
# cargo bench), BENCH_OUT (bench/out), PC_PREFIX (pcbench).
set -euo pipefail
cd "$(dirname "$0")/.."

export PC_PREFIX=${PC_PREFIX:-pcbench} PC_CARRIERS=4
# shellcheck source=testbed/netns/lib.sh
source testbed/netns/lib.sh
# shellcheck source=scripts/lib-pair.sh
source scripts/lib-pair.sh
pc_require_root

REPS=${BENCH_REPS:-3}
SECS=${BENCH_SECONDS:-5}
CONNS=${BENCH_CONNS:-1000}
RTTS=${BENCH_RTTS:-2000}
MPTCP_SUBFLOWS=${BENCH_MPTCP_SUBFLOWS:-2}
DECISION=${BENCH_DECISION:-1}
OUT=${BENCH_OUT:-bench/out}
WORK=$PC_STATE/bench
RAW=$WORK/raw.jsonl
HZ=$(getconf CLK_TCK)
# "direct" and "mptcp_raw" servers: on the cloud's end of carrier 0.
DIRECT_ADDR=$(cpx_addr 0)
DIRECT_IPERF_PORT=5301
MPTCP_IPERF_PORT=5302
DIRECT_ECHO_PORT=7007
SCHEMES=(direct mptcp_raw relay_1 relay_2 relay_4 kernel_mptcp)

for tool in iperf3 mptcpize jq python3 ss top; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found: run 'make setup'" >&2; exit 1; }
done
if ((MPTCP_SUBFLOWS < 1 || MPTCP_SUBFLOWS > PC_CARRIERS)); then
    echo "bench: BENCH_MPTCP_SUBFLOWS must be 1..$PC_CARRIERS" >&2
    exit 2
fi
if [[ ! -x $BIN/polycorn-relay || ! -x $BIN/polycorn-proxy || ! -x $BIN/polycorn-pki ]]; then
    cargo build --release --locked -p polycorn-relay -p polycorn-proxy -p polycorn-pki
fi
# Run private copies: a rebuild of target/release during the run (others
# work in this tree) must not mix two versions of the pair in one result.
mkdir -p "$WORK/bin"
cp "$BIN/polycorn-relay" "$BIN/polycorn-proxy" "$BIN/polycorn-pki" "$WORK/bin/"
BIN=$WORK/bin

# bg_wait OUT ERR CMD...: run CMD (stdout to OUT, stderr to ERR, or to OUT
# too for -) in the background and wait for it, so that Ctrl-C runs the INT
# trap at once. With CMD in the foreground, bash runs the trap only when CMD
# ends, and `timeout` moves its child into a process group of its own, which
# the terminal's Ctrl-C does not reach. What CMD leaves running inside the
# namespaces, down.sh kills; the rest (cargo bench), cleanup() kills by
# BG_PID: a background job of a script ignores SIGINT. (Redirect here, not
# around the call: the trap runs inside `wait` and would write into the
# redirection.)
BG_PID=
bg_wait() {
    local out=$1 err=$2 rc=0
    shift 2
    if [[ $err == - ]]; then
        "$@" >"$out" 2>&1 &
    else
        "$@" >"$out" 2>"$err" &
    fi
    BG_PID=$!
    wait "$BG_PID" || rc=$?
    BG_PID=
    return "$rc"
}

# kill_tree PID: PID and its descendants, children first.
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null || true
}

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n ${HOLD_PID:-} ]]; then kill "$HOLD_PID" 2>/dev/null || true; fi
    if [[ -n $BG_PID ]]; then kill_tree "$BG_PID"; fi
    if [[ -n ${SAMPLER_PID:-} ]]; then kill_tree "$SAMPLER_PID"; fi
    stop_pair || true
    testbed/origin/stop.sh >/dev/null 2>&1 || true
    testbed/netns/down.sh >/dev/null 2>&1 || true
    exit "$rc"
}
trap cleanup EXIT
trap 'echo; log "interrupted"; exit 130' INT TERM

PAX() { ip netns exec "$NS_PAX" "$@"; }
TRAIN() { ip netns exec "$NS_TRAIN" "$@"; }
CLOUD() { ip netns exec "$NS_CLOUD" "$@"; }

# ---- /proc readers
# pid_ticks NAME: utime+stime (all threads) of a pair process, in clock ticks.
pid_ticks() {
    local f="$PC_STATE/run/$1.pid" s
    if [[ ! -f $f ]] || ! s=$(cat "/proc/$(cat "$f")/stat" 2>/dev/null); then
        echo null
        return
    fi
    s=${s##*) } # fields from 3 (state) on; comm may hold spaces
    read -r -a s <<<"$s"
    echo $((s[11] + s[12]))
}
# ctx_switches NAME: voluntary + involuntary context switches of all the
# threads of a pair process (each sleep/wake-up of a thread counts).
ctx_switches() {
    local f="$PC_STATE/run/$1.pid" n=
    [[ -f $f ]] && n=$(cat "/proc/$(cat "$f")"/task/*/status 2>/dev/null | awk '/ctxt_switches:/ { s += $2 } END { print s + 0 }')
    echo "${n:-null}"
}
# Busy ticks of the whole machine (every CPU, every namespace: includes
# softirq work of the veths, the iperf3 ends and any other load).
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
rss_kb() {
    local f="$PC_STATE/run/$1.pid" kb=
    [[ -f $f ]] && kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$(cat "$f")/status" 2>/dev/null)
    echo "${kb:-null}"
}
now_ns() { date +%s%N; }
delta() { [[ $1 == null || $2 == null ]] && echo null || echo $(($2 - $1)); }

# subflows SCHEME: subflows the scheme's data connection is using right now.
subflows() {
    case $1 in
        direct) echo 1 ;;
        relay_*) TRAIN ss -Htn state established "( dport = :$PROXY_PORT )" | wc -l ;;
        # ss -M reports the subflows added to the initial one.
        kernel_mptcp | mptcp_raw)
            local port=$PROXY_PORT
            [[ $1 == mptcp_raw ]] && port=$MPTCP_IPERF_PORT
            TRAIN ss -HMni "( dport = :$port )" | grep -o 'subflows:[0-9]*' | cut -d: -f2 |
                awk 'BEGIN { m = -1 } $1 > m { m = $1 } END { print m + 1 }'
            ;;
    esac
}

# ---- schemes
# scheme_up SCHEME: start what SCHEME needs; fails if it does not come up.
scheme_up() {
    case $1 in
        direct | mptcp_raw) return 0 ;;
        # Explicit scheduler and transport: the results must not follow a
        # change of the defaults silently.
        relay_*)
            local k=${1#relay_}
            start_proxy --scheduler minrtt --transport tls
            PC_CARRIERS=$k start_main_relay --scheduler minrtt --transport tls
            wait_paths_up "$k"
            ;;
        kernel_mptcp)
            start_proxy --scheduler minrtt --transport kernel-mptcp
            PC_CARRIERS=1 start_main_relay --scheduler minrtt --transport kernel-mptcp
            wait_paths_up 1 || return 1
            # The kernel joins the extra subflows just after the handshake.
            local i
            for ((i = 0; i < 30; i++)); do
                [[ $(subflows kernel_mptcp) -ge $MPTCP_SUBFLOWS ]] && return 0
                sleep 0.1
            done
            log "warning: kernel MPTCP has $(subflows kernel_mptcp) subflows, expected $MPTCP_SUBFLOWS"
            ;;
    esac
}
scheme_down() { stop_pair; }

# iperf_client SCHEME ARGS...: the scheme's iperf3 client, from the right side.
iperf_client() {
    local scheme=$1
    shift
    local t=(timeout $((SECS + 25)))
    case $scheme in
        direct) TRAIN "${t[@]}" iperf3 -c "$DIRECT_ADDR" -p "$DIRECT_IPERF_PORT" "$@" ;;
        mptcp_raw) TRAIN "${t[@]}" mptcpize run iperf3 -c "$DIRECT_ADDR" -p "$MPTCP_IPERF_PORT" "$@" ;;
        *) PAX "${t[@]}" iperf3 -c "$ORIGIN_ADDR" -p 5201 "$@" ;;
    esac
}

# top_snapshot FILE TITLE: a per-thread top frame (the second one, whose
# %CPU covers the last second) appended to FILE.
top_snapshot() {
    { echo "=== $2"; top -b -H -n 2 -d 1 -w 200 | awk '/^top -/ { n++ } n == 2' | head -n 30; echo; } >>"$1"
}

# throughput REP SCHEME DIR: one iperf3 run; appends a record to RAW.
throughput() {
    local rep=$1 scheme=$2 dir=$3 json=$WORK/iperf.json sf_file=$WORK/subflows
    # -i 0.1: 100 ms intervals, to see stalls (report.py: runs of intervals
    # that moved nothing).
    local -a flags=(-t "$SECS" -J -i 0.1)
    [[ $dir == down ]] && flags+=(-R)
    echo null >"$sf_file"
    # Mid-run sampler: subflows in use (and, once, where the CPU goes).
    (
        sleep $((SECS / 2))
        subflows "$scheme" >"$sf_file"
        if [[ $rep == 1 && $scheme == relay_2 ]]; then
            top_snapshot "$OUT/dataplane-top.txt" "relay_2 $dir, $(date -u +%FT%TZ)"
        fi
    ) &
    SAMPLER_PID=$!
    local r0 p0 m0 t0 rx0 px0 r1 p1 m1 t1 rx1 px1 rc=0
    rx0=$(ctx_switches relay) px0=$(ctx_switches proxy)
    r0=$(pid_ticks relay) p0=$(pid_ticks proxy) m0=$(machine_ticks) t0=$(now_ns)
    bg_wait "$json" "$WORK/iperf.err" iperf_client "$scheme" "${flags[@]}" || rc=$?
    t1=$(now_ns) r1=$(pid_ticks relay) p1=$(pid_ticks proxy) m1=$(machine_ticks)
    rx1=$(ctx_switches relay) px1=$(ctx_switches proxy)
    wait "$SAMPLER_PID" || true
    SAMPLER_PID=
    local err=null
    if ((rc != 0)) || ! jq -e '.end.sum_received.bytes > 0' "$json" >/dev/null 2>&1; then
        err=$(jq -Rs '.' < <(jq -r '.error // empty' "$json" 2>/dev/null; head -c 300 "$WORK/iperf.err"; echo "exit $rc"))
        echo '{}' >"$json"
    fi
    jq -c --argjson rep "$rep" --arg scheme "$scheme" --arg dir "$dir" --argjson hz "$HZ" \
        --argjson relay "$(delta "$r0" "$r1")" --argjson proxy "$(delta "$p0" "$p1")" \
        --argjson machine "$(delta "$m0" "$m1")" --argjson wall_ns "$((t1 - t0))" \
        --argjson relay_cs "$(delta "$rx0" "$rx1")" --argjson proxy_cs "$(delta "$px0" "$px1")" \
        --argjson subflows "$(cat "$sf_file")" --argjson error "$err" \
        '{kind: "throughput", rep: $rep, scheme: $scheme, dir: $dir,
          bits_per_second: .end.sum_received.bits_per_second, bytes: .end.sum_received.bytes,
          intervals: [.intervals[]?.sum | [(.seconds * 1000 | round), .bytes]],
          wall_s: ($wall_ns / 1e9),
          relay_cpu_s: (if $relay == null then null else $relay / $hz end),
          proxy_cpu_s: (if $proxy == null then null else $proxy / $hz end),
          machine_cpu_s: ($machine / $hz), relay_ctx_switches: $relay_cs, proxy_ctx_switches: $proxy_cs,
          subflows: $subflows, error: $error}' "$json" >>"$RAW"
    jq -r '"    \(.dir | . + "  ")  \(if .error then "FAILED: " + .error else
        "\(.bits_per_second / 1e9 * 100 | round / 100) Gb/s  empty 100ms intervals \([.intervals[] | select(.[1] == 0)] | length)  subflows \(.subflows)" +
        (if .relay_cpu_s then "  relay \(.relay_cpu_s)s proxy \(.proxy_cpu_s)s CPU" else "" end) end)"' \
        <<<"$(tail -n 1 "$RAW")"
}

# latency REP SCHEME: echo round trips; appends a record to RAW.
latency() {
    local rep=$1 scheme=$2 out=$WORK/rtt.json
    local -a run
    case $scheme in
        direct) run=(ip netns exec "$NS_TRAIN" python3 bench/tools/echo_rtt.py "$DIRECT_ADDR" "$DIRECT_ECHO_PORT") ;;
        origin_local) run=(ip netns exec "$NS_CLOUD" python3 bench/tools/echo_rtt.py "$ORIGIN_ADDR" 7) ;;
        *) run=(ip netns exec "$NS_PAX" python3 bench/tools/echo_rtt.py "$ORIGIN_ADDR" 7) ;;
    esac
    if bg_wait "$out" "$WORK/rtt.err" timeout 60 "${run[@]}" --count "$RTTS"; then
        jq -c --argjson rep "$rep" --arg scheme "$scheme" '{kind: "latency", rep: $rep, scheme: $scheme, error: null} + .' \
            "$out" >>"$RAW"
        jq -r '"    rtt    p50 \(.p50_us) us  p99 \(.p99_us) us"' "$out"
    else
        jq -nc --argjson rep "$rep" --arg scheme "$scheme" --arg e "$(head -c 300 "$WORK/rtt.err")" \
            '{kind: "latency", rep: $rep, scheme: $scheme, error: $e}' >>"$RAW"
        echo "    rtt    FAILED: $(head -c 300 "$WORK/rtt.err")"
    fi
}

# rss REP: a fresh relay_2 pair, idle, then holding CONNS passenger
# connections open through it; appends a record to RAW.
rss() {
    local rep=$1 hold=$WORK/hold.out
    if ! scheme_up relay_2; then
        jq -nc --argjson rep "$rep" '{kind: "rss", rep: $rep, error: "relay_2 did not come up"}' >>"$RAW"
        scheme_down
        return
    fi
    sleep 0.5
    local r_idle p_idle r_held=null p_held=null upstreams=null ready='{}' err=null i
    r_idle=$(rss_kb relay) p_idle=$(rss_kb proxy)
    : >"$hold"
    # Not through PAX(): a backgrounded function is a subshell, and $! would
    # not be the python process.
    ip netns exec "$NS_PAX" python3 bench/tools/hold_conns.py "$ORIGIN_ADDR" 7 --count "$CONNS" --hold 120 >"$hold" 2>"$WORK/hold.err" &
    HOLD_PID=$!
    for ((i = 0; i < 600; i++)); do
        [[ -s $hold ]] && break
        kill -0 "$HOLD_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -s $hold ]]; then
        sleep 1 # let both ends settle
        r_held=$(rss_kb relay) p_held=$(rss_kb proxy)
        upstreams=$(CLOUD ss -Htn state established "( dst $ORIGIN_ADDR and dport = :7 )" | wc -l)
        ready=$(head -n 1 "$hold")
    else
        err=$(jq -Rs . <"$WORK/hold.err")
    fi
    kill "$HOLD_PID" 2>/dev/null || true
    wait "$HOLD_PID" 2>/dev/null || true
    HOLD_PID=
    jq -nc --argjson rep "$rep" --argjson conns "$CONNS" --argjson ri "$r_idle" --argjson pi "$p_idle" \
        --argjson rh "$r_held" --argjson ph "$p_held" --argjson up "$upstreams" --argjson ready "$ready" \
        --argjson error "$err" \
        '{kind: "rss", rep: $rep, conns: $conns, relay_kb_idle: $ri, proxy_kb_idle: $pi,
          relay_kb: $rh, proxy_kb: $ph, proxy_upstreams: $up, echoed: $ready.echoed,
          open_seconds: $ready.seconds, error: $error}' >>"$RAW"
    jq -r '"    rss    \(.conns) conns (\(.echoed) echoed, \(.proxy_upstreams) upstream at the proxy): relay \(.relay_kb_idle) -> \(.relay_kb) kB, proxy \(.proxy_kb_idle) -> \(.proxy_kb) kB"' \
        <<<"$(tail -n 1 "$RAW")"
    scheme_down
}

# ---- decision micro-benchmark (crates/core/benches/decision.rs)
decision() {
    local out=$WORK/decision.json marker=$WORK/decision.start n f
    echo '{}' >"$out"
    if [[ $DECISION != 1 ]]; then
        jq -n '{error: "skipped (BENCH_DECISION=0)"}' >"$out"
        return
    fi
    if [[ ! -f crates/core/benches/decision.rs ]]; then
        log "decision: crates/core/benches/decision.rs does not exist yet; decision_ns is null"
        jq -n '{error: "crates/core/benches/decision.rs does not exist yet"}' >"$out"
        return
    fi
    touch "$marker"
    log "decision: cargo bench -p polycorn-core --bench decision (log: $WORK/decision.log)"
    if ! bg_wait "$WORK/decision.log" - \
        cargo bench --locked -p polycorn-core --bench decision -- --warm-up-time 1 --measurement-time 3 'select/minrtt'; then
        log "decision: cargo bench failed; decision_ns is null. Last lines:"
        tail -n 15 "$WORK/decision.log" | sed 's/^/    /'
        jq -n --arg log "$(tail -n 15 "$WORK/decision.log")" '{error: "cargo bench failed", log_tail: $log}' >"$out"
        return
    fi
    for n in 2 4 8; do
        f=target/criterion/select/minrtt/$n/new/estimates.json
        if [[ -f $f && $f -nt $marker ]]; then
            jq --arg n "$n" '.[$n] = input.median.point_estimate' "$out" "$f" >"$out.tmp" && mv "$out.tmp" "$out"
        else
            log "decision: no fresh $f (bench ID select/minrtt/$n missing?)"
        fi
    done
    log "decision: $(jq -c . "$out") ns"
}

# ---- run
mkdir -p "$OUT" "$WORK"
: >"$RAW"
: >"$OUT/dataplane-top.txt"
git_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git_dirty=false
git diff --no-ext-diff --quiet HEAD -- 2>/dev/null || git_dirty=true
started=$(date -u +%FT%TZ)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$SECONDS

log "testbed $PC_PREFIX: $PC_CARRIERS carriers; $REPS repetitions x ${#SCHEMES[@]} schemes x up/down x ${SECS}s"
testbed/netns/up.sh >/dev/null
grep -q '^MPTCP=1' "$PC_STATE/netns.env" || log "warning: kernel MPTCP is off; mptcp_raw and kernel_mptcp will fail"
testbed/origin/start.sh >/dev/null
pair_pki
# Kernel MPTCP gets MPTCP_SUBFLOWS subflows (the initial one over car0, plus
# one endpoint per further carrier), so that kernel_mptcp is comparable to
# relay_<MPTCP_SUBFLOWS>.
TRAIN ip mptcp endpoint flush 2>/dev/null || true
for ((i = 1; i < MPTCP_SUBFLOWS; i++)); do
    TRAIN ip mptcp endpoint add "$(car_addr "$i")" dev "$(car_if "$i")" subflow
done
CLOUD iperf3 -s -D -B "$DIRECT_ADDR" -p "$DIRECT_IPERF_PORT" --logfile "$WORK/iperf-direct.log"
CLOUD mptcpize run iperf3 -s -D -B "$DIRECT_ADDR" -p "$MPTCP_IPERF_PORT" --logfile "$WORK/iperf-mptcp.log"
CLOUD setsid python3 testbed/origin/echo.py --bind "$DIRECT_ADDR" --port "$DIRECT_ECHO_PORT" \
    </dev/null >>"$WORK/echo-direct.log" 2>&1 &
disown
for ((i = 0; i < 50; i++)); do
    [[ $(CLOUD ss -Hltn "src $DIRECT_ADDR" | wc -l) -ge 3 ]] && break
    sleep 0.1
done

for ((rep = 1; rep <= REPS; rep++)); do
    # Rotate the order each repetition, so no scheme always runs first.
    order=("${SCHEMES[@]:rep - 1}" "${SCHEMES[@]:0:rep - 1}")
    for scheme in "${order[@]}"; do
        log "rep $rep/$REPS  $scheme"
        if ! scheme_up "$scheme"; then
            log "  $scheme did not come up; see $PC_STATE/logs"
            for dir in down up; do
                jq -nc --argjson rep "$rep" --arg s "$scheme" --arg d "$dir" \
                    '{kind: "throughput", rep: $rep, scheme: $s, dir: $d, error: "did not come up"}' >>"$RAW"
            done
            scheme_down
            continue
        fi
        throughput "$rep" "$scheme" down
        throughput "$rep" "$scheme" up
        case $scheme in
            direct) latency "$rep" direct; latency "$rep" origin_local ;;
            relay_* | kernel_mptcp) latency "$rep" "$scheme" ;;
        esac
        scheme_down
    done
    log "rep $rep/$REPS  rss: $CONNS idle passenger connections through relay_2"
    rss "$rep"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
net_seconds=$((SECONDS - t_start))
cp "$PC_STATE/logs/relay.log" "$WORK/relay-last.log" 2>/dev/null || true
log "network part done in ${net_seconds}s; tearing down the testbed"
stop_pair || true
testbed/origin/stop.sh >/dev/null 2>&1 || true
testbed/netns/down.sh >/dev/null

decision

jq -n --arg started "$started" --arg finished "$(date -u +%FT%TZ)" --arg commit "$git_commit" \
    --argjson dirty "$git_dirty" --argjson reps "$REPS" --argjson secs "$SECS" --argjson conns "$CONNS" \
    --argjson rtts "$RTTS" --argjson mptcp_subflows "$MPTCP_SUBFLOWS" --argjson carriers "$PC_CARRIERS" \
    --argjson net_seconds "$net_seconds" --arg load_start "$load_start" --arg load_end "$load_end" \
    --arg cpu "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)" --argjson ncpu "$(nproc)" \
    --arg kernel "$(uname -r)" --argjson mem_mb "$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)" \
    --arg iperf3 "$(iperf3 --version | head -n 1)" --arg python "$(python3 --version)" \
    --arg relay "$("$BIN/polycorn-relay" --version), sha256 $(sha256sum "$BIN/polycorn-relay" | cut -c1-16)" \
    --arg proxy "$("$BIN/polycorn-proxy" --version), sha256 $(sha256sum "$BIN/polycorn-proxy" | cut -c1-16)" \
    '{started: $started, finished: $finished, git_commit: $commit, git_dirty: $dirty,
      settings: {reps: $reps, seconds_per_run: $secs, conns: $conns, round_trips: $rtts,
                 mptcp_subflows: $mptcp_subflows, testbed_carriers: $carriers},
      network_part_seconds: $net_seconds, loadavg_start: $load_start, loadavg_end: $load_end,
      machine: {cpu: $cpu, cpus: $ncpu, kernel: $kernel, mem_mb: $mem_mb},
      tools: {iperf3: $iperf3, python: $python, relay: $relay, proxy: $proxy}}' >"$WORK/meta.json"

report_rc=0
python3 bench/tools/report.py --raw "$RAW" --meta "$WORK/meta.json" --decision "$WORK/decision.json" \
    --json "$OUT/dataplane.json" --md "$OUT/dataplane.md" || report_rc=$?
log "wrote $OUT/dataplane.json and $OUT/dataplane.md ($((SECONDS - t_start))s in all)"
echo
cat "$OUT/dataplane.md"
((report_rc == 0))
