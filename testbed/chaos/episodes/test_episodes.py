"""A few episodes of the fault campaign, for make test (make chaos runs 100).

The seeds are fixed so that these episodes cover a spread of fault kinds:
15 fills the spool's disk and SIGKILLs the relay, 26 SIGKILLs the proxy and
then the relay, 16 SIGKILLs PostgreSQL. CHAOS_SMOKE_SEEDS=1,2,3 picks others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from polycorn_chaos.campaign import Campaign
from polycorn_chaos.checks import TripTelemetry
from polycorn_chaos.testbed import Settings, Testbed


# One testbed for every episode of the session (in this module: a conftest.py
# would share its module name with the services' test folders under mypy).
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


SEEDS = [int(s) for s in os.environ.get("CHAOS_SMOKE_SEEDS", "15,26,16").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_episode_keeps_every_invariant(campaign: Campaign, seed: int) -> None:
    result = campaign.episode(SEEDS.index(seed), seed, None)
    faults = ", ".join(f["kind"] for f in result["faults"])
    violations = "\n".join(f"  {v['invariant']}: {v['detail']}" for v in result["violations"])
    assert not result["violations"], (
        f"episode seed {seed} ({faults}) broke invariants:\n{violations}\n"
        f"reproduce: {result['reproduce']}"
    )


def test_memory_stays_bounded(campaign: Campaign) -> None:
    assert campaign.memory_violations() == []
