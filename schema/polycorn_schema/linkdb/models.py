"""LinkDB: the fleet's record of trains, trips, positions, cells and handovers.

One place owns the schema: these SQLAlchemy 2 models and the Alembic
migrations next to them (``polycorn-linkdb upgrade``). ingest writes it,
linkdb-api reads it, the trainer reads it and writes models and
failure-location tables. ``docs/linkdb.md`` has the diagram and the rules.

Conventions:

- Times are ``timestamptz``; positions are ``geography(Point, 4326)``
  (WGS 84 lon/lat, distances in metres).
- ``track_m`` is the position along the route's linear reference (kilometre
  posts), when the train knows it or ingest map-matched the fix onto a
  route (``routes``, migration 0006; ``route_id`` says which); ``direction``
  is the direction of travel along it (``increasing``/``decreasing``), the
  key of a cell together with carrier and cell ID (paper §3: a cell's
  failure location depends on the direction of travel).
- A route is a line's linear reference: a WGS 84 linestring whose vertex
  order is the direction of increasing ``track_m`` (0 at its first vertex,
  geodesic metres), with the line's tracks beside it (``route_tracks``,
  each with the direction(s) trains run on it) and the reference cut into
  segments of at most 500 m for matching (``route_segments``).
- The high-volume time series (``gps_fixes``, ``signal_samples``,
  ``path_stats``) are partitioned by time (monthly ranges; a DEFAULT
  partition catches anything outside the created ones, so no row is ever
  refused). ingest creates the month partitions it needs.
- Idempotency lives in natural keys: a fix is (train, time), a handover is
  (train, carrier, start time), a sample is (train, path, time). Replayed or
  duplicated telemetry changes nothing (``ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from geoalchemy2 import Geography
from sqlalchemy import (
    BigInteger,
    Computed,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names, so that migrations can refer to them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Outcome(enum.StrEnum):
    """How a handover ended."""

    success = "success"
    failure = "failure"


class Direction(enum.StrEnum):
    """Direction of travel along the track's linear reference."""

    increasing = "increasing"
    decreasing = "decreasing"


class Source(enum.StrEnum):
    """Where a row came from."""

    telemetry = "telemetry"  # a train's relay-agent, through Kafka
    drivetest = "drivetest"  # a third-party drive-test log (polycorn-ingest import-drivetest)


OUTCOME = Enum(Outcome, name="handover_outcome", values_callable=lambda e: [m.value for m in e])
DIRECTION = Enum(Direction, name="track_direction", values_callable=lambda e: [m.value for m in e])
SOURCE = Enum(Source, name="row_source", values_callable=lambda e: [m.value for m in e])


def point(nullable: bool = False) -> Geography:
    """A WGS 84 point column type; a new instance per column (GeoAlchemy2 keeps
    the nullability on the type). The GiST indexes are declared explicitly."""
    return Geography(geometry_type="POINT", srid=4326, spatial_index=False, nullable=nullable)


TS = DateTime(timezone=True)
# Text keys compare bytewise (COLLATE "C"), whatever the database's locale:
# they are identifiers, not prose, and every B-tree probe and insert on the
# natural keys compares them (migration 0004).
TRAIN_ID = String(128, collation="C")
CARRIER = String(64, collation="C")
ROUTE_ID = String(128, collation="C")


def line(nullable: bool = False) -> Geography:
    """A WGS 84 linestring column type (see :func:`point`)."""
    return Geography(geometry_type="LINESTRING", srid=4326, spatial_index=False, nullable=nullable)


class RouteSource(enum.StrEnum):
    """Where a route's geometry came from."""

    geojson = "geojson"  # polycorn-ingest routes import FILE.geojson
    osm = "osm"  # polycorn-ingest routes import FILE.osm (railway ways)
    learned = "learned"  # polycorn-ingest routes learn (fleet GPS centre line)


class Running(enum.StrEnum):
    """The direction(s) trains run on a track, along the route's reference."""

    increasing = "increasing"
    decreasing = "decreasing"
    both = "both"


ROUTE_SOURCE = Enum(
    RouteSource, name="route_source", values_callable=lambda e: [m.value for m in e]
)
RUNNING = Enum(Running, name="track_running", values_callable=lambda e: [m.value for m in e])


class Route(Base):
    """A line's linear reference: ``track_m`` runs from 0 at the first vertex
    of ``geog`` to ``length_m`` at the last (geodesic metres)."""

    __tablename__ = "routes"
    id: Mapped[str] = mapped_column(ROUTE_ID, primary_key=True)
    name: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[RouteSource] = mapped_column(ROUTE_SOURCE)
    length_m: Mapped[float] = mapped_column(Double)
    geog: Mapped[Any] = mapped_column(line())
    properties: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(TS, server_default=func.now())


class RouteTrack(Base):
    """One track of a route (a double-track line has two, usually one per
    direction). A route without tracks is matched on its reference line."""

    __tablename__ = "route_tracks"
    route_id: Mapped[str] = mapped_column(
        ROUTE_ID, ForeignKey("routes.id", ondelete="CASCADE"), primary_key=True
    )
    track: Mapped[str] = mapped_column(String(64), primary_key=True)
    running: Mapped[Running] = mapped_column(RUNNING)
    geog: Mapped[Any] = mapped_column(line())


_START = "ST_StartPoint(geog::geometry)"
_END = "ST_EndPoint(geog::geometry)"


class RouteSegment(Base):
    """A straight piece (at most 500 m) of a route's reference line
    (``track`` empty) or of one of its tracks, with the measure at each end
    (for a track: its ends projected onto the reference), for matching: a
    fix's measure is interpolated at its foot on the nearest piece."""

    __tablename__ = "route_segments"
    route_id: Mapped[str] = mapped_column(
        ROUTE_ID, ForeignKey("routes.id", ondelete="CASCADE"), primary_key=True
    )
    track: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_m: Mapped[float] = mapped_column(Double)
    end_m: Mapped[float] = mapped_column(Double)
    geog: Mapped[Any] = mapped_column(line())
    # The piece's end points, computed once when it is stored (migration
    # 0008): the matcher reads hundreds of thousands of pieces per batch and
    # would otherwise cast and take them apart on every read.
    lon0: Mapped[float] = mapped_column(Double, Computed(f"ST_X({_START})", persisted=True))
    lat0: Mapped[float] = mapped_column(Double, Computed(f"ST_Y({_START})", persisted=True))
    lon1: Mapped[float] = mapped_column(Double, Computed(f"ST_X({_END})", persisted=True))
    lat1: Mapped[float] = mapped_column(Double, Computed(f"ST_Y({_END})", persisted=True))
    __table_args__ = (Index("ix_route_segments_geog", "geog", postgresql_using="gist"),)


class Train(Base):
    """A train (its relay-agent's certificate name), or a drive-test log."""

    __tablename__ = "trains"
    id: Mapped[str] = mapped_column(TRAIN_ID, primary_key=True)
    source: Mapped[Source] = mapped_column(SOURCE, default=Source.telemetry)
    first_seen: Mapped[dt.datetime] = mapped_column(TS)
    last_seen: Mapped[dt.datetime] = mapped_column(TS)


class Trip(Base):
    """A run of a train's fixes with no gap longer than the trip gap (ingest)."""

    __tablename__ = "trips"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    train_id: Mapped[str] = mapped_column(TRAIN_ID, ForeignKey("trains.id", ondelete="CASCADE"))
    started_at: Mapped[dt.datetime] = mapped_column(TS)
    ended_at: Mapped[dt.datetime] = mapped_column(TS)
    fixes: Mapped[int] = mapped_column(Integer, default=0)
    # Direction of travel over most of the trip, when track_m is known.
    direction: Mapped[Direction | None] = mapped_column(DIRECTION, nullable=True)
    __table_args__ = (
        UniqueConstraint("train_id", "started_at"),
        Index("ix_trips_train_time", "train_id", "started_at", "ended_at"),
    )


class GpsFix(Base):
    """A position fix. Partitioned by ``time`` (see the migration).

    No spatial index: fixes are read by train and time (the primary key);
    spatial questions go to handovers and cells (migration 0004)."""

    __tablename__ = "gps_fixes"
    train_id: Mapped[str] = mapped_column(TRAIN_ID, primary_key=True)
    time: Mapped[dt.datetime] = mapped_column(TS, primary_key=True)
    geog: Mapped[Any] = mapped_column(point())
    speed_mps: Mapped[float | None] = mapped_column(Double)
    heading_deg: Mapped[float | None] = mapped_column(Double)
    accuracy_m: Mapped[float | None] = mapped_column(Double)
    track_m: Mapped[float | None] = mapped_column(Double)
    # Map matching (ingest, when the fix has no track_m and routes exist):
    # the route, the track, the distance from the matched track, and
    # off_route when no route explains the fix (a depot, a GPS jump). NULL
    # when the fix was not matched.
    route_id: Mapped[str | None] = mapped_column(ROUTE_ID, nullable=True)
    track: Mapped[str | None] = mapped_column(String(64), nullable=True)
    match_dist_m: Mapped[float | None] = mapped_column(Double)
    off_route: Mapped[bool | None] = mapped_column(nullable=True)
    __table_args__ = (
        Index("ix_gps_fixes_time", "time", postgresql_using="brin"),
        {"postgresql_partition_by": "RANGE (time)"},
    )


class SignalSample(Base):
    """One interface's serving cell and signal. Partitioned by ``time``."""

    __tablename__ = "signal_samples"
    train_id: Mapped[str] = mapped_column(TRAIN_ID, primary_key=True)
    path: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    time: Mapped[dt.datetime] = mapped_column(TS, primary_key=True)
    carrier: Mapped[str] = mapped_column(CARRIER)
    cell_id: Mapped[int] = mapped_column(BigInteger)
    rsrp_dbm: Mapped[float | None] = mapped_column(Double)
    registration: Mapped[str] = mapped_column(String(16))
    measured_at: Mapped[dt.datetime | None] = mapped_column(TS)
    # Drive-test logs only (the relay reports RSRP alone): RSRQ, SINR, and the
    # network mode as the log names it (LTE, 5G, HSPA+, ...).
    rsrq_db: Mapped[float | None] = mapped_column(Double)
    sinr_db: Mapped[float | None] = mapped_column(Double)
    rat: Mapped[str | None] = mapped_column(String(16))
    __table_args__ = (
        Index("ix_signal_samples_time", "time", postgresql_using="brin"),
        {"postgresql_partition_by": "RANGE (time)"},
    )


class PathStat(Base):
    """One data-plane path's counters and estimates. Partitioned by ``time``."""

    __tablename__ = "path_stats"
    train_id: Mapped[str] = mapped_column(TRAIN_ID, primary_key=True)
    path: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    time: Mapped[dt.datetime] = mapped_column(TS, primary_key=True)
    carrier: Mapped[str] = mapped_column(CARRIER)
    up: Mapped[bool] = mapped_column()
    srtt_us: Mapped[int] = mapped_column(BigInteger)
    rate_bps: Mapped[int] = mapped_column(BigInteger)
    bytes_sent: Mapped[int] = mapped_column(BigInteger)
    bytes_acked: Mapped[int] = mapped_column(BigInteger)
    reinjected_bytes: Mapped[int] = mapped_column(BigInteger)
    redundant_bytes: Mapped[int] = mapped_column(BigInteger)
    rto_count: Mapped[int] = mapped_column(Integer)
    __table_args__ = (
        Index("ix_path_stats_time", "time", postgresql_using="brin"),
        {"postgresql_partition_by": "RANGE (time)"},
    )


class Cell(Base):
    """A cell as the trainer sees it: ⟨carrier, cell ID, direction⟩.

    Derived by ingest from the handovers out of the cell (its source cell):
    counts, and the earliest handover position along the direction of travel
    (the smallest ``track_m`` when increasing, the largest when decreasing;
    its point too).
    """

    __tablename__ = "cells"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    carrier: Mapped[str] = mapped_column(CARRIER)
    cell_id: Mapped[int] = mapped_column(BigInteger)
    direction: Mapped[Direction] = mapped_column(DIRECTION)
    handovers: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    earliest_ho_track_m: Mapped[float | None] = mapped_column(Double)
    earliest_ho_geog: Mapped[Any | None] = mapped_column(point(nullable=True), nullable=True)
    first_seen: Mapped[dt.datetime] = mapped_column(TS)
    last_seen: Mapped[dt.datetime] = mapped_column(TS)
    __table_args__ = (
        UniqueConstraint("carrier", "cell_id", "direction"),
        Index("ix_cells_earliest_geog", "earliest_ho_geog", postgresql_using="gist"),
    )


class Handover(Base):
    """A handover out of ``source_cell_id`` and how it ended."""

    __tablename__ = "handovers"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    train_id: Mapped[str] = mapped_column(TRAIN_ID, ForeignKey("trains.id", ondelete="CASCADE"))
    trip_id: Mapped[int | None] = mapped_column(ForeignKey("trips.id", ondelete="SET NULL"))
    cell: Mapped[int | None] = mapped_column(ForeignKey("cells.id", ondelete="SET NULL"))
    source: Mapped[Source] = mapped_column(SOURCE, default=Source.telemetry)
    carrier: Mapped[str] = mapped_column(CARRIER)
    path: Mapped[int | None] = mapped_column(SmallInteger)
    source_cell_id: Mapped[int] = mapped_column(BigInteger)
    target_cell_id: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[dt.datetime] = mapped_column(TS)
    geog: Mapped[Any] = mapped_column(point())
    track_m: Mapped[float | None] = mapped_column(Double)
    route_id: Mapped[str | None] = mapped_column(ROUTE_ID, nullable=True)
    direction: Mapped[Direction | None] = mapped_column(DIRECTION)
    rsrp_dbm: Mapped[float | None] = mapped_column(Double)
    outcome: Mapped[Outcome] = mapped_column(OUTCOME)
    duration_ms: Mapped[int] = mapped_column(Integer)
    __table_args__ = (
        UniqueConstraint("train_id", "carrier", "start_time"),
        Index("ix_handovers_geog", "geog", postgresql_using="gist"),
        # linkdb-api's lon/lat bounding boxes: a planar envelope test on the
        # geometry, which a geography index cannot serve, and the time order
        # of a map page as a nearest-neighbour scan (btree_gist; 0003, 0005).
        Index(
            "ix_handovers_geom_time",
            text("(CAST(geog AS geometry))"),
            "start_time",
            postgresql_using="gist",
        ),
        Index("ix_handovers_start_time", "start_time"),
        # A cell's handovers in time order, carrying what linkdb-api's cell
        # statistics read, so that they come from the index alone (0012).
        Index(
            "ix_handovers_cell_time",
            "carrier",
            "source_cell_id",
            "direction",
            "start_time",
            postgresql_include=["outcome", "track_m", "duration_ms", "rsrp_dbm", "id"],
        ),
        Index("ix_handovers_cell", "cell"),
        Index("ix_handovers_trip", "trip_id"),
        # ingest's per-train re-derivation of trips and directions (0002) and
        # the API's pages of one train's handovers, in (start_time, id) order
        # (0011).
        Index("ix_handovers_train_time_id", "train_id", "start_time", "id"),
    )


class Model(Base):
    """A trainer run: its parameters and validation results."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(TS, server_default=func.now())
    trainer_version: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    cells_fitted: Mapped[int] = mapped_column(Integer, default=0)
    handovers_used: Mapped[int] = mapped_column(Integer, default=0)
    validation: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class CellModel(Base):
    """One cell's fitted model within a trainer run."""

    __tablename__ = "cell_models"
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    cell: Mapped[int] = mapped_column(ForeignKey("cells.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # e.g. "linear_svc", "fallback"
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    predicted_failure_track_m: Mapped[float | None] = mapped_column(Double)
    failure_rate: Mapped[float | None] = mapped_column(Double)
    # The route predicted_failure_track_m is on (the cell's handovers' route,
    # migration 0006) and the point there on the route's reference line.
    route_id: Mapped[str | None] = mapped_column(ROUTE_ID, nullable=True)
    predicted_failure_geog: Mapped[Any | None] = mapped_column(point(nullable=True), nullable=True)


class FailureTable(Base):
    """A published failure-location table (the proxies' file format in ``body``).

    ``version`` grows by one per publication; ``etag`` is a hash of ``body``
    that the API serves for conditional polling. The current table is the
    highest version. ``body_bytes`` and ``signature``: migration 0009.
    """

    __tablename__ = "failure_tables"
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    created_at: Mapped[dt.datetime] = mapped_column(TS, server_default=func.now())
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    etag: Mapped[str] = mapped_column(String(80))
    entries: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    note: Mapped[str] = mapped_column(Text, default="")
    # The exact bytes published (served verbatim, signed); NULL for tables
    # stored before migration 0009 (the API re-serialises ``body``).
    body_bytes: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The trainer's Ed25519 signature of ``body_bytes``, base64; NULL: unsigned.
    signature: Mapped[str | None] = mapped_column(Text)


# The partitioned tables, for migrations and ingest's partition upkeep.
PARTITIONED = ("gps_fixes", "signal_samples", "path_stats")
