"""The trainer's validation run directly on generated trips (no LinkDB).

``python -m polycorn_trainer.trips DIR...`` reads the ``events.jsonl`` of
``polycorn-tracegen`` trip directories, groups their handovers into cells
(⟨carrier, source cell, direction⟩; generated trips all travel one way) and
runs the same leave-one-trip-out validation and separability fits as a
trainer run over LinkDB (:mod:`polycorn_trainer.fit`), plus PC Table 1's
success rates. It prints one JSON object per carrier label. The trace
generator's validation (``testbed/tracegen/tools/validate_tracegen.py``) uses it for
hsr-facts §15.8 items 13–16, so that the generator is judged by exactly the
code that learns from the fleet.

Positions are the handovers' ``track_m`` (where the blackout starts: the UE
leaves the source cell), RSRP is the event's ``rsrp_dbm`` (at that moment),
and the speed is that of the last GPS fix at or before the handover, as the
trainer takes it from LinkDB.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .fit import (
    INCREASING,
    CellData,
    Counts,
    Params,
    fit_cell,
    fold_tabled,
    priors_of,
    validate_cell,
)

# PC Table 1's thresholds: 200 m past the earliest handover position, −95 dBm.
EHP_LATE_M = 200.0
RSRP_LOW_DBM = -95.0


@dataclass
class _Ho:
    trip: int
    track_m: float
    rsrp_dbm: float
    speed_mps: float
    failed: bool = False
    duration_s: float = 0.0


@dataclass
class _Trip:
    route: int
    seed: int
    labels: list[str]
    handovers: dict[tuple[int, int], _Ho] = field(default_factory=dict)


def load_trip(d: Path) -> _Trip:
    """One trip directory's handovers, keyed by (carrier, source cell)."""
    info = json.loads((d / "trip.json").read_text())
    carriers = int(info["carriers"])
    labels = [info["preset"]["carriers"][i % 2]["label"] for i in range(carriers)]
    trip = _Trip(route=int(info["route_seed"]), seed=int(info["trip_seed"]), labels=labels)
    fixes_t: list[int] = []
    fixes_v: list[float] = []
    starts: list[dict[str, Any]] = []
    ends: dict[tuple[int, int], tuple[bool, float]] = {}
    with (d / "events.jsonl").open() as f:
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{d / 'events.jsonl'}:{n}: {err}") from err
            kind = e.get("event")
            if kind == "gps":
                fixes_t.append(int(e["t_ms"]))
                fixes_v.append(float(e["speed_mps"]))
            elif kind == "handover_start":
                starts.append(e)
            elif kind == "handover_end":
                ends[(int(e["carrier"]), int(e["from_cell"]))] = (
                    e["outcome"] != "success",
                    float(e["duration_ms"]) / 1000.0,
                )
    for e in starts:
        key = (int(e["carrier"]), int(e["from_cell"]))
        if key not in ends:  # the trip ended during the blackout
            continue
        i = bisect.bisect_right(fixes_t, int(e["t_ms"])) - 1
        speed = fixes_v[i] if i >= 0 and int(e["t_ms"]) - fixes_t[i] <= 10_000 else float("nan")
        trip.handovers[key] = _Ho(
            trip=trip.seed,
            track_m=float(e["track_m"]),
            rsrp_dbm=float(e["rsrp_dbm"]),
            speed_mps=speed,
            failed=ends[key][0],
            duration_s=ends[key][1],
        )
    return trip


def cells_of(trips: list[_Trip], at_reconnect: bool = False) -> dict[str, list[CellData]]:
    """Per carrier label, one :class:`CellData` per (route, carrier, source
    cell): the cells of different routes are different cells."""
    grouped: dict[tuple[int, int, int], list[_Ho]] = defaultdict(list)
    label_of: dict[int, str] = {}
    for t in trips:
        for (carrier, cell), h in t.handovers.items():
            grouped[(t.route, carrier, cell)].append(h)
            label_of[carrier] = t.labels[carrier]
    out: dict[str, list[CellData]] = defaultdict(list)
    for key, gk in enumerate(sorted(grouped)):
        _, carrier, cell = gk
        hs = grouped[gk]
        out[f"c{carrier}/{label_of[carrier]}"].append(
            CellData(
                key=key,
                carrier=label_of[carrier],
                cell_id=cell,
                direction=INCREASING,
                track_m=np.array([h.track_m for h in hs]),
                rsrp_dbm=np.array([h.rsrp_dbm for h in hs]),
                failed=np.array([h.failed for h in hs]),
                trip=np.array([h.trip for h in hs], dtype=np.int64),
                # Generated trips are independent draws of the model, like
                # trips of different trains: each counts as its own train.
                train=np.array([h.trip for h in hs], dtype=np.int64),
                speed_mps=np.array([h.speed_mps for h in hs]),
                delta_offset_s=np.array([h.duration_s for h in hs]) if at_reconnect else None,
            )
        )
    return out


def _table1(cells: list[CellData]) -> dict[str, Any]:
    """PC Table 1: success rates by distance to the cell's EHP (earliest
    handover position over all trips) and by RSRP at the handover, and the
    implied failure odds ratios (bin 2 over bin 1)."""
    n = {k: [0, 0] for k in ("ehp_near", "ehp_far", "rsrp_high", "rsrp_low")}
    for c in cells:
        if len(c.track_m) == 0:
            continue
        far = (c.x - c.x.min()) >= EHP_LATE_M
        low = c.rsrp_dbm < RSRP_LOW_DBM
        for name, mask in (
            ("ehp_near", ~far),
            ("ehp_far", far),
            ("rsrp_high", ~low),
            ("rsrp_low", low),
        ):
            n[name][0] += int(mask.sum())
            n[name][1] += int((mask & c.failed).sum())

    def success(k: str) -> float | None:
        return round(1 - n[k][1] / n[k][0], 6) if n[k][0] else None

    def odds_ratio(a: str, b: str) -> float | None:
        (na, fa), (nb, fb) = n[a], n[b]
        if min(fa, fb, na - fa, nb - fb) <= 0:
            return None
        return round((fb / (nb - fb)) / (fa / (na - fa)), 4)

    return {
        "handovers": {k: v[0] for k, v in n.items()},
        "success": {k: success(k) for k in n},
        "odds_ratio_ehp_far": odds_ratio("ehp_near", "ehp_far"),
        "odds_ratio_rsrp_low": odds_ratio("rsrp_high", "rsrp_low"),
    }


def _lead_view(s: dict[str, Any]) -> dict[str, Any]:
    """A validation summary seen with HPR's lead counted: the same keys as the
    summary's top level, from its ``with_lead`` parts."""
    return {
        **s["with_lead"],
        "with_prediction": s["with_lead_with_prediction"],
        "failures_without_prediction": s["failures_without_prediction"],
        "failures": s["failures"],
        "successes": s["successes"],
    }


def validate_trips(dirs: list[Path], lead_s: float = Params.lead_s) -> dict[str, Any]:
    """Items 13–16 per carrier: the trainer's validation without and with
    the HPR lead (the throttle starts ``lead_s`` before t̂_HOF, i.e. the
    correct window moves to Δ ∈ [−lead, t2 − lead])."""
    trips = [load_trip(d) for d in dirs]
    out: dict[str, Any] = {"trips": len(trips), "lead_s": lead_s}
    base = Params(lead_s=lead_s)
    at_end = cells_of(trips, at_reconnect=True)
    for label, cells in sorted(cells_of(trips).items()):
        paper, deployed, reconnect = Counts(), Counts(), Counts()
        failing = 0
        for c, ce in zip(cells, at_end[label], strict=True):
            fitted = fit_cell(c, base)
            paper.add(fitted.counts)
            deployed.add(fitted.deployed)
            reconnect.add(validate_cell(ce, base)[0])
            failing += int(c.failed.any())
        fails = sum(int(c.failed.sum()) for c in cells)
        n = sum(len(c.track_m) for c in cells)
        out[label] = {
            "cells": len(cells),
            "handovers": n,
            "failure_share": round(fails / n, 6) if n else None,
            "cells_with_failure": round(failing / len(cells), 6) if cells else None,
            "passes_per_cell": round(n / len(cells), 2) if cells else None,
            "loto": paper.summary(),
            "loto_with_lead": _lead_view(paper.summary()),
            "loto_at_reconnect": reconnect.summary(),
            # What the proxies get: each fold's table built by the table's rule
            # (thresholds, several trains; each trip is its own train here).
            "deployed_with_lead": _lead_view(deployed.summary()),
            "table1": _table1(cells),
        }
    return out


# The threshold grid of the table curve: (min_failures, min_failure_rate).
CURVE_MIN_FAILURES: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
CURVE_MIN_RATES: tuple[float, ...] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)


# The prior rule's sweep of C_fail / C_hold (Params.failure_cost_ratio),
# and the min_trains it is measured with (1: every failure counts; 2: the
# default, failures from two trips, i.e. trains, here).
CURVE_COST_RATIOS: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 12, 20)
CURVE_PRIOR_MIN_TRAINS: tuple[int, ...] = (1, 2)
CURVE_RULES: tuple[str, ...] = ("threshold", "prior", "both")


def _point(passes: int, fails_in: int, fails_all: int, tabled: list[int]) -> dict[str, Any]:
    return {
        "tabled_passes": passes,
        "precision": round(fails_in / passes, 6) if passes else None,
        "coverage": round(fails_in / fails_all, 6) if fails_all else None,
        # Cells in the table built without the held-out trip (its route's,
        # both carriers), mean over held-out trips.
        "table_cells": round(sum(tabled) / len(tabled), 2) if tabled else None,
    }


def table_curve(dirs: list[Path], rule: str = "both") -> dict[str, Any]:
    """Precision of "this cell fails here" against coverage, per table
    rule, leave one trip out: for every trip, the table is built from
    the other trips of its route and scored on the held-out trip's
    handovers. *Precision*: the share of the held-out trip's passes through
    tabled cells that failed (each such pass is a throttle HPR makes).
    *Coverage*: the share of the held-out trip's failures that were in
    tabled cells (failures HPR could act on). *Throttles per failure caught*
    = 1 / precision. Both carriers pooled.

    ``curve`` (rule ``threshold``, or ``both``): a cell qualifies with ≥
    ``min_failures`` failures and a failure share ≥ ``min_failure_rate``,
    over a grid of the two. ``prior_curve`` (rule ``prior``, or ``both``):
    the ``prior`` rule (:func:`polycorn_trainer.fit.qualifies`) for each
    ``failure_cost_ratio`` of CURVE_COST_RATIOS and ``min_trains`` of
    CURVE_PRIOR_MIN_TRAINS, each fold's prior fitted on every route's cells
    without the held-out trip (:func:`polycorn_trainer.fit.priors_of`)."""
    trips = [load_trip(d) for d in dirs]
    route_of = {t.seed: t.route for t in trips}
    out: dict[str, Any] = {"trips": len(trips), "routes": sorted({t.route for t in trips})}
    per_route: dict[int, int] = defaultdict(int)
    for t in trips:
        per_route[t.route] += 1
    out["trips_per_route"] = {str(k): v for k, v in sorted(per_route.items())}
    if rule in ("threshold", "both"):
        out["curve"] = _threshold_curve(trips)
    if rule in ("prior", "both"):
        cells = [c for cs in cells_of(trips).values() for c in cs]
        fails_all = sum(int(c.failed.sum()) for c in cells)
        priors = priors_of(cells)
        rows = []
        for mt in CURVE_PRIOR_MIN_TRAINS:
            for r in CURVE_COST_RATIOS:
                p = Params(rule="prior", min_trains=mt, failure_cost_ratio=float(r))
                passes = fails_in = 0
                tabled: dict[int, int] = dict.fromkeys(route_of, 0)
                for c in cells:
                    groups, inv, ok = fold_tabled(c, p, priors)
                    hit = ok[inv]
                    passes += int(hit.sum())
                    fails_in += int((hit & c.failed).sum())
                    for trip in groups[ok].tolist():
                        tabled[int(trip)] += 1
                rows.append(
                    {
                        "failure_cost_ratio": r,
                        "hold_bar": round(p.hold_bar, 6),
                        "min_trains": mt,
                        **_point(passes, fails_in, fails_all, list(tabled.values())),
                    }
                )
        out["prior_curve"] = rows
        out["prior"] = {"a": round(priors.all.a, 6), "b": round(priors.all.b, 6)}
    return out


def _threshold_curve(trips: list[_Trip]) -> list[dict[str, Any]]:
    """The ``threshold`` rule's grid (:func:`table_curve`)."""
    # Per (route, carrier, cell): handovers and failures per trip seed.
    per: dict[tuple[int, int, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for t in trips:
        for (carrier, cell), h in t.handovers.items():
            per[(t.route, carrier, cell)][t.seed] = (1, int(h.failed))
    rows = []
    for mf in CURVE_MIN_FAILURES:
        for mr in CURVE_MIN_RATES:
            passes = fails_in = fails_all = 0
            cells_tabled: dict[int, int] = {t.seed: 0 for t in trips}
            for by_trip in per.values():
                n_tot = sum(n for n, _ in by_trip.values())
                f_tot = sum(f for _, f in by_trip.values())
                for seed, (n, f) in by_trip.items():
                    n_tr, f_tr = n_tot - n, f_tot - f
                    tabled = f_tr >= mf and n_tr > 0 and f_tr / n_tr >= mr
                    fails_all += f
                    if tabled:
                        passes += n
                        fails_in += f
                        cells_tabled[seed] += 1
            rows.append(
                {
                    "min_failures": mf,
                    "min_failure_rate": mr,
                    **_point(passes, fails_in, fails_all, list(cells_tabled.values())),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polycorn_trainer.trips",
        description="The trainer's leave-one-trip-out validation on generated trip directories.",
    )
    ap.add_argument("dirs", nargs="+", type=Path, help="polycorn-tracegen trip directories")
    ap.add_argument(
        "--lead-s", type=float, default=Params.lead_s, help="HPR's lead (s) for the second variant"
    )
    ap.add_argument(
        "--curve",
        action="store_true",
        help="instead: the table rules' precision against coverage (leave one trip out)",
    )
    ap.add_argument(
        "--curve-rule",
        choices=CURVE_RULES,
        default="both",
        help="with --curve: the threshold grid, the prior rule's sweep of the cost ratio, "
        "or both (default)",
    )
    a = ap.parse_args(argv)
    try:
        r = table_curve(a.dirs, a.curve_rule) if a.curve else validate_trips(a.dirs, a.lead_s)
    except (OSError, ValueError, KeyError) as e:
        print(f"polycorn_trainer.trips: {e}", file=sys.stderr)
        return 1
    json.dump(r, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
