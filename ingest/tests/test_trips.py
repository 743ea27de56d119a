"""Trip merging is exact and independent of arrival order."""

from __future__ import annotations

import random

from polycorn_ingest.trips import Trip, merge

GAP = 600_000


def runs(times: list[int]) -> list[tuple[int, int, int]]:
    """Reference: runs of sorted unique times with no gap > GAP."""
    out: list[list[int]] = []
    for t in sorted(set(times)):
        if out and t - out[-1][1] <= GAP:
            out[-1][1] = t
            out[-1][2] += 1
        else:
            out.append([t, t, 1])
    return [tuple(r) for r in out]  # type: ignore[misc]


def apply(trips: dict[int, Trip], new: list[int], next_id: list[int]) -> None:
    ch = merge(sorted(trips.values(), key=lambda t: t.started_ms), new, GAP)
    for d in ch.deletes:
        del trips[d]
    for t in ch.upserts:
        if t.id is None:
            next_id[0] += 1
            trips[next_id[0]] = Trip(next_id[0], t.started_ms, t.ended_ms, t.fixes)
        else:
            trips[t.id] = t


def test_batches_in_any_order_give_the_runs_of_all_fixes() -> None:
    rng = random.Random(7)
    for _ in range(200):
        times = sorted({rng.randrange(0, 50 * GAP, 1000) for _ in range(rng.randrange(1, 60))})
        shuffled = times[:]
        rng.shuffle(shuffled)
        trips: dict[int, Trip] = {}
        next_id = [0]
        i = 0
        while i < len(shuffled):
            n = rng.randrange(1, 8)
            apply(trips, shuffled[i : i + n], next_id)
            i += n
        got = sorted((t.started_ms, t.ended_ms, t.fixes) for t in trips.values())
        assert got == runs(times)


def test_extending_the_current_trip_keeps_its_id_and_asks_only_for_the_new_part() -> None:
    old = Trip(5, 0, 10_000, 11)
    ch = merge([old], [11_000, 12_000], GAP)
    assert ch.upserts == [Trip(5, 0, 12_000, 13)]
    assert ch.deletes == []
    assert ch.regions == [(10_000, 12_000 + GAP)]


def test_a_fix_in_a_gap_merges_two_trips_into_the_earlier_one() -> None:
    a, b = Trip(1, 0, 1000, 2), Trip(2, 1000 + GAP + 1000, 1000 + GAP + 2000, 2)
    ch = merge([a, b], [1000 + GAP // 2], GAP)
    assert ch.upserts == [Trip(1, 0, b.ended_ms, 5)]
    assert ch.deletes == [2]
