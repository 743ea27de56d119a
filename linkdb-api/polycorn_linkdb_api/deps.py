"""Dependencies shared by the routes: authentication and the database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, Engine

from polycorn_linkdb_api.auth import KeyStore, Principal, Scope

# Declared for OpenAPI (the "Authorize" button of /docs); KeyStore reads the
# headers itself so that every failure is the same problem document.
_bearer = HTTPBearer(auto_error=False, description="an API key as a bearer token")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="an API key")


async def read_scope(
    request: Request,
    _b: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _k: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    keys: KeyStore = request.app.state.keys
    return keys.require(request, Scope.read)


async def admin_scope(
    request: Request,
    _b: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _k: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    keys: KeyStore = request.app.state.keys
    return keys.require(request, Scope.admin)


Reader = Annotated[Principal, Depends(read_scope)]
Admin = Annotated[Principal, Depends(admin_scope)]


@contextmanager
def db(request: Request) -> Iterator[Connection]:
    """A pooled connection in one transaction; used inside the (threadpool)
    handler itself, so a request costs one thread hop, not two."""
    engine: Engine = request.app.state.engine
    with engine.begin() as conn:
        yield conn
