"""A few episodes of the fault campaign, for make test (make chaos runs 100).

The seeds are fixed so that these episodes cover a spread of fault kinds:
15 fills the spool's disk and SIGKILLs the relay, 26 SIGKILLs the proxy and
then the relay, 16 SIGKILLs PostgreSQL. CHAOS_SMOKE_SEEDS=1,2,3 picks others.
"""

from __future__ import annotations

import os

import pytest

from polycorn_chaos.campaign import Campaign

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
