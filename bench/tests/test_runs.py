"""Run-to-run variation of the overall hrsch/minrtt ratio (``polycorn_bench.runs``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunBuilder, download

from polycorn_bench.report import markdown
from polycorn_bench.runs import RunRatio, load, main, summarise, t975
from polycorn_bench.stats import Z95, geomean


def hsr_json(path: Path, ratio: float, ci: list[float], n: int = 150, **kw: Any) -> Path:
    """A minimal hsr.json with one overall hrsch/minrtt ratio."""
    doc: dict[str, Any] = {
        "profile": "full",
        "commit": kw.pop("commit", "abc"),
        "link_set": "hsr",
        "seeds": ["r7-t1001", "r7-t1002"],
        "link_sets": {
            "hsr": {
                "trips": kw.pop("trips", ["r7-t1001", "r7-t1002"]),
                "bulk": {
                    "hrsch": {"overall": {"ratio_vs_minrtt": ratio, "ci95": ci, "n_pairs": n}}
                },
            }
        },
    }
    doc.update(kw)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def run_ratio(ratio: float, half_log: float, source: str = "x") -> RunRatio:
    """A run whose 95 % interval is ratio · exp(±half_log)."""
    ci = (ratio * math.exp(-half_log), ratio * math.exp(half_log))
    return RunRatio(source, ratio, ci, 150, "abc", "full", ("t1", "t2"))


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(4) == pytest.approx(2.776)
    assert t975(30) == pytest.approx(2.042)
    assert t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_agreeing_runs_have_no_between_run_variance() -> None:
    # Three runs whose spread is well inside their own intervals: Q < k - 1, tau = 0, and the
    # combined estimate is the inverse-variance mean.
    runs = [run_ratio(0.95, 0.06), run_ratio(0.97, 0.06), run_ratio(0.96, 0.06)]
    s = summarise(runs)
    assert s["runs"] == 3
    assert s["tau"] == 0.0
    assert s["hrsch_vs_minrtt"] == pytest.approx([0.95, 0.97, 0.96])
    assert s["mean"] == pytest.approx(geomean([0.95, 0.97, 0.96]))
    assert s["combined"] == pytest.approx(s["mean"])  # equal weights
    se = 0.06 / Z95 / math.sqrt(3)
    lo, hi = s["combined_ci95"]
    assert lo == pytest.approx(s["combined"] * math.exp(-t975(2) * se))
    assert hi == pytest.approx(s["combined"] * math.exp(t975(2) * se))
    assert s["combined_ci95_halfwidth"] == pytest.approx((hi - lo) / 2)
    assert s["sd_between_runs"] == pytest.approx(float(np.std(np.log([0.95, 0.97, 0.96]), ddof=1)))
    assert s["same_trips"] is True


def test_disagreeing_runs_add_between_run_variance() -> None:
    # Two runs 20 % apart with tight intervals: DerSimonian-Laird by hand.
    a, b = run_ratio(0.9, 0.03), run_ratio(1.1, 0.03)
    s = summarise([a, b])
    y = [math.log(0.9), math.log(1.1)]
    s2 = (0.03 / Z95) ** 2
    w = 1 / s2
    y_w = sum(y) / 2
    q = sum(w * (v - y_w) ** 2 for v in y)
    tau2 = (q - 1) / (2 * w - 2 * w * w / (2 * w))
    assert s["q"] == pytest.approx(q)
    assert s["tau"] == pytest.approx(math.sqrt(tau2))
    assert s["tau"] > 0.1
    # The combined interval is far wider than the fixed-effect one would be, and one run's
    # interval including the between-run variance is wider than its own.
    mu = sum(y) / 2
    se = math.sqrt((s2 + tau2) / 2)
    assert s["combined_ci95"] == pytest.approx(
        [math.exp(mu - t975(1) * se), math.exp(mu + t975(1) * se)]
    )
    own = (a.ci95[1] - a.ci95[0]) / 2
    assert s["single_run_ci95_halfwidth"] > 3 * own
    assert s["ci95_halfwidth"][0] == pytest.approx(own)


def test_summarise_needs_two_runs() -> None:
    with pytest.raises(ValueError, match="two runs"):
        summarise([run_ratio(1.0, 0.05)])


def test_zero_width_interval_does_not_divide_by_zero() -> None:
    s = summarise([RunRatio("a", 1.0, (1.0, 1.0), 4, None, None, ()), run_ratio(1.1, 0.05)])
    assert math.isfinite(s["combined"])
    json.dumps(s, allow_nan=False)


def test_load_from_hsr_json_and_from_run_dir(tmp_path: Path) -> None:
    j = load(hsr_json(tmp_path / "a.json", 0.96, [0.90, 1.02], commit="c1"))
    assert (j.ratio, j.ci95, j.n_pairs, j.commit) == (0.96, (0.90, 1.02), 150, "c1")
    assert j.trips == ("r7-t1001", "r7-t1002")
    assert j.log_se == pytest.approx((math.log(1.02) - math.log(0.90)) / (2 * Z95))

    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], ["r1-t1", "r1-t2"])
    for trip, f in (("r1-t1", 1.25), ("r1-t2", 0.8)):
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0), download(1, 5000, 1000.0)])
        b.bulk(trip, "hrsch", [download(0, 1000, 1000.0 / f), download(1, 5000, 500.0)])
    r = load(b.finish())
    assert r.n_pairs == 4
    assert r.ratio == pytest.approx(geomean([1.25, 2.0, 0.8, 2.0]))
    assert r.ci95[0] <= r.ratio <= r.ci95[1]
    assert r.trips == ("r1-t1", "r1-t2")


def test_cli_writes_run_to_run_and_the_report_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = hsr_json(tmp_path / "a.json", 0.96, [0.90, 1.02])
    b = hsr_json(tmp_path / "b.json", 1.06, [1.00, 1.12], trips=["r7-t1001", "r7-t1009"])
    into = hsr_json(tmp_path / "hsr.json", 0.96, [0.90, 1.02], bulk={}, link_sets={})
    md = tmp_path / "hsr.md"
    assert main([str(a), str(b), "--into", str(into), "--md", str(md)]) == 0
    doc = json.loads(into.read_text())
    rr = doc["run_to_run"]
    assert rr["runs"] == 2
    assert rr["hrsch_vs_minrtt"] == [0.96, 1.06]
    assert rr["same_trips"] is False
    assert rr["sources"] == [str(a), str(b)]
    assert doc["profile"] == "full"  # the rest of the document is kept
    text = md.read_text()
    assert "## Run-to-run variation" in text
    assert "| 2 | " in text and "1.060 [1.000, 1.120]" in text
    assert "not all on the same trips" in text
    err = capsys.readouterr().err
    assert "same trips" in err
    # Without the field, the report has no such section.
    del doc["run_to_run"]
    assert "Run-to-run" not in markdown(doc)


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = hsr_json(tmp_path / "a.json", 0.96, [0.90, 1.02])
    into = tmp_path / "hsr.json"
    into.write_text("{}")
    assert main([str(a), "--into", str(into)]) == 2
    assert "at least two runs" in capsys.readouterr().err
    one_pair = hsr_json(tmp_path / "c.json", 0.9, [0.9, 0.9], n=1)
    assert main([str(a), str(one_pair), "--into", str(into)]) == 2
    assert "at least 2 paired" in capsys.readouterr().err
    swapped = hsr_json(tmp_path / "d.json", 0.9, [1.0, 0.8])
    assert main([str(a), str(swapped), "--into", str(into)]) == 2
    assert "out of order" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "missing.json"), "--into", str(into)]) == 2
    assert json.loads(into.read_text()) == {}  # nothing written on error


def test_trip_intervals_widen_one_runs_interval() -> None:
    # Each run carries the interval that resamples trips; one run's total interval uses it
    # with the between-run tau (from the pairs' intervals) added.
    def with_trips(r: RunRatio, half_log: float) -> RunRatio:
        ci = (r.ratio * math.exp(-half_log), r.ratio * math.exp(half_log))
        return RunRatio(r.source, r.ratio, r.ci95, r.n_pairs, r.commit, r.profile, r.trips, ci)

    runs = [with_trips(run_ratio(x, 0.03), 0.06) for x in (0.95, 1.0, 1.05)]
    s = summarise(runs)
    st = 0.06 / Z95
    lo, hi = s["single_run_trips_ci95"]
    single = math.sqrt(st**2 + s["tau"] ** 2)
    assert lo == pytest.approx(s["combined"] * math.exp(-Z95 * single))
    assert hi == pytest.approx(s["combined"] * math.exp(Z95 * single))
    assert s["single_run_trips_ci95_halfwidth"] > s["single_run_ci95_halfwidth"]
    assert s["ci95_trips"][0] == pytest.approx(list(runs[0].ci95_trips or ()))
    # One run without a trip interval: no combined trip interval.
    s = summarise([*runs[:2], run_ratio(1.0, 0.03)])
    assert s["single_run_trips_ci95"] is None
    assert s["single_run_trips_ci95_halfwidth"] is None


def test_load_reads_the_trip_interval(tmp_path: Path) -> None:
    j = hsr_json(tmp_path / "a.json", 0.96, [0.90, 1.02])
    doc = json.loads(j.read_text())
    doc["link_sets"]["hsr"]["bulk"]["hrsch"]["overall"]["ci95_trips"] = [0.85, 1.08]
    j.write_text(json.dumps(doc))
    assert load(j).ci95_trips == (0.85, 1.08)
    # Malformed or reversed bounds are ignored, not trusted.
    doc["link_sets"]["hsr"]["bulk"]["hrsch"]["overall"]["ci95_trips"] = [1.08, 0.85]
    j.write_text(json.dumps(doc))
    assert load(j).ci95_trips is None

    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], ["r1-t1", "r1-t2", "r1-t3"])
    for trip, f in (("r1-t1", 1.25), ("r1-t2", 0.8), ("r1-t3", 1.0)):
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0), download(1, 5000, 1000.0)])
        b.bulk(trip, "hrsch", [download(0, 1000, 1000.0 / f), download(1, 5000, 1000.0 / f)])
    r = load(b.finish())
    assert r.ci95_trips is not None
    assert r.ci95_trips[0] <= r.ratio <= r.ci95_trips[1]
