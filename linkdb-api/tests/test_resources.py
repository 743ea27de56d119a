"""Trains, trips, cells and per-cell statistics."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import READ


def get(client: TestClient, url: str, **params: Any) -> Any:
    r = client.get(url, params=params, headers=READ)
    assert r.status_code == 200, r.text
    return r.json()


def test_trains_page_by_id(client: TestClient) -> None:
    first = get(client, "/v1/trains", limit=2)
    assert [t["id"] for t in first["items"]] == ["dt-log", "t1"]
    rest = client.get(first["next"], headers=READ).json()
    assert [t["id"] for t in rest["items"]] == ["t2"]
    assert rest["next"] is None


def test_a_train_is_a_feature_at_its_latest_fix(client: TestClient) -> None:
    t1 = get(client, "/v1/trains/t1")
    assert t1["geometry"] == {"type": "Point", "coordinates": [116.04, 39.0]}
    assert t1["properties"]["trips"] == 2
    assert t1["properties"]["last_fix_time"] == "2026-11-01T10:04:00+00:00"
    t2 = get(client, "/v1/trains/t2")
    assert t2["geometry"] is None
    r = client.get("/v1/trains/nope", headers=READ)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert "nope" in r.json()["detail"]


def test_trips_filter_by_train_and_window_with_optional_line(client: TestClient) -> None:
    trips = get(client, "/v1/trips", train_id="t1")
    assert [f["id"] for f in trips["features"]] == [1, 3]
    assert all(f["geometry"] is None for f in trips["features"])
    with_line = get(client, "/v1/trips", train_id="t1", geometry="true")
    line = with_line["features"][0]["geometry"]
    assert line["type"] == "LineString"
    assert line["coordinates"][0] == [116.0, 39.0] and len(line["coordinates"]) == 5
    assert with_line["features"][1]["geometry"] is None, "no fixes: no line"
    window = get(client, "/v1/trips", since="2026-11-01T11:30:00Z", until="2026-11-02T00:00:00Z")
    assert [f["id"] for f in window["features"]] == [2]
    paged = get(client, "/v1/trips", limit=2)
    assert [f["id"] for f in paged["features"]] == [1, 2]
    assert [f["id"] for f in client.get(paged["next"], headers=READ).json()["features"]] == [3]


def test_cells_filters_and_geometry(client: TestClient) -> None:
    allc = get(client, "/v1/cells")
    assert [f["id"] for f in allc["features"]] == [1, 2, 3, 4]
    c1 = allc["features"][0]
    assert c1["geometry"] == {"type": "Point", "coordinates": [116.0, 39.0]}
    assert c1["properties"]["failure_rate"] == pytest.approx(0.2)
    assert allc["features"][3]["geometry"] is None
    assert allc["features"][3]["properties"]["failure_rate"] is None
    # Cell IDs below 2^28 are LTE cell identities: eNB ID x 256 + cell.
    assert [f["properties"]["name"] for f in allc["features"]] == [
        "eNB 0 cell 101",
        "eNB 0 cell 102",
        "eNB 0 cell 201",
        "eNB 3 cell 231",
    ]

    def ids(**p: Any) -> list[int]:
        return [f["id"] for f in get(client, "/v1/cells", **p)["features"]]

    assert ids(carrier="unicom") == [3, 4]
    assert ids(direction="decreasing") == [3]
    assert ids(min_handovers=120) == [1, 2]
    assert ids(bbox="116.1,38.9,116.2,39.1") == [2]
    assert ids(bbox="116.1,38.9,116.2,39.1", carrier="unicom") == []


def test_cell_stats(client: TestClient) -> None:
    s = get(client, "/v1/cells/1/stats")
    # Cell 1: t1's handovers i = 0..149, a failure every 5th.
    assert s["handovers"] == 150 and s["failures"] == 30
    assert (s["carrier"], s["cell_id"], s["name"]) == ("cmcc", 101, "eNB 0 cell 101")
    assert s["failure_rate"] == pytest.approx(0.2)
    assert s["earliest_handover_track_m"] == 0.0
    assert s["earliest_handover_position"] == {"type": "Point", "coordinates": [116.0, 39.0]}
    assert s["mean_failure_track_m"] == pytest.approx(sum(range(0, 150, 5)) / 30)
    assert s["mean_failure_duration_ms"] == pytest.approx(2000)
    assert s["rsrp_dbm"]["count"] == 150
    assert s["rsrp_dbm"]["min"] == -109.0 and s["rsrp_dbm"]["max"] == -80.0
    assert s["rsrp_dbm"]["median"] == pytest.approx(-94.5)
    assert s["first_handover"] == "2026-11-01T10:00:00+00:00"
    # Decreasing: the earliest is the largest track_m.
    s3 = get(client, "/v1/cells/3/stats")
    assert s3["earliest_handover_track_m"] == 1000.0
    assert s3["rsrp_dbm"]["count"] == 0 and s3["rsrp_dbm"]["median"] is None
    # A window.
    w = get(client, "/v1/cells/1/stats", since="2026-11-01T10:00:00Z", until="2026-11-01T10:01:00Z")
    assert w["handovers"] == 6 and w["failures"] == 2
    assert w["since"] == "2026-11-01T10:00:00+00:00"
    empty = get(client, "/v1/cells/4/stats")
    assert empty["handovers"] == 0 and empty["failure_rate"] is None
    assert empty["earliest_handover_position"] is None
    assert client.get("/v1/cells/99/stats", headers=READ).status_code == 404


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}


def test_routes_page_filter_by_bbox_and_carry_their_tracks(client: TestClient) -> None:
    first = get(client, "/v1/routes", limit=1)
    assert first["type"] == "FeatureCollection"
    (a,) = first["features"]
    assert a["id"] == "line-a" and a["geometry"]["type"] == "LineString"
    assert a["geometry"]["coordinates"][0] == [116.0, 39.0]  # drawn along the measure
    assert a["properties"]["tracks"] == [
        {"track": "1", "running": "increasing"},
        {"track": "2", "running": "decreasing"},
    ]
    assert a["properties"]["properties"] == {"operator": "test"}
    rest = client.get(first["next"], headers=READ).json()
    assert [f["id"] for f in rest["features"]] == ["line-b"]
    assert rest["features"][0]["properties"]["tracks"] == []
    boxed = get(client, "/v1/routes", bbox="116.9,39.9,117.1,40.05", geometry="false")
    assert [f["id"] for f in boxed["features"]] == ["line-b"]
    assert boxed["features"][0]["geometry"] is None


def test_one_route_and_its_tracks(client: TestClient) -> None:
    a = get(client, "/v1/routes/line-a")
    assert a["properties"]["length_m"] == 4270.0
    tracks = get(client, "/v1/routes/line-a/tracks")
    assert [(f["id"], f["properties"]["running"]) for f in tracks["features"]] == [
        ("1", "increasing"),
        ("2", "decreasing"),
    ]
    assert get(client, "/v1/routes/line-b/tracks")["features"] == []
    for url in ("/v1/routes/nope", "/v1/routes/nope/tracks"):
        r = client.get(url, headers=READ)
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
