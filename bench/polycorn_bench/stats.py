"""Summary statistics: geometric means of paired ratios with bootstrap CIs, IM delay stats."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from polycorn_bench.links import FloatArray

#: Bootstrap resamples and seed: fixed, so the same input always gives the same CI.
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_240_611
_CHUNK_ELEMENTS = 4_000_000


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN/inf: they become ``null``."""
    return x if math.isfinite(x) else None


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
