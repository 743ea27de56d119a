"""Ablation of the head-of-line schedulerlets (``crates/core/src/sched/hol.rs``).

Each composition in :data:`HOL` adds one or all of ``stale-filter``, ``opp-reinject`` and
``penalise`` to a base pipeline (minrtt or hrsch). Its gain is measured against *that base*,
paired, in the two phases where a blocked window head costs goodput:

* bulk downloads (all sizes pooled): geometric mean over downloads paired by trip and id of
  goodput_scheme / goodput_base, 95 % percentile bootstrap CI;
* the backlogged download: the same over backlog records paired by trip and id (one per trip,
  so its interval is wide with few trips).

A gain whose interval contains 0 is reported as "not resolved", never as a gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polycorn_bench.flows import (
    BacklogRun,
    Flow,
    Paired,
    paired_goodputs,
    paired_ratios_by_trip,
)
from polycorn_bench.hrsch import verdict_interval
from polycorn_bench.stats import bootstrap_geomean_ci, finite_or_none, geomean, trip_interval

#: composition -> (base pipeline, schedulerlets it adds).
HOL: Mapping[str, tuple[str, str]] = {
    "minrtt+stale": ("minrtt", "stale-filter"),
    "minrtt+opp": ("minrtt", "opp-reinject"),
    "minrtt+pen": ("minrtt", "penalise"),
    "minrtt+hol": ("minrtt", "stale-filter + opp-reinject + penalise"),
    "hrsch+hol": ("hrsch", "stale-filter + opp-reinject + penalise"),
    "hrsch+stale": ("hrsch", "stale-filter"),
    "hrsch+": ("hrsch+stale", "tail-filter (for tail-reject) + tail-reinject"),
}

METHODS = {
    "hol_ablation": (
        "Per head-of-line composition (crates/core/src/sched/hol.rs) against its base pipeline: "
        "gain = geometric mean of paired goodput ratios scheme/base - 1 with a 95 % bootstrap "
        "CI of the pairs (ci95) and, for bulk, of the trips (ci95_trips: trips resampled, "
        "the between-trip variation included), for bulk downloads (all sizes, paired by trip "
        "and id) and for the backlogged download (paired by trip); 'resolved' when the "
        "interval named by verdict_interval excludes 0 (the trips' from 10 trips on)."
    ),
}


def _minus_one(ci: Sequence[float | None] | None) -> list[float] | None:
    if ci is None or None in ci:
        return None
    return [float(ci[0]) - 1, float(ci[1]) - 1]  # type: ignore[arg-type]


def _gain(ratios: list[float], by_trip: list[list[float]] | None = None) -> dict[str, Any]:
    """Gain with the pairs' interval, and the trips' when ``by_trip`` groups the same ratios."""
    if not ratios:
        return {"n_pairs": 0, "gain": None, "ci95": None, "resolved": None}
    arr = np.asarray(ratios)
    lo, hi = bootstrap_geomean_ci(arr)
    g = finite_or_none(geomean(arr))
    out: dict[str, Any] = {
        "n_pairs": len(ratios),
        "gain": None if g is None else g - 1,
        "ci95": _minus_one([finite_or_none(lo), finite_or_none(hi)]),
    }
    if by_trip is not None:
        t = trip_interval(by_trip)
        out["n_trips"] = t["n_trips"]
        out["ci95_trips"] = _minus_one(t["ci95_trips"])
    # From 10 trips on the trips' interval, as hrsch's verdicts.
    out["verdict_interval"] = verdict_interval(out)
    ci_gain = out[out["verdict_interval"]]
    out["resolved"] = (
        None if ci_gain is None or len(ratios) < 2 else (ci_gain[0] > 0 or ci_gain[1] < 0)
    )
    return out


def _ratios(records: Sequence[Paired], scheme: str, base: str) -> list[float]:
    """goodput_scheme / goodput_base over the records paired by trip and id."""
    pairs = paired_goodputs(
        (r for r in records if r.scheme == scheme), (r for r in records if r.scheme == base)
    )
    return [g / ref for g, ref in pairs]


def gains_over(
    flows: list[Flow], backlogs: list[BacklogRun], scheme: str, base: str
) -> dict[str, Any]:
    """``scheme``'s gain over ``base``: ``bulk`` (downloads paired by trip and id, with the
    trips' interval) and ``backlog`` (records paired by trip and id)."""
    return {
        "bulk": _gain(
            _ratios(flows, scheme, base),
            paired_ratios_by_trip(
                (f for f in flows if f.scheme == scheme), (f for f in flows if f.scheme == base)
            ),
        ),
        "backlog": _gain(_ratios(backlogs, scheme, base)),
    }


def hol_ablation(
    flows: list[Flow], backlogs: list[BacklogRun], schemes: list[str]
) -> dict[str, Any] | None:
    """Gain of each head-of-line composition that ran over its base; None when none ran."""
    out: dict[str, Any] = {}
    for scheme, (base, adds) in HOL.items():
        if scheme not in schemes or base not in schemes:
            continue
        out[scheme] = {"base": base, "adds": adds, **gains_over(flows, backlogs, scheme, base)}
    return out or None
