"""The failure-location table: publication, validation, ETag polling."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_schema.testing import fresh_database, service_url

from .conftest import ADMIN, READ, TABLE, settings_for

FORMAT = "polycorn-failure-table/1"


def table(*entries: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"format": FORMAT, "source": "test", "entries": list(entries), **top}


E1 = {
    "cell": 4294967301,
    "direction": "increasing",
    "position_m": 12345.6,
    "failures": 4,
    "handovers": 6,
}


@pytest.fixture
def fresh() -> Iterator[TestClient]:
    with fresh_database() as url, TestClient(create_app(settings_for(url))) as c:
        yield c


def test_the_api_role_alone_cannot_publish() -> None:
    # The API's deployed role is linkdb_reader only: the admin route is
    # refused by the database, as a 403, and nothing is stored.
    with fresh_database() as url:
        s = settings_for(url)
        s.database.url = service_url(url, "api")
        with TestClient(create_app(s)) as c:
            r = c.post("/v1/failure-tables", json=table(E1), headers=ADMIN)
            assert r.status_code == 403, r.text
            assert "linkdb_publisher" in r.json()["detail"]
            assert c.get("/v1/failure-table", headers=READ).status_code == 404
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM failure_tables").fetchone() == (0,)


def test_no_table_yet_is_404(fresh: TestClient) -> None:
    r = fresh.get("/v1/failure-table", headers=READ)
    assert r.status_code == 404
    assert "no failure-location table" in r.json()["detail"]


def test_publish_then_poll_with_etag(fresh: TestClient) -> None:
    r = fresh.post("/v1/failure-tables", json=table(E1), headers=ADMIN, params={"note": "first"})
    assert r.status_code == 201, r.text
    meta = r.json()
    assert meta["version"] == 1 and meta["entries"] == 1 and meta["note"] == "first"
    assert r.headers["location"] == "/v1/failure-tables/1"
    etag = r.headers["etag"]

    cur = fresh.get("/v1/failure-table", headers=READ)
    assert cur.status_code == 200
    assert cur.headers["etag"] == etag == f'"{meta["etag"]}"'
    assert "max-age=" in cur.headers["cache-control"]
    # Strong: the ETag is the SHA-256 of exactly the bytes served.
    assert f'"{hashlib.sha256(cur.content).hexdigest()}"' == etag
    body = cur.json()
    assert body == {"format": FORMAT, "version": 1, "source": "test", "entries": [E1]}

    again = fresh.get("/v1/failure-table", headers={**READ, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag
    weak = fresh.get("/v1/failure-table", headers={**READ, "If-None-Match": f'"x", W/{etag}'})
    assert weak.status_code == 304

    # A new version: the old ETag no longer matches.
    e2 = {"cell": 7, "direction": "decreasing", "position_m": 10}
    r2 = fresh.post("/v1/failure-tables", json=table(E1, e2, version=2), headers=ADMIN)
    assert r2.status_code == 201 and r2.json()["version"] == 2
    newer = fresh.get("/v1/failure-table", headers={**READ, "If-None-Match": etag})
    assert newer.status_code == 200
    assert newer.json()["version"] == 2
    assert newer.json()["entries"][1] == {"cell": 7, "direction": "decreasing", "position_m": 10.0}

    # Old versions stay, immutable.
    old = fresh.get("/v1/failure-tables/1", headers=READ)
    assert old.json()["version"] == 1 and old.headers["etag"] == etag
    assert "immutable" in old.headers["cache-control"]
    assert fresh.get("/v1/failure-tables/3", headers=READ).status_code == 404
    listed = fresh.get("/v1/failure-tables", headers=READ).json()
    assert [t["version"] for t in listed["items"]] == [2, 1]


def test_a_wrong_version_is_a_conflict(fresh: TestClient) -> None:
    r = fresh.post("/v1/failure-tables", json=table(version=5), headers=ADMIN)
    assert r.status_code == 409
    assert "next version (1)" in r.json()["detail"]


def test_unknown_fields_are_ignored_and_dropped(fresh: TestClient) -> None:
    t = table({**E1, "extra": 1}, comment="x")
    assert fresh.post("/v1/failure-tables", json=t, headers=ADMIN).status_code == 201
    body = fresh.get("/v1/failure-table", headers=READ).json()
    assert "comment" not in body and "extra" not in body["entries"][0]


def test_routes_and_entry_routes_are_kept_in_canonical_form(fresh: TestClient) -> None:
    route = {"id": "bj-sh", "coords": [[116, 39], [116.01, 39.0]], "measures": [0, 853.2]}
    t = table({**E1, "route": "bj-sh", "lat": 39, "lon": 116.005}, routes=[route])
    assert fresh.post("/v1/failure-tables", json=t, headers=ADMIN).status_code == 201
    r = fresh.get("/v1/failure-table", headers=READ)
    body = r.json()
    assert body["entries"][0]["route"] == "bj-sh"
    assert body["routes"] == [
        {"id": "bj-sh", "coords": [[116.0, 39.0], [116.01, 39.0]], "measures": [0.0, 853.2]}
    ]
    # Canonical: numbers as floats, so JSONB's round trip changes no byte.
    assert b'"lat":39.0' in r.content and b'"coords":[[116.0,39.0]' in r.content
    assert r.headers["etag"].strip('"') == hashlib.sha256(r.content).hexdigest()


def test_model_id_must_exist(fresh: TestClient) -> None:
    r = fresh.post("/v1/failure-tables", json=table(), headers=ADMIN, params={"model_id": 3})
    assert r.status_code == 422
    assert "no model 3" in r.json()["detail"]


# What the Rust parser refuses (crates/telemetry/src/failure_table.rs), and why.
BAD: list[tuple[Any, str]] = [
    ({"format": "x", "entries": []}, "is not 'polycorn-failure-table/1'"),
    ({"entries": []}, "body.format"),
    ({"format": FORMAT}, "body.entries"),
    (table({**E1, "cell": 0}), "cell 0 means unknown"),
    (table({**E1, "cell": -1}), "body.entries.0.cell"),
    (table({**E1, "cell": 2**64}), "body.entries.0.cell"),
    (table({**E1, "cell": 1.5}), "body.entries.0.cell"),
    (table({**E1, "cell": "5"}), "body.entries.0.cell"),
    (table({**E1, "direction": "up"}), "'increasing' or 'decreasing'"),
    (table({**E1, "position_m": "1"}), "body.entries.0.position_m"),
    (table({**E1, "position_m": None}), "body.entries.0.position_m"),
    (table({**E1, "failures": -1}), "body.entries.0.failures"),
    (table({**E1, "handovers": True}), "body.entries.0.handovers"),
    (table({**E1, "route": ""}), "body.entries.0.route"),
    (table({**E1, "lat": 91.0}), "body.entries.0.lat"),
    (table(routes=[{"id": "r", "coords": [[1.0, 2.0]], "measures": [0.0]}]), "body.routes.0"),
    (
        table(routes=[{"id": "r", "coords": [[1.0, 2.0], [1.0, 2.1], [1, 3]], "measures": [0, 1]}]),
        "each vertex needs one measure",
    ),
    (
        table(routes=[{"id": "r", "coords": [[1.0, 2.0], [1.0, 2.1]], "measures": [5.0, 1.0]}]),
        "non-decreasing",
    ),
    (
        table(routes=[{"id": "r", "coords": [[1.0, 2.0], [181.0, 2.1]], "measures": [0, 1]}]),
        "WGS 84",
    ),
    (
        table(
            routes=[
                {"id": "r", "coords": [[1.0, 2.0], [1.0, 2.1]], "measures": [0, 1]},
                {"id": "r", "coords": [[1.0, 2.0], [1.0, 2.1]], "measures": [0, 1]},
            ]
        ),
        "unique",
    ),
    (table(version=-1), "body.version"),
    (table(version=1.0), "body.version"),
    (table(source=3), "body.source"),
    ({"format": FORMAT, "entries": {}}, "body.entries"),
    ([], "body"),
]


@pytest.mark.parametrize(("body", "why"), BAD)
def test_bad_tables_are_refused_with_the_reason(fresh: TestClient, body: Any, why: str) -> None:
    r = fresh.post("/v1/failure-tables", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert why in problem["detail"], problem
    assert problem["invalid-params"]


def with_position(raw: str) -> str:
    entry = '{"cell":1,"direction":"increasing","position_m":' + raw + "}"
    return '{"format":"' + FORMAT + '","entries":[' + entry + "]}"


@pytest.mark.parametrize("raw", ["{", "NaN", with_position("1e999"), with_position("NaN")])
def test_unparsable_or_non_finite_json_is_refused(fresh: TestClient, raw: str) -> None:
    r = fresh.post(
        "/v1/failure-tables",
        content=raw,
        headers={**ADMIN, "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert fresh.get("/v1/failure-table", headers=READ).status_code == 404


def test_a_table_the_rust_writer_made_is_accepted_as_is(fresh: TestClient) -> None:
    # serde's to_string_pretty of FailureTableFile (failure_table.rs).
    text = json.dumps(
        {
            "format": FORMAT,
            "version": 1,
            "source": "tracegen",
            "entries": [
                {
                    "cell": 5,
                    "direction": "increasing",
                    "position_m": 1000.0,
                    "failures": 2,
                    "handovers": 3,
                }
            ],
        },
        indent=2,
    )
    r = fresh.post(
        "/v1/failure-tables", content=text, headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert r.status_code == 201, r.text
    assert fresh.get("/v1/failure-table", headers=READ).json() == json.loads(text)


def test_the_stored_bytes_are_served_verbatim_with_their_signature() -> None:
    """A table stored with its bytes (the trainer's, migration 0009) is
    served exactly as stored, with its signature in X-Polycorn-Signature:
    a signature is over those bytes, whatever a re-serialisation of the
    JSONB body would give (here: the space, the order and the field the API
    does not know are kept). A table stored without bytes (before 0009) is
    re-serialised as before, and a table without a signature has no
    signature header."""
    data = (
        b'{"version": 1, "format":"polycorn-failure-table/1","source":"trainer",'
        b'"entries":[{"cell":7,"direction":"increasing","position_m":100.5,"x":1}]}'
    )
    with fresh_database() as url:
        with psycopg.connect(url) as c:
            c.execute(
                "INSERT INTO failure_tables (version, etag, entries, body, note, body_bytes, "
                "signature) VALUES (1, %s, 1, %s, 'trainer', %s, 'c2lnbmF0dXJl')",
                (hashlib.sha256(data).hexdigest(), data.decode(), data),
            )
        with TestClient(create_app(settings_for(url))) as client:
            for path, headers in (("/v1/failure-table", TABLE), ("/v1/failure-tables/1", READ)):
                r = client.get(path, headers=headers)
                assert r.status_code == 200 and r.content == data, path
                assert r.headers["x-polycorn-signature"] == "c2lnbmF0dXJl"
                assert r.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
            # Published through the API: stored bytes, no signature.
            r = client.post("/v1/failure-tables", json=table(E1), headers=ADMIN)
            assert r.status_code == 201, r.text
            cur = client.get("/v1/failure-table", headers=TABLE)
            assert cur.json()["version"] == 2 and "x-polycorn-signature" not in cur.headers
        with psycopg.connect(url) as c:
            stored = c.execute("SELECT body_bytes FROM failure_tables WHERE version = 2").fetchone()
            assert stored is not None and bytes(stored[0]) == cur.content
            # A row from before migration 0009: re-serialised from its body.
            c.execute("UPDATE failure_tables SET body_bytes = NULL, signature = NULL")
        with TestClient(create_app(settings_for(url))) as client:
            old = client.get("/v1/failure-tables/1", headers=READ)
            assert old.content == (
                b'{"entries":[{"cell":7,"direction":"increasing","position_m":100.5}],'
                b'"format":"polycorn-failure-table/1","source":"trainer","version":1}'
            )
