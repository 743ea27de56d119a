"""The API's connection pool takes sslmode and sslrootcert from its URL
(the chart sets verify-full): against the infra PostgreSQL with TLS."""

from __future__ import annotations

import asyncio

from polycorn_linkdb_api.db import make_pool
from polycorn_linkdb_api.settings import DatabaseSettings
from polycorn_schema.testing import fresh_database, tls_url


def test_the_pool_connects_with_verify_full() -> None:
    async def ssl_in_use(url: str) -> object:
        pool = make_pool(DatabaseSettings(url=url, pool_size=1))
        await pool.open(wait=True, timeout=30)
        try:
            async with pool.connection() as c:
                cur = await c.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                row = await cur.fetchone()
                return None if row is None else row[0]
        finally:
            await pool.close()

    with fresh_database() as url:
        assert asyncio.run(ssl_in_use(tls_url(url))) is True
        # postgresql+psycopg:// (SQLAlchemy's spelling) keeps its query too.
        alt = tls_url(url).replace("postgresql://", "postgresql+psycopg://", 1)
        assert asyncio.run(ssl_in_use(alt)) is True
