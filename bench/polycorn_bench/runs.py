"""Run-to-run variation of the overall hrsch/minrtt ratio.

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.runs RUN_OR_JSON RUN_OR_JSON... \\
        --into bench/out/hsr.json [--md bench/out/hsr.md] [--link-set hsr]

Each source is a raw run directory (with ``run.json``) or the ``hsr.json`` the analysis wrote
for one; all should be runs of the same configuration (profile, schemes, trips). For each run
the overall ratio hrsch/minrtt is the geometric mean of the paired bulk-download ratios (all
sizes, the pairs of ``bulk.hrsch.overall``) with its 95 % percentile bootstrap interval. The
summary goes into the top-level field ``run_to_run`` of the ``--into`` document (written back
in place; run this *after* the analysis, which rebuilds the document without it), and
``--md`` rewrites the markdown report from it. Formulas: :func:`summarise` and ``README.md``
("Run-to-run variation"). The document keeps its run's provenance, looked at again: added to at
another commit than the run's, or from a tree with uncommitted changes, it is no longer clean
(into ``bench/out`` only with ``POLYCORN_BENCH_ALLOW_DIRTY=1``).

Exit status: 0, or 2 when a source cannot be read, has no hrsch/minrtt pairs, or fewer than
two sources are given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench import provenance
from polycorn_bench.analysis import OVERALL, PRIMARY_LINK_SET
from polycorn_bench.flows import REFERENCE, collect_flows, paired_goodputs, paired_ratios_by_trip
from polycorn_bench.hrsch import HRSCH
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown
from polycorn_bench.stats import (
    Z95,
    bootstrap_geomean_ci,
    ci_halfwidth,
    geomean,
    trip_geomean_ci,
)

#: t quantiles (0.975) for 1..30 degrees of freedom. (A within-run bootstrap interval is read
#: as ±Z95 · SE on the log scale.)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

METHOD = (
    "per run: r_i = overall hrsch/minrtt (geometric mean of the paired bulk ratios), y_i = "
    "ln r_i, within-run standard error s_i = (ln hi_i - ln lo_i) / (2 * 1.96) from its 95 % "
    "bootstrap interval; mean = exp(mean y_i); sd_between_runs = sample SD of y_i (log "
    "scale, about a relative SD); between-run variance tau^2 by DerSimonian-Laird: w_i = "
    "1/s_i^2, Q = sum w_i (y_i - y_w)^2, tau^2 = max(0, (Q - (k-1)) / (sum w_i - sum w_i^2 / "
    "sum w_i)); combined = exp(mu), mu = sum w*_i y_i / sum w*_i with w*_i = 1/(s_i^2 + "
    "tau^2), combined_ci95 = exp(mu +- t_(0.975, k-1) / sqrt(sum w*_i)); "
    "single_run_ci95_halfwidth: the half-width (hi - lo)/2 one run's interval would have "
    "with the between-run variance added to its own, exp(y +- 1.96 sqrt(s^2 + tau^2)) around "
    "the combined ratio, s^2 the mean of s_i^2; where every run has an interval that "
    "resamples trips (ci95_trips), single_run_trips_ci95 = exp(mu +- 1.96 sqrt(s_t^2 + "
    "tau^2)), s_t^2 the mean of the squared log standard errors of those intervals: one "
    "run's uncertainty with trips, downloads and run-to-run variation in it (tau comes from "
    "the pairs' intervals: repeated runs of the same trips share the trips, so only the "
    "downloads and the machine vary between them)"
)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` ≥ 1 degrees of freedom (a table to 30,
    then the Cornish-Fisher expansion, within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class RunRatio:
    """One run's overall hrsch/minrtt ratio."""

    source: str
    ratio: float
    ci95: tuple[float, float]
    n_pairs: int
    commit: str | None
    profile: str | None
    trips: tuple[str, ...]
    #: The interval that resamples trips, when the source has one.
    ci95_trips: tuple[float, float] | None = None

    @property
    def log_se(self) -> float:
        """Within-run standard error of ln(ratio), from the pairs' 95 % interval."""
        return _log_se(self.ci95)

    @property
    def trips_log_se(self) -> float | None:
        """Standard error of ln(ratio) from the interval that resamples trips, if any."""
        return None if self.ci95_trips is None else _log_se(self.ci95_trips)


def _log_se(ci: tuple[float, float]) -> float:
    lo, hi = ci
    return (math.log(hi) - math.log(lo)) / (2 * Z95)


class SourceError(Exception):
    """A source that gives no usable ratio."""


def _from_json(path: Path, link_set: str) -> RunRatio:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: not a JSON object")
    ls = (doc.get("link_sets") or {}).get(link_set)
    if ls is None:
        if doc.get("link_set") != link_set:
            raise SourceError(f"{path}: no link set {link_set!r}")
        ls = doc
    o = ((ls.get("bulk") or {}).get(HRSCH) or {}).get(OVERALL) or {}
    ratio, ci, n = o.get("ratio_vs_minrtt"), o.get("ci95"), o.get("n_pairs") or 0
    return _checked(
        str(path),
        ratio=ratio,
        ci=ci,
        ci_trips=o.get("ci95_trips"),
        n=n,
        commit=doc.get("commit"),
        profile=doc.get("profile"),
        trips=tuple(ls.get("trips") or doc.get("seeds") or ()),
    )


def _from_run_dir(path: Path, link_set: str) -> RunRatio:
    run = read_run(path)
    ls = next((s for s in run.link_sets if s.name == link_set), None)
    if ls is None:
        raise SourceError(f"{path}: no link set {link_set!r} in run.json")
    flows = collect_flows(ls, run, with_oracle=False)
    mine = [f for f in flows if f.scheme == HRSCH]
    ref = [f for f in flows if f.scheme == REFERENCE]
    pairs = paired_goodputs(mine, ref)
    ratios = np.asarray([g / r for g, r in pairs])
    lo, hi = bootstrap_geomean_ci(ratios)
    t_lo, t_hi = trip_geomean_ci(paired_ratios_by_trip(mine, ref))
    meta = run.meta
    return _checked(
        str(path),
        ratio=geomean(ratios) if len(ratios) else None,
        ci=[lo, hi],
        ci_trips=[t_lo, t_hi],
        n=len(pairs),
        commit=meta.get("commit"),
        profile=meta.get("profile"),
        trips=tuple(t.name for t in ls.trips),
    )


def _checked(
    source: str,
    *,
    ratio: Any,
    ci: Any,
    n: int,
    ci_trips: Any = None,
    commit: Any,
    profile: Any,
    trips: tuple[str, ...],
) -> RunRatio:
    ok = isinstance(ratio, int | float) and math.isfinite(ratio) and ratio > 0 and _interval(ci)
    if not ok or n < 2:
        raise SourceError(
            f"{source}: no overall hrsch/minrtt ratio with an interval (hrsch and minrtt need "
            f"at least 2 paired bulk downloads; found {n})"
        )
    lo, hi = float(ci[0]), float(ci[1])
    if lo > hi:
        raise SourceError(f"{source}: interval bounds out of order: [{lo}, {hi}]")
    trips_ci = None
    if _interval(ci_trips) and float(ci_trips[0]) <= float(ci_trips[1]):
        trips_ci = (float(ci_trips[0]), float(ci_trips[1]))
    return RunRatio(
        source,
        float(ratio),
        (lo, hi),
        n,
        commit if isinstance(commit, str) else None,
        profile if isinstance(profile, str) else None,
        tuple(str(t) for t in trips),
        trips_ci,
    )


def _interval(ci: Any) -> bool:
    """Two finite positive bounds."""
    return (
        isinstance(ci, list | tuple)
        and len(ci) == 2
        and all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in ci)
    )


def load(source: Path, link_set: str = PRIMARY_LINK_SET) -> RunRatio:
    """The ratio of one run: ``source`` is a run directory or an ``hsr.json``."""
    try:
        if source.is_dir():
            return _from_run_dir(source, link_set)
        return _from_json(source, link_set)
    except (OSError, ValueError) as e:
        raise SourceError(f"{source}: {e}") from e


def summarise(runs: Sequence[RunRatio]) -> dict[str, Any]:
    """The ``run_to_run`` field (see :data:`METHOD`) of two or more runs."""
    k = len(runs)
    if k < 2:
        raise ValueError("run-to-run variation needs at least two runs")
    y = np.log([r.ratio for r in runs])
    s2 = np.asarray([r.log_se**2 for r in runs])
    if np.any(s2 <= 0):
        # A zero-width interval (all pairs equal): no within-run error to weigh by.
        s2 = np.maximum(s2, 1e-12)
    w = 1 / s2
    y_w = float(np.sum(w * y) / np.sum(w))
    q = float(np.sum(w * (y - y_w) ** 2))
    c = float(np.sum(w) - np.sum(w**2) / np.sum(w))
    tau2 = max(0.0, (q - (k - 1)) / c) if c > 0 else 0.0
    w_star = 1 / (s2 + tau2)
    mu = float(np.sum(w_star * y) / np.sum(w_star))
    se = float(1 / math.sqrt(float(np.sum(w_star))))
    t = t975(k - 1)
    combined_ci = [math.exp(mu - t * se), math.exp(mu + t * se)]
    single = math.sqrt(float(np.mean(s2)) + tau2)
    single_ci = [math.exp(mu - Z95 * single), math.exp(mu + Z95 * single)]
    trip_sets = {r.trips for r in runs}
    trips_se = [r.trips_log_se for r in runs]
    trips_ci: list[float] | None = None
    if all(x is not None for x in trips_se):
        st = math.sqrt(float(np.mean([x**2 for x in trips_se if x is not None])) + tau2)
        trips_ci = [math.exp(mu - Z95 * st), math.exp(mu + Z95 * st)]
    return {
        "runs": k,
        "sources": [r.source for r in runs],
        "commits": [r.commit for r in runs],
        "profiles": [r.profile for r in runs],
        "same_trips": len(trip_sets) == 1,
        "hrsch_vs_minrtt": [r.ratio for r in runs],
        "ci95": [list(r.ci95) for r in runs],
        "ci95_halfwidth": [ci_halfwidth(r.ci95) for r in runs],
        "n_pairs": [r.n_pairs for r in runs],
        "within_se_log": [r.log_se for r in runs],
        "mean": math.exp(float(np.mean(y))),
        "sd_between_runs": float(np.std(y, ddof=1)),
        "tau": math.sqrt(tau2),
        "q": q,
        "combined": math.exp(mu),
        "combined_ci95": combined_ci,
        "combined_ci95_halfwidth": ci_halfwidth(combined_ci),
        "single_run_ci95_halfwidth": ci_halfwidth(single_ci),
        "ci95_trips": [list(r.ci95_trips) if r.ci95_trips else None for r in runs],
        "single_run_trips_ci95": trips_ci,
        "single_run_trips_ci95_halfwidth": ci_halfwidth(trips_ci),
        "method": METHOD,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.runs", description=__doc__.split("\n")[0])
    p.add_argument("sources", type=Path, nargs="+", help="run directories or their hsr.json")
    p.add_argument("--into", type=Path, required=True, help="hsr.json to add run_to_run to")
    p.add_argument("--md", type=Path, help="rewrite this markdown report from the result")
    p.add_argument("--link-set", default=PRIMARY_LINK_SET, help="link set (default hsr)")
    args = p.parse_args(argv)
    prog = "polycorn_bench.runs"
    if len(args.sources) < 2:
        print(f"{prog}: need at least two runs, got {len(args.sources)}", file=sys.stderr)
        return 2
    try:
        runs = [load(s, args.link_set) for s in args.sources]
        doc = json.loads(args.into.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise SourceError(f"{args.into}: not a JSON object")
    except (SourceError, OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    prov = provenance.resume(doc, args.into, *([args.md] if args.md else []))
    summary = summarise(runs)
    if not summary["same_trips"]:
        print(f"{prog}: warning: the runs did not all run the same trips", file=sys.stderr)
    if len(set(summary["profiles"])) > 1:
        print(f"{prog}: warning: the runs have different profiles", file=sys.stderr)
    doc["run_to_run"] = summary
    doc = prov.stamp(doc)
    args.into.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.md:
        args.md.write_text(markdown(doc), encoding="utf-8")
    print(
        f"{summary['runs']} runs: hrsch/minrtt "
        + ", ".join(f"{r:.3f}" for r in summary["hrsch_vs_minrtt"])
        + f"; SD between runs {summary['sd_between_runs']:.3f} (log), tau "
        f"{summary['tau']:.3f}; combined {summary['combined']:.3f} "
        f"[{summary['combined_ci95'][0]:.3f}, {summary['combined_ci95'][1]:.3f}]; "
        f"wrote {args.into}" + (f", {args.md}" if args.md else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
