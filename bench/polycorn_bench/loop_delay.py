"""From a failure to the table that carries it: the fleet loop's delays.

A table entry appears when the trainer's evidence for a cell is complete, which is a
failure somewhere on the line (with several trains, the failure that brings a second
train's word). For every cell that enters a published table version (``tables.jsonl``:
the version, when LinkDB stored it, whether the follower or a refit made it, its cells)
the delay is measured from the latest failure in that cell before the version was stored
(its ``handover_start``, on the wall clock of the trip's epoch):

* ``to_linkdb_s``: until LinkDB stored the version (the trainer's part);
* ``to_proxy_s``: until a running proxy had it in use, i.e. the first time the learned
  copy's proxy of any trip showed that version or a later one (``table-timeline.jsonl``,
  sampled every second). Every proxy takes tables from the same compacted topic, so this
  is when the proxies of the trains behind would have it. A version that a proxy had only
  from its start (published between trips, when no proxy ran) is counted apart
  (``at_proxy_start``): its delay is the gap between trips, not the system's.

Pure functions over the records; :func:`read_tables` and :func:`read_timeline` skip what
they cannot read and say how much.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TableVersion:
    version: int
    created_unix_ms: int
    update: str  # "follow" or "refit"
    cells: frozenset[int]


@dataclass(frozen=True)
class Seen:
    """A proxy's table version from ``t_unix_ms`` on; ``first`` when it is the first
    sample of its trip (in use since the proxy started, not received live)."""

    t_unix_ms: int
    version: int | None
    first: bool


@dataclass(frozen=True)
class Failure:
    t_unix_ms: int
    cell: int
    trip: int
    train: str | None


def read_tables(path: Path) -> tuple[list[TableVersion], int]:
    """The versions of ``tables.jsonl`` in version order, and the lines skipped."""
    out: list[TableVersion] = []
    bad = 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return [], 0
    for line in lines:
        try:
            d = json.loads(line)
            cells = frozenset(int(c) for c in d["cells"])
            out.append(
                TableVersion(int(d["version"]), int(d["created_unix_ms"]), str(d["update"]), cells)
            )
        except (ValueError, KeyError, TypeError):
            bad += 1
    out.sort(key=lambda v: v.version)
    return out, bad


def read_timeline(path: Path) -> tuple[list[Seen], int]:
    """A trip's ``table-timeline.jsonl`` in time order, and the lines skipped."""
    rows: list[tuple[int, int | None]] = []
    bad = 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return [], 0
    for line in lines:
        try:
            d = json.loads(line)
            v = d.get("version")
            rows.append((int(d["t_unix_ms"]), None if v is None else int(v)))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
    rows.sort(key=lambda r: r[0])
    return [Seen(t, v, i == 0) for i, (t, v) in enumerate(rows)], bad


def _quantiles(xs: Sequence[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "median": None, "p90": None, "max": None}
    s = sorted(xs)

    def q(p: float) -> float:
        # The nearest-rank quantile: one of the delays measured, never an interpolation.
        return round(s[max(0, math.ceil(p * len(s)) - 1)], 3)

    return {"n": len(s), "median": q(0.5), "p90": q(0.9), "max": round(s[-1], 3)}


def entry_delays(
    tables: Sequence[TableVersion],
    failures: Iterable[Failure],
    timelines: Iterable[Sequence[Seen]],
) -> list[dict[str, Any]]:
    """One row per cell entering a table version (absent from the version before it),
    with its delays (module docstring). A cell without a failure before the version was
    stored has ``failure_trip`` None and no delay."""
    by_cell: dict[int, list[Failure]] = {}
    for f in failures:
        by_cell.setdefault(f.cell, []).append(f)
    seen = sorted((s for tl in timelines for s in tl), key=lambda s: s.t_unix_ms)
    cells_of = {t.version: t.cells for t in tables}
    out: list[dict[str, Any]] = []
    prev: frozenset[int] = frozenset()
    for v in sorted(tables, key=lambda t: t.version):
        new = v.cells - prev
        prev = v.cells
        for cell in sorted(new):
            # The first time a proxy had this version or a later one that still carries
            # the cell (a later version may have dropped it again).
            at_proxy = next(
                (
                    s
                    for s in seen
                    if s.version is not None
                    and s.version >= v.version
                    and cell in cells_of.get(s.version, frozenset())
                ),
                None,
            )
            before = [f for f in by_cell.get(cell, []) if f.t_unix_ms <= v.created_unix_ms]
            row: dict[str, Any] = {
                "cell": cell,
                "version": v.version,
                "update": v.update,
                "failure_trip": None,
                "failure_train": None,
                "to_linkdb_s": None,
                "to_proxy_s": None,
                "at_proxy_start": None,
            }
            if before:
                f = max(before, key=lambda x: x.t_unix_ms)
                row["failure_trip"] = f.trip
                row["failure_train"] = f.train
                row["to_linkdb_s"] = (v.created_unix_ms - f.t_unix_ms) / 1000
                if at_proxy is not None:
                    row["to_proxy_s"] = (at_proxy.t_unix_ms - f.t_unix_ms) / 1000
                    row["at_proxy_start"] = at_proxy.first
            out.append(row)
    return out


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and quantiles (median, 90th percentile, max, nearest rank) of the delays:
    to LinkDB for every entry with a failure before it, to a running proxy for those a
    proxy received live, per kind of update."""
    timed = [r for r in rows if r["to_linkdb_s"] is not None]
    live = [r for r in timed if r["to_proxy_s"] is not None and not r["at_proxy_start"]]
    out: dict[str, Any] = {
        "entries": len(rows),
        "entries_without_a_failure_before": len(rows) - len(timed),
        "to_linkdb_s": _quantiles([r["to_linkdb_s"] for r in timed]),
        "to_proxy_s": _quantiles([r["to_proxy_s"] for r in live]),
        "at_proxy_start": sum(1 for r in timed if r["at_proxy_start"]),
        "never_at_a_proxy": sum(1 for r in timed if r["to_proxy_s"] is None),
        "by_update": {},
    }
    for kind in sorted({r["update"] for r in rows}):
        mine = [r for r in timed if r["update"] == kind]
        mine_live = [r for r in live if r["update"] == kind]
        out["by_update"][kind] = {
            "entries": sum(1 for r in rows if r["update"] == kind),
            "to_linkdb_s": _quantiles([r["to_linkdb_s"] for r in mine]),
            "to_proxy_s": _quantiles([r["to_proxy_s"] for r in mine_live]),
        }
    return out
