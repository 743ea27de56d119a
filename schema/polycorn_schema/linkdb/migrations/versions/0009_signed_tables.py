"""Signed failure-location tables: each table's exact bytes and
their signature.

``body_bytes`` holds the bytes a publisher stored (the canonical JSON): the
API serves them verbatim, the Kafka message carries them, and the
signature is over them. ``body`` (JSONB) stays for queries; re-serialising
it would not always give the same bytes back (JSONB keeps numbers as it
parsed them), so a signature could not be checked against it. ``signature``
is the trainer's Ed25519 signature of ``body_bytes``, base64 (standard,
padded), as the API's ``X-Polycorn-Signature`` header and the Kafka header
``polycorn-signature`` carry it. Both are nullable: tables published before
this revision, or through ``POST /v1/failure-tables``, have no signature
(and the older ones no stored bytes: the API re-serialises ``body`` for
them, as before).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("failure_tables", sa.Column("body_bytes", sa.LargeBinary(), nullable=True))
    op.add_column("failure_tables", sa.Column("signature", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("failure_tables", "signature")
    op.drop_column("failure_tables", "body_bytes")
