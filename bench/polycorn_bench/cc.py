"""make bench-cc: the QUIC subflows' congestion controller (``railway``,
crates/core/src/cc.rs) and its variants side by side on generated trips, in virtual
time -> bench/out/cc.json and a table on stdout.

Each carrier of each trip is replayed by ``polycorn-ccsim`` (testbed/ccsim): the
emulator's own sans-IO links (the trip's downlink and uplink traces, delays, loss
and blackouts, the testbed's 3 MB droptail buffer) and a sender that drives the
controller as quinn does, busy from second 45 to 165 as the hsr bench's backlog
phase. Every variant sees the same trips, so each is paired with the default.

Trip sets (``polycorn-tracegen generate``, preset pc-gateway-300):

* ``tune``: route seeds 1-3, trip seeds 1-4 (200 s). The defaults were chosen here.
* ``report``: route seed 7, trip seeds 1001-1031 (315 s): the hsr bench's held-out
  trips.
* ``unseen``: route seed 11, trip seeds 1001-1010 (315 s): a route no choice was
  tuned on.

Per variant and set: the carrier share (bytes the downlink delivered / what its
trace offered outside blackouts, as bench-hsr's ``capacity_share``), the queueing
time at the carrier (p50 and p95 of the packets' sojourn in its buffer), each the
mean over trips with a 95 % interval that resamples trips; and the share paired
with the default's, per carrier and trip, as a geometric mean with the same kind
of interval. Hints (``railway``) reach the controller 200 ms after the radio
event, the longest RSRP report delay of the trace model; ``railway-nohints`` gets
none.

Env: BENCH_OUT (bench/out), BENCH_WORK (/tmp/polycorn-bench-cc), CC_SETS (tune
report unseen), CC_JOBS (2). Writing into bench/out needs a clean tree
(POLYCORN_BENCH_ALLOW_DIRTY=1 writes anyway and records it; :mod:`polycorn_bench.provenance`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import provenance
from .stats import geomean, trip_geomean_ci, trip_mean_interval

ROOT = Path(__file__).resolve().parents[2]

BIN = ROOT / "target" / "release"
HINT_DELAY_MS = 200
#: name -> the polycorn-ccsim --variant settings.
VARIANTS: dict[str, str] = {
    "railway": f"hint_delay_ms={HINT_DELAY_MS}",
    "railway-nohints": "",
    "railway-steady": f"hint_delay_ms={HINT_DELAY_MS},variability_lo=1000,variability_hi=1001",
    "railway-q0": f"hint_delay_ms={HINT_DELAY_MS},surge_queue_delay=0",
    "railway-q300": f"hint_delay_ms={HINT_DELAY_MS},surge_queue_delay=300",
    "railway-q600": f"hint_delay_ms={HINT_DELAY_MS},surge_queue_delay=600",
}
DEFAULT = "railway"
#: set -> (route seeds, trip seeds, trip seconds).
SETS: dict[str, tuple[list[int], list[int], int]] = {
    "tune": ([1, 2, 3], [1, 2, 3, 4], 200),
    "report": ([7], list(range(1001, 1032)), 315),
    "unseen": ([11], list(range(1001, 1011)), 315),
}
CARRIERS = (0, 1)


class BenchError(Exception):
    pass


def generate(work: Path, route: int, trip: int, seconds: int) -> Path:
    out = work / f"r{route}-t{trip}"
    if not (out / "c1.down").exists():
        subprocess.run(
            [
                str(BIN / "polycorn-tracegen"),
                "generate",
                "--route-seed",
                str(route),
                "--trip-seed",
                str(trip),
                "--duration-s",
                str(seconds),
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
    return out


def replay(trip: Path) -> list[dict[str, Any]]:
    cmd = [str(BIN / "polycorn-ccsim"), "--trip", str(trip)]
    for c in CARRIERS:
        cmd += ["--carrier", str(c)]
    for name, spec in VARIANTS.items():
        cmd += ["--variant", f"{name}:{spec}" if spec else name]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise BenchError(f"polycorn-ccsim on {trip}: {r.stderr.strip()}")
    return [json.loads(line) for line in r.stdout.splitlines()]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    trips = sorted({r["trip"] for r in rows})
    by = {(r["variant"], r["trip"], r["carrier"]): r for r in rows}
    out: dict[str, Any] = {}
    for v in VARIANTS:

        def per_trip(key: str, v: str = v) -> list[list[float]]:
            return [[by[(v, t, c)][key] for c in CARRIERS if (v, t, c) in by] for t in trips]

        ratios = [
            [
                by[(v, t, c)]["share"] / by[(DEFAULT, t, c)]["share"]
                for c in CARRIERS
                if (v, t, c) in by
                and by.get((DEFAULT, t, c), {}).get("share", 0) > 0
                and by[(v, t, c)]["share"] > 0
            ]
            for t in trips
        ]
        flat = [x for g in ratios for x in g]
        lo, hi = trip_geomean_ci(ratios)
        geo = geomean(flat) if flat else None
        out[v] = {
            "share": trip_mean_interval(per_trip("share")),
            "sojourn_p50_ms": trip_mean_interval(per_trip("sojourn_p50_ms")),
            "sojourn_p95_ms": trip_mean_interval(per_trip("sojourn_p95_ms")),
            "share_vs_default": {
                "ratio": geo,
                "ci95_trips": [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None,
                "n": len(flat),
            },
            "per_carrier_share": {
                str(c): trip_mean_interval(
                    [[by[(v, t, c)]["share"]] for t in trips if (v, t, c) in by]
                )
                for c in CARRIERS
            },
        }
    return {"trips": trips, "variants": out}


def fmt(x: dict[str, Any], nd: int = 2) -> str:
    if x.get("mean") is None:
        return "-"
    ci = x.get("ci95_trips")
    m = x["mean"]
    if ci:
        return f"{m:.{nd}f} [{ci[0]:.{nd}f}, {ci[1]:.{nd}f}]"
    return f"{m:.{nd}f}"


def main() -> int:
    e = os.environ.get
    out_dir = Path(e("BENCH_OUT", str(ROOT / "bench" / "out")))
    work = Path(e("BENCH_WORK", "/tmp/polycorn-bench-cc"))
    sets = (e("CC_SETS") or " ".join(SETS)).split()
    jobs = int(e("CC_JOBS", "2"))
    for s in sets:
        if s not in SETS:
            raise BenchError(f"CC_SETS: unknown set {s!r} (use {', '.join(SETS)})")
    prov = provenance.start(out_dir / "cc.json")
    for b in ("polycorn-ccsim", "polycorn-tracegen"):
        if not (BIN / b).exists():
            raise BenchError(f"{BIN / b} is missing: run make build")
    doc: dict[str, Any] = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "default": DEFAULT,
        "variants": VARIANTS,
        "hint_delay_ms": HINT_DELAY_MS,
        "window_s": [45, 165],
        "buffer_bytes": 3_000_000,
        "sets": {},
        "method": (
            "per carrier: share = downlink bytes delivered in the window / trace opportunities "
            "outside blackouts x 1500; sojourn = time in the carrier's buffer; means over trips "
            "(carriers pooled) with a 95 % percentile bootstrap interval that resamples trips; "
            "share_vs_default = geometric mean over (trip, carrier) of share / the default's "
            "share, interval resampling trips"
        ),
    }
    for s in sets:
        routes, trip_seeds, seconds = SETS[s]
        trips = [generate(work / s, r, t, seconds) for r in routes for t in trip_seeds]
        n = f"{len(trips)} trips x {len(CARRIERS)} carriers x {len(VARIANTS)} variants"
        print(f"bench-cc: {s}: {n}", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            rows = [r for batch in pool.map(replay, trips) for r in batch]
        for r in rows:
            r["trip"] = f"{s}/{r['trip']}"
        doc["sets"][s] = summarise(rows)
        print(f"\n{s} ({len(trips)} trips)")
        print("| variant | carrier share | × default | queueing p50 ms | queueing p95 ms |")
        print("|---|---|---|---|---|")
        for v, x in doc["sets"][s]["variants"].items():
            r = x["share_vs_default"]
            ci = r["ci95_trips"]
            rv = f"{r['ratio']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and r["ratio"] else "-"
            print(
                f"| `{v}` | {fmt(x['share'])} | {rv} | {fmt(x['sojourn_p50_ms'], 0)} | "
                f"{fmt(x['sojourn_p95_ms'], 0)} |"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = prov.stamp(doc)
    (out_dir / "cc.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"bench-cc: wrote {out_dir / 'cc.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"bench-cc: {err}", file=sys.stderr)
        sys.exit(1)
