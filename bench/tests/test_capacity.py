"""The capacity sections: best single carrier, concurrency, budget sweep, budget check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import RunBuilder, backlog, write_jsonl, write_trace

from polycorn_bench.analysis import analyse
from polycorn_bench.capacity import carrier_schemes, jain_index
from polycorn_bench.hsr import main
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown, text_table
from polycorn_bench.stats import geomean

MIB = 1_048_576
TRIPS = ["r1-t1", "r1-t2", "r1-t3"]
SCHEMES = ["minrtt", "hrsch", "single-path-c0", "single-path-c1"]


def mbps(nbytes: float, ms: float) -> float:
    return nbytes * 8 / ms / 1000


def budget_metrics(peak: float, budget: float, used: float = 0.0) -> str:
    """A snapshot with the memory-budget gauges as the relay and proxy write them."""
    return (
        "# TYPE polycorn_mem_budget_used_bytes gauge\n"
        f"polycorn_mem_budget_used_bytes{{}} {used}\n"
        f"polycorn_mem_budget_peak_bytes{{}} {peak}\n"
        f'polycorn_mem_budget_bytes{{level="low"}} {budget / 2}\n'
        f'polycorn_mem_budget_bytes{{level="pressure"}} {budget * 3 / 4}\n'
        f'polycorn_mem_budget_bytes{{level="high"}} {budget}\n'
    )


def write_backlog(b: RunBuilder, trip: str, scheme: str, rows: list[dict[str, Any]]) -> None:
    write_jsonl(b.scheme_dir(trip, scheme) / "backlog.jsonl", rows)


def write_concurrency(
    b: RunBuilder,
    trip: str,
    scheme: str,
    users_bytes: list[int],
    *,
    hwm_kb: tuple[int, int] = (40_960, 81_920),
    relay: str | None = None,
    proxy: str | None = None,
) -> None:
    """concurrency-<N>.jsonl (one record per user over [300 s, 310 s]), its mem.json and
    metrics snapshots."""
    n = len(users_bytes)
    sdir = b.scheme_dir(trip, scheme)
    rows = [
        backlog(x, 300_000.0, 310_000.0, id=u, user=u, source=f"10.66.0.{100 + u}")
        for u, x in enumerate(users_bytes)
    ]
    write_jsonl(sdir / f"concurrency-{n}.jsonl", rows)
    mem = {
        "users": n,
        "relay": {"pid": 11, "vm_hwm_kb": hwm_kb[0], "vm_rss_kb": hwm_kb[0] - 100},
        "proxy": {"pid": 12, "vm_hwm_kb": hwm_kb[1], "vm_rss_kb": hwm_kb[1] - 100},
    }
    (sdir / f"concurrency-{n}.mem.json").write_text(json.dumps(mem), encoding="utf-8")
    logs = sdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"concurrency-{n}.relay.metrics").write_text(
        relay if relay is not None else budget_metrics(8 * MIB, 64 * MIB), encoding="utf-8"
    )
    (logs / f"concurrency-{n}.proxy.metrics").write_text(
        proxy if proxy is not None else budget_metrics(16 * MIB, 256 * MIB), encoding="utf-8"
    )


def write_sweep(
    b: RunBuilder, trip: str, mib: int, scheme: str, nbytes: int, *, peak: float | None = None
) -> None:
    sdir = b.root / b.link_set / trip / "sweep" / str(mib) / scheme
    write_jsonl(sdir / "backlog.jsonl", [backlog(nbytes, 20_000.0, 30_000.0)])
    logs = sdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    p = peak if peak is not None else mib * MIB / 2
    for name in ("relay", "proxy"):
        (logs / f"{name}.metrics").write_text(budget_metrics(p, mib * MIB), encoding="utf-8")


# ---- Jain's index ------------------------------------------------------------------------------


def test_jain_index() -> None:
    assert jain_index([5.0, 5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert jain_index([7.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    # (1 + 2 + 3)^2 / (3 * (1 + 4 + 9)) = 36 / 42
    assert jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert jain_index([3.0]) == pytest.approx(1.0)
    # Scale-free.
    assert jain_index([10.0, 20.0, 30.0]) == pytest.approx(36 / 42)
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) is None
    assert jain_index([1.0, float("nan")]) is None
    assert jain_index([1.0, -1.0]) is None


def test_carrier_schemes() -> None:
    got = carrier_schemes(["minrtt", "single-path-c1", "single-path", "single-path-c0", "x-c2"])
    assert got == ["single-path-c0", "single-path-c1"]
    assert carrier_schemes(["single-path-c10", "single-path-c2"]) == [
        "single-path-c2",
        "single-path-c10",
    ]
    assert carrier_schemes(["minrtt", "single-path"]) == []


# ---- best single carrier -----------------------------------------------------------------------


def best_run(tmp_path: Path) -> RunBuilder:
    """Backlog goodput over 100 s windows (bytes given per trip):

    r1-t1: c0 10e6, c1 20e6 (best c1, 20e6); minrtt 40e6 (2×), hrsch 30e6 (1.5×)
    r1-t2: c0 50e6, c1 25e6 (best c0, 50e6); minrtt 25e6 (0.5×), hrsch 100e6 (2×)
    r1-t3: c0 only (c1 missing): no reference; minrtt 99e6 left out."""
    b = RunBuilder(tmp_path / "run", SCHEMES, TRIPS)
    table = {
        "r1-t1": {"single-path-c0": 10e6, "single-path-c1": 20e6, "minrtt": 40e6, "hrsch": 30e6},
        "r1-t2": {"single-path-c0": 50e6, "single-path-c1": 25e6, "minrtt": 25e6, "hrsch": 100e6},
        "r1-t3": {"single-path-c0": 50e6, "minrtt": 99e6},
    }
    for trip, per in table.items():
        for scheme, nbytes in per.items():
            write_backlog(b, trip, scheme, [backlog(int(nbytes))])
    return b


def test_best_single_carrier_reference_and_ratios(tmp_path: Path) -> None:
    doc = analyse(read_run(best_run(tmp_path).finish()))
    best = doc["best_single_carrier"]
    assert (
        best is doc["link_sets"]["hsr"]["best_single_carrier"]
        or best == (doc["link_sets"]["hsr"]["best_single_carrier"])
    )
    assert best["schemes"] == ["single-path-c0", "single-path-c1"]
    ref = {r["trip"]: (r["scheme"], r["goodput_mbps"]) for r in best["reference"]}
    assert ref == {
        "r1-t1": ("single-path-c1", pytest.approx(mbps(20e6, 100_000))),
        "r1-t2": ("single-path-c0", pytest.approx(mbps(50e6, 100_000))),
    }
    by = best["by_scheme"]
    assert by["minrtt"]["n_pairs"] == 2
    assert by["minrtt"]["ratio"] == pytest.approx(geomean([2.0, 0.5]))
    assert by["hrsch"]["ratio"] == pytest.approx(geomean([1.5, 2.0]))
    assert by["hrsch"]["ratio_of_means"] == pytest.approx(130 / 70)
    lo, hi = by["hrsch"]["ci95"]
    assert 1.5 - 1e-9 <= lo <= by["hrsch"]["ratio"] <= hi <= 2.0 + 1e-9
    # The best carrier is 1.0 on its own trips, the other below.
    assert by["single-path-c0"]["ratio"] == pytest.approx(geomean([0.5, 1.0]))
    # The backlog section carries the same numbers per scheme.
    assert doc["backlog"]["hrsch"]["vs_best_single_carrier"]["ratio"] == pytest.approx(
        by["hrsch"]["ratio"]
    )
    assert "best_single_carrier" not in doc["notes"]
    md = markdown(doc)
    assert "against the best single carrier" in md
    assert "backlog / best single carrier: minrtt 1.00" in text_table(doc)


def test_best_single_carrier_needs_both_carriers(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "single-path-c0", "single-path-c1"], ["r1-t1"])
    write_backlog(b, "r1-t1", "minrtt", [backlog(10_000_000)])
    write_backlog(b, "r1-t1", "single-path-c0", [backlog(5_000_000)])
    doc = analyse(read_run(b.finish()))
    # Only one carrier scheme has a record: a reference of one carrier is not "the best".
    assert doc["best_single_carrier"] is not None
    assert doc["best_single_carrier"]["schemes"] == ["single-path-c0"]
    b2 = RunBuilder(tmp_path / "run2", ["minrtt"], ["r1-t1"])
    write_backlog(b2, "r1-t1", "minrtt", [backlog(10_000_000)])
    doc = analyse(read_run(b2.finish()))
    assert doc["best_single_carrier"] is None
    assert "single-path-c0" in doc["notes"]["best_single_carrier"]
    assert "vs_best_single_carrier" not in doc["backlog"]["minrtt"]


# ---- capacity use ------------------------------------------------------------------------------


def test_capacity_use_shares_and_ceiling(tmp_path: Path) -> None:
    """c0: 1 opportunity per ms (11.584 Mbit/s); c1: 2 per ms but dark for a quarter of the
    [100 s, 200 s] window (17.376 Mbit/s over it): ceiling (11.584 + 17.376) / 17.376."""
    schemes = ["minrtt", "single-path-c0", "single-path-c1"]
    b = RunBuilder(tmp_path / "run", schemes, ["r1-t1"])
    tdir = b.trip_dir("r1-t1")
    write_trace(tdir / "c1.down", 2, 60_000)
    (tdir / "c1.schedule").write_text("delay 0 10\nblackout 150000 175000 hold\n", encoding="utf-8")
    c0, c1, both = 11.584, 23.168 * 0.75, 11.584 + 23.168 * 0.75
    # bytes over 100 s for a goodput of x Mbit/s: x * 100e6 / 8
    shares = (("minrtt", 0.5 * both), ("single-path-c0", c0), ("single-path-c1", 0.8 * c1))
    for scheme, mbit in shares:
        write_backlog(b, "r1-t1", scheme, [backlog(round(mbit * 100e6 / 8))])
    doc = analyse(read_run(b.finish()))
    use = doc["capacity_use"]
    assert use is not None
    assert use["trips"][0]["trip"] == "r1-t1"
    assert use["trips"][0]["carriers_mbps"] == [pytest.approx(c0), pytest.approx(c1)]
    assert use["trips"][0]["ceiling"] == pytest.approx(both / c1)
    assert use["ceiling"] == pytest.approx(both / c1)
    by = use["by_scheme"]
    assert by["minrtt"]["ratio"] == pytest.approx(0.5)
    assert by["single-path-c0"]["ratio"] == pytest.approx(1.0)
    assert by["single-path-c1"]["ratio"] == pytest.approx(0.8)
    assert doc["link_sets"]["hsr"]["capacity_use"]["ceiling"] == pytest.approx(both / c1)
    md = markdown(doc)
    assert "Capacity used by the backlogged download" in md
    assert "11.58 / 17.38" in md


def test_capacity_use_without_link_files_is_null_with_an_issue(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], ["r1-t1"])
    write_backlog(b, "r1-t1", "minrtt", [backlog(10_000_000)])
    (b.trip_dir("r1-t1") / "c0.down").unlink()
    doc = analyse(read_run(b.finish()))
    assert doc["capacity_use"] is None
    # Reported once, though the bulk flows and capacity_use both wanted the link files.
    assert doc["issues"]["by_kind"]["no c0.down in trip directory (no oracle)"] == 1


# ---- concurrency -------------------------------------------------------------------------------


def test_concurrency_totals_fairness_and_memory(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], TRIPS[:2])
    # 10 s windows. r1-t1 minrtt: 1 user 10e6 B; 4 users 1,2,3,4e6 B.
    write_concurrency(b, "r1-t1", "minrtt", [10_000_000])
    write_concurrency(b, "r1-t1", "minrtt", [1_000_000, 2_000_000, 3_000_000, 4_000_000])
    # r1-t2 minrtt: 4 equal users, larger RSS.
    write_concurrency(b, "r1-t2", "minrtt", [2_500_000] * 4, hwm_kb=(51_200, 102_400))
    # hrsch: one user took everything.
    write_concurrency(b, "r1-t1", "hrsch", [8_000_000, 0, 0, 0])
    doc = analyse(read_run(b.finish()))
    conc = doc["concurrency"]
    assert conc == doc["link_sets"]["hsr"]["concurrency"]
    assert set(conc) == {"1", "4"}
    one = conc["1"]["minrtt"]
    assert one["goodput_mbps_total"] == pytest.approx(mbps(10e6, 10_000))
    assert one["jain"] == pytest.approx(1.0)
    assert one["n_users"] == 1
    assert one["n_trips"] == 1
    four = conc["4"]["minrtt"]
    assert four["n_trips"] == 2
    # Both trips moved 10e6 B in 10 s: 8 Mbit/s in all.
    assert four["goodput_mbps_total"] == pytest.approx(8.0)
    jain_t1 = (1 + 2 + 3 + 4) ** 2 / (4 * (1 + 4 + 9 + 16))
    assert four["jain"] == pytest.approx((jain_t1 + 1.0) / 2)
    # RSS: the larger of the trips, MiB.
    assert (four["relay_rss_mb"], four["proxy_rss_mb"]) == (50.0, 100.0)
    assert (four["relay_budget_peak_mb"], four["proxy_budget_peak_mb"]) == (8.0, 16.0)
    t1 = next(t for t in four["trips"] if t["trip"] == "r1-t1")
    assert t1["goodput_mbps_user_min"] == pytest.approx(mbps(1e6, 10_000))
    assert (t1["relay_rss_mb"], t1["relay_budget_mb"], t1["proxy_budget_mb"]) == (40.0, 64.0, 256.0)
    assert conc["4"]["hrsch"]["jain"] == pytest.approx(0.25)
    # The one carrier offers 1 opportunity per ms (11.584 Mbit/s): 8 Mbit/s is 0.69 of it.
    assert t1["capacity_mbps"] == pytest.approx(11.584)
    assert t1["capacity_share"] == pytest.approx(8.0 / 11.584)
    assert four["capacity_share"] == pytest.approx(8.0 / 11.584)
    # Every key of the issue's result format.
    for per in conc.values():
        for entry in per.values():
            assert {"goodput_mbps_total", "jain", "relay_rss_mb", "proxy_rss_mb"} <= set(entry)
    assert doc["budget_check"]["ok"] is True
    assert "concurrency" not in doc["notes"]
    md = markdown(doc)
    assert "### Concurrent passengers" in md
    json.dumps(doc, allow_nan=False)


def test_concurrency_without_memory_files(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], ["r1-t1"])
    write_jsonl(
        b.scheme_dir("r1-t1", "minrtt") / "concurrency-2.jsonl",
        [backlog(1000, 0.0, 1000.0, id=0, user=0), backlog(1000, 0.0, 1000.0, id=1, user=1)],
        ["{not json"],
    )
    doc = analyse(read_run(b.finish()))
    c = doc["concurrency"]["2"]["minrtt"]
    assert c["jain"] == pytest.approx(1.0)
    assert c["relay_rss_mb"] is None and c["proxy_budget_peak_mb"] is None
    assert doc["issues"]["by_kind"]["malformed JSON line"] == 1
    # No budget gauges anywhere: nothing checked, no section.
    assert doc["budget_check"] is None


def test_no_concurrency_or_sweep_gives_nulls_and_notes(builder: RunBuilder) -> None:
    doc = analyse(read_run(builder.finish()))
    for key in ("concurrency", "budget_sweep", "best_single_carrier", "budget_check"):
        assert key in doc and doc[key] is None
        assert key in doc["link_sets"]["hsr"]
    assert "concurrency" in doc["notes"] and "budget_sweep" in doc["notes"]


# ---- budget sweep ------------------------------------------------------------------------------


def test_budget_sweep_shape_and_ratios(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], TRIPS[:2])
    # 10 s windows: minrtt 8 MiB = half of 64 MiB's goodput on r1-t1, a quarter on r1-t2.
    for trip, small in (("r1-t1", 5_000_000), ("r1-t2", 2_500_000)):
        write_sweep(b, trip, 8, "minrtt", small)
        write_sweep(b, trip, 64, "minrtt", 10_000_000)
    write_sweep(b, "r1-t1", 64, "hrsch", 20_000_000)
    doc = analyse(read_run(b.finish()))
    sweep = doc["budget_sweep"]
    assert list(sweep) == ["8", "64"]
    m8 = sweep["8"]["minrtt"]
    assert m8["backlog_goodput_mbps"] == pytest.approx((4.0 + 2.0) / 2)
    assert m8["n_trips"] == 2
    assert m8["ratio_vs_largest"] == pytest.approx(geomean([0.5, 0.25]))
    assert m8["n_pairs_vs_largest"] == 2
    assert sweep["64"]["minrtt"]["ratio_vs_largest"] == pytest.approx(1.0)
    assert sweep["64"]["hrsch"]["backlog_goodput_mbps"] == pytest.approx(16.0)
    assert "hrsch" not in sweep["8"]
    assert m8["relay_budget_peak_mb"] == pytest.approx(4.0)
    # The sweep's directories are not schemes of the trip.
    assert "sweep" not in doc["schemes"]
    assert doc["budget_check"]["ok"] is True
    assert doc["budget_check"]["n_checked"] == 10
    assert "### Memory-budget sweep" in markdown(doc)


# ---- budget check ------------------------------------------------------------------------------


def test_budget_check_flags_a_peak_above_the_budget(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], ["r1-t1"])
    write_backlog(b, "r1-t1", "minrtt", [backlog(1_000_000)])
    write_backlog(b, "r1-t1", "hrsch", [backlog(1_000_000)])
    # End of trip: minrtt's proxy within its budget, hrsch's relay above it.
    b.metrics("r1-t1", "minrtt", budget_metrics(60 * MIB, 64 * MIB), budget_metrics(1, 256 * MIB))
    b.metrics("r1-t1", "hrsch", budget_metrics(65 * MIB, 64 * MIB), budget_metrics(1, 256 * MIB))
    # Concurrency window: minrtt's proxy above.
    write_concurrency(
        b, "r1-t1", "minrtt", [1000, 1000], proxy=budget_metrics(257 * MIB, 256 * MIB)
    )
    # Sweep: a budget other than configured (8 MiB asked, 64 MiB in force).
    sdir = b.root / "hsr" / "r1-t1" / "sweep" / "8" / "minrtt"
    write_jsonl(sdir / "backlog.jsonl", [backlog(1000, 0.0, 1000.0)])
    (sdir / "logs").mkdir(parents=True)
    (sdir / "logs" / "relay.metrics").write_text(budget_metrics(MIB, 64 * MIB), encoding="utf-8")
    doc = analyse(read_run(b.finish()))
    check = doc["budget_check"]
    assert check["ok"] is False
    assert check["schemes_exceeding"] == ["hrsch", "minrtt"]
    got = {(v["scheme"], v["phase"], v["endpoint"]) for v in check["exceeded"]}
    assert got == {("hrsch", "trip", "relay"), ("minrtt", "concurrency-2", "proxy")}
    v = next(v for v in check["exceeded"] if v["scheme"] == "hrsch")
    assert (v["peak_bytes"], v["budget_bytes"]) == (65 * MIB, 64 * MIB)
    assert [(m["phase"], m["configured_bytes"]) for m in check["mismatched"]] == [
        ("sweep-8", 8 * MIB)
    ]
    assert "memory budget exceeded in 2 snapshot(s)" in doc["notes"]["budget"]
    kinds = doc["issues"]["by_kind"]
    assert kinds["memory budget exceeded"] == 2
    assert kinds["memory budget not as configured"] == 1
    assert any("hrsch trip relay" in e for e in doc["issues"]["examples"])
    assert "above the budget" in markdown(doc)
    assert "memory budget: memory budget exceeded" in text_table(doc)


def test_budget_check_at_the_budget_is_fine(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], ["r1-t1"])
    b.metrics("r1-t1", "minrtt", budget_metrics(64 * MIB, 64 * MIB), "garbage line\n")
    doc = analyse(read_run(b.finish()))
    assert doc["budget_check"]["ok"] is True
    assert doc["budget_check"]["n_checked"] == 1
    assert "budget" not in doc["notes"]


# ---- the CLI writes it all ---------------------------------------------------------------------


def test_cli_writes_the_new_keys(tmp_path: Path) -> None:
    b = best_run(tmp_path)
    write_concurrency(b, "r1-t1", "minrtt", [1000] * 3)
    write_sweep(b, "r1-t1", 16, "minrtt", 1000)
    root = b.finish()
    out = tmp_path / "hsr.json"
    assert main([str(root), "--out", str(out), "--quiet", "--md", str(tmp_path / "hsr.md")]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    for key in ("best_single_carrier", "concurrency", "budget_sweep", "budget_check"):
        assert doc[key] is not None, key
    assert set(doc["concurrency"]["3"]["minrtt"]) >= {
        "goodput_mbps_total",
        "jain",
        "relay_rss_mb",
        "proxy_rss_mb",
    }
    assert set(doc["budget_sweep"]["16"]["minrtt"]) >= {"backlog_goodput_mbps"}
    for key in ("best_single_carrier", "concurrency", "budget_sweep", "budget_check"):
        assert key in doc["methods"]
