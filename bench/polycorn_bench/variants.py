"""Variants of HRSCH and of the default pipeline, each measured against the composition it
differs from.

Two kinds, both in ``testbed/pipelines.toml``:

* **Leave one out**: ``hrsch-no-<mechanism>`` is hrsch without one of its four mechanisms;
  the mechanism's contribution *inside* hrsch is hrsch's gain over it (the ablation of
  ``hrsch.ABLATION`` adds each mechanism to minrtt alone instead).
* **Stale-pipeline variants**: ``hrsch+stale-<...>`` changes one parameter of ``hrsch+stale``
  (the default pipeline until ``hrsch+``: the stale threshold, or tail-aware rejection for
  burst ends); its gain is over ``hrsch+stale``.
* **Failure table and HPR lead**: ``hrsch@oracle`` is hrsch with the measured trip's own
  failures as its table (polycorn_benchrun.hsr: a scheme ``NAME@oracle``), ``hrsch@broad``
  with the trainer's table at lower thresholds, ``hrsch@early`` with the trainer placing each
  cell's failure at the 10th percentile of its failures (runs before 2026-11-27, when the
  learned table used the mean), ``hrsch@mean`` at their mean (the paper's rule; since then),
  each against the learned table;
  ``hrsch+lead100`` the default pipeline with ``hof-reject``'s E_GPS at 100 m.
* **Congestion control**: ``NAME~cubic`` is pipeline NAME with CUBIC on its subflows
  (polycorn_benchrun.hsr: relay and proxy ``--subflow-cc``) against NAME with the default,
  BBR, in the same run; ``direct-c<k>~cubic`` the same for the passenger's own TCP without
  the tunnel (CUBIC at passenger and origin against BBR).
* **Tail rules** (not in the paper): ``tail-filter`` in place of ``tail-reject``,
  with or without ``tail-reinject``, on ``hrsch+stale``, ``hrsch+hol`` or ``minrtt``; the
  gain is over the pipeline without them.

Each gain is paired like the head-of-line ablation (``hol``): bulk downloads by trip and id
(pairs' and trips' intervals, "resolved" from the interval ``verdict_interval`` names), the
backlogged download by trip; and for chat, the relative change of the mean and p90 delivery
time and of the CoV against the base, averaged over the user counts, with an interval that
resamples trips (``hrsch.im_trip_intervals``; lower is better there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polycorn_bench import hrsch
from polycorn_bench.flows import REFERENCE, BacklogRun, Flow
from polycorn_bench.hol import gains_over
from polycorn_bench.records import LinkSetRun
from polycorn_bench.stats import bootstrap_ratio_of_means_ci

#: The default pipeline before ``hrsch+``: the base of its parameter variants.
STALE = "hrsch+stale"
#: variant -> (scheme, base, what the gain measures): gain = scheme / base.
VARIANTS: Mapping[str, tuple[str, str, str]] = {
    "hrsch-no-hpr": (hrsch.HRSCH, "hrsch-no-hpr", "HPR inside hrsch"),
    "hrsch-no-tpr": (hrsch.HRSCH, "hrsch-no-tpr", "TPR inside hrsch"),
    "hrsch-no-ori": (hrsch.HRSCH, "hrsch-no-ori", "ORI inside hrsch"),
    "hrsch-no-er": (hrsch.HRSCH, "hrsch-no-er", "ER inside hrsch"),
    "hrsch+stale-150": ("hrsch+stale-150", STALE, "stale after 150 ms (not 300)"),
    "hrsch+stale-600": ("hrsch+stale-600", STALE, "stale after 600 ms (not 300)"),
    "hrsch+stale-f4": ("hrsch+stale-f4", STALE, "stale after 4 SRTT (not 2)"),
    "hrsch+stale-bursts": (
        "hrsch+stale-bursts",
        STALE,
        "tail-aware rejection for burst ends",
    ),
    "hrsch+bursts": ("hrsch+bursts", "hrsch+", "tail-filter for burst ends"),
    "hrsch+stale-strict": ("hrsch+stale-strict", STALE, "tail-reject without 1 + rttvar/srtt"),
    "hrsch+stale+tf": ("hrsch+stale+tf", STALE, "the tail rule before minrtt (tail-filter)"),
    "hrsch+stale+tail": ("hrsch+stale+tail", STALE, "tail-filter and tail-reinject"),
    "hrsch+hol+tail": ("hrsch+hol+tail", "hrsch+hol", "tail-filter and tail-reinject"),
    "minrtt+tail": ("minrtt+tail", "minrtt", "tail-reinject"),
    "hrsch+lead100": ("hrsch+lead100", "hrsch+", "HPR's lead from E_GPS 100 m (not 20 m)"),
    "hrsch+pen": ("hrsch+pen", "hrsch+", "penalise on the default pipeline"),
    "hrsch+ with hol": (
        "hrsch+hol+tail",
        "hrsch+",
        "opp-reinject and penalise on the default pipeline",
    ),
    "minrtt~cubic": ("minrtt~cubic", "minrtt", "CUBIC on the subflows (not BBR)"),
    "hrsch+~cubic": ("hrsch+~cubic", "hrsch+", "CUBIC on the subflows (not BBR)"),
    "direct-c0~cubic": ("direct-c0~cubic", "direct-c0", "CUBIC at passenger and origin (not BBR)"),
    "direct-c1~cubic": ("direct-c1~cubic", "direct-c1", "CUBIC at passenger and origin (not BBR)"),
    "hrsch@oracle": ("hrsch@oracle", hrsch.HRSCH, "the trip's oracle failure table (not learned)"),
    "hrsch@broad": ("hrsch@broad", hrsch.HRSCH, "the table at 2 failures and 10 % (not 3, 20 %)"),
    "hrsch@early": (
        "hrsch@early",
        hrsch.HRSCH,
        "failures placed at their 10th percentile (not mean)",
    ),
    # Since 2026-11-27 the trainer's default is the 10th percentile: the
    # run's own table is the early one and this variant is the paper's mean.
    "hrsch@mean": (
        "hrsch@mean",
        hrsch.HRSCH,
        "failures placed at their mean, the paper's (not the 10th percentile)",
    ),
}

METHODS = {
    "variants": (
        "Per variant of testbed/pipelines.toml (variants.VARIANTS): scheme, base and the gain "
        "scheme/base - 1 for bulk downloads (paired by trip and id; ci95 of the pairs, "
        "ci95_trips of the trips, resolved from verdict_interval as hol_ablation) and the "
        "backlogged download (paired by trip); recovery: scheme's goodput in the 2 s after "
        "each failed handover over base's on the same windows (hof_recovery's; ratio of means "
        "minus 1, percentile bootstrap over the windows); im: the relative change of scheme's chat "
        "delivery time (mean, p90) and CoV against base, averaged over the user counts, with "
        "an interval resampling trips (negative = faster or fairer). For hrsch-no-<m> the "
        "scheme is hrsch: the gain is mechanism m's contribution inside hrsch."
    ),
}


def recovery_gain(hof: Mapping[str, Any] | None, scheme: str, base: str) -> dict[str, Any] | None:
    """``scheme``'s recovery after failed handovers over ``base``'s, on the windows both have
    (same failure, same download): gain = mean(scheme) / mean(base) - 1 over the paired
    windows of ``hof_recovery`` (``base`` minrtt: each window's own minrtt goodput), with a
    percentile bootstrap over the windows. None when no window pairs."""
    by = (hof or {}).get("by_scheme", {})

    def key(w: Mapping[str, Any]) -> tuple[Any, ...]:
        return (w["trip"], w["t_ms"], w["carrier"], w["source"], w["id"])

    mine = {key(w): w for w in by.get(scheme, {}).get("windows", [])}
    if base == REFERENCE:
        ref = {k: w["minrtt_goodput_mbps"] for k, w in mine.items()}
    else:
        ref = {key(w): w["goodput_mbps"] for w in by.get(base, {}).get("windows", [])}
    keys = sorted(mine.keys() & ref.keys(), key=str)
    a = [float(mine[k]["goodput_mbps"]) for k in keys]
    b = [float(ref[k]) for k in keys]
    if not keys or sum(b) <= 0:
        return None
    lo, hi = bootstrap_ratio_of_means_ci(a, b)
    gain = sum(a) / sum(b) - 1.0
    return {
        "n_windows": len(keys),
        "gain": gain,
        "ci95": [lo - 1.0, hi - 1.0],
        "resolved": bool(lo > 1.0 or hi < 1.0),
    }


def variants(
    flows: list[Flow],
    backlogs: list[BacklogRun],
    schemes: Sequence[str],
    ls: LinkSetRun,
    *,
    im: Mapping[str, Mapping[str, Any]],
    users: Sequence[int],
    hof: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Each variant whose scheme and base both ran; None when none did."""
    out: dict[str, Any] = {}
    for name, (scheme, base, what) in VARIANTS.items():
        if scheme not in schemes or base not in schemes:
            continue
        refs = ((base, "vs_base"),)
        chat = hrsch.im_changes(
            im, hrsch.im_trip_intervals(ls, users, scheme, refs=refs), scheme, refs=refs
        )
        out[name] = {
            "scheme": scheme,
            "base": base,
            "measures": what,
            **gains_over(flows, backlogs, scheme, base),
            "recovery": recovery_gain(hof, scheme, base),
            "im": None
            if chat is None
            else {
                "change": chat["average"]["vs_base"],
                "ci95": chat["average_ci95"]["vs_base"],
                "n_trips": chat["n_trips"],
            },
        }
    return out or None
