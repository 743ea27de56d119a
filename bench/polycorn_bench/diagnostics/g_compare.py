"""Diagnostic G: bulk downloads' ratio to the oracle on the same two held-out trips, in the main
run (22 schemes side by side) and in a run of 5 schemes (light load).

Usage (from bench/), for bench/out/diagnostics/g/compare.json:

    uv run python -m polycorn_bench.diagnostics.g_compare MAIN_RUN LIGHT_RUN OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench.flows import Flow, collect_flows
from polycorn_bench.records import read_run
from polycorn_bench.stats import bootstrap_geomean_ci, geomean

TRIPS = {"r7-t1001", "r7-t1002"}
SCHEMES = ["minrtt", "ecf", "single-path-c0", "single-path-c1", "kernel-mptcp-conn"]


def flows(run_dir: Path) -> list[Flow]:
    run = read_run(run_dir)
    ls = next(ls for ls in run.link_sets if ls.name == "hsr")
    return [f for f in collect_flows(ls, run) if f.trip in TRIPS]


def summary(fl: list[Flow], scheme: str) -> dict[str, Any]:
    r = [f.oracle_ratio for f in fl if f.scheme == scheme and f.oracle_ratio is not None]
    lo, hi = bootstrap_geomean_ci(np.asarray(r))
    return {"n": len(r), "oracle_ratio": geomean(r), "ci95": [lo, hi]}


def main() -> None:
    main_run, light_run, out = (Path(a) for a in sys.argv[1:4])
    m, light = flows(main_run), flows(light_run)
    doc = {
        "trips": sorted(TRIPS),
        "main": {s: summary(m, s) for s in SCHEMES},
        "light": {s: summary(light, s) for s in SCHEMES},
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
