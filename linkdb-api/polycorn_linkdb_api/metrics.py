"""Prometheus metrics: request latency by route template.

``polycorn_api_request_duration_seconds{route,method,status}``: ``route`` is
the matched route's template (``/v1/cells/{cell_id}/stats``), never the raw
path, so the label set stays bounded; requests that match no route count
under ``route="<unmatched>"``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.duration = Histogram(
            "polycorn_api_request_duration_seconds",
            "Time to answer an API request, by route template, method and status.",
            ["route", "method", "status"],
            buckets=BUCKETS,
            registry=registry,
        )


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it costs a task per request)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = (
                route.path
                if isinstance(route, BaseRoute) and hasattr(route, "path")
                else "<unmatched>"
            )
            self.metrics.duration.labels(template, scope["method"], str(status)).observe(
                time.perf_counter() - start
            )
