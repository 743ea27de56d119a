"""Track geometry into LinkDB: routes from GeoJSON or OpenStreetMap.

A route is a line's linear reference (a linestring whose vertex order is
the direction of increasing ``track_m``, 0 at its first vertex) and the
line's tracks, each with the direction(s) trains run on it. Storing a
route replaces any route of the same id, all in one transaction: the
reference and every track are cut by PostGIS into straight pieces of at
most 500 m (``route_segments``), each with the measure at both ends, which
is what the map matcher (:mod:`polycorn_ingest.mapmatch`) reads.

GeoJSON (``polycorn-ingest routes import FILE.geojson``): a
FeatureCollection of LineString features (a MultiLineString whose parts
join end to end is accepted), grouped into routes by the property
``route`` (else ``route_id``, else the feature's ``id``). A feature with a
``track`` property is a track of its route (``running``: ``increasing``,
``decreasing`` or ``both``, default ``both``); the one without is the
route's reference. A route given only as tracks takes its first track as
the reference. ``name`` names the route.

OpenStreetMap (``FILE.osm``, the XML that ``osmium extract`` or the
Overpass API write): every way tagged ``railway=rail`` (or a ``--railway``
value given) is chained with the ways that continue it into lines (where
three or more way ends meet, the straightest pairs continue: :func:`_pairs`);
each line at least ``min_length_m`` long is a track, the longest
one the reference (its measure runs the way its first way in the file is
drawn), and ``railway:preferred_direction`` (``forward`` /
``backward`` / ``both``, OSM's tag for the running direction) gives each
track's running direction. Shorter lines (sidings, yards) are reported
and left out.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from defusedxml import ElementTree as SafeXml
from defusedxml.common import DefusedXmlException

from polycorn_ingest.mapmatch import haversine_m

PIECE_M = 500.0  # the longest piece in route_segments
RUNNING = ("increasing", "decreasing", "both")

Coords = list[tuple[float, float]]  # (lon, lat)


class RouteError(ValueError):
    """A route file that cannot be stored, with the reason and where."""


@dataclass
class TrackSpec:
    name: str
    running: str
    coords: Coords


@dataclass
class RouteSpec:
    id: str
    name: str
    source: str  # geojson | osm | learned
    reference: Coords
    tracks: list[TrackSpec] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def length_m(coords: Sequence[tuple[float, float]]) -> float:
    return sum(haversine_m(a[1], a[0], b[1], b[0]) for a, b in itertools.pairwise(coords))


def _check_coords(coords: Any, where: str) -> Coords:
    if not isinstance(coords, list) or len(coords) < 2:
        raise RouteError(f"{where}: a line needs at least 2 positions")
    out: Coords = []
    for k, c in enumerate(coords):
        if (
            not isinstance(c, list | tuple)
            or len(c) < 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in c[:2])
        ):
            raise RouteError(f"{where}: position {k} is not [lon, lat]")
        lon, lat = float(c[0]), float(c[1])
        if not (math.isfinite(lon) and math.isfinite(lat)) or abs(lon) > 180 or abs(lat) > 90:
            raise RouteError(f"{where}: position {k} ({lon}, {lat}) is outside WGS 84")
        if out and (lon, lat) == out[-1]:
            continue  # repeated vertex
        out.append((lon, lat))
    if len(out) < 2 or length_m(out) < 1.0:
        raise RouteError(f"{where}: the line has no length")
    return out


def _join_parts(parts: list[Coords], where: str) -> Coords:
    """A MultiLineString's parts joined end to end (within 1 m)."""
    line = list(parts[0])
    for k, p in enumerate(parts[1:], start=1):
        gap = haversine_m(line[-1][1], line[-1][0], p[0][1], p[0][0])
        if gap > 1.0:
            raise RouteError(f"{where}: part {k} starts {gap:.0f} m from the end of part {k - 1}")
        line.extend(p[1:])
    return line


def parse_geojson(doc: Any) -> list[RouteSpec]:
    """Routes from a GeoJSON document (module doc)."""
    refs: dict[str, tuple[Coords, dict[str, Any]]] = {}
    tracks: dict[str, list[TrackSpec]] = defaultdict(list)
    order: list[str] = []
    for n, f in enumerate(_features(doc)):
        where = f"feature {n}"
        rid, props, coords = _read_feature(f, where)
        if rid not in order:
            order.append(rid)
        track = props.get("track")
        if track is None:
            if rid in refs:
                raise RouteError(f"{where}: route {rid!r} has two reference lines")
            refs[rid] = (coords, props)
            continue
        running = str(props.get("running", "both"))
        if running not in RUNNING:
            raise RouteError(f"{where}: running must be one of {', '.join(RUNNING)}")
        name = str(track)
        if not name or len(name) > 64 or any(t.name == name for t in tracks[rid]):
            raise RouteError(f"{where}: track name {name!r} is empty, too long or repeated")
        tracks[rid].append(TrackSpec(name, running, coords))
    out: list[RouteSpec] = []
    for rid in order:
        if rid in refs:
            ref, props = refs[rid]
        else:
            ref, props = tracks[rid][0].coords, {}
        extra = {k: v for k, v in props.items() if k not in ("route", "route_id", "name")}
        name = str(props.get("name") or next(iter(_names(tracks[rid])), rid))
        out.append(RouteSpec(rid, name, "geojson", ref, tracks[rid], extra))
    if not out:
        raise RouteError("GeoJSON: no routes")
    return out


def _features(doc: Any) -> list[Any]:
    """A GeoJSON document's features: a FeatureCollection's, or the one Feature."""
    if not isinstance(doc, dict):
        raise RouteError("GeoJSON: the document is not an object")
    if doc.get("type") == "FeatureCollection":
        feats = doc.get("features")
        if not isinstance(feats, list):
            raise RouteError("GeoJSON: FeatureCollection without a features list")
        return feats
    if doc.get("type") == "Feature":
        return [doc]
    raise RouteError(f"GeoJSON: expected a FeatureCollection or Feature, got {doc.get('type')!r}")


def _read_feature(f: Any, where: str) -> tuple[str, dict[str, Any], Coords]:
    """One feature's route id, properties and line (a MultiLineString's parts joined)."""
    if not isinstance(f, dict) or f.get("type") != "Feature":
        raise RouteError(f"{where}: not a Feature")
    props = f.get("properties") or {}
    if not isinstance(props, dict):
        raise RouteError(f"{where}: properties is not an object")
    rid = props.get("route", props.get("route_id", f.get("id")))
    if rid is None or str(rid).strip() == "" or len(str(rid)) > 128:
        raise RouteError(f"{where}: no route id (property 'route', 'route_id' or the id)")
    geom = f.get("geometry") or {}
    gtype = geom.get("type") if isinstance(geom, dict) else None
    if gtype == "LineString":
        coords = _check_coords(geom.get("coordinates"), where)
    elif gtype == "MultiLineString":
        parts = geom.get("coordinates")
        if not isinstance(parts, list) or not parts:
            raise RouteError(f"{where}: empty MultiLineString")
        coords = _join_parts(
            [_check_coords(p, f"{where} part {k}") for k, p in enumerate(parts)], where
        )
    else:
        raise RouteError(f"{where}: geometry must be a LineString, got {gtype!r}")
    return str(rid), props, coords


def _names(tracks: Iterable[TrackSpec]) -> list[str]:
    return [t.name for t in tracks]


def parse_osm(
    path: Path,
    *,
    route_id: str,
    name: str = "",
    railway: Sequence[str] = ("rail",),
    min_length_m: float = 1000.0,
) -> RouteSpec:
    """One route from an OSM XML extract's railway ways (module doc)."""
    nodes, ways = _read_osm(path, railway)
    chains = _chain(ways, nodes)
    notes: list[str] = []
    lines: list[tuple[Coords, str]] = []
    for refs, pref, wids in chains:
        coords = [nodes[r] for r in refs]
        ln = length_m(coords)
        if ln < min_length_m:
            notes.append(f"left out ways {','.join(wids)}: {ln:.0f} m < {min_length_m:.0f} m")
            continue
        lines.append((coords, pref))
    if not lines:
        raise RouteError(f"{path}: no railway line of at least {min_length_m:.0f} m")
    lines.sort(key=lambda lp: -length_m(lp[0]))
    ref = lines[0][0]
    tracks = []
    for k, (coords, pref) in enumerate(lines):
        same = _same_direction(ref, coords)
        running = {
            "forward": "increasing" if same else "decreasing",
            "backward": "decreasing" if same else "increasing",
        }.get(pref, "both")
        tracks.append(TrackSpec(f"{k + 1}", running, coords))
    props = {"osm_ways": sorted({w for _, _, ws in chains for w in ws}, key=int_or_str)}
    return RouteSpec(route_id, name or route_id, "osm", ref, tracks, props, notes)


def _read_osm(
    path: Path, railway: Sequence[str]
) -> tuple[dict[str, tuple[float, float]], list[tuple[str, list[str], dict[str, str]]]]:
    """An OSM XML extract's nodes (id -> lon, lat) and its ways tagged with one of the
    railway values (id, node ids, tags), each way with at least 2 nodes, all present."""
    nodes: dict[str, tuple[float, float]] = {}
    ways: list[tuple[str, list[str], dict[str, str]]] = []
    try:
        for _, el in SafeXml.iterparse(path, events=("end",)):
            if el.tag == "node":
                try:
                    nodes[el.attrib["id"]] = (float(el.attrib["lon"]), float(el.attrib["lat"]))
                except (KeyError, ValueError) as e:
                    raise RouteError(f"{path}: node {el.attrib.get('id')!r}: {e}") from e
                el.clear()
            elif el.tag == "way":
                tags = {t.attrib.get("k", ""): t.attrib.get("v", "") for t in el.iter("tag")}
                if tags.get("railway") in railway:
                    refs = [nd.attrib["ref"] for nd in el.iter("nd") if "ref" in nd.attrib]
                    ways.append((el.attrib.get("id", "?"), refs, tags))
                el.clear()
    except (SafeXml.ParseError, DefusedXmlException) as e:
        raise RouteError(f"{path}: not OSM XML: {e}") from e
    if not ways:
        raise RouteError(f"{path}: no ways tagged railway={'|'.join(railway)}")
    for wid, refs, _ in ways:
        missing = [r for r in refs if r not in nodes]
        if missing or len(refs) < 2:
            raise RouteError(
                f"{path}: way {wid} refers to nodes not in the extract ({', '.join(missing[:3])})"
                if missing
                else f"{path}: way {wid} has fewer than 2 nodes"
            )
    return nodes, ways


def int_or_str(s: str) -> tuple[int, str]:
    return (int(s), "") if s.isdigit() else (0, s)


# Two way ends meeting at a junction continue each other (a train can run
# from one onto the other) when the line turns by at most this much there;
# turnouts diverge by a few degrees, so the straightest pair is the through
# route and the other ends (sidings, crossovers, branch lines) stop.
MAX_DEFLECTION_DEG = 30.0
# A way end's direction is taken from its vertex at least this far away
# (the first vertices at a switch are metres apart and noisy).
BEARING_BASE_M = 30.0


def _bearing(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Initial bearing from a to b ((lon, lat) degrees), in degrees."""
    la1, la2 = math.radians(a[1]), math.radians(b[1])
    dl = math.radians(b[0] - a[0])
    y = math.sin(dl) * math.cos(la2)
    x = math.cos(la1) * math.sin(la2) - math.sin(la1) * math.cos(la2) * math.cos(dl)
    return math.degrees(math.atan2(y, x)) % 360


def _leaving(refs: list[str], nodes: dict[str, tuple[float, float]]) -> float:
    """The bearing of a way leaving its first node ``refs[0]``."""
    start = nodes[refs[0]]
    far = nodes[refs[1]]
    for r in refs[1:]:
        far = nodes[r]
        if haversine_m(start[1], start[0], far[1], far[0]) >= BEARING_BASE_M:
            break
    return _bearing(start, far)


def _pairs(
    ways: list[tuple[str, list[str], dict[str, str]]], nodes: dict[str, tuple[float, float]]
) -> dict[tuple[int, bool], tuple[int, bool]]:
    """Which way end continues which, as (way, at its last node) keys: at a
    node where two ends meet they continue each other; where three or more
    meet (a switch, a junction), the pairs that turn least, straightest
    first, up to MAX_DEFLECTION_DEG ("strokes", as road networks are
    generalised)."""
    ends: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for k, (_, refs, _) in enumerate(ways):
        ends[refs[0]].append((k, False))
        ends[refs[-1]].append((k, True))
    out: dict[tuple[int, bool], tuple[int, bool]] = {}
    for es in ends.values():
        if len(es) == 2:
            out[es[0]], out[es[1]] = es[1], es[0]
            continue
        if len(es) < 2:
            continue
        heading = {e: _leaving(ways[e[0]][1][::-1] if e[1] else ways[e[0]][1], nodes) for e in es}
        cands = []
        for e, f in itertools.combinations(es, 2):
            turn = abs((heading[e] - heading[f]) % 360 - 180)  # 0: straight on
            if turn <= MAX_DEFLECTION_DEG and e[0] != f[0]:
                cands.append((turn, e, f))
        taken: set[tuple[int, bool]] = set()
        for _, e, f in sorted(cands):
            if e not in taken and f not in taken:
                taken |= {e, f}
                out[e], out[f] = f, e
    return out


def _chain(
    ways: list[tuple[str, list[str], dict[str, str]]], nodes: dict[str, tuple[float, float]]
) -> list[tuple[list[str], str, list[str]]]:
    """Ways joined end to end where they continue each other (:func:`_pairs`):
    each chain's nodes, its running direction in its own digitisation
    (``forward``/``backward``/``both``; mixed is ``both``) and its way ids."""
    pairs = _pairs(ways, nodes)
    used = [False] * len(ways)

    def nodes_of(k: int, flipped: bool) -> list[str]:
        refs = ways[k][1]
        return refs[::-1] if flipped else refs

    def grow(chain: list[tuple[int, bool]]) -> None:
        while True:
            k, flipped = chain[-1]
            nxt = pairs.get((k, not flipped))  # the end we are leaving by
            if nxt is None or used[nxt[0]]:
                return
            used[nxt[0]] = True
            chain.append((nxt[0], nxt[1]))  # entered at its last node: run it flipped

    out: list[tuple[list[str], str, list[str]]] = []
    for k in range(len(ways)):
        if used[k]:
            continue
        used[k] = True
        chain = [(k, False)]
        grow(chain)
        chain = [(w, not f) for w, f in reversed(chain)]
        grow(chain)
        chain = [(w, not f) for w, f in reversed(chain)]  # as way k is drawn
        refs = list(nodes_of(*chain[0]))
        for w, f in chain[1:]:
            refs.extend(nodes_of(w, f)[1:])
        prefs = set()
        for w, f in chain:
            p = ways[w][2].get("railway:preferred_direction", "both")
            if p not in ("forward", "backward"):
                p = "both"
            elif f:
                p = "backward" if p == "forward" else "forward"
            prefs.add(p)
        out.append(
            (refs, prefs.pop() if len(prefs) == 1 else "both", [ways[w][0] for w, _ in chain])
        )
    return out


def _same_direction(ref: Coords, line: Coords) -> bool:
    """Whether ``line`` runs the way ``ref`` does: its start is nearer the
    reference's start than its end is."""

    def d(a: tuple[float, float], b: tuple[float, float]) -> float:
        return haversine_m(a[1], a[0], b[1], b[0])

    return d(line[0], ref[0]) + d(line[-1], ref[-1]) <= d(line[0], ref[-1]) + d(line[-1], ref[0])


def _wkt(coords: Coords) -> str:
    return "LINESTRING(" + ", ".join(f"{x!r} {y!r}" for x, y in coords) + ")"


# The reference's straight pieces (at most PIECE_M) with cumulative
# geodesic measures.
REFERENCE_PIECES = """
INSERT INTO route_segments (route_id, track, seq, start_m, end_m, geog)
SELECT %(id)s, '', d.seq, sum(d.len) OVER w - d.len, sum(d.len) OVER w, d.g
FROM (SELECT s.path[1] AS seq, s.geom::geography AS g, ST_Length(s.geom::geography) AS len
      FROM routes r, ST_DumpSegments(ST_Segmentize(r.geog, %(piece)s)::geometry) AS s
      WHERE r.id = %(id)s) AS d
WINDOW w AS (ORDER BY d.seq)"""

# A track's pieces, each end's measure projected onto the nearest piece of
# the reference.
TRACK_PIECES = """
WITH p AS (
  SELECT s.path[1] AS seq, s.geom AS g
  FROM ST_DumpSegments(ST_Segmentize(ST_GeogFromText(%(wkt)s), %(piece)s)::geometry) AS s),
m AS (
  SELECT p.seq, p.g,
    (SELECT r.start_m + ST_LineLocatePoint(r.geog::geometry, ST_StartPoint(p.g))
            * (r.end_m - r.start_m)
     FROM route_segments r WHERE r.route_id = %(id)s AND r.track = ''
     ORDER BY r.geog <-> ST_StartPoint(p.g)::geography LIMIT 1) AS m0,
    (SELECT r.start_m + ST_LineLocatePoint(r.geog::geometry, ST_EndPoint(p.g))
            * (r.end_m - r.start_m)
     FROM route_segments r WHERE r.route_id = %(id)s AND r.track = ''
     ORDER BY r.geog <-> ST_EndPoint(p.g)::geography LIMIT 1) AS m1
  FROM p)
INSERT INTO route_segments (route_id, track, seq, start_m, end_m, geog)
SELECT %(id)s, %(track)s, seq, m0, m1, g::geography FROM m"""


def store(conn: Any, spec: RouteSpec) -> dict[str, Any]:
    """Replace route ``spec.id`` in LinkDB (``conn``: psycopg, inside the
    caller's transaction). Returns what was stored."""
    with conn.cursor() as cur:
        cur.execute("DELETE FROM routes WHERE id = %s", (spec.id,))
        cur.execute(
            "INSERT INTO routes (id, name, source, length_m, geog, properties) "
            "VALUES (%(id)s, %(name)s, %(src)s, 0, ST_GeogFromText(%(wkt)s), %(props)s::jsonb)",
            {
                "id": spec.id,
                "name": spec.name,
                "src": spec.source,
                "wkt": _wkt(spec.reference),
                "props": json.dumps(spec.properties),
            },
        )
        cur.execute(
            "UPDATE routes SET length_m = ST_Length(geog) WHERE id = %s RETURNING length_m",
            (spec.id,),
        )
        row = cur.fetchone()
        total = float(row[0]) if row else 0.0
        cur.execute(REFERENCE_PIECES, {"id": spec.id, "piece": PIECE_M})
        pieces = cur.rowcount
        for t in spec.tracks:
            cur.execute(
                "INSERT INTO route_tracks (route_id, track, running, geog) "
                "VALUES (%s, %s, %s, ST_GeogFromText(%s))",
                (spec.id, t.name, t.running, _wkt(t.coords)),
            )
            cur.execute(
                TRACK_PIECES,
                {"id": spec.id, "track": t.name, "wkt": _wkt(t.coords), "piece": PIECE_M},
            )
            pieces += cur.rowcount
    return {
        "route": spec.id,
        "name": spec.name,
        "source": spec.source,
        "length_m": round(total, 1),
        "tracks": [{"track": t.name, "running": t.running} for t in spec.tracks],
        "pieces": pieces,
        "notes": spec.notes,
    }


def load(
    path: Path,
    *,
    fmt: str | None = None,
    route_id: str | None = None,
    name: str = "",
    railway: Sequence[str] = ("rail",),
    min_length_m: float = 1000.0,
) -> list[RouteSpec]:
    """Parse a route file; ``fmt`` geojson or osm (default: by extension)."""
    kind = fmt or ("osm" if path.suffix.lower() in (".osm", ".xml") else "geojson")
    if kind == "osm":
        if not route_id or len(route_id) > 128:
            raise RouteError("an OSM extract needs --route-id (at most 128 characters)")
        spec = parse_osm(
            path, route_id=route_id, name=name, railway=railway, min_length_m=min_length_m
        )
        return [spec]
    if kind != "geojson":
        raise RouteError(f"unknown route format {kind!r} (geojson or osm)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RouteError(f"{path}: {e}") from e
    return parse_geojson(doc)
