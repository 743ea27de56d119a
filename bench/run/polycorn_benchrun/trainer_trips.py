#!/usr/bin/env python3
"""Writes ``bench/out/trainer-trips.json``: the trainer's leave-one-trip-out validation
(``python -m polycorn_trainer.trips``) on the held-out fleets of ``make bench-trainer``,
regenerated from the same seeds, with every reading of hsr-facts §15.8 item 14. docs/trainer.md's
"Results" table is generated from it (``python -m polycorn_bench.docnumbers``).

    uv run --all-packages --locked python -m polycorn_benchrun.trainer_trips [--out FILE]

Needs ``target/release/polycorn-tracegen`` (``make build``); about two minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polycorn_harness import provenance
from polycorn_trainer.fit import Params

ROOT = Path(__file__).resolve().parents[3]
# The trace generator's validation generates the fleets.
sys.path.insert(0, str(ROOT / "testbed" / "tracegen" / "tools"))

import validate_tracegen as vt  # noqa: E402 (a script beside the generator, not a package)

TRACEGEN = ROOT / "target" / "release" / "polycorn-tracegen"
PRESET = "pc-gateway-300"
TRIP_S = 1800
#: Held-out routes of make bench-trainer and their trip seeds (polycorn_benchrun.trainer_fleet).
ROUTES: dict[int, range] = {7: range(2001, 2025), 11: range(2101, 2125), 12: range(2201, 2225)}
PAPER = {
    "failure_correct": 0.806,
    "failure_late": 0.013,
    "failure_early": 0.181,
    "success_correct": 0.782,
}


def generate_routes(
    routes: Mapping[int, Sequence[int]], work: Path, trip_s: int = TRIP_S
) -> dict[int, list[Path]]:
    """Each route's trips (trip seeds ``routes[route]``; polycorn-tracegen
    PRESET, 2 carriers, ``trip_s`` long) under ``work``, as trip directories.
    Raises RuntimeError when the generator fails."""
    out: dict[int, list[Path]] = {}
    for route, seeds in routes.items():
        trips = tuple((route, t) for t in seeds)
        fleet = vt.Fleet(f"r{route}", PRESET, trips, "trainer", duration_s=trip_s)
        try:
            out[route] = vt.generate(TRACEGEN, fleet, work)
        except vt.RunError as e:
            raise RuntimeError(str(e)) from e
    return out


def trips_json(args: Sequence[str]) -> dict[str, Any]:
    """``python -m polycorn_trainer.trips ARGS``'s JSON; RuntimeError with its
    stderr when it fails."""
    r = subprocess.run(
        [sys.executable, "-m", "polycorn_trainer.trips", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"polycorn_trainer.trips failed: {r.stderr.strip()}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "trainer-trips.json")
    args = ap.parse_args(argv)
    prov = provenance.start(args.out)
    if not TRACEGEN.exists():
        print(f"{TRACEGEN} missing: run `make build` first", file=sys.stderr)
        return 1
    routes: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="polycorn-trainer-trips-") as tmp:
        try:
            for route, dirs in generate_routes(ROUTES, Path(tmp)).items():
                routes[str(route)] = trips_json([str(d) for d in dirs])
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    params = {k: v for k, v in dataclasses.asdict(Params()).items() if not k.startswith("_")}
    seeds_text = ", ".join(f"{r}: trip seeds {s.start}-{s.stop - 1}" for r, s in ROUTES.items())
    doc = {
        **prov.fields(),
        "method": (
            "python -m polycorn_trainer.trips on the held-out fleets of make bench-trainer, "
            f"regenerated from the same seeds (polycorn-tracegen {PRESET}, failure model v2, "
            f"2 carriers, 24 trips of {TRIP_S} s per route; route {seeds_text}): the trainer's fit "
            "and leave-one-trip-out code on the event files, with the variants of hsr-facts "
            "§15.8 item 14 (loto: t_HO = blackout start, no lead, failures without a prediction "
            "counted late as the trainer does; loto_with_lead: HPR's lead counted; "
            "loto_at_reconnect: t_HO = when the UE is connected again; with_prediction: over "
            "failures whose cell failed in another trip). The trainer's default parameters "
            "(trainer_params); the generator's were fixed on development routes 1-3 before "
            "these routes were generated. Written by python -m polycorn_benchrun.trainer_trips."
        ),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "trainer_params": params,
        "paper": PAPER,
        "routes": routes,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
