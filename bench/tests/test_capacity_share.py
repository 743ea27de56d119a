"""capacity_share: each carrier's share of its capacity used by the backlogged download, for
every scheme (the direct ones, without relay or proxy, included), with intervals over trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import RunBuilder, backlog, write_jsonl, write_trace

from polycorn_bench.analysis import analyse
from polycorn_bench.capacity import is_direct, own_carrier
from polycorn_bench.records import Issues, read_carrier_samples, read_run
from polycorn_bench.report import markdown
from polycorn_bench.stats import trip_mean_interval

TRIPS = ["r1-t1", "r1-t2", "r1-t3"]
SCHEMES = ["minrtt", "single-path-c0", "direct-c0", "direct-c0~cubic", "direct-c1"]
#: Over the records' window [100 s, 200 s): carrier 0 has 1 opportunity per ms, carrier 1 two.
WIRE = (100_000 * 1500, 200_000 * 1500)
PAYLOAD_MBPS = (11.584, 23.168)


def counters(b: RunBuilder, trip: str, scheme: str, rx: tuple[int, int], **kw: Any) -> None:
    """backlog.carriers.json: the counters at 100 s and at 200 s, ``rx`` delivered between."""
    base = (5_000, 7_000)
    samples = [
        {
            "t_ms": 100_000.0,
            "rx_bytes": list(base),
            "rx_packets": [3, 4],
            "tx_bytes": [1, 2],
            "tx_packets": [1, 1],
        },
        {
            "t_ms": 200_000.0,
            "rx_bytes": [base[0] + rx[0], base[1] + rx[1]],
            "rx_packets": [9, 9],
            "tx_bytes": [9, 9],
            "tx_packets": [2, 2],
        },
    ]
    doc = {"samples": samples, **kw}
    path = b.scheme_dir(trip, scheme) / "backlog.carriers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")


def two_carriers(b: RunBuilder, trip: str) -> None:
    tdir = b.trip_dir(trip)
    write_trace(tdir / "c1.down", 2, 60_000)
    write_trace(tdir / "c1.up", 2, 60_000)
    (tdir / "c1.schedule").write_text("delay 0 10\n", encoding="utf-8")


def goodput_bytes(share_of_all: float) -> int:
    """Body bytes over the 100 s window for that share of both carriers' payload capacity."""
    return round(share_of_all * sum(PAYLOAD_MBPS) * 100e6 / 8)


#: scheme -> per trip (carrier 0 share, carrier 1 share, goodput share of all).
SHARES = {
    "minrtt": [(0.6, 0.3, 0.35), (0.8, 0.4, 0.45), (0.7, 0.5, 0.5)],
    "single-path-c0": [(0.9, 0.001, 0.3), (0.8, 0.001, 0.28), (0.85, 0.001, 0.29)],
    "direct-c0": [(0.95, 0.0, 0.32), (0.9, 0.0, 0.3), (0.85, 0.0, 0.29)],
    "direct-c0~cubic": [(0.7, 0.0, 0.25), (0.6, 0.0, 0.2), (0.65, 0.0, 0.22)],
    "direct-c1": [(0.0, 0.5, 0.3), (0.0, 0.6, 0.37), (0.0, 0.55, 0.34)],
}


def build(tmp_path: Path, *, with_counters: bool = True) -> RunBuilder:
    b = RunBuilder(tmp_path / "run", SCHEMES, TRIPS)
    for t, trip in enumerate(TRIPS):
        two_carriers(b, trip)
        for scheme, per_trip in SHARES.items():
            s0, s1, g = per_trip[t]
            write_jsonl(b.scheme_dir(trip, scheme) / "backlog.jsonl", [backlog(goodput_bytes(g))])
            if with_counters:
                counters(b, trip, scheme, (round(s0 * WIRE[0]), round(s1 * WIRE[1])))
    return b


def test_every_scheme_has_per_carrier_total_and_goodput_shares(tmp_path: Path) -> None:
    doc = analyse(read_run(build(tmp_path).finish()))
    share = doc["capacity_share"]
    assert share is not None
    assert set(share) == set(SCHEMES)
    assert doc["link_sets"]["hsr"]["capacity_share"] == share
    for scheme, per_trip in SHARES.items():
        st = share[scheme]
        for k in (0, 1):
            c = st["carriers"][str(k)]
            want = [x[k] for x in per_trip]
            assert c["mean"] == pytest.approx(sum(want) / 3)
            assert c["n_trips"] == 3
            lo, hi = c["ci95_trips"]
            assert min(want) - 1e-9 <= lo <= c["mean"] <= hi <= max(want) + 1e-9
        totals = [(s0 * WIRE[0] + s1 * WIRE[1]) / sum(WIRE) for s0, s1, _ in per_trip]
        assert st["total"]["mean"] == pytest.approx(sum(totals) / 3, rel=1e-6)
        goodputs = [g for _, _, g in per_trip]
        assert st["goodput_share"]["mean"] == pytest.approx(sum(goodputs) / 3, rel=1e-6)
        assert st["goodput_share"]["ci95_trips"] is not None
        row = st["trips"][0]
        assert row["window_ms"] == [100_000.0, 200_000.0]
        assert row["carriers"][0]["capacity_mbps"] == pytest.approx(12.0)
        assert row["carriers"][1]["capacity_mbps"] == pytest.approx(24.0)
        assert row["carriers"][0]["delivered_mbps"] == pytest.approx(12.0 * per_trip[0][0])
    assert share["direct-c0"]["own_carrier"] == 0
    assert share["direct-c1"]["own_carrier"] == 1
    assert share["single-path-c0"]["own_carrier"] == 0
    assert share["minrtt"]["own_carrier"] is None
    # A carrier the scheme never used has share 0, not a missing value.
    assert share["direct-c0"]["carriers"]["1"]["mean"] == 0.0
    assert "capacity_share" not in doc["notes"]
    assert "capacity_share" in doc["methods"]
    md = markdown(doc)
    assert "### Share of each carrier's capacity used by the backlogged download" in md
    assert "| `direct-c0` | 3 | 0.90 [0.85, 0.95] | 0.00 [0.00, 0.00] |" in md


def test_capacity_use_counts_a_direct_scheme_against_its_own_carrier(tmp_path: Path) -> None:
    doc = analyse(read_run(build(tmp_path).finish()))
    by = doc["capacity_use"]["by_scheme"]
    # goodput share of all carriers x (all / own carrier's capacity)
    scale = sum(PAYLOAD_MBPS) / PAYLOAD_MBPS[0]
    first = SHARES["direct-c0"][0][2] * scale
    assert doc["capacity_use"]["trips"][0]["carriers_mbps"][0] == pytest.approx(11.584)
    assert by["direct-c0"]["ratio"] == pytest.approx(
        (first * SHARES["direct-c0"][1][2] * scale * SHARES["direct-c0"][2][2] * scale) ** (1 / 3)
    )
    scale1 = sum(PAYLOAD_MBPS) / PAYLOAD_MBPS[1]
    assert by["direct-c1"]["ratio"] == pytest.approx(
        (0.3 * 0.37 * 0.34) ** (1 / 3) * scale1, rel=1e-6
    )


def test_without_counters_only_the_goodput_share_with_a_note(tmp_path: Path) -> None:
    doc = analyse(read_run(build(tmp_path, with_counters=False).finish()))
    share = doc["capacity_share"]
    assert share is not None
    for scheme in SCHEMES:
        assert share[scheme]["carriers"] is None
        assert share[scheme]["total"] is None
        assert share[scheme]["goodput_share"]["n_trips"] == 3
    assert "backlog.carriers.json" in doc["notes"]["capacity_share"]
    assert "| `minrtt` | 3 | – | 0.43 [0.35, 0.50] |" in markdown(doc)


def test_without_backlog_there_is_no_section(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], ["r1-t1"])
    doc = analyse(read_run(b.finish()))
    assert doc["capacity_share"] is None


def test_direct_schemes_without_endpoint_files_are_skipped_cleanly(tmp_path: Path) -> None:
    """No relay or proxy: no metrics snapshots, no memory files, no traces. Their
    endpoint sections are null for them, and nothing counts as an input problem."""
    b = build(tmp_path)
    for trip in TRIPS:
        (b.scheme_dir(trip, "direct-c0") / "logs").mkdir(parents=True, exist_ok=True)
        write_jsonl(
            b.scheme_dir(trip, "direct-c0") / "concurrency-2.jsonl",
            [backlog(1_000_000, id=u, user=u) for u in range(2)],
        )
    doc = analyse(read_run(b.finish()))
    assert doc["extra_traffic"]["direct-c0"] is None
    # The synthetic tunnel schemes lack their snapshots; the direct ones are not asked for any.
    assert doc["issues"]["total"] == 6
    assert not any("direct" in e for e in doc["issues"]["examples"])
    conc = doc["concurrency"]["2"]["direct-c0"]
    assert conc["relay_rss_mb"] is None and conc["proxy_rss_mb"] is None
    assert conc["goodput_mbps_total"] == pytest.approx(2 * 0.08)
    # Its own carrier's capacity over the window: 11.584 Mbit/s.
    assert conc["capacity_share"] == pytest.approx(0.16 / 11.584)
    assert doc["budget_check"] is None
    markdown(doc)


def test_variants_compare_a_direct_scheme_with_its_bbr_twin(tmp_path: Path) -> None:
    doc = analyse(read_run(build(tmp_path).finish()))
    v = doc["variants"]["direct-c0~cubic"]
    assert v["base"] == "direct-c0"
    g = [x[2] for x in SHARES["direct-c0~cubic"]]
    ref = [x[2] for x in SHARES["direct-c0"]]
    want = 1.0
    for a, r in zip(g, ref, strict=True):
        want *= a / r
    assert v["backlog"]["gain"] == pytest.approx(want ** (1 / 3) - 1, rel=1e-6)


def test_carrier_samples_reader(tmp_path: Path) -> None:
    path = tmp_path / "backlog.carriers.json"
    good = {"t_ms": 5.0, "rx_bytes": [1, 2], "rx_packets": [1, 1], "tx_bytes": [0, 0]}
    good["tx_packets"] = [0, 0]
    bad_len = {**good, "t_ms": 1.0, "rx_bytes": [1]}
    negative = {**good, "rx_bytes": [-1, 2]}
    later = {**good, "t_ms": 9.0}
    path.write_text(json.dumps({"samples": [later, good, bad_len, negative, 7]}), "utf-8")
    issues = Issues()
    samples = read_carrier_samples(path, issues)
    assert [s.t_ms for s in samples] == [5.0, 9.0]
    assert samples[0].rx_bytes == (1, 2)
    assert issues.counts["bad carrier counter sample"] == 3
    path.write_text("not json", "utf-8")
    assert read_carrier_samples(path, issues) == []
    assert issues.counts["unreadable carrier counters"] == 1


def test_scheme_names() -> None:
    assert is_direct("direct-c0") and is_direct("direct-c12~cubic")
    assert not is_direct("single-path-c0") and not is_direct("direct-c0@oracle")
    assert own_carrier("single-path-c1") == 1
    assert own_carrier("single-path-c0~cubic") == 0
    assert own_carrier("single-path-c0@mean") == 0
    assert own_carrier("direct-c1~bbr") == 1
    assert own_carrier("quic-single-path-c1") == 1
    assert own_carrier("quic-single-path-c0~railway-nohints-q300") == 0
    assert own_carrier("quic-minrtt") is None and own_carrier("quic-direct-c0") is None
    assert own_carrier("single-path") is None and own_carrier("minrtt") is None


def test_trip_mean_interval() -> None:
    st = trip_mean_interval([[0.2], [0.4], [0.0, 0.6]])
    assert st["mean"] == pytest.approx(0.3)
    assert st["n_trips"] == 3 and st["n"] == 4
    lo, hi = st["ci95_trips"]
    assert 0.0 <= lo <= 0.3 <= hi <= 0.6
    assert st["ci95_trips_halfwidth"] == pytest.approx((hi - lo) / 2)
    one = trip_mean_interval([[0.5, 0.7]])
    assert one["mean"] == pytest.approx(0.6) and one["ci95_trips"] is None
    assert trip_mean_interval([])["mean"] is None
    # Same input, same interval (fixed seed).
    assert trip_mean_interval([[0.2], [0.4], [0.6]]) == trip_mean_interval([[0.2], [0.4], [0.6]])


def test_each_schemes_queueing_delay_comes_from_its_emulator(tmp_path: Path) -> None:
    """logs/emu.log's last stats lines give each carrier's downlink queueing time; the
    p95 is averaged over trips beside the shares (a scheme without the log has none)."""
    b = build(tmp_path)
    for t, trip in enumerate(TRIPS):
        logs = b.scheme_dir(trip, "minrtt") / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        lines = [
            "polycorn-emu: t=1.0s carrier 0 down: arrived 1p/1B sojourn-p50 1ms sojourn-p95 2ms",
            f"polycorn-emu: t=9.0s carrier 0 down: arrived 9p/9B delivered 9p/9B "
            f"sojourn-p50 {10 + t}ms sojourn-p95 {100 + 10 * t}ms",
            "polycorn-emu: t=9.0s carrier 0 up: arrived 9p/9B sojourn-p50 3ms sojourn-p95 4ms",
            "polycorn-emu: t=9.0s carrier 1 down: arrived 0p/0B sojourn-p50 -1ms sojourn-p95 -1ms",
        ]
        (logs / "emu.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    share = analyse(read_run(b.finish()))["capacity_share"]
    q = share["minrtt"]["queue_delay_p95_ms"]
    assert set(q) == {"0"}, "a carrier that delivered nothing has no queueing time"
    assert q["0"]["mean"] == pytest.approx(110.0)
    assert q["0"]["n_trips"] == 3
    assert share["direct-c0"]["queue_delay_p95_ms"] is None
