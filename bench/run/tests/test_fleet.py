"""``make bench-fleet``'s harness, small: 3 trains of 20 passenger connections for a few
seconds against the real Kafka and PostGIS (about 30 s each), and once with a seeded broken
download, which must fail the run. Numbers are not judged, only that the harness works."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from polycorn_benchrun import fleet
from polycorn_benchrun.fleet_traffic import pattern
from polycorn_harness import ROOT

BIN = Path(os.environ.get("POLYCORN_BIN", ROOT / "target/release"))
NEEDED = ("polycorn-proxy", "polycorn-relay", "polycorn-pki", "polycorn-tracegen")
KEYS = ("trains", "conns_per_train", "proxy_rss_mb_p99", "cpu_per_train_pct", "ingest_lag_p99_ms")


@pytest.fixture
def binaries() -> Path:
    missing = [b for b in NEEDED if not (BIN / b).is_file()]
    if missing:
        # make test builds them before test-py (make build); a developer's
        # tree may not have them yet.
        if os.environ.get("CI"):
            pytest.fail(f"{missing} missing in {BIN}")
        pytest.skip(f"{missing} missing in {BIN} (cargo build --release --locked)")
    return BIN


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


def test_pattern_is_keyed_and_continuous() -> None:
    a = pattern(7, 0, 3 << 20)
    assert a[1000:5000] == pattern(7, 1000, 4000)
    assert pattern(8, 0, 4096) != a[:4096]
