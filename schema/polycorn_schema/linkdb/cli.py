"""``polycorn-linkdb``: apply LinkDB's migrations and inspect the schema version.

    polycorn-linkdb upgrade [--url URL] [REVISION]     (default: head)
    polycorn-linkdb downgrade [--url URL] REVISION
    polycorn-linkdb current [--url URL]
    polycorn-linkdb revision -m MESSAGE [--autogenerate]   (developers)

The database URL comes from ``--url`` or ``POLYCORN_DATABASE_URL``
(``postgresql://user@host:port/db``; the psycopg 3 driver is used).
"""

from __future__ import annotations

import argparse
import os
import sys

from alembic import command
from alembic.config import Config


def sqlalchemy_url(url: str) -> str:
    """A libpq-style URL as SQLAlchemy's psycopg 3 URL."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {url!r} (expected postgresql://user@host:port/db)")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "polycorn_schema.linkdb:migrations")
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (used by services and tests)."""
    command.upgrade(alembic_config(url), revision)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn-linkdb", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("POLYCORN_DATABASE_URL"))
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upgrade")
    up.add_argument("revision", nargs="?", default="head")
    down = sub.add_parser("downgrade")
    down.add_argument("revision")
    sub.add_parser("current")
    rev = sub.add_parser("revision")
    rev.add_argument("-m", "--message", required=True)
    rev.add_argument("--autogenerate", action="store_true")
    a = p.parse_args(argv)
    if not a.url:
        p.error("no database: give --url or set POLYCORN_DATABASE_URL")
    try:
        cfg = alembic_config(a.url)
    except ValueError as e:
        p.error(str(e))
    if a.cmd == "upgrade":
        command.upgrade(cfg, a.revision)
    elif a.cmd == "downgrade":
        command.downgrade(cfg, a.revision)
    elif a.cmd == "current":
        command.current(cfg, verbose=True)
    else:
        command.revision(cfg, message=a.message, autogenerate=a.autogenerate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
