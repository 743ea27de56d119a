"""What a caught failure saves and a needless hold costs (``polycorn_bench.costs``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunBuilder, handover
from test_backlog import backlog, write_backlog

from polycorn_bench.analysis import analyse
from polycorn_bench.costs import pipelines, stall_seconds, threshold
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown

P = "hrsch+"
SCHEMES = ["minrtt", f"{P}@none", f"{P}@oracle", f"{P}@every"]
TRIPS = ["r1-t1", "r1-t2", "r1-t3", "r1-t4"]
SAVED = 4e6  # bytes a caught failure saves
HELD = 5e5  # bytes a needless hold costs
HOLD_S = 0.4  # seconds a needless hold lasts (a caught failure's: 1 s)


def proxy_metrics(held_s: float, holds: int) -> str:
    """A proxy's end-of-trip snapshot with hof-reject's hold counters."""
    m = "polycorn_sched_schedulerlet_events_total"
    return (
        f"# TYPE {m} counter\n"
        f'{m}{{schedulerlet="hof-reject",event="held_ms"}} {held_s * 1000:g}\n'
        f'{m}{{schedulerlet="hof-reject",event="rejections"}} {holds}\n'
    )


def whole(nbytes: float) -> dict[str, object]:
    """A backlog record over [100 s, 200 s] of trip time that delivered ``nbytes``."""
    return backlog(1e5, 2e5, [[1e5, 0], [2e5, nbytes]])


def costs_run(tmp_path: Path, schemes: list[str] = SCHEMES) -> RunBuilder:
    """Backlog window [100.0008 s, 200 s] on every trip. r1-t1: 2 failures and 3 successes in
    the window, a success before and a failure after it; r1-t2: 1 failure, 4 successes;
    r1-t3: 2 successes; r1-t4: a failure, but no @every record (left out). Each caught
    failure adds SAVED bytes to @oracle over @none, each success costs @every HELD bytes."""
    b = RunBuilder(tmp_path / "run", schemes, TRIPS)
    plan = {
        "r1-t1": ([110_000, 150_000], [105_000, 130_000, 170_000], [50_000], [300_000]),
        "r1-t2": ([120_000], [140_000, 160_000, 180_000, 190_000], [], []),
        "r1-t3": ([], [115_000, 125_000], [], []),
        "r1-t4": ([150_000], [], [], []),
    }
    for trip, (fails, oks, oks_outside, fails_outside) in plan.items():
        rows = [r for t in fails + fails_outside for r in handover(t, 3000, "rlf")]
        rows += [r for t in oks + oks_outside for r in handover(t, 50)]
        b.event_rows(trip, sorted(rows, key=lambda r: float(r["t_ms"])))
        none = 50e6 + len(oks) * 1e5  # the none copy's bytes vary between trips
        oracle = none + SAVED * len(fails)
        every = oracle - HELD * len(oks)
        write_backlog(b, trip, "minrtt", [whole(none)])
        if f"{P}@none" in schemes:
            write_backlog(b, trip, f"{P}@none", [whole(none)])
        write_backlog(b, trip, f"{P}@oracle", [whole(oracle)])
        if trip != "r1-t4":
            write_backlog(b, trip, f"{P}@every", [whole(every)])
        b.metrics(trip, f"{P}@oracle", None, proxy_metrics(len(fails), len(fails)))
        if trip != "r1-t3":  # r1-t3's @every left no snapshot: not in the held seconds
            held = len(fails) + HOLD_S * len(oks)
            b.metrics(trip, f"{P}@every", None, proxy_metrics(held, len(fails) + len(oks)))
    return b


def test_costs_from_the_three_copies_over_the_backlog_window(tmp_path: Path) -> None:
    doc = analyse(read_run(costs_run(tmp_path).finish()))
    ls = doc["link_sets"]["hsr"]
    c = ls["handover_costs"][P]
    assert (c["trips"], c["trips_left_out"]) == (3, 1)
    assert (c["failed"], c["succeeded"]) == (3, 9), "handovers outside the window do not count"
    assert c["saved_per_failure_mb"] == pytest.approx(SAVED / 1e6)
    assert c["cost_per_hold_mb"] == pytest.approx(HELD / 1e6)
    assert c["threshold_p"] == pytest.approx(HELD / (SAVED + HELD))
    assert c["cost_ratio"] == pytest.approx(SAVED / HELD)
    lo, hi = c["saved_per_failure_mb_ci95"]
    assert lo == pytest.approx(SAVED / 1e6) and hi == pytest.approx(SAVED / 1e6)
    r_lo, r_hi = c["cost_ratio_ci95"]
    assert r_lo == pytest.approx(SAVED / HELD) and r_hi == pytest.approx(SAVED / HELD)
    # In seconds of the none copy's mean goodput over the three trips' windows.
    rate = sum(50e6 + k * 1e5 for k in (3, 4, 2)) / (3 * 99.9992)
    assert c["saved_per_failure_s"] == pytest.approx(SAVED / rate)
    assert "handover_costs" not in ls["notes"]
    # Held seconds from r1-t1 and r1-t2 only (r1-t3 has no @every snapshot).
    assert c["trips_with_holds"] == 2
    assert c["cost_per_held_second_mb"] == pytest.approx(HELD / HOLD_S / 1e6)
    assert c["mean_hold_s"]["oracle"] == pytest.approx(1.0)
    assert c["mean_hold_s"]["every"] == pytest.approx((3 + HOLD_S * 7) / 10)
    md = markdown(doc)
    assert "What a caught failure saves and a needless hold costs" in md
    assert f"| `{P}` | 3 (3 / 9) |" in md


def test_costs_interval_spreads_with_the_trips(tmp_path: Path) -> None:
    b = costs_run(tmp_path)
    # r1-t2's caught failure saved three times as much: the interval over trips widens.
    write_backlog(b, "r1-t2", f"{P}@oracle", [whole(50e6 + 4e5 + 3 * SAVED)])
    write_backlog(b, "r1-t2", f"{P}@every", [whole(50e6 + 4e5 + 3 * SAVED - 4 * HELD)])
    c = analyse(read_run(b.finish()))["link_sets"]["hsr"]["handover_costs"][P]
    assert c["saved_per_failure_mb"] == pytest.approx((2 * SAVED + 3 * SAVED) / 3 / 1e6)
    lo, hi = c["saved_per_failure_mb_ci95"]
    assert lo < c["saved_per_failure_mb"] < hi
    p_lo, p_hi = c["threshold_p_ci95"]
    r_lo, r_hi = c["cost_ratio_ci95"]
    assert r_lo == pytest.approx(1 / p_hi - 1) and r_hi == pytest.approx(1 / p_lo - 1)


def test_no_section_without_the_three_copies_and_a_note_without_their_records(
    tmp_path: Path,
) -> None:
    two = ["minrtt", f"{P}@oracle", f"{P}@every"]
    ls = analyse(read_run(costs_run(tmp_path / "a", two).finish()))["link_sets"]["hsr"]
    assert ls["handover_costs"] is None and "handover_costs" not in ls["notes"]
    b = RunBuilder(tmp_path / "b" / "run", SCHEMES, ["r1-t1"])
    b.event_rows("r1-t1", handover(150_000, 3000, "rlf"))
    ls = analyse(read_run(b.finish()))["link_sets"]["hsr"]
    assert ls["handover_costs"] is None
    assert "no trip has the backlog record" in ls["notes"]["handover_costs"]


def test_pipelines_and_threshold() -> None:
    assert pipelines(["minrtt", "a@none", "b@oracle", "a@every", "a@oracle", "b@none"]) == ["a"]
    assert threshold(4.0, 1.0) == pytest.approx(0.2)
    assert threshold(0.0, 1.0) == 1.0, "a caught failure that saves nothing: no cell pays"
    assert threshold(-1.0, 1.0) == 1.0
    assert threshold(4.0, 0.0) == 0.0, "a hold that costs nothing: every cell pays"
    assert threshold(4.0, -1.0) == 0.0


def stalled(nbytes: float, stall_ms: float) -> dict[str, object]:
    """A backlog record over [100 s, 200 s] whose download stopped for ``stall_ms`` once,
    right after its first byte."""
    t = 1e5 + 100
    return backlog(1e5, 2e5, [[1e5, 0], [t, 1], [t + stall_ms, 1], [2e5, nbytes]])


def test_stall_seconds_count_gaps_from_the_first_byte_on() -> None:
    p = [(0.0, 0.0), (100.0, 0.0), (200.0, 10.0), (300.0, 10.0), (400.0, 10.0)]
    p += [(500.0, 10.0), (600.0, 20.0), (700.0, 20.0), (800.0, 30.0), (900.0, 30.0)]
    p += [(1000.0, 30.0), (1100.0, 30.0)]
    # 200-500 ms (300 ms) and 800-1100 ms at the end count; 600-700 ms is too short, and
    # nothing before the first byte counts.
    assert stall_seconds(p) == pytest.approx(0.6)
    assert stall_seconds(p, min_ms=400) == 0.0
    assert stall_seconds([(0.0, 0.0), (100.0, 0.0)]) is None
    assert stall_seconds(None) is None


def test_costs_in_stall_seconds(tmp_path: Path) -> None:
    b = costs_run(tmp_path)
    plan = {"r1-t1": (2, 3), "r1-t2": (1, 4), "r1-t3": (0, 2)}
    for trip, (fails, oks) in plan.items():
        # No table: 2 s of stall per failure; the oracle 0.5 s; every hold adds 0.1 s.
        write_backlog(b, trip, f"{P}@none", [stalled(50e6, 400 + 2000 * fails)])
        write_backlog(b, trip, f"{P}@oracle", [stalled(50e6, 400 + 500 * fails)])
        write_backlog(b, trip, f"{P}@every", [stalled(50e6, 400 + 500 * fails + 100 * oks)])
    c = analyse(read_run(b.finish()))["link_sets"]["hsr"]["handover_costs"][P]
    assert c["trips_with_stalls"] == 3
    assert c["stall_saved_per_failure_s"] == pytest.approx(1.5)
    assert c["stall_cost_per_hold_s"] == pytest.approx(0.1)
    assert c["stall_threshold_p"] == pytest.approx(0.1 / 1.6)
    assert c["stall_cost_ratio"] == pytest.approx(15.0)
    lo, hi = c["stall_saved_per_failure_s_ci95"]
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
