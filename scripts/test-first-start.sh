#!/usr/bin/env bash
# A newcomer's first run, in make test: PostgreSQL, Kafka and Prometheus start
# from nothing (a fresh, private state directory: initdb, a freshly formatted
# KRaft broker) and the demo's fleet part runs on them at once: history
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
export POLYCORN_PG_PORT=${FIRST_START_PG_PORT:-55452}
export POLYCORN_KAFKA_PORT=${FIRST_START_KAFKA_PORT:-59122}
export POLYCORN_PROM_PORT=${FIRST_START_PROM_PORT:-59120}

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

for p in "$POLYCORN_PG_PORT" "$POLYCORN_KAFKA_PORT" "$((POLYCORN_KAFKA_PORT + 1))" "$POLYCORN_PROM_PORT"; do
    if ss -Htln "sport = :$p" | grep -q .; then
        echo "first-start: port $p is in use; set FIRST_START_*_PORT" >&2
        exit 1
    fi
done

fresh() { [[ ! -e $STATE/pg && ! -e $STATE/kafka ]]; }
step "no earlier state in $STATE" fresh
# Returns only when each server is ready for what the project does with it.
step "scripts/infra.sh up from nothing (initdb, Kafka format)" bash scripts/infra.sh up pg kafka prom
step "the demo's fleet part on the new servers" \
    env DEMO_TRIP_S="${FIRST_START_TRIP_S:-60}" DEMO_HISTORY_TRIPS="${FIRST_START_HISTORY_TRIPS:-2}" \
    bash scripts/demo-fleet.sh
