"""The compose fleet's credentials: made once, private, reused, never printed."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from polycorn_harness import credentials


def test_made_at_first_start_private_and_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "sub" / "compose.env"
    first = credentials.ensure(f)
    assert set(first) == {*credentials.NAMES, credentials.API_KEYS}
    assert len(set(first.values())) == len(first), "every credential is its own"
    assert all(len(first[n]) == 48 for n in credentials.NAMES)
    # linkdb-api gets the read key's hash, which the key matches.
    name, scope, digest = first[credentials.API_KEYS].split(":")
    assert (name, scope) == ("compose", "read")
    assert digest == hashlib.sha256(first["POLYCORN_API_READ_KEY"].encode()).hexdigest()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert credentials.ensure(f) == first, "a second start reuses them"
    # A credential a newer compose file needs is added; the others are kept.
    lines = [ln for ln in f.read_text().splitlines() if "GRAFANA_ADMIN" not in ln]
    f.write_text("\n".join(lines) + "\n")
    again = credentials.ensure(f)
    assert {k: again[k] for k in first if "GRAFANA_ADMIN" not in k} == {
        k: v for k, v in first.items() if "GRAFANA_ADMIN" not in k
    }
    assert again["POLYCORN_GRAFANA_ADMIN_PASSWORD"] != first["POLYCORN_GRAFANA_ADMIN_PASSWORD"]
    assert credentials.main([str(f)]) == 0
    out = capsys.readouterr()
    assert not any(v in out.out + out.err for v in again.values()), "never printed"


def test_a_file_others_can_read_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "compose.env"
    credentials.ensure(f)
    f.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        credentials.ensure(f)


def test_docker_compose_has_no_fixed_password() -> None:
    text = (credentials.ROOT / "docker-compose.yml").read_text()
    for name in (*credentials.NAMES, credentials.API_KEYS):
        if name == "POLYCORN_API_READ_KEY":
            continue  # the API is given its hash, API_KEYS
        assert f"${{{name}:-" not in text, f"{name} has a default in docker-compose.yml"
        assert f"${{{name}:?" in text, f"{name} is not required by docker-compose.yml"
