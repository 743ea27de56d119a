"""``make bench-matching``: the cost of map matching a batch of fixes, the
batched candidate search against the per-train one, side by side.

    python -m polycorn_benchrun.matching [--trains 200] [--fixes 60] [--rounds 7]
        [--seed 1] [--out FILE]

Against the real PostGIS of ``scripts/infra.sh`` (env
``POLYCORN_DATABASE_URL``), on a fresh database holding one route: a
double-track line 9.0 km long (3 km straight, a 3 km-radius quarter curve,
1.3 km straight; tracks 4.5 m apart; a vertex every 20 m, as a surveyed or
OSM line has on curves). A batch is T trains of F fixes each (one a second
at 80 m/s, 20 m of GPS noise per axis, half of them in each direction, spread
along the line): what ingest matches when a batch holds a second of a fleet's
fixes or a minute of a few trains'.

Each round matches the same batch both ways, in alternating order:

- ``per_train``: one candidate query per train (:func:`mapmatch.pieces_near`)
  and :func:`mapmatch.nearest_per_track` in Python per fix, then Viterbi
  and smoothing (ingest's path before this benchmark existed);
- ``batched``: :func:`mapmatch.candidates` once for the batch (one query,
  numpy projections), then the same Viterbi and smoothing per train
  (ingest's path now).

Both must give the same matches (checked every round). Reported: each way's
milliseconds per fix per round, and the per-round ratio per_train/batched
with its geometric mean and a 95 % bootstrap interval over the rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from polycorn_benchrun.ingest import _machine
from polycorn_harness import provenance
from polycorn_ingest import mapmatch
from polycorn_ingest.routes import parse_geojson, store
from polycorn_schema.testing import fresh_database

LAT0, LON0 = 39.80, 116.30
GAUGE_M = 4.5
NOISE_M = 20.0
SPEED = 80.0
STRAIGHT, RADIUS, TAIL = 3000.0, 3000.0, 1300.0
LENGTH = STRAIGHT + RADIUS * math.pi / 2 + TAIL


def _lonlat(x: float, y: float) -> tuple[float, float]:
    lat = LAT0 + math.degrees(y / mapmatch.EARTH_R)
    lon = LON0 + math.degrees(x / (mapmatch.EARTH_R * math.cos(math.radians(LAT0))))
    return lon, lat


def _point(s: float, off: float) -> tuple[float, float]:
    """(x, y) metres of the point ``off`` to the right of the centre at s."""
    arc = RADIUS * math.pi / 2
    if s <= STRAIGHT:
        x, y, h = s, 0.0, math.pi / 2
    elif s <= STRAIGHT + arc:
        th = (s - STRAIGHT) / RADIUS
        x, y, h = STRAIGHT + RADIUS * math.sin(th), RADIUS * (1 - math.cos(th)), math.pi / 2 - th
    else:
        x, y, h = STRAIGHT + RADIUS, RADIUS + (s - STRAIGHT - arc), 0.0
    return x + off * math.cos(h), y - off * math.sin(h)


def route() -> dict[str, Any]:
    def line(off: float) -> list[tuple[float, float]]:
        return [_lonlat(*_point(min(LENGTH, 20.0 * k), off)) for k in range(int(LENGTH // 20) + 2)]

    feats: list[dict[str, Any]] = [
        {"type": "Feature", "properties": {"route": "bench"}, "geometry": {}},
        {"type": "Feature", "properties": {"route": "bench", "track": "R"}, "geometry": {}},
        {"type": "Feature", "properties": {"route": "bench", "track": "L"}, "geometry": {}},
    ]
    for f, off in zip(feats, (0.0, GAUGE_M / 2, -GAUGE_M / 2), strict=True):
        f["geometry"] = {"type": "LineString", "coordinates": line(off)}
    return {"type": "FeatureCollection", "features": feats}


def batch(trains: int, fixes: int, seed: int) -> list[list[mapmatch.Fix]]:
    rng = random.Random(seed)  # noqa: S311 (reproducible test data, not secrets)
    out = []
    span = SPEED * fixes
    for k in range(trains):
        up = k % 2 == 0
        s0 = rng.uniform(100.0, LENGTH - span - 100.0)
        seq = []
        for n in range(fixes):
            s = s0 + SPEED * n if up else s0 + span - SPEED * n
            x, y = _point(s, GAUGE_M / 2 if up else -GAUGE_M / 2)
            lon, lat = _lonlat(x + rng.gauss(0, NOISE_M), y + rng.gauss(0, NOISE_M))
            seq.append(mapmatch.Fix(1_790_000_000_000 + 1000 * n, lat, lon, None, SPEED, NOISE_M))
        out.append(seq)
    return out


def per_train(cur: Any, trains: Sequence[list[mapmatch.Fix]]) -> list[list[mapmatch.Match]]:
    out = []
    for seq in trains:
        cands = [
            mapmatch.nearest_per_track(f, ps)
            for f, ps in zip(seq, mapmatch.pieces_near(cur, seq), strict=True)
        ]
        out.append(mapmatch.match_fixes(cur, seq, None, cands))
    return out


def batched(cur: Any, trains: Sequence[list[mapmatch.Fix]]) -> list[list[mapmatch.Match]]:
    flat = mapmatch.candidates(cur, [f for seq in trains for f in seq])
    out, start = [], 0
    for seq in trains:
        out.append(mapmatch.match_fixes(cur, seq, None, flat[start : start + len(seq)]))
        start += len(seq)
    return out


def _same(a: list[list[mapmatch.Match]], b: list[list[mapmatch.Match]]) -> bool:
    for xs, ys in zip(a, b, strict=True):
        for x, y in zip(xs, ys, strict=True):
            if (x.route_id, x.track, x.direction, x.off_route) != (
                y.route_id,
                y.track,
                y.direction,
                y.off_route,
            ):
                return False
            if (x.measure_m is None) != (y.measure_m is None) or (
                x.measure_m is not None
                and y.measure_m is not None
                and abs(x.measure_m - y.measure_m) > 1e-6
            ):
                return False
    return True


def _bootstrap_gm(ratios: list[float], seed: int, n: int = 10_000) -> tuple[float, float]:
    rng = random.Random(seed)  # noqa: S311 (reproducible test data, not secrets)
    logs = [math.log(r) for r in ratios]
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return math.exp(means[int(0.025 * n)]), math.exp(means[int(0.975 * n) - 1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trains", type=int, default=200)
    ap.add_argument("--fixes", type=int, default=60, help="fixes per train")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench/out/matching.json"))
    a = ap.parse_args(argv)
    if a.trains < 1 or a.fixes < 2 or a.rounds < 2 or SPEED * a.fixes > LENGTH - 400:
        ap.error("need trains >= 1, rounds >= 2, and 2 <= fixes <= 107 (the line is 9 km)")
    prov = provenance.start(a.out)
    trains = batch(a.trains, a.fixes, a.seed)
    n = a.trains * a.fixes
    rounds: list[dict[str, float]] = []
    with fresh_database(prefix="linkdb_bench_match") as url:
        with psycopg.connect(url) as conn, conn.transaction():
            for spec in parse_geojson(route()):
                store(conn, spec)
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            batched(cur, trains[:2])  # warm the caches and the plan
            for r in range(a.rounds):
                got: dict[str, list[list[mapmatch.Match]]] = {}
                ms: dict[str, float] = {}
                ways = (("per_train", per_train), ("batched", batched))
                for name, fn in ways if r % 2 == 0 else ways[::-1]:
                    t = time.perf_counter()
                    got[name] = fn(cur, trains)
                    ms[name] = 1000 * (time.perf_counter() - t) / n
                if not _same(got["per_train"], got["batched"]):
                    raise SystemExit("bench-matching: the two searches disagree")
                rounds.append(ms)
                print(
                    f"round {r + 1}: per_train {ms['per_train']:.3f} ms/fix, "
                    f"batched {ms['batched']:.3f} ms/fix"
                )
    ratios = [x["per_train"] / x["batched"] for x in rounds]
    lo, hi = _bootstrap_gm(ratios, a.seed)
    result = {
        **prov.fields(),
        "benchmark": "matching",
        "method": "one batch matched both ways per round, order alternating; ms per fix "
        "(wall clock, client + database); ratio per_train/batched per round, geometric mean "
        "with a 95 % bootstrap interval over rounds",
        "batch": {"trains": a.trains, "fixes_per_train": a.fixes, "fixes": n},
        "route": {"length_m": round(LENGTH, 1), "tracks": 2, "vertex_spacing_m": 20.0},
        "rounds": rounds,
        "ms_per_fix_median": {
            k: round(statistics.median(x[k] for x in rounds), 4) for k in ("per_train", "batched")
        },
        "speedup": {
            "geomean": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 3),
            "ci95": [round(lo, 3), round(hi, 3)],
        },
        "machine": _machine(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("batch", "ms_per_fix_median", "speedup")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
