"""The validation on trip directories (polycorn_trainer.trips) on hand-written trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polycorn_trainer.trips import load_trip, main, table_curve, validate_trips

V = 83.3  # m/s


def write_trip(
    d: Path, seed: int, handovers: list[tuple[int, float, bool, float]], route: int = 1
) -> Path:
    """A trip directory with GPS every second and the given handovers of carrier 0:
    (cell, position m, failed, blackout s)."""
    d.mkdir(parents=True)
    info = {
        "carriers": 1,
        "route_seed": route,
        "trip_seed": seed,
        "preset": {"carriers": [{"label": "A"}, {"label": "B"}]},
    }
    (d / "trip.json").write_text(json.dumps(info))
    lines: list[dict[str, Any]] = []
    for s in range(0, 200):
        lines.append({"event": "gps", "t_ms": s * 1000, "speed_mps": V})
    for cell, x, failed, dur in handovers:
        t = int(x / V * 1000)
        lines.append(
            {
                "event": "handover_start",
                "t_ms": t,
                "carrier": 0,
                "from_cell": cell,
                "to_cell": cell + 1,
                "track_m": x,
                "rsrp_dbm": -100.0 if failed else -90.0,
            }
        )
        lines.append(
            {
                "event": "handover_end",
                "t_ms": t + int(dur * 1000),
                "carrier": 0,
                "from_cell": cell,
                "to_cell": cell + 1,
                "outcome": "rlf" if failed else "success",
                "duration_ms": int(dur * 1000),
            }
        )
    lines.sort(key=lambda e: int(e["t_ms"]))
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return d


def test_a_cell_that_fails_at_one_place_is_predicted_correctly(tmp_path: Path) -> None:
    # Cell 3 fails at 5000 m ± 10 m on every trip; cell 4 always succeeds.
    dirs = [
        write_trip(
            tmp_path / f"t{i}",
            i,
            [(3, 5000.0 + 10 * (i % 3 - 1), True, 1.5), (4, 6000.0, False, 0.05)],
        )
        for i in range(6)
    ]
    r = validate_trips(dirs, lead_s=0.44)
    a = r["c0/A"]
    assert a["cells"] == 2 and a["handovers"] == 12
    assert a["failure_share"] == 0.5
    assert a["cells_with_failure"] == 0.5
    # The ±10 m spread would make a third of them "late" (Δ < 0) against the earliest
    # of the other trips' failures; the margin (83 m over 5 failures) covers it ...
    assert a["loto"]["with_prediction"]["failure_late"] == 0.0
    # ... and with the lead (37 m at 83 m/s) every one is correct too.
    assert a["loto_with_lead"]["with_prediction"]["failure_correct"] == 1.0
    # At reconnection, 1.5 s later: still within 2.5 s.
    assert a["loto_at_reconnect"]["with_prediction"]["failure_correct"] == 1.0
    # Successes happen in a cell without failures: no prediction, correct.
    assert a["loto"]["success_correct"] == 1.0
    assert a["loto"]["failures_without_prediction"] == 0


def test_reconnect_variant_counts_long_blackouts_as_early(tmp_path: Path) -> None:
    dirs = [write_trip(tmp_path / f"t{i}", i, [(1, 3000.0, True, 4.0)]) for i in range(4)]
    a = validate_trips(dirs)["c0/A"]
    assert a["loto"]["with_prediction"]["failure_correct"] == 1.0
    assert a["loto_at_reconnect"]["with_prediction"]["failure_early"] == 1.0


def test_the_deployed_reading_predicts_only_where_the_tables_rule_holds(tmp_path: Path) -> None:
    """Cell 5 fails on trips 0 and 1 of 4: the paper's reading predicts each
    failure from the other, the table's rule (3 failures) never tables it.
    Cell 6 fails on every trip: both readings predict it, correctly."""
    dirs = [
        write_trip(tmp_path / f"t{i}", i, [(5, 2000.0, i < 2, 1.0), (6, 4000.0 + 5 * i, True, 1.0)])
        for i in range(4)
    ]
    a = validate_trips(dirs)["c0/A"]
    assert a["loto_with_lead"]["failures_without_prediction"] == 0
    assert a["deployed_with_lead"]["failures"] == 6
    assert a["deployed_with_lead"]["failures_without_prediction"] == 2
    assert a["deployed_with_lead"]["with_prediction"]["failure_correct"] == 1.0


def test_cells_of_different_routes_are_different_cells(tmp_path: Path) -> None:
    # The same cell index on two routes fails at places 2 km apart: pooled, every
    # prediction would be off by 1 km.
    dirs = [
        write_trip(tmp_path / f"r{r}t{i}", 10 * r + i, [(2, 1000.0 + 2000 * r, True, 1.0)], r)
        for r in (1, 2)
        for i in range(3)
    ]
    a = validate_trips(dirs)["c0/A"]
    assert a["cells"] == 2
    assert a["loto_with_lead"]["with_prediction"]["failure_correct"] == 1.0


def test_table_curve_precision_and_coverage(tmp_path: Path) -> None:
    # Cell 1 fails on 3 of 4 trips, cell 2 on 1 of 4, cell 3 never.
    fails = {1: {0, 1, 2}, 2: {0}, 3: set()}
    dirs = [
        write_trip(
            tmp_path / f"t{i}",
            i,
            [(c, 1000.0 * c, i in fails[c], 1.0) for c in (1, 2, 3)],
        )
        for i in range(4)
    ]
    rows = {(r["min_failures"], r["min_failure_rate"]): r for r in table_curve(dirs)["curve"]}
    # 1 failure, any share: leave one trip out, cell 1 is tabled on every trip (≥ 2 other
    # failures) and cell 2 on the three trips other than 0; 4 failures in all.
    r = rows[(1, 0.0)]
    assert r["tabled_passes"] == 4 + 3
    assert r["coverage"] == pytest.approx(3 / 4)  # cell 2's only failure had no history
    assert r["precision"] == pytest.approx(3 / 7)
    # 2 failures: only cell 1 on the trips where two others failed (trip 3: three others).
    r = rows[(2, 0.0)]
    assert r["tabled_passes"] == 4
    assert r["precision"] == pytest.approx(3 / 4)


def test_bad_events_line_is_reported_with_its_line(tmp_path: Path) -> None:
    d = write_trip(tmp_path / "t", 1, [(1, 1000.0, True, 1.0)])
    with (d / "events.jsonl").open("a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match=r"events.jsonl:\d+"):
        load_trip(d)
    assert main([str(d)]) == 1
