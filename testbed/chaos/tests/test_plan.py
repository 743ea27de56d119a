"""Fault plans come from their seed alone, and cover every kind."""

from collections import Counter

import pytest

from polycorn_chaos.campaign import SILENT_GRACE_S
from polycorn_chaos.plan import (
    CARRIER_KINDS,
    DURATION_BY_KIND,
    DURATION_S,
    KINDS,
    START_S,
    make_plan,
)


def test_the_same_seed_gives_the_same_plan() -> None:
    assert make_plan(1234) == make_plan(1234)
    assert make_plan(1234).to_json() == make_plan(1234).to_json()


def test_plans_are_bounded_and_hit_distinct_components() -> None:
    for seed in range(500):
        plan = make_plan(seed)
        assert 1 <= len(plan.faults) <= 2
        comps = [f.component for f in plan.faults]
        assert len(set(comps)) == len(comps), plan
        for f in plan.faults:
            assert START_S[0] <= f.start_s <= START_S[1]
            lo, hi = DURATION_BY_KIND.get(f.kind, DURATION_S)
            assert lo <= f.duration_s <= hi
            assert f.carrier in ((0, 1) if f.kind in CARRIER_KINDS else (0,))
        assert [f.start_s for f in plan.faults] == sorted(f.start_s for f in plan.faults)
        w = plan.workload
        assert 1 <= w.downloaders <= 3 and 1 <= w.chat_users <= 4


def test_every_carrier_down_lasts_long_enough_to_judge_the_proxy_often() -> None:
    # The proxy's readiness is judged only when the outage outlasts its
    # bound (campaign.check_unready_during).
    d = [
        f.duration_s for s in range(1000) for f in make_plan(s).faults if f.kind == "links-all-down"
    ]
    assert d and sum(x > SILENT_GRACE_S for x in d) >= len(d) / 4, d


def test_a_hundred_episodes_meet_every_fault_kind() -> None:
    seen = Counter(f.kind for seed in range(1, 101) for f in make_plan(seed).faults)
    assert set(seen) == set(KINDS), set(KINDS) - set(seen)


def test_kinds_narrow_the_draw() -> None:
    for seed in range(50):
        assert {f.kind for f in make_plan(seed, kinds=("spool-full",)).faults} == {"spool-full"}
    with pytest.raises(ValueError, match="no fault kind"):
        make_plan(1, kinds=("meteor",))
