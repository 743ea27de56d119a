"""bench-hsr's scheme list: the table suffixes a scheme may carry, and the profiles."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from polycorn_benchrun.hsr import PROFILES, TRIP_TABLE_FILES, BenchError, _schemes

OUT = Path(__file__).resolve().parents[3] / "bench" / "out"


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


@pytest.mark.parametrize("profile", ["recovery", "costs"])
def test_a_profile_runs_its_backlog_as_long_as_its_committed_result_did(profile: str) -> None:
    """A committed result is reproducible only if its profile still runs what it ran."""
    p = PROFILES[profile]
    result = json.loads((OUT / f"{p.result}.json").read_text())
    spans = [
        (r["end_ms"] - r["start_ms"]) / 1000
        for scheme in result["backlog"].values()
        for r in scheme["records"]
    ]
    assert spans, f"{p.result}.json has no backlog records"
    assert statistics.median(spans) == pytest.approx(p.backlog_s, rel=0.01), (
        f"PROFILE={profile} runs {p.backlog_s} s of backlog; {p.result}.json ran "
        f"{statistics.median(spans):.0f} s"
    )
