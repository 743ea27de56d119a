"""``make bench-fleet``'s simulated trains (``--sim``), small: 3 trains of one
``polycorn-fleetsim`` against 3 real proxies, Kafka, ingest and PostGIS, with passenger
traffic, for about 20 s, with one download broken at the origin (a flipped byte): every
telemetry record must land in LinkDB once, the simulator's passengers must catch the
broken download, and only that one, which fails the run. Numbers are not judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polycorn_benchrun import fleet
from polycorn_harness.fixtures import require_binaries

NEEDED = ("polycorn-proxy", "polycorn-fleetsim", "polycorn-pki", "polycorn-tracegen")
LINKDB_ONCE = "LinkDB holds each train's GPS fixes and handovers once, none missing"
BYTES_INTACT = "every transfer complete and byte-exact"


@pytest.fixture
def binaries() -> Path:
    return require_binaries(*NEEDED)


def run(binaries: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "fleet.json"
    rc = fleet.main(
        [
            "--sim",
            "--bin",
            str(binaries),
            "--bulk-rate",
            "16384",
            "--bulk-size",
            "16384",
            "--chat-gap-s",
            "1",
            # Proxies from 24000, their metrics from 26000, the simulator's on 28000:
            # apart from test_fleet.py's 23000 plan and below the ephemeral ports.
            "--port-base",
            "24000",
            "--out",
            str(out),
            *extra,
        ]
    )
    doc: dict[str, Any] = json.loads(out.read_text())
    assert (tmp_path / "fleet.md").read_text().startswith("# Fleet load")
    return rc, doc


def test_simulated_trains_land_every_record_once_and_catch_a_broken_download(
    binaries: Path, tmp_path: Path
) -> None:
    # Passengers for 3 + 2 + 10 + 5 = 20 s, the trains a little longer.
    rc, doc = run(
        binaries,
        tmp_path,
        "--trains",
        "3",
        "--conns",
        "20",
        "--seconds",
        "10",
        "--warmup-s",
        "2",
        "--ramp-s",
        "3",
        "--fault",
        "corrupt",
    )
    (r,) = doc["runs"]
    assert r["mode"] == "sim"
    # The broken download, and nothing else, fails the run.
    assert rc == 1 and not doc["ok"] and not r["ok"]
    assert not r["checks"][BYTES_INTACT]
    assert r["transfers"]["corrupt"] == 1
    assert [k for k, ok in r["checks"].items() if not ok] == [BYTES_INTACT], r["checks"]
    assert r["checks"][LINKDB_ONCE]
    assert r["transfers"]["bulk_done"] > 0 and r["transfers"]["chat_ok"] > 0
    tele = r["telemetry_records"]
    assert tele["produced"] == tele["in_topic"] > 0
    assert r["telemetry_in_linkdb"]["fixes"] >= 3 * 15
    g = r["load_generator"]
    assert g["totals"]["handshakes"] == 6
    # The relays' acks are counted at the last scrape, the simulator's when it has
    # stopped, and a record sent just before the stop is produced but never
    # confirmed: each count may trail the next by the records in flight then.
    assert 0 < tele["relays_acked"] <= g["totals"]["records_acked"] <= tele["produced"]
    assert g["rss_mb_p99"] > 0
