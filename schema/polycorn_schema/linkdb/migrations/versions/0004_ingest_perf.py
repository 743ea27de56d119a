"""ingest throughput: bytewise text keys, BRIN time indexes, no GiST on fixes.

- ``train_id`` / ``trains.id`` and ``carrier`` become ``COLLATE "C"``:
  they are identifiers, and every natural-key B-tree probe and insert
  compares them; under a libc locale (the test cluster's ``C.UTF-8``) each
  comparison goes through ``strcoll`` instead of ``memcmp``. Only indexes on
  these columns are rebuilt (same type, so no table rewrite). ASCII ids sort
  the same as before.
- The ``time`` indexes of ``gps_fixes``, ``signal_samples`` and
  ``path_stats`` become BRIN: the series are appended in time order, so a
  block range summary serves time-range scans at a fraction of a B-tree
  insert's cost. Per-train queries use the primary keys (train, …, time).
- ``gps_fixes`` loses its GiST index on ``geog``: nothing queries fixes
  spatially (linkdb-api serves a train's fixes by train and time; spatial
  queries are on handovers and cells, which keep theirs). docs/linkdb.md.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table -> (column, length) of the text key columns made bytewise.
KEYS: dict[str, list[tuple[str, int]]] = {
    "trains": [("id", 128)],
    "trips": [("train_id", 128)],
    "gps_fixes": [("train_id", 128)],
    "signal_samples": [("train_id", 128), ("carrier", 64)],
    "path_stats": [("train_id", 128), ("carrier", 64)],
    "cells": [("carrier", 64)],
    "handovers": [("train_id", 128), ("carrier", 64)],
}
FKS = (
    ("fk_trips_train_id_trains", "trips"),
    ("fk_handovers_train_id_trains", "handovers"),
)
SERIES = ("gps_fixes", "signal_samples", "path_stats")


def _collate(collation: str | None) -> None:
    for name, table in FKS:
        op.drop_constraint(name, table, type_="foreignkey")
    for table, cols in KEYS.items():
        with op.batch_alter_table(table) as b:
            for col, n in cols:
                b.alter_column(
                    col,
                    type_=sa.String(n, collation=collation),
                    existing_type=sa.String(n),
                    existing_nullable=False,
                )
    for name, table in FKS:
        op.create_foreign_key(name, table, "trains", ["train_id"], ["id"], ondelete="CASCADE")


def _time_indexes(using: str) -> None:
    for table in SERIES:
        op.drop_index(f"ix_{table}_time", table_name=table)
        op.create_index(f"ix_{table}_time", table, ["time"], unique=False, postgresql_using=using)


def upgrade() -> None:
    _collate("C")
    _time_indexes("brin")
    op.drop_index("ix_gps_fixes_geog", table_name="gps_fixes", postgresql_using="gist")


def downgrade() -> None:
    op.create_index(
        "ix_gps_fixes_geog", "gps_fixes", ["geog"], unique=False, postgresql_using="gist"
    )
    _time_indexes("btree")
    _collate(None)
