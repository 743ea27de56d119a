"""Every bad parameter is a 4xx problem document naming it; never a 500."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.params import encode_cursor

from .conftest import READ

BAD: list[tuple[str, str]] = [
    ("/v1/handovers?bbox=1,2,3", "4 comma-separated numbers"),
    ("/v1/handovers?bbox=a,b,c,d", "not numbers"),
    ("/v1/handovers?bbox=nan,0,1,1", "finite"),
    ("/v1/handovers?bbox=0,0,inf,1", "finite"),
    ("/v1/handovers?bbox=181,0,182,1", "longitudes"),
    ("/v1/handovers?bbox=0,-91,1,1", "latitudes"),
    ("/v1/handovers?bbox=2,0,1,1", "minlon must be < maxlon"),
    ("/v1/handovers?bbox=0,0,0,1", "minlon must be < maxlon"),
    ("/v1/handovers?since=yesterday", "query.since"),
    ("/v1/handovers?since=2026-11-02T00:00:00Z&until=2026-11-01T00:00:00Z", "later than since"),
    ("/v1/handovers?since=2026-11-01T00:00:00Z&until=2026-11-01T00:00:00Z", "later than since"),
    ("/v1/handovers?limit=0", "query.limit"),
    ("/v1/handovers?limit=1001", "query.limit"),
    ("/v1/handovers?limit=x", "query.limit"),
    ("/v1/handovers?outcome=maybe", "query.outcome"),
    ("/v1/handovers?trip_id=9223372036854775808", "query.trip_id"),
    ("/v1/handovers?trip_id=0", "query.trip_id"),
    ("/v1/handovers?cell=-5", "query.cell"),
    ("/v1/handovers?train_id=", "query.train_id"),
    ("/v1/handovers?train_id=a%00b", "query.train_id"),
    ("/v1/handovers?carrier=" + "x" * 65, "query.carrier"),
    ("/v1/handovers?cursor=!!!", "does not decode"),
    ("/v1/handovers?cursor=" + base64.urlsafe_b64encode(b"[1,2]").decode(), "not a cursor of"),
    ("/v1/handovers?cursor=" + encode_cursor("handovers", "noon", 1), "damaged"),
    ("/v1/handovers?cursor=" + encode_cursor("handovers", "2026-11-01T00:00:00", 1), "damaged"),
    (
        "/v1/handovers?cursor=" + encode_cursor("handovers", "2026-11-01T00:00:00Z", 2**63),
        "damaged",
    ),
    ("/v1/cells?direction=north", "query.direction"),
    ("/v1/cells?min_handovers=-1", "query.min_handovers"),
    ("/v1/cells?min_handovers=99999999999", "query.min_handovers"),
    ("/v1/cells?cursor=" + encode_cursor("cells", "x"), "damaged"),
    ("/v1/cells/0/stats", "path.cell_id"),
    ("/v1/cells/abc/stats", "path.cell_id"),
    ("/v1/cells/99999999999999999999/stats", "path.cell_id"),
    ("/v1/cells/1/stats?since=2026-11-02T00:00:00Z&until=2026-11-01T00:00:00Z", "later than"),
    ("/v1/trips?geometry=perhaps", "query.geometry"),
    ("/v1/trips?since=1e99", "query.since"),
    ("/v1/trains?cursor=" + encode_cursor("trains", 5), "damaged"),
    ("/v1/trains/" + "x" * 129, "path.train_id"),
    ("/v1/failure-tables/0", "path.version"),
    ("/v1/failure-tables/-1", "path.version"),
    ("/v1/failure-tables?limit=0", "query.limit"),
]


@pytest.mark.parametrize(("url", "why"), BAD)
def test_a_bad_parameter_is_422_naming_it(client: TestClient, url: str, why: str) -> None:
    r = client.get(url, headers=READ)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 422 and problem["title"]
    assert why in problem["detail"], problem
    assert problem["instance"] == url.split("?", maxsplit=1)[0]


def test_unknown_paths_and_methods_are_problems(client: TestClient) -> None:
    r = client.get("/v2/handovers", headers=READ)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert "/v1/" in r.json()["detail"]
    r = client.delete("/v1/cells", headers=READ)
    assert r.status_code == 405
    assert r.headers["content-type"] == "application/problem+json"


def test_extreme_but_valid_values_are_not_errors(client: TestClient) -> None:
    for url in [
        "/v1/handovers?since=0001-01-01T00:00:00Z&until=9999-12-31T23:59:59Z",
        "/v1/handovers?bbox=-180,-90,180,90&limit=1000",
        "/v1/handovers?trip_id=9223372036854775807&cell=9223372036854775807",
        "/v1/handovers?train_id=%F0%9F%9A%84&carrier=%E4%B8%AD%E5%9B%BD",
        "/v1/cells?min_handovers=2147483647",
        "/v1/trips?since=0001-01-01T00:00:00%2B14:00",
    ]:
        r = client.get(url, headers=READ)
        assert r.status_code == 200, (url, r.text)
