"""Map matching: a train's GPS fixes onto LinkDB's routes.

Each fix gets a route, a track, a measure along the route (``track_m``) and
the direction of travel, or ``off_route`` when no route explains it (a
depot, a GPS jump). PostGIS finds the candidates: the route pieces
(``route_segments``, at most 500 m each) within :data:`SEARCH_M` of a fix,
through their GiST index. This module then decides between them with a
hidden Markov model over the train's fixes in time order (Newson and
Krumm, "Hidden Markov map matching through noise and sparseness", 2009,
adapted to rails):

- a state is ⟨route, direction⟩ on the nearest track that carries trains
  in that direction (a double-track line usually has one track per
  direction, so the direction picks the track where 20 m of GPS noise
  cannot), or *off route*;
- emission: the fix's distance from that track against its accuracy
  (Gaussian, σ = the fix's accuracy clamped to [5, 50] m, 15 m when not
  given), and its heading against the track's bearing in that direction
  (σ 30°, only when the fix moves at ≥ 3 m/s);
- transition: |distance along the route − great-circle distance| / β
  between consecutive fixes (β 20 m), so a train keeps its direction and
  moves forward; a reversal, a change of route and leaving or joining the
  line cost a fixed amount each;
- the most likely sequence (Viterbi). The train's last matched fix in
  LinkDB seeds it, so a batch boundary does not break continuity;
- the measures of each run of fixes along one route are then smoothed
  (:func:`smooth`), so GPS error along the track averages out.

The measure of a fix is the measure of its foot on the nearest piece,
interpolated between the piece's ends (a local tangent-plane projection
over at most 500 m: centimetres of error against the spheroid).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from polycorn_ingest.sqltime import ms, ts

SEARCH_M = 150.0  # candidate pieces within this distance of a fix
EARTH_R = 6_371_008.8  # mean Earth radius, metres

# Model constants (costs are negative log-likelihoods, in nats).
SIGMA_DEFAULT_M = 15.0
SIGMA_MIN_M = 5.0
SIGMA_MAX_M = 50.0
HEADING_SIGMA_DEG = 30.0
HEADING_MIN_SPEED_MPS = 3.0
HEADING_COST_CAP = 8.0
BETA_M = 20.0
TRANSITION_COST_CAP = 30.0
OFF_ROUTE_COST = 6.0  # emission of "off route": a fix ~3.5 σ from every track
JOIN_LEAVE_COST = 4.0
ROUTE_CHANGE_COST = 8.0
REVERSAL_COST = 12.0
CONTINUITY_S = 120.0  # fixes further apart than this are matched independently


@dataclass(frozen=True)
class Fix:
    t_ms: int
    lat: float
    lon: float
    heading_deg: float | None = None
    speed_mps: float | None = None
    accuracy_m: float | None = None


@dataclass(frozen=True)
class Piece:
    """A route piece near a fix, as PostGIS returned it."""

    route_id: str
    track: str  # "" for the route's reference line
    running: str  # increasing | decreasing | both
    lon0: float
    lat0: float
    lon1: float
    lat1: float
    start_m: float  # measure at (lon0, lat0)
    end_m: float  # measure at (lon1, lat1)


@dataclass(frozen=True)
class Candidate:
    """The nearest point of one track of one route to a fix."""

    route_id: str
    track: str
    running: str
    measure_m: float
    dist_m: float
    bearing_deg: float  # the track's bearing in the direction of increasing measure


@dataclass(frozen=True)
class Match:
    route_id: str | None
    track: str | None
    measure_m: float | None
    direction: str | None  # increasing | decreasing
    dist_m: float | None
    off_route: bool


OFF = Match(None, None, None, None, None, True)


@dataclass(frozen=True)
class Prior:
    """The train's last matched fix before the batch."""

    t_ms: int
    lat: float
    lon: float
    match: Match


def haversine_m(lat0: float, lon0: float, lat1: float, lon1: float) -> float:
    p0, p1 = math.radians(lat0), math.radians(lat1)
    dp, dl = p1 - p0, math.radians(lon1 - lon0)
    a = math.sin(dp / 2) ** 2 + math.cos(p0) * math.cos(p1) * math.sin(dl / 2) ** 2
    return 2 * EARTH_R * math.asin(min(1.0, math.sqrt(a)))


def _local(lat0: float, lon0: float, lat: float, lon: float) -> tuple[float, float]:
    """(east, north) metres of (lat, lon) in the tangent plane at (lat0, lon0)."""
    x = math.radians(lon - lon0) * EARTH_R * math.cos(math.radians(lat0))
    y = math.radians(lat - lat0) * EARTH_R
    return x, y


def candidate(fix: Fix, p: Piece) -> Candidate:
    """Project a fix onto a piece: its measure, distance and bearing."""
    x1, y1 = _local(p.lat0, p.lon0, p.lat1, p.lon1)
    px, py = _local(p.lat0, p.lon0, fix.lat, fix.lon)
    seg2 = x1 * x1 + y1 * y1
    f = 0.0 if seg2 <= 0 else max(0.0, min(1.0, (px * x1 + py * y1) / seg2))
    dx, dy = px - f * x1, py - f * y1
    bearing = math.degrees(math.atan2(x1, y1)) % 360.0
    if p.end_m < p.start_m:  # a piece digitised against the measure
        bearing = (bearing + 180.0) % 360.0
    return Candidate(
        route_id=p.route_id,
        track=p.track,
        running=p.running,
        measure_m=p.start_m + f * (p.end_m - p.start_m),
        dist_m=math.hypot(dx, dy),
        bearing_deg=bearing,
    )


def nearest_per_track(fix: Fix, pieces: Sequence[Piece]) -> list[Candidate]:
    """The nearest point of each track, and of each further pass of a track
    near the fix (a route that loops back): local minima at least
    2 × SEARCH_M apart along the route."""
    cands = sorted((candidate(fix, p) for p in pieces), key=lambda c: c.dist_m)
    kept: list[Candidate] = []
    for c in cands:
        if c.dist_m > SEARCH_M:
            break
        if any(
            k.route_id == c.route_id
            and k.track == c.track
            and abs(k.measure_m - c.measure_m) < 2 * SEARCH_M
            for k in kept
        ):
            continue
        kept.append(c)
    return kept


@dataclass(frozen=True)
class _State:
    route_id: str
    direction: int  # +1 increasing, -1 decreasing
    cand: Candidate


def _states(cands: Sequence[Candidate]) -> list[_State]:
    """⟨route, direction⟩ states of one fix: per route pass and direction,
    the nearest track that runs that way. The reference line ("") stands
    for the route only when the route has no tracks near the fix."""
    best: dict[tuple[str, int, int], _State] = {}
    has_tracks = {c.route_id for c in cands if c.track}
    for c in cands:
        if c.track == "" and c.route_id in has_tracks:
            continue
        for d in (1, -1):
            if (c.running == "increasing" and d < 0) or (c.running == "decreasing" and d > 0):
                continue
            # One state per pass of the route: candidates of its tracks
            # within the same 600 m of measure are one pass (passes are at
            # least 2 × SEARCH_M apart, nearest_per_track); a pass that
            # straddles a bucket boundary gives two states of the same
            # route and direction, which Viterbi treats as equals.
            key = (c.route_id, d, int(c.measure_m // (4 * SEARCH_M)))
            old = best.get(key)
            if old is None or c.dist_m < old.cand.dist_m:
                best[key] = _State(c.route_id, d, c)
    return list(best.values())


def _sigma(fix: Fix) -> float:
    if fix.accuracy_m is None or not math.isfinite(fix.accuracy_m) or fix.accuracy_m <= 0:
        return SIGMA_DEFAULT_M
    return max(SIGMA_MIN_M, min(SIGMA_MAX_M, fix.accuracy_m))


def _angle(a: float, b: float) -> float:
    d = abs(a - b) % 360.0
    return min(d, 360.0 - d)


def _emission(fix: Fix, s: _State) -> float:
    z = s.cand.dist_m / _sigma(fix)
    cost = 0.5 * z * z
    h, v = fix.heading_deg, fix.speed_mps
    moving = v is not None and math.isfinite(v) and v >= HEADING_MIN_SPEED_MPS
    if h is not None and math.isfinite(h) and moving:
        travel = s.cand.bearing_deg if s.direction > 0 else s.cand.bearing_deg + 180.0
        e = _angle(h, travel) / HEADING_SIGMA_DEG
        cost += min(HEADING_COST_CAP, 0.5 * e * e)
    return cost


def _transition(a: _State | None, b: _State | None, gc_m: float) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return JOIN_LEAVE_COST
    if a.route_id != b.route_id:
        return ROUTE_CHANGE_COST
    moved = (b.cand.measure_m - a.cand.measure_m) * a.direction
    cost = abs(moved - gc_m) / BETA_M if a.direction == b.direction else REVERSAL_COST
    if a.direction != b.direction:
        cost += abs(abs(moved) - gc_m) / BETA_M
    return min(TRANSITION_COST_CAP, cost)


def _state_match(s: _State | None) -> Match:
    if s is None:
        return OFF
    c = s.cand
    return Match(
        route_id=s.route_id,
        track=c.track or None,
        measure_m=c.measure_m,
        direction="increasing" if s.direction > 0 else "decreasing",
        dist_m=c.dist_m,
        off_route=False,
    )


def _prior_state(prior: Prior | None) -> _State | None:
    if prior is None or prior.match.off_route or prior.match.route_id is None:
        return None
    m = prior.match
    d = 1 if m.direction == "increasing" else -1
    c = Candidate(m.route_id or "", m.track or "", "both", m.measure_m or 0.0, 0.0, 0.0)
    return _State(m.route_id or "", d, c)


def viterbi(
    fixes: Sequence[Fix], cands: Sequence[Sequence[Candidate]], prior: Prior | None = None
) -> list[Match]:
    """The most likely matches of a train's fixes (time order), given each
    fix's candidates. Deterministic: ties go to the first state listed."""
    out: list[Match] = []
    if not fixes:
        return out
    # Per step: the states (None = off route), their best cost and back-pointer.
    steps: list[list[_State | None]] = []
    costs: list[list[float]] = []
    backs: list[list[int]] = []
    prev_fix: Fix | None = None
    prev_states: list[_State | None] = []
    prev_costs: list[float] = []
    if prior is not None:
        prev_fix = Fix(prior.t_ms, prior.lat, prior.lon)
        prev_states = [_prior_state(prior)]
        prev_costs = [0.0]
    for fix, cs in zip(fixes, cands, strict=True):
        states: list[_State | None] = [None, *_states(cs)]
        emit = [OFF_ROUTE_COST] + [_emission(fix, s) for s in states[1:] if s is not None]
        step_costs: list[float] = []
        step_backs: list[int] = []
        linked = prev_fix is not None and abs(fix.t_ms - prev_fix.t_ms) <= CONTINUITY_S * 1000
        gc = haversine_m(prev_fix.lat, prev_fix.lon, fix.lat, fix.lon) if prev_fix else 0.0
        base = min(prev_costs) if prev_costs else 0.0
        for s, e in zip(states, emit, strict=True):
            if not linked or not prev_states:
                step_costs.append(base + e)
                step_backs.append(int(prev_costs.index(base)) if prev_costs else -1)
                continue
            best, arg = math.inf, -1
            for j, (p, pc) in enumerate(zip(prev_states, prev_costs, strict=True)):
                c = pc + _transition(p, s, gc)
                if c < best:
                    best, arg = c, j
            step_costs.append(best + e)
            step_backs.append(arg)
        steps.append(states)
        costs.append(step_costs)
        backs.append(step_backs)
        prev_fix, prev_states, prev_costs = fix, states, step_costs
    # Back-track (the prior, if any, is not part of the output).
    i = min(range(len(costs[-1])), key=lambda k: costs[-1][k])
    for n in range(len(steps) - 1, -1, -1):
        out.append(_state_match(steps[n][i]))
        i = backs[n][i]
        if n > 0 and i < 0:
            i = 0
    out.reverse()
    return out


# PostGIS: the pieces within SEARCH_M of each fix (GiST on route_segments),
# with their tracks' running directions.
CANDIDATE_PIECES = """
SELECT f.i, s.route_id, s.track, COALESCE(t.running::text, 'both'),
       s.lon0, s.lat0, s.lon1, s.lat1, s.start_m, s.end_m
FROM unnest(%(lon)s::float8[], %(lat)s::float8[]) WITH ORDINALITY AS f(lon, lat, i)
JOIN route_segments s
  ON ST_DWithin(s.geog, ST_SetSRID(ST_MakePoint(f.lon, f.lat), 4326)::geography, %(r)s, false)
LEFT JOIN route_tracks t ON t.route_id = s.route_id AND t.track = s.track
ORDER BY f.i, s.route_id, s.track, s.seq"""


def pieces_near(cur: Any, fixes: Sequence[Fix]) -> list[list[Piece]]:
    """Each fix's nearby route pieces, from LinkDB (``cur``: a psycopg cursor)."""
    out: list[list[Piece]] = [[] for _ in fixes]
    if not fixes:
        return out
    cur.execute(
        CANDIDATE_PIECES,
        {"lon": [f.lon for f in fixes], "lat": [f.lat for f in fixes], "r": SEARCH_M},
    )
    for i, route, track, running, x0, y0, x1, y1, m0, m1 in cur.fetchall():
        out[int(i) - 1].append(Piece(route, track, running, x0, y0, x1, y1, m0, m1))
    return out


SMOOTH_S = 5.0  # half-width of the measure's smoothing window


def smooth(fixes: Sequence[Fix], matches: Sequence[Match]) -> list[Match]:
    """Measures smoothed along the train's run: each matched fix's measure
    is the value at its time of a least-squares line (measure against time)
    through the fixes of the same run within ±SMOOTH_S (a run: consecutive
    fixes on one route in one direction, at most SMOOTH_S apart, moving as
    the route allows). The GPS error along the track averages out (about
    1/√11 at 1 Hz); the bias is a quarter of the acceleration times
    SMOOTH_S², under 7 m at 1 m/s²."""
    out = list(matches)
    runs: list[list[int]] = []
    for i, m in enumerate(matches):
        if m.off_route or m.measure_m is None:
            continue
        if runs:
            j = runs[-1][-1]
            p = matches[j]
            gap = (fixes[i].t_ms - fixes[j].t_ms) / 1000.0
            if (
                j == i - 1
                and p.route_id == m.route_id
                and p.direction == m.direction
                and gap <= SMOOTH_S
                and abs(m.measure_m - (p.measure_m or 0.0)) <= 2 * SEARCH_M + 150.0 * gap
            ):
                runs[-1].append(i)
                continue
        runs.append([i])
    for run in runs:
        lo = 0
        for i in run:
            t = fixes[i].t_ms / 1000.0
            while fixes[run[lo]].t_ms / 1000.0 < t - SMOOTH_S:
                lo += 1
            win = [k for k in run[lo:] if fixes[k].t_ms / 1000.0 <= t + SMOOTH_S]
            if len(win) < 3:
                continue
            ts = [fixes[k].t_ms / 1000.0 - t for k in win]
            ms = [matches[k].measure_m or 0.0 for k in win]
            n = len(win)
            mt, mm = sum(ts) / n, sum(ms) / n
            var = sum((x - mt) ** 2 for x in ts)
            if var <= 0:
                continue
            slope = sum((x - mt) * (y - mm) for x, y in zip(ts, ms, strict=True)) / var
            out[i] = replace(matches[i], measure_m=mm - slope * mt)
    return out


# The same pieces as CANDIDATE_PIECES, as one row of arrays (binary float8[]
# transfer, no per-row tuples) with each piece's track as its 1-based
# position in the list of "route<US>track" keys passed in (a function, not a
# join, so the planner keeps driving the search from the fixes and the GiST).
# The aggregates of one query level see the rows in one order, so the arrays
# line up; candidates() sorts them itself.
CANDIDATE_ARRAYS = """
SELECT array_agg(f.i),
       array_agg(array_position(%(keys)s::text[], s.route_id || chr(31) || s.track)),
       array_agg(s.lon0),
       array_agg(s.lat0),
       array_agg(s.lon1),
       array_agg(s.lat1),
       array_agg(s.start_m),
       array_agg(s.end_m)
FROM unnest(%(lon)s::float8[], %(lat)s::float8[]) WITH ORDINALITY AS f(lon, lat, i)
JOIN route_segments s
  ON ST_DWithin(s.geog, ST_SetSRID(ST_MakePoint(f.lon, f.lat), 4326)::geography, %(r)s, false)"""

TRACKS = """
SELECT r.id, '', 'both' FROM routes r
UNION ALL
SELECT t.route_id, t.track, t.running::text FROM route_tracks t"""


def candidates(cur: Any, fixes: Sequence[Fix]) -> list[list[Candidate]]:
    """Each fix's candidates: what :func:`nearest_per_track` gives on the
    pieces of :func:`pieces_near`, computed for a whole batch at once (one
    query; projections vectorised with numpy). A fix where some track
    passes twice (pieces of one track within SEARCH_M of it whose
    projections are 2 × SEARCH_M apart or more along the route) takes the
    exact per-fix path; every other fix has at most the nearest point of
    each track, which is what the per-fix rule keeps there."""
    out: list[list[Candidate]] = [[] for _ in fixes]
    if not fixes:
        return out
    cur.execute(TRACKS)
    keys: list[tuple[str, str, str]] = [(str(a), str(b), str(c)) for a, b, c in cur.fetchall()]
    if not keys:
        return out
    cur.execute(
        CANDIDATE_ARRAYS,
        {
            "lon": [f.lon for f in fixes],
            "lat": [f.lat for f in fixes],
            "r": SEARCH_M,
            "keys": [f"{k[0]}\x1f{k[1]}" for k in keys],
        },
        binary=True,
    )
    row = cur.fetchone()
    if row is None or row[0] is None:
        return out
    if any(v is None for v in row[1]):  # a piece of a track not in routes/route_tracks
        raise RuntimeError("route_segments has pieces of an unknown route or track")
    i = np.asarray(row[0], dtype=np.int64) - 1
    j = np.asarray(row[1], dtype=np.int64) - 1
    lon0, lat0, lon1, lat1, m0, m1 = (np.asarray(c, dtype=np.float64) for c in row[2:])
    flat = np.asarray([f.lat for f in fixes])[i]
    flon = np.asarray([f.lon for f in fixes])[i]
    # candidate(), vectorised: the tangent plane at each piece's start.
    scale = EARTH_R * np.cos(np.radians(lat0))
    x1, y1 = np.radians(lon1 - lon0) * scale, np.radians(lat1 - lat0) * EARTH_R
    px, py = np.radians(flon - lon0) * scale, np.radians(flat - lat0) * EARTH_R
    seg2 = x1 * x1 + y1 * y1
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(seg2 > 0, np.clip((px * x1 + py * y1) / seg2, 0.0, 1.0), 0.0)
    dist = np.hypot(px - frac * x1, py - frac * y1)
    measure = m0 + frac * (m1 - m0)
    bearing = np.degrees(np.arctan2(x1, y1)) % 360.0
    bearing = np.where(m1 < m0, (bearing + 180.0) % 360.0, bearing)
    near = dist <= SEARCH_M
    i, j, dist, measure, bearing = i[near], j[near], dist[near], measure[near], bearing[near]
    # Per (fix, track): the nearest piece first.
    order = np.lexsort((dist, j, i))
    i, j, dist, measure, bearing = i[order], j[order], dist[order], measure[order], bearing[order]
    first = np.ones(len(i), dtype=bool)
    first[1:] = (i[1:] != i[:-1]) | (j[1:] != j[:-1])
    group = np.cumsum(first) - 1
    far = np.abs(measure - measure[first][group]) >= 2 * SEARCH_M
    twice = np.zeros(len(fixes), dtype=bool)
    twice[i[far]] = True
    for k in np.flatnonzero(first).tolist():
        fi = int(i[k])
        if twice[fi]:
            continue
        route, track, running = keys[int(j[k])]
        out[fi].append(
            Candidate(route, track, running, float(measure[k]), float(dist[k]), float(bearing[k]))
        )
    exact = np.flatnonzero(twice).tolist()
    for fi, ps in zip(exact, pieces_near(cur, [fixes[fi] for fi in exact]), strict=True):
        out[fi] = nearest_per_track(fixes[fi], ps)
    for cs in out:
        cs.sort(key=lambda c: c.dist_m)
    return out


def match_fixes(
    cur: Any,
    fixes: Sequence[Fix],
    prior: Prior | None = None,
    cands: Sequence[list[Candidate]] | None = None,
) -> list[Match]:
    """Match one train's fixes (time order) against LinkDB's routes;
    ``cands``: their :func:`candidates`, if already fetched with a batch."""
    if cands is None:
        cands = candidates(cur, fixes)
    return smooth(fixes, viterbi(fixes, cands, prior))


def fix_from_row(row: Sequence[Any]) -> Fix:
    """A fix from ingest's staging row (train, t_ms, lat, lon, speed,
    heading, accuracy, track_m)."""
    return Fix(
        t_ms=int(row[1]),
        lat=float(row[2]),
        lon=float(row[3]),
        speed_mps=row[4],
        heading_deg=row[5],
        accuracy_m=row[6],
    )


# Each train's last two matched fixes before its batch (within the
# continuity window): the second-to-last gives the direction.
PRIORS = f"""
SELECT b.train, g.t_ms, g.lat, g.lon, g.route_id, g.track, g.track_m, g.match_dist_m,
       g.off_route
FROM unnest(%(train)s::text[], %(t0)s::bigint[]) AS b(train, t0)
CROSS JOIN LATERAL (
  SELECT {ms("f.time")} AS t_ms, ST_Y(f.geog::geometry) AS lat,
         ST_X(f.geog::geometry) AS lon, f.route_id, f.track, f.track_m, f.match_dist_m,
         f.off_route
  FROM gps_fixes f
  WHERE f.train_id = b.train AND f.off_route IS NOT NULL
    AND f.time < {ts("b.t0")}
    AND f.time >= {ts("b.t0 - %(w)s")}
  ORDER BY f.time DESC LIMIT 2) AS g
ORDER BY b.train, g.t_ms"""


def priors(cur: Any, first_ms: dict[str, int]) -> dict[str, Prior]:
    """Each train's last matched fix before ``first_ms[train]``, with the
    direction of its last move along the route (no prior when unknown)."""
    if not first_ms:
        return {}
    trains = sorted(first_ms)
    cur.execute(
        PRIORS,
        {"train": trains, "t0": [first_ms[t] for t in trains], "w": int(CONTINUITY_S * 1000)},
    )
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for r in cur.fetchall():
        rows.setdefault(r[0], []).append(r)
    out: dict[str, Prior] = {}
    for train, rs in rows.items():
        last = rs[-1]
        _, t_ms, lat, lon, route, track, m, dist, off = last
        if off or route is None or m is None:
            out[train] = Prior(int(t_ms), lat, lon, OFF)
            continue
        if len(rs) < 2 or rs[0][4] != route or rs[0][6] is None or rs[0][6] == m:
            continue  # direction unknown: no prior
        direction = "increasing" if m > rs[0][6] else "decreasing"
        out[train] = Prior(int(t_ms), lat, lon, Match(route, track, m, direction, dist, False))
    return out


HANDOVER_WINDOW_MS = 10_000

# The route and track of each handover's nearest matched fix in LinkDB.
NEAREST_MATCHED = f"""
SELECT h.i, g.route_id, g.track
FROM unnest(%(train)s::text[], %(t)s::bigint[]) WITH ORDINALITY AS h(train, t, i)
CROSS JOIN LATERAL (
  SELECT f.route_id, f.track FROM gps_fixes f
  WHERE f.train_id = h.train AND f.route_id IS NOT NULL
    AND f.time >= {ts("h.t - %(w)s")}
    AND f.time <= {ts("h.t + %(w)s")}
  ORDER BY abs({ms("f.time")} - h.t), f.time LIMIT 1) AS g"""


@dataclass(frozen=True)
class HandoverAt:
    """Where and when a handover started."""

    train: str
    t_ms: int
    lat: float
    lon: float


# A train's matched fixes: (t_ms, route, track) each.
Matched = Mapping[str, Sequence[tuple[int, str, str | None]]]


def handover_positions(
    cur: Any, handovers: Sequence[HandoverAt], matched: Matched
) -> list[tuple[str | None, float | None]]:
    """(route, measure) of each handover: the route and track of the train's
    matched fix nearest in time (``matched``, the caller's fixes, else
    LinkDB's, within 10 s), and the handover's own position projected onto
    that track."""
    want: list[tuple[str, str | None] | None] = []
    missing: list[int] = []
    for k, h in enumerate(handovers):
        best: tuple[int, str, str | None] | None = None
        for t, route, track in matched.get(h.train, ()):
            dt = abs(t - h.t_ms)
            if dt <= HANDOVER_WINDOW_MS and (best is None or dt < best[0]):
                best = (dt, route, track)
        want.append(None if best is None else (best[1], best[2]))
        if best is None:
            missing.append(k)
    if missing:
        cur.execute(
            NEAREST_MATCHED,
            {
                "train": [handovers[k].train for k in missing],
                "t": [handovers[k].t_ms for k in missing],
                "w": HANDOVER_WINDOW_MS,
            },
        )
        for i, route, track in cur.fetchall():
            want[missing[int(i) - 1]] = (route, track)
    pts = [Fix(h.t_ms, h.lat, h.lon) for h in handovers]
    near = pieces_near(cur, pts)
    out: list[tuple[str | None, float | None]] = []
    for fix, w, ps in zip(pts, want, near, strict=True):
        if w is None:
            out.append((None, None))
            continue
        route, track = w
        on = [p for p in ps if p.route_id == route and p.track == (track or "")]
        cs = nearest_per_track(fix, on)
        out.append((route, cs[0].measure_m) if cs else (None, None))
    return out
