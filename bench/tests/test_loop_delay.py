"""The fleet loop's delays from a failure to the table carrying it (polycorn_bench.loop_delay)."""

from __future__ import annotations

import json
from pathlib import Path

from polycorn_bench.loop_delay import (
    Failure,
    Seen,
    TableVersion,
    entry_delays,
    read_tables,
    read_timeline,
    summarise,
)

T = 1_800_000_000_000  # a wall clock, ms


def version(v: int, at_s: float, cells: set[int], update: str = "follow") -> TableVersion:
    return TableVersion(v, T + int(at_s * 1000), update, frozenset(cells))


def timeline(*rows: tuple[float, int | None]) -> list[Seen]:
    return [Seen(T + int(t * 1000), v, i == 0) for i, (t, v) in enumerate(rows)]


def test_an_entry_is_timed_from_the_failure_that_completed_it() -> None:
    """Train 1 fails in cell 7 at 10 s, train 2 at 100 s; the follower's version 2 (at
    106 s) carries it and the running proxy has it at 108 s. Cell 8's entry in the same
    version rests on a failure at 50 s."""
    failures = [
        Failure(T + 10_000, 7, 1, "a"),
        Failure(T + 100_000, 7, 2, "b"),
        Failure(T + 50_000, 8, 2, "b"),
    ]
    tables = [version(1, 0, set(), "refit"), version(2, 106, {7, 8})]
    rows = entry_delays(tables, failures, [timeline((1, 1), (108, 2))])
    by_cell = {r["cell"]: r for r in rows}
    assert by_cell[7]["failure_train"] == "b"
    assert by_cell[7]["to_linkdb_s"] == 6.0
    assert by_cell[7]["to_proxy_s"] == 8.0
    assert by_cell[7]["at_proxy_start"] is False
    assert by_cell[8]["to_proxy_s"] == 58.0
    s = summarise(rows)
    assert s["entries"] == 2
    assert s["to_proxy_s"]["n"] == 2
    assert s["to_proxy_s"]["median"] == 8.0
    assert s["by_update"]["follow"]["entries"] == 2


def test_a_version_published_between_trips_is_counted_apart() -> None:
    """The refit after trip 1 (at 300 s) adds cell 5; no proxy runs until trip 2's starts
    at 400 s with it: its delay is the gap between trips, not counted as a proxy's."""
    failures = [Failure(T + 200_000, 5, 1, "a")]
    tables = [version(1, 300, {5}, "refit")]
    rows = entry_delays(tables, failures, [timeline((0, None)), timeline((400, 1))])
    assert rows[0]["at_proxy_start"] is True
    assert rows[0]["to_proxy_s"] == 200.0
    s = summarise(rows)
    assert s["at_proxy_start"] == 1
    assert s["to_proxy_s"]["n"] == 0
    assert s["to_linkdb_s"]["median"] == 100.0


def test_a_cell_dropped_before_any_proxy_saw_it_never_reached_one() -> None:
    failures = [Failure(T + 1_000, 3, 1, "a"), Failure(T + 1_000, 4, 1, "a")]
    tables = [version(1, 5, {3, 4}), version(2, 6, {4})]
    rows = entry_delays(tables, failures, [timeline((0, None), (7, 2))])
    by_cell = {r["cell"]: r for r in rows}
    assert by_cell[3]["to_proxy_s"] is None
    assert by_cell[4]["to_proxy_s"] == 6.0
    assert summarise(rows)["never_at_a_proxy"] == 1


def test_an_entry_without_a_failure_before_it_has_no_delay() -> None:
    rows = entry_delays([version(1, 5, {9})], [Failure(T + 9_000, 9, 1, "a")], [])
    assert rows[0]["to_linkdb_s"] is None
    assert summarise(rows)["entries_without_a_failure_before"] == 1


def test_the_readers_skip_what_they_cannot_read(tmp_path: Path) -> None:
    tables = tmp_path / "tables.jsonl"
    tables.write_text(
        json.dumps({"version": 2, "created_unix_ms": T, "update": "follow", "cells": [1, 2]})
        + "\nnot json\n"
        + json.dumps({"version": 1, "created_unix_ms": T, "update": "refit", "cells": []})
        + "\n"
        + json.dumps({"version": 3, "cells": [1]})
        + "\n"
    )
    got, bad = read_tables(tables)
    assert [t.version for t in got] == [1, 2] and bad == 2
    assert got[1].cells == frozenset({1, 2})
    tl = tmp_path / "table-timeline.jsonl"
    tl.write_text(
        json.dumps({"t_unix_ms": T + 5, "version": 4, "entries": 3})
        + "\n[]\n"
        + json.dumps({"t_unix_ms": T, "version": None, "entries": None})
        + "\n"
    )
    seen, bad = read_timeline(tl)
    assert [(s.version, s.first) for s in seen] == [(None, True), (4, False)] and bad == 1
    assert read_tables(tmp_path / "missing") == ([], 0)
