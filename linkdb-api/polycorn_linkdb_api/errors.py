"""Every error is an RFC 9457 problem document (``application/problem+json``).

Domain errors are raised as :class:`ApiError` subclasses; the table
``STATUS`` maps each to its HTTP status in one place. FastAPI's validation
errors become 422 problems that name every bad parameter; database errors
that valid-looking input can still provoke become 422 (a value out of the
database's range) or 503 (database unreachable), never 500.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"


class InvalidParam(BaseModel):
    name: str = Field(
        description="where the bad value is: query.bbox, path.cell_id, body.entries.0.cell"
    )
    reason: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = Field(default="about:blank")
    title: str
    status: int
    detail: str
    instance: str | None = None
    invalid_params: list[InvalidParam] | None = Field(
        default=None, alias="invalid-params", description="present on 422"
    )


class ApiError(Exception):
    """A domain error; its HTTP status comes from ``STATUS``."""

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class NotFoundError(ApiError):
    pass


class UnauthenticatedError(ApiError):
    pass


class ForbiddenError(ApiError):
    pass


class ConflictError(ApiError):
    pass


class InvalidInputError(ApiError):
    """Input that passed the parameter types but not a domain rule."""

    def __init__(self, detail: str, params: list[InvalidParam] | None = None) -> None:
        super().__init__(detail)
        self.params = params or []


class UnavailableError(ApiError):
    pass


STATUS: dict[type[ApiError], tuple[int, str]] = {
    InvalidInputError: (422, "Unprocessable Content"),
    UnauthenticatedError: (401, "Unauthorized"),
    ForbiddenError: (403, "ForbiddenError"),
    NotFoundError: (404, "Not Found"),
    ConflictError: (409, "ConflictError"),
    UnavailableError: (503, "Service UnavailableError"),
}

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "ForbiddenError",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "ConflictError",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service UnavailableError",
}


def problem(
    status: int,
    detail: str,
    request: Request | None = None,
    *,
    params: list[InvalidParam] | None = None,
    headers: dict[str, str] | None = None,
    title: str | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title or TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if request is not None:
        body["instance"] = request.url.path
    if params:
        body["invalid-params"] = [p.model_dump() for p in params]
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM)


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(x) for x in loc)


def _reason(err: dict[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    if "input" in err and err.get("type") not in ("missing",):
        shown = repr(err["input"])
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = f"{msg} (got {shown})"
    return msg


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        status, title = STATUS.get(type(exc), (500, "Internal Server Error"))
        params = exc.params if isinstance(exc, InvalidInputError) else None
        return problem(status, exc.detail, request, params=params, headers=exc.headers, title=title)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        params = [InvalidParam(name=_loc(e["loc"]), reason=_reason(e)) for e in exc.errors()]
        detail = "; ".join(f"{p.name}: {p.reason}" for p in params) or "invalid request"
        return problem(422, detail, request, params=params)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such resource: {request.url.path} (the API lives under /v1/, see /docs)"
        return problem(exc.status_code, detail, request, headers=dict(exc.headers or {}))

    @app.exception_handler(psycopg.DataError)
    async def data_error(request: Request, exc: Exception) -> JSONResponse:
        # Valid-looking input the database still refuses (a number or time
        # beyond its range): the client's to fix.
        log.info("database refused a parameter: %s", exc)
        first = str(exc).splitlines()[0] if str(exc) else "value out of range"
        return problem(422, f"a parameter is out of the database's range: {first}", request)

    @app.exception_handler(psycopg.OperationalError)
    async def db_down(request: Request, exc: Exception) -> JSONResponse:
        # Unreachable, a statement timeout, or the pool's queue full
        # (psycopg_pool's PoolTimeout and TooManyRequests).
        log.warning("database unavailable: %s", exc)
        return problem(
            503, "LinkDB is unavailable; retry later", request, headers={"Retry-After": "1"}
        )

    @app.exception_handler(psycopg.Error)
    async def db_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("database error: %s", exc, exc_info=exc)
        return problem(500, "internal database error (logged)", request)
