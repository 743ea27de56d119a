"""The harness's own pieces, without namespaces: waiting, metrics parsing."""

from __future__ import annotations

import pytest

from polycorn_harness.metrics import sums, value
from polycorn_harness.topology import leftovers
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
