"""The closed loop's learning curve (``polycorn_bench.loop``) on tiny synthetic runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import RunBuilder, download, failure_table_doc, handover, progress, write_jsonl

from polycorn_bench.loop import (
    LEARNED,
    NONE,
    TRUTH,
    analyse_loop,
    cell_id,
    coverage,
    hof_rejections,
    main,
    markdown,
    read_table,
)
from polycorn_bench.records import HandoverFailure, read_run

SCHEMES = [LEARNED, "minrtt", NONE, TRUTH]
TRIPS = ["r7-t2001", "r7-t2002"]


def build(tmp_path: Path, speed: dict[str, float]) -> Path:
    """Two trips; each scheme's 1 MB downloads (at 10, 20, 30 s) take 1000 ms /
    speed[scheme] at a constant rate; trip 2 has a failed handover of carrier 0 out of cell 3
    at 20.1 s, during download 2 in every scheme, covered by the learned table."""
    b = RunBuilder(tmp_path / "run", SCHEMES, TRIPS)
    b.meta["profile"] = "ci"
    b.meta["im"] = {"users": []}
    for k, trip in enumerate(TRIPS, start=1):
        for scheme in SCHEMES:
            dur = 1000 / speed[scheme]
            rate = 1_048_576 / dur
            rows = [
                download(
                    i, 10_000.0 * i, dur, progress=progress(10_000.0 * i, 10_000 * i + dur, rate)
                )
                for i in range(1, 4)
            ]
            b.bulk(trip, scheme, rows)
        tdir = b.trip_dir(trip).parent
        events = handover(5_000, 40)
        if k == 2:
            events += handover(20_100, 800, outcome="rlf")
        b.event_rows(trip, events)
        (tdir / "failure-table-truth.json").write_text(
            json.dumps(failure_table_doc([(cell_id(0, 3), 1600.0)] if k == 2 else [])),
            encoding="utf-8",
        )
        meta: dict[str, Any] = {
            "trip": k,
            "trip_seed": 2000 + k,
            "learned_table": None,
            "handovers": {"trip_events": 2, "events_all_trips": 2 * k, "linkdb": 2 * k},
            "trainer_after": {
                "model_id": k,
                "cells": 3,
                "cells_fitted": 1,
                "handovers": 2 * k,
                "table": {"version": k, "entries": 1, "etag": "x"},
                "validation": {"failures": 0, "successes": 4, "failure_correct": None},
            },
        }
        if k == 2:
            meta["learned_table"] = {"version": 1, "entries": 1}
            (tdir / "failure-table-learned.json").write_text(
                json.dumps(failure_table_doc([(cell_id(0, 3), 1500.0)])), encoding="utf-8"
            )
        (tdir / "loop-trip.json").write_text(json.dumps(meta), encoding="utf-8")
    return b.finish()


SPEED = {LEARNED: 2.0, "minrtt": 1.0, NONE: 1.0, TRUTH: 0.5}


def test_per_trip_ratios_against_minrtt(tmp_path: Path) -> None:
    doc = analyse_loop(read_run(build(tmp_path, SPEED)))
    assert [t["trip"] for t in doc["trips"]] == [1, 2]
    for t in doc["trips"]:
        assert t["hrsch_vs_minrtt"] == pytest.approx(2.0)
        assert t["n"] == 3
        assert t["variants"][NONE]["goodput_vs_minrtt"] == pytest.approx(1.0)
        assert t["variants"][TRUTH]["goodput_vs_minrtt"] == pytest.approx(0.5)


def test_recovery_only_where_a_failure_meets_a_download(tmp_path: Path) -> None:
    doc = analyse_loop(read_run(build(tmp_path, SPEED)))
    first, second = doc["trips"]
    assert first["hof_n"] == 0
    assert first["hof_recovery_vs_minrtt"] is None
    # Download 2 is in flight in every scheme at 20.1 s, at the scheme's constant rate.
    assert second["hof_n"] == 1
    assert second["hof_recovery_vs_minrtt"] == pytest.approx(2.0)
    assert second["variants"][NONE]["hof_recovery_vs_minrtt"] == pytest.approx(1.0)
    assert second["variants"][TRUTH]["hof_recovery_vs_minrtt"] == pytest.approx(0.5)


def test_table_used_and_coverage(tmp_path: Path) -> None:
    doc = analyse_loop(read_run(build(tmp_path, SPEED)))
    first, second = doc["trips"]
    assert first["table"]["version"] is None
    assert first["table"]["entries"] == 0
    assert second["table"] == {
        "version": 1,
        "entries": 1,
        "failures": 1,
        "failures_in_table_cells": 1,
        "position_error_m_median": pytest.approx(20_100 / 12 - 1500, abs=1e-6),
        # No GPS fix in the event log: 83.3 m/s, Δ = 175 m / 83.3 m/s = 2.1 s, above the
        # window's 2.5 s − 0.44 s: early.
        "failures_correct": 0,
        "failures_early": 1,
        "failures_late": 0,
        "failures_without_position": 0,
        "speed_fallbacks": 1,
        "delta_s": [pytest.approx(175 / 83.3, abs=1e-3)],
    }
    assert second["learned_known_failure_share"] == 1.0
    assert second["learned_correct_share"] == 0.0
    assert first["learned_known_failure_share"] is None  # no failure on trip 1
    assert second["truth_table"]["failures_in_table_cells"] == 1
    assert second["handovers"] == {"trip_events": 2, "events_all_trips": 4, "linkdb": 4}
    assert second["trainer_after"]["table"] == {"version": 2, "entries": 1}
    pooled = doc["pooled_learned_trips"]
    assert pooled["trips"] == ["r7-t2002"]
    assert pooled["variants"][LEARNED]["goodput_vs_minrtt"] == pytest.approx(2.0)


def test_coverage_counts_cells_of_the_table_only() -> None:
    f = HandoverFailure(
        t_ms=1.0,
        end_ms=2.0,
        carrier=1,
        from_cell=7,
        to_cell=8,
        track_m=100.0,
        outcome="rlf",
        duration_ms=1.0,
    )
    other = HandoverFailure(1.0, 2.0, 0, 7, 8, 50.0, "nas", 1.0)
    assert coverage([f, other], None) == {
        "entries": 0,
        "failures": 2,
        "failures_in_table_cells": 0,
        "position_error_m_median": None,
    }


def test_read_table_rejects_garbage(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    assert read_table(p) is None
    p.write_text("not json", encoding="utf-8")
    assert read_table(p) is None
    p.write_text(json.dumps(failure_table_doc([(5, 10.0)], version=4)), encoding="utf-8")
    t = read_table(p)
    assert t is not None
    assert t.version == 4
    assert t.entries == {5: (10.0, 1)}


def test_cli_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    run = build(tmp_path, SPEED)
    out, md, plots = tmp_path / "loop.json", tmp_path / "loop.md", tmp_path / "img"
    assert (
        main([str(run), "--out", str(out), "--md", str(md), "--plots", str(plots), "--quiet"]) == 0
    )
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert {"trip", "hrsch_vs_minrtt", "hof_recovery_vs_minrtt"} <= set(doc["trips"][0])
    assert "| 2 | v1, 1 |" in md.read_text(encoding="utf-8")
    assert (plots / "loop-curve.png").stat().st_size > 0
    assert markdown(doc).startswith("# The closed fleet loop")


def test_cli_without_run_json(tmp_path: Path) -> None:
    assert main([str(tmp_path / "nothing"), "--quiet"]) == 2


def test_trip_without_records_has_null_ratios(tmp_path: Path) -> None:
    run = build(tmp_path, SPEED)
    write_jsonl(run / "hsr" / TRIPS[0] / LEARNED / "bulk.jsonl", [])
    doc = analyse_loop(read_run(run))
    assert doc["trips"][0]["hrsch_vs_minrtt"] is None
    assert doc["trips"][0]["n"] == 0


def test_hof_rejections_from_a_snapshot(tmp_path: Path) -> None:
    p = tmp_path / "proxy.metrics"
    assert hof_rejections(p) is None
    series = "polycorn_sched_schedulerlet_events_total"
    p.write_text(
        f"# TYPE {series.removesuffix('_total')} counter\n"
        f'{series}{{schedulerlet="hof-reject",event="rejections"}} 5.0\n'
        f'{series}{{schedulerlet="tail-reject",event="deselected"}} 70.0\n',
        encoding="utf-8",
    )
    assert hof_rejections(p) == 5


def test_the_delay_from_a_failure_to_the_table_carrying_it(tmp_path: Path) -> None:
    """Trip 2's failure (cell 3 of carrier 0, 20.1 s into the trip) enters the
    follower's version 1 6 s later and the running proxy has it 8 s after the failure."""
    root = build(tmp_path, SPEED)
    epoch = 1_800_000_000_000
    meta_file = next(p for p in root.rglob("loop-trip.json") if "t2002" in str(p))
    meta = json.loads(meta_file.read_text())
    meta.update({"epoch_unix_ms": epoch, "train": "train-loop-2"})
    meta_file.write_text(json.dumps(meta))
    (meta_file.parent / "table-timeline.jsonl").write_text(
        json.dumps({"t_unix_ms": epoch, "version": None, "entries": None})
        + "\n"
        + json.dumps({"t_unix_ms": epoch + 28_100, "version": 1, "entries": 1})
        + "\n"
    )
    (root / "tables.jsonl").write_text(
        json.dumps(
            {
                "version": 1,
                "created_unix_ms": epoch + 26_100,
                "update": "follow",
                "cells": [cell_id(0, 3)],
            }
        )
        + "\n"
    )
    doc = analyse_loop(read_run(root))
    assert doc["trips"][1]["train"] == "train-loop-2"
    d = doc["delays"]
    assert d["entries"][0]["failure_train"] == "train-loop-2"
    assert d["summary"]["to_linkdb_s"]["median"] == pytest.approx(6.0)
    assert d["summary"]["to_proxy_s"]["median"] == pytest.approx(8.0)
    assert "From a failure to the table carrying it" in markdown(doc)
    # A run that kept no table versions has no delays.
    (root / "tables.jsonl").unlink()
    assert analyse_loop(read_run(root))["delays"] is None
