"""paired_goodputs: records paired with a reference scheme's by trip and id."""

from __future__ import annotations

from polycorn_bench.flows import BacklogRun, Flow, paired_goodputs
from polycorn_bench.records import Backlog, Download


def flow(trip: str, scheme: str, ident: int, duration_ms: float | None) -> Flow:
    """A 1 MB download: goodput 8000 / duration_ms Mbit/s, None without a duration."""
    rec = Download(
        id=ident,
        label="1MB",
        size=1_000_000,
        planned_ms=0.0,
        start_ms=0.0,
        end_ms=duration_ms,
        bytes=1_000_000 if duration_ms is not None else 0,
        ok=duration_ms is not None,
        timeout=False,
        error=None,
    )
    return Flow(trip, scheme, rec, duration_ms, censored=False, oracle_ms=None)


def backlog_run(trip: str, scheme: str, ident: int, nbytes: int) -> BacklogRun:
    """A 1 s window: goodput nbytes * 8 / 1e6 Mbit/s."""
    return BacklogRun(trip, scheme, Backlog(ident, "backlog", 0.0, 1000.0, nbytes))


def test_flows_pair_by_trip_and_id_skipping_missing_and_null() -> None:
    records = [
        flow("t1", "a", 0, 500.0),  # 16 vs t1/0 = 8
        flow("t1", "a", 1, 1000.0),  # 8 vs t1/1 = 4
        flow("t1", "a", 2, 1000.0),  # no t1/2 in the reference
        flow("t2", "a", 0, 250.0),  # 32 vs t2/0 = 2 (not t1/0's 8)
        flow("t2", "a", 1, 1000.0),  # t2/1 has no goodput in the reference
        flow("t2", "a", 3, None),  # no goodput itself
        flow("t3", "a", 0, 1000.0),  # no trip t3 in the reference
    ]
    reference = [
        flow("t2", "minrtt", 0, 4000.0),
        flow("t1", "minrtt", 0, 1000.0),
        flow("t1", "minrtt", 1, 2000.0),
        flow("t2", "minrtt", 1, None),
        flow("t2", "minrtt", 3, 1000.0),
    ]
    assert paired_goodputs(records, reference) == [(16.0, 8.0), (8.0, 4.0), (32.0, 2.0)]


def test_backlogs_pair_by_trip_and_id_skipping_zero_reference() -> None:
    records = [
        backlog_run("t1", "a", 0, 3_000_000),  # 24 vs t1/0 = 16
        backlog_run("t2", "a", 0, 1_000_000),  # 8 vs t2/0 = 4 (not t1/0's 16)
        backlog_run("t2", "a", 1, 1_000_000),  # t2/1 delivered nothing in the reference
        backlog_run("t3", "a", 0, 0),  # its own zero pairs: a ratio of 0 is a result
    ]
    reference = [
        backlog_run("t1", "minrtt", 0, 2_000_000),
        backlog_run("t2", "minrtt", 0, 500_000),
        backlog_run("t2", "minrtt", 1, 0),
        backlog_run("t3", "minrtt", 0, 125_000),
    ]
    assert paired_goodputs(records, reference) == [(24.0, 16.0), (8.0, 4.0), (0.0, 1.0)]


def test_no_reference_no_pairs() -> None:
    assert paired_goodputs([flow("t1", "a", 0, 1000.0)], []) == []
    assert paired_goodputs([], [backlog_run("t1", "minrtt", 0, 1)]) == []
