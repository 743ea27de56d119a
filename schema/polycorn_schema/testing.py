"""Test support shared by the services' test suites: throw-away LinkDB databases
on the real PostgreSQL + PostGIS that ``scripts/infra.sh up pg`` starts.

Tests read ``POLYCORN_DATABASE_URL`` (``scripts/infra.sh env``) and fail, not
skip, when it is missing: a silently skipped database test proves nothing.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from polycorn_schema.linkdb.cli import upgrade
from polycorn_schema.startup import pg_connect


def base_url() -> str:
    url = os.environ.get("POLYCORN_DATABASE_URL")
    if not url:
        raise RuntimeError(
            "POLYCORN_DATABASE_URL is not set: start PostGIS with `scripts/infra.sh up pg` and "
            'run `eval "$(scripts/infra.sh env)"` (make test-py does both)'
        )
    return url


def with_database(url: str, dbname: str) -> str:
    head, _, _ = url.rpartition("/")
    return f"{head}/{dbname}"


@contextmanager
def fresh_database(migrate: bool = True, prefix: str = "linkdb_test") -> Iterator[str]:
    """A new, empty database (PostGIS enabled, migrated to head unless
    ``migrate`` is false) on the test server; dropped afterwards."""
    admin = with_database(base_url(), "postgres")
    name = f"{prefix}_{secrets.token_hex(4)}"
    with pg_connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = with_database(base_url(), name)
    try:
        with pg_connect(url, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS postgis")
        if migrate:
            upgrade(url)
        yield url
    finally:
        with pg_connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
