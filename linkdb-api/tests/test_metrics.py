"""Prometheus metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient

from .conftest import READ


def test_latency_histogram_uses_route_templates(client: TestClient) -> None:
    client.get("/v1/cells/1/stats", headers=READ)
    client.get("/v1/cells/2/stats", headers=READ)
    client.get("/v1/cells/abc/stats", headers=READ)
    client.get("/no/such/path")
    text = client.get("/metrics").text
    assert "# TYPE polycorn_api_request_duration_seconds histogram" in text
    line = (
        'polycorn_api_request_duration_seconds_count{method="GET",'
        'route="/v1/cells/{cell_id}/stats",status="200"}'
    )
    count = next(ln for ln in text.splitlines() if ln.startswith(line))
    assert float(count.split()[-1]) >= 2
    assert 'route="/v1/cells/{cell_id}/stats",status="422"' in text
    assert 'route="<unmatched>",status="404"' in text
    assert "/v1/cells/1/stats" not in text
