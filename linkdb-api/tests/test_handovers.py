"""/v1/handovers: filters, GeoJSON shape, keyset pagination."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.routes.handovers import KNN_MAX_AREA_DEG2
from polycorn_schema.testing import fresh_database

from .conftest import READ, settings_for


def get(client: TestClient, url: str, **params: Any) -> dict[str, Any]:
    r = client.get(url, params=params, headers=READ)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def walk(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    """Every page, following `next` links."""
    features: list[dict[str, Any]] = []
    r = client.get("/v1/handovers", params=params, headers=READ)
    while True:
        assert r.status_code == 200, r.text
        body = r.json()
        features += body["features"]
        assert body["number_returned"] == len(body["features"])
        if body["next"] is None:
            assert body["next_cursor"] is None
            return features
        assert r.headers["link"] == f'<{body["next"]}>; rel="next"'
        r = client.get(body["next"], headers=READ)


def test_a_page_is_a_geojson_feature_collection_of_points(client: TestClient) -> None:
    r = client.get("/v1/handovers", params={"limit": 2}, headers=READ)
    assert r.headers["content-type"] == "application/geo+json"
    body = r.json()
    assert body["type"] == "FeatureCollection"
    f = body["features"][0]
    assert f["type"] == "Feature"
    assert f["geometry"] == {"type": "Point", "coordinates": [116.0, 39.0]}
    assert f["properties"]["train_id"] == "t1"
    assert f["properties"]["outcome"] == "failure"
    assert f["properties"]["start_time"] == "2026-11-01T10:00:00+00:00"
    assert f["id"] == f["properties"]["id"]


def test_walking_every_page_returns_every_row_once_in_order(client: TestClient) -> None:
    for limit in (1, 7, 100, 1000):
        features = walk(client, limit=limit) if limit != 1 else walk(client, limit=1, train_id="t2")
        ids = [f["id"] for f in features]
        assert len(ids) == len(set(ids)), "a row appeared twice"
        want = 100 if limit == 1 else 400
        assert len(ids) == want
        keys = [(f["properties"]["start_time"], f["id"]) for f in features]
        assert keys == sorted(keys)


def test_pagination_with_filters_is_complete(client: TestClient) -> None:
    everything = walk(client, limit=1000)
    failures = walk(client, outcome="failure", carrier="cmcc", limit=9)
    want = {
        f["id"]
        for f in everything
        if f["properties"]["outcome"] == "failure" and f["properties"]["carrier"] == "cmcc"
    }
    assert {f["id"] for f in failures} == want
    assert len(want) == 30 + 15


def test_bbox_keeps_only_points_inside(client: TestClient) -> None:
    # t1's handovers run along lat 39 from lon 116.000 to 116.299.
    inside = walk(client, bbox="116.0995,38.9,116.1995,39.1", limit=1000)
    lons = sorted(f["geometry"]["coordinates"][0] for f in inside)
    assert len(lons) == 100
    assert lons[0] == 116.1 and lons[-1] == 116.199
    assert walk(client, bbox="10,10,11,11") == []


def test_time_window_is_half_open(client: TestClient) -> None:
    got = walk(client, since="2026-11-01T10:00:00Z", until="2026-11-01T10:01:00Z", limit=1000)
    assert [f["properties"]["start_time"][11:19] for f in got] == [
        "10:00:00",
        "10:00:10",
        "10:00:20",
        "10:00:30",
        "10:00:40",
        "10:00:50",
    ]
    # A time without a zone is UTC.
    naive = walk(client, since="2026-11-01T10:00:00", until="2026-11-01T10:01:00", limit=1000)
    assert naive == got


def test_train_trip_and_cell_filters(client: TestClient) -> None:
    assert len(walk(client, train_id="t2", limit=1000)) == 100
    assert len(walk(client, trip_id=1, limit=1000)) == 300
    assert walk(client, trip_id=3) == []
    by_cell = walk(client, cell=2, limit=1000)
    assert len(by_cell) == 150
    assert {f["properties"]["source_cell_id"] for f in by_cell} == {102}
    names = {(f["properties"]["source_cell"], f["properties"]["target_cell"]) for f in by_cell}
    assert names == {("eNB 0 cell 102", "eNB 0 cell 103")}
    assert walk(client, cell=4) == []
    assert walk(client, cell=12345) == []
    assert walk(client, train_id="nobody") == []


def test_a_cursor_of_another_endpoint_is_refused(client: TestClient) -> None:
    cells = get(client, "/v1/cells", limit=1)
    r = client.get("/v1/handovers", params={"cursor": cells["next_cursor"]}, headers=READ)
    assert r.status_code == 422
    assert "cursor" in r.json()["detail"]


# 10 trains x 3 carriers hand over at the same 5 instants, inside a small
# box: 30 rows share each start time, so pages cut through ties.
TIES = """
INSERT INTO trains (id, source, first_seen, last_seen)
  SELECT 'tie' || i, 'telemetry', '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z'
  FROM generate_series(0, 9) i;
INSERT INTO handovers (source, train_id, carrier, source_cell_id, target_cell_id, start_time,
                       geog, outcome, duration_ms)
  SELECT 'telemetry', 'tie' || i, c, 7, 8,
         '2026-11-01T10:00:00Z'::timestamptz + t * interval '1 second',
         ST_MakePoint(116.0 + i * 0.001, 39.0 + t * 0.001)::geography, 'success', 50
  FROM generate_series(0, 9) i, unnest(ARRAY['a', 'b', 'c']) c, generate_series(4, 0, -1) t
  ORDER BY random();
"""


@pytest.fixture(scope="module")
def ties() -> Iterator[TestClient]:
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(TIES)
        with TestClient(create_app(settings_for(url))) as client:
            yield client


@pytest.mark.parametrize("limit", [1, 7, 30, 31, 1000])
def test_pages_through_equal_start_times_are_exact_on_both_plans(
    ties: TestClient, limit: int
) -> None:
    small = "115.99,38.99,116.02,39.01"  # the nearest-neighbour plan
    big = "115,38,117,40"  # the planner's plan
    assert (0.03 * 0.02) <= KNN_MAX_AREA_DEG2 < 2 * 2
    want = walk(ties, limit=1000)
    assert len(want) == 150
    keys = [(f["properties"]["start_time"], f["id"]) for f in want]
    assert keys == sorted(keys)
    for bbox in (small, big):
        got = walk(ties, bbox=bbox, limit=limit)
        assert [f["id"] for f in got] == [f["id"] for f in want], bbox
    # A cursor in the middle of a tie, and a filter the index does not hold.
    inside = walk(ties, bbox="116.0035,38.99,116.02,39.01", carrier="b", limit=limit)
    assert [f["id"] for f in inside] == [
        f["id"]
        for f in want
        if f["properties"]["carrier"] == "b" and f["geometry"]["coordinates"][0] > 116.0035
    ]
