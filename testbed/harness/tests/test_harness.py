"""The harness's own pieces, without namespaces: waiting, metrics parsing, the
trip judge."""

from __future__ import annotations

from pathlib import Path

import pytest

from polycorn_harness.metrics import sums, targets_up, value
from polycorn_harness.topology import leftovers
from polycorn_harness.trip import Expected, exactly_once
from polycorn_harness.wait import WaitTimeoutError, wait_until

OPENMETRICS = """# HELP polycorn_path_up Path up.
# TYPE polycorn_path_up gauge
polycorn_path_up{path="0"} 1
polycorn_path_up{path="1"} 0
# HELP polycorn_sched_schedulerlet_events Schedulerlet events.
# TYPE polycorn_sched_schedulerlet_events counter
polycorn_sched_schedulerlet_events_total{schedulerlet="hof-reject",event="rejections"} 3
polycorn_sched_schedulerlet_events_total{schedulerlet="hof-reject",event="held_ms"} 1500
# EOF
"""
PROMETHEUS = """# HELP polycorn_ingest_db_errors_total DB errors.
# TYPE polycorn_ingest_db_errors_total counter
polycorn_ingest_db_errors_total 2.0
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_wait_until_returns_the_condition_or_names_what_did_not_happen() -> None:
    c = FakeClock()
    calls = iter([None, None, "ready"])
    assert wait_until("x", lambda: next(calls), 10, clock=c.clock, sleep=c.sleep) == "ready"
    assert c.now == pytest.approx(0.2)
    with pytest.raises(WaitTimeoutError, match="the path: not within 2 s"):
        wait_until("the path", lambda: False, 2, clock=c.clock, sleep=c.sleep)


def test_both_exposition_formats_are_read() -> None:
    ev = "polycorn_sched_schedulerlet_events_total"
    assert value(OPENMETRICS, ev, schedulerlet="hof-reject", event="rejections") == 3
    assert value(OPENMETRICS, ev, schedulerlet="hof-reject") == 1503
    assert value(OPENMETRICS, "polycorn_path_up") == 1
    assert value(OPENMETRICS, "polycorn_missing") is None
    assert value(PROMETHEUS, "polycorn_ingest_db_errors_total") == 2
    assert sums(OPENMETRICS)["polycorn_path_up"] == 1
    with pytest.raises(ValueError):
        value("polycorn_x{ 1\n# EOF\n", "polycorn_x")


def test_nothing_is_left_of_a_topology_that_never_was() -> None:
    assert leftovers("pc-never-started") == []


def test_targets_up_needs_every_job_and_every_target_up() -> None:
    def doc(*targets: tuple[str, str]) -> dict[str, object]:
        return {
            "data": {
                "activeTargets": [
                    {"labels": {"job": j}, "health": h, "scrapeUrl": f"http://{j}/metrics"}
                    for j, h in targets
                ]
            }
        }

    assert targets_up(doc(("a", "up"), ("b", "up")), ["a", "b"])[0]
    ok, report = targets_up(doc(("a", "up"), ("b", "down")), ["a", "b"])
    assert not ok and "down" in report
    ok, report = targets_up(doc(("a", "up")), ["a", "c"])
    assert not ok and "c: absent" in report
    assert not targets_up({"status": "error"}, ["a"])[0]


def test_exactly_once_takes_the_trip_and_nothing_else(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"event":"gps","t_ms":1000}\n'
        '{"event":"handover_end","carrier":0,"t_ms":5000,"duration_ms":40}\n'
        '{"event":"handover_end","carrier":2,"t_ms":6000,"duration_ms":40}\n'
    )
    want = Expected.load(events, 0)
    assert want.handovers == (("carrier-0", 4960),) and want.handover_emit_ms == (5000,)
    assert exactly_once(want, [("carrier-0", 4960)], [1000])[0]
    # seeded faults: a duplicated fix, the wrong carrier, a missing handover
    assert not exactly_once(want, [("carrier-0", 4960)], [1000, 1000])[0]
    assert not exactly_once(want, [("carrier-1", 4960)], [1000])[0]
    ok, report = exactly_once(want, [], [1000])
    assert not ok and "missing 1" in report
    # an empty trip proves nothing
    assert not exactly_once(Expected((), (), (), ()), [], [])[0]


def test_the_passenger_probe_catalogue_names_every_kind_of_target_once() -> None:
    from polycorn_harness.probes import catalogue

    got = catalogue(2, ["10.77.0.2", "10.77.1.2", "10.99.0.1"])
    names = [p.name for p in got]
    assert len(names) == len(set(names)), "each probe is named once"
    targets = {(p.via, p.host) for p in got}
    for want in [
        ("tcp", "10.66.0.1"),
        ("udp", "10.66.0.1"),
        ("tcp", "10.77.1.1"),
        ("tcp", "10.99.0.1"),
        ("socks5", "::ffff:10.99.0.1"),
        ("socks5", "64:ff9b::a63:1"),
        ("socks5", "::1"),
        ("socks5", "::ffff:127.0.0.1"),
        ("socks5", "64:ff9b::7f00:1"),
        ("socks5", "::127.0.0.1"),
        ("socks5", "2002:7f00:1::1"),
        ("socks5", "0.0.0.0"),  # noqa: S104 (a probed destination)
        ("socks5", "::"),
        ("tcp", "169.254.169.254"),
        ("socks5", "fd00:ec2::254"),
        ("socks5", "10.0.0.1"),
        ("socks5", "metadata.test"),
    ]:
        assert want in targets, want
    # A passenger has no IPv6 route in the testbed: IPv6 only through SOCKS5.
    assert all(":" not in p.host for p in got if p.via != "socks5")
