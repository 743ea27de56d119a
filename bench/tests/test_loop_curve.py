"""The loop's learning curve over many trips (``polycorn_bench.loop_curve`` and the per-trip
and running fields of ``loop.json``) on synthetic runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import RunBuilder, download, failure_table_doc, progress

from polycorn_bench import loop
from polycorn_bench.loop import LEARNED, NONE, TRUTH, Table, analyse_loop, cell_id, main, timing
from polycorn_bench.loop_curve import (
    Fixes,
    Pairs,
    TripSample,
    _from_on,
    gain_test,
    half_oracle_gain,
    pooled,
    reached,
    running,
    share,
    wilson,
)
from polycorn_bench.records import HandoverFailure, read_run

SCHEMES = [LEARNED, "minrtt", NONE, TRUTH]
#: The failure of every synthetic trip: carrier 0 leaves cell 3 at 20.1 s, at track_m 1675.
FAIL_T_MS = 20_100.0
FAIL_X_M = FAIL_T_MS / 12
CELL = cell_id(0, 3)


# ------------------------------------------------------------------ building blocks


def test_wilson_interval_known_values() -> None:
    assert wilson(5, 10) == pytest.approx([0.2366, 0.7634], abs=1e-4)
    assert wilson(0, 10) == pytest.approx([0.0, 0.2775], abs=1e-4)
    assert wilson(1, 1) == pytest.approx([0.2065, 1.0], abs=1e-4)
    assert wilson(0, 0) is None
    assert share(3, 4) == (0.75, wilson(3, 4))
    assert share(None, 4) == (None, None)
    assert share(0, 0) == (None, None)


def failure(x: float | None, t_ms: float = 20_000.0, carrier: int = 0, cell: int = 3) -> Any:
    return HandoverFailure(t_ms, t_ms + 800, carrier, cell, cell + 1, x, "rlf", 800.0)


def test_speed_of_the_last_recent_fix() -> None:
    fixes = Fixes((0.0, 5_000.0, 30_000.0), (80.0, 50.0, 0.1))
    assert fixes.speed_at(-1.0) is None
    assert fixes.speed_at(6_000.0) == 50.0
    assert fixes.speed_at(15_000.0) == 50.0
    assert fixes.speed_at(15_001.0) is None  # more than 10 s old
    assert fixes.speed_at(30_000.0) is None  # standing still


def test_timing_classes_with_hprs_lead() -> None:
    """Δ = (x − L̂) / v at v = 50 m/s; correct for Δ in [−0.44, 2.06] s."""
    table = Table(
        1,
        {
            cell_id(0, 1): (1000.0, 1),  # x 1075: Δ 1.5 s, correct
            cell_id(0, 2): (1000.0, 1),  # x 1110: Δ 2.2 s, early
            cell_id(0, 3): (1000.0, 1),  # x 1000 − 25: Δ −0.5 s, late
            cell_id(0, 4): (1000.0, 1),  # x 1000 − 20: Δ −0.4 s, correct
            cell_id(1, 5): (1000.0, 1),  # decreasing, x 925: Δ +1.5 s, correct
            cell_id(0, 6): (1000.0, 1),  # no position
        },
        {cell_id(1, 5): -1},
    )
    fixes = Fixes((19_000.0,), (50.0,))
    fs = [
        failure(1075.0, cell=1),
        failure(1110.0, cell=2),
        failure(975.0, cell=3),
        failure(980.0, cell=4),
        failure(925.0, carrier=1, cell=5),
        failure(None, cell=6),
        failure(1000.0, cell=9),  # no entry: late
    ]
    got = timing(fs, table, fixes)
    assert got["failures_correct"] == 3
    assert got["failures_early"] == 1
    assert got["failures_late"] == 2
    assert got["failures_without_position"] == 1
    assert got["speed_fallbacks"] == 0
    assert got["delta_s"] == pytest.approx([-0.5, -0.4, 1.5, 1.5, 2.2])
    # No lead: the window is [0, 2.5] s, so −0.4 s is late and 2.2 s correct.
    no_lead = timing(fs, table, fixes, lead_s=0.0)
    assert (no_lead["failures_correct"], no_lead["failures_early"]) == (3, 0)
    assert no_lead["failures_late"] == 3
    # Without GPS: 83.3 m/s, each tabled failure with a position counted as a fallback.
    fallback = timing(fs, table, None)
    assert fallback["speed_fallbacks"] == 5
    assert fallback["delta_s"][-1] == pytest.approx(110 / 83.3, abs=1e-3)
    # Without a table every failure is late.
    assert timing(fs, None, fixes)["failures_late"] == len(fs)


def pairs(values: list[float], ref: float = 1.0, trip: str = "t") -> Pairs:
    return {(trip, i): (v, ref) for i, v in enumerate(values)}


def test_gain_test_on_the_windows_all_variants_have() -> None:
    s = {
        LEARNED: pairs([2.0] * 5),
        NONE: pairs([1.0] * 5),
        TRUTH: pairs([3.0] * 4),  # one window fewer: left out of the test
    }
    g = gain_test(s, "hof_recovery")
    assert g["n"] == 4
    assert g["learned"] == pytest.approx(1.0)
    assert g["oracle"] == pytest.approx(2.0)
    assert g["half_oracle_excess"] == pytest.approx(0.0)
    assert g["learned_share_of_oracle"] == pytest.approx(0.5)
    assert g["half_oracle_excess_ci95"] == pytest.approx([0.0, 0.0])
    assert reached(g) == (True, True)
    # Goodput: geometric means of the ratios, here 2/1 and 0.5/1 -> 1 for the learned.
    s2 = {
        LEARNED: {("t", 0): (2.0, 1.0), ("t", 1): (0.5, 1.0)},
        NONE: {("t", 0): (1.0, 1.0), ("t", 1): (1.0, 1.0)},
        TRUTH: {("t", 0): (4.0, 1.0), ("t", 1): (1.0, 1.0)},
    }
    g2 = gain_test(s2, "goodput")
    assert g2["learned"] == pytest.approx(0.0)
    assert g2["oracle"] == pytest.approx(1.0)
    assert reached(g2)[0] is False
    # One window: a point, no interval.
    one = gain_test({v: pairs([x]) for v, x in ((LEARNED, 2.0), (NONE, 1.0), (TRUTH, 2.0))}, "x")
    assert one["half_oracle_excess"] == pytest.approx(0.5)
    assert one["half_oracle_excess_ci95"] is None
    assert reached(one) == (True, False)
    assert gain_test({}, "hof_recovery")["learned"] is None


def test_no_oracle_gain_is_never_half_reached() -> None:
    s = {LEARNED: pairs([1.0] * 3), NONE: pairs([1.0] * 3), TRUTH: pairs([1.0] * 3)}
    g = gain_test(s, "hof_recovery")
    assert g["half_oracle_excess"] == pytest.approx(0.0)
    assert reached(g) == (False, False)
    assert g["learned_share_of_oracle"] is None


def test_from_on_needs_every_later_trip() -> None:
    assert _from_on([False, True, False, True, True], [1, 2, 3, 4, 5]) == 4
    assert _from_on([True, True, False], [1, 2, 3]) is None
    assert _from_on([True, True], [1, 2]) == 1
    assert _from_on([], []) is None


def sample(trip: int, known: int, correct: int, n: int, learned: float) -> TripSample:
    hof = {
        LEARNED: pairs([learned], trip=str(trip)),
        NONE: pairs([1.0], trip=str(trip)),
        TRUTH: pairs([3.0], trip=str(trip)),
    }
    return TripSample(
        trip, n, {"learned": known, "oracle": n}, {"learned": correct, "oracle": n}, hof, {}
    )


def test_pooled_shares_and_windows() -> None:
    ss = [sample(1, 0, 0, 2, 1.0), sample(2, 1, 1, 3, 2.0), sample(3, 3, 2, 5, 3.0)]
    p = pooled(ss)
    assert (p["trip"], p["from_trip"], p["failures"]) == (3, 1, 10)
    assert p["learned_known_failure_share"] == pytest.approx(0.4)
    assert p["learned_known_failure_share_ci95"] == pytest.approx(wilson(4, 10))
    assert p["learned_correct_share"] == pytest.approx(0.3)
    assert p["oracle_correct_share"] == pytest.approx(1.0)
    assert p["hof_recovery_learned"] == pytest.approx(2.0)
    assert p["hof_recovery_learned_n"] == 3
    assert p["hof_recovery_gain"]["learned"] == pytest.approx(1.0)
    # A trip whose counts are unknown is left out of the share, not counted as 0.
    gap = sample(4, 0, 0, 4, 1.0)
    gap.known["learned"] = None
    assert pooled([*ss, gap])["learned_known_failure_share"] == pytest.approx(0.4)
    assert pooled([*ss, gap])["failures"] == 14


def test_running_curves_cumulative_and_window() -> None:
    # Learned = none on trips 1-3, 2.5 from trip 4; oracle 3, none 1: the learned gain
    # pooled over 1..k is 1.5 (k − 3) / k, half the oracle's (1) from k = 9; over the last 4
    # trips it is at least 1 from k = 6 (trips 3-6: (1 + 3 · 2.5) / 4 − 1 = 1.125).
    ss = [sample(k, 0, 0, 1, 1.0 if k <= 3 else 2.5) for k in range(1, 13)]
    curves = running(ss, window=4)
    assert [r["trip"] for r in curves["cumulative"]] == list(range(1, 13))
    assert [r["from_trip"] for r in curves["window"]] == [1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    for r in curves["cumulative"]:
        k = r["trip"]
        assert r["hof_recovery_gain"]["learned"] == pytest.approx(max(0, 1.5 * (k - 3) / k))
    half = half_oracle_gain(curves)
    assert half["hof_recovery"]["cumulative"]["point"] == 9
    assert half["hof_recovery"]["window"]["point"] == 6
    assert half["hof_recovery"]["window"]["first_point"] == 6
    # From trip 7 the window has only learned = 2.5 windows: no spread, lower bound = point.
    assert half["hof_recovery"]["window"]["lower_bound"] == 7
    low = half["hof_recovery"]["cumulative"]["lower_bound"]
    assert low is None or low >= 9
    assert half["goodput"]["cumulative"]["point"] is None  # no downloads
    last = half["hof_recovery"]["cumulative"]["at_last_trip"]
    assert last["learned_share_of_oracle"] == pytest.approx(1.5 * 9 / 12 / 2)


# ------------------------------------------------------------------ synthetic loop runs


def build_loop(
    tmp_path: Path,
    n: int,
    speed: Callable[[int], dict[str, float]],
    learned_pos: Callable[[int], float | None],
    gps_mps: float | None = 50.0,
) -> Path:
    """``n`` trips in order. Trip k: three 1 MB downloads per scheme (at 10, 20, 30 s) at
    speed(k)[scheme] (1000 ms / speed), one failed handover of carrier 0 out of cell 3 at
    20.1 s (track_m 1675, during download 2), a GPS fix at 20 s at ``gps_mps``, the oracle
    table at the failure, and from trip 2 a learned table with the cell at learned_pos(k)
    (None: a table without the cell)."""
    trips = [f"r7-t{2000 + k}" for k in range(1, n + 1)]
    b = RunBuilder(tmp_path / "run", SCHEMES, trips)
    b.meta["profile"] = "ci"
    b.meta["im"] = {"users": []}
    for k, trip in enumerate(trips, start=1):
        for scheme in SCHEMES:
            dur = 1000 / speed(k)[scheme]
            rate = 1_048_576 / dur
            rows = [
                download(
                    i, 10_000.0 * i, dur, progress=progress(10_000.0 * i, 10_000 * i + dur, rate)
                )
                for i in range(1, 4)
            ]
            b.bulk(trip, scheme, rows)
        cells = {"from_cell": 3, "to_cell": 4, "carrier": 0}
        events: list[dict[str, Any]] = []
        if gps_mps is not None:
            events.append({"event": "gps", "t_ms": 20_000, "speed_mps": gps_mps, "track_m": 1666})
        events += [
            {"event": "handover_start", "t_ms": FAIL_T_MS, "track_m": FAIL_X_M, **cells},
            {
                "event": "handover_end",
                "t_ms": FAIL_T_MS + 800,
                "outcome": "rlf",
                "duration_ms": 800,
                **cells,
            },
        ]
        b.event_rows(trip, events)
        tdir = b.trip_dir(trip).parent
        (tdir / "failure-table-truth.json").write_text(
            json.dumps(failure_table_doc([(CELL, FAIL_X_M)])), encoding="utf-8"
        )
        meta: dict[str, Any] = {"trip": k, "trip_seed": 2000 + k, "learned_table": None}
        if k >= 2:
            pos = learned_pos(k)
            entries = [(CELL, pos)] if pos is not None else [(cell_id(1, 9), 0.0)]
            meta["learned_table"] = {"version": k - 1, "entries": 1}
            (tdir / "failure-table-learned.json").write_text(
                json.dumps(failure_table_doc(entries, k - 1)), encoding="utf-8"
            )
        (tdir / "loop-trip.json").write_text(json.dumps(meta), encoding="utf-8")
    return b.finish()


def learning_speed(k: int) -> dict[str, float]:
    """Learned = none (1) on trips 1-3, 2.5 from trip 4; oracle 3; minrtt 1."""
    return {LEARNED: 1.0 if k <= 3 else 2.5, "minrtt": 1.0, NONE: 1.0, TRUTH: 3.0}


def learning_pos(k: int) -> float | None:
    """No entry for the cell on trip 2, 175 m behind it on trip 3 (Δ 3.5 s: early), 75 m
    behind it from trip 4 (Δ 1.5 s: correct)."""
    return None if k == 2 else FAIL_X_M - (175.0 if k == 3 else 75.0)


def test_per_trip_shares_and_recoveries(tmp_path: Path) -> None:
    doc = analyse_loop(read_run(build_loop(tmp_path, 5, learning_speed, learning_pos)))
    trips = doc["trips"]
    assert [t["trip"] for t in trips] == [1, 2, 3, 4, 5]
    assert [t["learned_known_failure_share"] for t in trips] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [t["learned_correct_share"] for t in trips] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert trips[0]["learned_known_failure_share_ci95"] == pytest.approx(wilson(0, 1))
    assert trips[3]["learned_correct_share_ci95"] == pytest.approx(wilson(1, 1))
    assert trips[2]["table"]["failures_early"] == 1
    assert trips[2]["table"]["delta_s"] == pytest.approx([3.5])
    assert trips[3]["table"]["speed_fallbacks"] == 0
    for t in trips:
        assert t["oracle_known_failure_share"] == 1.0
        assert t["oracle_correct_share"] == 1.0
        assert t["hof_recovery_none"] == pytest.approx(1.0)
        assert t["hof_recovery_oracle"] == pytest.approx(3.0)
        assert t["hof_recovery_none_ci95"] == t["variants"][NONE]["hof_recovery_ci95"]
        # The existing fields stay.
        assert t["hof_recovery_vs_minrtt"] == t["hof_recovery_learned"]
        assert {"table", "truth_table", "variants", "hrsch_vs_minrtt", "n"} <= set(t)
    assert trips[3]["hof_recovery_learned"] == pytest.approx(2.5)
    assert trips[3]["hof_recovery_gain"]["learned"] == pytest.approx(1.5)
    assert trips[3]["goodput_gain"]["oracle"] == pytest.approx(2.0)
    assert doc["parameters"]["lead_s"] == pytest.approx(0.44)


def test_running_curve_of_a_run_matches_the_pooled_analysis(tmp_path: Path) -> None:
    run = read_run(build_loop(tmp_path, 12, learning_speed, learning_pos))
    doc = analyse_loop(run, window=4)
    cum = doc["running"]["cumulative"]
    assert len(cum) == 12
    assert cum[-1]["failures"] == 12
    assert cum[-1]["learned_known_failure_share"] == pytest.approx(10 / 12)
    assert cum[-1]["learned_correct_share"] == pytest.approx(9 / 12)
    # Pooled over all trips, the recoveries are what the existing per-link-set code gives.
    ls = run.link_sets[0]
    whole = loop._variant_numbers(ls, run)
    for v, key in ((LEARNED, "hof_recovery_learned"), (TRUTH, "hof_recovery_oracle")):
        assert cum[-1][key] == pytest.approx(whole.variants[v]["hof_recovery_vs_minrtt"])
        assert cum[-1][f"{key}_ci95"] == pytest.approx(whole.variants[v]["hof_recovery_ci95"])
    half = doc["half_oracle_gain_trip"]
    assert half["hof_recovery"]["cumulative"]["point"] == 9
    assert half["hof_recovery"]["window"]["point"] == 6
    # Bulk goodput, geometric means: trips 3-6 give 2.5^0.75 − 1 = 0.99 < 1, so from 7.
    assert half["goodput"]["window"]["point"] == 7
    assert "definition" in half and "caveat" in half


def test_missing_raw_data_gives_unknown_not_zero(tmp_path: Path) -> None:
    run = build_loop(tmp_path, 3, learning_speed, learning_pos, gps_mps=None)
    (run / "hsr" / "r7-t2003" / "failure-table-learned.json").unlink()
    (run / "hsr" / "r7-t2002" / "trip" / "events.jsonl").unlink()
    doc = analyse_loop(read_run(run))
    first, second, third = doc["trips"]
    assert first["learned_known_failure_share"] == 0.0
    assert second["learned_known_failure_share"] is None  # no event log
    assert second["oracle_correct_share"] is None
    assert third["learned_known_failure_share"] is None  # the table used is missing
    assert third["oracle_correct_share"] == 1.0  # 83.3 m/s without GPS: Δ 0 all the same
    assert third["truth_table"]["speed_fallbacks"] == 1
    cum = doc["running"]["cumulative"]
    assert cum[-1]["learned_known_failure_share"] == 0.0  # trip 1 only
    assert cum[-1]["oracle_known_failure_share"] == 1.0


def test_cli_writes_the_learning_plots_and_sections(tmp_path: Path) -> None:
    run = build_loop(tmp_path, 14, learning_speed, learning_pos)
    out, md, plots = tmp_path / "loop.json", tmp_path / "loop.md", tmp_path / "img"
    argv = [str(run), "--out", str(out), "--md", str(md), "--plots", str(plots), "--quiet"]
    assert main([*argv, "--window", "4", "--lead-s", "0.3"]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["parameters"] == {
        "lead_s": 0.3,
        "t1_s": 0.0,
        "t2_s": 2.5,
        "nominal_speed_mps": 83.3,
        "window_trips": 4,
    }
    assert doc["half_oracle_gain_trip"]["hof_recovery"]["cumulative"]["point"] == 9
    text = md.read_text(encoding="utf-8")
    for heading in (
        "## Table quality per trip (HPR's lead 0.3 s)",
        "## Running curve: pooled over trips 1..k",
        "## Running curve: pooled over the last 4 trips up to k",
        "## Half of the oracle's gain",
    ):
        assert heading in text
    assert "| hof_recovery | cumulative | 9 |" in text
    for name in ("loop-curve.png", "loop-learning.png", "loop-gain.png"):
        assert (plots / name).stat().st_size > 0
    with pytest.raises(SystemExit):
        main([*argv, "--window", "0"])
