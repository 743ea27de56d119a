"""``/v1/cells``: cells as GeoJSON Points at their earliest handover position,
and per-cell statistics computed from the handovers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from polycorn_linkdb_api.deps import Reader, db
from polycorn_linkdb_api.errors import NotFoundError
from polycorn_linkdb_api.params import (
    BIGINT_MAX,
    BboxParam,
    Carrier,
    CursorParam,
    Limit,
    Since,
    Until,
    encode_cursor,
    int_cursor,
    parse_bbox,
    window,
)
from polycorn_linkdb_api.routes.common import (
    AUTH_ERRORS,
    NOT_FOUND,
    GeoJSONResponse,
    JSONTextResponse,
    fetchall,
    fetchone,
    page,
)
from polycorn_linkdb_api.schemas import CellCollection, CellStats
from polycorn_schema.linkdb.models import Direction

router = APIRouter(prefix="/v1", tags=["cells"])

FEATURE = """json_build_object(
  'type', 'Feature', 'id', c.id,
  'geometry', ST_AsGeoJSON(c.earliest_ho_geog, 7)::json,
  'properties', json_build_object(
    'id', c.id, 'carrier', c.carrier, 'cell_id', c.cell_id, 'name', cell_name(c.cell_id),
    'direction', c.direction, 'handovers', c.handovers, 'failures', c.failures,
    'failure_rate', CASE WHEN c.handovers > 0 THEN c.failures::float8 / c.handovers END,
    'earliest_ho_track_m', c.earliest_ho_track_m,
    'first_seen', c.first_seen, 'last_seen', c.last_seen))::text"""


@router.get(
    "/cells",
    response_model=CellCollection,
    response_class=GeoJSONResponse,
    responses=AUTH_ERRORS,
    summary="Cells as a GeoJSON FeatureCollection",
)
async def list_cells(
    *,
    request: Request,
    _who: Reader,
    bbox: BboxParam = None,
    carrier: Carrier = None,
    direction: Direction | None = None,
    min_handovers: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Limit = 100,
    cursor: CursorParam = None,
) -> Response:
    """Cells (⟨carrier, cell ID, direction⟩) with their counters, as Points at
    the earliest handover position (null geometry when unknown; a bbox keeps
    only cells with a position inside). Ordered by LinkDB cell ID."""
    box = parse_bbox(bbox)
    after = int_cursor(cursor, "cells")
    where: list[str] = []
    binds: dict[str, Any] = {"lim": limit + 1}
    if box is not None:
        where.append(
            "c.earliest_ho_geog::geometry && ST_MakeEnvelope(:bb_x0, :bb_y0, :bb_x1, :bb_y1, 4326)"
        )
        binds.update(box.binds())
    if carrier is not None:
        where.append("c.carrier = :carrier")
        binds["carrier"] = carrier
    if direction is not None:
        where.append("c.direction = CAST(:direction AS track_direction)")
        binds["direction"] = direction.value
    if min_handovers is not None:
        where.append("c.handovers >= :min_handovers")
        binds["min_handovers"] = min_handovers
    if after is not None:
        where.append("c.id > :after")
        binds["after"] = after
    sql = (
        f"SELECT {FEATURE}, c.id FROM cells c "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY c.id LIMIT :lim"
    )
    async with db(request) as conn:
        rows = await fetchall(conn, sql, binds)
    nxt = encode_cursor("cells", rows[limit - 1][1]) if len(rows) > limit else None
    return page(request, rows, limit, nxt, collection=True)


# One pass over the cell's handovers, from the index alone
# (ix_handovers_cell_time carries the columns read); the earliest position is
# the first along the direction of travel, whose point alone is read from the
# table.
STATS = """
SELECT json_build_object(
  'id', c.id, 'carrier', c.carrier, 'cell_id', c.cell_id, 'name', cell_name(c.cell_id),
  'direction', c.direction,
  'since', CAST(:since AS timestamptz), 'until', CAST(:until AS timestamptz),
  'handovers', s.n, 'failures', s.failures,
  'failure_rate', CASE WHEN s.n > 0 THEN s.failures::float8 / s.n END,
  'earliest_handover_track_m', earliest.track_m,
  'earliest_handover_position', ST_AsGeoJSON(e.geog, 7)::json,
  'mean_failure_track_m', s.mean_fail_m,
  'stddev_failure_track_m', s.sd_fail_m,
  'mean_failure_duration_ms', s.mean_fail_ms,
  'first_handover', s.first_t, 'last_handover', s.last_t,
  'rsrp_dbm', json_build_object(
    'count', s.rsrp_n, 'min', s.rsrp_min, 'p10', s.rsrp_q[1], 'median', s.rsrp_q[2],
    'mean', s.rsrp_mean, 'p90', s.rsrp_q[3], 'max', s.rsrp_max,
    'mean_at_failure', s.rsrp_fail, 'mean_at_success', s.rsrp_ok)
)::text
FROM cells c
CROSS JOIN LATERAL (
  SELECT count(*) AS n,
         count(*) FILTER (WHERE h.outcome = 'failure') AS failures,
         avg(h.track_m) FILTER (WHERE h.outcome = 'failure') AS mean_fail_m,
         stddev_samp(h.track_m) FILTER (WHERE h.outcome = 'failure') AS sd_fail_m,
         avg(h.duration_ms) FILTER (WHERE h.outcome = 'failure')::float8 AS mean_fail_ms,
         min(h.start_time) AS first_t, max(h.start_time) AS last_t,
         count(h.rsrp_dbm) AS rsrp_n, min(h.rsrp_dbm) AS rsrp_min, max(h.rsrp_dbm) AS rsrp_max,
         avg(h.rsrp_dbm) AS rsrp_mean,
         percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP (ORDER BY h.rsrp_dbm) AS rsrp_q,
         avg(h.rsrp_dbm) FILTER (WHERE h.outcome = 'failure') AS rsrp_fail,
         avg(h.rsrp_dbm) FILTER (WHERE h.outcome = 'success') AS rsrp_ok
  FROM handovers h
  WHERE h.carrier = c.carrier AND h.source_cell_id = c.cell_id AND h.direction = c.direction
    AND (CAST(:since AS timestamptz) IS NULL OR h.start_time >= :since)
    AND (CAST(:until AS timestamptz) IS NULL OR h.start_time < :until)
) s
LEFT JOIN LATERAL (
  SELECT h.id, h.track_m FROM handovers h
  WHERE h.carrier = c.carrier AND h.source_cell_id = c.cell_id AND h.direction = c.direction
    AND h.track_m IS NOT NULL
    AND (CAST(:since AS timestamptz) IS NULL OR h.start_time >= :since)
    AND (CAST(:until AS timestamptz) IS NULL OR h.start_time < :until)
  ORDER BY CASE WHEN c.direction = 'increasing' THEN h.track_m ELSE -h.track_m END, h.id
  LIMIT 1
) earliest ON true
LEFT JOIN handovers e ON e.id = earliest.id
WHERE c.id = :id
"""


@router.get(
    "/cells/{cell_id}/stats",
    response_model=CellStats,
    response_class=JSONTextResponse,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One cell's handover statistics",
)
async def cell_stats(
    request: Request,
    _who: Reader,
    cell_id: Annotated[int, Path(ge=1, le=BIGINT_MAX, description="LinkDB cell ID")],
    since: Since = None,
    until: Until = None,
) -> Response:
    """Failure rate and counts, the earliest handover position along the
    direction of travel, the mean (and spread) of failure locations along
    the track, and an RSRP summary, over the handovers out of the cell in
    [since, until) (all time by default)."""
    s, u = window(since, until)
    async with db(request) as conn:
        row = await fetchone(conn, STATS, {"id": cell_id, "since": s, "until": u})
    if row is None:
        raise NotFoundError(f"no cell {cell_id} (list them with /v1/cells)")
    return JSONTextResponse(row[0])
