"""The HRSCH issue's sections on synthetic run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunBuilder, download, handover, proxy_metrics, relay_metrics

from polycorn_bench.analysis import analyse
from polycorn_bench.flows import Flow
from polycorn_bench.hrsch import (
    DEFAULT_SCHEME,
    MIN_TRIPS_FOR_TRIP_INTERVAL,
    PAPER,
    window_goodput,
)
from polycorn_bench.hsr import main
from polycorn_bench.metrics import parse_metrics
from polycorn_bench.records import Download, read_run
from polycorn_bench.report import markdown
from polycorn_bench.stats import bootstrap_ratio_of_means_ci, geomean, paired_ratio_stats
from polycorn_bench.verdict import verdict, verdict_text

MB = 1_048_576
KB256 = 262_144
TRIPS = ["r1-t1", "r1-t2"]
ABLATION = ["minrtt+hpr", "minrtt+tpr", "minrtt+ori", "minrtt+er"]


def new_builder(tmp_path: Path, schemes: list[str]) -> RunBuilder:
    return RunBuilder(tmp_path / "run", schemes, TRIPS)


def goodput(size: int, dur: float) -> float:
    return size * 8 / dur / 1000


# --- bulk: hrsch vs baselines, ablation ----------------------------------------------------


def bulk_run(tmp_path: Path) -> RunBuilder:
    """minrtt: 1 MB in 1000 ms and 256 KB in 500 ms everywhere; every other scheme a fixed
    speed-up over it (hrsch 1.25 x / 2 x and 1.6 x; blest 1.0 x; each ablation its own)."""
    b = new_builder(tmp_path, ["minrtt", "blest", "hrsch", *ABLATION])
    factors = {
        "minrtt": (1.0, 1.0),
        "blest": (1.0, 1.0),
        "minrtt+hpr": (1.1, 1.1),
        "minrtt+tpr": (1.05, 1.05),
        "minrtt+ori": (1.2, 1.2),
        "minrtt+er": (1.0, 1.0),
    }
    for trip in TRIPS:
        for scheme, (f_mb, f_kb) in factors.items():
            b.bulk(
                trip,
                scheme,
                [download(0, 1000, 1000.0 / f_mb), download(1, 5000, 500.0 / f_kb, size=KB256)],
            )
    b.bulk("r1-t1", "hrsch", [download(0, 1000, 800.0), download(1, 5000, 312.5, size=KB256)])
    b.bulk("r1-t2", "hrsch", [download(0, 1000, 500.0), download(1, 5000, 312.5, size=KB256)])
    return b


def test_the_default_pipeline_against_hrsch_and_the_baselines(tmp_path: Path) -> None:
    """default_vs_baselines pairs the default pipeline with minrtt and hrsch like hrsch's own
    section; against minrtt it carries the paper's and our goal's numbers with verdicts."""
    b = new_builder(tmp_path, ["minrtt", "hrsch", DEFAULT_SCHEME])
    for trip in TRIPS:
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0), download(1, 5000, 500.0, size=KB256)])
        b.bulk(trip, "hrsch", [download(0, 1000, 800.0), download(1, 5000, 400.0, size=KB256)])
        b.bulk(
            trip, DEFAULT_SCHEME, [download(0, 1000, 500.0), download(1, 5000, 250.0, size=KB256)]
        )
    doc = analyse(read_run(b.finish()))
    d = doc["default_vs_baselines"]
    assert list(d) == ["minrtt", "hrsch"]
    assert d["minrtt"]["overall"]["ratio"] == pytest.approx(2.0)
    assert d["hrsch"]["overall"]["ratio"] == pytest.approx(1.6)
    assert d["minrtt"]["1MB"]["paper"] == 1.28
    assert d["minrtt"]["overall"]["goal"] == 1.45
    assert d["minrtt"]["overall"]["goal_verdict"] == "above"
    assert d["hrsch"]["overall"]["paper"] is None and d["hrsch"]["overall"]["goal"] is None
    # hrsch at 1.25x: below our 1.45 goal, consistent with nothing (its interval is a point).
    h = doc["hrsch_vs_baselines"]["minrtt"]["overall"]
    assert h["ratio"] == pytest.approx(1.25)
    assert h["goal_verdict"] == "below"
    assert DEFAULT_SCHEME not in doc["hrsch_vs_baselines"]
    assert doc["link_sets"]["hsr"]["default_vs_baselines"] == d


def test_without_the_default_pipeline_its_section_is_null(tmp_path: Path) -> None:
    doc = analyse(read_run(bulk_run(tmp_path).finish()))
    assert doc["default_vs_baselines"] is None


def test_hrsch_vs_baselines_and_ablation(tmp_path: Path) -> None:
    doc = analyse(read_run(bulk_run(tmp_path).finish()))
    # '+' in scheme names is an ordinary scheme everywhere.
    assert doc["bulk"]["minrtt+ori"]["overall"]["ratio_vs_minrtt"] == pytest.approx(1.2)
    assert "minrtt+hpr" in doc["schemes"]

    vs = doc["hrsch_vs_baselines"]
    assert list(vs) == ["minrtt", "blest"]
    m = vs["minrtt"]
    assert m["1MB"]["ratio"] == pytest.approx(geomean([1.25, 2.0]))
    assert m["1MB"]["n_pairs"] == 2
    assert m["1MB"]["mean_of_ratios"] == pytest.approx(1.625)
    assert m["1MB"]["ratio_of_means"] == pytest.approx(
        (goodput(MB, 800) + goodput(MB, 500)) / 2 / goodput(MB, 1000)
    )
    assert m["256KB"]["ratio"] == pytest.approx(1.6)
    assert m["256KB"]["ci95"] == pytest.approx([1.6, 1.6])
    assert m["overall"]["ratio"] == pytest.approx(geomean([1.25, 2.0, 1.6, 1.6]))
    assert m["overall"]["n_pairs"] == 4
    assert m["1MB"]["paper"] == 1.28
    assert m["overall"]["paper"] == 1.31
    assert "4MB" not in m  # no 4 MB download in this run
    assert vs["blest"]["overall"]["ratio"] == pytest.approx(m["overall"]["ratio"])
    assert vs["blest"]["overall"]["paper"] is None
    # Verdicts from the interval: 256 KB is 1.6 in both pairs (interval [1.6, 1.6] > 1.45);
    # 1 MB's pairs are 1.25 and 2.0, an interval around 1.28; blest has no paper number.
    assert m["256KB"]["verdict"] == "above"
    assert m["1MB"]["ci95"][0] < 1.28 < m["1MB"]["ci95"][1]
    assert m["1MB"]["verdict"] == "consistent"
    assert vs["blest"]["overall"]["verdict"] is None
    assert m["overall"]["ci95_halfwidth"] == pytest.approx(
        (m["overall"]["ci95"][1] - m["overall"]["ci95"][0]) / 2
    )
    # Top level = the primary link set's.
    assert doc["hrsch_vs_baselines"] == doc["link_sets"]["hsr"]["hrsch_vs_baselines"]

    abl = doc["ablation"]
    assert list(abl) == [*ABLATION, "hrsch"]
    assert abl["minrtt+hpr"]["mechanism"] == "HPR"
    assert abl["minrtt+hpr"]["gain"] == pytest.approx(0.1)
    assert abl["minrtt+hpr"]["ci95"] == pytest.approx([0.1, 0.1])
    assert abl["minrtt+tpr"]["gain"] == pytest.approx(0.05)
    assert abl["minrtt+er"]["gain"] == pytest.approx(0.0)
    assert abl["minrtt+ori"]["gain_by_size"] == pytest.approx({"256KB": 0.2, "1MB": 0.2})
    assert abl["minrtt+ori"]["paper_gain"] == PAPER["ablation_gain"]["minrtt+ori"]
    assert abl["hrsch"]["mechanism"] == "all (hrsch)"
    assert abl["hrsch"]["gain"] == pytest.approx(m["overall"]["ratio"] - 1)
    assert abl["hrsch"]["n_pairs"] == 4
    # Zero-width intervals of 4 pairs: +10 % > +7 %, +5 % > +4.2 %, +20 % > +18.8 %, 0 < 2.9 %.
    assert {s: abl[s]["verdict"] for s in ABLATION} == {
        "minrtt+hpr": "above",
        "minrtt+tpr": "above",
        "minrtt+ori": "above",
        "minrtt+er": "below",
    }
    assert doc["paper"]["hrsch_vs_minrtt"]["256KB"] == 1.45

    md = markdown(doc)
    assert "HRSCH against the paper" in md
    assert "(paper 1.45: above the paper)" in md
    assert "(paper 1.28: consistent with the paper)" in md  # 1 MB: 1.58, but [1.25, 2.0]
    assert "| HPR | `minrtt+hpr` | 4 | +10.0 %" in md
    assert "| +2.9 % | **below the paper** |" in md  # ER: 0 % against 2.9 %
    assert "short of the paper" not in md.lower()
    json.dumps(doc, allow_nan=False)


def test_below_the_paper_is_flagged(tmp_path: Path) -> None:
    b = new_builder(tmp_path, ["minrtt", "hrsch"])
    for trip in TRIPS:
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0)])
        b.bulk(trip, "hrsch", [download(0, 1000, 900.0)])
    doc = analyse(read_run(b.finish()))
    m = doc["hrsch_vs_baselines"]["minrtt"]
    assert m["1MB"]["ratio"] == pytest.approx(1 / 0.9)
    assert m["1MB"]["verdict"] == m["overall"]["verdict"] == "below"
    md = markdown(doc)
    assert "(paper 1.28: **below the paper**)" in md
    assert "(paper 1.31: **below the paper**)" in md


def test_verdict_reads_the_trip_interval_from_ten_trips(tmp_path: Path) -> None:
    """Twelve trips whose levels differ (hrsch 1.15x or 1.5x minrtt) with identical pairs within
    each: the pairs' interval is narrow and excludes the paper's 1.31; the trips' interval is
    wide and includes it, and from 10 trips on the verdict reads it."""
    trips = [f"r1-t{i}" for i in range(1, 13)]
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], trips)
    for i, trip in enumerate(trips):
        f = 1.5 if i % 3 == 0 else 1.15
        b.bulk(trip, "minrtt", [download(k, 1000 + 4000 * k, 1000.0) for k in range(6)])
        b.bulk(trip, "hrsch", [download(k, 1000 + 4000 * k, 1000.0 / f) for k in range(6)])
    doc = analyse(read_run(b.finish()))
    o = doc["hrsch_vs_baselines"]["minrtt"]["overall"]
    assert o["n_trips"] == 12 >= MIN_TRIPS_FOR_TRIP_INTERVAL
    assert o["ci95_trips_halfwidth"] > 2 * o["ci95_halfwidth"]
    assert not o["ci95"][0] <= 1.31 <= o["ci95"][1]
    assert o["ci95_trips"][0] <= 1.31 <= o["ci95_trips"][1]
    assert o["verdict_interval"] == "ci95_trips"
    # All the spread is between trips: identical pairs within each.
    assert o["log_variance"]["within"] == pytest.approx(0.0, abs=1e-12)
    assert o["log_variance"]["between"] > 0.01
    assert o["log_variance"]["trips"] == 12
    assert o["verdict"] == "consistent"
    md = markdown(doc)
    assert "(paper 1.31: consistent with the paper)" in md
    assert "trips [" in md
    # With two trips the pairs' interval decides.
    two = analyse(read_run(bulk_run(tmp_path / "two").finish()))
    assert two["hrsch_vs_baselines"]["minrtt"]["overall"]["verdict_interval"] == "ci95"


def test_one_pair_gives_no_verdict(tmp_path: Path) -> None:
    """A single pair's bootstrap interval has zero width: no interval, not 'below'."""
    b = new_builder(tmp_path, ["minrtt", "hrsch"])
    b.bulk("r1-t1", "minrtt", [download(0, 1000, 1000.0)])
    b.bulk("r1-t1", "hrsch", [download(0, 1000, 900.0)])
    doc = analyse(read_run(b.finish()))
    m = doc["hrsch_vs_baselines"]["minrtt"]["1MB"]
    assert m["n_pairs"] == 1
    assert m["verdict"] == "no interval"
    assert m["ci95_halfwidth"] is None
    assert doc["bulk"]["hrsch"]["overall"]["ci95_halfwidth"] is None
    assert doc["bulk"]["minrtt"]["overall"]["ci95_halfwidth"] == 0.0
    assert "(paper 1.28: no interval (n < 2))" in markdown(doc)


def test_paired_ratio_stats_function() -> None:
    s = paired_ratio_stats([2.0, 1.0], [1.0, 2.0])
    assert s["ratio"] == pytest.approx(1.0)
    assert s["ratio_of_means"] == pytest.approx(1.0)
    assert s["mean_of_ratios"] == pytest.approx(1.25)
    assert s["n_pairs"] == 2
    lo, hi = s["ci95"]
    assert lo < 1.0 < hi
    empty = paired_ratio_stats([], [])
    assert empty["ratio"] is None
    assert empty["ci95"] is None
    lo, hi = bootstrap_ratio_of_means_ci([2.0, 4.0, 3.0], [1.0, 2.0, 1.5])
    assert lo == pytest.approx(2.0)
    assert hi == pytest.approx(2.0)


# --- baseline-only runs ------------------------------------------------------------------


def test_baseline_only_run_has_null_hrsch_sections(builder: RunBuilder) -> None:
    for trip in TRIPS:
        builder.bulk(trip, "minrtt", [download(0, 1000, 100.0)])
        builder.bulk(trip, "redundant", [download(0, 1000, 200.0)])
    doc = analyse(read_run(builder.finish()))
    for key in ("hrsch_vs_baselines", "ablation", "im_hrsch", "hof_recovery"):
        assert doc[key] is None, key
        assert doc["link_sets"]["hsr"][key] is None, key
    assert doc["reinjection_overhead"] == {}
    assert "hrsch did not run" in doc["notes"]["hrsch"]
    # No metrics snapshots in this run: extra traffic null, with a warning per trip.
    assert doc["extra_traffic"] == {"minrtt": None, "redundant": None}
    assert doc["issues"]["by_kind"]["missing metrics file (no extra_traffic)"] == 4
    md = markdown(doc)
    assert "HRSCH against the paper" not in md
    assert "### Extra traffic" in md
    json.dumps(doc, allow_nan=False)


# --- extra traffic and reinjection overhead ------------------------------------------------


def test_metrics_parser() -> None:
    m = parse_metrics(
        relay_metrics(reinjected=5, redundant=7, down=1000, up=20)
        + 'polycorn_weird{a="b"} NaN\ngarbage line here\nx_total{} 1e3\n'
    )
    assert m.counter("polycorn_capture_down_bytes") == 1000  # summed over listeners
    assert m.counter("polycorn_capture_down_bytes_total") == 1000
    assert m.counter("polycorn_sched_reinjected_bytes") == 5
    assert m.counter("polycorn_path_reinjected_bytes") == 999
    assert m.counter("polycorn_sched_redundant_bytes") == 7
    assert m.counter("x") == 1000
    assert m.counter("polycorn_nothing") is None
    assert m.bad_lines == 2
    assert m.first_bad is not None and "NaN" in m.first_bad
    # Without braces and without _total.
    assert parse_metrics("foo 3\nfoo 4 1700000000\n").counter("foo") == 7
    assert parse_metrics("").empty


def test_extra_traffic_and_reinjection_overhead(tmp_path: Path) -> None:
    schemes = ["minrtt", "hrsch", "hrsch-k1", "hrsch-k2", "redundant", "kernel-mptcp"]
    b = new_builder(tmp_path, schemes)
    # (downlink reinjected, uplink reinjected, downlink redundant) per trip; goodput 1000+100.
    per_trip = {
        "minrtt": (11, 0, 0),
        "hrsch": (2, 1, 0),
        "hrsch-k1": (500, 50, 0),
        "hrsch-k2": (150, 15, 0),
        "redundant": (0, 0, 1000),
    }
    for trip in TRIPS:
        for scheme in schemes:
            b.bulk(trip, scheme, [download(0, 1000, 100.0)])
        for scheme, (re_d, re_u, red_d) in per_trip.items():
            b.metrics(
                trip,
                scheme,
                relay_metrics(reinjected=re_u, redundant=0, down=1000, up=100),
                proxy_metrics(reinjected=re_d, redundant=red_d),
            )
        # kernel-mptcp's snapshots exist but its counters mean nothing.
        b.metrics(trip, "kernel-mptcp", relay_metrics(0, 0, 1000, 100), proxy_metrics(0, 0))
    doc = analyse(read_run(b.finish()))
    extra = doc["extra_traffic"]
    k1 = extra["hrsch-k1"]
    assert k1["reinjected_bytes"] == 2 * 550
    assert k1["reinjected_bytes_down"] == 1000
    assert k1["reinjected_bytes_up"] == 100
    assert k1["goodput_bytes"] == 2 * 1100
    assert k1["goodput_bytes_down"] == 2000
    assert k1["reinjected_share"] == pytest.approx(0.5)
    assert k1["redundant_share"] == 0.0
    assert k1["n_trips"] == 2
    assert k1["n_trips_missing"] == 0
    assert extra["redundant"]["redundant_bytes"] == 2000
    assert extra["redundant"]["redundant_share"] == pytest.approx(2000 / 2200)
    assert extra["kernel-mptcp"] is None
    assert doc["reinjection_overhead"] == pytest.approx({"1": 0.5, "2": 0.15, "3": 3 / 1100})
    assert list(doc["reinjection_overhead"]) == ["1", "2", "3"]
    # Both trips alike: zero-width trip-level intervals. Lower is better: k = 1's 50 % is
    # worse than the paper's 47 % (below), k = 3's 0.27 % better than its 0.3 % (above).
    assert k1["reinjected_share_ci95"] == pytest.approx([0.5, 0.5])
    ro = doc["reinjection_overhead_vs_paper"]
    assert ro["1"]["scheme"] == "hrsch-k1"
    assert ro["1"]["lower_is_better"] is True
    assert ro["1"]["n"] == 2
    assert {k: e["verdict"] for k, e in ro.items()} == {
        "1": "below",
        "2": "consistent",
        "3": "above",
    }
    assert doc["issues"]["total"] == 0
    md = markdown(doc)
    assert "Extended reinjection overhead" in md
    assert "| 1 | `hrsch-k1` | 50.00 % [50.00, 50.00] | 47.0 % | **below the paper** |" in md
    assert "| 3 | `hrsch` | 0.27 % [0.27, 0.27] | 0.3 % | above the paper |" in md
    json.dumps(doc, allow_nan=False)


def test_missing_and_garbled_metrics_are_null_with_a_warning(tmp_path: Path) -> None:
    b = new_builder(tmp_path, ["minrtt", "hrsch", "hrsch-k1", "hrsch-k2"])
    for trip in TRIPS:
        for scheme in ("minrtt", "hrsch", "hrsch-k1", "hrsch-k2"):
            b.bulk(trip, scheme, [download(0, 1000, 100.0)])
    # hrsch: one trip fine, the other without proxy.metrics -> the usable trip only.
    b.metrics("r1-t1", "hrsch", relay_metrics(1, 0, 1000, 0), proxy_metrics(9, 0))
    b.metrics("r1-t2", "hrsch", relay_metrics(1, 0, 1000, 0), None)
    # hrsch-k1: garbage in both trips -> null.
    for trip in TRIPS:
        b.metrics(trip, "hrsch-k1", "\x00\x01 not metrics {{{\n", "<html>502</html>\n")
    # hrsch-k2: a truncated relay snapshot without the capture counters -> null.
    for trip in TRIPS:
        b.metrics(trip, "hrsch-k2", "polycorn_sched_reinjected_bytes_total{} 3\n", "")
    # minrtt: no logs at all.
    doc = analyse(read_run(b.finish()))
    extra = doc["extra_traffic"]
    assert extra["hrsch"]["n_trips"] == 1
    assert extra["hrsch"]["n_trips_missing"] == 1
    assert extra["hrsch"]["reinjected_share"] == pytest.approx(10 / 1000)
    assert extra["hrsch-k1"] is None
    assert extra["hrsch-k2"] is None
    assert extra["minrtt"] is None
    assert doc["reinjection_overhead"] == pytest.approx({"3": 0.01})
    kinds = doc["issues"]["by_kind"]
    assert kinds["missing metrics file (no extra_traffic)"] == 3
    assert kinds["malformed metrics line"] == 4
    assert kinds["metrics snapshot without the needed counters (no extra_traffic)"] == 4
    markdown(doc)
    json.dumps(doc, allow_nan=False)


# --- instant messaging ---------------------------------------------------------------------


def im_rows(delays: dict[int, list[float]]) -> list[dict[str, Any]]:
    return [
        {"user": u, "msg": i, "ok": True, "delay_ms": d}
        for u, ds in delays.items()
        for i, d in enumerate(ds)
    ]


def test_im_changes(tmp_path: Path) -> None:
    b = new_builder(tmp_path, ["minrtt", "single-path", "hrsch"])
    b.im("r1-t1", "single-path", 10, im_rows({0: [100.0], 1: [300.0]}))  # mean 200, cov .5
    b.im("r1-t1", "minrtt", 10, im_rows({0: [100.0], 1: [100.0]}))  # mean 100, cov 0
    b.im("r1-t1", "hrsch", 10, im_rows({0: [90.0], 1: [110.0]}))  # mean 100, cov .1
    b.im("r1-t1", "single-path", 20, im_rows({0: [100.0], 1: [100.0]}))
    b.im("r1-t1", "minrtt", 20, im_rows({0: [50.0], 1: [50.0]}))
    b.im("r1-t1", "hrsch", 20, im_rows({0: [50.0], 1: [50.0]}))
    doc = analyse(read_run(b.finish()))
    im = doc["im_hrsch"]
    u10 = im["by_users"]["10"]
    assert u10["vs_single_path"]["mean"] == pytest.approx(-0.5)
    assert u10["vs_single_path"]["cov"] == pytest.approx(0.1 / 0.5 - 1)
    assert u10["vs_minrtt"]["mean"] == pytest.approx(0.0)
    assert u10["vs_minrtt"]["cov"] is None  # minrtt's cov is 0
    u20 = im["by_users"]["20"]
    assert u20["vs_single_path"]["mean"] == pytest.approx(-0.5)
    assert u20["vs_single_path"]["p90"] == pytest.approx(-0.5)
    assert im["average"]["vs_single_path"]["mean"] == pytest.approx(-0.5)
    assert im["average"]["vs_minrtt"]["mean"] == pytest.approx(0.0)
    assert im["average"]["vs_minrtt"]["cov"] is None
    assert im["paper"]["vs_single_path"]["mean"] == -0.45
    md = markdown(doc)
    assert "| average | -50.0 % |" in md
    assert "| paper | -45.0 % | -34.0 % | -86.0 % | -16.0 % | -14.0 % | -49.0 % |" in md
    # One trip: no interval, so no verdict either way (CoV -80 % against the paper's -86 %).
    assert im["n_trips"] == 1
    assert im["average_ci95"]["vs_single_path"]["cov"] is None
    assert im["vs_paper"]["vs_single_path"]["cov"]["verdict"] == "no interval"
    assert "| single-path | CoV | -80.0 % | -86 % | no interval (n < 2) |" in md
    assert "| minrtt | CoV | – | -49 % | no data |" in md


def test_im_intervals_over_trips(tmp_path: Path) -> None:
    """The IM averages' intervals resample trips; trips alike give zero-width intervals, and
    trips that differ an interval around the pooled estimate."""
    b = new_builder(tmp_path, ["minrtt", "single-path", "hrsch"])
    for trip in TRIPS:
        b.im(trip, "single-path", 10, im_rows({0: [100.0], 1: [300.0]}))
        b.im(trip, "minrtt", 10, im_rows({0: [100.0], 1: [120.0]}))
    b.im("r1-t1", "hrsch", 10, im_rows({0: [90.0], 1: [110.0]}))
    b.im("r1-t2", "hrsch", 10, im_rows({0: [45.0], 1: [55.0]}))
    doc = analyse(read_run(b.finish()))
    im = doc["im_hrsch"]
    assert im["n_trips"] == 2
    # Against single-path: hrsch's mean is 100 / 200 on r1-t1 and 50 / 200 on r1-t2; the
    # resamples are {t1, t1}, {t1, t2}, {t2, t2}: changes -0.5, -0.625, -0.75.
    assert im["average"]["vs_single_path"]["mean"] == pytest.approx(-0.625)
    lo, hi = im["average_ci95"]["vs_single_path"]["mean"]
    assert lo == pytest.approx(-0.75)
    assert hi == pytest.approx(-0.5)
    # The paper's -45 % is above the whole interval: faster than the paper (lower is better).
    assert im["vs_paper"]["vs_single_path"]["mean"]["verdict"] == "above"
    # Against minrtt (110 ms): -9 % and -55 %, around the paper's -16 %: consistent.
    lo, hi = im["average_ci95"]["vs_minrtt"]["mean"]
    assert lo < -0.16 < hi
    assert im["vs_paper"]["vs_minrtt"]["mean"]["verdict"] == "consistent"
    # CoV: hrsch's per-user spread is the same share on both trips, single-path's too.
    assert im["average_ci95"]["vs_single_path"]["cov"] == pytest.approx([0.2 - 1, 0.2 - 1])
    md = markdown(doc)
    assert "| single-path | mean | -62.5 % [-75.0, -50.0] | -45 % | above the paper |" in md
    json.dumps(doc, allow_nan=False)


# --- recovery after handover failures ------------------------------------------------------


def dl(ident: int, start: float, end: float, progress: list[list[float]] | None) -> dict[str, Any]:
    rec = download(ident, start, end - start)
    if progress is not None:
        rec["progress"] = progress
    return rec


def hof_run(tmp_path: Path, with_progress: bool = True) -> RunBuilder:
    b = new_builder(tmp_path, ["minrtt", "hrsch", "blest"])
    b.event_rows(
        "r1-t1",
        [
            *handover(5000, 50),  # success: not a failure
            *handover(10000, 3000, "rlf", carrier=1),
            *handover(30000, 2000, "rlf"),
            *handover(40000, 1500, "nas"),
        ],
    )
    b.event_rows("r1-t2", [*handover(20000, 4000, "rlf"), *handover(50000, 2500, "rlf", 1)])

    def p(points: list[list[float]]) -> list[list[float]] | None:
        return points if with_progress else None

    # r1-t1 @10000: minrtt 200000 B in [10000, 12000]; hrsch finishes at 10800, so only its
    # 800 ms count: 448576 B.
    # r1-t1 @30000: minrtt ends 100 ms after the failure -> pair dropped (too short).
    # r1-t1 @40000: hrsch finished before the failure -> unpaired.
    b.bulk(
        "r1-t1",
        "minrtt",
        [
            dl(
                0,
                9000,
                13000,
                p([[9500, 1e5], [10000, 2e5], [11000, 3e5], [12000, 4e5], [13000, MB]]),
            ),
            dl(2, 29000, 30100, p([[30000, 9e5], [30100, MB]])),
            dl(3, 39000, 41000, p([[41000, MB]])),
        ],
    )
    b.bulk(
        "r1-t1",
        "hrsch",
        [
            dl(0, 9000, 10800, p([[9500, 3e5], [10000, 6e5], [10800, MB]])),
            dl(2, 29000, 31000, p([[31000, MB]])),
            dl(3, 39000, 39900, p([[39900, MB]])),
        ],
    )
    # r1-t2 @20000: interpolated: minrtt 100000 B; hrsch 674288 - 100000 B.
    # r1-t2 @50000: linear from start (no sample before the end): 2000 ms of each.
    b.bulk(
        "r1-t2",
        "minrtt",
        [
            dl(1, 19000, 24000, p([[20000, 0], [22000, 1e5], [24000, MB]])),
            dl(4, 49000, 53000, p([[53000, MB]])),
        ],
    )
    b.bulk(
        "r1-t2",
        "hrsch",
        [
            dl(1, 19000, 23000, p([[19500, 0], [21000, 3e5], [23000, MB]])),
            dl(4, 49000, 52000, p([[52000, MB]])),
        ],
    )
    # blest: no progress at all in r1-t2, same as minrtt in r1-t1.
    b.bulk(
        "r1-t1",
        "blest",
        [dl(0, 9000, 13000, p([[10000, 2e5], [12000, 4e5], [13000, MB]]))],
    )
    b.bulk("r1-t2", "blest", [dl(1, 19000, 24000, None), dl(4, 49000, 53000, None)])
    return b


def mbps(nbytes: float, ms: float) -> float:
    return nbytes * 8 / ms / 1000


def test_hof_recovery(tmp_path: Path) -> None:
    doc = analyse(read_run(hof_run(tmp_path).finish()))
    hof = doc["hof_recovery"]
    assert hof == doc["link_sets"]["hsr"]["hof_recovery"]
    assert hof["n_failures"] == 5
    assert hof["window_ms"] == 2000
    h = hof["by_scheme"]["hrsch"]
    hrsch_g = [
        mbps(MB - 6e5, 800),
        mbps(300000 + 0.5 * (MB - 3e5) - 1e5, 2000),
        mbps(2000 * MB / 3000, 2000),
    ]
    minrtt_g = [mbps(2e5, 2000), mbps(1e5, 2000), mbps(2000 * MB / 4000, 2000)]
    assert h["n"] == 3
    assert h["n_short"] == 1
    assert h["n_unpaired"] == 1
    assert h["n_no_progress"] == 0
    got = sorted(h["windows"], key=lambda w: (w["trip"], w["t_ms"]))
    assert [w["goodput_mbps"] for w in got] == pytest.approx(hrsch_g)
    assert [w["minrtt_goodput_mbps"] for w in got] == pytest.approx(minrtt_g)
    assert got[0]["carrier"] == 1
    assert h["ratio_of_means"] == pytest.approx(np.mean(hrsch_g) / np.mean(minrtt_g))
    assert h["ratio_of_medians"] == pytest.approx(np.median(hrsch_g) / np.median(minrtt_g))
    assert hof["hrsch_vs_minrtt_mean"] == h["ratio_of_means"]
    assert hof["hrsch_vs_minrtt_median"] == h["ratio_of_medians"]
    assert hof["n"] == 3
    lo, hi = hof["hrsch_vs_minrtt_mean_ci95"]
    assert lo <= hof["hrsch_vs_minrtt_mean"] <= hi
    bl = hof["by_scheme"]["blest"]
    assert bl["n"] == 1
    assert bl["ratio_of_means"] == pytest.approx(1.0)
    assert bl["n_no_progress"] == 2
    assert "minrtt" not in hof["by_scheme"]
    assert "hof_recovery" not in doc["notes"]
    lo, hi = hof["hrsch_vs_minrtt_median_ci95"]
    assert lo <= hof["hrsch_vs_minrtt_median"] <= hi
    vp = hof["vs_paper"]
    assert vp["mean"]["ours"] == hof["hrsch_vs_minrtt_mean"]
    assert vp["mean"]["paper"] == 1.2
    assert vp["median"]["paper"] == 1.5
    assert vp["mean"]["n"] == 3
    assert vp["mean"]["verdict"] == verdict(hof["hrsch_vs_minrtt_mean_ci95"], 1.2, 3)
    assert vp["median"]["verdict"] == verdict(hof["hrsch_vs_minrtt_median_ci95"], 1.5, 3)
    md = markdown(doc)
    assert "Recovery after handover failures" in md
    assert f"(paper 1.2: {verdict_text(vp['mean']['verdict'])})" in md
    json.dumps(doc, allow_nan=False)


def test_hof_recovery_without_progress_is_null_with_a_note(tmp_path: Path) -> None:
    doc = analyse(read_run(hof_run(tmp_path, with_progress=False).finish()))
    assert doc["hof_recovery"] is None
    assert "progress" in doc["notes"]["hof_recovery"]
    assert "progress" in markdown(doc)


def test_window_goodput_and_bad_progress() -> None:
    rec = Download.from_json(dl(0, 1000, 3000, [[2000, 500], [3000, 1000]]))
    assert rec is not None
    assert rec.progress == ((2000.0, 500.0), (3000.0, 1000.0))
    f = Flow("t", "s", rec, 2000.0, False, None)
    # 0 B at start_ms, 250 B at 1500, 1000 B at 3000: 750 B in [1500, 3000].
    g, active = window_goodput(f, 1500.0)
    assert active == 1500.0
    assert g == pytest.approx(mbps(750, 1500))
    g, active = window_goodput(f, 3500.0)
    assert np.isnan(g)
    assert active == 0.0
    for bad in ([[2000, 500], [1000, 600]], [[1, 2, 3]], "x", [[1, -5]], [[0, 5], [1, 4]]):
        rec = Download.from_json(dl(0, 1000, 3000, bad))  # type: ignore[arg-type]
        assert rec is not None
        assert rec.progress is None
        assert rec.progress_bad


def test_failed_handovers_are_read_from_events(builder: RunBuilder) -> None:
    rows = [
        *handover(1000, 50),
        {"event": "handover_start", "t_ms": 2000, "carrier": 0},
        {"event": "handover_start", "t_ms": 2100, "carrier": 1},
        {"event": "handover_end", "t_ms": 2200, "carrier": 0, "outcome": "rlf"},
        {"event": "handover_end", "t_ms": 4000, "carrier": 1, "outcome": "success"},
        {"event": "handover_end", "t_ms": 5000, "carrier": 2, "outcome": "rlf"},  # no start
        {"event": "handover_end", "t_ms": 6000, "carrier": 1},  # no outcome
    ]
    builder.event_rows("r1-t1", rows)
    builder.bulk(
        "r1-t1", "minrtt", [download(0, 1000, 100.0), download(1, 1900, 200.0, progress="x")]
    )
    run = read_run(builder.finish())
    trip = run.link_sets[0].trips[0]
    assert trip.handover_starts == [1000.0, 2000.0, 2100.0]
    assert trip.handover_failures is not None
    [hf] = trip.handover_failures
    assert (hf.t_ms, hf.end_ms, hf.carrier, hf.outcome) == (2000.0, 2200.0, 0, "rlf")
    assert run.link_sets[0].trips[1].handover_failures is None
    kinds = run.issues.counts
    assert kinds["failed handover without handover_start"] == 1
    assert kinds["handover_end without outcome"] == 1
    assert kinds["bad progress field (ignored)"] == 1
    # The record with the bad progress is kept.
    assert len(trip.schemes["minrtt"].downloads) == 2


def test_cli_with_hrsch_sections(tmp_path: Path) -> None:
    b = hof_run(tmp_path)
    for trip in TRIPS:
        for scheme in ("minrtt", "hrsch", "blest"):
            b.metrics(trip, scheme, relay_metrics(3, 0, 5e6, 1e4), proxy_metrics(40, 0))
        b.im(trip, "hrsch", 10, im_rows({0: [50.0]}))
        b.im(trip, "single-path", 10, im_rows({0: [100.0]}))
    out, md = tmp_path / "hsr.json", tmp_path / "hsr.md"
    plots = tmp_path / "img"
    args = [str(b.finish()), "--out", str(out), "--md", str(md), "--plots", str(plots)]
    assert main([*args, "--quiet"]) == 0
    doc = json.loads(out.read_text())
    for key in (
        "hrsch_vs_baselines",
        "ablation",
        "im_hrsch",
        "extra_traffic",
        "reinjection_overhead",
        "hof_recovery",
        "notes",
        "paper",
    ):
        assert key in doc, key
    assert doc["reinjection_overhead"] == pytest.approx({"3": 43 / (5e6 + 1e4)})
    assert doc["hof_recovery"]["n"] == 3
    text = md.read_text()
    for needle in ("hrsch against each baseline", "Ablation", "Extra traffic", "Recovery"):
        assert needle in text
    assert (plots / "hsr-ablation.png").exists()


def test_duplicates_come_from_the_receiving_end_of_each_direction(tmp_path: Path) -> None:
    b = new_builder(tmp_path, ["minrtt", "redundant"])
    for trip in TRIPS:
        for scheme in ("minrtt", "redundant"):
            b.bulk(trip, scheme, [download(0, 1000, 100.0)])
        # Downlink: the proxy sends 100 reinjected + 300 redundant, the relay drops 250 as
        # duplicates; uplink: the relay reinjects 20, the proxy drops 10.
        b.metrics(
            trip,
            "redundant",
            relay_metrics(reinjected=20, redundant=0, down=1000, up=100, duplicate=250),
            proxy_metrics(reinjected=100, redundant=300, duplicate=10),
        )
        # Older snapshots without the counter: no duplicate numbers, the rest unchanged.
        b.metrics(trip, "minrtt", relay_metrics(5, 0, 1000, 100), proxy_metrics(7, 0))
    extra = analyse(read_run(b.finish()))["extra_traffic"]
    red = extra["redundant"]
    assert red["duplicate_bytes_down"] == 2 * 250
    assert red["duplicate_bytes_up"] == 2 * 10
    assert red["duplicate_share_of_extra"] == pytest.approx(260 / 420)
    assert extra["minrtt"]["duplicate_bytes"] is None
    assert extra["minrtt"]["duplicate_share_of_extra"] is None
    assert extra["minrtt"]["reinjected_bytes"] == 2 * 12


def test_im_of_the_default_pipeline(tmp_path: Path) -> None:
    """im_default is im_hrsch's computation for the binaries' default pipeline: the default's
    own delays against the same references, hrsch's left alone."""
    b = new_builder(tmp_path, ["minrtt", "single-path", "hrsch", DEFAULT_SCHEME])
    for trip in TRIPS:
        b.im(trip, "single-path", 10, im_rows({0: [200.0], 1: [200.0]}))
        b.im(trip, "minrtt", 10, im_rows({0: [100.0], 1: [100.0]}))
        b.im(trip, "hrsch", 10, im_rows({0: [100.0], 1: [100.0]}))
        b.im(trip, DEFAULT_SCHEME, 10, im_rows({0: [80.0], 1: [80.0]}))
    doc = analyse(read_run(b.finish()))
    d, h = doc["im_default"], doc["im_hrsch"]
    assert d["n_trips"] == 2
    assert d["average"]["vs_minrtt"]["mean"] == pytest.approx(-0.2)
    assert d["average"]["vs_single_path"]["mean"] == pytest.approx(-0.6)
    assert d["average_ci95"]["vs_minrtt"]["mean"] == pytest.approx([-0.2, -0.2])
    assert h["average"]["vs_minrtt"]["mean"] == pytest.approx(0.0)
