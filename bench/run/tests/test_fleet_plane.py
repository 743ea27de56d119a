"""``make bench-fleet-plane``'s harness, small: 20 simulated trains of one
``polycorn-fleetsim --direct-kafka`` against the real Kafka, ingest and PostGIS for a
10 s window with 3 signed tables published in it, and two faults seeded in the
simulator: the first train's third GPS fix is lost on its way to Kafka (yet counted
as confirmed), and the first table consumer never takes the second table. The run
must fail on exactly the checks those faults break, every other record must land in
LinkDB once, and every table's propagation must be measured for every consumer that
took it. Numbers are not judged.

The pure parts (the propagation statistics, the bootstrap of the per-train slope) are
tested without binaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polycorn_benchrun import fleet_plane
from polycorn_harness.fixtures import require_binaries

NEEDED = ("polycorn-fleetsim", "polycorn-pki", "polycorn-tracegen")
TRAINS = 20
LINKDB_ONCE = "LinkDB holds each train's GPS fixes and handovers once, none missing"
COMMITTED = "ingest committed every record Kafka confirmed"
IN_TOPIC = "the topic holds exactly the records Kafka confirmed"
TABLES_SEEN = "every table consumer put every published table in use"


@pytest.fixture
def binaries() -> Path:
    return require_binaries(*NEEDED)


def test_a_lost_record_and_a_deaf_table_consumer_fail_the_run_and_nothing_else(
    binaries: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fleet-plane.json"
    rc = fleet_plane.main(
        [
            "--bin",
            str(binaries),
            "--trains",
            str(TRAINS),
            "--seconds",
            "10",
            "--warmup-s",
            "2",
            "--idle-s",
            "0",
            # One client per train, as the proxies have.
            "--trains-per-client",
            "1",
            "--table-entries",
            "50",
            # The simulator's metrics: apart from the fleet benchmarks' port plans and the
            # infra's ports, below the ephemeral range.
            "--port-base",
            "29480",
            "--fault",
            "drop-record",
            "--fault",
            "deaf-consumer",
            "--out",
            str(out),
        ]
    )
    doc: dict[str, Any] = json.loads(out.read_text())
    assert (tmp_path / "fleet-plane.md").read_text().startswith("# The fleet's shared plane")
    assert doc["did_not_run"] == []
    (r,) = doc["runs"]
    assert rc == 1 and not doc["ok"] and not r["ok"] and not r["held"]
    assert doc["largest_held"] is None
    failed = {k for k, ok in r["checks"].items() if not ok}
    # The lost fix: the topic and LinkDB lack it, ingest could not commit it.
    assert failed == {LINKDB_ONCE, COMMITTED, IN_TOPIC, TABLES_SEEN}, r["checks"]
    bad = r["telemetry_in_linkdb"]["trains_with_problems"]
    assert bad == {"train-fl0000": ["missing: 1 fixes, 0 handovers"]}, bad
    tele = r["telemetry_records"]
    assert tele["in_topic"] == tele["committed_by_ingest"] == tele["confirmed"] - 1 > 0
    assert r["telemetry_in_linkdb"]["fixes"] >= TRAINS * 5
    # Every table published, its delay measured for every consumer but the deaf one.
    prop = r["table_propagation"]
    assert [t["version"] for t in prop["tables"]] == [1, 2, 3]
    for t in prop["tables"]:
        missing = [0] if t["version"] == 2 else []
        assert t["consumers_missing"] == missing, t
        assert t["consumers_seen"] == TRAINS - len(missing)
        assert t["delay_ms_p50"] is not None and t["delay_ms_max"] >= t["delay_ms_p50"]
    assert r["kafka_clients"] == {
        "producers": TRAINS,
        "table_consumers": TRAINS,
        "trains_per_client": 1,
    }
    assert r["kafka_records_per_s"] > 0 and r["ingest_lag_records"] > 0
    assert all(r["cpu_pct"][g] >= 0 for g in ("kafka", "ingest", "postgres", "fleetsim"))


def test_propagation_is_per_table_and_names_the_consumers_that_missed_one() -> None:
    published = [
        {"version": 1, "published_unix_ms": 1000, "acked_unix_ms": 1010},
        {"version": 2, "published_unix_ms": 2000, "acked_unix_ms": 2010},
    ]
    consumers = [
        {"index": 0, "seen": [{"version": 1, "unix_ms": 1020}, {"version": 2, "unix_ms": 2030}]},
        {"index": 1, "seen": [{"version": 1, "unix_ms": 1050}]},
    ]
    p = fleet_plane.propagation(published, consumers)
    assert not p["every_consumer_saw_every_table"]
    t1, t2 = p["tables"]
    assert (t1["delay_ms_p50"], t1["delay_ms_max"], t1["missing"]) == (20.0, 50.0, 0)
    assert (t2["consumers_missing"], t2["consumers_seen"]) == ([1], 1)
    assert p["delay_ms_max"] == 50.0 and p["delay_after_ack_ms_max"] == 40.0
    assert fleet_plane.propagation(published, consumers[:1])["every_consumer_saw_every_table"]


def test_the_per_train_slope_and_its_interval_come_from_the_repeats() -> None:
    runs = [
        {
            "trains": n,
            "shared_cpu_pct": 5.0 + 0.01 * n + e,
            "cpu_pct": {"kafka": 1.0 + 0.005 * n, "ingest": 2.0, "postgres": 1.0 + e},
        }
        for n in (100, 200, 400)
        for e in (-0.5, 0.5)
    ]
    f = fleet_plane.per_train_fit(runs)
    lo, hi = f["shared"]["ci95"]
    assert f["shared"]["cpu_pct_per_train"] == pytest.approx(0.01)
    assert lo <= 0.01 <= hi and lo < hi
    assert f["kafka"]["cpu_pct_per_train"] == pytest.approx(0.005)
    # Deterministic (seeded), and no interval from a single repeat.
    assert fleet_plane.per_train_fit(runs) == f
    assert fleet_plane.per_train_fit(runs[::2])["shared"]["ci95"] is None
