"""Diagnostic CC: the subflows' congestion control, BBR (the default) against CUBIC, on the
same held-out trips and the same downloads, in two precision runs one after the other.

Pairs each bulk download of the CUBIC run with the same download (trip, id, scheme) of the
BBR run, on the trips where both runs started the load at the same trip time (so the download
sits at the same place of the trip in both); reports per scheme the geometric mean of
goodput_cubic / goodput_bbr with a 95 % bootstrap interval that resamples trips, each run's
ratio to the oracle, and within each run the ratio of SCHEME to minrtt.

Usage (from bench/), for bench/out/diagnostics/cc/compare.json:

    uv run python -m polycorn_bench.diagnostics.cc_compare BBR_RUN CUBIC_RUN OUT_JSON
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench.flows import Flow, collect_flows
from polycorn_bench.records import read_run
from polycorn_bench.stats import geomean

SCHEMES = ["minrtt", "hrsch+"]
RESAMPLES = 2000


def flows(run_dir: Path) -> tuple[dict[tuple[str, int, str], Flow], dict[str, int]]:
    run = read_run(run_dir)
    ls = next(ls for ls in run.link_sets if ls.name == "hsr")
    starts = {
        p.parent.name: json.loads(p.read_text())["load_start_s"]
        for p in (run_dir / "hsr").glob("*/timing.json")
    }
    out = {(f.trip, f.rec.id, f.scheme): f for f in collect_flows(ls, run) if f.scheme in SCHEMES}
    return out, starts


def trip_ci(by_trip: dict[str, list[float]], seed: int = 1) -> list[float]:
    """95 % percentile interval of the geometric mean, resampling trips."""
    trips = sorted(by_trip)
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(RESAMPLES):
        pick = rng.integers(0, len(trips), len(trips))
        logs = np.concatenate([np.log(by_trip[trips[i]]) for i in pick])
        means.append(float(np.exp(logs.mean())))
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def within(fl: dict[tuple[str, int, str], Flow], trips: set[str], scheme: str) -> dict[str, Any]:
    by_trip: dict[str, list[float]] = defaultdict(list)
    for (trip, i, s), f in fl.items():
        if s != scheme or trip not in trips:
            continue
        m = fl.get((trip, i, "minrtt"))
        if m and f.goodput_mbps and m.goodput_mbps:
            by_trip[trip].append(f.goodput_mbps / m.goodput_mbps)
    allr = [r for v in by_trip.values() for r in v]
    return {"n": len(allr), "ratio_vs_minrtt": geomean(allr), "ci95_trips": trip_ci(by_trip)}


def main() -> None:
    bbr_run, cubic_run, out = (Path(a) for a in sys.argv[1:4])
    bbr, bbr_starts = flows(bbr_run)
    cubic, cubic_starts = flows(cubic_run)
    trips = {t for t, s in cubic_starts.items() if bbr_starts.get(t) == s}
    doc: dict[str, Any] = {
        "trips": sorted(trips),
        "trips_left_out": sorted(set(cubic_starts) - trips),
        "schemes": {},
    }
    for scheme in SCHEMES:
        by_trip: dict[str, list[float]] = defaultdict(list)
        moved = 0
        for key, c in cubic.items():
            trip, _, s = key
            b = bbr.get(key)
            if s != scheme or trip not in trips or b is None:
                continue
            if abs(c.rec.start_ms - b.rec.start_ms) > 1000:
                moved += 1
                continue
            if c.goodput_mbps and b.goodput_mbps:
                by_trip[trip].append(c.goodput_mbps / b.goodput_mbps)
        allr = [r for v in by_trip.values() for r in v]

        def oracle(fl: dict[tuple[str, int, str], Flow], scheme: str = scheme) -> float:
            r = [f.oracle_ratio for (t, _, s), f in fl.items() if s == scheme and t in trips]
            return geomean([x for x in r if x])

        doc["schemes"][scheme] = {
            "pairs": len(allr),
            "pairs_not_at_the_same_trip_time": moved,
            "cubic_over_bbr": geomean(allr),
            "ci95_trips": trip_ci(by_trip),
            "oracle_ratio": {"bbr": oracle(bbr), "cubic": oracle(cubic)},
            "vs_minrtt": {"bbr": within(bbr, trips, scheme), "cubic": within(cubic, trips, scheme)},
        }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
