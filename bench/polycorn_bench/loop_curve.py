"""The closed loop's learning curve over many trips: shares with binomial intervals, curves
pooled over trips, and the trip from which the learned table has half of the oracle's gain.

:mod:`polycorn_bench.loop` reads the run and hands each trip over as a :class:`TripSample`
(failure counts of the tables, and the paired samples behind the recovery and goodput
ratios); this module pools them:

* per trip and pooled, the share of failures in cells of a table and the share the table
  had "correct" (paper §3 with HPR's lead), with Wilson 95 % intervals;
* pooled, each variant's recovery after failed handovers against ``minrtt`` (ratio of
  means over the pooled windows, 95 % bootstrap CI: the numbers
  :func:`polycorn_bench.hrsch.hof_recovery` gives on the same trips);
* the **gain** of a variant: its ratio to ``minrtt`` minus ``hrsch-none``'s, over the
  failure windows (or downloads) that all three hrsch variants have, and the test
  ``gain_learned − gain_oracle / 2 ≥ 0`` with a bootstrap interval;
* two running curves: cumulative (trips 1..k) and a trailing window (the last ``window``
  trips up to k).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench.records import Issues, finite, read_jsonl
from polycorn_bench.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_ratio_of_means_ci,
    finite_or_none,
)

LEARNED = "hrsch-learned"
NONE = "hrsch-none"
TRUTH = "hrsch-truth"
VARIANTS = (LEARNED, NONE, TRUTH)
#: Tables whose failure shares are counted (no table: 0 by definition).
TABLES = {"learned": LEARNED, "oracle": TRUTH}
#: The recovery fields of a trip or pooled entry, per variant.
HOF_FIELD = {
    LEARNED: "hof_recovery_learned",
    TRUTH: "hof_recovery_oracle",
    NONE: "hof_recovery_none",
}

#: Paper §3's window for a correct failure prediction, Δ = t_HO − t̂_HOF in [T1, T2] ...
T1_S = 0.0
T2_S = 2.5
#: ... moved by HPR's lead (PC §4.3: RTT 0.2 s + E_GPS / V = 20 m / 83 m/s), as the trainer's
#: ``validation.with_lead`` (docs/trainer.md): correct for Δ in [T1 − lead, T2 − lead].
LEAD_S = 0.44
#: The train's speed at a handover: its last GPS fix at or before the handover start, no
#: older than this; otherwise (or at a standstill) the nominal 300 km/h, counted as a fallback.
SPEED_MAX_AGE_MS = 10_000.0
MIN_SPEED_MPS = 0.5
NOMINAL_SPEED_MPS = 83.3
#: Trips of the trailing window of the running curve.
WINDOW_TRIPS = 8
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> list[float] | None:
    """Wilson score interval (95 %) of a binomial share k / n; None for n = 0."""
    if n <= 0:
        return None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def share(k: int | None, n: int | None) -> tuple[float | None, list[float] | None]:
    """(k / n, its Wilson interval); (None, None) without a count or without failures."""
    if k is None or n is None or n <= 0:
        return None, None
    return k / n, wilson(k, n)


@dataclass(frozen=True)
class Fixes:
    """The GPS fixes of a trip's event log: time (ms, sorted) and speed (m/s)."""

    t_ms: tuple[float, ...]
    speed_mps: tuple[float, ...]

    def speed_at(self, t_ms: float) -> float | None:
        """Speed of the last fix at or before ``t_ms`` (at most SPEED_MAX_AGE_MS old and
        above MIN_SPEED_MPS), else None."""
        i = bisect.bisect_right(self.t_ms, t_ms) - 1
        if i < 0 or t_ms - self.t_ms[i] > SPEED_MAX_AGE_MS:
            return None
        v = self.speed_mps[i]
        return v if v > MIN_SPEED_MPS else None


def read_fixes(path: Path) -> Fixes | None:
    """The ``gps`` events of ``events.jsonl``; None without the file. (Unreadable lines are
    already counted when the run's handovers are read.)"""
    if not path.exists():
        return None
    rows: list[tuple[float, float]] = []
    for obj in read_jsonl(path, Issues()):
        if obj.get("event") != "gps":
            continue
        t, v = finite(obj.get("t_ms")), finite(obj.get("speed_mps"))
        if t is not None and v is not None:
            rows.append((t, v))
    rows.sort()
    return Fixes(tuple(t for t, _ in rows), tuple(v for _, v in rows))


#: One paired sample: (variant's value, minrtt's value) under a key that is the same for the
#: same failure window (or download) in every variant.
Pairs = dict[Any, tuple[float, float]]


@dataclass
class TripSample:
    """What the running curve needs of one trip."""

    trip: int
    #: Failed handovers of the trip; None without an event log.
    failures: int | None
    #: Per table name ("learned", "oracle"): failures in the table's cells, and failures the
    #: table had correct; None where it cannot be known (table file or event log missing).
    known: dict[str, int | None] = field(default_factory=dict)
    correct: dict[str, int | None] = field(default_factory=dict)
    #: Per variant: recovery windows (goodput in the 2 s after a failure, and minrtt's).
    hof: dict[str, Pairs] = field(default_factory=dict)
    #: Per variant: bulk downloads (goodput, and minrtt's on the same download).
    goodput: dict[str, Pairs] = field(default_factory=dict)


def ratio_of_means(pairs: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """mean(variant) / mean(minrtt) with its 95 % bootstrap CI, as ``hrsch.hof_recovery``."""
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    if not pairs:
        return {"ratio": None, "ci95": None, "n": 0}
    mb = float(np.mean(b))
    lo, hi = bootstrap_ratio_of_means_ci(a, b)
    return {
        "ratio": float(np.mean(a)) / mb if mb != 0 else None,
        "ci95": [finite_or_none(lo), finite_or_none(hi)],
        "n": len(pairs),
    }


#: How the gain is measured for each kind of sample.
GAIN_KINDS = {
    "hof_recovery": "ratio of means to minrtt over the failure windows",
    "goodput": "geometric mean of the paired ratios to minrtt over the bulk downloads",
}


def _ratio_rows(values: np.ndarray, ref: np.ndarray, kind: str) -> np.ndarray:
    """The ratio to minrtt of each row of resampled ``values`` (shape (R, n))."""
    if kind == "hof_recovery":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(values.mean(axis=1) / ref.mean(axis=1), dtype=np.float64)
    return np.asarray(np.exp(np.log(values / ref).mean(axis=1)), dtype=np.float64)


def gain_test(
    samples: dict[str, Pairs],
    kind: str,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """The gains over no table, on the keys all three hrsch variants have.

    gain(v) = ratio(v) − ratio(hrsch-none), ratio = the variant's ratio to minrtt
    (``kind``: "hof_recovery", ratio of means; "goodput", geometric mean of the ratios).
    ``half_oracle_excess`` = gain(learned) − gain(oracle) / 2: ≥ 0 when the learned table has
    at least half of the oracle's gain. 95 % percentile bootstrap CIs of the excess and of the
    oracle's gain resample the keys (all variants of a key together); none with fewer than 2
    keys."""
    learned, none, truth = (samples.get(v, {}) for v in VARIANTS)
    keys = [k for k in learned if k in none and k in truth]
    if kind == "goodput":
        keys = [k for k in keys if min(*learned[k], *none[k], *truth[k]) > 0]
    n = len(keys)
    empty: dict[str, Any] = {
        "n": n,
        "learned": None,
        "oracle": None,
        "half_oracle_excess": None,
        "half_oracle_excess_ci95": None,
        "oracle_ci95": None,
        "learned_share_of_oracle": None,
    }
    if n == 0:
        return empty
    ref = np.array([learned[k][1] for k in keys])
    vals = {
        LEARNED: np.array([learned[k][0] for k in keys]),
        NONE: np.array([none[k][0] for k in keys]),
        TRUTH: np.array([truth[k][0] for k in keys]),
    }
    whole = {v: float(_ratio_rows(a[None, :], ref[None, :], kind)[0]) for v, a in vals.items()}
    g_l, g_t = whole[LEARNED] - whole[NONE], whole[TRUTH] - whole[NONE]
    out = dict(empty)
    out.update(
        {
            "learned": finite_or_none(g_l),
            "oracle": finite_or_none(g_t),
            "half_oracle_excess": finite_or_none(g_l - g_t / 2),
            "learned_share_of_oracle": finite_or_none(g_l / g_t) if g_t > 0 else None,
        }
    )
    if n < 2:
        return out
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    r = {v: _ratio_rows(a[idx], ref[idx], kind) for v, a in vals.items()}
    oracle = r[TRUTH] - r[NONE]
    excess = r[LEARNED] - r[NONE] - oracle / 2
    ok = np.isfinite(excess) & np.isfinite(oracle)
    if ok.any():
        out["half_oracle_excess_ci95"] = [float(q) for q in np.quantile(excess[ok], [0.025, 0.975])]
        out["oracle_ci95"] = [float(q) for q in np.quantile(oracle[ok], [0.025, 0.975])]
    return out


def reached(gain: dict[str, Any]) -> tuple[bool, bool]:
    """(point estimate, lower bound) of "the learned table has half of the oracle's gain":
    the oracle gains (point > 0; the lower bound of its interval > 0) and the excess is ≥ 0
    (point; the lower bound of its interval)."""
    g_t, e = gain.get("oracle"), gain.get("half_oracle_excess")
    point = g_t is not None and e is not None and g_t > 0 and e >= 0
    ci_e, ci_t = gain.get("half_oracle_excess_ci95"), gain.get("oracle_ci95")
    lower = (
        ci_e is not None
        and ci_t is not None
        and ci_e[0] is not None
        and ci_t[0] is not None
        and ci_e[0] >= 0
        and ci_t[0] > 0
    )
    return point, lower


def pooled(samples: Sequence[TripSample]) -> dict[str, Any]:
    """The trips' numbers pooled: shares over all their failures, ratios over all their
    windows (or downloads)."""
    out: dict[str, Any] = {
        "trip": samples[-1].trip,
        "from_trip": samples[0].trip,
        "failures": sum(s.failures for s in samples if s.failures is not None),
    }
    for name in TABLES:
        for what in ("known", "correct"):
            got: list[tuple[int, int]] = []
            for s in samples:
                k_s = (s.known if what == "known" else s.correct).get(name)
                if k_s is not None and s.failures is not None:
                    got.append((k_s, s.failures))
            x, ci = share(sum(k for k, _ in got), sum(n for _, n in got)) if got else (None, None)
            field_name = "known_failure_share" if what == "known" else "correct_share"
            out[f"{name}_{field_name}"] = x
            out[f"{name}_{field_name}_ci95"] = ci
    for v in VARIANTS:
        r = ratio_of_means([p for s in samples for p in s.hof.get(v, {}).values()])
        out[HOF_FIELD[v]] = r["ratio"]
        out[f"{HOF_FIELD[v]}_ci95"] = r["ci95"]
        out[f"{HOF_FIELD[v]}_n"] = r["n"]
    for kind, attr in (("hof_recovery", "hof"), ("goodput", "goodput")):
        merged: dict[str, Pairs] = {v: {} for v in VARIANTS}
        for s in samples:
            for v in VARIANTS:
                merged[v].update(getattr(s, attr).get(v, {}))
        out[f"{kind}_gain"] = gain_test(merged, kind)
    return out


def running(samples: Sequence[TripSample], window: int = WINDOW_TRIPS) -> dict[str, Any]:
    """Pooled over trips 1..k (``cumulative``) and over the last ``window`` trips up to k
    (``window``), for every k."""
    n = len(samples)
    return {
        "window_trips": window,
        "cumulative": [pooled(samples[:k]) for k in range(1, n + 1)],
        "window": [pooled(samples[max(0, k - window) : k]) for k in range(1, n + 1)],
    }


def _from_on(flags: Sequence[bool], trips: Sequence[int]) -> int | None:
    """The first trip from which every flag holds to the last; None if the last fails."""
    first = None
    for flag, trip in zip(flags, trips, strict=True):
        if not flag:
            first = None
        elif first is None:
            first = trip
    return first


HALF_GAIN_DEFINITION = (
    "gain of a variant = its ratio to minrtt minus hrsch-none's, on the same failure "
    "windows (hof_recovery: ratio of means of the goodput in the 2 s after each failed "
    "handover) or bulk downloads (goodput: geometric mean of the paired ratios), pooled over "
    "the trips of the curve (cumulative: 1..k; window: the last window_trips up to k), on the "
    "windows or downloads all three hrsch variants have. The learned table has half of the "
    "oracle's gain at k when gain_learned − gain_oracle/2 ≥ 0 and gain_oracle > 0. "
    "point: the first k from which the point estimates meet this on every later k; "
    "lower_bound: the same with the lower ends of the 95 % bootstrap intervals (of the "
    "excess, and of the oracle's gain); first_point: the first k where the point estimates "
    "meet it at all. null: not reached (or not kept) by the last trip."
)
HALF_GAIN_CAVEAT = (
    "a trip has a handful of failed handovers and fewer recovery windows, so the pooled "
    "gains are noisy and the windows of one trip are not independent (same failure, same "
    "link realisation); the bootstrap resamples windows, not trips. A k close to the last "
    "trip is not a stable result."
)


def half_oracle_gain(curves: dict[str, Any]) -> dict[str, Any]:
    """``half_oracle_gain_trip``: per kind of gain and curve, the trips from which the
    learned table has half of the oracle's gain."""
    out: dict[str, Any] = {
        "definition": HALF_GAIN_DEFINITION,
        "caveat": HALF_GAIN_CAVEAT,
        "window_trips": curves.get("window_trips"),
    }
    for kind in GAIN_KINDS:
        per: dict[str, Any] = {}
        for curve in ("cumulative", "window"):
            rows = curves.get(curve) or []
            trips = [r["trip"] for r in rows]
            flags = [reached(r[f"{kind}_gain"]) for r in rows]
            last = rows[-1][f"{kind}_gain"] if rows else {}
            per[curve] = {
                "point": _from_on([p for p, _ in flags], trips),
                "lower_bound": _from_on([lo for _, lo in flags], trips),
                "first_point": next((t for t, (p, _) in zip(trips, flags, strict=True) if p), None),
                "at_last_trip": {
                    k: last.get(k)
                    for k in (
                        "learned",
                        "oracle",
                        "learned_share_of_oracle",
                        "half_oracle_excess",
                        "half_oracle_excess_ci95",
                        "n",
                    )
                },
            }
        out[kind] = per
    return out
