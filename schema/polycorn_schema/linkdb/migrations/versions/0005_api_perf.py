"""linkdb-api performance: the handovers' bbox index also orders by time.

``ix_handovers_geom_time`` is a GiST index on ``(geog::geometry,
start_time)`` (the time column through btree_gist, a contrib extension of
PostgreSQL). It replaces ``ix_handovers_geom`` (0003), which it subsumes
for bbox filters, and serves the API's map page, "the first N handovers in
this viewport in time order", as a nearest-neighbour scan
``ORDER BY start_time <-> <the earliest timestamptz>``: the rows come out
of the index in time order, so only the page's rows are read from the
table (linkdb-api/polycorn_linkdb_api/routes/handovers.py). One GiST index
replaces another, so ingest maintains as many indexes as before (each
entry is larger: the index is about 1.7 x the size of 0003's).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    op.execute(
        "CREATE INDEX ix_handovers_geom_time ON handovers "
        "USING gist ((CAST(geog AS geometry)), start_time)"
    )
    op.execute("DROP INDEX IF EXISTS ix_handovers_geom")


def downgrade() -> None:
    op.execute("CREATE INDEX ix_handovers_geom ON handovers USING gist ((CAST(geog AS geometry)))")
    op.execute("DROP INDEX IF EXISTS ix_handovers_geom_time")
    # btree_gist stays: other objects may use it, and it costs nothing.
