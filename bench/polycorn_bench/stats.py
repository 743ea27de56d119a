"""Summary statistics: geometric means of paired ratios with bootstrap CIs, IM delay stats."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from polycorn_bench.links import FloatArray

#: Bootstrap resamples and seed: fixed, so the same input always gives the same CI.
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_240_611
_CHUNK_ELEMENTS = 4_000_000


#: Resamples of the trip-level (cluster) bootstrap; each distinct resample is evaluated once.
CLUSTER_BOOTSTRAP_RESAMPLES = 2_000

#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN/inf: they become ``null``."""
    return x if math.isfinite(x) else None


def ci_halfwidth(ci: Sequence[float | None] | None, n: int | None = None) -> float | None:
    """Half the width of an interval, (hi − lo) / 2, in the units of its bounds (for an
    asymmetric interval, such as a bootstrap interval of a ratio, this is not the distance of
    either bound from the estimate); None without both bounds, or with ``n`` < 2 samples
    behind it (a one-sample bootstrap interval has zero width and says nothing)."""
    if not ci or len(ci) != 2 or (n is not None and n < 2):
        return None
    lo, hi = ci
    if lo is None or hi is None or not math.isfinite(lo) or not math.isfinite(hi):
        return None
    return (hi - lo) / 2


def geomean(values: Sequence[float] | FloatArray) -> float:
    """Geometric mean of positive values (NaN when empty)."""
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a) & (a > 0)]
    if len(a) == 0:
        return math.nan
    return float(np.exp(np.mean(np.log(a))))


def bootstrap_geomean_ci(
    ratios: Sequence[float] | FloatArray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the geometric mean of ``ratios``: resample the ratios (the
    pairs) with replacement ``resamples`` times, take each resample's geometric mean, and
    return the (1−level)/2 and (1+level)/2 quantiles. NaN for no data; a single ratio gives a
    zero-width interval."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    logs = logs[np.isfinite(logs)]
    n = len(logs)
    if n == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, _CHUNK_ELEMENTS // n)
    for lo in range(0, resamples, step):
        hi = min(resamples, lo + step)
        idx = rng.integers(0, n, size=(hi - lo, n))
        means[lo:hi] = logs[idx].mean(axis=1)
    alpha = (1 - level) / 2
    q_lo, q_hi = np.quantile(means, [alpha, 1 - alpha])
    return float(np.exp(q_lo)), float(np.exp(q_hi))


def im_stats(delays_by_user: dict[int, list[float]]) -> tuple[float, float, float, int]:
    """(mean, p90, cov, n) of one group of users sharing a link: mean and 90th percentile
    (linear interpolation) of all delays, and the coefficient of variation of the per-user
    mean delays (population standard deviation / mean; users without a delivered message are
    left out)."""
    all_delays = [d for ds in delays_by_user.values() for d in ds]
    if not all_delays:
        return math.nan, math.nan, math.nan, 0
    a = np.asarray(all_delays, dtype=np.float64)
    per_user = np.asarray([np.mean(ds) for ds in delays_by_user.values() if ds])
    m = float(np.mean(per_user))
    cov = float(np.std(per_user) / m) if m > 0 else math.nan
    return float(np.mean(a)), float(np.percentile(a, 90)), cov, len(a)


def safe_ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return a / b


def _paired_ratio_bootstrap_ci(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    centre: Callable[[FloatArray], FloatArray],
    *,
    resamples: int,
    seed: int,
    level: float,
) -> tuple[float, float]:
    """Percentile bootstrap CI of centre(a) / centre(b) for paired samples: the pairs
    ``(a[i], b[i])`` are resampled together; ``centre`` reduces each resample (rows) to one
    value. NaN for no pairs (or when every resample's ratio is undefined)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    n = len(x)
    if n == 0 or len(y) != n:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    step = max(1, _CHUNK_ELEMENTS // n)
    for lo in range(0, resamples, step):
        hi = min(resamples, lo + step)
        idx = rng.integers(0, n, size=(hi - lo, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[lo:hi] = centre(x[idx]) / centre(y[idx])
    ratios = ratios[np.isfinite(ratios)]
    if len(ratios) == 0:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    q_lo, q_hi = np.quantile(ratios, [alpha, 1 - alpha])
    return float(q_lo), float(q_hi)


def bootstrap_ratio_of_means_ci(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(a) / mean(b) for paired samples: the pairs
    ``(a[i], b[i])`` are resampled together. NaN for no pairs (or resamples where mean(b) is
    0 everywhere)."""
    return _paired_ratio_bootstrap_ci(
        a, b, lambda m: m.mean(axis=1), resamples=resamples, seed=seed, level=level
    )


def bootstrap_ratio_of_medians_ci(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(a) / median(b) for paired samples, as
    :func:`bootstrap_ratio_of_means_ci`. NaN for no pairs."""
    return _paired_ratio_bootstrap_ci(
        a, b, lambda m: np.median(m, axis=1), resamples=resamples, seed=seed, level=level
    )


def _log_groups(groups: Sequence[Sequence[float]]) -> list[FloatArray]:
    """The finite logarithms of each group's ratios, groups without any left out."""
    out = []
    for g in groups:
        x = np.log(np.asarray(g, dtype=np.float64))
        x = x[np.isfinite(x)]
        if len(x):
            out.append(x)
    return out


def trip_interval(groups: Sequence[Sequence[float]]) -> dict[str, Any]:
    """``n_trips`` (groups), ``ci95_trips`` (:func:`trip_geomean_ci`, None without an
    interval) and ``ci95_trips_halfwidth`` of ratios grouped by trip: the fields every paired
    ratio in ``hsr.json`` carries beside its pairs' interval."""
    lo, hi = trip_geomean_ci(groups)
    return {
        "n_trips": len(groups),
        "ci95_trips": [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None,
        "ci95_trips_halfwidth": ci_halfwidth([lo, hi], len(groups)),
    }


def trip_geomean_ci(
    groups: Sequence[Sequence[float]],
    resamples: int = CLUSTER_BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the geometric mean of paired ratios that resamples *trips*
    instead of pairs: ``groups[t]`` holds trip t's ratios; each of ``resamples`` resamples
    draws as many trips as have ratios, with replacement, and takes the geometric mean of all
    their ratios pooled (a trip drawn twice counts twice). The pairs of one trip share its
    links, so they are not independent: this interval carries the between-trip variation that
    :func:`bootstrap_geomean_ci` (pairs independent) leaves out. NaN with fewer than two trips
    with ratios."""
    logs = _log_groups(groups)
    n = len(logs)
    if n < 2:
        return math.nan, math.nan
    s = np.asarray([x.sum() for x in logs])
    c = np.asarray([len(x) for x in logs], dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    means = s[idx].sum(axis=1) / c[idx].sum(axis=1)
    alpha = (1 - level) / 2
    q_lo, q_hi = np.quantile(means, [alpha, 1 - alpha])
    return float(np.exp(q_lo)), float(np.exp(q_hi))


def log_variance_components(
    groups: Sequence[Sequence[float]], ratio: float | None = None, halfwidth: float = 0.05
) -> dict[str, Any] | None:
    """One-way analysis of variance of the log ratios grouped by trip (``groups[t]``: trip t's
    ratios): the between-trip variance ``between`` (σ_b², method of moments, unequal group
    sizes: (MSB − MSW) / m₀ with m₀ = (N − Σ nᵢ²/N) / (k − 1), floored at 0) and the
    within-trip variance ``within`` (σ_w² = MSW), ``trips``, ``pairs``, ``pairs_per_trip``
    (N / k), and ``trips_for_halfwidth``: the trips an interval that resamples trips needs for
    a half-width of ``halfwidth`` (in ratio units, around ``ratio``, default the geometric
    mean) with this many pairs per trip, ⌈(1.96 · ratio / halfwidth)² · (σ_b² + σ_w² / m)⌉.
    None with fewer than 2 trips with ratios or no within-trip replication."""
    logs = _log_groups(groups)
    k = len(logs)
    n_tot = sum(len(x) for x in logs)
    if k < 2 or n_tot <= k:
        return None
    grand = float(np.concatenate(logs).mean())
    msb = sum(len(x) * (float(x.mean()) - grand) ** 2 for x in logs) / (k - 1)
    msw = sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / (n_tot - k)
    m0 = (n_tot - sum(len(x) ** 2 for x in logs) / n_tot) / (k - 1)
    between = max(0.0, (msb - msw) / m0)
    m = n_tot / k
    r = math.exp(grand) if ratio is None else ratio
    need = (Z95 * r / halfwidth) ** 2 * (between + msw / m)
    return {
        "between": between,
        "within": msw,
        "trips": k,
        "pairs": n_tot,
        "pairs_per_trip": m,
        "halfwidth": halfwidth,
        "trips_for_halfwidth": math.ceil(need),
    }


def cluster_bootstrap_ci(
    n_clusters: int,
    statistic: Callable[[tuple[int, ...]], FloatArray],
    resamples: int = CLUSTER_BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> FloatArray:
    """Percentile bootstrap over clusters (trips): ``resamples`` times, draw ``n_clusters``
    cluster indices with replacement and evaluate ``statistic`` on them (sorted; a cluster
    drawn twice appears twice). The statistic returns a vector; each distinct resample is
    evaluated once (with five trips there are only 126). Returns an array of shape (k, 2):
    per component the (1−level)/2 and (1+level)/2 quantiles over the resamples where it is
    finite, NaN where there are none or fewer than two clusters."""
    if n_clusters < 2:
        return np.full((len(statistic(tuple(range(n_clusters)))), 2), math.nan)
    rng = np.random.default_rng(seed)
    cache: dict[tuple[int, ...], FloatArray] = {}
    rows = []
    for _ in range(resamples):
        key = tuple(sorted(int(i) for i in rng.integers(0, n_clusters, size=n_clusters)))
        if key not in cache:
            cache[key] = np.asarray(statistic(key), dtype=np.float64)
        rows.append(cache[key])
    values = np.vstack(rows)
    alpha = (1 - level) / 2
    out = np.full((values.shape[1], 2), math.nan)
    for j in range(values.shape[1]):
        col = values[:, j]
        col = col[np.isfinite(col)]
        if len(col):
            out[j] = np.quantile(col, [alpha, 1 - alpha])
    return out


def trip_mean_interval(groups: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The arithmetic mean of values grouped by trip (``groups[t]``: trip t's values, pooled)
    with the interval of :func:`cluster_bootstrap_ci`, which resamples trips: ``mean``,
    ``n_trips`` (groups with a finite value), ``n``, ``ci95_trips`` (None with fewer than two
    trips) and ``ci95_trips_halfwidth``. For shares and other values that may be 0, where the
    geometric mean of :func:`trip_interval` is undefined."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    clean = [x[np.isfinite(x)] for x in arrays if np.isfinite(x).any()]
    n = len(clean)
    if n == 0:
        return {
            "mean": None,
            "n_trips": 0,
            "n": 0,
            "ci95_trips": None,
            "ci95_trips_halfwidth": None,
        }
    sums = np.asarray([x.sum() for x in clean])
    counts = np.asarray([len(x) for x in clean], dtype=np.float64)

    def mean_of(idx: tuple[int, ...]) -> FloatArray:
        i = list(idx)
        return np.asarray([sums[i].sum() / counts[i].sum()])

    lo, hi = cluster_bootstrap_ci(n, mean_of)[0]
    ci = [float(lo), float(hi)] if n >= 2 and math.isfinite(lo) and math.isfinite(hi) else None
    return {
        "mean": float(sums.sum() / counts.sum()),
        "n_trips": n,
        "n": int(counts.sum()),
        "ci95_trips": ci,
        "ci95_trips_halfwidth": ci_halfwidth(ci, n),
    }


def paired_ratio_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Paired comparison of positive values ``a[i]`` against ``b[i]`` (e.g. goodputs of one
    download in two schemes): ``ratio`` = geometric mean of a/b with its percentile bootstrap
    ``ci95``, ``ratio_of_means`` = mean(a)/mean(b), ``mean_of_ratios`` = arithmetic mean of
    a/b, ``n_pairs``. Nulls when there is no pair."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    n = len(x)
    if n == 0:
        return {
            "n_pairs": 0,
            "ratio": None,
            "ci95": None,
            "ci95_halfwidth": None,
            "ratio_of_means": None,
            "mean_of_ratios": None,
        }
    with np.errstate(divide="ignore", invalid="ignore"):
        r = x / y
    lo, hi = bootstrap_geomean_ci(r)
    finite = r[np.isfinite(r)]
    return {
        "n_pairs": n,
        "ratio": finite_or_none(geomean(r)),
        "ci95": [finite_or_none(lo), finite_or_none(hi)],
        "ci95_halfwidth": ci_halfwidth([lo, hi], n),
        "ratio_of_means": safe_ratio(float(np.mean(x)), float(np.mean(y))),
        "mean_of_ratios": finite_or_none(float(np.mean(finite))) if len(finite) else None,
    }
