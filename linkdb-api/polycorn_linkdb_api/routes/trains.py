"""``/v1/trains`` and ``/v1/trips``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from polycorn_linkdb_api.deps import Reader, db
from polycorn_linkdb_api.errors import NotFoundError
from polycorn_linkdb_api.params import (
    NO_NUL,
    CursorParam,
    Limit,
    Since,
    TrainId,
    Until,
    encode_cursor,
    str_cursor,
    time_id_cursor,
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
from polycorn_linkdb_api.schemas import TrainDetail, TrainList, TripCollection

router = APIRouter(prefix="/v1", tags=["trains"])

TRAIN = """json_build_object('id', t.id, 'source', t.source,
  'first_seen', t.first_seen, 'last_seen', t.last_seen)::text"""


@router.get(
    "/trains",
    response_model=TrainList,
    response_class=JSONTextResponse,
    responses=AUTH_ERRORS,
    summary="Trains",
)
async def list_trains(
    request: Request, _who: Reader, limit: Limit = 100, cursor: CursorParam = None
) -> Response:
    """Trains (and drive-test logs) ordered by ID."""
    after = str_cursor(cursor, "trains")
    binds: dict[str, Any] = {"lim": limit + 1}
    where = ""
    if after is not None:
        where = "WHERE t.id > :after"
        binds["after"] = after
    async with db(request) as conn:
        rows = await fetchall(
            conn, f"SELECT {TRAIN}, t.id FROM trains t {where} ORDER BY t.id LIMIT :lim", binds
        )
    nxt = encode_cursor("trains", rows[limit - 1][1]) if len(rows) > limit else None
    return page(request, rows, limit, nxt, collection=False, response_class=JSONTextResponse)


TRAIN_DETAIL = """
SELECT json_build_object('type', 'Feature', 'id', t.id,
  'geometry', ST_AsGeoJSON(f.geog, 7)::json,
  'properties', json_build_object('id', t.id, 'source', t.source,
    'first_seen', t.first_seen, 'last_seen', t.last_seen,
    'trips', (SELECT count(*) FROM trips WHERE trips.train_id = t.id),
    'last_fix_time', f.time))::text
FROM trains t
LEFT JOIN LATERAL (SELECT g.geog, g.time FROM gps_fixes g WHERE g.train_id = t.id
                   ORDER BY g.time DESC LIMIT 1) f ON true
WHERE t.id = :id
"""


@router.get(
    "/trains/{train_id}",
    response_model=TrainDetail,
    response_class=GeoJSONResponse,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One train, at its latest position",
)
async def get_train(
    request: Request,
    _who: Reader,
    train_id: Annotated[str, Path(min_length=1, max_length=128, pattern=NO_NUL)],
) -> Response:
    """A GeoJSON Feature at the train's latest GPS fix, with its trip count."""
    async with db(request) as conn:
        row = await fetchone(conn, TRAIN_DETAIL, {"id": train_id})
    if row is None:
        raise NotFoundError(f"no train {train_id!r} (list them with /v1/trains)")
    return GeoJSONResponse(row[0])


# A trip's line: its fixes in time order (gps_fixes' primary key serves the
# range); fewer than two fixes make no LineString, so null.
TRIP_LINE = """
LEFT JOIN LATERAL (
  SELECT CASE WHEN count(*) >= 2
    THEN ST_AsGeoJSON(ST_MakeLine(g.geog::geometry ORDER BY g.time), 7)::json END AS line
  FROM gps_fixes g
  WHERE g.train_id = t.train_id AND g.time >= t.started_at AND g.time <= t.ended_at
) l ON true"""


@router.get(
    "/trips",
    response_model=TripCollection,
    response_class=GeoJSONResponse,
    responses=AUTH_ERRORS,
    summary="Trips as a GeoJSON FeatureCollection",
)
async def list_trips(
    *,
    request: Request,
    _who: Reader,
    train_id: TrainId = None,
    since: Since = None,
    until: Until = None,
    geometry: Annotated[
        bool, Query(description="include each trip's GPS track as a LineString")
    ] = False,
    limit: Limit = 100,
    cursor: CursorParam = None,
) -> Response:
    """Trips overlapping [since, until), ordered by start time (then id);
    geometry null unless `geometry=true`."""
    s, u = window(since, until)
    after = time_id_cursor(cursor, "trips")
    where: list[str] = []
    binds: dict[str, Any] = {"lim": limit + 1}
    if train_id is not None:
        where.append("t.train_id = :train_id")
        binds["train_id"] = train_id
    if s is not None:
        where.append("t.ended_at >= :since")
        binds["since"] = s
    if u is not None:
        where.append("t.started_at < :until")
        binds["until"] = u
    if after is not None:
        where.append("(t.started_at, t.id) > (:c_t, :c_id)")
        binds["c_t"], binds["c_id"] = after
    geom = "l.line" if geometry else "NULL::json"
    sql = f"""
SELECT json_build_object('type', 'Feature', 'id', t.id, 'geometry', {geom},
  'properties', json_build_object('id', t.id, 'train_id', t.train_id,
    'started_at', t.started_at, 'ended_at', t.ended_at, 'fixes', t.fixes,
    'direction', t.direction))::text, t.started_at, t.id
FROM (SELECT * FROM trips t {"WHERE " + " AND ".join(where) if where else ""}
      ORDER BY t.started_at, t.id LIMIT :lim) t
{TRIP_LINE if geometry else ""}
ORDER BY t.started_at, t.id"""
    async with db(request) as conn:
        rows = await fetchall(conn, sql, binds)
    nxt = None
    if len(rows) > limit:
        nxt = encode_cursor("trips", rows[limit - 1][1], rows[limit - 1][2])
    return page(request, rows, limit, nxt, collection=True)
