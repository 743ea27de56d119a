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
from polycorn_harness.topology import ORIGIN, Topology, carrier_counters, leftovers, run
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


def constant_trip(d: Path, per_ms: tuple[float, ...], delay_ms: float = 10) -> Path:
    """A trip of constant-rate carriers: carrier i delivers ``per_ms[i]`` full-size packets
    a millisecond (12 Mbit/s each) both ways, ``delay_ms`` one way, no loss."""
    d.mkdir(parents=True, exist_ok=True)
    for i, rate in enumerate(per_ms):
        step = 1 / rate
        lines = "".join(f"{round(k * step)}\n" for k in range(1, round(1000 * rate) + 1))
        for way in ("up", "down"):
            (d / f"c{i}.{way}").write_text(lines)
        (d / f"c{i}.schedule").write_text(f"delay 0 {delay_ms}\n")
    return d


def test_a_direct_scheme_crosses_its_carrier_alone_at_its_rate(
    topologies: Topologies, tmp_path: Path
) -> None:
    """direct-c1: the passenger's own TCP, no relay, through carrier 1's emulated link (3
    Mbit/s here, so 1 MiB takes about 3 s, not the milliseconds of a shortcut), with the
    congestion control asked for at the origin, and nothing on carrier 0."""
    t = topologies(P, constant_trip(tmp_path / "trip", (1.0, 0.25))).up("direct-c1", cc="cubic")
    assert not (t.state / "run" / "relay.pid").exists()

    def rx() -> list[int]:
        c = carrier_counters(t.ns("train"))
        assert c is not None
        return c["rx_bytes"]

    url = f"http://{ORIGIN}/files/1MiB.bin"
    before = rx()
    start = time.monotonic()
    get = subprocess.Popen(
        ["ip", "netns", "exec", t.ns("pax"), "curl", "-fsS", "--max-time", "60", url],
        stdout=subprocess.PIPE,
    )
    seen = ""
    while get.poll() is None and "cubic" not in seen:
        seen = t.exec("inet", ["ss", "-tin", "sport = :80"]).stdout
        time.sleep(0.2)
    got, _ = get.communicate(timeout=90)
    took = time.monotonic() - start
    assert get.returncode == 0
    want = (t.state / "origin/www/files/1MiB.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest()
    assert "cubic" in seen
    after = rx()
    assert after[1] - before[1] >= len(want)
    assert after[0] - before[0] < 10_000
    # 3 Mbit/s on the wire, 1448 of every 1500 bytes payload: 2.9 s at best.
    assert 2.7 < took < 30, took


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
    """The same trip and oracle table (with the trip's route line) on
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
