"""``make bench-fleet``'s harness, small: 3 trains of 20 passenger connections for a few
seconds against the real Kafka and PostGIS (about 30 s each), and once with a seeded broken
download, which must fail the run. Numbers are not judged, only that the harness works."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polycorn_benchrun import fleet
from polycorn_benchrun.fleet_traffic import pattern
from polycorn_harness.fixtures import require_binaries
from polycorn_schema.startup import pg_connect
from polycorn_schema.testing import fresh_database

NEEDED = ("polycorn-proxy", "polycorn-relay", "polycorn-pki", "polycorn-tracegen")
KEYS = ("trains", "conns_per_train", "proxy_rss_mb_p99", "cpu_per_train_pct", "ingest_lag_p99_ms")


@pytest.fixture
def binaries() -> Path:
    return require_binaries(*NEEDED)


def run(binaries: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "fleet.json"
    rc = fleet.main(
        [
            "--bin",
            str(binaries),
            "--seconds",
            "3",
            "--warmup-s",
            "1",
            "--ramp-s",
            "2",
            "--bulk-rate",
            "16384",
            "--bulk-size",
            "16384",
            "--chat-gap-s",
            "1",
            "--port-base",
            "23000",
            "--out",
            str(out),
            *extra,
        ]
    )
    doc: dict[str, Any] = json.loads(out.read_text())
    assert (tmp_path / "fleet.md").read_text().startswith("# Fleet load")
    assert list(doc)[:2] == ["commit", "clean"]
    return rc, doc


def test_smoke(binaries: Path, tmp_path: Path) -> None:
    rc, doc = run(binaries, tmp_path, "--trains", "3", "--conns", "20")
    for k in KEYS:
        assert k in doc, k
    assert (doc["trains"], doc["conns_per_train"]) == (3, 20)
    (r,) = doc["runs"]
    assert r["ok"], r["checks"]
    assert rc == 0
    assert r["transfers"]["bulk_done"] > 0 and r["transfers"]["chat_ok"] > 0
    assert r["telemetry_records"]["produced"] > 0
    assert r["telemetry_in_linkdb"]["fixes"] > 0
    assert doc["sizing"]["nodes"]


def test_a_corrupted_download_fails_the_run(binaries: Path, tmp_path: Path) -> None:
    rc, doc = run(binaries, tmp_path, "--trains", "1", "--conns", "4", "--fault", "corrupt")
    (r,) = doc["runs"]
    assert rc == 1 and not doc["ok"]
    assert not r["checks"]["every transfer complete and byte-exact"]
    assert r["transfers"]["corrupt"] == 1
    # Everything else held.
    assert r["checks"]["LinkDB holds each train's GPS fixes and handovers once, none missing"]


def test_check_train_telemetry_counts_gaps_and_extras() -> None:
    fixes = list(range(0, 60_000, 1000))
    hos = [("carrier-0", 9_900, 10_000), ("carrier-1", 29_000, 30_000)]
    epoch = 1_000_000
    got = [epoch + t for t in fixes[5:50]]
    ok = fleet.check_train_telemetry(
        fixes,
        hos,
        epoch,
        got,
        [("carrier-0", epoch + 9_900), ("carrier-1", epoch + 29_000)],
        epoch + 5_000,
        epoch + 49_500,
    )
    assert ok["ok"], ok
    gap = [t for t in got if t != epoch + 20_000]
    r = fleet.check_train_telemetry(
        fixes, hos, epoch, gap, [("carrier-0", epoch + 9_900)], epoch + 5_000, epoch + 49_500
    )
    assert not r["ok"]
    assert r["problems"] == ["missing: 1 fixes, 1 handovers"]
    dup = [*got, got[3], epoch + 1234]
    r = fleet.check_train_telemetry(fixes, hos, epoch, dup, [], epoch + 5_000, epoch + 49_500)
    assert not r["ok"]


def test_a_spool_keeps_up_when_nothing_waits_and_nothing_lost_its_confirmation() -> None:
    def m(held: float, in_flight: float, oldest: float) -> dict[str, float]:
        return {
            "polycorn_telemetry_spool_records": held,
            "polycorn_telemetry_spool_in_flight": in_flight,
            "polycorn_telemetry_spool_oldest_in_flight_seconds": oldest,
        }

    assert fleet.spool_keeps_up(m(0, 0, 0))
    assert fleet.spool_keeps_up(m(3, 3, 0.02)), "records in their first round trip"
    assert not fleet.spool_keeps_up(m(3, 3, 6.0)), "one has lost its confirmation"
    assert not fleet.spool_keeps_up(m(5, 3, 0.02)), "two wait for the sender"
    assert not fleet.spool_keeps_up({}), "no metrics: nothing is known"


def test_pattern_is_keyed_and_continuous() -> None:
    a = pattern(7, 0, 3 << 20)
    assert a[1000:5000] == pattern(7, 1000, 4000)
    assert pattern(8, 0, 4096) != a[:4096]


def _run(n: int, rep: int, cloud: float, *, saturated: bool = False) -> dict[str, Any]:
    return {
        "trains": n,
        "repeat": rep,
        "saturated": saturated,
        "ok": True,
        "cpu_pct": {"proxy": cloud * 0.8},
        "cloud_cpu_pct": cloud,
        "proxy_rss_mb_sum": 17.0 * n,
        "proxy_rss_mb_p99": 17.5,
        "cpu_per_train_pct": cloud * 0.8 / n,
        "ingest_lag_p99_ms": 700.0 + rep,
        "kafka_records_per_s": 5.4 * n,
        "kafka_bytes_per_s": 410.0 * n,
    }


def test_schedule_interleaves_sizes_and_alternates_their_order() -> None:
    assert fleet.schedule([10, 25, 50], 3) == [
        (0, 10), (0, 25), (0, 50), (1, 50), (1, 25), (1, 10), (2, 10), (2, 25), (2, 50),
    ]  # fmt: skip


def test_sizing_interval_from_repeats_covers_the_slope_and_widens_with_noise() -> None:
    # Cloud CPU 10 % + 4 % per train, each repeat off by a little.
    runs = [
        _run(n, rep, 10 + 4 * n + noise)
        for rep, noise in enumerate((-3.0, 0.0, 3.0))
        for n in (10, 25, 50, 100)
    ]
    s = fleet.sizing(runs)
    lo, hi = s["cloud_cpu_pct_per_train_ci95"]
    assert lo < 4.0 < hi and lo <= s["cloud_cpu_pct_per_train"] <= hi
    node = s["nodes"][0]
    assert node["trains_by_cpu_ci95"][0] <= node["trains_by_cpu"] <= node["trains_by_cpu_ci95"][1]
    noisier = [
        _run(n, rep, 10 + 4 * n + 4 * noise)
        for rep, noise in enumerate((-3.0, 0.0, 3.0))
        for n in (10, 25, 50, 100)
    ]
    lo2, hi2 = fleet.sizing(noisier)["cloud_cpu_pct_per_train_ci95"]
    assert hi2 - lo2 > hi - lo
    # One run per size: no interval is claimed.
    assert (
        fleet.sizing([r for r in runs if r["repeat"] == 0])["cloud_cpu_pct_per_train_ci95"] is None
    )


def test_a_size_saturated_in_one_repeat_is_not_carried_nor_fitted() -> None:
    runs = [_run(n, rep, 10 + 4 * n) for rep in (0, 1) for n in (10, 25, 50)]
    runs[-1]["saturated"] = True  # 50 trains, second repeat
    assert fleet.carried_sizes(runs) == {10, 25}
    assert fleet.sizing(runs)["fitted_sizes"] == [10, 25]
    h = fleet.headline(runs, fleet.carried_sizes(runs))
    assert (h["trains"], h["headline_runs"], h["ingest_lag_p99_ms"]) == (25, 2, 700.5)


def test_postgres_cpu_leaves_out_backends_of_other_databases() -> None:
    # The instance is shared: a backend serving another database is not the node's cost.
    with (
        fresh_database(prefix="fleet_ours") as ours,
        fresh_database(prefix="fleet_other") as other,
        pg_connect(other) as c,
    ):
        row = c.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        assert row[0] in fleet.infra_pids()["postgres"]
        assert row[0] not in fleet.infra_pids(ours)["postgres"]
