"""Signal samples carry RSRQ, SINR and the network mode.

Drive-test logs (G-NetTrack Pro exports such as the UCC 4G/5G datasets)
record RSRQ, SINR and the radio access technology beside RSRP; the importer
stores them instead of dropping them. The relay's telemetry carries RSRP
only, so the columns are nullable and its rows leave them empty. Adding
nullable columns without a default rewrites nothing (PostgreSQL keeps them
in the catalogue), on the partitioned parent and every partition alike.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 14:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("signal_samples", sa.Column("rsrq_db", sa.Double(), nullable=True))
    op.add_column("signal_samples", sa.Column("sinr_db", sa.Double(), nullable=True))
    op.add_column("signal_samples", sa.Column("rat", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("signal_samples", "rat")
    op.drop_column("signal_samples", "sinr_db")
    op.drop_column("signal_samples", "rsrq_db")
