#!/usr/bin/env bash
# The official postgres image's first-start behaviour, reduced to what the
# compose testbed uses: initdb with POSTGRES_USER/POSTGRES_PASSWORD, create
# POSTGRES_DB with the postgis extension, then postgres in the foreground
# listening on every address with password authentication.
set -euo pipefail
if [[ $(id -u) == 0 ]]; then
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres} db=${POSTGRES_DB:-${POSTGRES_USER:-postgres}}
if [[ ! -s $PGDATA/PG_VERSION ]]; then
    [[ -n ${POSTGRES_PASSWORD:-} ]] || { echo "postgis: set POSTGRES_PASSWORD" >&2; exit 2; }
    pw=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
    # UTF8 as in the official image (the default here would be SQL_ASCII,
    # which psycopg answers with bytes).
    initdb -D "$PGDATA" -U "$user" -E UTF8 --locale=C.UTF-8 --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pw"
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [[ $db != postgres ]]; then
        psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -qc "CREATE DATABASE \"$db\""
    fi
    psql -v ON_ERROR_STOP=1 -U "$user" -d "$db" -qc "CREATE EXTENSION IF NOT EXISTS postgis"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "postgis: cluster initialised (database $db, user $user)"
fi
if [[ ${1:-} == postgres ]]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
