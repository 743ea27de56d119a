"""The FastAPI application: ``create_app(settings)``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from polycorn_linkdb_api import errors
from polycorn_linkdb_api.auth import KeyStore, load_keys
from polycorn_linkdb_api.db import make_pool
from polycorn_linkdb_api.errors import Problem
from polycorn_linkdb_api.metrics import Metrics, MetricsMiddleware
from polycorn_linkdb_api.routes import cells, failure_tables, handovers, health, lines, trains
from polycorn_linkdb_api.routes.failure_tables import BodyCache
from polycorn_linkdb_api.settings import Settings

log = logging.getLogger(__name__)

DESCRIPTION = """\
Polycorn's LinkDB: trains, trips, cells and handovers (GeoJSON), per-cell
statistics, and the failure-location tables the proxies poll.

Authenticate with an API key: `Authorization: Bearer <key>` or
`X-API-Key: <key>`. Scopes: `read` (every GET), `admin` (publishing).
Errors are RFC 9457 problem documents (`application/problem+json`).
Lists are keyset-paginated: follow `next` until it is null.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    keys = load_keys(settings.api.keys, settings.api.keys_file)
    if not keys:
        log.warning("no API keys configured: every /v1 request will be refused (401)")
    db_settings = settings.database

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Opened here, in the loop that serves the requests; connecting goes
        # on in the background (a down database makes /readyz 503, not a
        # failed start).
        pool = make_pool(db_settings)
        await pool.open(wait=False)
        app.state.pool = pool
        try:
            yield
        finally:
            app.state.pool = None
            await pool.close()

    app = FastAPI(
        title="Polycorn LinkDB API",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.pool = None
    app.state.keys = KeyStore(keys)
    app.state.table_cache = BodyCache()
    app.state.metrics = Metrics(CollectorRegistry())
    errors.install(app)
    for r in (
        trains.router,
        cells.router,
        handovers.router,
        lines.router,
        failure_tables.router,
        health.router,
    ):
        app.include_router(r)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = problem_openapi(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    return app


def problem_openapi(spec: dict[str, Any]) -> dict[str, Any]:
    """Document 422 (and every problem response) as what the handlers send:
    ``application/problem+json`` with the Problem schema."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    problem_schema = Problem.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/{model}"
    )
    for name, sub in problem_schema.pop("$defs", {}).items():
        schemas[name] = sub
    schemas["Problem"] = problem_schema
    ref = {"$ref": "#/components/schemas/Problem"}
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path in spec.get("paths", {}).values():
        for op in path.values():
            responses = op.get("responses", {})
            for status, resp in responses.items():
                if status[0] in "45":
                    resp["content"] = {"application/problem+json": {"schema": ref}}
            if op.get("requestBody"):
                responses.setdefault(
                    "400",
                    {
                        "description": "the body is not JSON",
                        "content": {"application/problem+json": {"schema": ref}},
                    },
                )
            if op.get("parameters") or op.get("requestBody"):
                responses.setdefault(
                    "422",
                    {
                        "description": "a bad parameter (every one is named)",
                        "content": {"application/problem+json": {"schema": ref}},
                    },
                )
    return spec
