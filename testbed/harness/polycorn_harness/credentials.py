"""The compose fleet's credentials, made at its first start and kept.

docker-compose.yml has no default password: each one is a variable that
must be set (``${VAR:?...}``). :func:`ensure` makes the file that sets them,
random values in an env file of mode 0600, the first time, and reads it
back afterwards, adding only what a newer docker-compose.yml needs; no
value is ever printed. ``docker compose --env-file FILE up`` (or the harness,
:mod:`polycorn_harness.compose`) passes them on.

    python -m polycorn_harness.credentials [FILE]   (default .polycorn/compose.env)
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_FILE = ROOT / ".polycorn" / "compose.env"

# Every credential of docker-compose.yml (the LinkDB superuser that runs the
# migrations, one login per service, Grafana's read-only login and admin,
# linkdb-api's read key).
NAMES = (
    "POLYCORN_DB_PASSWORD",
    "POLYCORN_DB_INGEST_PASSWORD",
    "POLYCORN_DB_API_PASSWORD",
    "POLYCORN_DB_TRAINER_PASSWORD",
    "POLYCORN_DB_GRAFANA_PASSWORD",
    "POLYCORN_GRAFANA_ADMIN_PASSWORD",
    "POLYCORN_API_READ_KEY",
)
# What linkdb-api is given instead of its key: the key's SHA-256 (its
# POLYCORN_API_KEYS entry, name:scope:sha256hex), so the API's container
# never holds the key itself.
API_KEYS = "POLYCORN_API_KEYS"
LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=([0-9a-z:]{32,160})$")


def api_keys(read_key: str) -> str:
    """linkdb-api's ``POLYCORN_API_KEYS`` for the compose read key."""
    return f"compose:read:{hashlib.sha256(read_key.encode()).hexdigest()}"


def read(path: Path) -> dict[str, str]:
    """The credentials in ``path`` (an error for a line that is not ours)."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            raise ValueError(f"{path}:{n}: not NAME=<hex> (remove the file to make a new one)")
        out[m.group(1)] = m.group(2)
    return out


def ensure(path: Path = DEFAULT_FILE) -> dict[str, str]:
    """The credentials of ``path``, made (mode 0600) with the missing ones."""
    have = read(path) if path.exists() else {}
    if path.exists() and path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others: chmod 600 it (or remove it)")
    missing = [n for n in NAMES if n not in have]
    if not missing and have.get(API_KEYS) == api_keys(have["POLYCORN_API_READ_KEY"]):
        return have
    have |= {n: secrets.token_hex(24) for n in missing}
    have[API_KEYS] = api_keys(have["POLYCORN_API_READ_KEY"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# Polycorn compose credentials, made at first start; keep this file private.\n")
        f.writelines(f"{k}={v}\n" for k, v in sorted(have.items()))
    tmp.replace(path)
    return have


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_FILE
    ensure(path)
    print(f"credentials: {path} (mode 0600; docker compose --env-file {path} up -d)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
