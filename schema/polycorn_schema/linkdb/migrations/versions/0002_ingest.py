"""ingest: an index on handovers (train_id, start_time).

ingest re-derives the trip and direction of a train's handovers near newly
arrived fixes; that is a per-train time-range lookup, which neither the
unique key (train_id, carrier, start_time) nor ix_handovers_start_time
serves well once a train has months of handovers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_handovers_train_time", "handovers", ["train_id", "start_time"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_handovers_train_time", table_name="handovers")
