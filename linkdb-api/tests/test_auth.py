"""API keys and scopes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import hash_key, load_keys, parse_entries
from polycorn_linkdb_api.main import main
from polycorn_schema.testing import fresh_database

from .conftest import ADMIN, ADMIN_KEY, READ, READ_KEY, TABLE, TABLE_KEY, settings_for

EMPTY_TABLE = {"format": "polycorn-failure-table/1", "entries": []}


def test_no_key_is_401_with_a_challenge(client: TestClient) -> None:
    r = client.get("/v1/cells")
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert r.headers["content-type"] == "application/problem+json"
    assert "API key" in r.json()["detail"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer wrong"},
        {"X-API-Key": "wrong"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer "},
    ],
)
def test_a_wrong_key_is_401(client: TestClient, headers: dict[str, str]) -> None:
    r = client.get("/v1/cells", headers=headers)
    assert r.status_code == 401
    assert "www-authenticate" in r.headers


def test_both_headers_carry_a_key(client: TestClient) -> None:
    assert client.get("/v1/cells", headers={"X-API-Key": READ_KEY}).status_code == 200
    assert (
        client.get("/v1/cells", headers={"Authorization": f"bearer {READ_KEY}"}).status_code == 200
    )


def test_admin_implies_read_but_read_cannot_publish(client: TestClient) -> None:
    assert client.get("/v1/cells", headers=ADMIN).status_code == 200
    r = client.post("/v1/failure-tables", json=EMPTY_TABLE, headers=READ)
    assert r.status_code == 403
    assert "admin" in r.json()["detail"]


def test_a_table_key_reads_the_current_table_and_nothing_else() -> None:
    """The relays' and proxies' key: `GET /v1/failure-table`, and 403 on every
    other /v1 route (walked from the app's routes, so a new route is covered
    without touching this test)."""
    entry = {"cell": 7, "direction": "increasing", "position_m": 1.5, "failures": 1}
    published = {**EMPTY_TABLE, "entries": [{**entry, "handovers": 2}]}
    with fresh_database() as url, TestClient(create_app(settings_for(url))) as c:
        assert c.get("/v1/failure-table", headers=TABLE).status_code == 404, "no table yet"
        assert c.post("/v1/failure-tables", json=published, headers=ADMIN).status_code == 201
        r = c.get("/v1/failure-table", headers=TABLE)
        assert r.status_code == 200, r.text
        assert r.json()["entries"][0]["cell"] == 7
        etag = r.headers["etag"]
        r = c.get("/v1/failure-table", headers={**TABLE, "If-None-Match": etag})
        assert r.status_code == 304
        bearer = {"Authorization": f"Bearer {TABLE_KEY}"}
        assert c.get("/v1/failure-table", headers=bearer).status_code == 200
        for who in (READ, ADMIN):
            assert c.get("/v1/failure-table", headers=who).status_code == 200, "read/admin imply it"

        checked = []
        paths: dict[str, dict[str, object]] = c.get("/openapi.json").json()["paths"]
        for template, operations in paths.items():
            if not template.startswith("/v1/") or template == "/v1/failure-table":
                continue
            path = re.sub(r"\{[^}]+\}", "1", template)
            for method in operations:
                r = c.request(method.upper(), path, headers=TABLE, json=published)
                assert r.status_code == 403, (method, path, r.status_code, r.text)
                assert "table" in r.json()["detail"]
                checked.append(f"{method.upper()} {template}")
        for must in ("GET /v1/trains", "GET /v1/handovers", "GET /v1/trips", "GET /v1/cells"):
            assert must in checked
        assert "GET /v1/failure-tables/{version}" in checked
        assert "POST /v1/failure-tables" in checked
        assert c.get("/v1/handovers", headers=READ).status_code == 200


def test_metrics_can_require_a_key(seeded: str) -> None:
    with TestClient(create_app(settings_for(seeded, metrics_public=False))) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=READ).status_code == 200
    with TestClient(create_app(settings_for(seeded))) as c:
        assert c.get("/metrics").status_code == 200


def test_key_entries_are_checked(tmp_path: Path) -> None:
    h = hash_key("k")
    assert parse_entries(f"a:read:{h}, b:admin:{h.upper()}", "env")[h].name == "b"
    for bad, why in [
        ("a:read", "name:scope:sha256hex"),
        (f"a:write:{h}", "not one of table, read, admin"),
        ("a:read:plaintextkey", "64 hex"),
        (f"a b:read:{h}", "bad name"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_entries(bad, "env")
    f = tmp_path / "keys"
    f.write_text(f"# operators\nops:admin:{h}\n\n")
    assert load_keys("", f)[h].scope == "admin"
    assert parse_entries(f"relay:table:{h}", "env")[h].scope == "table"


def test_hash_key_prints_an_entry_that_authenticates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["hash-key", "--key", ADMIN_KEY, "ci", "admin"]) == 0
    assert capsys.readouterr().out.strip() == f"ci:admin:{hash_key(ADMIN_KEY)}"
    assert main(["hash-key", "fresh", "read"]) == 0
    out = capsys.readouterr()
    key = out.err.split(": ")[-1].strip()
    assert out.out.strip() == f"fresh:read:{hash_key(key)}"
    assert len(key) > 40
    assert main(["hash-key", "--key", TABLE_KEY, "proxy-7", "table"]) == 0
    assert capsys.readouterr().out.strip() == f"proxy-7:table:{hash_key(TABLE_KEY)}"
