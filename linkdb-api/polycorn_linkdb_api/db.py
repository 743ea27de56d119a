"""The database engine (the per-request connection: ``deps.db``).

Sync SQLAlchemy over psycopg 3: FastAPI runs the (plain ``def``) handlers in
its thread pool, each with a pooled connection. Every query is one
round-trip that returns ready-made JSON, so the Python side stays thin.
Sessions run in UTC, so the JSON PostgreSQL builds carries ``+00:00`` times.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine

from polycorn_linkdb_api.settings import DatabaseSettings
from polycorn_schema.linkdb.cli import sqlalchemy_url


def make_engine(s: DatabaseSettings) -> Engine:
    return create_engine(
        sqlalchemy_url(s.url),
        pool_size=s.pool_size,
        max_overflow=s.pool_size,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={
            "options": f"-c timezone=UTC -c statement_timeout={s.statement_timeout_ms}",
            "application_name": "polycorn-linkdb-api",
            "connect_timeout": 5,
        },
    )
