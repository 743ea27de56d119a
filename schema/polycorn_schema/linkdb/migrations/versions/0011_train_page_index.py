"""A train's handovers page straight off one index.

The API lists a train's handovers in ``(start_time, id)`` order, a page at a
time (``/v1/handovers?train_id=...``). ``ix_handovers_train_time`` on
``(train_id, start_time)`` could not give that order on its own, so the
planner either walked ``ix_handovers_start_time`` and skipped every other
train's rows (a page of 100 read 780 rows with 8 trains; with a fleet of
hundreds, hundreds of times its size) or read the train's whole window and
sorted it. With ``id`` as the index's last column an equality on the train
leaves the rows in exactly the page's order: a page reads its own rows and
the one after (linkdb-api/tests/test_plans.py). The new index replaces the
old one, which it subsumes for ingest's per-train reads (0002).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 09:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_handovers_train_time_id", "handovers", ["train_id", "start_time", "id"], unique=False
    )
    op.drop_index("ix_handovers_train_time", table_name="handovers")


def downgrade() -> None:
    op.create_index(
        "ix_handovers_train_time", "handovers", ["train_id", "start_time"], unique=False
    )
    op.drop_index("ix_handovers_train_time_id", table_name="handovers")
