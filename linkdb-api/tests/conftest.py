"""A throw-away LinkDB on the real PostGIS, seeded with SQL, and the app on it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import hash_key
from polycorn_linkdb_api.settings import ApiSettings, DatabaseSettings, Settings
from polycorn_schema.testing import fresh_database, service_url

READ_KEY = "test-read-key"
ADMIN_KEY = "test-admin-key"
TABLE_KEY = "test-table-key"
READ = {"Authorization": f"Bearer {READ_KEY}"}
ADMIN = {"X-API-Key": ADMIN_KEY}
TABLE = {"X-API-Key": TABLE_KEY}

# Two trains along a line from (116.0, 39.0) eastwards; 300 handovers of train
# t1 (every 10 s, 0.001° apart), 100 of t2 on another carrier; cells keyed by
# (carrier, cell_id, direction); one fix-only trip for the LineString.
SEED = """
INSERT INTO trains (id, source, first_seen, last_seen) VALUES
  ('t1', 'telemetry', '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z'),
  ('t2', 'telemetry', '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z'),
  ('dt-log', 'drivetest', '2026-10-01T00:00:00Z', '2026-10-01T01:00:00Z');
INSERT INTO trips (id, train_id, started_at, ended_at, fixes, direction)
  OVERRIDING SYSTEM VALUE VALUES
  (1, 't1', '2026-11-01T10:00:00Z', '2026-11-01T11:00:00Z', 5, 'increasing'),
  (2, 't2', '2026-11-01T12:00:00Z', '2026-11-01T13:00:00Z', 0, 'decreasing'),
  (3, 't1', '2026-11-02T10:00:00Z', '2026-11-02T11:00:00Z', 0, NULL);
INSERT INTO gps_fixes (train_id, time, geog, track_m)
  SELECT 't1', '2026-11-01T10:00:00Z'::timestamptz + i * interval '1 minute',
         ST_MakePoint(116.0 + i * 0.01, 39.0)::geography, i * 1000.0
  FROM generate_series(0, 4) i;
INSERT INTO cells (id, carrier, cell_id, direction, handovers, failures, earliest_ho_track_m,
                   earliest_ho_geog, first_seen, last_seen) OVERRIDING SYSTEM VALUE VALUES
  (1, 'cmcc', 101, 'increasing', 150, 30, 0.0, ST_MakePoint(116.0, 39.0)::geography,
   '2026-11-01T10:00:00Z', '2026-11-01T11:00:00Z'),
  (2, 'cmcc', 102, 'increasing', 150, 15, 150.0, ST_MakePoint(116.15, 39.0)::geography,
   '2026-11-01T10:00:00Z', '2026-11-01T11:00:00Z'),
  (3, 'unicom', 201, 'decreasing', 100, 10, 900.0, ST_MakePoint(117.0, 40.0)::geography,
   '2026-11-01T12:00:00Z', '2026-11-01T13:00:00Z'),
  (4, 'unicom', 999, 'increasing', 0, 0, NULL, NULL,
   '2026-11-01T12:00:00Z', '2026-11-01T12:00:00Z');
INSERT INTO handovers (source, train_id, trip_id, carrier, path, source_cell_id,
                       target_cell_id, start_time, geog, track_m, direction, rsrp_dbm,
                       outcome, duration_ms)
  SELECT 'telemetry', 't1', 1, 'cmcc', 0, CASE WHEN i < 150 THEN 101 ELSE 102 END, 103,
         '2026-11-01T10:00:00Z'::timestamptz + i * interval '10 seconds',
         ST_MakePoint(116.0 + i * 0.001, 39.0)::geography, i * 1.0, 'increasing',
         -80.0 - (i % 30),
         (CASE WHEN i % 5 = 0 AND i < 150 OR i % 10 = 0 THEN 'failure' ELSE 'success' END)
           ::handover_outcome,
         CASE WHEN i % 5 = 0 THEN 2000 ELSE 50 END
  FROM generate_series(0, 299) i;
INSERT INTO routes (id, name, source, length_m, geog, properties) VALUES
  ('line-a', 'Line A', 'geojson', 4270.0,
   ST_GeogFromText('LINESTRING(116.0 39.0, 116.05 39.0)'), '{"operator": "test"}'),
  ('line-b', 'Line B', 'osm', 11100.0,
   ST_GeogFromText('LINESTRING(117.0 40.0, 117.0 40.1)'), '{}');
INSERT INTO route_tracks (route_id, track, running, geog) VALUES
  ('line-a', '1', 'increasing', ST_GeogFromText('LINESTRING(116.0 39.00002, 116.05 39.00002)')),
  ('line-a', '2', 'decreasing', ST_GeogFromText('LINESTRING(116.05 38.99998, 116.0 38.99998)'));
INSERT INTO handovers (source, train_id, trip_id, carrier, path, source_cell_id,
                       target_cell_id, start_time, geog, track_m, direction, rsrp_dbm,
                       outcome, duration_ms)
  SELECT 'telemetry', 't2', 2, 'unicom', 1, 201, 202,
         '2026-11-01T12:00:00Z'::timestamptz + i * interval '10 seconds',
         ST_MakePoint(117.0, 40.0 + i * 0.0001)::geography, 1000.0 - i, 'decreasing',
         NULL, (CASE WHEN i % 10 = 0 THEN 'failure' ELSE 'success' END)::handover_outcome,
         50
  FROM generate_series(0, 99) i;
"""


@pytest.fixture(scope="session")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def seeded(database: str) -> str:
    with psycopg.connect(database, autocommit=True) as c:
        c.execute(SEED)
    return database


def settings_for(url: str, **api: object) -> Settings:
    keys = (
        f"reader:read:{hash_key(READ_KEY)},boss:admin:{hash_key(ADMIN_KEY)},"
        f"proxy:table:{hash_key(TABLE_KEY)}"
    )
    # The API's own role; the admin publish tests need linkdb_publisher too.
    url = service_url(url, "api-publisher")
    return Settings(DatabaseSettings(url=url, pool_size=4), ApiSettings(keys=keys, **api))  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def client(seeded: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(seeded)), raise_server_exceptions=False) as c:
        yield c
