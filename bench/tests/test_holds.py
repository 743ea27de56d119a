"""The offline replay of hof-reject's holds (polycorn_bench.holds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polycorn_bench import holds
from polycorn_bench.holds import Table, read_trip, replay, summarise
from polycorn_bench.loop import cell_id
from polycorn_bench.records import Issues

SPEED = 100.0  # m/s: 1 m per 10 ms step


def _trip(
    handovers: list[tuple[int, int, int, float, float, str]],
    end_ms: float = 60_000,
    speed: float = SPEED,
    start_m: float = 0.0,
    sign: float = 1.0,
) -> Any:
    """A trip at ``speed`` m/s from ``start_m`` (track_m growing with ``sign`` 1, falling with
    -1; fixes every second) on carriers 0 and 1 (cell 1 at first), with handovers (carrier,
    from, to, start_ms, end_ms, outcome)."""
    ev: list[dict[str, Any]] = [
        {
            "event": "gps",
            "t_ms": t,
            "track_m": start_m + sign * speed * t / 1000,
            "speed_mps": speed,
        }
        for t in range(0, int(end_ms) + 1, 1000)
    ]
    ev += [{"event": "cell_change", "t_ms": 0, "carrier": c, "cell": 1} for c in (0, 1)]
    for c, a, b, start, end, outcome in handovers:
        ev.append({"event": "handover_start", "t_ms": start, "carrier": c, "from_cell": a})
        ev.append(
            {"event": "handover_end", "t_ms": end, "carrier": c, "from_cell": a, "outcome": outcome}
        )
        ev.append({"event": "cell_change", "t_ms": end, "carrier": c, "cell": b})
    ev.sort(key=lambda e: e["t_ms"])
    return read_trip("t", ev)


def _table(*entries: tuple[int, int, float]) -> Table:
    out: dict[tuple[int, str], list[float]] = {}
    for carrier, cell, pos in entries:
        out.setdefault((cell_id(carrier, cell), "increasing"), []).append(pos)
    return Table(out)


def test_a_hold_begins_at_the_lead_and_ends_with_the_new_cell() -> None:
    # Failure location 1000 m (t = 10 s); RTT 100 ms, E 20 m: hold from d < 10 + 20 = 30 m,
    # i.e. t = 9.71 s (the first 10 ms step past 970 m); the failed handover starts at 10 s and
    # ends (new cell) at 13 s.
    trip = _trip([(0, 1, 2, 10_000, 13_000, "rlf")])
    [h] = replay(trip, _table((0, 1, 1000.0)), gps_error_m=20, rtt_ms=100)
    assert h.carrier == 0 and h.cell == 1
    assert h.start_ms == pytest.approx(9_710, abs=10)
    assert h.end_ms == 13_000 and not h.expired
    assert h.before_failure and h.in_time
    s = summarise([trip], [[h]])
    assert s["failed_handovers_protected_in_time"] == 1 and s["failed_handovers"] == 1
    assert s["hold_s_per_trip_before_failure"] == pytest.approx(3.29, abs=0.02)


def test_a_late_hold_and_a_larger_error_that_makes_it_in_time() -> None:
    # The handover starts at 9.5 s, 50 m before the table's location: E 20 m holds too late,
    # E 100 m (from 8.9 s) in time.
    trip = _trip([(0, 1, 2, 9_500, 12_000, "nas")])
    table = _table((0, 1, 1000.0))
    [late] = replay(trip, table, gps_error_m=20)
    [early] = replay(trip, table, gps_error_m=100)
    assert late.before_failure and not late.in_time
    assert early.in_time and early.start_ms == pytest.approx(8_900, abs=10)
    assert summarise([trip], [[late]])["failed_handovers_protected_in_time"] == 0


def test_a_false_alarm_is_held_until_the_successful_handover() -> None:
    trip = _trip([(1, 1, 2, 12_000, 12_050, "success")])
    [h] = replay(trip, _table((1, 1, 1000.0)))
    assert not h.before_failure and h.handover is not None
    s = summarise([trip], [[h]])
    assert s["holds_before_success"] == 1
    assert s["hold_s_per_trip_before_success"] == pytest.approx((12_050 - h.start_ms) / 1000)


def test_max_hold_releases_and_the_cell_is_left_alone() -> None:
    # No handover at all: held 10 s, then the cell is not rejected again although the
    # location (passed by 376 m at 40 m/s) is still within the passed horizon.
    trip = _trip([], end_ms=60_000, speed=40.0)
    hs = replay(trip, _table((0, 1, 1000.0)))
    assert len(hs) == 1 and hs[0].expired and hs[0].handover is None
    assert hs[0].end_ms - hs[0].start_ms == pytest.approx(10_000, abs=10)


def test_other_cells_and_carriers_are_not_held() -> None:
    trip = _trip([(0, 1, 2, 10_000, 13_000, "rlf")])
    assert replay(trip, _table((1, 5, 1000.0), (0, 7, 1000.0))) == []


def test_decreasing_entries_act_on_a_decreasing_trip_only() -> None:
    trip = _trip([(0, 1, 2, 10_000, 13_000, "rlf")])
    t = Table({(cell_id(0, 1), "decreasing"): [1000.0]})
    assert replay(trip, t) == []
    # From 2000 m downwards: the location 1000 m is 1000 m ahead, reached at 10 s.
    down = _trip([(0, 1, 2, 10_000, 13_000, "rlf")], start_m=2000.0, sign=-1.0)
    [h] = replay(down, t)
    assert h.start_ms == pytest.approx(9_710, abs=10) and h.in_time


def test_analyse_reads_a_run(tmp_path: Path) -> None:
    trip = tmp_path / "hsr" / "r7-t1001" / "trip"
    trip.mkdir(parents=True)
    ev: list[dict[str, Any]] = [
        {"event": "gps", "t_ms": t, "track_m": SPEED * t / 1000, "speed_mps": SPEED}
        for t in range(0, 20_001, 1000)
    ]
    ev += [
        {"event": "cell_change", "t_ms": 0, "carrier": 0, "cell": 1},
        {"event": "handover_start", "t_ms": 10_000, "carrier": 0, "from_cell": 1},
        {"event": "handover_end", "t_ms": 13_000, "carrier": 0, "from_cell": 1, "outcome": "rlf"},
        {"event": "cell_change", "t_ms": 13_000, "carrier": 0, "cell": 2},
    ]
    ev.sort(key=lambda e: e["t_ms"])
    (trip / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev) + "garbage\n")
    entry = {"cell": cell_id(0, 1), "position_m": 1000.0, "direction": "increasing"}
    (tmp_path / "failure-table.json").write_text(json.dumps({"entries": [entry, "bad"]}))
    doc = holds.analyse(tmp_path, [20.0])
    assert doc["trips"] == ["r7-t1001"]
    assert doc["by_gps_error_m"]["20"]["failed_handovers_protected_in_time"] == 1
    # --oracle without truth tables: no trip.
    assert holds.analyse(tmp_path, [20.0], oracle=True)["trips"] == []
    assert holds.main([str(tmp_path), "--gps-error-m", "20"]) == 0
    assert holds.main([str(tmp_path), "--oracle"]) == 1
    # --training: the table's own trips, RUN/table-trips/<trip>/events.jsonl.
    assert holds.analyse(tmp_path, [20.0], training=True)["trips"] == []
    (tmp_path / "table-trips" / "r7-t901").mkdir(parents=True)
    (trip / "events.jsonl").rename(tmp_path / "table-trips" / "r7-t901" / "events.jsonl")
    doc = holds.analyse(tmp_path, [20.0], training=True)
    assert doc["trips"] == ["r7-t901"] and doc["trips_from"].startswith("table-trips")
    assert holds.analyse(tmp_path, [20.0])["trips"] == []
    views = holds.analyse_all(tmp_path, [20.0], 100.0)
    assert list(views) == ["training"], "no measured trip left, no broad or oracle table"
    out = tmp_path / "holds.json"
    assert holds.main([str(tmp_path), "--all", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    # The run's provenance first (its run.json recorded none: not clean), then the views.
    assert list(written)[:2] == ["commit", "clean"] and list(written)[-1] == "training"
    assert written["commit"] is None and written["clean"] is False


def test_relocate_moves_entries_to_a_quantile_of_their_training_failures(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ev = [
        {
            "event": "handover_end",
            "t_ms": 1,
            "carrier": 0,
            "from_cell": 1,
            "outcome": o,
            "track_m": x,
        }
        for o, x in (("rlf", 900.0), ("nas", 1000.0), ("rlf", 1100.0), ("success", 500.0))
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in ev))
    t = Table(
        {
            (cell_id(0, 1), "increasing"): [1000.0],
            (cell_id(0, 1), "decreasing"): [1000.0],
            (cell_id(1, 7), "increasing"): [3000.0],
        }
    )
    r = holds.relocate(t, [log], 0.0, Issues())
    assert r.entries[(cell_id(0, 1), "increasing")] == [900.0], "earliest along travel"
    assert r.entries[(cell_id(0, 1), "decreasing")] == [1100.0], "earliest going down"
    assert r.entries[(cell_id(1, 7), "increasing")] == [3000.0], "no failures: unchanged"
    assert holds.relocate(t, [log], 0.5, Issues()).entries[(cell_id(0, 1), "increasing")] == [
        pytest.approx(1000.0)
    ]
