#!/usr/bin/env bash
# End-to-end test of the fleet telemetry path on a testbed trip, with real
# Kafka and real PostgreSQL + PostGIS (scripts/infra.sh):
#
#   relay-agent (replay source, durable spool) -> emulated carriers -> proxy
#   -> Kafka (idempotent producer, ack after Kafka) -> polycorn-ingest -> LinkDB
#
# While the trip runs, every fault the issue names happens once, in turn:
# Kafka restarted, PostgreSQL restarted, the relay restarted, and every path
# blacked out for 60 s. Afterwards every handover event and every GPS fix of
# the trip must be in LinkDB exactly once, nothing may be in the dead-letter
# topic, and ingest must have survived. Also runs the Kafka-dependent Rust
# tests (`cargo test -- --ignored`). Ends with "N passed, N failed".
#
# As deployed, every service authenticates to Kafka (docs/security.md): the
# proxy (telemetry producer and table consumer), ingest and the trainer use
# the broker's SASL_SSL listener as their own SCRAM users, under the ACLs of
# services/kafka/acls.txt, with the broker certificate checked against the
# infra CA; the checks' own clients use the PLAINTEXT listener. Tables are
# signed as deployed too: the trainer signs with a key of `polycorn-pki
# table-key`, and the proxy takes only tables its public key verifies
# (scripts/signed_tables.py tries others on the running proxy).
#
# TRIP_S (default 300) sets the trip length; the fault times scale with it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

BIN=${BIN:-$root/target/release}
export BIN
for b in polycorn-emu polycorn-relay polycorn-proxy polycorn-pki polycorn-loadgen polycorn-tracegen; do
    [[ -x $BIN/$b ]] || cargo build --release --locked --workspace
done
uv sync --all-packages --locked --quiet

pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else ko "$name"; fi; }
log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }

# Its own PostgreSQL and Kafka (state and ports apart from the ones other
# tests and benchmarks share), since this test restarts them; stopped at
# the end.
export POLYCORN_INFRA_DIR=${E2E_INFRA_DIR:-/tmp/polycorn-infra-e2e}
export POLYCORN_PG_PORT=${E2E_PG_PORT:-25442} POLYCORN_KAFKA_PORT=${E2E_KAFKA_PORT:-29102}
export POLYCORN_PROM_PORT=${E2E_PROM_PORT:-29110}
bash scripts/infra.sh up pg kafka prom
eval "$(bash scripts/infra.sh env)"
KAFKA_PORT=${POLYCORN_KAFKA_BOOTSTRAP##*:}
KAFKA_SASL_PORT=${POLYCORN_KAFKA_SASL_BOOTSTRAP##*:}
# The Kafka security options of the service USER (proxy, ingest, trainer),
# one per line.
kafka_auth() {
    printf '%s\n' --kafka-security-protocol=SASL_SSL --kafka-sasl-username="$1" \
        --kafka-sasl-password-file="$POLYCORN_KAFKA_USERS_DIR/$1.password" --kafka-ssl-ca="$POLYCORN_INFRA_TLS_CA"
}
mapfile -t INGEST_AUTH < <(kafka_auth ingest)
mapfile -t TRAINER_AUTH < <(kafka_auth trainer)
PROXY_AUTH=()
while read -r a; do PROXY_AUTH+=(--proxy-arg "$a"); done < <(kafka_auth proxy)
PY() { uv run --all-packages --locked --quiet "$@"; }

TRIP_S=${TRIP_S:-300}
RUN=e2e$(date +%s)$$
TOPIC=polycorn.telemetry.v1.$RUN
DLQ=polycorn.telemetry.dlq.$RUN
TABLES=polycorn.failure-tables.v1.$RUN
DB=linkdb_$RUN
DB_URL=${POLYCORN_DATABASE_URL%/*}/$DB
P=pcite
export TRAIN_ID=train-e2e
WORK=$(mktemp -d /tmp/polycorn-ite.XXXXXX)
# The failure-table signing key: the trainer signs with table-signing.key,
# the proxy verifies with table-signing.pub.
TABLE_KEY=$WORK/table-key
"$BIN/polycorn-pki" table-key --out "$TABLE_KEY" >/dev/null
INGEST_PID=""
BLACKOUT=0

cleanup() {
    ((BLACKOUT)) && blackout off 2>/dev/null
    # ingest runs in its own process group (setsid): stop all of it.
    [[ -n $INGEST_PID ]] && kill -TERM -- "-$INGEST_PID" 2>/dev/null
    PC_PREFIX=$P testbed/topology.sh down >/dev/null 2>&1 || true
    bash scripts/infra.sh wipe >/dev/null 2>&1 || true
    [[ ${KEEP_WORK:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT

kafka_topics() { bash scripts/infra.sh topics "$@"; }

# ------------------------------------------------------------------ Rust tests that need Kafka

# Every #[ignore] test of the workspace runs here (the broker tests need
# Kafka; the rest are exploration studies); the list
# is exact: a missing one, a failed one, or one not listed (a new #[ignore]
# test must be added here) fails the check (scripts/cargo_ignored_tests.py).
IGNORED_TESTS=(
    polycorn_proxy::kafka::tests::broker::records_reach_kafka_keyed_by_train_and_are_acked_after_delivery
    polycorn_proxy::kafka::tests::broker::nothing_is_acked_while_kafka_is_down_and_everything_arrives_after
    polycorn_proxy::table_topic::tests::broker::the_highest_version_wins_and_a_new_proxy_reads_it_from_the_beginning
    polycorn_proxy::table_topic::tests::broker::the_table_stays_while_kafka_is_down_and_new_ones_follow_after
    # exploration studies in virtual time (print tables, about 5 s together):
    # run so that they keep working, not as checks
    polycorn_core::testing::blackouts::print_blackout_study
    polycorn_core::testing::blackouts::print_window_update_study
    polycorn_core::testing::blackouts::print_initial_window_study
    polycorn_core::testing::hetero::print_unequal_delay_study
    polycorn_core::testing::railway::print_railway_replay
)
rust_kafka_tests() {
    local rc=0
    POLYCORN_KAFKA_STOP_CMD="bash $root/scripts/infra.sh down kafka" \
        POLYCORN_KAFKA_START_CMD="bash $root/scripts/infra.sh up kafka" \
        cargo test --workspace --locked --release --no-fail-fast -- --ignored >"$WORK/cargo-ignored.log" 2>&1 || rc=$?
    python3 scripts/cargo_ignored_tests.py "$WORK/cargo-ignored.log" --status "$rc" --expect "${IGNORED_TESTS[@]}"
}
check "the Rust tests that need a real Kafka broker (cargo test -- --ignored)" rust_kafka_tests

# ------------------------------------------------------------------ the trip

log "generating a ${TRIP_S} s trip"
"$BIN/polycorn-tracegen" generate --route-seed 2 --trip-seed 5 --duration-s "$TRIP_S" --carriers 2 \
    --out "$WORK/trip" >/dev/null
kafka_topics --create --topic "$TOPIC" --partitions 4 --replication-factor 1 >/dev/null
kafka_topics --create --topic "$DLQ" --partitions 1 --replication-factor 1 >/dev/null
kafka_topics --create --topic "$TABLES" --partitions 1 --replication-factor 1 --config cleanup.policy=compact >/dev/null
psql "${POLYCORN_DATABASE_URL%/*}/postgres" -qc "CREATE DATABASE $DB"
psql "$DB_URL" -qc "CREATE EXTENSION postgis"
PY polycorn-linkdb --url "$DB_URL" upgrade

INGEST_METRICS=127.0.0.1:${E2E_INGEST_METRICS_PORT:-9481}
setsid "$root/.venv/bin/polycorn-ingest" run --bootstrap "$POLYCORN_KAFKA_SASL_BOOTSTRAP" "${INGEST_AUTH[@]}" \
    --database-url "$DB_URL" --topic "$TOPIC" --dlq-topic "$DLQ" --group "polycorn-ingest-$RUN" \
    --metrics-addr "$INGEST_METRICS" >"$WORK/ingest.log" 2>&1 &
INGEST_PID=$!
ingest_up() {
    local i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$INGEST_PID" 2>/dev/null || { tail -20 "$WORK/ingest.log"; return 1; }
        curl -fsS -o /dev/null --max-time 1 "http://$INGEST_METRICS/metrics" && return 0
        sleep 0.2
    done
    return 1
}
ingest_up || { echo "integration-telemetry: polycorn-ingest did not start" >&2; exit 1; }
# Prometheus scrapes ingest; the last check reads ingest's metrics back from it.
cat >"$POLYCORN_PROM_TARGETS_DIR/ingest-$RUN.json" <<EOJ
[{"targets": ["$INGEST_METRICS"], "labels": {"service": "ingest"}}]
EOJ

EPOCH=$(($(date +%s%3N) + 3000))
log "topology up (epoch $EPOCH)"
PC_PREFIX=$P testbed/topology.sh up --trip "$WORK/trip" --scheme hrsch --epoch-unix-ms "$EPOCH" \
    --forward-port "$KAFKA_PORT" --forward-port "$KAFKA_SASL_PORT" \
    --relay-arg --replay-resume \
    --proxy-arg "--kafka-brokers=$POLYCORN_KAFKA_SASL_BOOTSTRAP" --proxy-arg "--kafka-topic=$TOPIC" \
    --proxy-arg "--kafka-dlq-topic=$DLQ" --proxy-arg "--failure-table-topic=$TABLES" \
    --proxy-arg "--failure-table-verify-key=$TABLE_KEY/table-signing.pub" \
    "${PROXY_AUTH[@]}" >"$WORK/topology.log"
STATE=/tmp/polycorn-state-$P

trip_t() { echo $((($(date +%s%3N) - EPOCH) / 1000)); }
until_t() { while (($(trip_t) < $1)); do sleep 0.5; done; }

# Every path of the train dark: drop everything on the carrier interfaces.
blackout() {
    local op=-I
    [[ $1 == off ]] && op=-D
    ip netns exec "$P-train" iptables "$op" OUTPUT -o car+ -j DROP
    ip netns exec "$P-train" iptables "$op" INPUT -i car+ -j DROP
}

restart_relay() {
    local pid
    pid=$(cat "$STATE/run/relay.pid")
    mapfile -d '' -t cmd <"/proc/$pid/cmdline"
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    sleep 1
    ip netns exec "$P-train" "${cmd[@]}" >>"$STATE/logs/relay.log" 2>&1 &
    echo $! >"$STATE/run/relay.pid"
}

# ingest's failed database transactions (each retried with backoff), read
# just before the PostgreSQL restart and again before the next fault: ingest
# writes a batch every few seconds, so the restart must show there.
ingest_db_errors() { PY python3 scripts/prom_metric.py "http://$INGEST_METRICS/metrics" polycorn_ingest_db_errors_total; }
DB_ERRORS_BEFORE="" DB_ERRORS_AFTER=""

s=$((TRIP_S / 10))
until_t $((s * 1)); log "fault: Kafka restart";      bash scripts/infra.sh restart kafka
until_t $((s * 3)); DB_ERRORS_BEFORE=$(ingest_db_errors) || true
log "fault: PostgreSQL restart"; bash scripts/infra.sh restart pg
until_t $((s * 4)); DB_ERRORS_AFTER=$(ingest_db_errors) || true
log "ingest's database errors: ${DB_ERRORS_BEFORE:-?} before the PostgreSQL restart, ${DB_ERRORS_AFTER:-?} after"
log "fault: relay restart";      restart_relay
until_t $((s * 5)); log "fault: every path dark for 60 s"; blackout on; BLACKOUT=1
until_t $((s * 5 + 60)); blackout off; BLACKOUT=0; log "paths back"
until_t "$TRIP_S"
log "trip over; waiting for the spool to drain and ingest to catch up"

relay_metric() { # NAME: sum of the relay's metric
    ip netns exec "$P-train" curl -fsS --max-time 2 http://127.0.0.1:9465/metrics 2>/dev/null |
        awk -v m="$1" '$1 ~ "^"m"([{]|$)" {s += $2} END {print s + 0}'
}

drained() {
    local i
    for ((i = 0; i < 240; i++)); do
        [[ $(relay_metric polycorn_telemetry_spool_records) == 0 ]] && return 0
        sleep 0.5
    done
    echo "spool still holds $(relay_metric polycorn_telemetry_spool_records) records"
    return 1
}
check "the relay's spool drains after the faults (every record confirmed by the proxy after Kafka)" drained

# ingest has caught up when the row counts stop changing and its lag is 0.
caught_up() {
    local i last="" now
    for ((i = 0; i < 120; i++)); do
        now=$(psql "$DB_URL" -Atc "select (select count(*) from handovers), (select count(*) from gps_fixes)")
        [[ $now == "$last" && $now != "0|0" ]] && return 0
        last=$now
        sleep 2
    done
    return 1
}
check "ingest catches up" caught_up

# Every handover_end and GPS fix of the trip's log in LinkDB once, nothing
# else (scripts/trip_exactly_once.py; scripts/test-compose.sh uses it too).
exactly_once() {
    psql "$DB_URL" -Atc "select carrier, (extract(epoch from start_time) * 1000)::bigint
        from handovers where train_id = '$TRAIN_ID'" >"$WORK/handovers.rows"
    psql "$DB_URL" -Atc "select (extract(epoch from time) * 1000)::bigint
        from gps_fixes where train_id = '$TRAIN_ID'" >"$WORK/gps_fixes.rows"
    python3 scripts/trip_exactly_once.py "$WORK/trip/events.jsonl" "$EPOCH" "$WORK/handovers.rows" "$WORK/gps_fixes.rows"
}
check "every handover event and GPS fix of the trip is in LinkDB exactly once" exactly_once

no_dead_letters() {
    local n
    n=$(PY python3 -c "
from confluent_kafka import Consumer, TopicPartition
c = Consumer({'bootstrap.servers': '$POLYCORN_KAFKA_BOOTSTRAP', 'group.id': 'dlqcheck-$RUN'})
lo, hi = c.get_watermark_offsets(TopicPartition('$DLQ', 0), timeout=10)
print(hi - lo)")
    [[ $n == 0 ]] && return 0
    echo "$n dead letters; reasons:"
    PY python3 -c "
from collections import Counter
from confluent_kafka import Consumer
c = Consumer({'bootstrap.servers': '$POLYCORN_KAFKA_BOOTSTRAP', 'group.id': 'dlqread-$RUN', 'auto.offset.reset': 'earliest'})
c.subscribe(['$DLQ'])
seen = Counter()
for m in c.consume(num_messages=1000, timeout=10):
    if m.error() is None:
        seen[dict(m.headers() or []).get('polycorn-error', b'?').decode()] += 1
for r, k in seen.most_common(10):
    print(f'  {k} x {r}')"
    return 1
}
check "no telemetry record went to the dead-letter topic" no_dead_letters

faults_bit() {
    # The faults were real: the relay resent records, and ingest's count of
    # failed (retried) database transactions rose across the PostgreSQL
    # restart, and ingest is still running.
    local resent
    resent=$(relay_metric polycorn_telemetry_spool_resent_total)
    ((resent > 0)) || { echo "relay resent nothing"; return 1; }
    kill -0 "$INGEST_PID" || { echo "ingest died"; tail -20 "$WORK/ingest.log"; return 1; }
    [[ -n $DB_ERRORS_BEFORE && -n $DB_ERRORS_AFTER ]] ||
        { echo "could not read polycorn_ingest_db_errors_total from ingest's /metrics around the PostgreSQL restart"; return 1; }
    ((DB_ERRORS_AFTER > DB_ERRORS_BEFORE)) || {
        echo "ingest never noticed the PostgreSQL restart: polycorn_ingest_db_errors_total $DB_ERRORS_BEFORE before, $DB_ERRORS_AFTER after"
        return 1
    }
    echo "  ingest: $((DB_ERRORS_AFTER - DB_ERRORS_BEFORE)) failed database transactions retried across the PostgreSQL restart"
}
check "the faults really happened (relay resends, ingest noticed the database restart and survived)" faults_bit

proxy_metric() { # NAME: sum of the proxy's metric
    ip netns exec "$P-cloud" curl -fsS --max-time 2 http://127.0.0.1:9464/metrics 2>/dev/null |
        awk -v m="$1" '$1 ~ "^"m"([{]|$)" {s += $2} END {printf "%d", s + 0}'
}

learned_table_reaches_the_proxy() {
    # The trainer learns from what this trip put into LinkDB and publishes to
    # the compacted topic that the running proxy follows, signed. One trip
    # has no history to validate against and few failures per cell, so any
    # failure enters the table here (--min-failures 1).
    "$root/.venv/bin/polycorn-trainer" --log-level WARNING run --once --database-url "$DB_URL" \
        --bootstrap "$POLYCORN_KAFKA_SASL_BOOTSTRAP" "${TRAINER_AUTH[@]}" --topic "$TABLES" --min-failures 1 --min-failure-rate 0 \
        --table-signing-key "$TABLE_KEY/table-signing.key" \
        --summary-json "$WORK/trainer.json" 2>"$WORK/trainer.log" || { tail -5 "$WORK/trainer.log"; return 1; }
    local v i
    v=$(jq -r '.table.version // empty' "$WORK/trainer.json")
    [[ -n $v ]] || { echo "the trainer published no table: $(jq -c '{cells, handovers, table}' "$WORK/trainer.json")"; return 1; }
    echo "trainer: model $(jq -r .model_id "$WORK/trainer.json"), table v$v with $(jq -r .table.entries "$WORK/trainer.json") entries"
    # At most 90 s: the proxy's table consumer may still be backing off
    # from the broker restart above, longer on a loaded machine (a 30 s
    # bound failed once beside a running benchmark).
    for ((i = 0; i < 180; i++)); do
        (($(proxy_metric polycorn_failure_table_version) == v)) && break
        sleep 0.5
    done
    if (($(proxy_metric polycorn_failure_table_version) != v)); then
        echo "the proxy never loaded table v$v within 90 s; its last table lines:"
        grep -i "table" "$STATE/logs/proxy.log" | tail -5
        return 1
    fi
    echo "proxy: table v$v from Kafka after about $((i / 2)) s"
    # Whoever can write the topic (here the PLAINTEXT listener's super user)
    # tries tables of their own: signed with another key, unsigned, with the
    # trainer's signature of another table (each refused, reason=signature),
    # malformed but signed by the trainer (reason=malformed); v stays each
    # time, and a table the trainer's key signs is still taken.
    PY python3 scripts/signed_tables.py --bootstrap "$POLYCORN_KAFKA_BOOTSTRAP" --topic "$TABLES" \
        --signing-key "$TABLE_KEY/table-signing.key" --verify-key "$TABLE_KEY/table-signing.pub" \
        --metrics-cmd "ip netns exec $P-cloud curl -fsS --max-time 2 http://127.0.0.1:9464/metrics"
}
check "the trainer learns from the trip and signs its table; the running proxy with a verify key hot-reloads it from Kafka and refuses tables signed otherwise, unsigned or malformed" learned_table_reaches_the_proxy

prometheus_scraped_ingest() {
    # The real Prometheus scraped ingest's metrics: rows written and the
    # consumer lag, by the names the dashboards will use.
    local q n i
    for ((i = 0; i < 30; i++)); do
        q=$(curl -fsS "$POLYCORN_PROMETHEUS_URL/api/v1/query" \
            --data-urlencode 'query=sum(polycorn_ingest_rows_written_total{service="ingest"})' 2>/dev/null || true)
        n=$(jq -r '.data.result[0].value[1] // 0' <<<"$q" 2>/dev/null || echo 0)
        if [[ ${n%.*} -gt 0 ]]; then
            q=$(curl -fsS "$POLYCORN_PROMETHEUS_URL/api/v1/query" --data-urlencode 'query=polycorn_ingest_consumer_lag')
            jq -e '.data.result | length > 0' <<<"$q" >/dev/null && { echo "Prometheus: ingest wrote $n rows"; return 0; }
        fi
        sleep 1
    done
    echo "Prometheus never saw ingest's rows: $q"
    return 1
}
check "Prometheus scrapes ingest's metrics (rows written, consumer lag)" prometheus_scraped_ingest

# The alert rules and the dashboards name only metrics that the running
# services export, and the dashboards' LinkDB queries run on this trip's
# LinkDB (scripts/check_observability.py). linkdb-api and a serving trainer
# are started here, on this trip's database, just for their /metrics.
observability_matches_the_services() {
    local dumps=$WORK/metrics api=127.0.0.1:${E2E_API_PORT:-18491} trainer=127.0.0.1:${E2E_TRAINER_METRICS_PORT:-9482}
    local api_pid trainer_pid i rc=0
    mkdir -p "$dumps"
    ip netns exec "$P-train" curl -fsS --max-time 5 http://127.0.0.1:9465/metrics >"$dumps/relay.prom" || rc=1
    ip netns exec "$P-cloud" curl -fsS --max-time 5 http://127.0.0.1:9464/metrics >"$dumps/proxy.prom" || rc=1
    curl -fsS --max-time 5 "http://$INGEST_METRICS/metrics" >"$dumps/ingest.prom" || rc=1
    POLYCORN_DATABASE_URL=$DB_URL "$root/.venv/bin/polycorn-linkdb-api" serve --host "${api%:*}" --port "${api##*:}" \
        --no-access-log >"$WORK/api.log" 2>&1 &
    api_pid=$!
    "$root/.venv/bin/polycorn-trainer" --log-level WARNING run --interval-s 3600 --no-publish --database-url "$DB_URL" \
        --min-failures 1 --min-failure-rate 0 --metrics-addr "$trainer" >"$WORK/trainer-serve.log" 2>&1 &
    trainer_pid=$!
    for ((i = 0; i < 240; i++)); do
        curl -fsS -o /dev/null --max-time 1 "http://$api/readyz" 2>/dev/null &&
            curl -fsS --max-time 1 "http://$trainer/metrics" 2>/dev/null | grep -q '^polycorn_trainer_runs_total{' && break
        sleep 0.5
    done
    # A few requests, so that the request histogram has samples (and labels).
    curl -sS -o /dev/null "http://$api/healthz"
    curl -sS -o /dev/null "http://$api/v1/trains"
    curl -fsS --max-time 5 "http://$api/metrics" >"$dumps/linkdb-api.prom" || rc=1
    curl -fsS --max-time 5 "http://$trainer/metrics" >"$dumps/trainer.prom" || rc=1
    kill -TERM "$api_pid" "$trainer_pid" 2>/dev/null
    wait "$api_pid" "$trainer_pid" 2>/dev/null
    ((rc == 0)) || { echo "could not scrape every service: $(ls "$dumps")"; tail -5 "$WORK/api.log" "$WORK/trainer-serve.log"; return 1; }
    PY python3 scripts/check_observability.py metrics --rules services/prometheus/rules/*.yml \
        --dashboards dashboards/*.json --exposition "$dumps"/*.prom || rc=1
    PY python3 scripts/check_observability.py sql --database-url "$DB_URL" --expect-rows "Handover failures" \
        --expect-rows "Handovers and failures per hour" --expect-rows "Models and their tables" dashboards/*.json || rc=1
    # The offline check (scripts/validate-observability.sh) tests the rules
    # and dashboards against committed dumps: they must have the families
    # (names, types) the services export now, or that check is stale.
    if [[ ${OBSERVABILITY_UPDATE_FIXTURES:-0} == 1 ]]; then
        cp "$dumps"/*.prom services/prometheus/tests/metrics/
        echo "refreshed services/prometheus/tests/metrics/ from the running services"
    fi
    PY python3 scripts/check_observability.py families --committed services/prometheus/tests/metrics \
        --refresh "OBSERVABILITY_UPDATE_FIXTURES=1 bash scripts/integration-telemetry.sh" "$dumps"/*.prom || rc=1
    return "$rc"
}
check "the alert rules and dashboards use only metrics the running services export; the dashboards' SQL runs on LinkDB; the committed dumps are current" \
    observability_matches_the_services

echo
echo "integration-telemetry: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
