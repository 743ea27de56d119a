"""Where bulk downloads lose time against the oracle: a timeline per download and the lost
time attributed to its causes, summed over a whole benchmark.

Each download's timeline comes from its progress curve (``progress`` in ``bulk.jsonl``:
cumulative body bytes every 100 ms, :data:`BIN_MS`) and the trip's link files (the same
carriers the oracle uses):

* **setup**: request to first body byte (connection set-up through the tunnel, the request's
  trip, the server's first bytes), at the curve's 100 ms resolution;
* **stalled, a carrier lit**: runs of at least :data:`STALL_MIN_MS` after the first byte in
  which no byte arrived although
  the carriers offered at least :data:`LIT_MIN_OPPORTUNITIES` downlink opportunities per bin
  outside blackouts (head-of-line blocking, a path that went slow or dark under the data, a
  retransmission timeout);
* **stalled, all dark**: no byte arrived and the carriers offered (almost) nothing;
* **moving**: the rest.

Lost time = actual − oracle duration, attributed to: **setup excess** (setup − the oracle's
time to its first byte, at least 0), **stalls with a carrier lit** (the oracle would have
been moving), and **slow** (the rest: rate below the carriers' capacity — congestion control,
windows, scheduling — and dark time the oracle avoided by finishing earlier). A download that
beats the oracle's timeline (it cannot; the oracle is a lower bound) would show a negative
remainder, which is reported, not clipped.

Not from the endpoints: per-path window growth and the last byte's path need a per-connection
trace the relay does not export; the endpoint's counters (head-of-line stalls, stale
transitions) are per trip, in the metrics snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from polycorn_bench.flows import OVERALL, Flow, trip_oracle
from polycorn_bench.oracle import Carrier
from polycorn_bench.records import Issues, LinkSetRun

#: The loadgen's progress step (testbed/loadgen/src/bulk.rs, PROGRESS_STEP_US).
BIN_MS = 100.0
#: Shorter pauses are round trips of a window (slow start over a 100-300 ms cellular RTT),
#: not stalls; 300 ms is also where the core calls a path stale at the earliest.
STALL_MIN_MS = 300.0
#: Downlink opportunities (1448 payload bytes each) per 100 ms bin, over all carriers, below
#: which a stall counts as "all dark": 10 per 100 ms is about 1.2 Mbit/s.
LIT_MIN_OPPORTUNITIES = 10

METHODS = {
    "lost_time": (
        "bulk downloads with a progress curve (100 ms samples) and an oracle time: setup = "
        "first body byte - start; stalls: runs of >= 300 ms of 100 ms bins after the first "
        "byte with no new byte, each bin 'lit' "
        f"when the trip's carriers offered >= {LIT_MIN_OPPORTUNITIES} downlink opportunities "
        "per 100 ms outside blackouts, else 'dark'; lost = actual - oracle duration = "
        "setup_excess (setup - oracle's first byte, >= 0) + stall_lit + slow (remainder); sums "
        "over the downloads, shares of the summed lost time; censored (timed-out) downloads "
        "count up to their timeout"
    ),
}


@dataclass(frozen=True)
class Timeline:
    duration_ms: float
    oracle_ms: float
    setup_ms: float
    setup_excess_ms: float
    stall_lit_ms: float
    stall_dark_ms: float

    @property
    def lost_ms(self) -> float:
        return self.duration_ms - self.oracle_ms

    @property
    def slow_ms(self) -> float:
        return self.lost_ms - self.setup_excess_ms - self.stall_lit_ms


def _opportunities(carriers: list[Carrier], t0: float, t1: float) -> int:
    n = 0
    for c in carriers:
        times, _ = c.downlink(t1)
        n += int(np.searchsorted(times, t1, side="left") - np.searchsorted(times, t0, side="left"))
    return n


def timeline(f: Flow, carriers: list[Carrier], oracle_first_ms: float) -> Timeline | None:
    """The timeline of one download; None without a usable progress curve or oracle time."""
    prog, end = f.rec.progress, f.end_ms
    if not prog or f.rec.progress_bad or end is None or f.oracle_ms is None:
        return None
    start = f.rec.start_ms
    first = next((t for t, b in prog if b > 0), None)
    if first is None:
        first = end
    first = min(max(first, start), end)
    pts = [(t, b) for t, b in prog if first <= t <= end]
    # Runs of consecutive bins with no new byte; only runs of at least STALL_MIN_MS are stalls.
    runs: list[list[tuple[float, float]]] = [[]]
    for (t0, b0), (t1, b1) in pairwise(pts):
        if b1 == b0 and t1 > t0:
            runs[-1].append((t0, t1))
        elif runs[-1]:
            runs.append([])
    lit = dark = 0.0
    for run in runs:
        if not run or run[-1][1] - run[0][0] < STALL_MIN_MS:
            continue
        for r0, r1 in run:
            need = LIT_MIN_OPPORTUNITIES * (r1 - r0) / BIN_MS
            if _opportunities(carriers, r0, r1) >= need:
                lit += r1 - r0
            else:
                dark += r1 - r0
    setup = first - start
    return Timeline(
        duration_ms=end - start,
        oracle_ms=f.oracle_ms,
        setup_ms=setup,
        setup_excess_ms=max(0.0, setup - oracle_first_ms),
        stall_lit_ms=lit,
        stall_dark_ms=dark,
    )


def _summary(tls: list[Timeline]) -> dict[str, Any]:
    def s(attr: str) -> float:
        return float(sum(getattr(t, attr) for t in tls)) / 1000

    lost = s("lost_ms")
    out: dict[str, Any] = {
        "n": len(tls),
        "actual_s": s("duration_ms"),
        "oracle_s": s("oracle_ms"),
        "lost_s": lost,
        "setup_s": s("setup_ms"),
        "setup_excess_s": s("setup_excess_ms"),
        "stall_lit_s": s("stall_lit_ms"),
        "stall_dark_s": s("stall_dark_ms"),
        "slow_s": s("slow_ms"),
    }
    for k in ("setup_excess", "stall_lit", "slow"):
        out[f"{k}_share"] = out[f"{k}_s"] / lost if lost > 0 else None
    return out


def lost_time(
    flows: Iterable[Flow], ls: LinkSetRun, schemes: list[str], issues: Issues
) -> dict[str, Any] | None:
    """Per scheme and size (and overall): the summed timeline and lost-time attribution of its
    bulk downloads. None when no download has a progress curve and an oracle time."""
    by_trip: dict[str, list[Flow]] = {}
    for f in flows:
        by_trip.setdefault(f.trip, []).append(f)
    tls: dict[str, dict[str, list[Timeline]]] = {}
    for trip in ls.trips:
        mine = by_trip.get(trip.name)
        # Without an oracle time no download of the trip is attributed, and the reason is
        # already in ``issues`` (collect_flows loaded the same link files).
        if not mine or all(f.oracle_ms is None for f in mine):
            continue
        oracle = trip_oracle(trip, issues)
        if oracle is None:
            continue
        carriers = oracle.carriers
        first_cache: dict[float, float] = {}
        for f in mine:
            start = f.rec.start_ms
            if start not in first_cache:
                first_cache[start] = oracle.time_ms(start, 1)
            t = timeline(f, carriers, first_cache[start])
            if t is None:
                continue
            per = tls.setdefault(f.scheme, {})
            per.setdefault(f.rec.label, []).append(t)
            per.setdefault(OVERALL, []).append(t)
    if not tls:
        return None
    return {s: {label: _summary(v) for label, v in tls[s].items()} for s in schemes if s in tls}
