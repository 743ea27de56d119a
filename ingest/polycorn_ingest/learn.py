"""A route learned from fleet GPS when no track geometry exists.

``polycorn-ingest learn-route --route-id ID [--train T ...] [--since ISO]
[--until ISO]``: the centre line of the selected fixes (every trip of the
selected trains in the window that ran along the line), as a route of
source ``learned``. How (a principal-curve iteration, Hastie and Stuetzle
1989, on a local tangent plane in metres):

1. **Seed**: the trip with the most fixes, its fixes in time order as a
   polyline (the measure runs the way that trip travelled), simplified
   (Douglas-Peucker, 10 m) and resampled every ``step_m`` (100 m).
2. **Refine**, three times: every fix is projected onto the current line
   (shapely); a fix more than ``max_offset_m`` (60 m) from it is ignored
   (a depot, another line); each vertex moves to the mean of the fixes
   that project within half a step of it (a vertex with none stays), then
   the vertices are smoothed by a moving average of three.
3. **Output**: simplified again (2 m) and stored like an imported route
   (``routes.store``: geodesic pieces and measures); fixes already stored
   can then be matched with ``polycorn-ingest rematch``.

With noise σ per axis, n trips and a fix every v·Δt metres, a vertex
averages about n·step/(v·Δt) fixes: 20 trips at 80 m/s, 1 Hz and 100 m
steps put 25 fixes behind each vertex, so 20 m of noise becomes about 4 m.
A line that branches or that trips run in part only is not handled: the
selection should be trips of one line (by train, time or both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import shapely

from polycorn_ingest.mapmatch import EARTH_R
from polycorn_ingest.routes import RouteError, RouteSpec
from polycorn_ingest.sqltime import ms, ts

FIXES = f"""
SELECT f.train_id, t.id, {ms("f.time")}, ST_X(f.geog::geometry),
       ST_Y(f.geog::geometry)
FROM gps_fixes f
JOIN trips t ON t.train_id = f.train_id AND f.time BETWEEN t.started_at AND t.ended_at
WHERE (%(trains)s::text[] IS NULL OR f.train_id = ANY(%(trains)s))
  AND f.time >= {ts("%(lo)s")}
  AND f.time < {ts("%(hi)s")}
ORDER BY t.id, f.time"""


@dataclass(frozen=True)
class Learned:
    spec: RouteSpec
    fixes: int
    trips: int
    used: int  # fixes within max_offset_m of the final line


def _frame(lon: np.ndarray, lat: np.ndarray) -> tuple[float, float]:
    return float(np.mean(lon)), float(np.mean(lat))


def _to_xy(lon: np.ndarray, lat: np.ndarray, o: tuple[float, float]) -> np.ndarray:
    x = np.radians(lon - o[0]) * EARTH_R * math.cos(math.radians(o[1]))
    y = np.radians(lat - o[1]) * EARTH_R
    return np.column_stack([x, y])


def _to_lonlat(xy: np.ndarray, o: tuple[float, float]) -> list[tuple[float, float]]:
    lon = o[0] + np.degrees(xy[:, 0] / (EARTH_R * math.cos(math.radians(o[1]))))
    lat = o[1] + np.degrees(xy[:, 1] / EARTH_R)
    return [(float(a), float(b)) for a, b in zip(lon, lat, strict=True)]


def _resample(line: shapely.LineString, step: float) -> np.ndarray:
    n = max(2, int(line.length // step) + 1)
    d = np.linspace(0.0, line.length, n)
    return np.array([(p.x, p.y) for p in (line.interpolate(x) for x in d)])


def centre_line(
    trips: Sequence[np.ndarray], *, step_m: float = 100.0, max_offset_m: float = 60.0
) -> tuple[np.ndarray, int]:
    """The centre line (vertices in metres) of trips given as (n, 2) arrays of
    fixes in metres, time-ordered; and how many fixes lie within
    ``max_offset_m`` of it."""
    seed = max(trips, key=len)
    if len(seed) < 2:
        raise RouteError("no trip has two fixes")
    line = shapely.LineString(seed).simplify(10.0)
    if line.length < 2 * step_m:
        raise RouteError(f"the longest trip covers {line.length:.0f} m: too short for a route")
    verts = _resample(line, step_m)
    pts = np.vstack(list(trips))
    geoms = shapely.points(pts)
    for _ in range(3):
        line = shapely.LineString(verts)
        along = shapely.line_locate_point(line, geoms)
        near = shapely.distance(line, geoms) <= max_offset_m
        cum = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(verts, axis=0).T))])
        new = verts.copy()
        idx = np.searchsorted(cum, along[near])
        # The nearest vertex along the line of each near fix.
        idx = np.clip(idx, 0, len(verts) - 1)
        prev = np.clip(idx - 1, 0, len(verts) - 1)
        use_prev = np.abs(along[near] - cum[prev]) < np.abs(cum[idx] - along[near])
        idx = np.where(use_prev, prev, idx)
        sums = np.zeros_like(verts)
        counts = np.zeros(len(verts))
        np.add.at(sums, idx, pts[near])
        np.add.at(counts, idx, 1)
        has = counts > 0
        new[has] = sums[has] / counts[has, None]
        # Moving average of three (the ends keep theirs).
        smooth = new.copy()
        smooth[1:-1] = (new[:-2] + new[1:-1] + new[2:]) / 3.0
        verts = smooth
    final = shapely.LineString(verts)
    used = int(np.count_nonzero(shapely.distance(final, geoms) <= max_offset_m))
    return np.array(final.simplify(2.0).coords), used


def learn(
    cur: Any,
    *,
    route_id: str,
    name: str = "",
    trains: Sequence[str] | None = None,
    since_ms: int,
    until_ms: int,
    step_m: float = 100.0,
    max_offset_m: float = 60.0,
) -> Learned:
    """Learn a route from LinkDB's fixes (``cur``: a psycopg cursor)."""
    if not route_id or len(route_id) > 128:
        raise RouteError("--route-id must be 1 to 128 characters")
    cur.execute(FIXES, {"trains": list(trains) if trains else None, "lo": since_ms, "hi": until_ms})
    rows = cur.fetchall()
    if not rows:
        raise RouteError("no fixes in trips for this selection")
    lon = np.array([r[3] for r in rows], dtype=np.float64)
    lat = np.array([r[4] for r in rows], dtype=np.float64)
    o = _frame(lon, lat)
    xy = _to_xy(lon, lat, o)
    trip_ids = np.array([r[1] for r in rows])
    cuts = np.flatnonzero(np.diff(trip_ids)) + 1
    trips = [t for t in np.split(xy, cuts) if len(t) >= 2]
    verts, used = centre_line(trips, step_m=step_m, max_offset_m=max_offset_m)
    spec = RouteSpec(
        route_id,
        name or route_id,
        "learned",
        _to_lonlat(verts, o),
        [],
        {"learned_from": {"fixes": len(rows), "trips": len(trips), "step_m": step_m}},
    )
    return Learned(spec, len(rows), len(trips), used)
