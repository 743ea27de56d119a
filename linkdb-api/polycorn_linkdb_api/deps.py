"""Dependencies shared by the routes: authentication and the database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from polycorn_linkdb_api.auth import KeyStore, Principal, Scope

# Declared for OpenAPI (the "Authorize" button of /docs); KeyStore reads the
# headers itself so that every failure is the same problem document.
_bearer = HTTPBearer(auto_error=False, description="an API key as a bearer token")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="an API key")


def _requires(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits a key with ``scope`` (or one implying it)."""

    async def dependency(
        request: Request,
        _b: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        _k: Annotated[str | None, Depends(_api_key)],
    ) -> Principal:
        keys: KeyStore = request.app.state.keys
        return keys.require(request, scope)

    dependency.__name__ = f"{scope.name}_scope"
    return dependency


table_scope = _requires(Scope.table)
read_scope = _requires(Scope.read)
admin_scope = _requires(Scope.admin)


# `table` is the relays' and proxies' key: the current failure table only.
TableReader = Annotated[Principal, Depends(table_scope)]
Reader = Annotated[Principal, Depends(read_scope)]
Admin = Annotated[Principal, Depends(admin_scope)]


@asynccontextmanager
async def db(request: Request) -> AsyncIterator[AsyncConnection]:
    """A pooled connection (autocommit: each statement is its own
    transaction; writers use ``conn.transaction()``)."""
    pool: AsyncConnectionPool[AsyncConnection] | None = getattr(request.app.state, "pool", None)
    if pool is None:
        raise RuntimeError("the database pool is opened by the app's lifespan; none is running")
    async with pool.connection() as conn:
        yield conn
