"""LinkDB's database roles (migration 0010) against the real PostgreSQL: each
service's role may do its service's statements and nothing else. Every
refusal is PostgreSQL's own (InsufficientPrivilege), not a check of ours."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pgerr
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc

from polycorn_schema.linkdb import cli
from polycorn_schema.linkdb.cli import sqlalchemy_url
from polycorn_schema.linkdb.partitions import (
    ensure_month_partitions,
    month_start,
    next_month,
    partition_name,
)
from polycorn_schema.testing import fresh_database, service_url

T = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC)
LEARNED = ("models", "cell_models", "failure_tables")
TELEMETRY = (
    "trains",
    "trips",
    "gps_fixes",
    "signal_samples",
    "path_stats",
    "handovers",
    "cells",
    "routes",
    "route_tracks",
    "route_segments",
)
# A table as the trainer publishes one (store.py): model, then table.
PUBLISH = [
    "INSERT INTO models (trainer_version, params, cells_fitted, handovers_used, validation) "
    "VALUES ('test', '{}', 0, 0, '{}')",
    "INSERT INTO failure_tables (version, model_id, etag, entries, body, note, body_bytes) "
    "VALUES (1, (SELECT max(id) FROM models), 'e', 0, '{}', '', '\\x7b7d')",
    "UPDATE failure_tables SET signature = 'sig' WHERE version = 1",
]


@pytest.fixture(scope="module")
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_roles") as url:
        yield url


def refused(url: str, sql: str) -> None:
    with psycopg.connect(url) as c, pytest.raises(pgerr.InsufficientPrivilege):
        c.execute(sql)


# A column of each table, for an UPDATE.
COLUMN = {
    "failure_tables": "version",
    "cell_models": "model_id",
    "route_tracks": "route_id",
    "route_segments": "route_id",
    "gps_fixes": "train_id",
    "signal_samples": "train_id",
    "path_stats": "train_id",
}


def writes(table: str) -> list[str]:
    return [
        f"INSERT INTO {table} DEFAULT VALUES",
        f"UPDATE {table} SET {COLUMN.get(table, 'id')} = NULL",
        f"DELETE FROM {table}",
        f"TRUNCATE {table}",
    ]


def test_ingest_writes_telemetry_and_cannot_touch_models_or_tables(db: str) -> None:
    url = service_url(db, "ingest")
    with psycopg.connect(url) as c:
        c.execute(
            "INSERT INTO trains (id, source, first_seen, last_seen) "
            "VALUES ('t1', 'telemetry', now(), now())"
        )
        c.execute(
            "INSERT INTO gps_fixes (train_id, time, geog) VALUES "
            "('t1', %s, ST_GeogFromText('POINT(116.3 39.8)'))",
            (T,),
        )
    for sql in PUBLISH:
        refused(url, sql)
    for table in LEARNED:
        for sql in writes(table):
            refused(url, sql)
    refused(url, "CREATE TABLE planted (x int)")
    refused(url, "ALTER TABLE gps_fixes DETACH PARTITION gps_fixes_default")


def test_ingest_makes_month_partitions_through_the_function_only(db: str) -> None:
    url = service_url(db, "ingest")
    # Next month: inside ingest's window whenever the test runs.
    month = next_month(month_start(dt.datetime.now(dt.UTC)))
    at, name = month + dt.timedelta(days=1), partition_name("gps_fixes", month)
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO gps_fixes (train_id, time, geog) VALUES "
                    "('t1', :t, ST_GeogFromText('POINT(116.3 39.8)'))"
                ),
                {"t": at},
            )
        with engine.begin() as conn:
            created = ensure_month_partitions(conn, [at])
        assert name in created
        with engine.begin() as conn:
            # The new partition has its parent's privileges, not more.
            conn.execute(text(f"INSERT INTO {name} SELECT * FROM gps_fixes LIMIT 0"))
            where = conn.execute(
                text("SELECT tableoid::regclass::text FROM gps_fixes WHERE time = :t"),
                {"t": at},
            ).scalar_one()
        assert where == name
        with (
            engine.begin() as conn,
            pytest.raises(sa_exc.DBAPIError, match="not a partitioned LinkDB table"),
        ):
            conn.execute(text("SELECT linkdb_ensure_month_partition('failure_tables', now())"))
    finally:
        engine.dispose()
    with psycopg.connect(url) as c, pytest.raises(pgerr.InvalidParameterValue, match="window"):
        c.execute("SELECT linkdb_ensure_month_partition('gps_fixes', now() + interval '5 years')")
    refused(service_url(db, "api"), f"SELECT linkdb_ensure_month_partition('gps_fixes', '{T}')")
    refused(service_url(db, "trainer"), f"SELECT linkdb_ensure_month_partition('gps_fixes', '{T}')")


def test_the_api_role_reads_everything_and_writes_nothing(db: str) -> None:
    url = service_url(db, "api")
    with psycopg.connect(url) as c:
        for table in (*TELEMETRY, *LEARNED):
            c.execute(f"SELECT count(*) FROM {table}")
    for table in (*TELEMETRY, *LEARNED):
        for sql in writes(table):
            refused(url, sql)
    for sql in PUBLISH:
        refused(url, sql)
    refused(url, "CREATE TABLE planted (x int)")


def test_the_trainer_publishes_and_cannot_write_telemetry(db: str) -> None:
    url = service_url(db, "trainer")
    with psycopg.connect(url) as c:
        for sql in PUBLISH:
            c.execute(sql)
        assert c.execute("SELECT signature FROM failure_tables").fetchone() == ("sig",)
    for table in TELEMETRY:
        for sql in writes(table):
            refused(url, sql)
    refused(url, "CREATE TABLE planted (x int)")


def test_the_owner_owns_every_linkdb_object(db: str) -> None:
    with psycopg.connect(db) as c:
        others = c.execute(
            "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
            "AND c.relkind IN ('r', 'p') AND c.relname <> 'spatial_ref_sys' "
            "AND pg_get_userbyid(c.relowner) <> 'linkdb_owner'"
        ).fetchall()
    assert others == []


def test_login_makes_a_member_with_a_scram_verifier_only(db: str, tmp_path: Path) -> None:
    name = f"polycorn_test_login_{secrets.token_hex(3)}"
    pw = tmp_path / "pw"
    pw.write_text("s3cret-not-in-the-catalogue\n")
    try:
        assert (
            cli.main(
                ["--url", db, "login", name, "--role", "linkdb_ingest", "--password-file", str(pw)]
            )
            == 0
        )
        # Again: an update (a new password), not an error.
        assert (
            cli.main(
                ["--url", db, "login", name, "--role", "linkdb_ingest", "--password-file", str(pw)]
            )
            == 0
        )
        with psycopg.connect(db) as c:
            stored, member = c.execute(
                "SELECT rolpassword, pg_has_role(rolname, 'linkdb_ingest', 'MEMBER') "
                "FROM pg_authid WHERE rolname = %s",
                (name,),
            ).fetchone() or (None, None)
        assert stored is not None and stored.startswith("SCRAM-SHA-256$")
        assert "s3cret" not in stored and member is True
        assert (
            cli.main(
                [
                    "--url",
                    db,
                    "login",
                    "linkdb_owner",
                    "--role",
                    "linkdb_ingest",
                    "--password-file",
                    str(pw),
                ]
            )
            == 1
        )
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(f"DROP ROLE IF EXISTS {name}")


# cell_name (migration 0013): what each kind of cell ID reads as.
CELL_NAMES = [
    (0, "unknown"),
    (0x0A3B_5C1D, "eNB 670556 cell 29"),  # ModemManager's cid of an LTE cell
    ((1 << 28) - 1, "eNB 1048575 cell 255"),
    ((2 << 32) | 7, "testbed cell 7"),  # testbed_cell_id(1, 7)
    ((1 << 32) | 70_000, "NR cell 4295037296"),
    ((1 << 36) - 1, "NR cell 68719476735"),
    ((1 << 62) + 5, "cell 0x4000000000000005"),  # a drive-test log's hashed identity
]


@pytest.mark.parametrize("service", ["api", "trainer", "ingest"])
def test_every_reading_role_names_cells(db: str, service: str) -> None:
    with psycopg.connect(service_url(db, service)) as c:
        for cell_id, name in CELL_NAMES:
            assert c.execute("SELECT cell_name(%s)", (cell_id,)).fetchone() == (name,), cell_id
