"""Initial LinkDB schema: trains, trips, time-partitioned fixes/samples/path stats,
cells, handovers, models and failure-location tables.

Revision ID: 0001
Revises: -
Create Date: 2026-11-24 13:27:42.611055
"""

from __future__ import annotations

from collections.abc import Sequence

import geoalchemy2
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS postgis")
    op.create_table(
        "cells",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("carrier", sa.String(length=64), nullable=False),
        sa.Column("cell_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "direction", sa.Enum("increasing", "decreasing", name="track_direction"), nullable=False
        ),
        sa.Column("handovers", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("earliest_ho_track_m", sa.Double(), nullable=True),
        sa.Column(
            "earliest_ho_geog",
            geoalchemy2.types.Geography(
                geometry_type="POINT",
                srid=4326,
                dimension=2,
                spatial_index=False,
                from_text="ST_GeogFromText",
                name="geography",
            ),
            nullable=True,
        ),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cells")),
        sa.UniqueConstraint(
            "carrier", "cell_id", "direction", name=op.f("uq_cells_carrier_cell_id_direction")
        ),
    )
    op.create_index(
        "ix_cells_earliest_geog",
        "cells",
        ["earliest_ho_geog"],
        unique=False,
        postgresql_using="gist",
    )
    op.create_table(
        "gps_fixes",
        sa.Column("train_id", sa.String(length=128), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "geog",
            geoalchemy2.types.Geography(
                geometry_type="POINT",
                srid=4326,
                dimension=2,
                spatial_index=False,
                from_text="ST_GeogFromText",
                name="geography",
                nullable=False,
            ),
            nullable=False,
        ),
        sa.Column("speed_mps", sa.Double(), nullable=True),
        sa.Column("heading_deg", sa.Double(), nullable=True),
        sa.Column("accuracy_m", sa.Double(), nullable=True),
        sa.Column("track_m", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("train_id", "time", name=op.f("pk_gps_fixes")),
        postgresql_partition_by="RANGE (time)",
    )
    op.create_index(
        "ix_gps_fixes_geog", "gps_fixes", ["geog"], unique=False, postgresql_using="gist"
    )
    op.create_index("ix_gps_fixes_time", "gps_fixes", ["time"], unique=False)
    op.create_table(
        "models",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("trainer_version", sa.String(length=64), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("cells_fitted", sa.Integer(), nullable=False),
        sa.Column("handovers_used", sa.Integer(), nullable=False),
        sa.Column("validation", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
    )
    op.create_table(
        "path_stats",
        sa.Column("train_id", sa.String(length=128), nullable=False),
        sa.Column("path", sa.SmallInteger(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("carrier", sa.String(length=64), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("srtt_us", sa.BigInteger(), nullable=False),
        sa.Column("rate_bps", sa.BigInteger(), nullable=False),
        sa.Column("bytes_sent", sa.BigInteger(), nullable=False),
        sa.Column("bytes_acked", sa.BigInteger(), nullable=False),
        sa.Column("reinjected_bytes", sa.BigInteger(), nullable=False),
        sa.Column("redundant_bytes", sa.BigInteger(), nullable=False),
        sa.Column("rto_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("train_id", "path", "time", name=op.f("pk_path_stats")),
        postgresql_partition_by="RANGE (time)",
    )
    op.create_index("ix_path_stats_time", "path_stats", ["time"], unique=False)
    op.create_table(
        "signal_samples",
        sa.Column("train_id", sa.String(length=128), nullable=False),
        sa.Column("path", sa.SmallInteger(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("carrier", sa.String(length=64), nullable=False),
        sa.Column("cell_id", sa.BigInteger(), nullable=False),
        sa.Column("rsrp_dbm", sa.Double(), nullable=True),
        sa.Column("registration", sa.String(length=16), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("train_id", "path", "time", name=op.f("pk_signal_samples")),
        postgresql_partition_by="RANGE (time)",
    )
    op.create_index("ix_signal_samples_time", "signal_samples", ["time"], unique=False)
    op.create_table(
        "trains",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("source", sa.Enum("telemetry", "drivetest", name="row_source"), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trains")),
    )
    op.create_table(
        "cell_models",
        sa.Column("model_id", sa.BigInteger(), nullable=False),
        sa.Column("cell", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("predicted_failure_track_m", sa.Double(), nullable=True),
        sa.Column("failure_rate", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cell"], ["cells.id"], name=op.f("fk_cell_models_cell_cells"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_cell_models_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "cell", name=op.f("pk_cell_models")),
    )
    op.create_table(
        "failure_tables",
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("model_id", sa.BigInteger(), nullable=True),
        sa.Column("etag", sa.String(length=80), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_failure_tables_model_id_models"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_failure_tables")),
    )
    op.create_table(
        "trips",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("train_id", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fixes", sa.Integer(), nullable=False),
        sa.Column(
            "direction", sa.Enum("increasing", "decreasing", name="track_direction"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["train_id"], ["trains.id"], name=op.f("fk_trips_train_id_trains"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trips")),
        sa.UniqueConstraint("train_id", "started_at", name=op.f("uq_trips_train_id_started_at")),
    )
    op.create_index(
        "ix_trips_train_time", "trips", ["train_id", "started_at", "ended_at"], unique=False
    )
    op.create_table(
        "handovers",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("train_id", sa.String(length=128), nullable=False),
        sa.Column("trip_id", sa.BigInteger(), nullable=True),
        sa.Column("cell", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Enum("telemetry", "drivetest", name="row_source"), nullable=False),
        sa.Column("carrier", sa.String(length=64), nullable=False),
        sa.Column("path", sa.SmallInteger(), nullable=True),
        sa.Column("source_cell_id", sa.BigInteger(), nullable=False),
        sa.Column("target_cell_id", sa.BigInteger(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "geog",
            geoalchemy2.types.Geography(
                geometry_type="POINT",
                srid=4326,
                dimension=2,
                spatial_index=False,
                from_text="ST_GeogFromText",
                name="geography",
                nullable=False,
            ),
            nullable=False,
        ),
        sa.Column("track_m", sa.Double(), nullable=True),
        sa.Column(
            "direction", sa.Enum("increasing", "decreasing", name="track_direction"), nullable=True
        ),
        sa.Column("rsrp_dbm", sa.Double(), nullable=True),
        sa.Column(
            "outcome", sa.Enum("success", "failure", name="handover_outcome"), nullable=False
        ),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cell"], ["cells.id"], name=op.f("fk_handovers_cell_cells"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["train_id"],
            ["trains.id"],
            name=op.f("fk_handovers_train_id_trains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trip_id"], ["trips.id"], name=op.f("fk_handovers_trip_id_trips"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_handovers")),
        sa.UniqueConstraint(
            "train_id",
            "carrier",
            "start_time",
            name=op.f("uq_handovers_train_id_carrier_start_time"),
        ),
    )
    op.create_index("ix_handovers_cell", "handovers", ["cell"], unique=False)
    op.create_index(
        "ix_handovers_cell_key",
        "handovers",
        ["carrier", "source_cell_id", "direction"],
        unique=False,
    )
    op.create_index(
        "ix_handovers_geog", "handovers", ["geog"], unique=False, postgresql_using="gist"
    )
    op.create_index("ix_handovers_start_time", "handovers", ["start_time"], unique=False)
    op.create_index("ix_handovers_trip", "handovers", ["trip_id"], unique=False)
    # Every partitioned table gets a DEFAULT partition, so that no row is ever
    # refused for lack of a partition; ingest adds the month partitions
    # (polycorn_schema.linkdb.partitions) ahead of the data.
    for table in ("gps_fixes", "signal_samples", "path_stats"):
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")


def downgrade() -> None:
    op.drop_index("ix_handovers_trip", table_name="handovers")
    op.drop_index("ix_handovers_start_time", table_name="handovers")
    op.drop_index("ix_handovers_geog", table_name="handovers", postgresql_using="gist")
    op.drop_index("ix_handovers_cell_key", table_name="handovers")
    op.drop_index("ix_handovers_cell", table_name="handovers")
    op.drop_table("handovers")
    op.drop_index("ix_trips_train_time", table_name="trips")
    op.drop_table("trips")
    op.drop_table("failure_tables")
    op.drop_table("cell_models")
    op.drop_table("trains")
    op.drop_index("ix_signal_samples_time", table_name="signal_samples")
    op.drop_table("signal_samples")
    op.drop_index("ix_path_stats_time", table_name="path_stats")
    op.drop_table("path_stats")
    op.drop_table("models")
    op.drop_index("ix_gps_fixes_time", table_name="gps_fixes")
    op.drop_index("ix_gps_fixes_geog", table_name="gps_fixes", postgresql_using="gist")
    op.drop_table("gps_fixes")
    op.drop_index("ix_cells_earliest_geog", table_name="cells", postgresql_using="gist")
    op.drop_table("cells")
    for enum in ("handover_outcome", "track_direction", "row_source"):
        op.execute(f"DROP TYPE IF EXISTS {enum}")
