"""One testbed for every episode of the session (make chaos-smoke)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from polycorn_chaos.campaign import Campaign
from polycorn_chaos.checks import TripTelemetry
from polycorn_chaos.testbed import Settings, Testbed


@pytest.fixture(scope="session")
def campaign() -> Iterator[Campaign]:
    if os.geteuid() != 0:
        pytest.fail("the fault campaign needs root (network namespaces)")
    # Names, ports and directories of their own (CHAOS_* overrides them), so
    # that these episodes and a `make chaos` can run side by side.
    s = Settings.from_env(
        prefix="chs",
        infra_dir=Path("/tmp/polycorn-infra-chaos-smoke"),
        pg_port=25482,
        kafka_port=29152,
        prom_port=29160,
        ingest_metrics="127.0.0.1:9581",
        trainer_metrics="127.0.0.1:9582",
        work=Path("/tmp/polycorn-chaos-smoke"),
        trip_s=900,
    )
    s.tree = s.tree.resolve()
    tb = Testbed(s)
    try:
        tb.up()
        yield Campaign(tb, TripTelemetry.load(s.work / "trip" / "events.jsonl", tb.epoch_ms))
    finally:
        tb.down()
