"""The failure-location tables: the current one for the proxies to poll
(ETag / If-None-Match → 304), any version, the list, and publication.

A table is served as the exact bytes its publisher stored
(``failure_tables.body_bytes``), with the trainer's signature of them in
``X-Polycorn-Signature`` when it has one; tables stored before those
columns existed are re-serialised from ``body`` (their ETag was computed
from those canonical bytes)."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from psycopg import AsyncConnection
from psycopg import errors as pgerr

from polycorn_linkdb_api.deps import Admin, Reader, TableReader, db
from polycorn_linkdb_api.errors import (
    ConflictError,
    ForbiddenError,
    InvalidInputError,
    InvalidParam,
    NotFoundError,
)
from polycorn_linkdb_api.failure_table import (
    TableFile,
    TableIn,
    canonical_dict,
    if_none_match,
    reserialise,
)
from polycorn_linkdb_api.params import BIGINT_MAX, CursorParam, Limit, encode_cursor, int_cursor
from polycorn_linkdb_api.routes.common import (
    AUTH_ERRORS,
    NOT_FOUND,
    JSONTextResponse,
    fetchall,
    fetchone,
    page,
)
from polycorn_linkdb_api.schemas import TableList, TableMeta
from polycorn_schema.failure_table import (
    HTTP_SIGNATURE_HEADER,
    PUBLISH_LOCK,
    canonical,
    etag_of,
)

router = APIRouter(prefix="/v1", tags=["failure tables"])

NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "If-None-Match matched the current ETag: keep your copy"}
}
ETAG_HEADER = {
    "ETag": {"description": "strong validator: SHA-256 of the body", "schema": {"type": "string"}}
}
SIGNATURE_HEADER = {
    HTTP_SIGNATURE_HEADER: {
        "description": "the trainer's Ed25519 signature of exactly the body, base64 "
        "(absent: the table is unsigned)",
        "schema": {"type": "string"},
    }
}


class BodyCache:
    """Canonical bytes of recently served versions (rows never change). One
    per worker; the event loop is its only user, so it needs no lock."""

    def __init__(self, size: int = 8) -> None:
        self._d: OrderedDict[int, bytes] = OrderedDict()
        self._size = size

    def peek(self, version: int) -> bytes | None:
        return self._d.get(version)

    async def get(self, conn: AsyncConnection, version: int) -> bytes:
        hit = self._d.get(version)
        if hit is not None:
            return hit
        row = await fetchone(
            conn,
            "SELECT body_bytes, body FROM failure_tables WHERE version = :v",
            {"v": version},
        )
        if row is None:
            raise NotFoundError(f"no failure-location table version {version}")
        # The stored bytes verbatim (they are what is signed); re-serialised
        # only for a table stored before migration 0009.
        data = bytes(row[0]) if row[0] is not None else reserialise(row[1])
        self._d[version] = data
        while len(self._d) > self._size:
            self._d.popitem(last=False)
        return data


async def _serve(
    request: Request,
    conn: AsyncConnection,
    *,
    version: int,
    etag: str,
    signature: str | None,
    if_none: str | None,
    cache_control: str,
) -> Response:
    """304 without touching the body; else the cached bytes (read once per
    version and worker). The signature is not cached: the trainer re-signs
    a table when its key changes."""
    headers = {"ETag": f'"{etag}"', "Cache-Control": cache_control}
    if signature is not None:
        headers[HTTP_SIGNATURE_HEADER] = signature
    if if_none_match(if_none, etag):
        return Response(status_code=304, headers=headers)
    cache: BodyCache = request.app.state.table_cache
    data = cache.peek(version)
    if data is None:
        data = await cache.get(conn, version)
    return JSONTextResponse(data, headers=headers)


IfNoneMatch = Annotated[
    str | None,
    Header(max_length=1000, description="the ETag you hold; 304 when it is still current"),
]


@router.get(
    "/failure-table",
    response_model=TableFile,
    response_class=JSONTextResponse,
    responses={
        200: {"headers": {**ETAG_HEADER, **SIGNATURE_HEADER}},
        **NOT_MODIFIED,
        **AUTH_ERRORS,
        **NOT_FOUND,
    },
    summary="The current failure-location table (for the proxies)",
)
async def current_table(
    request: Request, _who: TableReader, if_none_match: IfNoneMatch = None
) -> Response:
    """The highest published version, in the proxies' file format. Poll with
    `If-None-Match: <ETag>`: 304 while it is unchanged. 404 until a first
    table is published (a proxy then runs without one). The body is the
    exact bytes published; `X-Polycorn-Signature` is the trainer's signature
    of them (relays and proxies with `--failure-table-verify-key` need it).
    The one route a `table` key (the relays' and proxies') may read."""
    max_age = request.app.state.settings.api.table_max_age_s
    async with db(request) as conn:
        row = await fetchone(
            conn,
            "SELECT version, etag, signature FROM failure_tables ORDER BY version DESC LIMIT 1",
        )
        if row is None:
            raise NotFoundError("no failure-location table has been published yet")
        return await _serve(
            request,
            conn,
            version=row[0],
            etag=row[1],
            signature=row[2],
            if_none=if_none_match,
            cache_control=f"private, max-age={max_age}, must-revalidate",
        )


@router.get(
    "/failure-tables/{version}",
    response_model=TableFile,
    response_class=JSONTextResponse,
    responses={
        200: {"headers": {**ETAG_HEADER, **SIGNATURE_HEADER}},
        **NOT_MODIFIED,
        **AUTH_ERRORS,
        **NOT_FOUND,
    },
    summary="One version of the failure-location table",
)
async def table_version(
    request: Request,
    _who: Reader,
    version: Annotated[int, Path(ge=1, le=BIGINT_MAX)],
    if_none_match: IfNoneMatch = None,
) -> Response:
    """A published version; versions never change, so it may be cached for good."""
    async with db(request) as conn:
        row = await fetchone(
            conn,
            "SELECT etag, signature FROM failure_tables WHERE version = :v",
            {"v": version},
        )
        if row is None:
            raise NotFoundError(f"no failure-location table version {version}")
        return await _serve(
            request,
            conn,
            version=version,
            etag=row[0],
            signature=row[1],
            if_none=if_none_match,
            cache_control="private, max-age=31536000, immutable",
        )


META = """json_build_object('version', f.version, 'etag', f.etag, 'entries', f.entries,
  'created_at', f.created_at, 'model_id', f.model_id, 'note', f.note)::text"""


@router.get(
    "/failure-tables",
    response_model=TableList,
    response_class=JSONTextResponse,
    responses=AUTH_ERRORS,
    summary="Published failure-location tables, newest first",
)
async def list_tables(
    request: Request, _who: Reader, limit: Limit = 100, cursor: CursorParam = None
) -> Response:
    """Metadata of every published version (no bodies), newest first."""
    before = int_cursor(cursor, "failure-tables")
    binds: dict[str, Any] = {"lim": limit + 1}
    where = ""
    if before is not None:
        where = "WHERE f.version < :before"
        binds["before"] = before
    async with db(request) as conn:
        rows = await fetchall(
            conn,
            f"SELECT {META}, f.version FROM failure_tables f {where} "
            "ORDER BY f.version DESC LIMIT :lim",
            binds,
        )
    nxt = encode_cursor("failure-tables", rows[limit - 1][1]) if len(rows) > limit else None
    return page(request, rows, limit, nxt, collection=False, response_class=JSONTextResponse)


async def _publish(
    request: Request, table: TableIn, note: str, model_id: int | None
) -> tuple[str, str, int]:
    async with db(request) as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": PUBLISH_LOCK})
        got = await fetchone(conn, "SELECT coalesce(max(version), 0) + 1 FROM failure_tables")
        version: int = got[0] if got is not None else 1
        if table.version is not None and table.version != version:
            raise ConflictError(
                f"version {table.version} is not the next version ({version}); leave version "
                "out to get the next one"
            )
        if (
            model_id is not None
            and await fetchone(conn, "SELECT 1 FROM models WHERE id = :m", {"m": model_id}) is None
        ):
            raise InvalidInputError(
                f"no model {model_id}",
                [InvalidParam(name="query.model_id", reason=f"no model {model_id}")],
            )
        body = canonical_dict(table, version)
        data = canonical(body)
        etag = etag_of(data)
        meta = await fetchone(
            conn,
            "INSERT INTO failure_tables (version, model_id, etag, entries, body, note, body_bytes) "
            "VALUES (:v, :m, :e, :n, CAST(:b AS jsonb), :note, :data) "
            f"RETURNING {META.replace('f.', '')}",
            {
                "v": version,
                "m": model_id,
                "e": etag,
                "n": len(table.entries),
                "b": json.dumps(body),
                "note": note,
                "data": data,
            },
        )
        if meta is None:  # INSERT ... RETURNING always returns the row
            raise RuntimeError("the INSERT returned no row")
        row: str = meta[0]
    return row, etag, version


@router.post(
    "/failure-tables",
    status_code=201,
    response_model=TableMeta,
    response_class=JSONTextResponse,
    responses={
        **AUTH_ERRORS,
        409: {
            "description": "the table's version is not the next one",
            "content": {"application/problem+json": {}},
        },
    },
    summary="Publish a failure-location table (admin)",
)
async def publish_table(
    request: Request,
    _who: Admin,
    table: TableIn,
    note: Annotated[str, Query(max_length=1000, pattern=r"^[^\x00]*$")] = "",
    model_id: Annotated[
        int | None, Query(ge=1, le=BIGINT_MAX, description="the trainer run (models.id)")
    ] = None,
) -> Response:
    """Validates the table exactly as the proxies' parser does, assigns
    version = previous + 1 (a given `version` must be that number, else 409),
    stores the canonical body and returns its metadata, with the new ETag."""
    try:
        row, etag, version = await _publish(request, table, note, model_id)
    except pgerr.InsufficientPrivilege as e:
        # linkdb-api's database role reads only; publishing needs the
        # linkdb_publisher group, which a deployment grants on purpose.
        raise ForbiddenError(
            "this API's database role may not publish failure tables (it needs the "
            "linkdb_publisher group); publish with polycorn-trainer, which signs the table"
        ) from e
    return JSONTextResponse(
        row,
        status_code=201,
        headers={"ETag": f'"{etag}"', "Location": f"/v1/failure-tables/{version}"},
    )
