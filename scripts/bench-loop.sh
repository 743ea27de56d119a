#!/usr/bin/env bash
# make bench-loop: the closed fleet loop on the testbed, trip after trip, and
# its learning curve.
#
#   PROFILE=report|ci scripts/bench-loop.sh
#
# N trips of the same route, one after the other. Each trip runs four copies
# of the topology side by side (testbed/topology.sh, prefixes hl0..hl3, one
# wall-clock epoch, so all see the same link realisation), with the same
# load plan as make bench-hsr (bulk downloads, then a backlogged download
# for the recovery after failed handovers):
#
#   hrsch-learned  hrsch with the table the trainer learned from the trips
#                  and signed (a `polycorn-pki table-key` pair made per run:
#                  the trainer's --table-signing-key, this copy's relay and
#                  proxy --failure-table-verify-key, as deployed)
#                  before this one (trip 1: none, LinkDB is empty). Its proxy
#                  reads it from Kafka (--failure-table-topic, the compacted
#                  topic, at start and hot-reloaded); its relay gets the same
#                  table as a file, from LinkDB's failure_tables. It is the
#                  only copy whose proxy produces telemetry: relay -> proxy ->
#                  Kafka -> polycorn-ingest -> LinkDB, with a stable train id,
#                  so LinkDB receives each trip exactly once, by the real path.
#   minrtt         the reference of every ratio.
#   hrsch-none     hrsch without a table (what the learned copy is on trip 1).
#   hrsch-truth    hrsch with the oracle table: every cell where this very
#                  trip fails (polycorn-tracegen failure-table --min-failures 1
#                  --min-failure-rate 0), the upper bound of what a table can do.
#
# After each trip: wait for the relay's spool to drain and for ingest to
# have loaded the trip's handovers (LinkDB against the event log, both
# reported), then `polycorn-trainer run --once` fits, validates, stores the
# model and publishes the next table (failure_tables + Kafka).
#
# Its own infrastructure (scripts/infra.sh with POLYCORN_INFRA_DIR
# /tmp/polycorn-infra-loop, PostgreSQL 25452, Kafka 29112, Prometheus port
# 29120), wiped at the start and at the end: a fresh LinkDB and fresh topics
# every run. The default instance (25432/29092) is never touched.
#
# Seeds: route 7 (the reported route), trip seeds 2001.. (ci: 2103..;
# bench-hsr measures 1001.. and builds its stand-in table from 901..;
# development uses route 1).
#
# Profiles: report, 32 trips of 263 s, meant to be left running: about 2.5 h
# (the 6-trip run of 2026-11-24 took 28 min, 4.5-4.7 min per trip: the trip,
# bringing four topologies up and down, ingest and the trainer); ci, 2 short
# trips, about 4 min. The analysis plots each trip and the curves pooled over
# trips 1..k and the last 8 trips (docs/benchmarks.md).
#
# Environment: PROFILE (report, default, or ci: 2 short trips), LOOP_TRIPS
# (trips; report 32, ci 2), BIN (binaries, default target/release),
# BENCH_PREFIX (topology prefix, default hl), BENCH_WORK (raw runs, default
# /tmp/polycorn-bench-loop), BENCH_OUT (default bench/out; ci: under
# BENCH_WORK), PLOTS (default docs/img/loop; ci: under BENCH_WORK),
# LOOP_TABLE_SOURCE (topic, default: the learned proxy reads Kafka; file:
# relay and proxy get the LinkDB table as a file, for a proxy without
# --failure-table-topic), LOOP_INGEST_METRICS (ingest's metrics address,
# default 127.0.0.1:9482). ROUTE_SEED / TRIP_SEED_BASE make a diagnostic run
# (results under BENCH_WORK/out only), as do TRACEGEN_PRESET (default
# pc-gateway-300) and PC_EMU_LOSS_KEYING (the emulator's --loss-keying;
# results from before 2026-11-26: pc-gateway-300-v1 and packet).
# LOOP_POSITIONS=gps (diagnostic, issue 21) runs the loop on GPS alone, as a
# real train would: the route's line (the generator's route.geojson) is
# imported into LinkDB before trip 1, every relay replays GPS fixes without
# track_m (--replay-gps-only), ingest map-matches them onto the route, the
# trainer learns on the matched measures and puts the route in its tables,
# and the proxies place the trains by matching their fixes onto it (the
# oracle table carries the route too: failure-table --route).
# Ctrl-C or any failure tears every topology, ingest and the infrastructure
# down.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

PROFILE=${PROFILE:-report}
BIN=${BIN:-$root/target/release}
export BIN
WORK=${BENCH_WORK:-/tmp/polycorn-bench-loop}
DIAGNOSTIC=0
for v in ROUTE_SEED TRIP_SEED_BASE LOOP_TABLE_SOURCE LOOP_ALLOW_NO_TRAINER LOOP_TRAINER_ARGS TRACEGEN_PRESET PC_EMU_LOSS_KEYING LOOP_POSITIONS; do
    [[ -n ${!v:-} ]] && DIAGNOSTIC=1
done
ROUTE_SEED=${ROUTE_SEED:-7}
PRESET=${TRACEGEN_PRESET:-pc-gateway-300}
TABLE_SOURCE=${LOOP_TABLE_SOURCE:-topic}
POSITIONS=${LOOP_POSITIONS:-track}
# The trainer's table thresholds. Its defaults (a cell needs 3 failures, and
# 15 % of its handovers failed) are for a fleet's months of trips; over a
# handful of trips no cell of this route reaches 3 failures (failures are
# about 5 % of handovers, one handover per cell and carrier per trip), so
# the table would stay empty and nothing would be learned. One failure is
# enough here; the 15 % rule stays (docs/results.md, "Learning loop").
TRAINER_ARGS=${LOOP_TRAINER_ARGS:---min-failures 1}
LOAD_SEED=424242
CARRIERS=2
ORIGIN=10.99.0.10
TRAIN=train-loop
TABLE_TOPIC=polycorn.failure-tables.v1
INGEST_METRICS=${LOOP_INGEST_METRICS:-127.0.0.1:9482}
VARIANTS=(hrsch-learned minrtt hrsch-none hrsch-truth)
LEARNED=0 # index of the copy on the real telemetry path

log() { printf '[%s] bench-loop: %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'bench-loop: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces)"

# Per profile: trips, downloads per size, slot seconds, backlog seconds.
# The trip is NOMINAL_WARMUP_S + bulk + backlog + 5 s long; the backlog
# window ends 5 s before the trip does whatever the real warm-up took, so
# the relay replays the whole event log before teardown and LinkDB gets
# every handover of the trip.
case $PROFILE in
    # ci: trip seeds 2103-2104, whose first 73 s have a failed handover each
    # (failure model v2; 2102, the first trip before 2026-11-27, has none,
    # so trip 2 had no learned table), so that trip 2 runs with a learned
    # table.
    ci) TRIPS=2 PER_SIZE=1 SLOT_S=6 BACKLOG_S=20 SEED_BASE=2102 ;;
    # report: 32 trips (seeds 2001-2032), about 2.5 h. A trip has a few
    # failed handovers and fewer recovery windows, so the learning curve is
    # read from the trips pooled.
    report) TRIPS=32 PER_SIZE=3 SLOT_S=12 BACKLOG_S=120 SEED_BASE=2000 ;;
    *) die "PROFILE must be report or ci, got '$PROFILE'" ;;
esac
TRIPS=${LOOP_TRIPS:-$TRIPS}
TRIP_SEED_BASE=${TRIP_SEED_BASE:-$SEED_BASE}
[[ $TRIPS =~ ^[1-9][0-9]*$ ]] || die "LOOP_TRIPS must be a positive integer, got '$TRIPS'"
[[ $TABLE_SOURCE =~ ^(topic|file)$ ]] || die "LOOP_TABLE_SOURCE must be topic or file, got '$TABLE_SOURCE'"
[[ $POSITIONS =~ ^(track|gps)$ ]] || die "LOOP_POSITIONS must be track or gps, got '$POSITIONS'"
for v in ROUTE_SEED TRIP_SEED_BASE; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
N_SIZES=3
BULK_S=$((PER_SIZE * N_SIZES * SLOT_S))
NOMINAL_WARMUP_S=30
TRIP_S=$((NOMINAL_WARMUP_S + BULK_S + BACKLOG_S + 5))
BACKLOG_PATH=/files/100MiB.bin
BACKLOG_SIZE=104857600

if [[ $PROFILE == ci || $DIAGNOSTIC == 1 ]]; then
    OUT=${BENCH_OUT:-$WORK/out}
    PLOTS=${PLOTS:-$OUT/plots-$PROFILE}
else
    OUT=${BENCH_OUT:-bench/out}
    PLOTS=${PLOTS:-docs/img/loop}
fi

for b in polycorn-emu polycorn-relay polycorn-proxy polycorn-pki polycorn-loadgen polycorn-tracegen; do
    [[ -x $BIN/$b ]] || die "$BIN/$b missing: run 'make build'"
done
command -v uv >/dev/null || die "uv not found: run 'make setup'"
if [[ $TABLE_SOURCE == topic ]] && ! "$BIN/polycorn-proxy" --help 2>/dev/null | grep -q -- --failure-table-topic; then
    die "$BIN/polycorn-proxy has no --failure-table-topic (LOOP_TABLE_SOURCE=file gives it the table as a file)"
fi

BENCH_PREFIX=${BENCH_PREFIX:-hl}
[[ $BENCH_PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "BENCH_PREFIX must be 1-8 lower-case letters/digits, got '$BENCH_PREFIX'"
prefix_of() { echo "$BENCH_PREFIX$1"; }

RUN=$WORK/run-$PROFILE
rm -rf "$RUN"
mkdir -p "$RUN" "$OUT"
# The failure-table signing key of this run: the trainer signs every table,
# the learned copy's relay and proxy take only tables it verifies. (The
# oracle table of hrsch-truth is the benchmark's stand-in, not a published
# table: that copy runs without a verify key.)
TABLE_KEY=$RUN/table-key
"$BIN/polycorn-pki" table-key --out "$TABLE_KEY" >/dev/null
VERIFY=--failure-table-verify-key=$TABLE_KEY/table-signing.pub

# The loop's own infrastructure.
export POLYCORN_INFRA_DIR=/tmp/polycorn-infra-loop
export POLYCORN_PG_PORT=25452 POLYCORN_KAFKA_PORT=29112 POLYCORN_PROM_PORT=29120
KAFKA_PORT=$POLYCORN_KAFKA_PORT
INGEST_PID=""
INFRA_UP=0

all_down() {
    local i pids=()
    for i in "${!VARIANTS[@]}"; do
        PC_PREFIX=$(prefix_of "$i") testbed/topology.sh down >/dev/null 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done
}
on_exit() {
    local rc=$? j
    for j in $(jobs -p); do kill "$j" 2>/dev/null || true; done
    log "tearing down"
    all_down
    # ingest runs in its own process group (setsid): stop all of it.
    [[ -n $INGEST_PID ]] && kill -TERM -- "-$INGEST_PID" 2>/dev/null
    ((INFRA_UP)) && bash scripts/infra.sh wipe >/dev/null 2>&1
    exit "$rc"
}
trap on_exit EXIT
trap 'log "interrupted"; exit 130' INT TERM

now_ms() { date +%s%3N; }

# ------------------------------------------------------------------ infrastructure

log "infrastructure in $POLYCORN_INFRA_DIR (PostgreSQL $POLYCORN_PG_PORT, Kafka $KAFKA_PORT), fresh"
INFRA_UP=1
bash scripts/infra.sh wipe >/dev/null 2>&1 || true
bash scripts/infra.sh up pg kafka 2>&1 | sed 's/^/  /' >&2
eval "$(bash scripts/infra.sh env)"
DB_URL=$POLYCORN_DATABASE_URL
uv sync --all-packages --locked --quiet
PY() { uv run --all-packages --locked --quiet "$@"; }
PY polycorn-linkdb --url "$DB_URL" upgrade >/dev/null
bash scripts/infra.sh topics --list | grep -qx "$TABLE_TOPIC" || die "topic $TABLE_TOPIC missing (services/kafka/topics.txt)"
# Fixes come every second within a trip, and trips are at least
# TRIP_SPACING_S apart: with a trip gap between the two, each emulated trip
# is one LinkDB trip (the trainer validates leaving one trip out).
setsid "$root/.venv/bin/polycorn-ingest" run --bootstrap "$POLYCORN_KAFKA_BOOTSTRAP" --database-url "$DB_URL" \
    --group ingest-loop --metrics-addr "$INGEST_METRICS" --trip-gap-s 5 >"$RUN/ingest.log" 2>&1 &
INGEST_PID=$!
for ((i = 0; i < 300; i++)); do
    kill -0 "$INGEST_PID" 2>/dev/null || { tail -20 "$RUN/ingest.log" >&2; die "polycorn-ingest exited"; }
    curl -fsS -o /dev/null --max-time 1 "http://$INGEST_METRICS/metrics" 2>/dev/null && break
    sleep 0.2
done
((i < 300)) || die "polycorn-ingest did not start (see $RUN/ingest.log)"
HAVE_TRAINER=1
if ! PY polycorn-trainer --help >/dev/null 2>&1; then
    # Development only (before the trainer existed): the learned copy then
    # never gets a table, and the run is a diagnostic one.
    [[ ${LOOP_ALLOW_NO_TRAINER:-0} == 1 ]] || die "polycorn-trainer is not in the workspace"
    log "WARNING: no polycorn-trainer: nothing is learned (diagnostic run)"
    HAVE_TRAINER=0
fi

# ------------------------------------------------------------------ one trip

# latest_table FILE: the newest published table into FILE, exactly the bytes
# the trainer signed (body_bytes), and its signature into FILE.sig; prints
# "version entries", or nothing when none is published yet.
latest_table() {
    local row
    row=$(psql "$DB_URL" -Atc "select version, entries from failure_tables order by version desc limit 1")
    [[ -n $row ]] || return 0
    psql "$DB_URL" -Atc "select encode(body_bytes, 'base64') from failure_tables order by version desc limit 1" |
        base64 -d >"$1"
    psql "$DB_URL" -Atc "select signature from failure_tables order by version desc limit 1" >"$1.sig"
    [[ -s $1 && -s $1.sig ]] || die "the latest table in LinkDB has no stored bytes or no signature"
    tr '|' ' ' <<<"$row"
}

db_handovers() { psql "$DB_URL" -Atc "select count(*) from handovers where train_id = '$TRAIN'"; }

# The handovers a relay replaying EVENTS reports (LinkDB rows): one per
# handover_end of the carriers it has paths for.
event_handovers() { jq -s --argjson n "$CARRIERS" '[.[] | select(.event == "handover_end" and .carrier < $n)] | length' "$1"; }

# Metrics are read with prometheus_client's parsers (scripts/prom_metric.py,
# the harness's reading), never with awk.
metric_of() { # FILE NAME [--label K=V]...: a metric's value (summed) in a snapshot, or null
    PY python3 scripts/prom_metric.py "$@" 2>/dev/null || echo null
}

relay_metric() { # PREFIX NAME: sum of the relay's metric, 0 when it does not answer
    ip netns exec "$1-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics 2>/dev/null |
        PY python3 scripts/prom_metric.py - "$2" 2>/dev/null || echo 0
}

# run_load DIR INDEX EPOCH START_S BACKLOG_END_S: the plan of one copy.
run_load() {
    local dir=$1 i=$2 epoch=$3 start=$4 backlog_end=$5 ns
    ns="$(prefix_of "$i")-pax"
    local bulk_end=$((start + BULK_S))
    ip netns exec "$ns" "$BIN/polycorn-loadgen" bulk --origin "$ORIGIN:80" --epoch-unix-ms "$epoch" \
        --seed "$LOAD_SEED" --window-s "$start:$bulk_end" --per-size "$PER_SIZE" \
        --out "$dir/bulk.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: bulk exited with $?"
    ip netns exec "$ns" "$BIN/polycorn-loadgen" backlog --origin "$ORIGIN:80" --epoch-unix-ms "$epoch" \
        --window-s "$bulk_end:$backlog_end" --path "$BACKLOG_PATH" --size "$BACKLOG_SIZE" \
        --out "$dir/backlog.jsonl" >>"$dir/loadgen.log" 2>&1 || log "$dir: backlog exited with $?"
}

collect() {
    local dir=$1 i=$2 p
    p=$(prefix_of "$i")
    mkdir -p "$dir/logs"
    ip netns exec "$p-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics >"$dir/logs/relay.metrics" 2>/dev/null || true
    ip netns exec "$p-cloud" curl -fsS --max-time 2 http://127.0.0.1:9464/metrics >"$dir/logs/proxy.metrics" 2>/dev/null || true
    cp "/tmp/polycorn-state-$p"/logs/*.log "$dir/logs/" 2>/dev/null || true
}

# wait_ingest WANT: until LinkDB holds WANT handovers of the train (or the
# count stops growing for 30 s); prints the count.
wait_ingest() {
    local want=$1 n last=-1 still=0 i
    for ((i = 0; i < 240; i++)); do
        n=$(db_handovers)
        ((n >= want)) && break
        if ((n == last)); then still=$((still + 1)); else still=0; fi
        ((still >= 60)) && break
        last=$n
        sleep 0.5
    done
    echo "$n"
}

HANDOVERS_WANT=0
LAST_TRIP_END_MS=0
TRIP_SPACING_S=10
run_trip() {
    local k=$1 seed=$((TRIP_SEED_BASE + $1))
    local id="r$ROUTE_SEED-t$seed"
    local tdir=$RUN/hsr/$id
    mkdir -p "$tdir"
    log "trip $k/$TRIPS ($id): generating ${TRIP_S}s"
    "$BIN/polycorn-tracegen" generate --preset "$PRESET" --route-seed "$ROUTE_SEED" --trip-seed "$seed" \
        --duration-s "$TRIP_S" --carriers "$CARRIERS" --out "$tdir/trip" >/dev/null
    local route_args=()
    if [[ $POSITIONS == gps ]]; then
        route_args=(--route "$tdir/trip/route.geojson")
        if ((k == 1)); then
            # The line before the first fix arrives (fixes are matched as they
            # are stored); every trip of the route has the same line.
            PY polycorn-ingest import-routes "$tdir/trip/route.geojson" --database-url "$DB_URL" \
                >"$RUN/import-routes.json" || die "import-routes failed"
            log "route imported: $(jq -c '{route, length_m, pieces}' "$RUN/import-routes.json")"
        fi
    fi
    "$BIN/polycorn-tracegen" failure-table --events "$tdir/trip/events.jsonl" --min-failures 1 \
        --min-failure-rate 0 "${route_args[@]}" --out "$tdir/failure-table-truth.json" >/dev/null 2>&1

    # The learned table as the trainer left it after the previous trip.
    local learned version="" entries=0
    learned=$(latest_table "$tdir/failure-table-learned.json")
    if [[ -n $learned ]]; then
        read -r version entries <<<"$learned"
        log "trip $k: learned table version $version, $entries entries; oracle table $(jq '.entries | length' "$tdir/failure-table-truth.json") entries"
    else
        log "trip $k: no learned table yet (empty LinkDB); oracle table $(jq '.entries | length' "$tdir/failure-table-truth.json") entries"
    fi

    local epoch i
    # The previous trip's last fix is at its epoch + TRIP_S.
    while (($(now_ms) < LAST_TRIP_END_MS + TRIP_SPACING_S * 1000)); do sleep 0.5; done
    epoch=$(now_ms)
    LAST_TRIP_END_MS=$((epoch + TRIP_S * 1000))
    log "trip $k: building ${#VARIANTS[@]} topologies (epoch $epoch)"
    for i in "${!VARIANTS[@]}"; do
        # Every copy replays the radio log from the trip's start
        # (--replay-resume, a modem's history), so all carry the same
        # telemetry; only the learned copy's proxy has a sink.
        local args=(--relay-arg --replay-resume)
        [[ $POSITIONS == gps ]] && args+=(--relay-arg --replay-gps-only)
        case ${VARIANTS[$i]} in
            hrsch-learned)
                args+=(--forward-port "$KAFKA_PORT" --proxy-arg "--kafka-brokers=127.0.0.1:$KAFKA_PORT")
                args+=(--proxy-arg "$VERIFY" --relay-arg "$VERIFY")
                if [[ $TABLE_SOURCE == topic ]]; then
                    args+=(--proxy-arg "--failure-table-topic=$TABLE_TOPIC")
                    [[ -n $version ]] && args+=(--relay-arg "--failure-table=$tdir/failure-table-learned.json")
                elif [[ -n $version ]]; then
                    args+=(--failure-table "$tdir/failure-table-learned.json")
                fi
                ;;
            hrsch-truth) args+=(--failure-table "$tdir/failure-table-truth.json") ;;
        esac
        local scheme=${VARIANTS[$i]%%-*}
        TRAIN_ID=$TRAIN PC_PREFIX=$(prefix_of "$i") testbed/topology.sh up --trip "$tdir/trip" --scheme "$scheme" \
            --epoch-unix-ms "$epoch" --seed "$((LOAD_SEED + k))" "${args[@]}" >/dev/null \
            || die "trip $k: topology for ${VARIANTS[$i]} failed (logs: /tmp/polycorn-state-$(prefix_of "$i")/logs)"
    done
    local warm backlog_end=$((TRIP_S - 5))
    warm=$((($(now_ms) - epoch) / 1000 + 5))
    ((warm < 15)) && warm=15
    ((backlog_end - warm - BULK_S >= 10)) || die "topologies took ${warm}s to come up: no time left for the backlog phase"
    log "trip $k: load from trip time ${warm}s: $((PER_SIZE * N_SIZES)) downloads in ${BULK_S}s, backlog until ${backlog_end}s"
    local pids=()
    for i in "${!VARIANTS[@]}"; do
        mkdir -p "$tdir/${VARIANTS[$i]}"
        run_load "$tdir/${VARIANTS[$i]}" "$i" "$epoch" "$warm" "$backlog_end" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    # The rest of the event log, then the learned relay's spool empties
    # (every record confirmed by the proxy after Kafka).
    while (($(now_ms) < epoch + TRIP_S * 1000 + 1000)); do sleep 0.5; done
    local p0 spool=-1
    p0=$(prefix_of "$LEARNED")
    for ((i = 0; i < 120; i++)); do
        spool=$(relay_metric "$p0" polycorn_telemetry_spool_records)
        [[ $spool == 0 ]] && break
        sleep 0.5
    done
    [[ $spool == 0 ]] || log "trip $k: WARNING: the learned relay's spool still holds $spool records"
    for i in "${!VARIANTS[@]}"; do collect "$tdir/${VARIANTS[$i]}" "$i"; done
    # Which table the learned copy's endpoints had in use at the end.
    local m=$tdir/${VARIANTS[$LEARNED]}/logs
    local proxy_version proxy_entries relay_version
    proxy_version=$(metric_of "$m/proxy.metrics" polycorn_failure_table_version)
    proxy_entries=$(metric_of "$m/proxy.metrics" polycorn_failure_table_entries)
    relay_version=$(metric_of "$m/relay.metrics" polycorn_failure_table_version)
    log "trip $k: learned copy's table in use: proxy version $proxy_version ($proxy_entries entries), relay version $relay_version"
    # Every table the trainer published verified: none refused for its signature.
    local refused
    local r v
    refused=0
    for r in proxy relay; do
        v=$(metric_of "$m/$r.metrics" polycorn_failure_table_source_rejected_total --label reason=signature)
        [[ $v == null ]] || refused=$((refused + v))
    done
    ((refused == 0)) || die "trip $k: the learned copy refused $refused of the trainer's tables for their signature"
    all_down
    for i in "${!VARIANTS[@]}"; do
        cp "/tmp/polycorn-state-$(prefix_of "$i")/logs/emu.log" "$tdir/${VARIANTS[$i]}/logs/" 2>/dev/null || true
    done

    # LinkDB has the trip, then the trainer learns the next table.
    local trip_ho got
    trip_ho=$(event_handovers "$tdir/trip/events.jsonl")
    HANDOVERS_WANT=$((HANDOVERS_WANT + trip_ho))
    got=$(wait_ingest "$HANDOVERS_WANT")
    local db_trips
    db_trips=$(psql "$DB_URL" -Atc "select count(*) from trips where train_id = '$TRAIN'")
    log "trip $k: handovers in the event log $trip_ho (all trips $HANDOVERS_WANT), in LinkDB $got; LinkDB trips of $TRAIN: $db_trips"
    ((got == HANDOVERS_WANT)) || log "trip $k: WARNING: LinkDB has $got handovers of $TRAIN, the event logs $HANDOVERS_WANT"
    local t0 rc=0
    t0=$(now_ms)
    echo null >"$tdir/trainer.json"
    if ((HAVE_TRAINER)); then
        # shellcheck disable=SC2086 # TRAINER_ARGS: separate flags on purpose
        PY polycorn-trainer run --once --database-url "$DB_URL" --bootstrap "$POLYCORN_KAFKA_BOOTSTRAP" \
            --topic "$TABLE_TOPIC" --table-signing-key "$TABLE_KEY/table-signing.key" $TRAINER_ARGS \
            --summary-json "$tdir/trainer.json" >"$tdir/trainer.log" 2>&1 || rc=$?
        ((rc == 0)) || { tail -20 "$tdir/trainer.log" >&2; die "trip $k: polycorn-trainer run failed ($rc)"; }
        log "trip $k: trainer $(jq -c '{model_id, cells, cells_fitted, handovers, table: (.table // null | if . then {version, entries} else null end)}' "$tdir/trainer.json") in $((($(now_ms) - t0) / 1000))s"
    fi

    jq -n --argjson trip "$k" --arg id "$id" --argjson seed "$seed" --argjson epoch "$epoch" \
        --argjson warm "$warm" --argjson backlog_end "$backlog_end" \
        --argjson version "${version:-null}" --argjson entries "$entries" \
        --argjson ev "$trip_ho" --argjson want "$HANDOVERS_WANT" --argjson got "$got" --argjson db_trips "$db_trips" \
        --argjson spool "$spool" --slurpfile trainer "$tdir/trainer.json" \
        --argjson pv "$proxy_version" --argjson pe "$proxy_entries" --argjson rv "$relay_version" \
        '{trip: $trip, id: $id, trip_seed: $seed, epoch_unix_ms: $epoch, load_start_s: $warm,
          backlog_end_s: $backlog_end,
          learned_table: (if $version == null then null else {version: $version, entries: $entries} end),
          handovers: {trip_events: $ev, events_all_trips: $want, linkdb: $got, linkdb_trips: $db_trips},
          in_use_at_end: {proxy_version: $pv, proxy_entries: $pe, relay_version: $rv},
          learned_relay_spool_left: $spool, trainer_after: $trainer[0]}' >"$tdir/loop-trip.json"
    TRIP_IDS+=("$id")
}

TRIP_IDS=()
# The commit the run starts from: a report run takes hours, and others may
# commit in this tree meanwhile (the binaries are the ones built now).
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
log "profile $PROFILE: $TRIPS trips of ${TRIP_S}s, route $ROUTE_SEED, trip seeds $((TRIP_SEED_BASE + 1))..$((TRIP_SEED_BASE + TRIPS)), table source $TABLE_SOURCE, positions $POSITIONS"
T_START=$(now_ms)
for ((k = 1; k <= TRIPS; k++)); do
    run_trip "$k"
    log "trip $k done; $((($(now_ms) - T_START) / 1000))s so far"
done

desc="polycorn-tracegen $PRESET, $CARRIERS carriers, route seed $ROUTE_SEED, trip seeds $((TRIP_SEED_BASE + 1))..$((TRIP_SEED_BASE + TRIPS)), in order"
((DIAGNOSTIC)) && desc="DIAGNOSTIC: $desc"
jq -n --arg profile "$PROFILE" --argjson diag "$( ((DIAGNOSTIC)) && echo true || echo false)" \
    --arg commit "$COMMIT" \
    --argjson per_size "$PER_SIZE" --argjson slot "$SLOT_S" --argjson backlog "$BACKLOG_S" \
    --argjson trip_s "$TRIP_S" --arg desc "$desc" --arg source "$TABLE_SOURCE" --arg train "$TRAIN" \
    --argjson route "$ROUTE_SEED" --arg trainer_args "$TRAINER_ARGS" --arg positions "$POSITIONS" \
    --args '{profile: $profile, diagnostic: $diag, commit: $commit,
      schemes: ["hrsch-learned", "minrtt", "hrsch-none", "hrsch-truth"],
      bulk: {per_size: $per_size, sizes: {"256KB": 262144, "1MB": 1048576, "4MB": 4194304}, slot_s: $slot},
      im: {users: []},
      backlog: {seconds_nominal: $backlog, path: "/files/100MiB.bin", link_sets: ["hsr"]},
      buffer_bytes: 3000000, load_seed: 424242, trip_s: $trip_s, route_seed: $route,
      loop: {train_id: $train, table_source: $source, trainer_args: $trainer_args, positions: $positions},
      link_sets: {hsr: {trips: $ARGS.positional, description: $desc}}}' "${TRIP_IDS[@]}" >"$RUN/run.json"

log "analysing $RUN"
mkdir -p "$PLOTS"
uv run --project bench --locked --quiet python -m polycorn_bench.loop "$RUN" \
    --out "$OUT/loop.json" --md "$OUT/loop.md" --plots "$PLOTS"
log "results: $OUT/loop.json, $OUT/loop.md, plot in $PLOTS; raw records in $RUN; $((($(now_ms) - T_START) / 1000))s"
