"""Route pieces keep their end points as columns (matching speed).

The map matcher reads every piece within 150 m of every fix of a batch
(about 50 per fix on a curved double-track line with its source's vertex
spacing) and needs each piece's end points; taking them from the geography
on every read (a cast to geometry, ST_StartPoint/ST_EndPoint, ST_X/ST_Y)
was half of the search's database time. Stored generated columns compute
them once, when a route is stored; existing rows are filled by the
migration (a rewrite of route_segments, which is small: one row per 500 m
or less of track).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_START = "ST_StartPoint(geog::geometry)"
_END = "ST_EndPoint(geog::geometry)"
COLUMNS = {
    "lon0": f"ST_X({_START})",
    "lat0": f"ST_Y({_START})",
    "lon1": f"ST_X({_END})",
    "lat1": f"ST_Y({_END})",
}


def upgrade() -> None:
    for name, expr in COLUMNS.items():
        op.add_column(
            "route_segments",
            sa.Column(name, sa.Double(), sa.Computed(expr, persisted=True), nullable=True),
        )


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("route_segments", name)
