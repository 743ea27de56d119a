#!/usr/bin/env bash
# The fleet's third-party services on loopback, for tests, benchmarks and the
# demo: PostgreSQL 15 + PostGIS (LinkDB), Kafka 4.3 (KRaft, one node) and
# Prometheus. Installed by `make setup` (scripts/setup.sh, component infra).
#
#   scripts/infra.sh up [pg] [kafka] [prom]     start (default: all); idempotent
#   scripts/infra.sh down [pg] [kafka] [prom]   stop (default: all); data kept
#   scripts/infra.sh restart pg|kafka|prom      stop then start (fault-injection tests)
#   scripts/infra.sh status
#   scripts/infra.sh env                        print the exports below
#   scripts/infra.sh wipe                       stop everything and delete all data
#   scripts/infra.sh topics ARGS...             kafka-topics on this broker (e.g. --create --topic T
#                                               --partitions 4 --replication-factor 1)
#
# State lives in $POLYCORN_INFRA_DIR (default /tmp/polycorn-infra). Ports:
# POLYCORN_PG_PORT (25432), POLYCORN_KAFKA_PORT (29092; controller +1),
# POLYCORN_PROM_PORT (29090). Exports for clients:
#   POLYCORN_DATABASE_URL=postgresql://postgres@127.0.0.1:25432/linkdb
#   POLYCORN_KAFKA_BOOTSTRAP=127.0.0.1:29092
#   POLYCORN_PROMETHEUS_URL=http://127.0.0.1:29090
#   POLYCORN_PROM_TARGETS_DIR=<state>/prom/targets
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${POLYCORN_INFRA_DIR:-/tmp/polycorn-infra}
PG_PORT=${POLYCORN_PG_PORT:-25432}
KAFKA_PORT=${POLYCORN_KAFKA_PORT:-29092}
KAFKA_CTRL_PORT=$((KAFKA_PORT + 1))
PROM_PORT=${POLYCORN_PROM_PORT:-29090}
# The defaults (and every script's private instance) sit below Linux's
# ephemeral range (ip_local_port_range, 32768-60999 by default): a server
# port inside it can be taken by any outgoing connection's source port
# (including a client's self-connect while it waits for the broker), and the
# server then fails to bind at random. One CI run met exactly that (Kafka on
# 59122, "Address already in use").
ephemeral_warn() {
    local lo hi p
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || return 0
    for p in "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CTRL_PORT" "$PROM_PORT"; do
        if ((p >= lo && p <= hi)); then
            echo "infra: WARNING: port $p is in the ephemeral range $lo-$hi; a server may fail to bind at random" >&2
        fi
    done
}
KAFKA_VERSION=$(sed -n 's/^KAFKA_VERSION=//p' "$ROOT/scripts/setup.sh")
KAFKA_LIBS="${POLYCORN_CACHE:-/var/cache/polycorn}/kafka-$KAFKA_VERSION/libs"
PGBIN=/usr/lib/postgresql/15/bin

log() { printf 'infra: %s\n' "$*" >&2; }
die() { printf 'infra: ERROR: %s\n' "$*" >&2; exit 1; }

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Waits (bounded, with a clear message) until a server does what the project
# needs of it: python -m polycorn_schema.startup in the workspace's venv.
ready() {
    command -v uv >/dev/null || die "uv missing: run make setup"
    uv run --project "$ROOT" --all-packages --locked --quiet python -m polycorn_schema.startup "$@" \
        || die "not ready: python -m polycorn_schema.startup $*"
}

# ---------------------------------------------------------------- PostgreSQL

pg_running() { su postgres -c "$PGBIN/pg_ctl -D $STATE/pg/data status" >/dev/null 2>&1; }

pg_up() {
    [[ -x $PGBIN/postgres ]] || die "PostgreSQL 15 missing: run make setup"
    mkdir -p "$STATE/pg"
    chown postgres:postgres "$STATE/pg"
    chmod 755 "$STATE"
    if [[ ! -f $STATE/pg/data/PG_VERSION ]]; then
        log "initdb $STATE/pg/data"
        su postgres -c "$PGBIN/initdb -D $STATE/pg/data -A trust -U postgres -E UTF8 --locale=C.UTF-8" >"$STATE/pg/initdb.log"
        cat "$ROOT/services/postgis/postgresql.conf" >>"$STATE/pg/data/postgresql.conf"
    fi
    if ! pg_running; then
        su postgres -c "$PGBIN/pg_ctl -D $STATE/pg/data -l $STATE/pg/pg.log -o '-p $PG_PORT -k $STATE/pg' -w -t 60 start" >/dev/null \
            || { tail -20 "$STATE/pg/pg.log" >&2; die "PostgreSQL did not start"; }
    fi
    # pg_ctl -w returns once the server accepts connections; a query is the proof.
    ready --timeout-s 60 pg --url "postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
    if [[ -z $(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -Atc "select 1 from pg_database where datname='linkdb'") ]]; then
        psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qc 'create database linkdb'
    fi
    PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d linkdb -v ON_ERROR_STOP=1 \
        -qc 'create extension if not exists postgis' \
        || die "PostGIS could not be enabled in database linkdb"
    ready --timeout-s 60 pg --url "postgresql://postgres@127.0.0.1:$PG_PORT/linkdb" --postgis
    log "PostgreSQL + PostGIS on 127.0.0.1:$PG_PORT (database linkdb)"
}

pg_down() {
    if pg_running; then
        su postgres -c "$PGBIN/pg_ctl -D $STATE/pg/data -m fast -w stop" >/dev/null
        log "PostgreSQL stopped"
    fi
}

# ---------------------------------------------------------------- Kafka

kafka_java() {
    java -Xms256m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$ROOT/services/kafka/log4j2.properties" \
        -cp "$KAFKA_LIBS/*" "$@"
}

kafka_topic_cmd() { kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" "$@"; }

kafka_up() {
    [[ -f $KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar ]] || die "Kafka jars missing in $KAFKA_LIBS: run make setup"
    mkdir -p "$STATE/kafka"
    local conf=$STATE/kafka/server.properties
    sed -e "s|@PORT@|$KAFKA_PORT|g" -e "s|@CONTROLLER_PORT@|$KAFKA_CTRL_PORT|g" -e "s|@DATA@|$STATE/kafka/data|g" \
        "$ROOT/services/kafka/server.properties.in" >"$conf"
    if [[ ! -f $STATE/kafka/data/meta.properties ]]; then
        kafka_java kafka.tools.StorageTool format -t "$(kafka_java kafka.tools.StorageTool random-uuid)" -c "$conf" \
            >"$STATE/kafka/format.log" 2>&1 || { cat "$STATE/kafka/format.log" >&2; die "Kafka storage format failed"; }
    fi
    if ! pid_alive "$STATE/kafka/pid"; then
        : >"$STATE/kafka/kafka.log"
        (setsid java -Xms256m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$ROOT/services/kafka/log4j2.properties" \
            -cp "$KAFKA_LIBS/*" kafka.Kafka "$conf" >>"$STATE/kafka/kafka.log" 2>&1 &
            echo $! >"$STATE/kafka/pid")
        local i
        for ((i = 0; i < 300; i++)); do
            grep -q 'Kafka Server started' "$STATE/kafka/kafka.log" && break
            pid_alive "$STATE/kafka/pid" || { tail -30 "$STATE/kafka/kafka.log" >&2; die "Kafka exited at start"; }
            sleep 0.2
        done
        grep -q 'Kafka Server started' "$STATE/kafka/kafka.log" || die "Kafka not started after 60 s (see $STATE/kafka/kafka.log)"
    fi
    # "Kafka Server started" comes before the group coordinator answers: a
    # fresh broker says NOT_COORDINATOR for a while. Ready means the project's
    # topics have leaders and a consumer group commits an offset on every
    # partition of __consumer_offsets (polycorn_schema.startup).
    ready kafka --bootstrap "127.0.0.1:$KAFKA_PORT" --topics-file "$ROOT/services/kafka/topics.txt"
    log "Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT"
}

kafka_down() {
    if pid_alive "$STATE/kafka/pid"; then
        local pid i
        pid=$(cat "$STATE/kafka/pid")
        kill -TERM "$pid"
        for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        log "Kafka stopped"
    fi
    rm -f "$STATE/kafka/pid"
}

# ---------------------------------------------------------------- Prometheus

prom_up() {
    command -v prometheus >/dev/null || die "prometheus missing: run make setup"
    mkdir -p "$STATE/prom/targets" "$STATE/prom/data"
    sed "s|@STATE@|$STATE/prom|g" "$ROOT/services/prometheus/prometheus.yml.in" >"$STATE/prom/prometheus.yml"
    if ! pid_alive "$STATE/prom/pid"; then
        (setsid prometheus --config.file="$STATE/prom/prometheus.yml" --storage.tsdb.path="$STATE/prom/data" \
            --web.listen-address="127.0.0.1:$PROM_PORT" --web.enable-lifecycle \
            >"$STATE/prom/prom.log" 2>&1 &
            echo $! >"$STATE/prom/pid")
    fi
    ready --timeout-s 60 http --url "http://127.0.0.1:$PROM_PORT/-/ready"
    log "Prometheus on 127.0.0.1:$PROM_PORT (targets: $STATE/prom/targets/*.json)"
}

prom_down() {
    if pid_alive "$STATE/prom/pid"; then
        kill -TERM "$(cat "$STATE/prom/pid")"
        log "Prometheus stopped"
    fi
    rm -f "$STATE/prom/pid"
}

# ---------------------------------------------------------------- main

print_env() {
    cat <<EOV
export POLYCORN_DATABASE_URL=postgresql://postgres@127.0.0.1:$PG_PORT/linkdb
export POLYCORN_KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT
export POLYCORN_PROMETHEUS_URL=http://127.0.0.1:$PROM_PORT
export POLYCORN_PROM_TARGETS_DIR=$STATE/prom/targets
EOV
}

services() { # the named services, or all
    local s
    (($#)) || set -- pg kafka prom
    for s in "$@"; do
        case $s in pg | kafka | prom) echo "$s" ;; *) die "unknown service '$s' (pg, kafka, prom)" ;; esac
    done
}

cmd=${1:-}
shift || true
case $cmd in
    up | start)
        ephemeral_warn
        for s in $(services "$@"); do "${s}_up"; done
        ;;
    down | stop) for s in $(services "$@"); do "${s}_down"; done ;;
    restart) for s in $(services "$@"); do "${s}_down"; "${s}_up"; done ;;
    status)
        pg_running && echo "pg: running" || echo "pg: stopped"
        pid_alive "$STATE/kafka/pid" && echo "kafka: running" || echo "kafka: stopped"
        pid_alive "$STATE/prom/pid" && echo "prom: running" || echo "prom: stopped"
        ;;
    env) print_env ;;
    wipe) for s in pg kafka prom; do "${s}_down"; done; rm -rf "$STATE" ;;
    topics) kafka_topic_cmd "$@" 2>/dev/null ;;
    *) die "usage: $0 up|down|restart|status|env|wipe [pg] [kafka] [prom] | topics ARGS..." ;;
esac
