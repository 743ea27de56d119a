"""The database: an asyncio psycopg 3 connection pool (``deps.db``).

The handlers are ``async def`` and await their one query on a pooled
``AsyncConnection``: no thread pool, no ORM. Connections are in autocommit
(a read is one round-trip, no BEGIN/COMMIT; writers open
``conn.transaction()``), run in UTC (the JSON PostgreSQL builds carries
``+00:00`` times) under the statement timeout, and psycopg prepares a query
server-side once it has run a few times (``prepare_threshold``). Every query
returns ready-made JSON text that is sent as the body, so the Python side
stays thin. When every connection is busy and ``max_waiting`` requests
already wait, the next one is refused at once (``TooManyRequests`` → 503)
rather than queued without bound.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from polycorn_linkdb_api.settings import DatabaseSettings


def conninfo(url: str) -> str:
    """A libpq URL (``postgresql+psycopg://`` accepted too)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def make_pool(s: DatabaseSettings) -> AsyncConnectionPool[AsyncConnection]:
    """Not opened: ``create_app``'s lifespan opens it in the serving loop."""
    return AsyncConnectionPool(
        conninfo(s.url),
        min_size=s.pool_size,
        max_size=s.pool_size,
        open=False,
        timeout=5,
        max_waiting=s.pool_max_waiting,
        name="linkdb-api",
        kwargs={
            "autocommit": True,
            "prepare_threshold": s.prepare_threshold,
            "options": f"-c timezone=UTC -c statement_timeout={s.statement_timeout_ms}",
            "application_name": "polycorn-linkdb-api",
            "connect_timeout": 5,
        },
    )
