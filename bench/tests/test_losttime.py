"""Lost time against the oracle: each download's timeline from its progress curve and the
trip's carriers, attributed to set-up, stalls while a carrier was lit, and the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunBuilder, download

from polycorn_bench.analysis import analyse
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown

MB = 1_048_576


def run_with(tmp_path: Path) -> RunBuilder:
    """One trip, one carrier of 1448 B/ms at 10 ms one way, dark over [20 s, 21 s).
    minrtt: 1 MB from 10,000 ms: first byte at 10,300, nothing over 10,500-10,800 (lit),
    then the rest by 11,500. hrsch: 1 MB from 19,500 ms, a 200 ms pause (too short for a
    stall), stalled over 20,000-21,000 (dark)."""
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], ["r1-t1"])
    (b.trip_dir("r1-t1") / "c0.schedule").write_text(
        "delay 0 10\nblackout 20000 21000 hold\n", encoding="utf-8"
    )
    prog_m = [[10_000.0 + 100 * i, 0.0] for i in range(4)]  # 10,000..10,300: nothing yet
    prog_m[3][1] = 100_000.0
    prog_m += [[10_400.0, 300_000.0], [10_500.0, 400_000.0]]
    prog_m += [[10_600.0, 400_000.0], [10_700.0, 400_000.0], [10_800.0, 400_000.0]]
    prog_m += [[10_900.0 + 100 * i, 400_000.0 + 100_000 * (i + 1)] for i in range(6)]
    prog_m += [[11_500.0, float(MB)]]
    b.bulk("r1-t1", "minrtt", [download(0, 10_000.0, 1_500.0, progress=prog_m)])
    prog_h = [[19_500.0, 0.0], [19_600.0, 200_000.0], [19_700.0, 400_000.0]]
    # 19,700-19,900: a 200 ms pause with the carrier lit (a round trip, not a stall).
    prog_h += [[19_800.0, 400_000.0], [19_900.0, 400_000.0], [20_000.0, 700_000.0]]
    prog_h += [[20_000.0 + 100 * i, 700_000.0] for i in range(1, 11)]  # dark, no bytes
    prog_h += [[21_100.0, 900_000.0], [21_200.0, float(MB)]]
    b.bulk("r1-t1", "hrsch", [download(0, 19_500.0, 1_700.0, progress=prog_h)])
    return b


def test_lost_time_is_set_up_stalls_with_a_carrier_lit_and_the_rest(tmp_path: Path) -> None:
    doc = analyse(read_run(run_with(tmp_path).finish()))
    lt = doc["lost_time"]
    m = lt["minrtt"]["overall"]
    assert m["n"] == 1
    assert m["actual_s"] == pytest.approx(1.5)
    assert m["setup_s"] == pytest.approx(0.3)
    # 10,500-10,800: no byte, the carrier lit.
    assert m["stall_lit_s"] == pytest.approx(0.3)
    assert m["stall_dark_s"] == 0
    oracle = doc["bulk"]["minrtt"]["overall"]
    assert m["oracle_s"] > 0 and oracle["n"] == 1
    assert m["lost_s"] == pytest.approx(m["actual_s"] - m["oracle_s"])
    # The oracle's first byte: the request's 10 ms up, the first opportunity, 10 ms down.
    assert m["setup_excess_s"] == pytest.approx(0.3 - 0.021, abs=0.002)
    parts = m["setup_excess_s"] + m["stall_lit_s"] + m["slow_s"]
    assert parts == pytest.approx(m["lost_s"])
    assert m["stall_lit_share"] == pytest.approx(0.3 / m["lost_s"])
    h = lt["hrsch"]["overall"]
    # The blackout: a dark stall, not a lit one; the oracle waits through it too.
    assert h["stall_dark_s"] == pytest.approx(1.0)
    assert h["stall_lit_s"] == 0, "a 200 ms pause is not a stall"
    assert "1MB" in lt["hrsch"]
    assert "### Where bulk downloads lose time" in markdown(doc)


def test_no_attribution_without_progress_curves(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], ["r1-t1"])
    b.bulk("r1-t1", "minrtt", [download(0, 1000.0, 500.0)])
    doc = analyse(read_run(b.finish()))
    assert doc["lost_time"] is None
    assert "lose time" not in markdown(doc)
