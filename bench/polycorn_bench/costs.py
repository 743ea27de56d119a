"""What a caught handover failure saves and what a needless hold costs: the two inputs of the
trainer's decision rule (``make bench-hsr PROFILE=costs``; docs/trainer.md, "The prior rule").

A pipeline P runs three times side by side on the same trip: ``P@none`` with no table,
``P@oracle`` with every cell where this very trip fails (placed at the failure) and ``P@every``
with the oracle's cells plus every cell the trip hands over in successfully. The oracle catches
every failure and holds nowhere else; ``P@every`` adds a needless hold before every handover
that succeeds. Over the backlog phase's always-busy download (the same record in each copy),
with B the body bytes a copy delivered in the download's window and n the trip's handovers that
start inside it:

    saved per caught failure   C_fail = sum over trips (B_oracle - B_none)  / sum n_failed
    cost per needless hold     C_hold = sum over trips (B_oracle - B_every) / sum n_succeeded

Whole windows rather than windows around each handover: no window length to choose, and no
handover's effect counted twice when two fall close together. A cell pays its place in the
table when its failure probability p has p * C_fail > (1 - p) * C_hold, i.e. above

    p* = C_hold / (C_fail + C_hold) = 1 / (1 + r),   r = C_fail / C_hold

(the trainer's ``--failure-cost-ratio``). p* is 1 when a caught failure saves nothing (no table
pays) and 0 when a hold costs nothing (every cell pays), so it stays finite where r does not.
Intervals: percentile bootstrap over trips (a trip's bytes and counts resampled together), 95 %;
r's interval is p*'s mapped through r = 1/p* - 1 (unbounded above where p*'s reaches 0).
Both costs are also given in seconds of the ``P@none`` download's mean goodput on that trip set.

This is the cost of a hold placed exactly where the handover happens; a learned table places its
cells less precisely, which lengthens holds and misses some failures. So the section also gives
what a held second costs: (B_oracle - B_every) over the seconds ``P@every`` held paths beyond
``P@oracle`` (``hof-reject``'s ``held_ms`` in the proxy's end-of-trip snapshot: the downlink,
which the download uses), and each copy's mean hold (``held_ms`` / ``rejections``). A table whose
holds last longer pays that much more per needless hold.

Volume is what a saturating download loses; a passenger waiting on a page or a video feels the
stalls. The same three copies are also compared in stall seconds: the time the download
received nothing for at least :data:`STALL_MIN_MS` (from its progress samples, after its first
byte), with C_fail and C_hold, p* and r as above in seconds of stall instead of bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polycorn_bench.flows import BacklogRun
from polycorn_bench.records import LinkSetRun, SchemeRun
from polycorn_bench.schedevents import schedulerlet_events
from polycorn_bench.stats import cluster_bootstrap_ci, finite_or_none

NONE, ORACLE, EVERY = "none", "oracle", "every"

#: A gap without a byte counts as a stall from this long on (three progress samples of
#: 100 ms): shorter gaps are the ordinary rhythm of a download over two carriers.
STALL_MIN_MS = 300.0

NOTE = (
    "no trip has the backlog record of each of NAME@none, NAME@oracle and NAME@every and its "
    "handover events: no handover costs"
)


@dataclass(frozen=True)
class TripCosts:
    """One trip's backlog download in the three copies, and its handovers in the window."""

    trip: str
    none_bytes: int
    oracle_bytes: int
    every_bytes: int
    failed: int
    succeeded: int
    window_ms: float
    #: hof-reject's holds in the proxy of P@oracle and P@every: (held seconds, holds begun);
    #: None without the snapshot or the counters.
    oracle_holds: tuple[float, int] | None = None
    every_holds: tuple[float, int] | None = None
    #: Stall seconds of each copy's download (None: no progress samples).
    stalls_s: tuple[float, float, float] | None = None


def pipelines(schemes: Sequence[str]) -> list[str]:
    """Pipelines the run has as NAME@none, NAME@oracle and NAME@every, in the run's order."""
    have = set(schemes)
    out: list[str] = []
    for s in schemes:
        p = s.partition("@")[0]
        if p not in out and all(f"{p}@{t}" in have for t in (NONE, ORACLE, EVERY)):
            out.append(p)
    return out


def trip_costs(
    ls: LinkSetRun, backlogs: Sequence[BacklogRun], pipeline: str
) -> tuple[list[TripCosts], int]:
    """(each trip where all three copies have the same backlog record and the trip has its
    handover events, the number of trips left out). The window is the ``P@none`` record's;
    with several records per copy, the first (lowest id) present in all three."""
    by: dict[tuple[str, str], dict[int, BacklogRun]] = {}
    for b in backlogs:
        by.setdefault((b.scheme, b.trip), {})[b.rec.id] = b
    out: list[TripCosts] = []
    left_out = 0
    for t in ls.trips:
        copies = [by.get((f"{pipeline}@{w}", t.name), {}) for w in (NONE, ORACLE, EVERY)]
        ids = sorted(set(copies[0]).intersection(*copies[1:]))
        if not ids or t.handover_starts is None or t.handover_failures is None:
            left_out += 1
            continue
        none, oracle, every = (c[ids[0]] for c in copies)
        holds = [_holds(t.schemes.get(f"{pipeline}@{w}")) for w in (ORACLE, EVERY)]
        sn, so, se = (stall_seconds(b.rec.progress) for b in (none, oracle, every))
        stalls = (sn, so, se) if sn is not None and so is not None and se is not None else None
        lo, hi = none.rec.start_ms, none.rec.end_ms
        starts = sum(1 for x in t.handover_starts if lo <= x < hi)
        failed = sum(1 for f in t.handover_failures if lo <= f.t_ms < hi)
        out.append(
            TripCosts(
                trip=t.name,
                none_bytes=none.rec.bytes,
                oracle_bytes=oracle.rec.bytes,
                every_bytes=every.rec.bytes,
                failed=failed,
                succeeded=starts - failed,
                window_ms=hi - lo,
                oracle_holds=holds[0],
                every_holds=holds[1],
                stalls_s=stalls,
            )
        )
    return out, left_out


def stall_seconds(
    progress: Sequence[tuple[float, float]] | None, min_ms: float = STALL_MIN_MS
) -> float | None:
    """Seconds the download received nothing, summed over gaps of at least ``min_ms``
    between progress samples with the same byte count, from its first byte on (None
    without samples)."""
    if not progress:
        return None
    first = next((i for i, (_, b) in enumerate(progress) if b > 0), None)
    if first is None:
        return None
    total = 0.0
    gap_start = None
    for (t0, b0), (_, b1) in zip(progress[first:], progress[first + 1 :], strict=False):
        if b1 == b0:
            gap_start = t0 if gap_start is None else gap_start
            continue
        if gap_start is not None and t0 - gap_start >= min_ms:
            total += t0 - gap_start
        gap_start = None
    if gap_start is not None and progress[-1][0] - gap_start >= min_ms:
        total += progress[-1][0] - gap_start
    return total / 1000


def _holds(sr: SchemeRun | None) -> tuple[float, int] | None:
    """(held seconds, holds begun) of hof-reject in the proxy's end-of-trip snapshot."""
    ev = schedulerlet_events(sr.proxy_metrics if sr is not None else None)
    if ev is None or "hof-reject/held_ms" not in ev or "hof-reject/rejections" not in ev:
        return None
    return ev["hof-reject/held_ms"] / 1000, int(ev["hof-reject/rejections"])


def _held(trips: Sequence[TripCosts], idx: Sequence[int]) -> float:
    """Bytes each second P@every held beyond P@oracle cost, over the trips with both
    snapshots (NaN without such trips or extra held time)."""
    held_bytes = extra_s = 0.0
    for i in idx:
        t = trips[i]
        if t.oracle_holds is None or t.every_holds is None:
            continue
        held_bytes += t.oracle_bytes - t.every_bytes
        extra_s += t.every_holds[0] - t.oracle_holds[0]
    return held_bytes / extra_s if extra_s > 0 else math.nan


def _mean_hold(trips: Sequence[TripCosts], which: str) -> float | None:
    hs = [h for t in trips if (h := t.oracle_holds if which == ORACLE else t.every_holds)]
    n = sum(h[1] for h in hs)
    return sum(h[0] for h in hs) / n if n else None


def _sums(trips: Sequence[TripCosts], idx: Sequence[int]) -> tuple[float, float, float, float]:
    """(saved, held, failed, succeeded) in bytes over the trips ``idx``."""
    saved = float(sum(trips[i].oracle_bytes - trips[i].none_bytes for i in idx))
    held = float(sum(trips[i].oracle_bytes - trips[i].every_bytes for i in idx))
    failed = float(sum(trips[i].failed for i in idx))
    succeeded = float(sum(trips[i].succeeded for i in idx))
    return saved, held, failed, succeeded


def _stall_sums(
    trips: Sequence[TripCosts], idx: Sequence[int]
) -> tuple[float, float, float, float]:
    """(saved, held, failed, succeeded) in stall seconds over the trips ``idx`` with
    progress in all three copies."""
    saved = held = failed = succeeded = 0.0
    for i in idx:
        t = trips[i]
        if t.stalls_s is None:
            continue
        none, oracle, every = t.stalls_s
        saved += none - oracle
        held += every - oracle
        failed += t.failed
        succeeded += t.succeeded
    return saved, held, failed, succeeded


def _rule(saved: float, held: float, failed: float, succeeded: float) -> list[float]:
    """[C_fail, C_hold, p*] of summed savings, holding costs and events (NaN without
    events)."""
    c_fail = saved / failed if failed else math.nan
    c_hold = held / succeeded if succeeded else math.nan
    p = threshold(c_fail, c_hold) if failed and succeeded else math.nan
    return [c_fail, c_hold, p]


def threshold(c_fail: float, c_hold: float) -> float:
    """p* = C_hold / (C_fail + C_hold), 1 when a caught failure saves nothing, 0 when a hold
    costs nothing (and C_fail is positive)."""
    if not c_fail > 0:
        return 1.0
    if not c_hold > 0:
        return 0.0
    return c_hold / (c_fail + c_hold)


def _statistic(trips: Sequence[TripCosts], idx: Sequence[int]) -> np.ndarray:
    """[C_fail, C_hold, p*] in bytes, the cost of a held second, and [C_fail, C_hold, p*]
    in stall seconds."""
    return np.array(
        [*_rule(*_sums(trips, idx)), _held(trips, idx), *_rule(*_stall_sums(trips, idx))]
    )


def _ratio(p: float | None) -> float | None:
    """r = 1/p* − 1: None (unbounded) at p* = 0."""
    if p is None or p <= 0:
        return None
    return 1 / p - 1


def costs_of(trips: Sequence[TripCosts]) -> dict[str, Any]:
    """C_fail, C_hold, p* and r of the trips, with intervals over trips."""
    idx = range(len(trips))
    saved, held, failed, succeeded = _sums(trips, idx)
    c_fail, c_hold, p, per_held_s, st_fail, st_hold, st_p = (
        float(v) for v in _statistic(trips, idx)
    )
    ci = cluster_bootstrap_ci(len(trips), lambda k: _statistic(trips, k))
    none_bytes = sum(t.none_bytes for t in trips)
    window_s = sum(t.window_ms for t in trips) / 1000
    rate = none_bytes / window_s if window_s > 0 else math.nan  # bytes/s of P@none

    def mb(x: float) -> float | None:
        return finite_or_none(x / 1e6)

    def seconds(x: float) -> float | None:
        return finite_or_none(x / rate) if rate > 0 else None

    p_ci = [finite_or_none(float(ci[2][0])), finite_or_none(float(ci[2][1]))]
    st_ci = [finite_or_none(float(ci[6][0])), finite_or_none(float(ci[6][1]))]
    return {
        "trips": len(trips),
        "failed": int(failed),
        "succeeded": int(succeeded),
        "none_goodput_mbps": finite_or_none(rate * 8 / 1e6),
        "saved_per_failure_mb": mb(c_fail),
        "saved_per_failure_mb_ci95": [mb(float(ci[0][0])), mb(float(ci[0][1]))],
        "saved_per_failure_s": seconds(c_fail),
        "cost_per_hold_mb": mb(c_hold),
        "cost_per_hold_mb_ci95": [mb(float(ci[1][0])), mb(float(ci[1][1]))],
        "cost_per_hold_s": seconds(c_hold),
        "threshold_p": finite_or_none(p),
        "threshold_p_ci95": p_ci,
        "cost_ratio": _ratio(finite_or_none(p)),
        # p* and r move in opposite directions: r's lower bound is p*'s upper.
        "cost_ratio_ci95": [_ratio(p_ci[1]), _ratio(p_ci[0])],
        "cost_per_held_second_mb": mb(per_held_s),
        "cost_per_held_second_mb_ci95": [mb(float(ci[3][0])), mb(float(ci[3][1]))],
        "mean_hold_s": {w: _mean_hold(trips, w) for w in (ORACLE, EVERY)},
        "trips_with_holds": sum(1 for t in trips if t.oracle_holds and t.every_holds),
        "stall_min_ms": STALL_MIN_MS,
        "trips_with_stalls": sum(1 for t in trips if t.stalls_s is not None),
        "stall_saved_per_failure_s": finite_or_none(st_fail),
        "stall_saved_per_failure_s_ci95": [finite_or_none(float(x)) for x in ci[4]],
        "stall_cost_per_hold_s": finite_or_none(st_hold),
        "stall_cost_per_hold_s_ci95": [finite_or_none(float(x)) for x in ci[5]],
        "stall_threshold_p": finite_or_none(st_p),
        "stall_threshold_p_ci95": st_ci,
        "stall_cost_ratio": _ratio(finite_or_none(st_p)),
        "stall_cost_ratio_ci95": [_ratio(st_ci[1]), _ratio(st_ci[0])],
        "saved_bytes": int(saved),
        "held_bytes": int(held),
        "per_trip": [
            {
                "trip": t.trip,
                "failed": t.failed,
                "succeeded": t.succeeded,
                "none_mb": t.none_bytes / 1e6,
                "oracle_mb": t.oracle_bytes / 1e6,
                "every_mb": t.every_bytes / 1e6,
                "stalls_s": list(t.stalls_s) if t.stalls_s else None,
            }
            for t in trips
        ],
    }


def handover_costs(
    ls: LinkSetRun, backlogs: Sequence[BacklogRun], schemes: Sequence[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """(section, note): per pipeline run as NAME@none/@oracle/@every, :func:`costs_of` over
    its trips. (None, None) when no pipeline ran as the three; (None, reason) when one did
    but no trip has all three backlog records and its handovers."""
    ps = pipelines(schemes)
    out: dict[str, Any] = {}
    for p in ps:
        trips, left_out = trip_costs(ls, backlogs, p)
        if trips:
            out[p] = {**costs_of(trips), "trips_left_out": left_out}
    if not out:
        return None, NOTE if ps else None
    return out, None
