"""Response models: what OpenAPI documents and schemathesis checks.

Handlers return JSON that PostgreSQL built (``json_build_object``), so these
models describe the responses rather than produce them; the tests and
schemathesis hold the two together.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from polycorn_linkdb_api.failure_table import TableFile

Dir = Literal["increasing", "decreasing"]


class Point(BaseModel):
    type: Literal["Point"]
    coordinates: list[float] = Field(min_length=2, max_length=3, description="[lon, lat]")


class LineString(BaseModel):
    type: Literal["LineString"]
    coordinates: list[list[float]] = Field(min_length=2)


class Page(BaseModel):
    next: str | None = Field(description="URL of the next page; null on the last page")
    next_cursor: str | None = Field(description="the `cursor` for the next page")
    number_returned: int


# ------------------------------------------------------------------ trains


class Train(BaseModel):
    id: str
    source: Literal["telemetry", "drivetest"]
    first_seen: dt.datetime
    last_seen: dt.datetime


class TrainList(Page):
    items: list[Train]


class TrainDetailProps(Train):
    trips: int = Field(description="number of trips")
    last_fix_time: dt.datetime | None = Field(description="time of the latest GPS fix")


class TrainDetail(BaseModel):
    """A train as a GeoJSON Feature at its latest GPS fix (geometry null without fixes)."""

    type: Literal["Feature"]
    id: str
    geometry: Point | None
    properties: TrainDetailProps


# ------------------------------------------------------------------ trips


class TripProps(BaseModel):
    id: int
    train_id: str
    started_at: dt.datetime
    ended_at: dt.datetime
    fixes: int
    direction: Dir | None


class TripFeature(BaseModel):
    type: Literal["Feature"]
    id: int
    geometry: LineString | None = Field(description="the trip's fixes, with ?geometry=true")
    properties: TripProps


class TripCollection(Page):
    type: Literal["FeatureCollection"]
    features: list[TripFeature]


# ------------------------------------------------------------------ routes

Running = Literal["increasing", "decreasing", "both"]


class TrackRef(BaseModel):
    track: str
    running: Running = Field(description="the direction(s) trains run on it along the measure")


class RouteProps(BaseModel):
    id: str
    name: str
    source: Literal["geojson", "osm", "learned"]
    length_m: float = Field(description="geodesic length; track_m runs from 0 to this")
    tracks: list[TrackRef]
    properties: dict[str, object] = Field(description="the import's other properties")
    created_at: dt.datetime
    updated_at: dt.datetime


class RouteFeature(BaseModel):
    """A route: its linear reference, drawn in the direction of increasing track_m."""

    type: Literal["Feature"]
    id: str
    geometry: LineString | None = Field(description="null with ?geometry=false")
    properties: RouteProps


class RouteCollection(Page):
    type: Literal["FeatureCollection"]
    features: list[RouteFeature]


class TrackProps(BaseModel):
    route_id: str
    track: str
    running: Running


class TrackFeature(BaseModel):
    type: Literal["Feature"]
    id: str
    geometry: LineString
    properties: TrackProps


class TrackCollection(BaseModel):
    type: Literal["FeatureCollection"]
    features: list[TrackFeature]


# ------------------------------------------------------------------ cells

CellName = Annotated[
    str,
    Field(
        description="the cell's identity as people read it (LinkDB's cell_name): "
        "'eNB 670556 cell 29' for an LTE cell, 'NR cell N', 'testbed cell N', 'unknown'"
    ),
]


class CellProps(BaseModel):
    id: int = Field(description="LinkDB cell ID (use in /v1/cells/{cell_id}/stats)")
    carrier: str
    cell_id: int = Field(description="the data plane's cell ID")
    name: CellName
    direction: Dir
    handovers: int
    failures: int
    failure_rate: float | None = Field(description="failures / handovers; null without handovers")
    earliest_ho_track_m: float | None
    first_seen: dt.datetime
    last_seen: dt.datetime


class CellFeature(BaseModel):
    type: Literal["Feature"]
    id: int
    geometry: Point | None = Field(description="the earliest handover position")
    properties: CellProps


class CellCollection(Page):
    type: Literal["FeatureCollection"]
    features: list[CellFeature]


class RsrpSummary(BaseModel):
    count: int
    min: float | None
    p10: float | None
    median: float | None
    mean: float | None
    p90: float | None
    max: float | None
    mean_at_failure: float | None
    mean_at_success: float | None


class CellStats(BaseModel):
    id: int
    carrier: str
    cell_id: int
    name: CellName
    direction: Dir
    since: dt.datetime | None
    until: dt.datetime | None
    handovers: int = Field(description="handovers out of the cell in the window")
    failures: int
    failure_rate: float | None
    earliest_handover_track_m: float | None = Field(
        description="smallest track_m when increasing, largest when decreasing"
    )
    earliest_handover_position: Point | None
    mean_failure_track_m: float | None = Field(description="mean location of failures")
    stddev_failure_track_m: float | None
    mean_failure_duration_ms: float | None
    first_handover: dt.datetime | None
    last_handover: dt.datetime | None
    rsrp_dbm: RsrpSummary


# ------------------------------------------------------------------ handovers


class HandoverProps(BaseModel):
    id: int
    train_id: str
    trip_id: int | None
    carrier: str
    path: int | None
    source_cell_id: int
    target_cell_id: int
    source_cell: CellName
    target_cell: CellName
    start_time: dt.datetime
    track_m: float | None
    route_id: str | None = Field(description="the route track_m is on (map matching)")
    direction: Dir | None
    rsrp_dbm: float | None
    outcome: Literal["success", "failure"]
    duration_ms: int
    source: Literal["telemetry", "drivetest"]


class HandoverFeature(BaseModel):
    type: Literal["Feature"]
    id: int
    geometry: Point
    properties: HandoverProps


class HandoverCollection(Page):
    type: Literal["FeatureCollection"]
    features: list[HandoverFeature]


# ------------------------------------------------------------------ failure tables


class TableMeta(BaseModel):
    version: int
    etag: str
    entries: int
    created_at: dt.datetime
    model_id: int | None
    note: str


class TableList(Page):
    items: list[TableMeta]


__all__ = ["TableFile"]


class Health(BaseModel):
    status: Literal["ok"]
