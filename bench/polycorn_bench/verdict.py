"""Verdicts against the paper's numbers, from 95 % intervals.

Every comparison of ours with a number of the POLYCORN paper goes through :func:`verdict`:

* ``"above"``: ours is better than the paper's number by more than the interval allows: for a
  metric where higher is better, the interval's lower bound is above the paper's number; for
  one where lower is better (message delay, overhead), its upper bound is below it;
* ``"below"``: ours is worse by more than the interval allows (the mirror image);
* ``"consistent"``: the paper's number is inside the interval (bounds included);
* ``"no interval"``: fewer than two samples behind the interval (a one-sample bootstrap has
  zero width and resolves nothing), or no interval at all.

So "above the paper" always means *better than the paper*, also for lower-is-better metrics,
where the numbers themselves are lower. A point estimate alone never decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

ABOVE = "above"
CONSISTENT = "consistent"
BELOW = "below"
NO_INTERVAL = "no interval"
VERDICTS = (ABOVE, CONSISTENT, BELOW, NO_INTERVAL)

#: How the report and the docs say each verdict.
TEXT = {
    ABOVE: "above the paper",
    CONSISTENT: "consistent with the paper",
    BELOW: "below the paper",
    NO_INTERVAL: "no interval (n < 2)",
}


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def verdict(
    ci: Sequence[float | None] | None,
    paper: float | None,
    n: int | None,
    *,
    lower_is_better: bool = False,
) -> str | None:
    """The verdict of a 95 % interval ``ci`` = [lo, hi] of ours, from ``n`` samples, against
    the paper's number; None when there is no paper number. Bounds equal to the paper's number
    count as consistent. Raises ValueError for an interval whose lower bound is above its upper
    bound (a bug upstream, never a verdict)."""
    if paper is None:
        return None
    if not _finite(paper):
        raise ValueError(f"paper number is not finite: {paper!r}")
    if n is None or n < 2 or ci is None or len(ci) != 2:
        return NO_INTERVAL
    lo, hi = ci
    if not _finite(lo) or not _finite(hi):
        return NO_INTERVAL
    assert lo is not None and hi is not None
    if lo > hi:
        raise ValueError(f"interval bounds out of order: [{lo}, {hi}]")
    if lo > paper:
        return BELOW if lower_is_better else ABOVE
    if hi < paper:
        return ABOVE if lower_is_better else BELOW
    return CONSISTENT


def verdict_text(v: str | None) -> str:
    """'' without a paper number, else the verdict in words."""
    return "" if v is None else TEXT[v]


def compare(
    ours: float | None,
    ci: Sequence[float | None] | None,
    n: int | None,
    paper: float | None,
    *,
    lower_is_better: bool = False,
) -> dict[str, Any]:
    """A JSON-ready comparison with the paper: ``ours``, ``ci95``, ``n``, ``paper``,
    ``lower_is_better`` and the ``verdict``."""
    return {
        "ours": ours,
        "ci95": None if ci is None else list(ci),
        "n": n,
        "paper": paper,
        "lower_is_better": lower_is_better,
        "verdict": verdict(ci, paper, n, lower_is_better=lower_is_better),
    }
