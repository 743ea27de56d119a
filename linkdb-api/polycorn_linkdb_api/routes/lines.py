"""``/v1/routes``: track geometry as GeoJSON.

A route is a line's linear reference (its LineString is drawn in the
direction of increasing ``track_m``, 0 at the first vertex); its tracks
are separate LineStrings with the direction(s) trains run on each.
``polycorn-ingest import-routes`` stores them; ingest map-matches fixes
onto them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from polycorn_linkdb_api.deps import Reader, db
from polycorn_linkdb_api.errors import NotFoundError
from polycorn_linkdb_api.params import (
    NO_NUL,
    BboxParam,
    CursorParam,
    Limit,
    encode_cursor,
    parse_bbox,
    str_cursor,
)
from polycorn_linkdb_api.routes.common import (
    AUTH_ERRORS,
    NOT_FOUND,
    GeoJSONResponse,
    fetchall,
    fetchone,
    page,
)
from polycorn_linkdb_api.schemas import RouteCollection, RouteFeature, TrackCollection

router = APIRouter(prefix="/v1", tags=["routes"])

RouteId = Annotated[str, Path(min_length=1, max_length=128, pattern=NO_NUL)]


def _feature(geometry: bool) -> str:
    geom = "ST_AsGeoJSON(r.geog, 7)::json" if geometry else "NULL::json"
    return f"""json_build_object(
  'type', 'Feature', 'id', r.id, 'geometry', {geom},
  'properties', json_build_object(
    'id', r.id, 'name', r.name, 'source', r.source, 'length_m', r.length_m,
    'tracks', COALESCE((SELECT json_agg(json_build_object('track', t.track, 'running', t.running)
                                        ORDER BY t.track)
                        FROM route_tracks t WHERE t.route_id = r.id), '[]'::json),
    'properties', r.properties, 'created_at', r.created_at, 'updated_at', r.updated_at))::text"""


@router.get(
    "/routes",
    response_model=RouteCollection,
    response_class=GeoJSONResponse,
    responses=AUTH_ERRORS,
    summary="Routes (linear references) as a GeoJSON FeatureCollection",
)
async def list_routes(
    *,
    request: Request,
    _who: Reader,
    bbox: BboxParam = None,
    geometry: Annotated[
        bool, Query(description="include each route's LineString (default true)")
    ] = True,
    limit: Limit = 100,
    cursor: CursorParam = None,
) -> Response:
    """Routes ordered by ID; a bbox keeps the routes whose line passes
    through it. Each LineString is drawn in the direction of increasing
    ``track_m``."""
    box = parse_bbox(bbox)
    after = str_cursor(cursor, "routes")
    where: list[str] = []
    binds: dict[str, Any] = {"lim": limit + 1}
    if box is not None:
        where.append(
            "ST_Intersects(r.geog::geometry, ST_MakeEnvelope(:bb_x0, :bb_y0, :bb_x1, :bb_y1, 4326))"
        )
        binds.update(box.binds())
    if after is not None:
        where.append("r.id > :after")
        binds["after"] = after
    sql = (
        f"SELECT {_feature(geometry)}, r.id FROM routes r "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY r.id LIMIT :lim"
    )
    async with db(request) as conn:
        rows = await fetchall(conn, sql, binds)
    nxt = encode_cursor("routes", rows[limit - 1][1]) if len(rows) > limit else None
    return page(request, rows, limit, nxt, collection=True)


@router.get(
    "/routes/{route_id}",
    response_model=RouteFeature,
    response_class=GeoJSONResponse,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One route's reference line",
)
async def get_route(request: Request, _who: Reader, route_id: RouteId) -> Response:
    """A GeoJSON Feature: the route's LineString and its tracks' names and
    running directions."""
    async with db(request) as conn:
        row = await fetchone(
            conn, f"SELECT {_feature(True)} FROM routes r WHERE r.id = :id", {"id": route_id}
        )
    if row is None:
        raise NotFoundError(f"no route {route_id!r} (list them with /v1/routes)")
    return GeoJSONResponse(row[0])


TRACKS = """
SELECT json_build_object('type', 'FeatureCollection', 'features', COALESCE(json_agg(
  json_build_object('type', 'Feature', 'id', t.track,
    'geometry', ST_AsGeoJSON(t.geog, 7)::json,
    'properties', json_build_object('route_id', t.route_id, 'track', t.track,
                                    'running', t.running))
  ORDER BY t.track) FILTER (WHERE t.track IS NOT NULL), '[]'::json))::text
FROM routes r LEFT JOIN route_tracks t ON t.route_id = r.id
WHERE r.id = :id
GROUP BY r.id"""


@router.get(
    "/routes/{route_id}/tracks",
    response_model=TrackCollection,
    response_class=GeoJSONResponse,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One route's tracks as a GeoJSON FeatureCollection",
)
async def get_tracks(request: Request, _who: Reader, route_id: RouteId) -> Response:
    """The route's tracks (LineStrings as drawn) with the direction(s) trains
    run on each along the route's measure; empty for a route given as a
    reference line only."""
    async with db(request) as conn:
        row = await fetchone(conn, TRACKS, {"id": route_id})
    if row is None:
        raise NotFoundError(f"no route {route_id!r} (list them with /v1/routes)")
    return GeoJSONResponse(row[0])
