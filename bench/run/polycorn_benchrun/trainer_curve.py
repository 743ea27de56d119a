#!/usr/bin/env python3
"""Writes ``bench/out/trainer-curve.json``: what the failure-location table's rule
trades, precision against coverage, on the development routes only.

    uv run --all-packages --locked python -m polycorn_benchrun.trainer_curve [--out FILE]

Leave one trip out on development routes 1-3 (24 generated trips of 1800 s each), the
table built from a route's other trips with each rule and scored on the held-out trip
(``python -m polycorn_trainer.trips --curve --curve-rule both``): the threshold rule's
grid (``curve``) and the prior rule's sweep of the cost ratio (``prior_curve``), on all
24 trips of each route, and again on the first 7 and 13 (6 and 12 training trips:
``by_training_trips``), which shows how each rule's table grows with the data.
docs/trainer.md's tables are generated from it (``python -m polycorn_bench.docnumbers``).
The reported routes are never used here: the defaults are chosen from this file.

Needs ``target/release/polycorn-tracegen`` (``make build``); a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polycorn_benchrun.trainer_trips import (
    PRESET,
    ROOT,
    TRACEGEN,
    TRIP_S,
    generate_routes,
    trips_json,
)
from polycorn_harness import provenance
from polycorn_trainer.fit import Params

#: Development routes and their trip seeds.
ROUTES: dict[int, range] = {1: range(1, 25), 2: range(101, 125), 3: range(201, 225)}
#: Trips per route for the smaller training sets (leave one out: one fewer trains).
SUBSETS = (7, 13)


def curve(dirs: Sequence[Path]) -> dict[str, Any]:
    return trips_json(["--curve", "--curve-rule", "both", *map(str, dirs)])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "trainer-curve.json")
    ap.add_argument(
        "--trip-s", type=int, default=TRIP_S, help="trip length (s); shorter only for tests"
    )
    ap.add_argument(
        "--trips", type=int, default=24, help="trips per route (the subsets stay below it)"
    )
    args = ap.parse_args(argv)
    prov = provenance.start(args.out)
    if not TRACEGEN.exists():
        print(f"{TRACEGEN} missing: run `make build` first", file=sys.stderr)
        return 1
    if not 3 <= args.trips <= 24:
        ap.error("--trips: 3 to 24")
    subsets = [k for k in SUBSETS if k < args.trips]
    with tempfile.TemporaryDirectory(prefix="polycorn-trainer-curve-") as tmp:
        routes = {r: list(seeds)[: args.trips] for r, seeds in ROUTES.items()}
        try:
            by_route = generate_routes(routes, Path(tmp), args.trip_s)
            full = curve([d for dirs in by_route.values() for d in dirs])
            smaller = {
                str(k - 1): curve([d for dirs in by_route.values() for d in dirs[:k]])
                for k in subsets
            }
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    defaults = Params()
    seeds_text = ", ".join(f"{r}: trip seeds {s.start}-{s.stop - 1}" for r, s in ROUTES.items())
    doc = {
        **prov.fields(),
        "method": (
            f"leave one trip out on development routes 1-3 ({args.trips} trips of "
            f"{args.trip_s} s each; route {seeds_text}; polycorn-tracegen {PRESET}, failure "
            "model v2, 2 carriers): python -m polycorn_trainer.trips --curve --curve-rule both "
            f"on every trip, and on the first {', '.join(map(str, subsets))} of each route "
            "(by_training_trips, keyed by training trips per route). Written by "
            "python -m polycorn_benchrun.trainer_curve."
        ),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "chosen": {
            "rule": defaults.rule,
            "min_failures": defaults.min_failures,
            "min_failure_rate": defaults.min_failure_rate,
            "min_trains": defaults.min_trains,
            "failure_cost_ratio": defaults.failure_cost_ratio,
        },
        **full,
        "by_training_trips": {str(args.trips - 1): full, **smaller},
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
