"""Responses built from JSON text that PostgreSQL produced."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection

from polycorn_linkdb_api.errors import Problem

GEOJSON = "application/geo+json"


_BIND = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=512)
def pg(sql: str) -> str:
    """``:name`` binds (SQLAlchemy style, easier to read) as psycopg's
    ``%(name)s``; ``::casts`` are left alone. The SQL holds no ``%``."""
    return _BIND.sub(r"%(\1)s", sql)


async def fetchall(
    conn: AsyncConnection, sql: str, binds: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    cur = await conn.execute(pg(sql), binds)
    return await cur.fetchall()


async def fetchone(
    conn: AsyncConnection, sql: str, binds: Mapping[str, Any] | None = None
) -> tuple[Any, ...] | None:
    cur = await conn.execute(pg(sql), binds)
    return await cur.fetchone()


class JSONTextResponse(JSONResponse):
    """JSON that is already text (PostgreSQL made it): sent as is. A
    JSONResponse subclass so that OpenAPI documents the response model."""

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        if isinstance(content, str):
            return content.encode()
        return super().render(content)


class GeoJSONResponse(JSONTextResponse):
    media_type = GEOJSON


def _problem(desc: str) -> dict[str, Any]:
    return {
        "description": desc,
        "content": {"application/problem+json": {"schema": Problem.model_json_schema()}},
    }


# Documented on every authenticated route (422 is added by app.custom_openapi).
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _problem("no API key, or an unknown one (see WWW-Authenticate)"),
    403: _problem("the key lacks the scope"),
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: _problem("no such resource")}


def page(
    request: Request,
    rows: Sequence[Any],
    limit: int,
    next_cursor: str | None,
    *,
    collection: bool,
    response_class: type[Response] = GeoJSONResponse,
    headers: dict[str, str] | None = None,
) -> Response:
    """A page whose rows' first column is one item's JSON text. The caller
    fetched ``limit + 1`` rows; ``next_cursor`` is built from row ``limit - 1``
    when there is a row after it."""
    items = ",".join(r[0] for r in rows[:limit])
    more = len(rows) > limit
    nxt = (
        str(request.url.include_query_params(cursor=next_cursor)) if more and next_cursor else None
    )
    cursor_json = json.dumps(next_cursor if more else None)
    meta = (
        f'"next":{json.dumps(nxt)},"next_cursor":{cursor_json},'
        f'"number_returned":{min(len(rows), limit)}'
    )
    if collection:
        body = f'{{"type":"FeatureCollection","features":[{items}],{meta}}}'
    else:
        body = f'{{"items":[{items}],{meta}}}'
    hdrs = dict(headers or {})
    if nxt:
        hdrs["Link"] = f'<{nxt}>; rel="next"'
    return response_class(body, headers=hdrs)
