"""Two builds on the same trips: each scheme's goodput in run B over run A, paired by trip
and download."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunBuilder, download

from polycorn_bench import ab
from polycorn_bench.stats import geomean


def run(root: Path, speedup: dict[str, float]) -> Path:
    """Two trips; minrtt and hrsch each download 1 MB at 1,000 and 5,000 ms in 1,000 ms,
    divided by ``speedup[trip]`` for hrsch."""
    b = RunBuilder(root, ["minrtt", "hrsch"], ["r1-t1", "r1-t2"])
    for trip in ("r1-t1", "r1-t2"):
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0), download(1, 5000, 1000.0)])
        f = speedup.get(trip, 1.0)
        b.bulk(trip, "hrsch", [download(0, 1000, 1000.0 / f), download(1, 5000, 1000.0 / f)])
    return b.finish()


def test_each_scheme_is_compared_with_itself_download_by_download(tmp_path: Path) -> None:
    a = run(tmp_path / "a", {})
    b = run(tmp_path / "b", {"r1-t1": 2.0, "r1-t2": 1.25})
    doc = ab.run_ab(a, b)
    bulk = doc["link_sets"]["hsr"]["bulk"]
    assert bulk["minrtt"]["overall"]["b_over_a"] == pytest.approx(1.0)
    o = bulk["hrsch"]["overall"]
    assert o["n_pairs"] == 4
    assert o["b_over_a"] == pytest.approx(geomean([2.0, 2.0, 1.25, 1.25]))
    assert o["n_trips"] == 2
    assert o["b_vs_oracle"] > o["a_vs_oracle"]


def test_runs_without_common_downloads_are_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = run(tmp_path / "a", {})
    assert ab.main([str(a), str(tmp_path / "missing")]) == 2
    assert "no run.json" in capsys.readouterr().err
    b = RunBuilder(tmp_path / "b", ["minrtt"], ["r9-t9"])
    b.bulk("r9-t9", "minrtt", [download(0, 1000, 1000.0)])
    assert ab.main([str(a), str(b.finish())]) == 2
    assert "no downloads paired" in capsys.readouterr().err


def test_runs_with_a_different_load_plan_are_flagged(tmp_path: Path) -> None:
    a = run(tmp_path / "a", {})
    b = run(tmp_path / "b", {})
    doc = ab.run_ab(a, b)
    assert not doc["comparable"], "the synthetic runs have no fixed load start"
    assert "load_start_s auto" in doc["differ"]
