#!/usr/bin/env bash
# The fleet half of the demo: one emulated trip's telemetry through the whole
# cloud side, with real services.
#
#   relay-agent (radio replay, durable spool) -> 2 emulated carriers -> proxy
#   -> Kafka -> polycorn-ingest -> LinkDB (PostgreSQL + PostGIS) -> linkdb-api
#                                          -> polycorn-trainer -> Kafka -> proxy
#
# First the fleet's history: DEMO_HISTORY_TRIPS (12) earlier trips of the same
# route go through Kafka and ingest into a fresh LinkDB
# (scripts/trainer_fleet.py load), and the trainer service learns from them
# and publishes failure-location table v1 to a compacted topic. Then the live
# trip: the proxy (hrsch) reads the table from the topic at start and
# hot-reloads every later version; a passenger downloads through the train;
# the trip's telemetry lands in LinkDB and the trainer's next run learns from
# it too. At the end the LinkDB API says what the fleet knows: the train, its
# handovers, the cells where handovers failed, the trainer's validation and
# the table the proxy used. Tables are signed as in a deployment: the
# trainer signs each with a key of `polycorn-pki table-key`, and the proxy
# takes only tables that key's public half verifies
# (--failure-table-verify-key). Run by scripts/demo.sh (make demo) after the
# side-by-side scheduler comparison; DEMO_TRIP_S sets the trip length (120).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
BIN=${BIN:-$root/target/release}
export BIN
uv sync --all-packages --locked --quiet

TRIP_S=${DEMO_TRIP_S:-120}
P=hf
STATE_LOGS=/tmp/polycorn-state-$P/logs
export TRAIN_ID=train-demo
API_PORT=${DEMO_API_PORT:-18080}
DB=linkdb_demo
WORK=$(mktemp -d /tmp/polycorn-demo-fleet.XXXXXX)
PIDS=()
PY() { uv run --all-packages --locked --quiet "$@"; }
VENV=$root/.venv/bin

cleanup() {
    local p
    # Each service runs in its own process group (setsid): stop all of it.
    for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    rm -f "${POLYCORN_PROM_TARGETS_DIR:-/nonexistent}"/demo-fleet-*.json
    local t
    for t in ${TOPIC:+"$TOPIC" "$DLQ" "$TABLES"}; do
        bash scripts/infra.sh topics --delete --topic "$t" >/dev/null 2>&1 || true
    done
    PC_PREFIX=$P testbed/topology.sh down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The demo is also a check (scripts/test-first-start.sh runs it on servers
# started from nothing): what did not happen fails it, with the log to read.
fail() {
    echo "demo-fleet: ERROR: $1" >&2
    [[ -n ${2:-} && -f $2 ]] && tail -30 "$2" >&2
    exit 1
}

bash scripts/infra.sh up pg kafka prom >/dev/null
eval "$(bash scripts/infra.sh env)"
KAFKA_PORT=${POLYCORN_KAFKA_BOOTSTRAP##*:}
DB_URL=${POLYCORN_DATABASE_URL%/*}/$DB
# A fresh LinkDB for the demo (the shared server keeps other databases).
psql "${POLYCORN_DATABASE_URL%/*}/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
PY polycorn-linkdb --url "$DB_URL" upgrade 2>"$WORK/migrate.log" || fail "migrating $DB_URL failed" "$WORK/migrate.log"
# The demo's own topics (deleted at the end): this LinkDB gets exactly the
# demo's records, not what other runs left on the shared broker.
TOPIC=polycorn.telemetry.demo-$$
DLQ=$TOPIC.dlq
TABLES=polycorn.failure-tables.demo-$$
bash scripts/infra.sh topics --create --topic "$TOPIC" --partitions 2 --replication-factor 1 >/dev/null
bash scripts/infra.sh topics --create --topic "$DLQ" --partitions 1 --replication-factor 1 >/dev/null
bash scripts/infra.sh topics --create --topic "$TABLES" --partitions 1 --replication-factor 1 \
    --config cleanup.policy=compact >/dev/null
echo "LinkDB: $DB_URL (migrated); Kafka: $POLYCORN_KAFKA_BOOTSTRAP, topics $TOPIC, $TABLES"

setsid "$VENV/polycorn-ingest" run --database-url "$DB_URL" --group "demo-$$" \
    --topic "$TOPIC" --dlq-topic "$DLQ" \
    --metrics-addr 127.0.0.1:19464 >"$WORK/ingest.log" 2>&1 &
PIDS+=($!)

KEY_ENTRY=$("$VENV/polycorn-linkdb-api" hash-key demo read 2>"$WORK/key")
KEY=$(sed -n 's/.*: //p' "$WORK/key")
POLYCORN_DATABASE_URL=$DB_URL POLYCORN_API_KEYS=$KEY_ENTRY \
    setsid "$VENV/polycorn-linkdb-api" serve --port "$API_PORT" --no-access-log >"$WORK/api.log" 2>&1 &
PIDS+=($!)
# Prometheus (scripts/infra.sh) scrapes ingest, the API and the trainer.
echo '[{"targets": ["127.0.0.1:19464"], "labels": {"service": "ingest"}},
  {"targets": ["127.0.0.1:19466"], "labels": {"service": "trainer"}},
  {"targets": ["127.0.0.1:'"$API_PORT"'"], "labels": {"service": "linkdb-api"}}]' \
    >"$POLYCORN_PROM_TARGETS_DIR/demo-fleet-$$.json"

# The failure-table signing key: the trainer signs, the proxy verifies.
TABLE_KEY=$WORK/table-key
"$BIN/polycorn-pki" table-key --out "$TABLE_KEY" >/dev/null

HISTORY=${DEMO_HISTORY_TRIPS:-24}
echo
echo "== the fleet's history: $HISTORY earlier trips of this route, through Kafka and ingest into LinkDB"
PY python scripts/trainer_fleet.py load --route-seed 1 --trip-seeds "101-$((100 + HISTORY))" \
    --duration-s "$TRIP_S" --tracegen "$BIN/polycorn-tracegen" --database-url "$DB_URL" \
    --work "$WORK/history" --out "$WORK/history.json" >"$WORK/history.log" 2>&1 ||
    fail "loading the fleet's history into LinkDB failed" "$WORK/history.log"
grep -E 'handovers|cells' "$WORK/history.log" | sed 's/^/  /'

# The trainer as a service: a run every 30 s, each publishing a new table
# version when the cells' failure locations changed. Demo thresholds: a cell
# needs 2 failures and a 10 % failure share (defaults 3 and 15 %), since a
# few minutes of route give each cell only a couple of failures (its own table topic:
# versions from other LinkDBs on this broker would mask the demo's).
setsid "$VENV/polycorn-trainer" run --interval-s 30 --database-url "$DB_URL" --topic "$TABLES" \
    --min-failures 2 --min-failure-rate 0.1 --table-signing-key "$TABLE_KEY/table-signing.key" \
    --metrics-addr 127.0.0.1:19466 --summary-json "$WORK/trainer.json" >"$WORK/trainer.log" 2>&1 &
PIDS+=($!)
for ((i = 0; i < 120; i++)); do [[ -s $WORK/trainer.json ]] && break; sleep 0.5; done
[[ -s $WORK/trainer.json ]] || { echo "the trainer's first run did not finish:"; tail "$WORK/trainer.log"; exit 1; }
# The table the live trip's proxy must find on the topic at its start.
first_table=$(jq -r '.table.version // empty' "$WORK/trainer.json")
jq -r '"trainer: model \(.model_id) from \(.handovers) handovers in \(.cells) cells (\(.cells_fitted) SVMs) in \(.refit_s) s; table v\(.table.version // "-") with \(.table.entries // 0) failure locations, on Kafka topic '"$TABLES"'",
    "  leave-one-trip-out: failures correct/late/early \(.validation.failure_correct)/\(.validation.failure_late)/\(.validation.failure_early), successes correct \(.validation.success_correct)"' \
    "$WORK/trainer.json"

"$BIN/polycorn-tracegen" generate --route-seed 1 --trip-seed 7 --duration-s "$TRIP_S" --carriers 2 \
    --out "$WORK/trip" >/dev/null
EPOCH=$(($(date +%s%3N) + 2000))
PC_PREFIX=$P testbed/topology.sh up --trip "$WORK/trip" --scheme hrsch --epoch-unix-ms "$EPOCH" \
    --forward-port "$KAFKA_PORT" --relay-arg --replay-resume \
    --proxy-arg "--kafka-brokers=$POLYCORN_KAFKA_BOOTSTRAP" --proxy-arg "--kafka-topic=$TOPIC" \
    --proxy-arg "--kafka-dlq-topic=$DLQ" --proxy-arg "--failure-table-topic=$TABLES" \
    --proxy-arg "--failure-table-verify-key=$TABLE_KEY/table-signing.pub" >/dev/null
echo
echo "== the live trip"
echo "train $TRAIN_ID on a ${TRIP_S} s trip at 300 km/h (hrsch, the learned table from Kafka, signed by the trainer); a passenger downloads 4 MB files meanwhile"

downloads=0 bytes=0
while (($(date +%s%3N) < EPOCH + TRIP_S * 1000)); do
    if b=$(ip netns exec "$P-pax" curl -fsS --max-time 30 -o /dev/null -w '%{size_download}' \
        http://10.99.0.10/files/bench-4MB.bin 2>/dev/null); then
        downloads=$((downloads + 1)) bytes=$((bytes + b))
    fi
done
echo "trip over: $downloads downloads, $((bytes / 1000000)) MB through the train"

# Telemetry confirmed by Kafka leaves the spool; then ingest catches up.
for ((i = 0; i < 120; i++)); do
    left=$(ip netns exec "$P-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics 2>/dev/null |
        PY python3 scripts/prom_metric.py - polycorn_telemetry_spool_records 2>/dev/null || true)
    [[ $left == 0 ]] && break
    sleep 0.5
done
[[ $left == 0 ]] || fail "the relay's telemetry spool still holds ${left:-?} records 60 s after the trip (Kafka never confirmed them)"
for ((i = 0; i < 60; i++)); do
    n=$(psql "$DB_URL" -Atc "select count(*) from handovers where train_id = '$TRAIN_ID'")
    w=$(grep -c '"event":"handover_end","t_ms":[0-9]*,"carrier":[01],' "$WORK/trip/events.jsonl" || true)
    ((n >= w)) && break
    sleep 1
done
((n >= w)) || fail "LinkDB has $n of the live trip's $w handovers 60 s after the spool drained" "$WORK/ingest.log"

# What the proxy did with the table during the trip, read with the harness's
# parser (scripts/prom_metric.py); a metric the proxy does not export reads 0.
ip netns exec "$P-cloud" curl -fsS --max-time 2 http://127.0.0.1:9464/metrics >"$WORK/proxy.metrics" 2>/dev/null || true
pmetric() { PY python3 scripts/prom_metric.py "$WORK/proxy.metrics" "$@" 2>/dev/null || echo 0; }
table_version=$(pmetric polycorn_failure_table_version)
loads=$(pmetric polycorn_failure_table_source_loads_total --label source=kafka)
echo "proxy: failure-location table v$table_version in use ($loads loaded from Kafka);" \
    "hof-reject kept a carrier out $(pmetric polycorn_sched_schedulerlet_events_total --label schedulerlet=hof-reject --label event=rejections) times"
if [[ -n $first_table ]]; then
    ((loads >= 1)) || fail "the trainer published a table but the proxy loaded none from Kafka" "$STATE_LOGS/proxy.log"
fi
refused=$(pmetric polycorn_failure_table_source_rejected_total --label reason=signature)
((refused == 0)) || fail "the proxy refused $refused of the trainer's tables for their signature" "$STATE_LOGS/proxy.log"

# The trainer's next scheduled run learns from the live trip too.
done_s=$(date +%s)
for ((i = 0; i < 90; i++)); do
    (($(stat -c %Y "$WORK/trainer.json") > done_s)) && break
    sleep 1
done
jq -r '"trainer, next scheduled run: model \(.model_id) from \(.handovers) handovers; table v\(.table.version // "-") (\(.table.entries // 0) entries\(if .table.new then ", new" else ", unchanged" end))"' \
    "$WORK/trainer.json"

echo
echo "== what LinkDB learned (through the API, http://127.0.0.1:$API_PORT/docs)"
API=http://127.0.0.1:$API_PORT KEY=$KEY TRAIN=$TRAIN_ID EVENTS=$WORK/trip/events.jsonl PY python3 - <<'PY'
import json, os
import httpx

api, train = os.environ["API"], os.environ["TRAIN"]
h = {"Authorization": f"Bearer {os.environ['KEY']}"}
c = httpx.Client(base_url=api, headers=h, timeout=30)
t = c.get(f"/v1/trains/{train}").raise_for_status().json()
print(f"train {train}: last seen {t['properties']['last_seen']}, "
      f"at {t['geometry']['coordinates'][1]:.4f} N {t['geometry']['coordinates'][0]:.4f} E")
hos, url, params = [], "/v1/handovers", {"train_id": train, "limit": 100}
while url:
    page = c.get(url, params=params).raise_for_status().json()
    hos += page["features"]
    url, params = page.get("next"), None
want = sum(1 for l in open(os.environ["EVENTS"])
           if (e := json.loads(l))["event"] == "handover_end" and e["carrier"] < 2)
fails = [f for f in hos if f["properties"]["outcome"] == "failure"]
print(f"handovers: {len(hos)} in LinkDB for the {want} of the trip; {len(fails)} failed")
if len(hos) != want:
    raise SystemExit(f"demo-fleet: ERROR: the API serves {len(hos)} handovers of the trip, not {want}")
for f in fails[:6]:
    p = f["properties"]
    print(f"  failed  {p['carrier']}  cell {p['source_cell_id']} -> {p['target_cell_id']}  at track "
          f"{p['track_m']:.0f} m ({p['direction']}), RSRP {p['rsrp_dbm']:.1f} dBm, blackout {p['duration_ms']} ms")
r = c.get("/v1/failure-table")
if r.status_code == 404:
    print("failure-location table: none published yet (no cell has enough failures)")
else:
    tab = r.raise_for_status().json()
    if "x-polycorn-signature" not in r.headers:
        raise SystemExit("demo-fleet: ERROR: the API serves the trainer's table without its signature")
    print(f"failure-location table v{tab['version']} ({len(tab['entries'])} cells, ETag {r.headers['etag'][:14]}...\"), "
          f"{tab['source']}, signed by the trainer (X-Polycorn-Signature); a poll with If-None-Match gets "
          f"{c.get('/v1/failure-table', headers={'If-None-Match': r.headers['etag']}).status_code}")
cells = c.get("/v1/cells", params={"limit": 500}).raise_for_status().json()["features"]
worst = sorted(cells, key=lambda f: -f["properties"]["failure_rate"])[:5]
print(f"cells: {len(cells)} ⟨carrier, cell, direction⟩; highest failure rates:")
for f in worst:
    p = f["properties"]
    print(f"  {p['carrier']} cell {p['cell_id']} {p['direction']}: {p['failures']}/{p['handovers']} failed, "
          f"earliest handover at track {p['earliest_ho_track_m']:.0f} m")
PY

echo
echo "== the same, as Prometheus scraped it ($POLYCORN_PROMETHEUS_URL)"
prom() {
    curl -fsS "$POLYCORN_PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1" |
        jq -r '.data.result[] | "\(.metric | del(.__name__, .instance, .job, .service) | tostring) \(.value[1])"' 2>/dev/null
}
# Prometheus scrapes every 2 s and rereads its file targets every 2 s: wait
# for the three targets and for a scrape after the API requests above.
for ((i = 0; i < 60; i++)); do
    up=$(prom 'count(up{service=~"ingest|trainer|linkdb-api"} == 1)' | awk '{print $2}')
    api=$(prom 'count(polycorn_api_request_duration_seconds_count{service="linkdb-api",route="/v1/cells"})' | awk '{print $2}')
    [[ $up == 3 && $api == 1 ]] && break
    sleep 0.5
done
[[ $up == 3 && $api == 1 ]] || fail "after 30 s Prometheus scrapes ${up:-0} of ingest, trainer and linkdb-api, and has ${api:-no} sample of the API's /v1/cells requests"
echo "rows ingest wrote, by table:"
prom 'sum by (table) (polycorn_ingest_rows_written_total{service="ingest"})' | sed 's/^/  /'
echo "trainer: runs, last validation:"
prom 'sum by (result) (polycorn_trainer_runs_total{service="trainer"})' | sed 's/^/  runs /'
prom 'polycorn_trainer_validation_ratio{service="trainer"}' | sed 's/^/  /'
echo "API requests, by route:"
prom 'sum by (route) (polycorn_api_request_duration_seconds_count{service="linkdb-api"})' | sed 's/^/  /'
