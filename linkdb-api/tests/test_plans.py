"""The hot routes keep their query plans, whatever state the database is in.

A scaled-down copy of ``make bench-api``'s database (loadtest/seed.sql: 8
trains x 12 trips, 86,400 handovers, seeded in time order as ingest writes)
is put in three states: freshly seeded and analysed; grown by half again with
no ANALYZE since (statistics as stale as between two autovacuum runs);
and planned with an SSD's costs (``random_page_cost = 1.1``, a common
production setting). In each state every hot request is sent through the app
while its SQL is recorded, then each recorded statement is run on a
connection opened exactly as the pool opens its own (``db.connect_kwargs``:
the same session settings and prepare threshold), more times than it takes
psycopg to prepare it and PostgreSQL to consider a generic plan. The plan of
the last run is read back with ``auto_explain`` (as a notice, with actual row
counts) and must:

- touch ``handovers`` and ``failure_tables`` only through an index, never a
  sequential or bitmap heap scan (a bitmap scan reads the whole viewport or
  cell before it sorts);
- for a map viewport, page with the nearest-neighbour scan of
  ``ix_handovers_geom_time`` ordered by time;
- for a cell's statistics, read its handovers from ``ix_handovers_cell_time``
  alone (an index-only scan; a cell's rows lie on as many table pages as it
  has handovers), and, freshly vacuumed, fetch no table page for them;
- read a bounded number of rows (returned plus removed by a filter or
  recheck): a page reads its limit plus the rows at its last start time, a
  cell's statistics read that cell's handovers, the current table one row
  of a year's versions. A large viewport (a good share of the table) walks
  the time index and skips what is outside: bounded by the share, not
  asserted.

This checks plans, not time: a change that loses a plan fails here on any
machine, however fast.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.db import connect_kwargs
from polycorn_linkdb_api.settings import DatabaseSettings
from polycorn_schema.testing import fresh_database

from .conftest import READ, settings_for

SEED = Path(__file__).parents[1] / "loadtest" / "seed.sql"
TRAINS, TRIPS = 8, 12
LIMIT = 100
# A viewport of 0.2 x 0.2 degrees on the first line of seed.sql (Beijing ->
# Xuzhou), about 1,200 handovers of the seeded copy: the page must not read
# them all. And one of 2 x 2 degrees (most of a line), served by walking the
# time index.
SMALL_BBOX = "116.38,39.28,116.58,39.48"
LARGE_BBOX = "115.8,37.0,117.8,39.0"
STATES = ("analysed", "stale statistics", "ssd costs")

Plan = dict[str, Any]


@pytest.fixture(scope="module")
def bench_copy() -> Iterator[str]:
    with fresh_database(prefix="linkdb_plans") as url:
        subprocess.run(
            ["psql", url, "-q", "-v", f"trains={TRAINS}", "-v", f"trips={TRIPS}", "-f", str(SEED)],
            check=True,
            capture_output=True,
        )
        with psycopg.connect(url, autocommit=True) as c:
            # A year of hourly tables, the newest of which the proxies poll for.
            c.execute(
                "INSERT INTO failure_tables (version, etag, entries, body, note, body_bytes) "
                "SELECT v, 'e' || v, 0, b::jsonb, 'plans', convert_to(b, 'UTF8') FROM ("
                ' SELECT v, \'{"format":"polycorn-failure-table/1","version":\' || v'
                " || ',\"entries\":[]}' AS b FROM generate_series(1, 8760) v) t"
            )
            c.execute("ANALYZE failure_tables")
        yield url


def grow_without_analyze(url: str) -> None:
    """Half as many handovers again, a month later, with autovacuum kept off
    the table so its statistics stay those of the smaller table."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER TABLE handovers SET (autovacuum_enabled = false)")
        c.execute(
            "INSERT INTO handovers (source, train_id, trip_id, carrier, path, source_cell_id,"
            " target_cell_id, start_time, geog, track_m, direction, rsrp_dbm, outcome,"
            " duration_ms) "
            "SELECT source, train_id, trip_id, carrier, path, source_cell_id, target_cell_id,"
            " start_time + interval '30 days', geog, track_m, direction, rsrp_dbm, outcome,"
            " duration_ms FROM handovers WHERE id % 2 = 0 ORDER BY start_time"
        )


def requests(url: str) -> dict[str, str]:
    with psycopg.connect(url) as c:
        (cell,) = c.execute("SELECT id FROM cells ORDER BY handovers DESC, id LIMIT 1").fetchone()  # type: ignore[misc]
    return {
        "handovers_bbox_page": f"/v1/handovers?bbox={SMALL_BBOX}&limit={LIMIT}",
        "handovers_large_bbox_page": f"/v1/handovers?bbox={LARGE_BBOX}&limit={LIMIT}",
        "handovers_train_window": (
            "/v1/handovers?train_id=train-003&since=2026-10-02T00:00:00Z"
            f"&until=2026-10-03T00:00:00Z&limit={LIMIT}"
        ),
        "cell_stats": f"/v1/cells/{cell}/stats",
        "failure_table": "/v1/failure-table",
    }


class Recorder:
    """Records the SQL and binds the app sends, by wrapping psycopg's
    ``AsyncConnection.execute`` for the duration of a request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, Any]] = []
        original = psycopg.AsyncConnection.execute

        async def execute(conn: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            self.seen.append((query, params))
            return await original(conn, query, params, **kw)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute)


def plans_of(url: str, statements: list[tuple[str, Any]], extra: list[str]) -> list[Plan]:
    """Each statement's plan as a warm pooled connection runs it."""
    db = DatabaseSettings(url=url)
    notices: list[str] = []
    out: list[Plan] = []
    with psycopg.connect(url, **connect_kwargs(db)) as c:
        c.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for sql in extra:
            c.execute(sql)
        c.execute("LOAD 'auto_explain'")
        for k, v in {
            "log_min_duration": "0",
            "log_analyze": "on",
            "log_timing": "off",
            "log_format": "json",
            "log_level": "notice",
        }.items():
            c.execute(f"SET auto_explain.{k} = {v}")
        runs = (db.prepare_threshold or 0) + 8
        for query, params in statements:
            for _ in range(runs):
                notices.clear()
                c.execute(query, params).fetchall()
            (text,) = [n for n in notices if "plan:" in n]
            out.append(json.loads(text.split("plan:", 1)[1])["Plan"])
    return out


def nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    for p in plan.get("Plans", []):
        yield from nodes(p)


TABLES = ("handovers", "failure_tables")


def scans(plan: Plan) -> list[Plan]:
    """The plan's reads of the big tables."""
    return [n for n in nodes(plan) if n.get("Relation Name") in TABLES]


def rows_read(n: Plan) -> float:
    per_loop = (
        n.get("Actual Rows", 0)
        + n.get("Rows Removed by Filter", 0)
        + n.get("Rows Removed by Index Recheck", 0)
    )
    return float(per_loop * n.get("Actual Loops", 0))


def describe(plan: Plan) -> str:
    return "; ".join(
        f"{n['Node Type']} {n['Relation Name']}.{n.get('Index Name', '')} read {rows_read(n):.0f}"
        for n in scans(plan)
    )


@pytest.mark.parametrize("state", STATES)
def test_each_hot_route_keeps_its_plan(
    bench_copy: str, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = ["SET random_page_cost = 1.1"] if state == "ssd costs" else []
    if state == "stale statistics":
        grow_without_analyze(bench_copy)
    with psycopg.connect(bench_copy) as c:
        (max_cell,) = c.execute("SELECT max(handovers) FROM cells").fetchone()  # type: ignore[misc]
        (at_time,) = c.execute(  # the most handovers that share one start time
            "SELECT max(n) FROM (SELECT count(*) n FROM handovers GROUP BY start_time) t"
        ).fetchone()  # type: ignore[misc]
    # A page: the limit, the rows at its last start time (read again on a
    # tie), and the probe row that says there is more; grown, a cell has
    # half as many handovers again.
    page_bound = 2 * (LIMIT + 1) + at_time
    bounds = {
        "handovers_bbox_page": page_bound,
        "handovers_train_window": page_bound,
        "cell_stats": 2 * max_cell * 1.5 + 1,
        "failure_table": 1,
    }
    app = create_app(settings_for(bench_copy))
    with TestClient(app) as client:
        for name, path in requests(bench_copy).items():
            rec = Recorder(monkeypatch)
            r = client.get(path, headers=READ)
            monkeypatch.undo()
            assert r.status_code == 200, (name, r.status_code, r.text[:300])
            reads = [(q, p) for q, p in rec.seen if "handovers" in q or "failure_tables" in q]
            assert reads, f"{name}: no query recorded"
            for plan in plans_of(bench_copy, reads, extra):
                got = describe(plan)
                print(f"  {state:17} {name:26} {got}")
                for n in scans(plan):
                    assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (name, got)
                if name == "handovers_bbox_page":
                    knn = [
                        n
                        for n in scans(plan)
                        if n.get("Index Name") == "ix_handovers_geom_time" and "Order By" in n
                    ]
                    assert knn, f"{name}: no nearest-neighbour scan in time order: {got}"
                if name == "cell_stats":
                    cover = [
                        n
                        for n in scans(plan)
                        if n.get("Index Name") == "ix_handovers_cell_time"
                        and n["Node Type"] == "Index Only Scan"
                    ]
                    assert len(cover) == 2, f"{name}: not from the index alone: {got}"
                    if state == "analysed":
                        fetched = sum(n.get("Heap Fetches", 0) for n in cover)
                        assert fetched == 0, (name, fetched, got)
                if name in bounds:
                    total = sum(rows_read(n) for n in scans(plan))
                    assert total <= bounds[name], (name, total, bounds[name], got)
