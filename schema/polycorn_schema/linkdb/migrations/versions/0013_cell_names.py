"""Cells by names people can read: ``cell_name(cell_id)``.

LinkDB keys a cell by the 64-bit ID the data plane reports, which is what
the proxies' tables need but not what an operator recognises. The function
turns an ID into the identity it encodes, one rule for the API, the
dashboards and anything else that reads LinkDB:

=====================================  ========================================
ID                                     name
=====================================  ========================================
0 (or negative: never written)         ``unknown``
below 2^28: an LTE E-UTRAN cell        ``eNB 670556 cell 29`` (ECI = eNB ID × 256
identity (3GPP TS 36.300 §8.2)         + cell; what ModemManager's ``cid`` is)
(k + 1) · 2^32 + i with k < 15 and     ``testbed cell i`` (the testbed's cell *i*
i < 2^16                               of carrier *k*, ``testbed_cell_id``)
other IDs below 2^36: a 5G NR cell     ``NR cell 8589934600`` (its split into gNB
identity (NCI, 36 bits)                and cell depends on the gNB ID's length,
                                       which the ID does not carry)
anything larger                        ``cell 0x…`` (a drive-test log's hashed
                                       multi-column identity)
=====================================  ========================================

The testbed's range overlaps NR cell identities whose low 32 bits are below
2^16; such a real NR cell would be named as a testbed one (the number is
still shown). The carrier is not part of the name: every row that has a
cell has its carrier beside it.

IMMUTABLE and written in SQL, so PostgreSQL inlines it into the queries
that call it. Executable by the reading, training and ingesting roles (no
default privileges: 0010).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "public.cell_name(bigint)"
FUNCTION_SQL = f"""
CREATE FUNCTION {SIGNATURE} RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT CASE
  WHEN $1 <= 0 THEN 'unknown'
  WHEN $1 < 268435456 THEN format('eNB %s cell %s', $1 >> 8, $1 & 255)
  WHEN ($1 >> 32) BETWEEN 1 AND 15 AND ($1 & 4294967295) < 65536
    THEN format('testbed cell %s', $1 & 4294967295)
  WHEN $1 < 68719476736 THEN format('NR cell %s', $1)
  ELSE format('cell 0x%s', to_hex($1))
END $$
"""
ROLES = "linkdb_reader, linkdb_trainer, linkdb_ingest"


def upgrade() -> None:
    op.execute(FUNCTION_SQL)
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {ROLES}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
