"""Variants of hrsch and of the default pipeline against the composition each differs from."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunBuilder, download
from test_hrsch import im_rows

from polycorn_bench.analysis import analyse
from polycorn_bench.capacity import is_direct
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown
from polycorn_bench.variants import STALE, VARIANTS, recovery_gain

TRIPS = ["r1-t1", "r1-t2"]
KB256 = 262_144


def test_leave_one_out_and_default_variants(tmp_path: Path) -> None:
    schemes = ["minrtt", "hrsch", "hrsch-no-tpr", STALE, "hrsch+stale-bursts"]
    b = RunBuilder(tmp_path / "run", schemes, TRIPS)
    # 1 MB and 256 KB downloads: hrsch 1.25x as fast as hrsch without TPR; the bursts
    # variant level with the default in bulk, and its chat 20 % faster.
    durations = {
        "minrtt": 1000.0,
        "hrsch-no-tpr": 1000.0,
        "hrsch": 800.0,
        STALE: 800.0,
        "hrsch+stale-bursts": 800.0,
    }
    for trip in TRIPS:
        for s, dur in durations.items():
            b.bulk(trip, s, [download(0, 1000, dur), download(1, 5000, dur / 2, size=KB256)])
        b.im(trip, STALE, 10, im_rows({0: [100.0, 120.0], 1: [100.0, 120.0]}))
        b.im(trip, "hrsch+stale-bursts", 10, im_rows({0: [80.0, 96.0], 1: [80.0, 96.0]}))
    doc = analyse(read_run(b.finish()))
    v = doc["variants"]
    assert list(v) == ["hrsch-no-tpr", "hrsch+stale-bursts"], "only variants whose pair ran"
    tpr = v["hrsch-no-tpr"]
    assert (tpr["scheme"], tpr["base"]) == ("hrsch", "hrsch-no-tpr")
    assert tpr["bulk"]["gain"] == pytest.approx(0.25)
    assert tpr["bulk"]["n_pairs"] == 4
    assert tpr["bulk"]["resolved"] is True
    assert tpr["im"] is None, "no chat records for hrsch"
    bursts = v["hrsch+stale-bursts"]
    assert bursts["base"] == STALE
    assert bursts["bulk"]["gain"] == pytest.approx(0.0)
    assert bursts["bulk"]["resolved"] is False
    assert bursts["im"]["change"]["mean"] == pytest.approx(-0.2)
    assert bursts["im"]["change"]["p90"] == pytest.approx(-0.2)
    assert bursts["im"]["n_trips"] == 2
    assert bursts["im"]["ci95"]["mean"] == pytest.approx([-0.2, -0.2])
    assert doc["link_sets"]["hsr"]["variants"] == v
    md = markdown(doc)
    assert "### Variants of hrsch and of the default pipeline" in md
    assert "| `hrsch+stale-bursts` | `hrsch+stale-bursts` over `hrsch+stale` |" in md
    assert "-20.0 % [-20.0, -20.0]" in md


def test_without_variants_the_section_is_null(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], TRIPS)
    for trip in TRIPS:
        b.bulk(trip, "minrtt", [download(0, 1000, 1000.0)])
        b.bulk(trip, "hrsch", [download(0, 1000, 800.0)])
    assert analyse(read_run(b.finish()))["variants"] is None


def test_every_variant_is_a_testbed_pipeline() -> None:
    """The variants' schemes and bases exist: built in, in testbed/pipelines.toml, or a
    direct scheme (no pipeline: the passenger's own TCP)."""
    toml = (Path(__file__).resolve().parents[2] / "testbed/pipelines.toml").read_text("utf-8")
    built_in = {"hrsch", "minrtt", "hrsch+hol", "hrsch+", STALE}
    for scheme, base, _ in VARIANTS.values():
        # polycorn_benchrun.hsr: NAME@oracle (@broad) is the pipeline NAME with another table,
        # NAME~CC the pipeline NAME with another congestion control.
        for s in (scheme.split("@")[0].split("~")[0], base.split("@")[0].split("~")[0]):
            if is_direct(s):
                continue
            assert s in built_in or f'[pipelines."{s}"]' in toml or f"[pipelines.{s}]" in toml, s


def _window(trip: str, t_ms: float, g: float, ref: float) -> dict[str, object]:
    return {
        "trip": trip,
        "t_ms": t_ms,
        "carrier": 0,
        "source": "backlog",
        "id": 0,
        "goodput_mbps": g,
        "minrtt_goodput_mbps": ref,
    }


def test_recovery_gain_pairs_the_windows_both_schemes_have() -> None:
    hof = {
        "by_scheme": {
            "hrsch": {"windows": [_window("a", 1, 2.0, 1.0), _window("a", 2, 4.0, 2.0)]},
            # One window more (unpaired with hrsch) and 1.5x hrsch on the common ones.
            "hrsch@oracle": {
                "windows": [
                    _window("a", 1, 3.0, 1.0),
                    _window("a", 2, 6.0, 2.0),
                    _window("b", 9, 100.0, 1.0),
                ]
            },
        }
    }
    g = recovery_gain(hof, "hrsch@oracle", "hrsch")
    assert g is not None
    assert g["n_windows"] == 2
    assert g["gain"] == pytest.approx(0.5)
    assert g["ci95"][0] == pytest.approx(0.5) and g["resolved"]
    # Against minrtt: each window's own minrtt goodput, all three windows.
    m = recovery_gain(hof, "hrsch@oracle", "minrtt")
    assert m is not None and m["n_windows"] == 3
    assert m["gain"] == pytest.approx((3 + 6 + 100) / (1 + 2 + 1) - 1)
    assert recovery_gain(hof, "hrsch+", "hrsch") is None
    assert recovery_gain(None, "hrsch", "minrtt") is None
