"""The database: an asyncio psycopg 3 connection pool (``deps.db``).

The handlers are ``async def`` and await their one query on a pooled
``AsyncConnection``: no thread pool, no ORM. Connections are in autocommit
(a read is one round-trip, no BEGIN/COMMIT; writers open
``conn.transaction()``), run in UTC (the JSON PostgreSQL builds carries
``+00:00`` times) under the statement timeout, and psycopg prepares a query
server-side once it has run a few times (``prepare_threshold``), which saves
parsing. Every execution is still planned for its own values
(``plan_cache_mode=force_custom_plan``): the hot routes' best plans depend on
them. A prepared statement's generic plan cannot see a bbox, so PostGIS
estimates every viewport at 0.01 % of the table; at about a million handovers
that makes a bitmap scan plus sort of the whole viewport cost within 7 % of
the nearest-neighbour page (docs/api.md, "Plans"), and which one a
connection runs then hangs on small changes of the table's statistics: 125 ms
a page instead of 4 ms. Planning each execution costs well under a
millisecond. The plans are pinned by tests/test_plans.py. Every query
returns ready-made JSON text that is sent as the body, so the Python side
stays thin. When every connection is busy and ``max_waiting`` requests
already wait, the next one is refused at once (``TooManyRequests`` → 503)
rather than queued without bound.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from polycorn_linkdb_api.settings import DatabaseSettings


def conninfo(url: str) -> str:
    """A libpq URL (``postgresql+psycopg://`` accepted too)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def connect_kwargs(s: DatabaseSettings) -> dict[str, Any]:
    """What every pooled connection is opened with (the plan tests open theirs
    with the same)."""
    return {
        "autocommit": True,
        "prepare_threshold": s.prepare_threshold,
        "options": (
            f"-c timezone=UTC -c statement_timeout={s.statement_timeout_ms} "
            "-c plan_cache_mode=force_custom_plan"
        ),
        "application_name": "polycorn-linkdb-api",
        "connect_timeout": 5,
    }


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
        kwargs=connect_kwargs(s),
    )
