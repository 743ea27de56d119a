"""Liveness, readiness and Prometheus metrics (outside ``/v1``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from polycorn_linkdb_api.auth import KeyStore, Scope
from polycorn_linkdb_api.deps import db
from polycorn_linkdb_api.errors import UnavailableError
from polycorn_linkdb_api.routes.common import AUTH_ERRORS
from polycorn_linkdb_api.schemas import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses={
        503: {"description": "LinkDB unreachable", "content": {"application/problem+json": {}}}
    },
    summary="Readiness: LinkDB answers",
)
async def readyz(request: Request) -> Health:
    try:
        async with db(request) as conn:
            await conn.execute("SELECT 1")
    except Exception as e:  # any failure to reach the database means not ready
        raise UnavailableError(f"LinkDB unreachable: {type(e).__name__}") from e
    return Health(status="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **AUTH_ERRORS,
    },
    summary="Prometheus metrics (public unless POLYCORN_API_METRICS_PUBLIC=false)",
)
async def metrics(request: Request) -> Response:
    if not request.app.state.settings.api.metrics_public:
        keys: KeyStore = request.app.state.keys
        keys.require(request, Scope.read)
    data = generate_latest(request.app.state.metrics.registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)
