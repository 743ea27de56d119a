#!/usr/bin/env bash
# A newcomer's first run, in make test: PostgreSQL, Kafka and Prometheus start
# from nothing (a fresh, private state directory: initdb, a freshly formatted
# KRaft broker). A client started before each server must wait through its
# start-up; then the demo's fleet part runs on the new servers: history
# through Kafka and ingest into LinkDB, the trainer, a live trip whose proxy
# reads the learned table from Kafka. Every run until issue 17 found servers
# left warm by an earlier run; a fresh broker's group coordinator answers
# NOT_COORDINATOR for a while, and the first `make demo` failed on it.
#
# The servers get their own ports and state directory, so the developer's
# warm servers (scripts/infra.sh defaults) are neither used nor wiped; this
# script wipes its own at the end, also on failure. Short: 2 history trips
# and a 60 s live trip (FIRST_START_TRIP_S, FIRST_START_HISTORY_TRIPS).
# Needs root (namespaces) and the release binaries (make build).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=$(mktemp -d /tmp/polycorn-first-start.XXXXXX)
export POLYCORN_INFRA_DIR=$STATE
export POLYCORN_PG_PORT=${FIRST_START_PG_PORT:-25452}
export POLYCORN_KAFKA_PORT=${FIRST_START_KAFKA_PORT:-29122}
export POLYCORN_PROM_PORT=${FIRST_START_PROM_PORT:-29120}

passed=0 failed=0
finish() {
    bash scripts/infra.sh wipe >/dev/null 2>&1 || true
    rm -rf "$STATE"
    echo "first-start: $passed passed, $failed failed"
}
trap finish EXIT

step() { # step NAME CMD...: run, time and report one step
    local name=$1 t0=$SECONDS
    shift
    echo "first-start: $name ..."
    if "$@"; then
        passed=$((passed + 1))
        echo "first-start: ok   $name ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1))
        echo "first-start: FAIL $name ($((SECONDS - t0)) s)"
        exit 1
    fi
}

for p in "$POLYCORN_PG_PORT" "$POLYCORN_KAFKA_PORT" "$((POLYCORN_KAFKA_PORT + 1))" "$((POLYCORN_KAFKA_PORT + 2))" "$POLYCORN_PROM_PORT"; do
    if ss -Htln "sport = :$p" | grep -q .; then
        echo "first-start: port $p is in use; set FIRST_START_*_PORT" >&2
        exit 1
    fi
done

fresh() { [[ ! -e $STATE/pg && ! -e $STATE/kafka ]]; }
step "no earlier state in $STATE" fresh

eval "$(bash scripts/infra.sh env)"
PG_ADMIN=${POLYCORN_DATABASE_URL%/*}/postgres
PY() { uv run --all-packages --locked --quiet "$@"; }
uv sync --all-packages --locked --quiet
WORK=$STATE/work
mkdir -p "$WORK"

# Clients that start before their server must wait through its start-up
# (connection refused, "the database system is starting up", a broker with
# no coordinator yet), bounded, instead of failing at the first error.
blocked() { # PID LOG PATTERN: the client runs and says it is waiting for its server
    local i
    for ((i = 0; i < 600; i++)); do
        grep -q "$3" "$2" && return 0
        kill -0 "$1" 2>/dev/null || { tail -20 "$2"; echo "it exited instead of waiting"; return 1; }
        sleep 0.1
    done
    tail -20 "$2"
    echo "no sign of waiting after 60 s"
    return 1
}
waited() { # PID LOG: the client's exit status; what it waited through
    local rc=0
    wait "$1" || rc=$?
    grep -h "retrying" "$2" | cut -c1-160 | sed 's/^/    waited: /' | head -3
    ((rc == 0)) || tail -20 "$2"
    return "$rc"
}
PY polycorn-linkdb --url "$PG_ADMIN" --wait-s 120 current >"$WORK/linkdb-wait.log" 2>&1 &
early_pg=$!
step "polycorn-linkdb, started before PostgreSQL, is waiting for it" blocked "$early_pg" "$WORK/linkdb-wait.log" "retrying"
step "scripts/infra.sh up pg from nothing (initdb)" bash scripts/infra.sh up pg
step "polycorn-linkdb, started before PostgreSQL, waited for it" waited "$early_pg" "$WORK/linkdb-wait.log"

PY polycorn-linkdb --url "$POLYCORN_DATABASE_URL" upgrade >"$WORK/migrate.log" 2>&1
# The history loader of the demo and the benchmarks, started while no broker
# runs: it creates its topics, produces two trips, has ingest consume them
# and checks the group's committed offsets, all on a broker that starts
# under it; LinkDB must then hold exactly the trips' records.
PY python scripts/trainer_fleet.py load --route-seed 3 --trip-seeds 301-302 --duration-s 60 \
    --tracegen target/release/polycorn-tracegen --ingest-timeout-s 300 \
    --work "$WORK/early" --out "$WORK/early.json" >"$WORK/early.log" 2>&1 &
early_kafka=$!
# librdkafka logs each refused connection; the loader's own waits say "retrying".
step "the history loader, started before Kafka, is waiting for it" \
    blocked "$early_kafka" "$WORK/early.log" "Connection refused\|retrying"
step "scripts/infra.sh up kafka prom from nothing (Kafka format)" bash scripts/infra.sh up kafka prom
step "the history loader, started before Kafka, loaded every record" waited "$early_kafka" "$WORK/early.log"

step "the demo's fleet part on the new servers" \
    env DEMO_TRIP_S="${FIRST_START_TRIP_S:-60}" DEMO_HISTORY_TRIPS="${FIRST_START_HISTORY_TRIPS:-2}" \
    bash scripts/demo-fleet.sh
