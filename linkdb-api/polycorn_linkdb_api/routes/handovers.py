"""``/v1/handovers``: handovers as GeoJSON Points, filtered, keyset-paginated
by (start_time, id).

A map viewport (a bbox up to ``KNN_MAX_AREA_DEG2``) is served by the GiST
index ``ix_handovers_geom_time`` on ``(geog::geometry, start_time)``
(btree_gist, migration 0005) as a nearest-neighbour scan ordered by
``start_time <-> TIME_ORIGIN``: the index yields the bbox's rows in time
order without visiting the heap for the rows it skips, so a page costs
about the bbox's index entries plus ``limit`` heap rows. (Walking
``ix_handovers_start_time`` and testing each row against the bbox costs
``limit`` / the bbox's share of all rows, tens of thousands of rows for a
20 km viewport; a bitmap scan of the bbox fetches every row in it.) The
distance order does not break ties by id, so when the page ends inside a
tie the query reads every row at that last start time again and sorts by
(start_time, id): exact, whatever the ties (without a tie, no second
read). A larger bbox holds a large share of the rows, where walking the
time index and filtering is cheap and the nearest-neighbour scan would
visit most of the index: the planner gets the plain query.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from polycorn_linkdb_api.deps import Reader, db
from polycorn_linkdb_api.params import (
    BboxParam,
    BigId,
    Carrier,
    CursorParam,
    Limit,
    Since,
    TrainId,
    Until,
    encode_cursor,
    parse_bbox,
    time_id_cursor,
    window,
)
from polycorn_linkdb_api.routes.common import AUTH_ERRORS, GeoJSONResponse, fetchall, page
from polycorn_linkdb_api.schemas import HandoverCollection
from polycorn_schema.linkdb.models import Outcome

router = APIRouter(prefix="/v1", tags=["handovers"])

FEATURE = """json_build_object(
  'type', 'Feature', 'id', h.id,
  'geometry', ST_AsGeoJSON(h.geog, 7)::json,
  'properties', json_build_object(
    'id', h.id, 'train_id', h.train_id, 'trip_id', h.trip_id, 'carrier', h.carrier,
    'path', h.path, 'source_cell_id', h.source_cell_id, 'target_cell_id', h.target_cell_id,
    'source_cell', cell_name(h.source_cell_id), 'target_cell', cell_name(h.target_cell_id),
    'start_time', h.start_time, 'track_m', h.track_m, 'route_id', h.route_id,
    'direction', h.direction,
    'rsrp_dbm', h.rsrp_dbm, 'outcome', h.outcome, 'duration_ms', h.duration_ms,
    'source', h.source))::text"""

# The bbox test is planar on lon/lat (what a map's viewport means), served by
# the GiST index ix_handovers_geom_time (migrations 0003, 0005).
BBOX = "h.geog::geometry && ST_MakeEnvelope(:bb_x0, :bb_y0, :bb_x1, :bb_y1, 4326)"
# The smallest timestamptz: ``start_time <-> TIME_ORIGIN`` grows with start_time
# for every time PostgreSQL can store (up to the year 294,000 or so, where
# the interval would overflow).
TIME_ORIGIN = "'4714-11-24 00:00:00+00 BC'::timestamptz"
# Bboxes up to this many square degrees (about 50 x 55 km at 40 degrees N)
# take the nearest-neighbour plan; see the module docstring.
KNN_MAX_AREA_DEG2 = 0.25
CELL = (
    "(h.carrier, h.source_cell_id, h.direction) = "
    "(SELECT c.carrier, c.cell_id, c.direction FROM cells c WHERE c.id = :cell)"
)


@router.get(
    "/handovers",
    response_model=HandoverCollection,
    response_class=GeoJSONResponse,
    responses=AUTH_ERRORS,
    summary="Handovers as a GeoJSON FeatureCollection",
)
async def list_handovers(
    *,
    request: Request,
    _who: Reader,
    bbox: BboxParam = None,
    since: Since = None,
    until: Until = None,
    carrier: Carrier = None,
    outcome: Outcome | None = None,
    train_id: TrainId = None,
    trip_id: BigId = None,
    cell: BigId = None,
    limit: Limit = 100,
    cursor: CursorParam = None,
) -> Response:
    """Handovers ordered by start time (then id). `cell` is a LinkDB cell ID
    (`/v1/cells`): the handovers out of that ⟨carrier, cell, direction⟩.
    Walk the pages with `next` (or `cursor=next_cursor`) until it is null."""
    box = parse_bbox(bbox)
    s, u = window(since, until)
    after = time_id_cursor(cursor, "handovers")
    where: list[str] = []
    binds: dict[str, Any] = {}
    if box is not None:
        where.append(BBOX)
        binds.update(box.binds())
    if s is not None:
        where.append("h.start_time >= :since")
        binds["since"] = s
    if u is not None:
        where.append("h.start_time < :until")
        binds["until"] = u
    if carrier is not None:
        where.append("h.carrier = :carrier")
        binds["carrier"] = carrier
    if outcome is not None:
        where.append("h.outcome = CAST(:outcome AS handover_outcome)")
        binds["outcome"] = outcome.value
    if train_id is not None:
        where.append("h.train_id = :train_id")
        binds["train_id"] = train_id
    if trip_id is not None:
        where.append("h.trip_id = :trip_id")
        binds["trip_id"] = trip_id
    if cell is not None:
        where.append(CELL)
        binds["cell"] = cell
    if after is not None:
        # The plain >= lets the start_time index bound the scan; the row
        # comparison does the exact keyset cut.
        where.append("h.start_time >= :c_t AND (h.start_time, h.id) > (:c_t, :c_id)")
        binds["c_t"], binds["c_id"] = after
    cond = " AND ".join(where) if where else "true"
    # The limit is inlined (a checked int): a prepared statement's generic
    # plan would otherwise guess it.
    lim = limit + 1
    if box is not None and box.area() <= KNN_MAX_AREA_DEG2:
        # k: the first lim rows in time order, ties in any order. Every row
        # before the last start time t is in k; rows at t may not all be.
        # If k holds the whole bbox (fewer than lim rows), or exactly
        # `limit` rows come before t (the page is those, and the row at t
        # only says there is more), k decides the page. Otherwise (a tie at
        # the page's end) every row at t is read again, by time.
        sql = f"""
WITH k AS MATERIALIZED (
  SELECT {FEATURE} AS f, h.start_time, h.id FROM handovers h WHERE {cond}
  ORDER BY h.start_time <-> {TIME_ORIGIN} LIMIT {lim}
), edge AS MATERIALIZED (
  SELECT e.t, e.n = {lim} AND (SELECT count(*) FROM k WHERE k.start_time < e.t) < {limit} AS tie
  FROM (SELECT max(k.start_time) AS t, count(*) AS n FROM k) e
)
SELECT * FROM (
  SELECT k.f, k.start_time, k.id FROM k
  WHERE k.start_time < (SELECT t FROM edge) OR NOT (SELECT tie FROM edge)
  UNION ALL
  SELECT {FEATURE}, h.start_time, h.id FROM handovers h
  WHERE (SELECT tie FROM edge) AND h.start_time = (SELECT t FROM edge) AND {cond}
) page
ORDER BY page.start_time, page.id LIMIT {lim}"""
    else:
        sql = (
            f"SELECT {FEATURE}, h.start_time, h.id FROM handovers h WHERE {cond} "
            f"ORDER BY h.start_time, h.id LIMIT {lim}"
        )
    async with db(request) as conn:
        rows = await fetchall(conn, sql, binds)
    nxt = None
    if len(rows) > limit:
        last = rows[limit - 1]
        nxt = encode_cursor("handovers", last[1], last[2])
    return page(request, rows, limit, nxt, collection=True)
