"""The HSR testbed: the topology runner on emulated links replaying a
generated trip, its teardown after a crash, and placing a train by GPS alone
(``make bench-hsr`` end to end is in test_bench_hsr.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from polycorn_harness import DEEP, ROOT
from polycorn_harness.fixtures import MakeTrip, Topologies
from polycorn_harness.metrics import value
from polycorn_harness.topology import ORIGIN, Topology, leftovers, run
from polycorn_harness.wait import wait_until

P = "pcith"
#: The GPS test's trip: route 7, trip 1001 has failed handovers at 24, 121 and
#: 124 s (and 309 s: ``make test-deep`` runs the longer trip, of which the
#: shorter is the first 200 s).
GPS_TRIP_S = 420 if DEEP else 200


def test_a_download_crosses_relay_emulated_links_and_proxy_intact(
    topologies: Topologies, make_trip: MakeTrip
) -> None:
    t = topologies(P, make_trip(1, 3, 120)).up("minrtt")
    got = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            t.ns("pax"),
            "curl",
            "-fsS",
            "--max-time",
            "60",
            f"http://{ORIGIN}/files/bench-256KB.bin",
        ],
        capture_output=True,
        check=True,
        timeout=90,
    ).stdout
    want = (t.state / "origin/www/files/bench-256KB.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest()
    # The carriers really are the emulator's TUN devices.
    assert "tun" in t.exec("train", ["ip", "-d", "link", "show", "car0"]).stdout


def test_down_after_a_sigkill_of_its_caller_leaves_nothing(
    bin_dir: Path, make_trip: MakeTrip
) -> None:
    # The caller of `up` dies without any cleanup (SIGKILL); `down` must
    # still remove everything it started.
    t = Topology(P, make_trip(1, 3, 120), bin_dir)
    runner = subprocess.Popen(
        [
            "bash",
            "-c",
            f'testbed/topology.sh up --trip "{t.trip}" --scheme kernel-mptcp >/dev/null '
            "&& exec sleep 1000",
        ],
        cwd=ROOT,
        env=t.env(),
    )
    try:
        comm = Path(f"/proc/{runner.pid}/comm")
        wait_until("topology.sh up finished", lambda: comm.read_text().strip() == "sleep", 120)
        assert leftovers(P), "it really was up"
    finally:
        runner.kill()
        runner.wait()
    t.down()
    assert leftovers(P) == []


def test_gps_only_and_gpsd_hold_carriers_as_the_replay_does(
    topologies: Topologies, make_trip: MakeTrip, bin_dir: Path, tmp_path: Path
) -> None:
    """Issue 21. The same trip and oracle table (with the trip's route line) on
    three topologies side by side: one replaying the track position, one GPS
    only (the proxy places the train by map matching onto the table's route),
    one on a real gpsd (gpsfake plays the trip's fixes as NMEA in real time).
    The proxy's hof-reject must hold a carrier as often (at least once) and
    for about as long (within 20 %) on each."""
    trip = make_trip(7, 1001, GPS_TRIP_S, "--preset", "pc-gateway-300")
    table = tmp_path / "gps-table.json"
    run(
        [
            str(bin_dir / "polycorn-tracegen"),
            "failure-table",
            "--events",
            str(trip),
            "--out",
            str(table),
            "--min-failures",
            "1",
            "--min-failure-rate",
            "0",
            "--route",
            str(trip / "route.geojson"),
        ]
    )
    epoch = int(time.time() * 1000)
    kinds = {
        "replay": topologies(f"{P}a", trip).up("hrsch", epoch_unix_ms=epoch, failure_table=table),
        "gps only": topologies(f"{P}b", trip).up(
            "hrsch", epoch_unix_ms=epoch, failure_table=table, relay_args=["--replay-gps-only"]
        ),
        "gpsd": topologies(f"{P}c", trip).up(
            "hrsch", epoch_unix_ms=epoch, failure_table=table, gpsd=True
        ),
    }
    loops = [
        t.popen(
            "pax",
            [
                "timeout",
                str(GPS_TRIP_S - 20),
                "bash",
                "-c",
                "while :; do curl -s -o /dev/null --max-time 120 "
                f"http://{ORIGIN}/files/100MiB.bin; done",
            ],
        )
        for t in kinds.values()
    ]
    for p in loops:
        p.wait(timeout=GPS_TRIP_S + 60)
    held: dict[str, tuple[float, float]] = {}
    for kind, t in kinds.items():
        text = t.metrics()
        ev = "polycorn_sched_schedulerlet_events_total"
        rej = value(text, ev, schedulerlet="hof-reject", event="rejections") or 0.0
        ms = value(text, ev, schedulerlet="hof-reject", event="held_ms") or 0.0
        held[kind] = (rej, ms)
    print(f"hof-reject on the proxy (holds, ms held): {held}")
    rej0, ms0 = held["replay"]
    assert rej0 > 0
    for kind in ("gps only", "gpsd"):
        rej, ms = held[kind]
        assert rej == rej0, kind
        assert 0.8 * ms0 <= ms <= 1.2 * ms0, kind


@pytest.fixture(autouse=True)
def _nothing_left_of_the_suites_prefixes() -> None:
    """Each test starts without a topology of this suite's prefixes."""
    for p in (P, f"{P}a", f"{P}b", f"{P}c"):
        if leftovers(p):
            run(["testbed/topology.sh", "down"], env={**os.environ, "PC_PREFIX": p})
