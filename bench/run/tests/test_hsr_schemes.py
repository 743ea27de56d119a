"""bench-hsr's scheme list: the table suffixes a scheme may carry, and the costs profile."""

from __future__ import annotations

import pytest

from polycorn_benchrun.hsr import PROFILES, TRIP_TABLE_FILES, BenchError, _schemes


def test_trip_tables_and_trainer_variants_are_the_only_suffixes() -> None:
    ok = "minrtt hrsch+@none hrsch+@oracle hrsch+@every hrsch@broad hrsch@mean"
    assert _schemes(ok) == ok.split()
    with pytest.raises(BenchError, match="@oracle, @every, @none, @broad"):
        _schemes("minrtt hrsch@all")
    with pytest.raises(BenchError, match="must include minrtt"):
        _schemes("hrsch@none")


def test_the_costs_profile_measures_the_default_pipeline_on_a_development_route() -> None:
    p = PROFILES["costs"]
    assert p.route_seed == 1, "a design choice is measured on a development route"
    assert p.phases == "backlog"
    assert _schemes(p.schemes) == ["minrtt"] + [f"hrsch+@{t}" for t in ("none", "oracle", "every")]
    assert set(TRIP_TABLE_FILES) == {"none", "oracle", "every"}
