"""linkdb-api: a GiST index on the handovers' positions as geometry.

The API's bounding boxes are lon/lat rectangles (``ST_MakeEnvelope``); a
geography index compares geocentric boxes, which do not follow lines of
latitude, so the API filters ``geog::geometry && envelope`` and this
expression index is what serves it (EXPLAIN: Bitmap Index Scan on
ix_handovers_geom).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_handovers_geom ON handovers USING gist ((CAST(geog AS geometry)))")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_handovers_geom")
