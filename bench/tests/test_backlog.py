"""The backlog phase (``backlog.jsonl``): its own section and its recovery windows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunBuilder, download, handover, write_jsonl

from polycorn_bench.analysis import analyse
from polycorn_bench.hsr import main
from polycorn_bench.records import Backlog, backlog_problem, read_run
from polycorn_bench.report import markdown, text_table
from polycorn_bench.stats import geomean

MB = 1_048_576
TRIPS = ["r1-t1", "r1-t2"]
BULK_KEYS = ("bulk", "bulk_by_handovers", "goodput_mbps", "hrsch_vs_baselines", "ablation")


def mbps(nbytes: float, ms: float) -> float:
    return nbytes * 8 / ms / 1000


def backlog(
    start: float, end: float, progress: list[list[float]] | None, ident: int = 0, **kw: Any
) -> dict[str, Any]:
    """A backlog.jsonl line as ``polycorn-loadgen backlog`` writes it; ``bytes`` = the last
    progress sample."""
    rec: dict[str, Any] = {
        "kind": "backlog",
        "id": ident,
        "label": "backlog",
        "path": "/files/100MiB.bin",
        "size": 104_857_600,
        "planned_ms": start,
        "start_ms": start + 0.8,
        "end_ms": end,
        "bytes": int(progress[-1][1]) if progress else 0,
        "requests": 3,
        "completed": 2,
        "failed": 0,
        "errors": [],
        "late": False,
    }
    if progress is not None:
        rec["progress"] = progress
    rec.update(kw)
    return rec


def write_backlog(b: RunBuilder, trip: str, scheme: str, rows: list[dict[str, Any]]) -> None:
    write_jsonl(b.scheme_dir(trip, scheme) / "backlog.jsonl", rows)


def bulk_dl(ident: int, start: float, end: float, progress: list[list[float]]) -> dict[str, Any]:
    return download(ident, start, end - start, progress=progress)


def backlog_run(tmp_path: Path, with_backlog: bool = True) -> RunBuilder:
    """Bulk phase up to 60 s, backlog phase [100 s, 200 s] of trip time.

    Failures: r1-t1 at 10 s (bulk phase: hrsch 4e5 B vs minrtt 2e5 B in the 2 s) and at
    150 s (backlog: hrsch 2e6 B vs minrtt 1e6 B); r1-t2 at 120 s (backlog: 4e6 B vs 2e6 B);
    r1-t1 at 300 s (nothing in flight). Every window: hrsch = 2 x minrtt.

    Whole backlog window (100 s): r1-t1 minrtt 50e6 B, hrsch 100e6 B; r1-t2 minrtt 25e6 B,
    hrsch 100e6 B."""
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], TRIPS)
    b.event_rows(
        "r1-t1",
        [
            *handover(10000, 3000, "rlf"),
            *handover(60000, 50),  # success: not a failure
            *handover(150000, 3000, "rlf", carrier=1),
            *handover(300000, 2000, "nas"),
        ],
    )
    b.event_rows("r1-t2", [*handover(120000, 4000, "rlf", carrier=1)])
    for trip in TRIPS:
        b.bulk(
            trip,
            "minrtt",
            [
                bulk_dl(0, 9000, 13000, [[10000, 2e5], [12000, 4e5], [13000, MB]]),
                bulk_dl(1, 20000, 21000, [[21000, MB]]),
            ],
        )
        b.bulk(
            trip,
            "hrsch",
            [
                bulk_dl(0, 9000, 13000, [[10000, 2e5], [12000, 6e5], [13000, MB]]),
                bulk_dl(1, 20000, 20500, [[20500, MB]]),
            ],
        )
    if with_backlog:
        # The same id (0) as a bulk download: the two must never pair with each other.
        write_backlog(
            b,
            "r1-t1",
            "minrtt",
            [backlog(1e5, 2e5, [[1e5, 0], [1.5e5, 10e6], [1.52e5, 11e6], [2e5, 50e6]])],
        )
        write_backlog(
            b,
            "r1-t1",
            "hrsch",
            [backlog(1e5, 2e5, [[1e5, 0], [1.5e5, 20e6], [1.52e5, 22e6], [2e5, 100e6]])],
        )
        write_backlog(
            b,
            "r1-t2",
            "minrtt",
            [backlog(1e5, 2e5, [[1e5, 0], [1.2e5, 5e6], [1.22e5, 7e6], [2e5, 25e6]])],
        )
        write_backlog(
            b,
            "r1-t2",
            "hrsch",
            [backlog(1e5, 2e5, [[1e5, 0], [1.2e5, 20e6], [1.22e5, 24e6], [2e5, 100e6]])],
        )
    return b


def test_recovery_windows_from_the_backlog(tmp_path: Path) -> None:
    doc = analyse(read_run(backlog_run(tmp_path).finish()))
    hof = doc["hof_recovery"]
    assert hof["n_failures"] == 4
    h = hof["by_scheme"]["hrsch"]
    assert (h["n"], h["n_bulk"], h["n_backlog"]) == (3, 1, 2)
    assert (hof["n"], hof["n_bulk"], hof["n_backlog"]) == (3, 1, 2)
    assert h["n_unpaired"] == 0
    assert h["n_short"] == 0
    got = sorted(h["windows"], key=lambda w: (w["trip"], w["t_ms"]))
    assert [(w["trip"], w["t_ms"], w["source"]) for w in got] == [
        ("r1-t1", 10000, "bulk"),
        ("r1-t1", 150000, "backlog"),
        ("r1-t2", 120000, "backlog"),
    ]
    assert [w["label"] for w in got] == ["1MB", "backlog", "backlog"]
    assert [w["carrier"] for w in got] == [0, 1, 1]
    # Hand-made curves: 2e5 B vs 4e5 B, 1 MB vs 2 MB, 2 MB vs 4 MB, each over 2 s.
    minrtt_g = [mbps(2e5, 2000), mbps(1e6, 2000), mbps(2e6, 2000)]
    hrsch_g = [mbps(4e5, 2000), mbps(2e6, 2000), mbps(4e6, 2000)]
    assert [w["minrtt_goodput_mbps"] for w in got] == pytest.approx(minrtt_g)
    assert [w["goodput_mbps"] for w in got] == pytest.approx(hrsch_g)
    assert got[1]["goodput_mbps"] == pytest.approx(8.0)
    assert got[1]["minrtt_goodput_mbps"] == pytest.approx(4.0)
    assert hof["hrsch_vs_minrtt_mean"] == pytest.approx(2.0)
    assert hof["hrsch_vs_minrtt_median"] == pytest.approx(2.0)
    assert hof["hrsch_vs_minrtt_mean_ci95"] == pytest.approx([2.0, 2.0])
    md = markdown(doc)
    assert "| scheme | n | n bulk | n backlog |" in md
    assert "| `hrsch` | 3 | 1 | 2 |" in md
    assert "n = 3 (1 bulk, 2 backlog)" in md
    json.dumps(doc, allow_nan=False)


def test_backlog_section(tmp_path: Path) -> None:
    doc = analyse(read_run(backlog_run(tmp_path).finish()))
    bl = doc["link_sets"]["hsr"]["backlog"]
    assert doc["backlog"] == bl
    assert list(bl) == ["minrtt", "hrsch"]
    dur = 2e5 - (1e5 + 0.8)
    m, h = bl["minrtt"], bl["hrsch"]
    assert m["n_trips"] == h["n_trips"] == 2
    assert m["goodput_mbps_mean"] == pytest.approx((mbps(50e6, dur) + mbps(25e6, dur)) / 2)
    assert h["goodput_mbps_mean"] == pytest.approx(mbps(100e6, dur))
    assert m["ratio_vs_minrtt"] == 1.0
    assert h["n_pairs"] == 2
    assert h["ratio_vs_minrtt"] == pytest.approx(geomean([2.0, 4.0]))
    assert h["ratio_of_means"] == pytest.approx(8 / 3)
    lo, hi = h["ci95"]
    assert 2.0 - 1e-9 <= lo <= h["ratio_vs_minrtt"] <= hi <= 4.0 + 1e-9
    assert [r["ratio_vs_minrtt"] for r in h["records"]] == pytest.approx([2.0, 4.0])
    assert (h["requests"], h["completed"], h["failed"]) == (6, 4, 0)
    assert h["bytes"] == 200_000_000
    assert "backlog" not in doc["notes"]
    md = markdown(doc)
    assert "### Always-busy download (backlog phase)" in md
    assert "| `hrsch` | 2 | 8.00 | 2.83 [" in md
    assert "backlog (always busy): hrsch/minrtt 2.83" in text_table(doc)
    json.dumps(doc, allow_nan=False)


def test_bulk_numbers_do_not_see_the_backlog(tmp_path: Path) -> None:
    with_bl = analyse(read_run(backlog_run(tmp_path / "a").finish()))
    without = analyse(read_run(backlog_run(tmp_path / "b", with_backlog=False).finish()))
    for key in BULK_KEYS:
        assert with_bl["link_sets"]["hsr"][key] == without["link_sets"]["hsr"][key], key
    assert with_bl["sizes"] == without["sizes"] == {"256KB": 262144, "1MB": MB, "4MB": 4194304}
    assert with_bl["bulk"]["hrsch"]["overall"]["n"] == 4
    assert "backlog" not in with_bl["bulk"]["hrsch"]
    # The bulk recovery window is the same; without the backlog it is the only one.
    h_without = without["hof_recovery"]["by_scheme"]["hrsch"]
    assert (h_without["n"], h_without["n_bulk"], h_without["n_backlog"]) == (1, 1, 0)
    bulk_w = [
        w for w in with_bl["hof_recovery"]["by_scheme"]["hrsch"]["windows"] if w["source"] == "bulk"
    ]
    assert bulk_w == h_without["windows"]


def test_absent_backlog_file_means_no_section(tmp_path: Path) -> None:
    doc = analyse(read_run(backlog_run(tmp_path, with_backlog=False).finish()))
    assert doc["backlog"] is None
    assert doc["link_sets"]["hsr"]["backlog"] is None
    assert "no backlog.jsonl" in doc["notes"]["backlog"]
    assert not any("backlog" in k for k in doc["issues"]["by_kind"])
    md = markdown(doc)
    assert "Always-busy download" not in md
    assert "*backlog: no backlog.jsonl" in md
    assert "backlog (always busy)" not in text_table(doc)


def test_backlog_window_boundaries_and_no_cross_source_pairs(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], ["r1-t1"])
    # At the backlog's start_ms (in flight: start <= t), 100 ms before its end (too short),
    # at its end_ms (not in flight), and at 5 s where minrtt's bulk id 1 and hrsch's backlog
    # id 1 are both running (different sources: two unpaired, not a window).
    b.event_rows(
        "r1-t1",
        [
            *handover(5000, 1000, "rlf"),
            *handover(10000, 1000, "rlf"),
            *handover(19900, 1000, "rlf"),
            *handover(20000, 1000, "rlf"),
        ],
    )
    b.bulk("r1-t1", "minrtt", [bulk_dl(1, 4000, 8000, [[8000, MB]])])
    curve: list[list[float]] = [[10000, 0], [20000, 10e6]]
    write_backlog(b, "r1-t1", "minrtt", [backlog(10000, 20000, curve, start_ms=10000)])
    write_backlog(
        b,
        "r1-t1",
        "hrsch",
        [
            backlog(10000, 20000, curve, start_ms=10000),
            backlog(4000, 6000, [[4000, 0], [6000, 1e6]], ident=1),  # no minrtt partner
            backlog(3e4, 4e4, [[3e4, 0], [4e4, 1e6]], ident=1),  # duplicate id: dropped
        ],
    )
    run = read_run(b.finish())
    assert len(run.link_sets[0].trips[0].schemes["hrsch"].backlog) == 3  # every line a record
    doc = analyse(run)
    h = doc["hof_recovery"]["by_scheme"]["hrsch"]
    assert (h["n"], h["n_backlog"], h["n_bulk"]) == (1, 1, 0)
    assert h["windows"][0]["t_ms"] == 10000
    assert h["windows"][0]["goodput_mbps"] == pytest.approx(mbps(2e6, 2000))
    assert h["ratio_of_means"] == pytest.approx(1.0)
    assert h["n_short"] == 1  # at 19900
    assert h["n_unpaired"] == 2  # at 5000: minrtt's bulk 1, hrsch's backlog 1
    assert doc["issues"]["by_kind"]["duplicate backlog id (kept the first)"] == 1
    # hrsch's second backlog record has no minrtt partner.
    assert doc["backlog"]["hrsch"]["n"] == 2
    assert doc["backlog"]["hrsch"]["n_pairs"] == 1


def test_malformed_backlog_lines_are_reported_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = backlog_run(tmp_path)
    path = b.scheme_dir("r1-t2", "hrsch") / "backlog.jsonl"
    good = backlog(1e5, 2e5, [[1e5, 0], [1.2e5, 20e6], [1.22e5, 24e6], [2e5, 100e6]])
    no_end = {k: v for k, v in good.items() if k != "end_ms"}
    path.write_text(
        json.dumps(good) + "\n" + json.dumps(no_end) + "\n" + '{"kind": "backlog", "id": 1,\n',
        encoding="utf-8",
    )
    out = tmp_path / "hsr.json"
    assert main([str(b.finish()), "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"bad backlog record: {path}:2: end_ms missing or not a number" in err
    assert f"malformed JSON line: {path}:3:" in err
    doc = json.loads(out.read_text())
    kinds = doc["issues"]["by_kind"]
    assert (kinds["bad backlog record"], kinds["malformed JSON line"]) == (1, 1)
    # The good line is still used.
    assert doc["backlog"]["hrsch"]["n_trips"] == 2
    assert doc["hof_recovery"]["n_backlog"] == 2


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"kind": "bulk"}, "kind 'bulk' is not 'backlog'"),
        ({"id": True}, "id missing"),
        ({"id": "0"}, "id missing"),
        ({"label": None}, "label missing"),
        ({"start_ms": "x"}, "start_ms missing"),
        ({"end_ms": 100.0}, "end_ms 100 not after start_ms 100.8"),
        ({"bytes": -1}, "bytes missing"),
        ({"bytes": 1.5}, "bytes missing"),
        ({"size": 0}, "size not a positive integer"),
        ({"requests": -2}, "requests not a non-negative integer"),
        ({"errors": "boom"}, "errors not a list"),
        ({"late": "no"}, "late not a boolean"),
    ],
)
def test_backlog_record_validation(change: dict[str, Any], problem: str) -> None:
    d = backlog(100, 2000, [[100.8, 0], [2000, 5000]]) | change
    p = backlog_problem(d)
    assert p is not None and p.startswith(problem)
    assert Backlog.from_json(d) is None


def test_backlog_record_parsing() -> None:
    d = backlog(100, 2100, [[100.8, 0], [2100, 5000]], errors=["reset"], late=True)
    rec = Backlog.from_json(d)
    assert rec is not None
    assert (rec.id, rec.label, rec.start_ms, rec.end_ms, rec.bytes) == (
        0,
        "backlog",
        100.8,
        2100,
        5000,
    )
    assert (rec.requests, rec.completed, rec.failed, rec.errors, rec.late) == (
        3,
        2,
        0,
        ("reset",),
        True,
    )
    assert rec.progress == ((100.8, 0.0), (2100.0, 5000.0))
    assert rec.goodput_mbps == pytest.approx(mbps(5000, 2100 - 100.8))
    # Optional fields may be absent; a bad progress is dropped, the record kept.
    minimal = {"id": 2, "label": "backlog", "start_ms": 0, "end_ms": 10, "bytes": 0}
    rec = Backlog.from_json({**minimal, "progress": [[5, 1], [4, 2]]})
    assert rec is not None
    assert rec.progress is None and rec.progress_bad
    assert rec.requests is None and rec.size is None
    assert np.isclose(rec.goodput_mbps, 0.0)
