"""The fleet loop on real positions, from drive-test logs: a
route imported from GeoJSON, drive-test CSVs with only latitude and
longitude imported and map-matched by ingest, the trainer run on them,
and its table, with the route, served by linkdb-api. Real PostGIS.

The logs are generated here (no third-party data): six eastbound drives
along a 20 km line at 39° N, 1 Hz rows with 10 m of GPS noise, one carrier
whose cells change every 2 km (±30 m); out of cells 3, 5 and 7 the
handover fails in five drives of six (three seconds without service) and
starts 150 m after the cell's edge, the others succeed at the edge. Half
of the drives are written as the generic CSV, half as a G-NetTrack Pro
export (the public UCC datasets' layout: local Beijing time to the second,
km/h, ``-`` for no value, the global cell ID in ``RAWCELLID``), imported
with ``--format gnettrack``; the trainer pools both."""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
from fastapi.testclient import TestClient

from polycorn_ingest.drivetest import FORMATS, Columns, import_csv
from polycorn_ingest.routes import parse_geojson, store
from polycorn_ingest.sink import LinkDbSink
from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import hash_key
from polycorn_linkdb_api.settings import ApiSettings, DatabaseSettings, Settings
from polycorn_schema.testing import fresh_database
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, run

R = 6_371_008.8
LAT0, LON0 = 39.0, 116.0
M_PER_DEG_LON = R * math.cos(math.radians(LAT0)) * math.pi / 180
LENGTH = 20_000.0
FAILING = {3, 5, 7}
LATE_M = 150.0
T0 = dt.datetime(2026, 11, 2, 8, tzinfo=dt.UTC)


def route_geojson() -> dict[str, object]:
    coords = [[LON0 + k * 100.0 / M_PER_DEG_LON, LAT0] for k in range(int(LENGTH / 100) + 1)]
    return {
        "type": "Feature",
        "properties": {"route": "line-e", "name": "test line"},
        "geometry": {"type": "LineString", "coordinates": coords},
    }


GNETTRACK = [
    "Timestamp",
    "Longitude",
    "Latitude",
    "Speed",
    "Operatorname",
    "CellID",
    "NetworkMode",
    "RSRP",
    "RSRQ",
    "SNR",
    "RAWCELLID",
]
BEIJING = ZoneInfo("Asia/Shanghai")


def drive(path: Path, k: int, rng: random.Random, *, gnettrack: bool = False) -> None:
    """One log: rows at 1 Hz at 80 m/s from 500 m to 19.5 km."""
    start = T0 + dt.timedelta(hours=k)
    edges = {c: 2000.0 * c + rng.uniform(-30, 30) for c in range(1, 10)}
    fails = {c for c in FAILING if not (k == 0 and c == 3)}  # 5 of 6 drives
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GNETTRACK if gnettrack else ["time", "lat", "lon", "cell_id", "rsrp"])
        x, t = 500.0, 0
        while x < LENGTH - 500:
            cell = 1 + int(x // 2000)
            c_from = cell - 1
            edge = edges.get(c_from, -1e9)
            if c_from in fails and edge <= x < edge + LATE_M:
                cell = c_from  # the handover starts late ...
            elif c_from in fails and edge + LATE_M <= x < edge + LATE_M + 3 * 80:
                cell = 0  # ... and fails: three seconds without service
            n, e = rng.gauss(0, 10), rng.gauss(0, 10)
            at = start + dt.timedelta(seconds=t)
            lat = f"{LAT0 + math.degrees(n / R):.7f}"
            lon = f"{LON0 + (x + e) / M_PER_DEG_LON:.7f}"
            if gnettrack:
                no = cell == 0
                w.writerow(
                    [
                        at.astimezone(BEIJING).strftime("%Y.%m.%d_%H.%M.%S"),
                        lon,
                        lat,
                        "288",
                        "op-x",
                        "-" if no else str(cell % 3 + 1),  # the cell's number in its site
                        "-" if no else "LTE",
                        "-" if no else "-90",
                        "-" if no else "-11",
                        "-" if no else "7.0",
                        "-" if no else str(100 + cell),
                    ]
                )
            else:
                w.writerow([at.isoformat(), lat, lon, 0 if cell == 0 else 100 + cell, -90.0])
            x += 80.0
            t += 1


def test_drive_test_logs_become_a_routed_failure_table_served_by_the_api(tmp_path: Path) -> None:
    rng = random.Random(21)
    with fresh_database(prefix="linkdb_test_drivetest_loop") as url:
        with psycopg.connect(url) as conn, conn.transaction():
            for spec in parse_geojson(route_geojson()):
                store(conn, spec)
        for k in range(6):
            p = tmp_path / f"drive-{k}.csv"
            gnet = k % 2 == 1
            drive(p, k, rng, gnettrack=gnet)
            sink = LinkDbSink(url, source="drivetest")
            try:
                if gnet:
                    rep = import_csv(
                        p, sink, train=f"dt-{k}", fmt=FORMATS["gnettrack"], timezone="Asia/Shanghai"
                    )
                else:
                    rep = import_csv(p, sink, train=f"dt-{k}", carrier="op-x", cols=Columns())
            finally:
                sink.close()
            assert rep.imported == rep.rows and not rep.bad and not rep.ignored
            assert rep.carriers == ["op-x"]
        with psycopg.connect(url) as c:
            # Every drive starts at its hour in UTC, whichever format wrote it.
            starts: dict[str, dt.datetime] = dict(
                c.execute("SELECT train_id, min(time) FROM gps_fixes GROUP BY 1").fetchall()
            )
            assert starts == {f"dt-{k}": T0 + dt.timedelta(hours=k) for k in range(6)}
            off, matched, total = c.execute(
                "SELECT count(*) FILTER (WHERE off_route), count(*) FILTER (WHERE route_id = "
                "'line-e'), count(*) FROM gps_fixes"
            ).fetchone() or (0, 0, 0)
            assert off == 0 and matched == total > 0
            routed = c.execute(
                "SELECT count(*) FILTER (WHERE route_id = 'line-e' AND direction = 'increasing'), "
                "count(*) FROM handovers"
            ).fetchone()
            assert routed is not None and routed[0] == routed[1] > 0
        s = run(url, Options(workers=1), Metrics())
        assert s["table"] is not None
        settings = Settings(
            DatabaseSettings(url=url, pool_size=2), ApiSettings(keys=f"t:read:{hash_key('k')}")
        )
        with TestClient(create_app(settings)) as client:
            r = client.get("/v1/failure-table", headers={"X-API-Key": "k"})
            assert r.status_code == 200
            table = r.json()
            routes = client.get("/v1/routes", headers={"X-API-Key": "k"}).json()
        assert [f["id"] for f in routes["features"]] == ["line-e"]
        by_cell = {e["cell"]: e for e in table["entries"]}
        # The failing cells, and only they, are in the table, each on the
        # route, at the late handovers' place (edge + 150 m; the handover
        # starts at the last row on the old cell, up to 80 m earlier).
        assert set(by_cell) == {100 + cell for cell in FAILING}
        for cell in FAILING:
            e = by_cell[100 + cell]
            assert e["route"] == "line-e" and e["direction"] == "increasing"
            want = 2000.0 * cell + LATE_M
            assert want - 150 < e["position_m"] < want + 60, e
            assert abs(e["lat"] - LAT0) < 1e-4
            # sphere (here) against spheroid (PostGIS): 0.25 % apart east-west at 39° N
            assert abs((e["lon"] - LON0) * M_PER_DEG_LON - e["position_m"]) < 0.005 * want
        (line,) = table["routes"]
        assert line["id"] == "line-e" and line["measures"][-1] > 19_900
