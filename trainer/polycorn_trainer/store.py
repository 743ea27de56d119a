"""Writing models and failure-location tables to LinkDB.

A trainer run is one ``models`` row and one ``cell_models`` row per cell it
fitted, written in one transaction (a crashed run leaves nothing). The table
the proxies get is assembled from the **latest model of every cell**, whichever
run (or shard) fitted it, so sharded workers need no coordinator: each one
publishes after its run and the last to finish publishes the union.
Publication takes linkdb-api's advisory lock, gets version = previous + 1,
and stores the canonical body with its ETag — the bytes the API serves and
the Kafka message carries. An assembled table equal to the current one is
not published again (no version churn); :func:`publish_table` then reports
the current one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from polycorn_schema.failure_table import FORMAT, PUBLISH_LOCK, canonical, etag_of
from polycorn_trainer import __version__
from polycorn_trainer.fit import CellResult

log = logging.getLogger(__name__)

U64_MAX = 2**64 - 1


@dataclass(frozen=True)
class Published:
    version: int
    entries: int
    etag: str
    body: bytes  # canonical
    new: bool  # false: the assembled table equalled the current one


def store_model(
    conn: psycopg.Connection,
    results: list[CellResult],
    params: dict[str, Any],
    validation: dict[str, Any],
    handovers: int,
) -> int:
    """Inserts the run and its cell models; returns ``models.id``. The caller
    owns the transaction."""
    row = conn.execute(
        "INSERT INTO models (trainer_version, params, cells_fitted, handovers_used, validation) "
        "VALUES (%s, %s, %s, %s, %s) RETURNING id",
        (
            f"polycorn-trainer {__version__}",
            json.dumps(params),
            sum(1 for r in results if r.kind == "linear_svc"),
            handovers,
            json.dumps(validation),
        ),
    ).fetchone()
    if row is None:
        raise RuntimeError("INSERT ... RETURNING gave no row")
    model_id = int(row[0])
    with conn.cursor().copy(
        "COPY cell_models (model_id, cell, kind, params, predicted_failure_track_m, failure_rate) "
        "FROM STDIN"
    ) as cp:
        for r in results:
            cp.write_row(
                (
                    model_id,
                    r.key,
                    r.kind,
                    json.dumps(r.params, allow_nan=False),
                    r.predicted_failure_track_m,
                    r.failure_rate,
                )
            )
    return model_id


ASSEMBLE_SQL = """
SELECT c.cell_id, c.direction::text, m.predicted_failure_track_m,
       (m.params->>'failures')::bigint, (m.params->>'handovers')::bigint, c.carrier
FROM (
    SELECT DISTINCT ON (cell) cell, predicted_failure_track_m, params
    FROM cell_models ORDER BY cell, model_id DESC
) m
JOIN cells c ON c.id = m.cell
WHERE m.predicted_failure_track_m IS NOT NULL
ORDER BY c.cell_id, c.direction
"""


def assemble(conn: psycopg.Connection) -> tuple[list[dict[str, Any]], int]:
    """The table's entries from the latest model of every cell, and how many
    entries were left out because their cell ID cannot be a data-plane ID."""
    entries: list[dict[str, Any]] = []
    skipped = 0
    seen: dict[tuple[int, str], str] = {}
    for cell_id, direction, pos, failures, handovers, carrier in conn.execute(ASSEMBLE_SQL):
        if cell_id is None or cell_id <= 0 or cell_id > U64_MAX:
            skipped += 1
            continue
        k = (int(cell_id), direction)
        if k in seen:
            # Two carriers reporting the same data-plane cell ID: the data
            # plane cannot tell them apart, so neither gets an entry.
            log.warning("cell %s %s seen on carriers %s and %s: left out", *k, seen[k], carrier)
            skipped += 1
            entries = [e for e in entries if (e["cell"], e["direction"]) != k]
            continue
        seen[k] = carrier
        entries.append(
            {
                "cell": int(cell_id),
                "direction": direction,
                "position_m": float(pos),
                "failures": int(failures),
                "handovers": int(handovers),
            }
        )
    return entries, skipped


def current_table(conn: psycopg.Connection) -> tuple[int, dict[str, Any], str] | None:
    row = conn.execute(
        "SELECT version, body, etag FROM failure_tables ORDER BY version DESC LIMIT 1"
    ).fetchone()
    return (int(row[0]), row[1], str(row[2])) if row else None


def publish_table(conn: psycopg.Connection, model_id: int | None) -> Published | None:
    """Assembles and stores the next table (module docstring). ``None`` when
    no cell has a failure location and no table was ever published."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (PUBLISH_LOCK,))
        entries, skipped = assemble(conn)
        if skipped:
            log.warning("%d cells left out of the table (cell ID not a data-plane ID)", skipped)
        cur = current_table(conn)
        if cur is not None and cur[1].get("entries") == entries:
            version, body, etag = cur
            data = canonical(body)
            return Published(version, len(entries), etag, data, new=False)
        if cur is None and not entries:
            return None
        version = (cur[0] if cur else 0) + 1
        body = {
            "format": FORMAT,
            "version": version,
            "source": f"polycorn-trainer {__version__}"
            + (f", model {model_id}" if model_id is not None else ""),
            "entries": entries,
        }
        data = canonical(body)
        etag = etag_of(data)
        conn.execute(
            "INSERT INTO failure_tables (version, model_id, etag, entries, body, note) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (version, model_id, etag, len(entries), data.decode(), "trainer"),
        )
    log.info("failure-location table v%d published: %d entries", version, len(entries))
    return Published(version, len(entries), etag, data, new=True)
