"""schemathesis against the API's own OpenAPI document: generated requests,
valid and invalid, with an admin key, must never get a 5xx, and every
response must match its documented status, content type and schema.

Deterministic (hypothesis derandomised) and bounded (MAX_EXAMPLES per
operation and mode). The publication endpoint runs against its own
database, so generated tables pile up there and not in the shared seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from polycorn_linkdb_api.app import create_app
from polycorn_schema.testing import fresh_database

from .conftest import ADMIN_KEY, settings_for

MAX_EXAMPLES = 50
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def app(seeded: str) -> Iterator[FastAPI]:
    # A database of its own for the publication endpoint's writes; the seed
    # is copied in so the reads find rows.
    with fresh_database() as url:
        import psycopg

        from .conftest import SEED

        with psycopg.connect(url, autocommit=True) as c:
            c.execute(SEED)
        yield create_app(settings_for(url))


def operations(app: FastAPI) -> list[tuple[str, object]]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [
        (f"{op.method.upper()} {op.path}", op)
        for op in (r.ok() for r in schema.get_all_operations())  # type: ignore[union-attr]
    ]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_error_and_no_schema_violation(app: FastAPI, mode: GenerationMode) -> None:
    ops = operations(app)
    assert len(ops) >= 12
    for name, op in ops:
        strategy = op.as_strategy(generation_mode=mode)  # type: ignore[attr-defined]

        @given(case=strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            case.call_and_validate(headers=AUTH, checks=CHECKS)

        try:
            run()
        except Unsatisfiable:
            # No parameters to make invalid (/healthz, /readyz, /metrics).
            assert mode is GenerationMode.NEGATIVE, name
        except Exception as e:
            raise AssertionError(f"{name} ({mode}): {e}") from e
