"""HPR's holds replayed offline: when ``hof-reject`` would hold each carrier on a trip, for how
long, and what followed: does it release the path when the failure did not come?

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.holds RUN_DIR \\
        [--table FILE | --oracle] [--gps-error-m 20 50 100 200] [--rtt-ms 100] [--out F.json]

``RUN_DIR`` is a bench-hsr run (``RUN/failure-table.json``, the learned table, and
``RUN/hsr/<trip>/trip/events.jsonl``); ``--oracle`` uses each trip's own
``failure-table-truth.json`` instead (left by a scheme ``NAME@oracle`` or ``TABLE=truth``);
``--training`` replays on the trips the table was learned from (``RUN/table-trips``), never
measured: the place to choose a lead without looking at the measured trips.

The replay follows ``crates/core/src/sched/hrsch.rs`` (``HofReject``) on a grid of
:data:`STEP_MS`: a carrier on a cell (non-zero) is rejected when the table's distance from the
train's position (the last GPS fix's ``track_m`` moved on at its speed, as the endpoint's
``position_at``) to the cell's failure location ahead, or passed by at most
:data:`PASSED_HORIZON_M`, is below V × RTT + E_GPS; the hold lasts until the carrier reports
another cell (``cell_change``, which the trip emits at ``handover_end``) or ``max_hold``
(after which the cell is left alone). RTT is one fixed value (``--rtt-ms``), where the
endpoint uses each path's smoothed RTT: the replay is a design aid for the lead, not a
measurement of the data plane (the data plane's counters, ``hof-reject`` ``rejections``,
``rejections_expired`` and ``held_ms``, are in each scheme's metrics snapshot: the live mean
hold is ``held_ms / rejections``, to set beside the replay's).

Each hold is classified by the handover that ended it (the carrier's last ``handover_start``
from the held cell before the hold's end): **before a failure** (outcome not ``success``) or
**before a success** (a false alarm: the carrier was healthy while held), and **in time**
when the hold began at or before that handover's start (the data plane stops sending on the
carrier before its blackout), else **late**. Per E_GPS: holds, their seconds per trip by
class, and the trip's failed handovers protected in time (of all failed handovers, tabled or
not).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench import provenance
from polycorn_bench.loop import cell_id
from polycorn_bench.records import Issues, finite, read_failure_table, read_jsonl

#: The replay's time step (ms).
STEP_MS = 10
#: ``FailureTable::DEFAULT_PASSED_HORIZON_M``.
PASSED_HORIZON_M = 500.0
#: ``hof-reject``'s defaults: E_GPS (m) and max_hold (s).
GPS_ERROR_M = 20.0
MAX_HOLD_S = 10.0
DEFAULT_RTT_MS = 100.0
#: ``--all``'s "early" view: the learned table with each entry at this quantile of its cell's
#: failures on the training trips (``polycorn-trainer --location-quantile``, bench-hsr's
#: ``NAME@early``).
EARLY_QUANTILE = 0.1

INCREASING, DECREASING = "increasing", "decreasing"


@dataclass(frozen=True)
class Table:
    """Failure locations per (cell ID, direction), as ``FailureTable``: several per key."""

    entries: dict[tuple[int, str], list[float]]

    def distance(self, cell: int, direction: str, position_m: float) -> float | None:
        """``FailureTable::distance_to_failure``: to the nearest location ahead, else the
        nearest passed within the horizon (negative), else None."""
        locs = self.entries.get((cell, direction))
        if not locs:
            return None
        sign = 1.0 if direction == INCREASING else -1.0
        ds = [sign * (f - position_m) for f in locs]
        ahead = [d for d in ds if d >= 0.0]
        if ahead:
            return min(ahead)
        passed = [d for d in ds if d >= -PASSED_HORIZON_M]
        return max(passed) if passed else None


def read_table(path: Path) -> Table | None:
    """A ``polycorn-failure-table/1`` file; None when absent or unusable. Entries without a
    direction are increasing (``polycorn_telemetry``'s default); others than the two are
    skipped."""
    doc = read_failure_table(path)
    if doc is None:
        return None
    entries: dict[tuple[int, str], list[float]] = {}
    for e in doc[1]:
        d = INCREASING if e.direction is None else e.direction
        if isinstance(d, str) and d in (INCREASING, DECREASING):
            entries.setdefault((e.cell, d), []).append(e.position_m)
    return Table(entries)


def relocate(table: Table, training: Sequence[Path], quantile: float, issues: Issues) -> Table:
    """``table`` with each entry moved to the ``quantile`` of its cell's failure starts (the
    ``handover_end`` events' ``track_m``, which is where the handover began) on the
    ``training`` trips' event logs, along the entry's direction of travel; an entry without
    such failures keeps its position. What ``polycorn-trainer --location-quantile`` does from
    LinkDB, done from the trips' ground truth."""
    starts: dict[int, list[float]] = {}
    for log in training:
        for e in read_jsonl(log, issues):
            if e.get("event") != "handover_end" or e.get("outcome") in (None, "success"):
                continue
            c, cell, x = e.get("carrier"), e.get("from_cell"), finite(e.get("track_m"))
            if isinstance(c, int) and isinstance(cell, int) and x is not None:
                starts.setdefault(cell_id(c, cell), []).append(x)
    out: dict[tuple[int, str], list[float]] = {}
    for (cell, d), locs in table.entries.items():
        xs = starts.get(cell)
        if not xs:
            out[(cell, d)] = list(locs)
            continue
        sign = 1.0 if d == INCREASING else -1.0
        q = sign * float(np.quantile([sign * x for x in xs], quantile))
        out[(cell, d)] = [q]
    return Table(out)


@dataclass(frozen=True)
class Handover:
    carrier: int
    from_cell: int
    start_ms: float
    end_ms: float
    outcome: str


@dataclass
class Trip:
    """What the replay needs of ``events.jsonl``."""

    name: str
    #: GPS fixes: time (ms), track_m, speed (m/s), sorted by time.
    fixes: list[tuple[float, float, float]] = field(default_factory=list)
    #: cell_change events: (time ms, carrier, cell), sorted.
    changes: list[tuple[float, int, int]] = field(default_factory=list)
    handovers: list[Handover] = field(default_factory=list)
    end_ms: float = 0.0

    @functools.cached_property
    def direction(self) -> str:
        """From the first and last fix (read once the trip is read)."""
        if len(self.fixes) >= 2 and self.fixes[-1][1] < self.fixes[0][1]:
            return DECREASING
        return INCREASING

    def state(self, t_ms: float) -> tuple[float, float] | None:
        """(position, speed) at ``t_ms``: the last fix's track_m moved on at its speed
        (``TrainState::position_at``); None before the first fix."""
        i = bisect.bisect_right(self.fixes, (t_ms, math.inf, math.inf)) - 1
        if i < 0:
            return None
        t, x, v = self.fixes[i]
        sign = 1.0 if self.direction == INCREASING else -1.0
        return x + sign * v * (t_ms - t) / 1000.0, max(v, 0.0)


def read_trip(name: str, events: Iterable[dict[str, Any]]) -> Trip:
    """The fixes, cell changes and handovers (start paired with its end) of a trip."""
    trip = Trip(name)
    starts: dict[tuple[int, int], float] = {}
    for e in events:
        t = finite(e.get("t_ms"))
        if t is None:
            continue
        trip.end_ms = max(trip.end_ms, t)
        kind, carrier = e.get("event"), e.get("carrier")
        if kind == "gps":
            x, v = finite(e.get("track_m")), finite(e.get("speed_mps"))
            if x is not None and v is not None:
                trip.fixes.append((t, x, v))
        elif not isinstance(carrier, int):
            continue
        elif kind == "cell_change" and isinstance(e.get("cell"), int):
            trip.changes.append((t, carrier, e["cell"]))
        elif kind == "handover_start" and isinstance(e.get("from_cell"), int):
            starts[(carrier, e["from_cell"])] = t
        elif kind == "handover_end" and isinstance(e.get("from_cell"), int):
            start = starts.pop((carrier, e["from_cell"]), None)
            dur = finite(e.get("duration_ms"))
            if start is None:
                start = t - dur if dur is not None else t
            out = e.get("outcome")
            out = out if isinstance(out, str) else "?"
            trip.handovers.append(Handover(carrier, e["from_cell"], start, t, out))
    trip.fixes.sort()
    trip.changes.sort()
    return trip


@dataclass(frozen=True)
class Hold:
    carrier: int
    cell: int
    start_ms: float
    end_ms: float
    expired: bool
    #: The handover that ended the hold (None: expired, or the trip ended).
    handover: Handover | None

    @property
    def before_failure(self) -> bool:
        return self.handover is not None and self.handover.outcome != "success"

    @property
    def in_time(self) -> bool:
        return self.handover is not None and self.start_ms <= self.handover.start_ms


def replay(
    trip: Trip,
    table: Table,
    gps_error_m: float = GPS_ERROR_M,
    rtt_ms: float = DEFAULT_RTT_MS,
    max_hold_s: float = MAX_HOLD_S,
) -> list[Hold]:
    """The holds ``hof-reject`` would make on ``trip`` with ``table``."""
    carriers = sorted({c for _, c, _ in trip.changes} | {h.carrier for h in trip.handovers})
    cell = dict.fromkeys(carriers, 0)
    held: dict[int, tuple[int, float]] = {}  # carrier -> (cell, since)
    spent: set[tuple[int, int]] = set()  # (carrier, cell) whose hold expired: left alone
    released: dict[int, tuple[int, float]] = {}  # carrier -> (cell left while held, when)
    holds: list[Hold] = []
    max_hold_ms = max_hold_s * 1000.0

    def end_hold(c: int, t: float, expired: bool) -> None:
        h_cell, since = held.pop(c)
        ho = None
        if not expired:
            cands = [
                h
                for h in trip.handovers
                if h.carrier == c and h.from_cell == h_cell and h.start_ms <= t
            ]
            ho = max(cands, key=lambda h: h.start_ms) if cands else None
        holds.append(Hold(c, h_cell, since, t, expired, ho))

    ci = 0
    t = 0.0
    while t <= trip.end_ms:
        while ci < len(trip.changes) and trip.changes[ci][0] <= t:
            _, c, new = trip.changes[ci]
            ci += 1
            cell[c] = new
            if c in held and new != 0 and new != held[c][0]:
                released[c] = (held[c][0], t)
                end_hold(c, t, expired=False)
        state = trip.state(t)
        if state is not None:
            pos, v = state
            for c in carriers:
                if c in held:
                    if t - held[c][1] >= max_hold_ms:
                        spent.add((c, held[c][0]))
                        end_hold(c, t, expired=True)
                    continue
                cur = cell[c]
                if cur == 0 or (c, cur) in spent:
                    continue
                rel = released.get(c)
                if rel is not None and rel[0] == cur and t - rel[1] < max_hold_ms:
                    continue
                d = table.distance(cell_id(c, cur), trip.direction, pos)
                if d is not None and d < v * rtt_ms / 1000.0 + gps_error_m:
                    held[c] = (cur, t)
        t += STEP_MS
    for c in list(held):
        end_hold(c, trip.end_ms, expired=True)
    return holds


def summarise(trips: Sequence[Trip], holds: Sequence[Sequence[Hold]]) -> dict[str, Any]:
    """Counts and seconds over the trips (``holds[i]`` are trip i's)."""
    all_holds = [h for hs in holds for h in hs]
    failures = [
        (i, ho) for i, t in enumerate(trips) for ho in t.handovers if ho.outcome != "success"
    ]
    protected = {
        (i, h.handover) for i, hs in enumerate(holds) for h in hs if h.before_failure and h.in_time
    }

    def secs(hs: Iterable[Hold]) -> float:
        return sum(h.end_ms - h.start_ms for h in hs) / 1000.0

    n = max(len(trips), 1)
    fail_holds = [h for h in all_holds if h.before_failure]
    ok_holds = [h for h in all_holds if h.handover is not None and not h.before_failure]
    return {
        "trips": len(trips),
        "holds": len(all_holds),
        "holds_before_failure": len(fail_holds),
        "holds_before_failure_in_time": sum(h.in_time for h in fail_holds),
        "holds_before_success": len(ok_holds),
        "holds_expired": sum(h.expired for h in all_holds),
        "hold_s_per_trip_before_failure": secs(fail_holds) / n,
        "hold_s_per_trip_before_success": secs(ok_holds) / n,
        "hold_s_per_trip_expired": secs(h for h in all_holds if h.expired) / n,
        "failed_handovers": len(failures),
        "failed_handovers_protected_in_time": sum((i, f) in protected for i, f in failures),
    }


def analyse(
    run: Path,
    errors_m: Sequence[float],
    *,
    rtt_ms: float = DEFAULT_RTT_MS,
    table_path: Path | None = None,
    oracle: bool = False,
    training: bool = False,
    relocate_quantile: float | None = None,
) -> dict[str, Any]:
    """Per E_GPS, :func:`summarise` over the run's hsr trips (``training``: over the trips
    the table was learned from, ``RUN/table-trips/<trip>/events.jsonl``, instead)."""
    if training:
        logs = sorted((run / "table-trips").glob("*/events.jsonl"))
    else:
        logs = sorted((run / "hsr").glob("*/trip/events.jsonl"))
    shared = None if oracle else read_table(table_path or run / "failure-table.json")
    trips: list[Trip] = []
    tables: list[Table] = []
    issues = Issues()
    if shared is not None and relocate_quantile is not None:
        training_logs = sorted((run / "table-trips").glob("*/events.jsonl"))
        shared = relocate(shared, training_logs, relocate_quantile, issues)
    for log in logs:
        trip_dir = log.parent if training else log.parent.parent
        table = read_table(trip_dir / "failure-table-truth.json") if oracle else shared
        if table is None:
            continue
        trips.append(read_trip(trip_dir.name, read_jsonl(log, issues)))
        tables.append(table)
    by_error = {}
    for e in errors_m:
        holds = [replay(t, tb, e, rtt_ms) for t, tb in zip(trips, tables, strict=True)]
        by_error[f"{e:g}"] = summarise(trips, holds)
    return {
        "run": str(run),
        "table": (
            "oracle (each trip's failure-table-truth.json)"
            if oracle
            else str(table_path or run / "failure-table.json")
        )
        + (
            ""
            if relocate_quantile is None
            else f", each entry at the {relocate_quantile:g} quantile of its training failures"
        ),
        "trips_from": "table-trips (the table's training trips)" if training else "hsr",
        "rtt_ms": rtt_ms,
        "max_hold_s": MAX_HOLD_S,
        "trips": [t.name for t in trips],
        "by_gps_error_m": by_error,
    }


def analyse_all(run: Path, errors_m: Sequence[float], rtt_ms: float) -> dict[str, Any]:
    """Every view of a run at once: the learned table on its training trips (where a lead is
    chosen), and on the measured trips the learned table, the broad one (when the run has
    ``failure-table-broad.json``), the oracle (when the trips have theirs) and the learned
    table's entries moved to :data:`EARLY_QUANTILE` of their training failures ("early")."""
    views = {
        "training": analyse(run, errors_m, rtt_ms=rtt_ms, training=True),
        "learned": analyse(run, errors_m, rtt_ms=rtt_ms),
        "broad": analyse(run, errors_m, rtt_ms=rtt_ms, table_path=run / "failure-table-broad.json"),
        "oracle": analyse(run, errors_m, rtt_ms=rtt_ms, oracle=True),
        "early": analyse(run, errors_m, rtt_ms=rtt_ms, relocate_quantile=EARLY_QUANTILE),
    }
    return {k: v for k, v in views.items() if v["trips"]}


def table_md(doc: dict[str, Any]) -> str:
    rows = [
        "| E_GPS (m) | holds | before a failure (in time) | before a success | expired "
        "| s/trip held before failures | s/trip held before successes | failed handovers "
        "protected in time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, s in doc["by_gps_error_m"].items():
        rows.append(
            f"| {e} | {s['holds']} | {s['holds_before_failure']} "
            f"({s['holds_before_failure_in_time']}) | {s['holds_before_success']} | "
            f"{s['holds_expired']} | {s['hold_s_per_trip_before_failure']:.1f} | "
            f"{s['hold_s_per_trip_before_success']:.1f} | "
            f"{s['failed_handovers_protected_in_time']} of {s['failed_handovers']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="bench-hsr run directory")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--table", type=Path, help="failure table (default RUN/failure-table.json)")
    g.add_argument("--oracle", action="store_true", help="each trip's failure-table-truth.json")
    p.add_argument(
        "--training",
        action="store_true",
        help="replay on RUN/table-trips (the trips the table was learned from), not RUN/hsr",
    )
    p.add_argument(
        "--relocate-quantile",
        type=float,
        help="move each entry to this quantile of its cell's failures on RUN/table-trips",
    )
    p.add_argument("--gps-error-m", type=float, nargs="+", default=[20.0, 50.0, 100.0, 200.0])
    p.add_argument("--rtt-ms", type=float, default=DEFAULT_RTT_MS)
    p.add_argument(
        "--all",
        action="store_true",
        help="every view (training trips; measured trips with the learned, broad and oracle "
        "tables) into one JSON, keyed by view",
    )
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    prov = provenance.of_run(a.run, a.out) if a.out else None
    if a.all:
        views = analyse_all(a.run, a.gps_error_m, a.rtt_ms)
        if not views:
            print(f"holds: no trip with a failure table under {a.run}", file=sys.stderr)
            return 1
        if prov:
            a.out.write_text(json.dumps(prov.stamp(views), indent=1) + "\n", encoding="utf-8")
        for name, v in views.items():
            print(f"{name}: {len(v['trips'])} trips ({v['trips_from']}), table {v['table']}")
            print(table_md(v))
        return 0
    doc = analyse(
        a.run,
        a.gps_error_m,
        rtt_ms=a.rtt_ms,
        table_path=a.table,
        oracle=a.oracle,
        training=a.training,
        relocate_quantile=a.relocate_quantile,
    )
    if not doc["trips"]:
        print(f"holds: no hsr trip with a failure table under {a.run}", file=sys.stderr)
        return 1
    if prov:
        a.out.write_text(json.dumps(prov.stamp(doc), indent=1) + "\n", encoding="utf-8")
    print(
        f"{len(doc['trips'])} trips ({doc['trips_from']}), table {doc['table']}, "
        f"RTT {a.rtt_ms:g} ms"
    )
    print(table_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
