"""Statistics on synthetic run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import RunBuilder, download

from polycorn_bench.analysis import analyse
from polycorn_bench.records import read_run
from polycorn_bench.stats import (
    bootstrap_geomean_ci,
    geomean,
    im_stats,
    log_variance_components,
    trip_geomean_ci,
)

MB = 1_048_576


def goodput(size: int, dur: float) -> float:
    return size * 8 / dur / 1000


def paired_run(builder: RunBuilder) -> Path:
    # minrtt: 100 ms per 1 MB everywhere; redundant: 200/50/100 ms.
    for trip, red in (("r1-t1", (200.0, 50.0)), ("r1-t2", (100.0, 100.0))):
        builder.bulk(trip, "minrtt", [download(0, 1000, 100.0), download(1, 5000, 100.0)])
        builder.bulk(trip, "redundant", [download(0, 1000, red[0]), download(1, 5000, red[1])])
    return builder.finish()


def test_pairing_and_ratios(builder: RunBuilder) -> None:
    doc = analyse(read_run(paired_run(builder)))
    red = doc["bulk"]["redundant"]["1MB"]
    ratios = [0.5, 2.0, 1.0, 1.0]
    assert red["n"] == 4
    assert red["n_pairs"] == 4
    assert red["ratio_vs_minrtt"] == pytest.approx(geomean(ratios))
    assert red["ratio_vs_minrtt"] == pytest.approx(1.0)
    good = [goodput(MB, d) for d in (200, 50, 100, 100)]
    assert red["ratio_of_means"] == pytest.approx(np.mean(good) / goodput(MB, 100))
    assert red["goodput_mbps_median"] == pytest.approx(goodput(MB, 100))
    lo, hi = red["ci95"]
    assert lo <= red["ratio_vs_minrtt"] <= hi
    assert lo < 1.0 < hi
    mr = doc["bulk"]["minrtt"]["1MB"]
    assert mr["ratio_vs_minrtt"] == 1.0
    assert mr["ci95"] == [1.0, 1.0]
    assert doc["bulk"]["redundant"]["overall"]["ratio_vs_minrtt"] == pytest.approx(1.0)
    # Sizes absent from the data are absent from the summary; single-path has no data at all.
    assert "4MB" not in doc["bulk"]["minrtt"]
    assert "single-path" not in doc["bulk"]
    # Top level mirrors the primary link set.
    assert doc["link_set"] == "hsr"
    assert doc["seeds"] == ["r1-t1", "r1-t2"]
    assert doc["bulk"] == doc["link_sets"]["hsr"]["bulk"]
    json.dumps(doc, allow_nan=False)


def test_oracle_ratio_in_summary(builder: RunBuilder) -> None:
    # Constant trace 1448 B/ms, 10 ms one-way: oracle(1 MB from 1000) = 10+1+10+725 = 746 ms.
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 1492.0)])
    doc = analyse(read_run(builder.finish()))
    s = doc["bulk"]["minrtt"]["1MB"]
    assert s["ratio_vs_oracle"] == pytest.approx(746 / 1492)
    assert s["oracle_goodput_mbps_median"] == pytest.approx(goodput(MB, 746))


def test_bootstrap_ci_contains_point_and_is_deterministic() -> None:
    rng = np.random.default_rng(1)
    r = np.exp(rng.normal(0.1, 0.3, size=200))
    lo, hi = bootstrap_geomean_ci(r)
    assert lo < geomean(r) < hi
    assert (lo, hi) == bootstrap_geomean_ci(r)
    assert bootstrap_geomean_ci([2.0]) == pytest.approx((2.0, 2.0))
    assert all(math.isnan(x) for x in bootstrap_geomean_ci([]))


def test_trip_interval_carries_the_between_trip_variation() -> None:
    # Ten trips of 30 pairs each: tight within a trip, but the trips' levels differ. Resampling
    # pairs sees 300 independent-looking ratios; resampling trips sees 10 levels.
    rng = np.random.default_rng(7)
    levels = rng.normal(0.0, 0.15, size=10)
    groups = [list(np.exp(lv + rng.normal(0.0, 0.02, size=30))) for lv in levels]
    pooled = [x for g in groups for x in g]
    p_lo, p_hi = bootstrap_geomean_ci(pooled)
    t_lo, t_hi = trip_geomean_ci(groups)
    assert t_lo < geomean(pooled) < t_hi
    assert (t_hi - t_lo) > 3 * (p_hi - p_lo)
    # Same levels, no between-trip spread: both intervals are of one size.
    flat = [list(np.exp(rng.normal(0.0, 0.15, size=30))) for _ in range(10)]
    f_pooled = [x for g in flat for x in g]
    fp_lo, fp_hi = bootstrap_geomean_ci(f_pooled)
    ft_lo, ft_hi = trip_geomean_ci(flat)
    assert 0.5 < (ft_hi - ft_lo) / (fp_hi - fp_lo) < 2.0
    assert trip_geomean_ci(groups) == (t_lo, t_hi)  # deterministic
    # Fewer than two trips with ratios: no interval.
    assert all(math.isnan(x) for x in trip_geomean_ci([[1.0, 2.0]]))
    assert all(math.isnan(x) for x in trip_geomean_ci([[1.0], []]))


def test_log_variance_components_by_hand() -> None:
    e = math.e
    # logs [0, 0] and [1, 1]: grand mean 0.5, MSB = 1, MSW = 0, m0 = 2: between 0.5.
    v = log_variance_components([[1.0, 1.0], [e, e]], ratio=1.0)
    assert v is not None
    assert v["between"] == pytest.approx(0.5)
    assert v["within"] == pytest.approx(0.0)
    assert (v["trips"], v["pairs"], v["pairs_per_trip"]) == (2, 4, 2.0)
    assert v["trips_for_halfwidth"] == math.ceil((1.959963984540054 / 0.05) ** 2 * 0.5)
    # logs [0, 2] and [1, 1]: equal means (between 0), MSW = (1 + 1 + 0 + 0) / 2 = 1.
    v = log_variance_components([[1.0, e * e], [e, e]], ratio=1.0, halfwidth=0.1)
    assert v is not None
    assert v["between"] == 0.0
    assert v["within"] == pytest.approx(1.0)
    assert v["trips_for_halfwidth"] == math.ceil((1.959963984540054 / 0.1) ** 2 * 0.5)
    # Unequal sizes: between from the method of moments, checked against a direct formula.
    rng = np.random.default_rng(3)
    groups = [list(np.exp(rng.normal(mu, 0.2, size=n))) for mu, n in ((0, 5), (0.3, 9), (-0.2, 3))]
    v = log_variance_components(groups)
    assert v is not None
    logs = [np.log(g) for g in groups]
    n = np.array([len(x) for x in logs])
    grand = np.concatenate(logs).mean()
    msb = sum(len(x) * (x.mean() - grand) ** 2 for x in logs) / 2
    msw = sum(((x - x.mean()) ** 2).sum() for x in logs) / (n.sum() - 3)
    m0 = (n.sum() - (n**2).sum() / n.sum()) / 2
    assert v["between"] == pytest.approx((msb - msw) / m0)
    assert v["within"] == pytest.approx(msw)
    # One trip, or one pair per trip: nothing to split.
    assert log_variance_components([[1.0, 2.0]]) is None
    assert log_variance_components([[1.0], [2.0]]) is None


def test_summary_has_the_trip_interval(builder: RunBuilder) -> None:
    doc = analyse(read_run(paired_run(builder)))
    red = doc["bulk"]["redundant"]["overall"]
    assert red["n_trips"] == 2
    lo, hi = red["ci95_trips"]
    assert lo <= red["ratio_vs_minrtt"] <= hi
    assert red["ci95_trips_halfwidth"] == pytest.approx((hi - lo) / 2)
    mr = doc["bulk"]["minrtt"]["overall"]
    assert (mr["n_trips"], mr["ci95_trips"], mr["ci95_trips_halfwidth"]) == (2, [1.0, 1.0], 0.0)


def test_timeouts_are_censored_and_failures_counted(builder: RunBuilder) -> None:
    builder.meta["bulk"]["timeout_ms"] = 400
    builder.bulk("r1-t1", "minrtt", [download(i, 1000 * i, 100.0) for i in range(4)])
    builder.bulk(
        "r1-t1",
        "redundant",
        [
            download(0, 0, 100.0),
            download(1, 1000, 300.0, ok=False, timeout=True, error="timeout"),
            download(2, 2000, None, timeout=True, error="timeout"),  # end_ms null: run.json
            download(3, 3000, None, error="connection reset"),
        ],
    )
    doc = analyse(read_run(builder.finish()))
    s = doc["bulk"]["redundant"]["1MB"]
    counts = [s[k] for k in ("n", "n_timeout", "n_censored", "n_failed", "n_records")]
    assert counts == [3, 2, 2, 1, 4]
    assert s["ratio_vs_minrtt"] == pytest.approx(geomean([1.0, 1 / 3, 1 / 4]))
    assert s["n_pairs"] == 3


def test_handover_bins_use_the_minrtt_interval(builder: RunBuilder) -> None:
    builder.events("r1-t1", [1050.0, 5010.0, 5020.0, 9000.0])
    builder.events("r1-t2", [])
    for trip in ("r1-t1", "r1-t2"):
        builder.bulk(trip, "minrtt", [download(0, 1000, 100.0), download(1, 5000, 100.0)])
        builder.bulk(trip, "redundant", [download(0, 1000, 50.0), download(1, 5000, 8500.0)])
    doc = analyse(read_run(builder.finish()))
    by = doc["link_sets"]["hsr"]["bulk_by_handovers"]
    # r1-t1 id 0: 1 handover; r1-t1 id 1: 2 (the one at 9000 is outside minrtt's interval);
    # r1-t2: none.
    assert by["minrtt"]["0"]["n"] == 2
    assert by["minrtt"]["1"]["n"] == 1
    assert by["minrtt"]["2+"]["n"] == 1
    assert by["redundant"]["1"]["ratio_vs_minrtt"] == pytest.approx(2.0)
    assert by["redundant"]["2+"]["ratio_vs_minrtt"] == pytest.approx(100 / 8500)
    assert by["redundant"]["0"]["ratio_vs_minrtt"] == pytest.approx(math.sqrt(2 * 100 / 8500))


def test_im_stats_function() -> None:
    mean, p90, cov, n = im_stats({1: [10.0, 20.0], 2: [30.0, 50.0]})
    assert n == 4
    assert mean == pytest.approx(27.5)
    assert p90 == pytest.approx(np.percentile([10, 20, 30, 50], 90))
    # per-user means 15 and 40: pop std 12.5, mean 27.5.
    assert cov == pytest.approx(12.5 / 27.5)


def im_row(user: int, msg: int, delay: float | None) -> dict[str, object]:
    return {
        "user": user,
        "msg": msg,
        "due_ms": 100.0 * msg,
        "send_ms": 100.0 * msg,
        "recv_ms": None if delay is None else 100.0 * msg + delay,
        "delay_ms": delay,
        "ok": delay is not None,
        "error": None if delay is not None else "lost",
    }


def test_im_summary_and_ratios(builder: RunBuilder) -> None:
    builder.im("r1-t1", "single-path", 10, [im_row(0, 0, 100.0), im_row(1, 0, 300.0)])
    builder.im("r1-t1", "minrtt", 10, [im_row(0, 0, 50.0), im_row(1, 0, 50.0), im_row(1, 1, None)])
    builder.im("r1-t2", "minrtt", 10, [im_row(0, 0, 20.0), im_row(1, 0, 60.0)])
    doc = analyse(read_run(builder.finish()))
    sp = doc["im"]["single-path"]["10"]
    assert (sp["mean_ms"], sp["cov"], sp["n_ok"], sp["n_failed"]) == (200.0, 0.5, 2, 0)
    mr = doc["im"]["minrtt"]["10"]
    assert mr["mean_ms"] == pytest.approx(45.0)
    assert mr["n_ok"] == 4
    assert mr["n_failed"] == 1
    assert mr["n_trips"] == 2
    assert mr["cov"] == pytest.approx((0.0 + 0.5) / 2)  # per trip, averaged
    assert mr["vs_single_path"]["mean"] == pytest.approx(45.0 / 200.0)
    assert mr["vs_single_path"]["cov"] == pytest.approx(0.25 / 0.5)
    assert mr["vs_minrtt"]["mean"] == pytest.approx(1.0)
    assert "20" not in doc["im"]["minrtt"]


def test_missing_and_partial_scheme_dirs(builder: RunBuilder) -> None:
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 100.0)])
    builder.bulk("r1-t1", "redundant", [download(0, 1000, 200.0)])
    builder.bulk("r1-t2", "minrtt", [download(0, 1000, 100.0)])
    # r1-t2/redundant missing; single-path missing everywhere; an extra scheme dir is picked up.
    builder.bulk("r1-t2", "blest", [download(0, 1000, 50.0)])
    doc = analyse(read_run(builder.finish()))
    assert doc["bulk"]["redundant"]["1MB"]["n"] == 1
    assert doc["bulk"]["blest"]["1MB"]["ratio_vs_minrtt"] == pytest.approx(2.0)
    assert doc["bulk"]["minrtt"]["1MB"]["n"] == 2
    assert doc["issues"]["by_kind"]["missing scheme directory"] == 3
    assert "blest" in doc["schemes"]
    assert "single-path" not in doc["schemes"]


def test_no_minrtt_gives_null_ratios(builder: RunBuilder) -> None:
    builder.bulk("r1-t1", "redundant", [download(0, 1000, 200.0)])
    doc = analyse(read_run(builder.finish()))
    s = doc["bulk"]["redundant"]["1MB"]
    assert s["ratio_vs_minrtt"] is None
    assert s["ci95"] is None
    json.dumps(doc, allow_nan=False)


def test_malformed_lines_are_skipped_and_counted(builder: RunBuilder) -> None:
    builder.bulk(
        "r1-t1",
        "minrtt",
        [download(0, 1000, 100.0), {"id": "x"}, download(1, 2000, 100.0)],
        extra=["{not json", "[1, 2]", '{"id": 3, "label": "1MB"'],
    )
    path = builder.scheme_dir("r1-t1", "minrtt") / "im-10.jsonl"
    path.write_text('{"user": 0, "msg": 0, "ok": true, "delay_ms": 5}\ngarbage\n', encoding="utf-8")
    run = read_run(builder.finish())
    doc = analyse(run)
    assert doc["bulk"]["minrtt"]["1MB"]["n"] == 2
    assert doc["issues"]["by_kind"]["malformed JSON line"] == 4
    assert doc["issues"]["by_kind"]["bad bulk record"] == 1
    assert any("bulk.jsonl:5" in e for e in doc["issues"]["examples"])
    assert doc["im"]["minrtt"]["10"]["n_ok"] == 1


def test_bad_link_files_mean_no_oracle_not_a_crash(builder: RunBuilder) -> None:
    (builder.trip_dir("r1-t1") / "c0.schedule").write_text("bogus 1\n", encoding="utf-8")
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 100.0)])
    doc = analyse(read_run(builder.finish()))
    assert doc["bulk"]["minrtt"]["1MB"]["ratio_vs_oracle"] is None
    assert doc["issues"]["by_kind"]["unusable link files (no oracle)"] == 1
