#!/usr/bin/env bash
# make bench-api: p50/p99 of the LinkDB API's hot queries with 1M handovers
# loaded, at a fixed open-loop 200 requests/s each -> bench/out/api.json.
#
# 1. PostgreSQL + PostGIS (scripts/infra.sh up pg); a fresh database
#    linkdb_bench_api, migrated, seeded by linkdb-api/loadtest/seed.sql
#    (1,008,000 handovers on 3 lines, 5,400 cells; ~2 min).
# 2. Two throw-away API keys (read, admin), only their hashes given to the API.
# 3. The API under uvicorn on loopback (BENCH_API_WORKERS=2 workers: one per
#    core), no access log.
# 4. A failure-location table published through POST /v1/failure-tables.
# 5. linkdb-api/loadtest/loadgen.py: each query for BENCH_API_SECONDS (30) at
#    BENCH_API_RATE (200) req/s after a 3 s warm-up, open loop.
#
# The load generator, the API and PostgreSQL share the machine's cores: the
# numbers include that contention.
#
# Env: BENCH_API_RATE (200), BENCH_API_SECONDS (30), BENCH_API_WORKERS (2),
# BENCH_API_PORT (58080), BENCH_API_REUSE=1 (keep an already seeded database),
# BENCH_OUT (bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${BENCH_API_RATE:-200}
SECS=${BENCH_API_SECONDS:-30}
WORKERS=${BENCH_API_WORKERS:-2}
PORT=${BENCH_API_PORT:-58080}
OUT=${BENCH_OUT:-bench/out}
DB=linkdb_bench_api
UVW=(uv run --all-packages --locked --quiet)

log() { printf 'bench-api: %s\n' "$*" >&2; }

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
    psql "$BENCH_URL" -qc "truncate failure_tables"
else
    log "creating and seeding $DB (1M handovers; about 2 minutes)"
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
KEYS="$("${UVW[@]}" polycorn-linkdb-api hash-key --key "$READ_KEY" bench read),$("${UVW[@]}" polycorn-linkdb-api hash-key --key "$ADMIN_KEY" bench-admin admin)"

log "starting the API: $WORKERS uvicorn workers on 127.0.0.1:$PORT"
POLYCORN_DATABASE_URL=$BENCH_URL POLYCORN_API_KEYS=$KEYS \
    "${UVW[@]}" polycorn-linkdb-api serve --host 127.0.0.1 --port "$PORT" --workers "$WORKERS" \
    --log-level warning --no-access-log &
API_PID=$!
cleanup() { kill "$API_PID" 2>/dev/null || true; wait "$API_PID" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 300); do
    curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
    sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { log "the API did not become ready"; exit 1; }

(cd linkdb-api && "${UVW[@]}" python -m loadtest.publish_table --db "$BENCH_URL" \
    --url "http://127.0.0.1:$PORT" --key "$ADMIN_KEY")

mkdir -p "$OUT"
(cd linkdb-api && "${UVW[@]}" python -m loadtest.loadgen --url "http://127.0.0.1:$PORT" \
    --key "$READ_KEY" --rate "$RATE" --seconds "$SECS" --out "../$OUT/api.json" \
    --setup "load average before: $(cut -d" " -f1-3 /proc/loadavg); $ROWS handovers, $CELLS cells; $WORKERS uvicorn workers, sync SQLAlchemy/psycopg pool 8+8 per worker; open loop at $RATE req/s, ${SECS} s after 3 s warm-up; $(nproc) cores shared by load generator, API and PostgreSQL")
