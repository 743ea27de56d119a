"""Month partitions of LinkDB's time-partitioned tables.

The initial migration gives each partitioned table a DEFAULT partition, so a
row is never refused. :func:`ensure_month_partitions` creates the month
partitions that rows are about to go into; if the DEFAULT partition already
holds rows of that month (written before the month existed), they are moved
into the new partition in the same transaction, which PostgreSQL requires
before the partition can be attached.
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

    Returns the names of the partitions created. Concurrent callers are
    serialised with a transaction-scoped advisory lock.
    """
    months = sorted({month_start(t) for t in times})
    if not months:
        return []
    created: list[str] = []
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('polycorn.linkdb.partitions'))"))
    for table in tables:
        if table not in PARTITIONED:
            raise ValueError(f"{table} is not a partitioned LinkDB table")
        have = existing_partitions(conn, table)
        for m in months:
            name = partition_name(table, m)
            if name in have:
                continue
            lo, hi = m.isoformat(), next_month(m).isoformat()
            conn.execute(text(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)"))
            conn.execute(
                text(
                    f"WITH moved AS (DELETE FROM {table}_default "
                    f"WHERE time >= :lo AND time < :hi RETURNING *) "
                    f"INSERT INTO {name} SELECT * FROM moved"
                ),
                {"lo": lo, "hi": hi},
            )
            conn.execute(
                text(
                    f"ALTER TABLE {table} ATTACH PARTITION {name} "
                    f"FOR VALUES FROM ('{lo}') TO ('{hi}')"
                )
            )
            created.append(name)
    return created
