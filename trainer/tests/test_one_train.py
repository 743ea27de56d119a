"""One train cannot poison the fleet's failure table: trainer runs against the
real PostGIS (scripts/infra.sh) on a fleet where one train reports failures
that no other train saw. docs/trainer.md, "One train cannot move the table"."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import pytest

from polycorn_schema.testing import fresh_database
from polycorn_trainer.fit import Params
from polycorn_trainer.run import Options, run

T0 = dt.datetime(2026, 10, 1, 6, 0, tzinfo=dt.UTC)
CARRIER = "cmcc"
HONEST = ("h1", "h2", "h3", "h4")
DAYS = 3  # each train's trips, a day apart


@dataclass
class Fleet:
    """Handovers to write: (train, day) -> [(cell, track_m, failed)]."""

    passes: dict[tuple[str, int], list[tuple[int, float, bool]]] = field(default_factory=dict)

    def add(self, train: str, day: int, cell: int, track_m: float, failed: bool) -> None:
        self.passes.setdefault((train, day), []).append((cell, track_m, failed))


def write(url: str, fleet: Fleet, minute: int = 0) -> None:
    """The fleet into LinkDB: one trip per (train, day), starting ``minute``
    minutes into the day (trains ten minutes apart), one handover per pass.
    Trains and cells already there are reused."""
    trains = sorted({t for t, _ in fleet.passes})
    with psycopg.connect(url) as c:
        for t in trains:
            c.execute(
                "INSERT INTO trains (id, source, first_seen, last_seen) "
                "VALUES (%s, 'telemetry', %s, %s) ON CONFLICT DO NOTHING",
                (t, T0, T0 + dt.timedelta(days=DAYS)),
            )
        key = {int(cid): int(i) for i, cid in c.execute("SELECT id, cell_id FROM cells")}
        for cell in sorted({c for ps in fleet.passes.values() for c, _, _ in ps} - set(key)):
            row = c.execute(
                "INSERT INTO cells (carrier, cell_id, direction, handovers, failures, "
                "first_seen, last_seen) VALUES (%s, %s, 'increasing', 0, 0, %s, %s) RETURNING id",
                (CARRIER, cell, T0, T0),
            ).fetchone()
            assert row is not None
            key[cell] = row[0]
        for (train, day), ps in sorted(fleet.passes.items()):
            start = T0 + dt.timedelta(days=day, minutes=minute + 10 * trains.index(train))
            row = c.execute(
                "INSERT INTO trips (train_id, started_at, ended_at, fixes, direction) "
                "VALUES (%s, %s, %s, 0, 'increasing') RETURNING id",
                (train, start, start + dt.timedelta(minutes=5)),
            ).fetchone()
            assert row is not None
            with c.cursor().copy(
                "COPY handovers (source, train_id, trip_id, cell, carrier, source_cell_id, "
                "target_cell_id, start_time, geog, track_m, direction, rsrp_dbm, outcome, "
                "duration_ms) FROM STDIN"
            ) as cp:
                for i, (cell, track, failed) in enumerate(ps):
                    cp.write_row(
                        (
                            "telemetry",
                            train,
                            row[0],
                            key[cell],
                            CARRIER,
                            cell,
                            cell + 100_000,
                            start + dt.timedelta(seconds=i),
                            f"SRID=4326;POINT({116 + track / 1e5} 39)",
                            track,
                            "increasing",
                            -95.0,
                            "failure" if failed else "success",
                            3000 if failed else 40,
                        )
                    )


def table(url: str, params: Params | None = None) -> dict[int, float]:
    """A trainer run (store and publish to LinkDB); the table it leaves: cell -> position_m."""
    s = run(url, Options(workers=1, params=params or Params()))
    with psycopg.connect(url) as c:
        row = c.execute("SELECT body FROM failure_tables ORDER BY version DESC LIMIT 1").fetchone()
    if s["table"] is None or row is None:
        return {}
    body: dict[str, Any] = row[0]
    return {int(e["cell"]): float(e["position_m"]) for e in body["entries"]}


@pytest.fixture
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_one_train") as url:
        yield url


def test_one_trains_failures_in_a_cell_do_not_put_it_in_the_table(db: str) -> None:
    """Train "bad" fails in cell 1 on each of its three days, ten times a day;
    the four other trains pass there without a failure. The thresholds hold
    (30 failures, 71 %), the several-trains rule keeps the cell out: trips on
    different days of the one train do not count as other trains.
    Cell 2 fails for two trains, three times each: in the table."""
    f = Fleet()
    for day in range(DAYS):
        for t in HONEST:
            f.add(t, day, 1, 1000.0, False)
        for i in range(10):
            f.add("bad", day, 1, 1000.0 + i, True)
    for day in range(DAYS):
        for t in HONEST:
            f.add(t, day, 2, 2300.0 + 10 * day, t in ("h1", "h2"))
    write(db, f)
    got = table(db)
    assert 1 not in got, "one train's failures put its cell into the fleet's table"
    assert 2 in got, "failures from two trains must enter the table"
    # The same data with one train's word enough (min_trains=1) would take cell 1.
    assert 1 in table(db, Params(min_trains=1))


def test_one_train_flooding_many_cells_moves_the_table_by_at_most_the_bound(db: str) -> None:
    """The four honest trains' failures qualify cells 1-8 (one failure each
    on day 0, 1300-1330 m into the cell); cells 9-10 are one failure short
    (h1 and h2 fail once: 2 < 3); cells 11-30 have one honest failure, cells
    31-50 none. Then train "bad" reports every pass of every cell as a
    failure, 1000 m before the honest failures. The bound: one train counts
    for no more than the runner-up, so it can complete only the cells the
    others brought to half the threshold (9-10), adds none of the other 40,
    and moves no entry earlier than the honest trains' failures put it (the
    table's location rule on them alone). Without the rule (min_trains=1) the flood
    would add all 42 cells and drag all 8 entries 1000 m earlier."""
    f = Fleet()
    honest_cells = range(1, 9)
    short = range(9, 11)
    weak = range(11, 31)
    clean = range(31, 51)
    every = [*honest_cells, *short, *weak, *clean]
    for day in range(DAYS):
        for j, t in enumerate(HONEST):
            for cell in every:
                base = 2000.0 * cell
                failed = day == 0 and (
                    cell in honest_cells
                    or (cell in short and t in ("h1", "h2"))
                    or (cell in weak and t == "h1")
                )
                f.add(t, day, cell, base + 1300.0 + 10 * j if failed else base + 1200.0, failed)
    write(db, f)
    before = table(db)
    assert set(before) == set(honest_cells)
    honest_q = {
        c: Params().location(np.array([2000.0 * c + 1300 + 10 * j for j in range(4)]))
        for c in honest_cells
    }
    for c, pos in before.items():
        assert pos >= honest_q[c]

    flood = Fleet()
    for day in range(DAYS):
        for cell in every:
            for i in range(3):
                flood.add("bad", day, cell, 2000.0 * cell + 300.0 + i, True)
    write(db, flood, minute=60)
    after = table(db)
    added = set(after) - set(before)
    assert added <= set(short), f"one train added cells {sorted(added - set(short))}"
    assert added == set(short), "the bound: the cells one failure short are completed"
    assert set(before) <= set(after), "failures of one more train removed an entry"
    moved = {c: (before[c], after[c]) for c in honest_cells if after[c] < honest_q[c]}
    assert not moved, f"one train moved entries earlier: {moved}"
    # The fault this guards against: with one train's word enough, the flood
    # takes every cell and drags every honest entry to its own failures.
    loose = table(db, Params(min_trains=1))
    assert set(loose) == set(every)
    assert all(loose[c] < 2000.0 * c + 400 for c in honest_cells)
