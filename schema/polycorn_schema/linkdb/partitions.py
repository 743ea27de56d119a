"""Month partitions of LinkDB's time-partitioned tables.

The initial migration gives each partitioned table a DEFAULT partition, so a
row is never refused. :func:`ensure_month_partitions` creates the month
partitions that rows are about to go into; if the DEFAULT partition already
holds rows of that month (written before the month existed), they are moved
into the new partition in the same transaction, which PostgreSQL requires
before the partition can be attached. The database function
``linkdb_ensure_month_partition`` (migration 0010) does it as the tables'
owner, so that ingest's role needs no ownership of them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from sqlalchemy import Connection, text

from polycorn_schema.linkdb.models import PARTITIONED


def month_start(t: dt.datetime) -> dt.datetime:
    t = t.astimezone(dt.UTC)
    return dt.datetime(t.year, t.month, 1, tzinfo=dt.UTC)


def next_month(m: dt.datetime) -> dt.datetime:
    return dt.datetime(m.year + (m.month == 12), m.month % 12 + 1, 1, tzinfo=dt.UTC)


def partition_name(table: str, m: dt.datetime) -> str:
    return f"{table}_y{m.year:04d}m{m.month:02d}"


def existing_partitions(conn: Connection, table: str) -> set[str]:
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t"
        ),
        {"t": table},
    )
    return {r[0] for r in rows}


def ensure_month_partitions(
    conn: Connection, times: Iterable[dt.datetime], tables: Iterable[str] = PARTITIONED
) -> list[str]:
    """Create the month partitions covering ``times`` (run inside a transaction).

    Returns the names of the partitions created. The work is done by the
    database function ``linkdb_ensure_month_partition`` (migration 0010): it
    runs as the tables' owner, so ingest's role needs EXECUTE on it and not
    ownership of the tables; it serialises concurrent callers with a
    transaction-scoped advisory lock and gives each new partition its
    parent's privileges.
    """
    months = sorted({month_start(t) for t in times})
    if not months:
        return []
    created: list[str] = []
    for table in tables:
        if table not in PARTITIONED:
            raise ValueError(f"{table} is not a partitioned LinkDB table")
        for m in months:
            name = conn.execute(
                text("SELECT public.linkdb_ensure_month_partition(:t, :m)"), {"t": table, "m": m}
            ).scalar()
            if name is not None:
                if name != partition_name(table, m):
                    raise RuntimeError(f"partition {name} made for {table} {m:%Y-%m}")
                created.append(name)
    return created
