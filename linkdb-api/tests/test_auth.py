"""API keys and scopes."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import hash_key, load_keys, parse_entries
from polycorn_linkdb_api.main import main

from .conftest import ADMIN, ADMIN_KEY, READ, READ_KEY, settings_for

TABLE = {"format": "polycorn-failure-table/1", "entries": []}


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
    r = client.post("/v1/failure-tables", json=TABLE, headers=READ)
    assert r.status_code == 403
    assert "admin" in r.json()["detail"]


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
        (f"a:write:{h}", "not read or admin"),
        ("a:read:plaintextkey", "64 hex"),
        (f"a b:read:{h}", "bad name"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_entries(bad, "env")
    f = tmp_path / "keys"
    f.write_text(f"# operators\nops:admin:{h}\n\n")
    assert load_keys("", f)[h].scope == "admin"


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
