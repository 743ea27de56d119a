"""Map matching against real PostGIS: routes stored, fixes
matched in ingest's sink.

The line: a curved double-track railway (a straight, a 3 km-radius curve
and a straight, 9 km), one track per running direction 4.5 m apart, and a
second single-track line that runs 60 m beside it for 3 km and then
leaves. Fixes at 1 Hz from a train at 80 m/s with 20 m of GPS noise on
each axis (radial RMS 28 m)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
import shapely
from defusedxml import ElementTree as SafeXml
from helpers import query

from polycorn_ingest import cli, mapmatch, records, testbed
from polycorn_ingest.records import Rows
from polycorn_ingest.routes import RouteError, parse_geojson, parse_osm, store
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.testing import fresh_database

LAT0, LON0 = 39.80, 116.30
T0 = 1_790_000_000_000
GAUGE_M = 4.5
NOISE_M = 20.0


def _lonlat(x: float, y: float) -> tuple[float, float]:
    lat = LAT0 + math.degrees(y / mapmatch.EARTH_R)
    lon = LON0 + math.degrees(x / (mapmatch.EARTH_R * math.cos(math.radians(LAT0))))
    return lon, lat


def centre(s: float) -> tuple[float, float, float]:
    """(x, y, heading rad from north) of the centre line at arc length s:
    3 km east, a 3 km-radius curve turning 90° left, then north."""
    r, a = 3000.0, 3000.0
    arc = r * math.pi / 2
    if s <= a:
        return s, 0.0, math.pi / 2
    if s <= a + arc:
        th = (s - a) / r
        return a + r * math.sin(th), r * (1 - math.cos(th)), math.pi / 2 - th
    return a + r, r + (s - a - arc), 0.0


LENGTH = 3000.0 + 3000.0 * math.pi / 2 + 1300.0


def offset_point(s: float, off: float) -> tuple[float, float]:
    """A point `off` metres to the right of the centre line at s."""
    x, y, h = centre(s)
    return x + off * math.cos(h), y - off * math.sin(h)


def polyline(
    off: float, step: float = 20.0, s0: float = 0.0, s1: float = LENGTH
) -> list[list[float]]:
    n = int((s1 - s0) / step)
    return [list(_lonlat(*offset_point(s0 + (s1 - s0) * k / n, off))) for k in range(n + 1)]


def geojson() -> dict[str, object]:
    """The double-track line "hsr" (reference = centre line, track "R"
    right of it eastbound-increasing, track "L" left of it decreasing) and
    the single track "conv" 60 m to the left for its first 3 km, then
    leaving to the north-west."""
    conv = polyline(-60.0, s0=0.0, s1=3000.0)
    for k in range(1, 40):  # leaves northwards
        conv.append(list(_lonlat(3000.0 - 60.0 - k * 10.0, 60.0 + k * 50.0)))
    return {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "properties": {"route": "hsr", "name": "test high-speed line"},
                "geometry": {"type": "LineString", "coordinates": polyline(0.0)},
            },
            {
                "type": "Feature",
                "properties": {"route": "hsr", "track": "R", "running": "increasing"},
                "geometry": {"type": "LineString", "coordinates": polyline(GAUGE_M / 2)},
            },
            {
                "type": "Feature",
                # digitised against the measure: the importer must cope
                "properties": {"route": "hsr", "track": "L", "running": "decreasing"},
                "geometry": {"type": "LineString", "coordinates": polyline(-GAUGE_M / 2)[::-1]},
            },
            {
                "type": "Feature",
                "properties": {"route": "conv", "name": "conventional line"},
                "geometry": {"type": "LineString", "coordinates": conv},
            },
        ],
    }


@pytest.fixture(scope="module")
def db() -> Iterator[str]:
    with fresh_database() as url:
        with psycopg.connect(url) as conn, conn.transaction():
            for spec in parse_geojson(geojson()):
                store(conn, spec)
        yield url


def trip(
    train: str,
    *,
    increasing: bool,
    rng: random.Random,
    v: float = 80.0,
    t0: int = T0,
    heading: bool = True,
    s_from: float = 200.0,
    s_to: float = LENGTH - 200.0,
) -> tuple[Rows, list[tuple[float, float]]]:
    """A train's fixes along the right-hand track of its direction, with
    noise; and each fix's true (x, y)."""
    rows = Rows()
    truth = []
    n = int((s_to - s_from) / v)
    for k in range(n):
        s = s_from + k * v if increasing else s_to - k * v
        off = GAUGE_M / 2 if increasing else -GAUGE_M / 2
        x, y = offset_point(s, off)
        truth.append((x, y))
        _, _, h = centre(s)
        hdg = math.degrees(h) % 360 if increasing else (math.degrees(h) + 180) % 360
        lon, lat = _lonlat(x + rng.gauss(0, NOISE_M), y + rng.gauss(0, NOISE_M))
        t = t0 + k * 1000
        rows.fixes.append(
            (
                train,
                t,
                lat,
                lon,
                v if heading else None,
                hdg + rng.gauss(0, 3) if heading else None,
                NOISE_M,
                None,
            )
        )
        rows.see(train, t)
        rows.times.append(t)
    return rows, truth


def true_measures(url: str, truth: list[tuple[float, float]]) -> list[float]:
    """The geodesic measure of each true point: its foot on the reference
    line's pieces as PostGIS stored them (the matcher's own geometry)."""
    pts = [mapmatch.Fix(0, lat, lon) for lon, lat in (_lonlat(x, y) for x, y in truth)]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        near = mapmatch.pieces_near(cur, pts)
    out = []
    for p, ps in zip(pts, near, strict=True):
        ref = [q for q in ps if q.route_id == "hsr" and q.track == ""]
        out.append(mapmatch.nearest_per_track(p, ref)[0].measure_m)
    return out


def matched(url: str, train: str) -> list[tuple[str | None, str | None, float | None, bool | None]]:
    return [
        (r[0], r[1], r[2], r[3])
        for r in query(
            url,
            "SELECT route_id, track, track_m, off_route FROM gps_fixes "
            "WHERE train_id = %s ORDER BY time",
            train,
        )
    ]


def write(url: str, rows: Rows) -> None:
    """Store a batch through ingest's sink (matching included)."""
    sink = LinkDbSink(url)
    try:
        sink.write(rows)
    finally:
        sink.close()


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def test_a_route_is_stored_with_its_tracks_and_geodesic_pieces(db: str) -> None:
    (n, length), *_ = query(db, "SELECT count(*), max(length_m) FROM routes WHERE id = 'hsr'")
    assert n == 1
    assert abs(length - LENGTH) < 0.01 * LENGTH
    # Every track piece's measures sit on the reference's, increasing along
    # the reference whatever the track's own digitisation.
    rows = query(
        db,
        "SELECT track, min(least(start_m, end_m)), max(greatest(start_m, end_m)), "
        "bool_and(end_m - start_m >= 0), bool_and(end_m - start_m <= 0) "
        "FROM route_segments WHERE route_id = 'hsr' GROUP BY track ORDER BY track",
    )
    by = {r[0]: r for r in rows}
    assert set(by) == {"", "L", "R"}
    for t in ("", "L", "R"):
        assert by[t][1] < 5 and abs(by[t][2] - length) < 5, by[t]
    assert by["R"][3] and by["L"][4]  # R digitised with the measure, L against it
    longest = query(db, "SELECT max(ST_Length(geog)) FROM route_segments")[0][0]
    assert longest <= 500.5


@pytest.mark.parametrize("increasing", [True, False])
@pytest.mark.parametrize("heading", [True, False])
def test_noisy_fixes_land_on_the_right_track_with_small_measure_error(
    db: str, increasing: bool, heading: bool
) -> None:
    train = f"mm-{increasing}-{heading}"
    rng = random.Random(hash((increasing, heading)) & 0xFFFF)
    rows, truth = trip(train, increasing=increasing, rng=rng, heading=heading)
    write(db, rows)
    got = matched(db, train)
    want_track = "R" if increasing else "L"
    assert len(got) == len(truth)
    on_hsr = [g for g in got if g[0] == "hsr"]
    right_track = sum(1 for g in on_hsr if g[1] == want_track)
    # The conventional line runs 60 m beside the first 3 km: continuity
    # keeps the train on its own line, and the direction picks the track.
    assert len(on_hsr) == len(got), [g for g in got if g[0] != "hsr"][:5]
    assert right_track == len(got)
    errs = [abs((g[2] or 0.0) - m) for g, m in zip(got, true_measures(db, truth), strict=True)]
    assert p95(errs) < 30.0, sorted(errs)[-5:]
    # The trip's direction comes out of the matched measures.
    direction = query(db, "SELECT direction::text FROM trips WHERE train_id = %s", train)
    assert direction == [("increasing" if increasing else "decreasing",)]


def test_depot_fixes_and_a_gps_jump_are_flagged_off_route(db: str) -> None:
    rng = random.Random(5)
    rows, _ = trip("mm-off", increasing=True, rng=rng, s_from=500.0, s_to=2500.0)
    fixes = list(rows.fixes)
    # A GPS jump: one fix 150 m north of the line (it is on the straight).
    k = len(fixes) // 2
    f = fixes[k]
    fixes[k] = (f[0], f[1], f[2] + math.degrees(150.0 / mapmatch.EARTH_R), *f[3:])
    # Then the train stands in a depot 400 m south of the line.
    t_last = fixes[-1][1]
    lon, lat = _lonlat(2500.0, -400.0)
    for j in range(1, 6):
        fixes.append(("mm-off", t_last + j * 1000, lat, lon, 0.0, None, 10.0, None))
    rows.fixes = fixes
    rows.see("mm-off", t_last + 5000)
    write(db, rows)
    got = matched(db, "mm-off")
    off = [i for i, g in enumerate(got) if g[3]]
    assert off == [k, *range(len(got) - 5, len(got))]
    assert all(g[0] is None and g[2] is None for g in got if g[3])
    assert all(g[0] == "hsr" and g[1] == "R" for g in got if not g[3])


def test_a_batch_boundary_keeps_the_line_and_handovers_take_their_measure(db: str) -> None:
    # Two batches of one trip beside the conventional line; the second
    # batch starts where the lines are 60 m apart and leans on the prior.
    rng = random.Random(11)
    rows, truth = trip("mm-split", increasing=True, rng=rng, s_from=300.0, s_to=2900.0)
    first, second = Rows(), Rows()
    half = len(rows.fixes) // 2
    for dst, part in ((first, rows.fixes[:half]), (second, rows.fixes[half:])):
        for f in part:
            dst.fixes.append(f)
            dst.see(f[0], f[1])
    # A handover (no track_m) in the second batch, at a fix's time and place.
    f = rows.fixes[half + 3]
    second.handovers.append(
        ("mm-split", "op", 0, 11, 12, f[1] + 200, f[2], f[3], None, -100.0, "failure", 300)
    )
    sink = LinkDbSink(db)
    try:
        sink.write(first)
        sink.write(second)
    finally:
        sink.close()
    got = matched(db, "mm-split")
    assert all(g[0] == "hsr" and g[1] == "R" for g in got)
    errs = [abs((g[2] or 0.0) - m) for g, m in zip(got, true_measures(db, truth), strict=True)]
    assert p95(errs) < 30.0
    (route, track_m, direction), *_ = query(
        db, "SELECT route_id, track_m, direction::text FROM handovers WHERE train_id = 'mm-split'"
    )
    assert route == "hsr" and direction == "increasing"
    assert track_m is not None and abs(track_m - true_measures(db, [truth[half + 3]])[0]) < 60


def test_a_short_batch_pulled_towards_the_next_line_stays_on_the_trains_line(db: str) -> None:
    # GPS error is not always independent: near buildings a receiver can be
    # off by tens of metres for seconds. Three fixes 35 m left of the train
    # (25 m from the conventional line 60 m away, 37 m from the train's
    # track) arrive as their own batch; the train's matched fixes before
    # them (the prior) keep it on its line.
    rng = random.Random(3)
    rows, _ = trip("mm-prior", increasing=True, rng=rng, s_from=800.0, s_to=2300.0)
    sink = LinkDbSink(db)
    try:
        sink.write(rows)
        t_last = rows.fixes[-1][1]
        s_last = 800.0 + (len(rows.fixes) - 1) * 80.0
        late = Rows()
        for j in range(1, 4):
            lon, lat = _lonlat(*offset_point(s_last + j * 80.0, -35.0))
            late.fixes.append(("mm-prior", t_last + j * 1000, lat, lon, 80.0, 90.0, 20.0, None))
            late.see("mm-prior", t_last + j * 1000)
        sink.write(late)
    finally:
        sink.close()
    got = matched(db, "mm-prior")
    assert [g[0] for g in got[-3:]] == ["hsr"] * 3


def test_without_routes_nothing_is_matched() -> None:
    with fresh_database() as url:
        rows, _ = trip("mm-none", increasing=True, rng=random.Random(1), s_to=2000.0)
        write(url, rows)
        got = matched(url, "mm-none")
        assert got and all(g[0] is None and g[2] is None and g[3] is None for g in got)


@pytest.mark.parametrize(
    ("doc", "msg"),
    [
        ({"type": "Point"}, "FeatureCollection or Feature"),
        ({"type": "FeatureCollection", "features": []}, "no routes"),
        (
            {"type": "Feature", "properties": {}, "geometry": {"type": "LineString"}},
            "no route id",
        ),
        (
            {
                "type": "Feature",
                "properties": {"route": "x"},
                "geometry": {"type": "LineString", "coordinates": [[1, 2]]},
            },
            "at least 2",
        ),
        (
            {
                "type": "Feature",
                "properties": {"route": "x"},
                "geometry": {"type": "LineString", "coordinates": [[1, 2], [200, 2]]},
            },
            "outside WGS 84",
        ),
        (
            {
                "type": "Feature",
                "properties": {"route": "x", "track": "1", "running": "up"},
                "geometry": {"type": "LineString", "coordinates": [[1, 2], [1.1, 2]]},
            },
            "running must be",
        ),
        (
            {
                "type": "Feature",
                "properties": {"route": "x"},
                "geometry": {
                    "type": "MultiLineString",
                    "coordinates": [[[1, 2], [1.1, 2]], [[1.2, 2], [1.3, 2]]],
                },
            },
            "part 1 starts",
        ),
    ],
)
def test_bad_route_files_are_refused_with_the_reason(doc: object, msg: str) -> None:
    with pytest.raises(RouteError, match=msg):
        parse_geojson(doc)


def osm_xml(tmp: Path) -> Path:
    """A synthetic OpenStreetMap extract (built here, no OSM data): the
    double-track line as ways of about 2 km, track "R" eastbound and drawn
    so, track "L" westbound and drawn so except one way drawn eastbound
    (preferred direction backward), a 300 m siding joined to the left
    track, and a road."""
    nodes: list[str] = []
    ways: list[str] = []
    nid = [0]

    def node(x: float, y: float) -> int:
        nid[0] += 1
        lon, lat = _lonlat(x, y)
        nodes.append(f'  <node id="{nid[0]}" lat="{lat:.8f}" lon="{lon:.8f}"/>')
        return nid[0]

    def way(wid: int, refs: list[int], tags: dict[str, str]) -> None:
        body = "".join(f'<nd ref="{r}"/>' for r in refs)
        body += "".join(f'<tag k="{k}" v="{v}"/>' for k, v in tags.items())
        ways.append(f'  <way id="{wid}">{body}</way>')

    for off, base, flip in ((GAUGE_M / 2, 100, False), (-GAUGE_M / 2, 200, True)):
        ids = [node(*offset_point(s, off)) for s in [k * 20.0 for k in range(int(LENGTH / 20))]]
        chunks = [ids[k : k + 101] for k in range(0, len(ids) - 1, 100)]
        for j, ch in enumerate(chunks):
            if not flip:  # eastbound, drawn eastbound
                way(base + j, ch, {"railway": "rail", "railway:preferred_direction": "forward"})
            elif j == 1:  # westbound, but this way is drawn eastbound
                way(base + j, ch, {"railway": "rail", "railway:preferred_direction": "backward"})
            else:  # westbound, drawn westbound
                tags = {"railway": "rail", "railway:preferred_direction": "forward"}
                way(base + j, ch[::-1], tags)
        if flip:
            junction = chunks[1][50]
            x, y = offset_point(3000.0, -GAUGE_M / 2 - 300.0)
            way(300, [junction, node(x, y)], {"railway": "rail", "service": "siding"})
    way(400, [node(0, 500), node(5000, 500)], {"highway": "primary"})
    path = tmp / "line.osm"
    path.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<osm version="0.6" generator="test">\n'
        + "\n".join(nodes + ways)
        + "\n</osm>\n",
        encoding="utf-8",
    )
    return path


def test_an_osm_extract_becomes_a_route_with_running_directions(tmp_path: Path) -> None:
    path = osm_xml(tmp_path)
    spec = parse_osm(path, route_id="osm-line", name="OSM line")
    assert len(spec.tracks) == 2
    assert any("300" in n for n in spec.notes), spec.notes  # the siding, left out
    ref = spec.reference
    by_side = {}
    for t in spec.tracks:
        # Which side of the reference: the track whose first vertex is the
        # reference's own is the reference.
        by_side["ref" if t.coords == ref else "other"] = t
    assert set(by_side) == {"ref", "other"}
    # The measure runs the way the file's first railway way (track R's,
    # eastbound) is drawn; R runs "increasing", L "decreasing", its way
    # drawn the other way included.
    assert ref[0][0] < ref[-1][0]
    south = min(spec.tracks, key=lambda t: min(c[1] for c in t.coords))
    north = max(spec.tracks, key=lambda t: min(c[1] for c in t.coords))
    assert south.running == "increasing" and north.running == "decreasing"
    assert by_side["ref"] is south
    with fresh_database() as url:
        with psycopg.connect(url) as conn, conn.transaction():
            out = store(conn, spec)
        assert out["tracks"] and abs(out["length_m"] - LENGTH) < 0.02 * LENGTH
        rows, _ = trip("osm-train", increasing=True, rng=random.Random(8), s_to=4000.0)
        write(url, rows)
        got = matched(url, "osm-train")
        assert all(g[0] == "osm-line" for g in got)
        assert len({g[1] for g in got}) == 1  # one track all the way


def test_import_routes_cli_stores_a_geojson_file_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "line.geojson"
    good.write_text(json.dumps(geojson()), encoding="utf-8")
    bad = tmp_path / "bad.geojson"
    bad.write_text('{"type": "FeatureCollection", "features": [{"type": "Feature"}]}')
    with fresh_database() as url:
        assert cli.main(["import-routes", str(bad), "--database-url", url]) == 2
        assert "no route id" in capsys.readouterr().err
        assert query(url, "SELECT count(*) FROM routes")[0][0] == 0
        assert cli.main(["import-routes", str(good), "--database-url", url]) == 0
        printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [p["route"] for p in printed] == ["hsr", "conv"]
        # Importing again replaces, not duplicates.
        assert cli.main(["import-routes", str(good), "--database-url", url]) == 0
        assert query(url, "SELECT count(*) FROM routes")[0][0] == 2
        assert query(url, "SELECT count(*) FROM route_tracks")[0][0] == 2


def test_rematch_places_fixes_and_handovers_stored_before_the_route(tmp_path: Path) -> None:
    rng = random.Random(17)
    rows, truth = trip("mm-late", increasing=False, rng=rng, s_from=500.0, s_to=6000.0)
    f = rows.fixes[20]
    rows.handovers.append(
        ("mm-late", "op", 0, 31, 32, f[1] + 300, f[2], f[3], None, -100.0, "failure", 2500)
    )
    with fresh_database() as url:
        sink = LinkDbSink(url)
        try:
            sink.write(rows)  # no routes yet: nothing matched
            assert all(g[3] is None for g in matched(url, "mm-late"))
            with psycopg.connect(url) as conn, conn.transaction():
                for spec in parse_geojson(geojson()):
                    store(conn, spec)
            # The CLI runs the same method.
            assert cli.main(["rematch", "--database-url", url, "--train", "mm-late"]) == 0
            again = sink.rematch()
        finally:
            sink.close()
        assert again.fixes == 0  # matched fixes are not matched again
        got = matched(url, "mm-late")
        assert all(g[0] == "hsr" and g[1] == "L" for g in got)
        errs = [abs((g[2] or 0.0) - m) for g, m in zip(got, true_measures(url, truth), strict=True)]
        assert p95(errs) < 30.0
        (route, track_m, direction, cell), *_ = query(
            url, "SELECT route_id, track_m, direction::text, cell FROM handovers"
        )
        assert route == "hsr" and track_m is not None and direction == "decreasing"
        (earliest,), *_ = query(url, "SELECT earliest_ho_track_m FROM cells WHERE id = %s", cell)
        assert earliest == track_m
        assert query(url, "SELECT direction::text FROM trips") == [("decreasing",)]


def test_a_route_learned_from_twenty_noisy_trips_lies_on_the_line(tmp_path: Path) -> None:
    # No geometry at all: 20 trips (both directions) along the curved line's
    # centre with 20 m of noise per axis; the learned centre line must lie
    # within metres of the true one, and the fixes then match onto it.
    rng = random.Random(23)
    with fresh_database() as url:
        sink = LinkDbSink(url)
        try:
            for k in range(20):
                rows = Rows()
                train = f"learn-{k % 4}"
                n = int((LENGTH - 400) / 80)
                for i in range(n):
                    s = 200 + i * 80.0 if k % 2 == 0 else LENGTH - 200 - i * 80.0
                    x, y = offset_point(s, 0.0)
                    lon, lat = _lonlat(x + rng.gauss(0, NOISE_M), y + rng.gauss(0, NOISE_M))
                    t = T0 + k * 3_600_000 + i * 1000
                    rows.fixes.append((train, t, lat, lon, 80.0, None, NOISE_M, None))
                    rows.see(train, t)
                sink.write(rows)
            assert cli.main(["learn-route", "--database-url", url, "--route-id", "learned-1"]) == 0
            r = sink.rematch()
        finally:
            sink.close()
        # Off route: only a few fixes past the learned line's ends (its end
        # vertices are averages, a little inside the trips' first fixes).
        assert r.fixes == 20 * int((LENGTH - 400) / 80) and r.off_route < 0.02 * r.fixes
        (source, length), *_ = query(url, "SELECT source::text, length_m FROM routes")
        assert source == "learned" and abs(length - (LENGTH - 400)) < 0.03 * LENGTH
        line = query(url, "SELECT ST_AsText(geog::geometry) FROM routes")[0][0]
        coords = [tuple(map(float, p.split())) for p in line[11:-1].split(",")]
        to_xy = [
            (
                math.radians(lo - LON0) * mapmatch.EARTH_R * math.cos(math.radians(LAT0)),
                math.radians(la - LAT0) * mapmatch.EARTH_R,
            )
            for lo, la in coords
        ]
        learned = shapely.LineString(to_xy)
        off = [
            learned.distance(shapely.Point(*offset_point(s, 0.0)))
            for s in np.arange(400.0, LENGTH - 400.0, 50.0)
        ]
        print(f"learned line: p95 {p95(off):.1f} m, max {max(off):.1f} m from the true centre")
        assert p95(off) < 10.0 and max(off) < 20.0, (p95(off), max(off))
        assert query(url, "SELECT count(DISTINCT route_id) FROM gps_fixes") == [(1,)]


def test_a_testbed_trip_sent_gps_only_is_placed_by_map_matching(tmp_path: Path) -> None:
    # produce-testbed --gps-only: the trip's fixes and handovers lose their
    # track_m, and ingest places them on the route instead.
    rng = random.Random(29)
    events = tmp_path / "events.jsonl"
    truth = []
    with events.open("w") as f:
        for k in range(60):
            s = 1000.0 + 80.0 * k
            x, y = offset_point(s, GAUGE_M / 2)
            truth.append((x, y))
            lon, lat = _lonlat(x + rng.gauss(0, NOISE_M), y + rng.gauss(0, NOISE_M))
            _, _, h = centre(s)
            e = {
                "event": "gps",
                "t_ms": k * 1000,
                "lat": lat,
                "lon": lon,
                "speed_mps": 80.0,
                "heading_deg": math.degrees(h) % 360,
                "accuracy_m": 20.0,
                "track_m": s,
            }
            f.write(json.dumps(e) + "\n")
        f.write(
            json.dumps(
                {
                    "event": "handover_start",
                    "t_ms": 30_200,
                    "carrier": 0,
                    "from_cell": 3,
                    "to_cell": 4,
                    "track_m": 3416.0,
                    "rsrp_dbm": -110.0,
                }
            )
            + "\n"
        )
        f.write(
            json.dumps(
                {
                    "event": "handover_end",
                    "t_ms": 32_200,
                    "carrier": 0,
                    "from_cell": 3,
                    "to_cell": 4,
                    "outcome": "failure",
                    "ho_type": 3,
                    "duration_ms": 2000,
                    "blackout": "flush",
                    "track_m": 3416.0,
                }
            )
            + "\n"
        )
    rows = Rows()
    for rec in testbed.records(events, "tb-gps", T0, ["carrier-0"], gps_only=True):
        assert not rec.HasField("gps") or not rec.gps.HasField("track_m")
        records.add_record(rec, b"tb-gps", rows)
    with fresh_database() as url:
        with psycopg.connect(url) as conn, conn.transaction():
            for spec in parse_geojson(geojson()):
                store(conn, spec)
        write(url, rows)
        got = matched(url, "tb-gps")
        assert all(g[0] == "hsr" and g[1] == "R" for g in got)
        errs = [abs((g[2] or 0.0) - m) for g, m in zip(got, true_measures(url, truth), strict=True)]
        assert p95(errs) < 30.0
        (route, track_m), *_ = query(url, "SELECT route_id, track_m FROM handovers")
        assert route == "hsr" and track_m is not None


# Real OpenStreetMap data: the railway ways of an extract of Liechtenstein
# (ingest/tests/data/osm/README.md; ODbL). The Feldkirch–Buchs line crosses
# the country as one single track, split into ways at every switch, with
# station loops, a siding and a yard track beside it.
REAL_OSM = Path(__file__).parent / "data" / "osm" / "liechtenstein-rail.osm"


def _line_ends(path: Path) -> list[tuple[float, float]]:
    """Read plainly: the nodes where a railway way ends and no other way
    touches (the line's two ends and the dead ends of sidings), the two
    farthest apart being where the line leaves the extract."""
    root = SafeXml.parse(path).getroot()
    assert root is not None
    pos = {
        n.get("id"): (float(n.get("lon", "0")), float(n.get("lat", "0"))) for n in root.iter("node")
    }
    uses: dict[str | None, int] = {}
    ends = []
    for w in root.iter("way"):
        refs = [nd.get("ref") for nd in w.iter("nd")]
        ends += [refs[0], refs[-1]]
        for r in refs:
            uses[r] = uses.get(r, 0) + 1
    dead = [pos[e] for e in ends if uses[e] == 1]
    a, b = max(
        ((p, q) for p in dead for q in dead),
        key=lambda pq: mapmatch.haversine_m(pq[0][1], pq[0][0], pq[1][1], pq[1][0]),
    )
    return [a, b]


def test_a_real_osm_line_is_one_route_through_its_stations() -> None:
    spec = parse_osm(REAL_OSM, route_id="li", name="Feldkirch–Buchs")
    # One track end to end: the chain continues straight through each switch
    # (seeded fault: ending chains at every junction gave a 4.5 km piece as
    # the reference and the rest as two "parallel" tracks).
    assert len(spec.tracks) == 1 and spec.tracks[0].coords == spec.reference
    assert sorted([spec.reference[0], spec.reference[-1]]) == sorted(_line_ends(REAL_OSM))
    # Left out: the short station tracks only (a siding, a loop, a yard track).
    left = {w for n in spec.notes for w in n.split()[3].rstrip(":").split(",")}
    assert left == {"2170", "2171", "2183"}, spec.notes
    assert 10_000 < length_of(spec.reference) < 10_400


def length_of(coords: list[tuple[float, float]]) -> float:
    return sum(mapmatch.haversine_m(a[1], a[0], b[1], b[0]) for a, b in itertools.pairwise(coords))


@pytest.mark.parametrize("increasing", [True, False])
def test_fixes_match_onto_a_real_osm_line(increasing: bool) -> None:
    """20 m GPS noise on the real line's curves: measure error < 30 m at p95."""
    spec = parse_osm(REAL_OSM, route_id="li", name="Feldkirch–Buchs")
    rng = random.Random(21 if increasing else 22)
    # Walk the line at 40 m/s (a regional train), one fix a second.
    cum = [0.0]
    for a, b in itertools.pairwise(spec.reference):
        cum.append(cum[-1] + mapmatch.haversine_m(a[1], a[0], b[1], b[0]))
    total = cum[-1]
    rows = Rows()
    truth = []
    for k in range(int((total - 400) / 40)):
        s = 200 + 40 * k if increasing else total - 200 - 40 * k
        j = max(i for i in range(len(cum) - 1) if cum[i] <= s)
        f = (s - cum[j]) / (cum[j + 1] - cum[j])
        (x0, y0), (x1, y1) = spec.reference[j], spec.reference[j + 1]
        lon, lat = x0 + f * (x1 - x0), y0 + f * (y1 - y0)
        truth.append(mapmatch.Fix(0, lat, lon))
        n_m, e_m = rng.gauss(0, NOISE_M), rng.gauss(0, NOISE_M)
        lat += math.degrees(n_m / mapmatch.EARTH_R)
        lon += math.degrees(e_m / (mapmatch.EARTH_R * math.cos(math.radians(lat))))
        t = T0 + k * 1000
        rows.fixes.append(("li-train", t, lat, lon, 40.0, None, NOISE_M, None))
        rows.see("li-train", t)
        rows.times.append(t)
    with fresh_database() as url:
        with psycopg.connect(url) as conn, conn.transaction():
            store(conn, spec)
        write(url, rows)
        got = matched(url, "li-train")
        with psycopg.connect(url) as conn, conn.cursor() as cur:
            near = mapmatch.pieces_near(cur, truth)
        want = [
            mapmatch.nearest_per_track(p, [q for q in ps if q.track == ""])[0].measure_m
            for p, ps in zip(truth, near, strict=True)
        ]
    assert all(g[0] == "li" and g[3] is False for g in got), got[:5]
    errs = [abs((g[2] or 0.0) - w) for g, w in zip(got, want, strict=True)]
    assert p95(errs) < 30.0, sorted(errs)[-10:]


def test_the_batched_candidate_search_equals_the_per_fix_rule() -> None:
    """mapmatch.candidates (one query for a batch, numpy projections) gives
    what nearest_per_track gives on pieces_near's pieces, fix by fix: on the
    curved double-track line, and on a line that turns back on itself (a
    U-turn of radius 100 m, so fixes between its legs see the same track
    twice, 2 km apart in measure: the exact per-fix path)."""
    u = []
    for k in range(41):  # east 2 km, a half circle, west 2 km
        u.append(_lonlat(50.0 * k, 2000.0))
    for k in range(1, 18):
        th = math.pi * k / 18
        u.append(_lonlat(2000.0 + 100.0 * math.sin(th), 2100.0 - 100.0 * math.cos(th)))
    for k in range(41):
        u.append(_lonlat(2000.0 - 50.0 * k, 2200.0))
    rng = random.Random(5)
    fixes = []
    for _ in range(400):  # around the double-track line and the U-turn's legs
        if rng.random() < 0.5:
            x, y = offset_point(rng.uniform(0, LENGTH), rng.uniform(-120, 120))
        else:
            x, y = rng.uniform(1000, 2150), rng.uniform(1900, 2300)
        lon, lat = _lonlat(x, y)
        fixes.append(mapmatch.Fix(T0, lat, lon))
    with fresh_database() as url:
        with psycopg.connect(url) as conn, conn.transaction():
            for spec in parse_geojson(geojson()):
                store(conn, spec)
            doc = {
                "type": "FeatureCollection",
                "features": [
                    {
                        "type": "Feature",
                        "properties": {"route": "u"},
                        "geometry": {"type": "LineString", "coordinates": u},
                    }
                ],
            }
            for spec in parse_geojson(doc):
                store(conn, spec)
        with psycopg.connect(url) as conn, conn.cursor() as cur:
            got = mapmatch.candidates(cur, fixes)
            want = [
                mapmatch.nearest_per_track(f, ps)
                for f, ps in zip(fixes, mapmatch.pieces_near(cur, fixes), strict=True)
            ]
    twice = 0
    for g, w in zip(got, want, strict=True):
        assert [(c.route_id, c.track, c.running) for c in g] == [
            (c.route_id, c.track, c.running) for c in w
        ]
        for a, b in zip(g, w, strict=True):
            assert a.measure_m == pytest.approx(b.measure_m, abs=1e-6)
            assert a.dist_m == pytest.approx(b.dist_m, abs=1e-6)
            assert a.bearing_deg == pytest.approx(b.bearing_deg, abs=1e-6)
        twice += sum(c.route_id == "u" for c in w) == 2
    assert twice >= 20, twice  # the exact path was exercised
