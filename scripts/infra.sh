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
# POLYCORN_PG_PORT (25432), POLYCORN_KAFKA_PORT (29092 PLAINTEXT; controller
# +1; SASL_SSL +2), POLYCORN_PROM_PORT (29090). Exports for clients:
#   POLYCORN_DATABASE_URL=postgresql://postgres@127.0.0.1:25432/linkdb
#   POLYCORN_KAFKA_BOOTSTRAP=127.0.0.1:29092
#   POLYCORN_PROMETHEUS_URL=http://127.0.0.1:29090
#   POLYCORN_PROM_TARGETS_DIR=<state>/prom/targets
# and for the authenticated paths (docs/security.md):
#   POLYCORN_INFRA_TLS_CA=<state>/tls/ca.crt     signs the servers' certificates
#                                                (localhost, 127.0.0.1)
#   POLYCORN_KAFKA_SASL_BOOTSTRAP=127.0.0.1:29094 SASL_SSL, SCRAM-SHA-512, ACLs
#                                                of services/kafka/acls.txt
#   POLYCORN_KAFKA_USERS_DIR=<state>/kafka/users  <user>.password of proxy,
#                                                ingest and trainer
# PostgreSQL takes TLS too (ssl=on, the same certificate): sslmode=verify-full
# with sslrootcert=$POLYCORN_INFRA_TLS_CA.
# LinkDB's roles (migration 0010) are made by the migrations; the tests log
# in as each service's own login, made on demand with no password (the
# cluster trusts local logins): polycorn_schema.testing.service_url.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${POLYCORN_INFRA_DIR:-/tmp/polycorn-infra}
PG_PORT=${POLYCORN_PG_PORT:-25432}
KAFKA_PORT=${POLYCORN_KAFKA_PORT:-29092}
KAFKA_CTRL_PORT=$((KAFKA_PORT + 1))
KAFKA_SASL_PORT=$((KAFKA_PORT + 2))
KAFKA_USERS=(proxy ingest trainer)
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
    for p in "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CTRL_PORT" "$KAFKA_SASL_PORT" "$PROM_PORT"; do
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

# ---------------------------------------------------------------- TLS

# A test CA and one server certificate (localhost, 127.0.0.1) for Kafka's
# SASL_SSL listener and PostgreSQL; made once per state directory.
tls_up() {
    local d=$STATE/tls
    [[ -f $d/kafka.pem ]] && return 0
    command -v openssl >/dev/null || die "openssl missing: run make setup"
    mkdir -p "$d"
    (
        umask 077
        openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" -days 3650 \
            -subj "/CN=Polycorn infra test CA" -addext basicConstraints=critical,CA:TRUE \
            -addext keyUsage=critical,keyCertSign,cRLSign
        openssl req -newkey rsa:2048 -nodes -keyout "$d/server.key" -out "$d/server.csr" -subj /CN=localhost
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
        openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 825 \
            -extfile "$d/server.ext" -out "$d/server.crt"
        cat "$d/server.key" "$d/server.crt" >"$d/kafka.pem.tmp" && mv "$d/kafka.pem.tmp" "$d/kafka.pem"
    ) >"$STATE/tls.log" 2>&1 || { cat "$STATE/tls.log" >&2; die "making the TLS certificates failed"; }
    chmod 644 "$d/ca.crt" "$d/server.crt"
    log "TLS: CA $d/ca.crt, server certificate for localhost and 127.0.0.1"
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
    # TLS with the infra CA's server certificate (plain connections stay
    # allowed); a server started before without it is restarted once.
    tls_up
    install -o postgres -g postgres -m 600 "$STATE/tls/server.key" "$STATE/pg/server.key"
    install -o postgres -g postgres -m 644 "$STATE/tls/server.crt" "$STATE/pg/server.crt"
    if pg_running && [[ $(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -Atc 'show ssl' 2>/dev/null) != on ]]; then
        log "restarting PostgreSQL with TLS"
        pg_down
    fi
    if ! pg_running; then
        su postgres -c "$PGBIN/pg_ctl -D $STATE/pg/data -l $STATE/pg/pg.log -o '-p $PG_PORT -k $STATE/pg -c ssl=on -c ssl_cert_file=$STATE/pg/server.crt -c ssl_key_file=$STATE/pg/server.key' -w -t 60 start" >/dev/null \
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
    ready --timeout-s 60 pg --url "postgresql://postgres@127.0.0.1:$PG_PORT/linkdb?sslmode=verify-full&sslrootcert=$STATE/tls/ca.crt"
    log "PostgreSQL + PostGIS on 127.0.0.1:$PG_PORT (database linkdb; TLS with $STATE/tls/ca.crt)"
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
    local conf=$STATE/kafka/server.properties users=$STATE/kafka/users u
    tls_up
    sed -e "s|@PORT@|$KAFKA_PORT|g" -e "s|@CONTROLLER_PORT@|$KAFKA_CTRL_PORT|g" -e "s|@DATA@|$STATE/kafka/data|g" \
        -e "s|@SASL_PORT@|$KAFKA_SASL_PORT|g" -e "s|@TLS@|$STATE/tls|g" \
        "$ROOT/services/kafka/server.properties.in" >"$conf"
    # A random password per SCRAM user, kept with the broker's data.
    mkdir -p "$users" && chmod 700 "$users"
    for u in "${KAFKA_USERS[@]}"; do
        [[ -s $users/$u.password ]] || (umask 077 && openssl rand -hex 24 >"$users/$u.password")
    done
    if [[ ! -f $STATE/kafka/data/meta.properties ]]; then
        # The users exist from the first start (KRaft: SCRAM credentials in
        # the bootstrap metadata); a broker formatted before gets them from
        # kafka_acl below.
        local scram=()
        for u in "${KAFKA_USERS[@]}"; do
            scram+=(--add-scram "SCRAM-SHA-512=[name=$u,password=$(<"$users/$u.password")]")
        done
        kafka_java kafka.tools.StorageTool format -t "$(kafka_java kafka.tools.StorageTool random-uuid)" -c "$conf" \
            "${scram[@]}" >"$STATE/kafka/format.log" 2>&1 \
            || { cat "$STATE/kafka/format.log" >&2; die "Kafka storage format failed"; }
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
    # The users' credentials and ACLs (services/kafka/acls.txt), then every
    # user logs in over SASL_SSL: polycorn_schema.kafka_acl.
    uv run --project "$ROOT" --all-packages --locked --quiet python -m polycorn_schema.kafka_acl \
        --bootstrap "127.0.0.1:$KAFKA_PORT" --acls-file "$ROOT/services/kafka/acls.txt" --users-dir "$users" \
        --check-bootstrap "127.0.0.1:$KAFKA_SASL_PORT" --check-ca "$STATE/tls/ca.crt" \
        || die "Kafka's users and ACLs could not be set (polycorn_schema.kafka_acl)"
    log "Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (PLAINTEXT), 127.0.0.1:$KAFKA_SASL_PORT (SASL_SSL: ${KAFKA_USERS[*]})"
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
export POLYCORN_INFRA_TLS_CA=$STATE/tls/ca.crt
export POLYCORN_KAFKA_SASL_BOOTSTRAP=127.0.0.1:$KAFKA_SASL_PORT
export POLYCORN_KAFKA_USERS_DIR=$STATE/kafka/users
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
# Starting and stopping take the state directory's lock: test stages that run
# side by side may both ask for the same servers, and the second must find
# them started rather than start them again.
# The servers started meanwhile inherit the descriptor, so the lock is
# released explicitly, on any exit, rather than by closing it.
lock_state() {
    mkdir -p "$STATE"
    exec 9>"$STATE/.lock"
    flock 9
    trap 'flock -u 9' EXIT
}

case $cmd in
    up | start)
        lock_state
        ephemeral_warn
        for s in $(services "$@"); do "${s}_up"; done
        ;;
    down | stop) lock_state; for s in $(services "$@"); do "${s}_down"; done ;;
    restart) lock_state; for s in $(services "$@"); do "${s}_down"; "${s}_up"; done ;;
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
