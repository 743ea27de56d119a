"""LinkDB's migrations against real PostgreSQL + PostGIS."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from polycorn_schema.linkdb.cli import alembic_config, sqlalchemy_url
from polycorn_schema.linkdb.models import PARTITIONED, Base
from polycorn_schema.linkdb.partitions import ensure_month_partitions, existing_partitions
from polycorn_schema.testing import fresh_database


def test_the_migrations_build_exactly_the_models() -> None:
    with fresh_database() as url:
        engine = create_engine(sqlalchemy_url(url))
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_object": lambda o, n, t, r, c: (
                        not (
                            t == "table" and (n == "spatial_ref_sys" or str(n).endswith("_default"))
                        )
                    )
                },
            )
            diff = compare_metadata(ctx, Base.metadata)
        engine.dispose()
        assert diff == [], f"models and migrations disagree: {diff}"


def test_downgrade_to_base_and_back() -> None:
    with fresh_database() as url:
        cfg = alembic_config(url)
        command.downgrade(cfg, "base")
        with psycopg.connect(url) as c:
            left = c.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname='public' "
                "AND tablename NOT IN ('spatial_ref_sys', 'alembic_version')"
            ).fetchall()
        assert left == []
        command.upgrade(cfg, "head")


def test_every_partitioned_table_takes_any_time_and_month_partitions_absorb_the_default() -> None:
    with fresh_database() as url:
        engine = create_engine(sqlalchemy_url(url))
        t = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO gps_fixes (train_id, time, geog) VALUES "
                    "('t1', :t, ST_GeogFromText('POINT(116.3 39.8)'))"
                ),
                {"t": t},
            )
        with engine.begin() as conn:
            created = ensure_month_partitions(conn, [t, t + dt.timedelta(days=40)])
        assert "gps_fixes_y2026m11" in created and "gps_fixes_y2027m01" in created
        assert len(created) == 2 * len(PARTITIONED)
        with engine.begin() as conn:
            assert ensure_month_partitions(conn, [t]) == []
            assert "path_stats_y2026m11" in existing_partitions(conn, "path_stats")
            where = conn.execute(
                text("SELECT tableoid::regclass::text FROM gps_fixes WHERE train_id='t1'")
            ).scalar_one()
        assert where == "gps_fixes_y2026m11", "the row moved out of the DEFAULT partition"
        with engine.begin() as conn, pytest.raises(ValueError, match="not a partitioned"):
            ensure_month_partitions(conn, [t], tables=["handovers"])
        engine.dispose()


def test_a_wrong_url_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        sqlalchemy_url("mysql://x@y/z")
