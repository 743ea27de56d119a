"""Trips: maximal runs of a train's fixes with no gap longer than the trip gap.

A pure function of the fixes, whatever order they arrive in. ingest keeps it
incrementally: adding fixes can only *merge* runs (a new fix splits a gap
into two smaller ones, never makes one larger), so the new trips near a
batch are the existing trips that the batch's new fixes touch, merged with
those fixes. :func:`merge` computes that from the existing trips within one
gap of the new fixes and the new fixes' times; nothing else is read.

It also says which handovers may need another trip (``regions``): those
near the part of the timeline that changed. Handovers get the trip that
contains their start time, else the nearest trip within one gap, else none.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Trip:
    """A trip row as ingest sees it (times in Unix ms)."""

    id: int | None  # None: not in the database yet
    started_ms: int
    ended_ms: int
    fixes: int


@dataclass
class TripChanges:
    """What to write for one train."""

    upserts: list[Trip] = field(default_factory=list)  # by id; id None: insert
    deletes: list[int] = field(default_factory=list)  # trip ids merged into another trip
    # [lo, hi] ranges (Unix ms) in which handovers must be (re)assigned.
    regions: list[tuple[int, int]] = field(default_factory=list)


def merge(existing: list[Trip], new_fix_ms: list[int], gap_ms: int) -> TripChanges:
    """Merge the new fixes (not yet counted in any trip) into the existing trips.

    ``existing`` must hold every trip of the train that overlaps
    [min(new) - gap, max(new) + gap]; trips are disjoint runs.
    """
    out = TripChanges()
    if not new_fix_ms:
        return out
    # Items are (start, end, fixes, trip or None), sorted by start.
    items: list[tuple[int, int, int, Trip | None]] = [
        (t.started_ms, t.ended_ms, t.fixes, t) for t in existing
    ]
    items.extend((ms, ms, 1, None) for ms in new_fix_ms)
    items.sort(key=lambda i: (i[0], i[1]))
    groups: list[list[tuple[int, int, int, Trip | None]]] = []
    end = 0
    for it in items:
        if groups and it[0] - end <= gap_ms:
            groups[-1].append(it)
            end = max(end, it[1])
        else:
            groups.append([it])
            end = it[1]
    for g in groups:
        olds = [i[3] for i in g if i[3] is not None]
        news = [i for i in g if i[3] is None]
        if not news:
            continue  # an existing trip the batch did not touch
        start = g[0][0]
        stop = max(i[1] for i in g)
        count = sum(i[2] for i in g)
        # The earliest old trip keeps its id (its start may move earlier);
        # the others are merged into it and deleted.
        kept = olds[0] if olds else None
        out.upserts.append(Trip(kept.id if kept else None, start, stop, count))
        out.deletes.extend(t.id for t in olds[1:] if t.id is not None)
        if kept is not None and len(olds) == 1 and kept.started_ms == start:
            # Extended at the end, or filled in: only handovers after the
            # old end may now belong to it.
            if stop > kept.ended_ms:
                out.regions.append((kept.ended_ms, stop + gap_ms))
        else:
            out.regions.append((start - gap_ms, stop + gap_ms))
    return out
