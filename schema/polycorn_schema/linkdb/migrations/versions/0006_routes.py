"""Routes: track geometry, and map-matched fixes.

``routes`` holds each line's linear reference (a geography linestring whose
vertex order is the direction of increasing ``track_m``), ``route_tracks``
the line's tracks with the direction(s) trains run on each, and
``route_segments`` the reference and the tracks cut into straight pieces
of at most 500 m with the measure at both ends and a GiST index, so that
matching a fix reads only the pieces near it and computes its measure on a
short piece (exact to centimetres, where a
fraction of a whole line in degrees is not: PostGIS 3.3 has no geography
``ST_LineLocatePoint``). Fixes and handovers gain the matched route;
fixes also the track, the distance from it and an off-route flag; a
cell model the route of its predicted failure location and that point. No
foreign keys from the time series to ``routes``: a route can be replaced
(re-imported) without touching months of fixes, and ingest's inserts pay
no lookup.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from geoalchemy2 import Geography
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROUTE_ID = sa.String(128, collation="C")


def _line() -> Geography:
    return Geography(geometry_type="LINESTRING", srid=4326, spatial_index=False, nullable=False)


def upgrade() -> None:
    source = postgresql.ENUM("geojson", "osm", "learned", name="route_source")
    running = postgresql.ENUM("increasing", "decreasing", "both", name="track_running")
    op.create_table(
        "routes",
        sa.Column("id", ROUTE_ID, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("source", source, nullable=False),
        sa.Column("length_m", sa.Double(), nullable=False),
        sa.Column("geog", _line(), nullable=False),
        sa.Column("properties", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_routes"),
    )
    op.create_table(
        "route_tracks",
        sa.Column("route_id", ROUTE_ID, nullable=False),
        sa.Column("track", sa.String(64), nullable=False),
        sa.Column("running", running, nullable=False),
        sa.Column("geog", _line(), nullable=False),
        sa.ForeignKeyConstraint(
            ["route_id"],
            ["routes.id"],
            name="fk_route_tracks_route_id_routes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("route_id", "track", name="pk_route_tracks"),
    )
    op.create_table(
        "route_segments",
        sa.Column("route_id", ROUTE_ID, nullable=False),
        sa.Column("track", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("start_m", sa.Double(), nullable=False),
        sa.Column("end_m", sa.Double(), nullable=False),
        sa.Column("geog", _line(), nullable=False),
        sa.ForeignKeyConstraint(
            ["route_id"],
            ["routes.id"],
            name="fk_route_segments_route_id_routes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("route_id", "track", "seq", name="pk_route_segments"),
    )
    op.create_index("ix_route_segments_geog", "route_segments", ["geog"], postgresql_using="gist")
    # Partitioned: ADD COLUMN on the parent reaches every partition; nullable
    # columns without defaults are a catalogue change, not a rewrite.
    op.add_column("gps_fixes", sa.Column("route_id", ROUTE_ID, nullable=True))
    op.add_column("gps_fixes", sa.Column("track", sa.String(64), nullable=True))
    op.add_column("gps_fixes", sa.Column("match_dist_m", sa.Double(), nullable=True))
    op.add_column("gps_fixes", sa.Column("off_route", sa.Boolean(), nullable=True))
    op.add_column("handovers", sa.Column("route_id", ROUTE_ID, nullable=True))
    op.add_column("cell_models", sa.Column("route_id", ROUTE_ID, nullable=True))
    op.add_column(
        "cell_models",
        sa.Column(
            "predicted_failure_geog",
            Geography(geometry_type="POINT", srid=4326, spatial_index=False),
            nullable=True,
        ),
    )


def downgrade() -> None:
    op.drop_column("cell_models", "predicted_failure_geog")
    op.drop_column("cell_models", "route_id")
    op.drop_column("handovers", "route_id")
    for col in ("off_route", "match_dist_m", "track", "route_id"):
        op.drop_column("gps_fixes", col)
    op.drop_index("ix_route_segments_geog", table_name="route_segments")
    op.drop_table("route_segments")
    op.drop_table("route_tracks")
    op.drop_table("routes")
    op.execute("DROP TYPE IF EXISTS track_running")
    op.execute("DROP TYPE IF EXISTS route_source")
