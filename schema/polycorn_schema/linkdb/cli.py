"""``polycorn-linkdb``: apply LinkDB's migrations and inspect the schema version.

    polycorn-linkdb upgrade [--url URL] [REVISION]     (default: head)
    polycorn-linkdb downgrade [--url URL] REVISION
    polycorn-linkdb current [--url URL]
    polycorn-linkdb login [--url URL] NAME --role GROUP [--role GROUP] --password-file FILE
    polycorn-linkdb revision -m MESSAGE [--autogenerate]   (developers)

The database URL comes from ``--url`` or ``POLYCORN_DATABASE_URL``
(``postgresql://user@host:port/db``; the psycopg 3 driver is used). A server
that is still starting is waited for, up to ``--wait-s`` (60 s), before the
command runs; then it fails with a message saying so.

``login`` makes (or updates) a LOGIN role for a service: its password is
read from a file and sent only as a SCRAM-SHA-256 verifier computed here
(never in clear text, never printed), and it is made a member of the
groups of migration 0010 (``linkdb_ingest``, ``linkdb_reader``,
``linkdb_trainer``, ``linkdb_publisher``, ``linkdb_owner``), which must
exist: run ``upgrade`` first.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from polycorn_schema.startup import NotReadyError, pg_connect


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


GROUPS = ("linkdb_owner", "linkdb_ingest", "linkdb_reader", "linkdb_trainer", "linkdb_publisher")
LOGIN_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def login(url: str, name: str, groups: list[str], password: str) -> None:
    """Make LOGIN role ``name`` (or update it) with ``password`` and membership
    of ``groups``; the password goes to the server as a SCRAM verifier only."""
    if not LOGIN_NAME.match(name) or name in GROUPS or name.startswith("pg_"):
        raise ValueError(f"{name!r} is not a login name for a service (lower case, a-z 0-9 _)")
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(unknown)} (one of {', '.join(GROUPS)})")
    if not password:
        raise ValueError("the password is empty")
    with pg_connect(url, autocommit=True) as c:
        verifier = c.pgconn.encrypt_password(
            password.encode(), name.encode(), b"scram-sha-256"
        ).decode()
        with c.transaction():
            exists = c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            c.execute(f"{verb} ROLE {name} LOGIN PASSWORD '{verifier}'")
            for g in groups:
                c.execute(f"GRANT {g} TO {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn-linkdb", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("POLYCORN_DATABASE_URL"))
    p.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="wait this long for a starting PostgreSQL (default 60; 0: do not wait)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upgrade")
    up.add_argument("revision", nargs="?", default="head")
    down = sub.add_parser("downgrade")
    down.add_argument("revision")
    sub.add_parser("current")
    lg = sub.add_parser("login", help="make or update a service's LOGIN role")
    lg.add_argument("name")
    lg.add_argument("--role", action="append", required=True, choices=GROUPS)
    lg.add_argument("--password-file", type=Path, required=True)
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
    if a.cmd != "revision" and a.wait_s > 0:
        libpq = "postgresql://" + sqlalchemy_url(a.url)[len("postgresql+psycopg://") :]
        try:
            pg_connect(libpq, timeout_s=a.wait_s).close()
        except NotReadyError as e:
            print(f"polycorn-linkdb: {e}", file=sys.stderr)
            return 1
    if a.cmd == "upgrade":
        command.upgrade(cfg, a.revision)
    elif a.cmd == "downgrade":
        command.downgrade(cfg, a.revision)
    elif a.cmd == "login":
        libpq = "postgresql://" + sqlalchemy_url(a.url)[len("postgresql+psycopg://") :]
        try:
            login(libpq, a.name, a.role, a.password_file.read_text().strip())
        except (ValueError, OSError) as e:
            print(f"polycorn-linkdb: {e}", file=sys.stderr)
            return 1
    elif a.cmd == "current":
        command.current(cfg, verbose=True)
    else:
        command.revision(cfg, message=a.message, autogenerate=a.autogenerate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
