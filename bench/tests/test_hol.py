"""The head-of-line schedulerlets' ablation: each composition against its own base."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunBuilder, backlog, download, write_jsonl

from polycorn_bench.analysis import analyse
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown
from polycorn_bench.stats import geomean

TRIPS = ["r1-t1", "r1-t2", "r1-t3"]
SCHEMES = ["minrtt", "hrsch", "minrtt+opp", "hrsch+hol"]


def hol_run(tmp_path: Path) -> RunBuilder:
    """minrtt+opp: bulk 0.5x minrtt's duration (2x goodput) on every download, backlog 1.5x on
    every trip; hrsch+hol: the same as hrsch in bulk, 0.8x..1.25x in backlog (unresolved).
    hrsch itself differs from minrtt, so a gain against the wrong base would show."""
    b = RunBuilder(tmp_path / "run", SCHEMES, TRIPS)
    dur = {"minrtt": 1000.0, "hrsch": 400.0, "minrtt+opp": 500.0, "hrsch+hol": 400.0}
    blog = {
        "minrtt": [10_000_000] * 3,
        "hrsch": [20_000_000] * 3,
        "minrtt+opp": [15_000_000] * 3,
        "hrsch+hol": [16_000_000, 25_000_000, 20_000_000],
    }
    for k, trip in enumerate(TRIPS):
        for s in SCHEMES:
            b.bulk(trip, s, [download(i, 1000.0 + 2000 * i, dur[s]) for i in range(4)])
            write_jsonl(b.scheme_dir(trip, s) / "backlog.jsonl", [backlog(blog[s][k])])
    return b


def test_each_composition_is_measured_against_its_own_base(tmp_path: Path) -> None:
    doc = analyse(read_run(hol_run(tmp_path).finish()))
    hol = doc["hol_ablation"]
    assert set(hol) == {"minrtt+opp", "hrsch+hol"}
    opp, hh = hol["minrtt+opp"], hol["hrsch+hol"]
    assert (opp["base"], hh["base"]) == ("minrtt", "hrsch")
    assert opp["bulk"]["n_pairs"] == 12
    assert opp["bulk"]["gain"] == pytest.approx(1.0)
    assert opp["bulk"]["resolved"] is True
    # 3 trips: the trips' interval is there, the verdict reads the pairs'.
    assert opp["bulk"]["n_trips"] == 3 and opp["bulk"]["ci95_trips"] is not None
    assert opp["bulk"]["verdict_interval"] == "ci95"
    assert opp["backlog"]["gain"] == pytest.approx(0.5)
    # Against hrsch, not minrtt: no bulk gain at all.
    assert hh["bulk"]["gain"] == pytest.approx(0.0)
    assert hh["bulk"]["resolved"] is False
    assert hh["backlog"]["n_pairs"] == 3
    assert hh["backlog"]["gain"] == pytest.approx(geomean([0.8, 1.25, 1.0]) - 1)
    lo, hi = hh["backlog"]["ci95"]
    assert lo < 0 < hi and hh["backlog"]["resolved"] is False
    md = markdown(doc)
    assert "### Head-of-line schedulerlets" in md
    assert "| `hrsch+hol` | `hrsch` |" in md


def test_no_section_without_a_composition_or_its_base(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch+hol"], TRIPS[:1])
    for s in ("minrtt", "hrsch+hol"):
        b.bulk(TRIPS[0], s, [download(0, 1000.0, 500.0)])
    doc = analyse(read_run(b.finish()))
    assert doc["hol_ablation"] is None
    assert "Head-of-line" not in markdown(doc)


def test_from_ten_trips_the_verdict_reads_the_trips_interval(tmp_path: Path) -> None:
    """minrtt+opp is 1.5x minrtt on five trips and 0.8x on five, the same on every download of
    a trip: the pairs' interval excludes 0 (80 pairs look independent), the trips' does not
    (10 trips that disagree), and from 10 trips on the verdict reads the trips'."""
    trips = [f"r1-t{k}" for k in range(10)]
    b = RunBuilder(tmp_path / "run", ["minrtt", "minrtt+opp"], trips)
    for k, trip in enumerate(trips):
        opp = 1000.0 / (1.5 if k < 5 else 0.8)
        b.bulk(trip, "minrtt", [download(i, 1000.0 + 2000 * i, 1000.0) for i in range(8)])
        b.bulk(trip, "minrtt+opp", [download(i, 1000.0 + 2000 * i, opp) for i in range(8)])
    g = analyse(read_run(b.finish()))["hol_ablation"]["minrtt+opp"]["bulk"]
    assert g["n_pairs"] == 80 and g["n_trips"] == 10
    assert g["gain"] == pytest.approx(geomean([1.5] * 5 + [0.8] * 5) - 1)
    assert g["ci95"][0] > 0, "the pairs' interval alone would call it resolved"
    lo, hi = g["ci95_trips"]
    assert lo < 0 < hi
    assert g["verdict_interval"] == "ci95_trips" and g["resolved"] is False
