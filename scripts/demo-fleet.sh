#!/usr/bin/env bash
# The fleet half of the demo: one emulated trip's telemetry through the whole
# cloud side, with real services.
#
#   relay-agent (radio replay, durable spool) -> 2 emulated carriers -> proxy
#   -> Kafka -> polycorn-ingest -> LinkDB (PostgreSQL + PostGIS) -> linkdb-api
#
# A passenger downloads through the train meanwhile. At the end it asks the
# LinkDB API what the trip taught the fleet: the train, its handovers, the
# cells where handovers failed. Run by scripts/demo.sh (make demo) after the
# side-by-side scheduler comparison; DEMO_TRIP_S sets the trip length (120).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
BIN=${BIN:-$root/target/release}
export BIN
uv sync --all-packages --locked --quiet

TRIP_S=${DEMO_TRIP_S:-120}
P=hf
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
    PC_PREFIX=$P testbed/topology.sh down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash scripts/infra.sh up pg kafka prom >/dev/null
eval "$(bash scripts/infra.sh env)"
KAFKA_PORT=${POLYCORN_KAFKA_BOOTSTRAP##*:}
DB_URL=${POLYCORN_DATABASE_URL%/*}/$DB
# A fresh LinkDB for the demo (the shared server keeps other databases).
psql "${POLYCORN_DATABASE_URL%/*}/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
PY polycorn-linkdb --url "$DB_URL" upgrade 2>/dev/null
TOPIC=polycorn.telemetry.v1
echo "LinkDB: $DB_URL (migrated); Kafka: $POLYCORN_KAFKA_BOOTSTRAP, topic $TOPIC"

# ingest: a fresh consumer group reads the topic from the start; earlier
# runs' records are for other trains or are duplicates, which LinkDB ignores.
setsid "$VENV/polycorn-ingest" run --database-url "$DB_URL" --group "demo-$(date +%s)" \
    --metrics-addr 127.0.0.1:19464 >"$WORK/ingest.log" 2>&1 &
PIDS+=($!)

KEY_ENTRY=$("$VENV/polycorn-linkdb-api" hash-key demo read 2>"$WORK/key")
KEY=$(sed -n 's/.*: //p' "$WORK/key")
POLYCORN_DATABASE_URL=$DB_URL POLYCORN_API_KEYS=$KEY_ENTRY \
    setsid "$VENV/polycorn-linkdb-api" serve --port "$API_PORT" --no-access-log >"$WORK/api.log" 2>&1 &
PIDS+=($!)
# Prometheus (scripts/infra.sh) scrapes ingest and the API.
echo '[{"targets": ["127.0.0.1:19464"], "labels": {"service": "ingest"}},
  {"targets": ["127.0.0.1:'"$API_PORT"'"], "labels": {"service": "linkdb-api"}}]' \
    >"$POLYCORN_PROM_TARGETS_DIR/demo-fleet-$$.json"

"$BIN/polycorn-tracegen" generate --route-seed 1 --trip-seed 7 --duration-s "$TRIP_S" --carriers 2 \
    --out "$WORK/trip" >/dev/null
EPOCH=$(($(date +%s%3N) + 2000))
PC_PREFIX=$P testbed/topology.sh up --trip "$WORK/trip" --scheme hrsch --epoch-unix-ms "$EPOCH" \
    --forward-port "$KAFKA_PORT" --relay-arg --replay-resume \
    --proxy-arg "--kafka-brokers=$POLYCORN_KAFKA_BOOTSTRAP" --proxy-arg "--kafka-topic=$TOPIC" >/dev/null
echo "train $TRAIN_ID on a ${TRIP_S} s trip at 300 km/h (hrsch); a passenger downloads 4 MB files meanwhile"

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
        awk '/^polycorn_telemetry_spool_records/ {print $2}')
    [[ $left == 0 ]] && break
    sleep 0.5
done
for ((i = 0; i < 60; i++)); do
    n=$(psql "$DB_URL" -Atc "select count(*) from handovers where train_id = '$TRAIN_ID'")
    w=$(grep -c '"event":"handover_end","t_ms":[0-9]*,"carrier":[01],' "$WORK/trip/events.jsonl" || true)
    ((n >= w)) && break
    sleep 1
done

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
for f in fails[:6]:
    p = f["properties"]
    print(f"  failed  {p['carrier']}  cell {p['source_cell_id']} -> {p['target_cell_id']}  at track "
          f"{p['track_m']:.0f} m ({p['direction']}), RSRP {p['rsrp_dbm']:.1f} dBm, blackout {p['duration_ms']} ms")
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
sleep 3
prom() {
    curl -fsS "$POLYCORN_PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1" |
        jq -r '.data.result[] | "\(.metric | del(.__name__, .instance, .job, .service) | tostring) \(.value[1])"' 2>/dev/null
}
echo "rows ingest wrote, by table:"
prom 'sum by (table) (polycorn_ingest_rows_written_total{service="ingest"})' | sed 's/^/  /'
echo "API requests, by route:"
prom 'sum by (route) (polycorn_api_request_duration_seconds_count{service="linkdb-api"})' | sed 's/^/  /'
