#!/usr/bin/env bash
# make bench-api: p50/p99 of the LinkDB API's hot queries with 1M handovers
# loaded, each at a fixed open-loop 200 requests/s -> bench/out/api.json.
#
# 1. PostgreSQL + PostGIS (scripts/infra.sh up pg); a fresh database
#    linkdb_bench_api, migrated, seeded by linkdb-api/loadtest/seed.sql
#    (1,008,000 handovers on 3 lines, 5,400 cells; a few minutes).
# 2. Two throw-away API keys (read, admin), only their hashes given to the API.
# 3. The API under uvicorn (uvloop + httptools) on loopback,
#    BENCH_API_WORKERS workers, no access log.
# 4. A failure-location table published through POST /v1/failure-tables.
# 5. Vegeta (scripts/setup.sh bench builds it) drives each query alone: a
#    warm-up of BENCH_API_WARMUP s, then BENCH_API_SECONDS s at BENCH_API_RATE
#    req/s, open loop (requests leave on schedule whether or not earlier ones
#    have answered); targets from linkdb-api/loadtest/targets.py (fixed seed).
#    `vegeta report -type=json` per query, folded by loadtest/report.py.
#
# Vegeta, the API and PostgreSQL share the machine's cores: the numbers
# include that contention, and whatever else runs (the load average before
# each query is recorded in api.json).
#
# Env: BENCH_API_RATE (200), BENCH_API_SECONDS (30), BENCH_API_WARMUP (5),
# BENCH_API_WORKERS (2), BENCH_API_PORT (28080), BENCH_API_QUERIES (all four),
# BENCH_API_REUSE=1 (keep an already seeded database), BENCH_OUT (bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${BENCH_API_RATE:-200}
SECS=${BENCH_API_SECONDS:-30}
WARMUP=${BENCH_API_WARMUP:-5}
WORKERS=${BENCH_API_WORKERS:-2}
PORT=${BENCH_API_PORT:-28080}
QUERIES=${BENCH_API_QUERIES:-handovers_bbox_page cell_stats failure_table failure_table_304}
OUT=${BENCH_OUT:-bench/out}
DB=linkdb_bench_api
UVW=(uv run --all-packages --locked --quiet)
API=http://127.0.0.1:$PORT

log() { printf 'bench-api: %s\n' "$*" >&2; }

bash scripts/setup.sh bench >/dev/null
VEGETA=${POLYCORN_CACHE:-/var/cache/polycorn}/go/bin/vegeta
bash scripts/infra.sh up pg
eval "$(bash scripts/infra.sh env)"
ADMIN_URL=${POLYCORN_DATABASE_URL%/*}/postgres
BENCH_URL=${POLYCORN_DATABASE_URL%/*}/$DB

seeded() {
    [[ $(psql "$ADMIN_URL" -Atc "select 1 from pg_database where datname='$DB'") == 1 ]] &&
        [[ $(psql "$BENCH_URL" -Atc "select count(*) >= 1000000 from handovers" 2>/dev/null) == t ]]
}

if [[ ${BENCH_API_REUSE:-0} == 1 ]] && seeded; then
    log "reusing the seeded database $DB"
    "${UVW[@]}" polycorn-linkdb --url "$BENCH_URL" upgrade
    psql "$BENCH_URL" -qc "truncate failure_tables"
else
    log "creating and seeding $DB (1M handovers; a few minutes)"
    psql "$ADMIN_URL" -qc "drop database if exists $DB with (force)" -c "create database $DB"
    psql "$BENCH_URL" -qc "create extension if not exists postgis"
    "${UVW[@]}" polycorn-linkdb --url "$BENCH_URL" upgrade
    start=$(date +%s)
    psql "$BENCH_URL" -q -f linkdb-api/loadtest/seed.sql >/dev/null
    log "seeded in $(($(date +%s) - start)) s"
fi
ROWS=$(psql "$BENCH_URL" -Atc "select count(*) from handovers")
CELLS=$(psql "$BENCH_URL" -Atc "select count(*) from cells")

READ_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
ADMIN_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
KEYS="$("${UVW[@]}" polycorn-linkdb-api hash-key --key="$READ_KEY" bench read),$("${UVW[@]}" polycorn-linkdb-api hash-key --key="$ADMIN_KEY" bench-admin admin)"

log "starting the API: $WORKERS uvicorn workers on 127.0.0.1:$PORT"
POLYCORN_DATABASE_URL=$BENCH_URL POLYCORN_API_KEYS=$KEYS \
    "${UVW[@]}" polycorn-linkdb-api serve --host 127.0.0.1 --port "$PORT" --workers "$WORKERS" \
    --log-level warning --no-access-log &
API_PID=$!
WORK=$(mktemp -d /tmp/bench-api.XXXXXX)
cleanup() {
    kill "$API_PID" 2>/dev/null || true
    wait "$API_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 300); do
    curl -fsS "$API/readyz" >/dev/null 2>&1 && break
    sleep 0.2
done
curl -fsS "$API/readyz" >/dev/null || { log "the API did not become ready"; exit 1; }

(cd linkdb-api && "${UVW[@]}" python -m loadtest.publish_table --db "$BENCH_URL" \
    --url "$API" --key="$ADMIN_KEY")
ETAG=$(curl -fsS -o /dev/null -D - -H "X-API-Key: $READ_KEY" "$API/v1/failure-table" |
    sed -n 's/^[Ee][Tt][Aa][Gg]: *//p' | tr -d '\r')
psql "$BENCH_URL" -Atc "select id from cells order by id" >"$WORK/cells.txt"
(cd linkdb-api && "${UVW[@]}" python -m loadtest.targets --url "$API" --key="$READ_KEY" \
    --cells "$WORK/cells.txt" --etag "$ETAG" --out "$WORK")

VEGETA_VERSION=$(sed -n "s/^VEGETA_VERSION=//p" scripts/setup.sh)
python3 - "$WORK/setup.json" <<PY
import json, os, platform, sys
json.dump({
    "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
    "handovers": $ROWS, "cells": $CELLS,
    "api": "$WORKERS uvicorn workers (uvloop, httptools), asyncio psycopg pool of 8 per worker",
    "load": "vegeta ${VEGETA_VERSION:-?}, open loop at $RATE req/s for $SECS s after a $WARMUP s warm-up, "
            "keep-alive; vegeta, API and PostgreSQL on the same cores",
}, open(sys.argv[1], "w"))
PY

for q in $QUERIES; do
    log "$q: warm-up ${WARMUP}s, then ${SECS}s at $RATE req/s"
    "$VEGETA" attack -format=json -targets="$WORK/$q.jsonl" -rate="$RATE/s" -duration="${WARMUP}s" \
        -timeout=10s >/dev/null
    cut -d' ' -f1-3 /proc/loadavg >"$WORK/$q.loadavg"
    "$VEGETA" attack -format=json -targets="$WORK/$q.jsonl" -rate="$RATE/s" -duration="${SECS}s" \
        -timeout=10s >"$WORK/$q.bin"
    "$VEGETA" report -type=json "$WORK/$q.bin" >"$WORK/$q.report.json"
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
(cd linkdb-api && "${UVW[@]}" python -m loadtest.report --dir "$WORK" --setup "$WORK/setup.json" \
    --out "$OUT/api.json")
