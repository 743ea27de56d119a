"""What the schedulerlets did: counters summed over trips, per scheme and direction."""

from __future__ import annotations

from pathlib import Path

from conftest import RunBuilder, download

from polycorn_bench.analysis import analyse
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown

TRIPS = ["r1-t1", "r1-t2"]


def events(rows: list[tuple[str, str, float]]) -> str:
    lines = ["# TYPE polycorn_sched_schedulerlet_events_total counter"]
    lines += [
        f'polycorn_sched_schedulerlet_events_total{{schedulerlet="{s}",event="{e}"}} {v}'
        for s, e, v in rows
    ]
    return "\n".join(lines) + "\n"


def test_counters_are_summed_over_trips_per_direction(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt", "hrsch"], TRIPS)
    for k, trip in enumerate(TRIPS):
        for s in ("minrtt", "hrsch"):
            b.bulk(trip, s, [download(0, 1000.0, 500.0)])
        b.metrics(trip, "minrtt", relay=events([]), proxy=events([]))
        b.metrics(
            trip,
            "hrsch",
            relay=events([("tail-reject", "deselected", 1)]),
            proxy=events(
                [("hof-reject", "rejections", 3 + k), ("hof-reject", "rejections_expired", k)]
            ),
        )
    doc = analyse(read_run(b.finish()))
    ev = doc["scheduler_events"]["hrsch"]
    assert ev["n_trips"] == 2
    assert ev["downlink"] == {"hof-reject/rejections": 7.0, "hof-reject/rejections_expired": 1.0}
    assert ev["uplink"] == {"tail-reject/deselected": 2.0}
    assert ev["per_trip_mean"]["hof-reject/rejections"] == 3.5
    md = markdown(doc)
    assert "### What the schedulerlets did" in md
    assert "| `hrsch` | 2 | 3.5 | 0.5 |" in md


def test_no_section_without_counters(tmp_path: Path) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], TRIPS[:1])
    b.bulk(TRIPS[0], "minrtt", [download(0, 1000.0, 500.0)])
    doc = analyse(read_run(b.finish()))
    assert doc["scheduler_events"] is None
    assert "What the schedulerlets did" not in markdown(doc)


def path_counters(rto: float, stale: float) -> str:
    return (
        "# TYPE polycorn_path_rto counter\n"
        f'polycorn_path_rto_total{{path="0"}} {rto}\n'
        f'polycorn_path_rto_total{{path="1"}} 1\n'
        "# TYPE polycorn_path_stale_transitions counter\n"
        f'polycorn_path_stale_transitions_total{{path="0"}} {stale}\n'
    )


def test_path_timeouts_and_stale_transitions_are_summed_over_paths_and_trips(
    tmp_path: Path,
) -> None:
    b = RunBuilder(tmp_path / "run", ["minrtt"], TRIPS)
    for k, trip in enumerate(TRIPS):
        b.bulk(trip, "minrtt", [download(0, 1000.0, 500.0)])
        b.metrics(trip, "minrtt", relay=path_counters(0, 0), proxy=path_counters(4 + k, 2))
    doc = analyse(read_run(b.finish()))
    ev = doc["path_events"]["minrtt"]
    assert ev["n_trips"] == 2
    assert ev["downlink"] == {"rto": 11.0, "stale_transitions": 4.0}
    assert ev["uplink"] == {"rto": 2.0, "stale_transitions": 0.0}
    assert ev["per_trip_mean"] == {"rto": 5.5, "stale_transitions": 2.0}
