"""Writing models and failure-location tables to LinkDB.

A trainer run is one ``models`` row and one ``cell_models`` row per cell it
fitted, written in one transaction (a crashed run leaves nothing). The table
the proxies get is assembled from the **latest model of every cell**, whichever
run (or shard) fitted it, so sharded workers need no coordinator: each one
publishes after its run and the last to finish publishes the union.
Publication takes linkdb-api's advisory lock, gets version = previous + 1,
and stores the canonical body with its ETag — the bytes the API serves and
the Kafka message carries (``body_bytes``, verbatim) — and, with a signing
key, their signature (``signature``; :mod:`polycorn_trainer.signing`).

Every table carries ``issued_unix_s`` (now) and ``expires_unix_s`` (now +
``validity_s``) inside the signed bytes: relays and proxies refuse a table
past its expiry and any table older than the highest they accepted, so an
old signed table cannot be replayed. An assembled table equal to the current
one gets no new version (no version churn) but is re-issued under the same
version with a fresh issue time and expiry (signed with the key given, a new
key after a rotation too), so a fleet whose trainer runs keeps a valid table.

The trainer signs only bytes it serialised itself from what it assembled,
never bytes read from the database: anyone who can write ``failure_tables``
could otherwise plant a table that the next run signs. A current row whose
stored bytes are not the canonical form of its stored body is not built
upon: :class:`StoredTableError` (the run fails, counted in
``polycorn_trainer_table_refused_total``) until an operator looks. Without a
signing key, a signed current row is re-sent as stored (nothing is signed).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from polycorn_schema.failure_table import FORMAT, PUBLISH_LOCK, canonical, etag_of
from polycorn_trainer import __version__
from polycorn_trainer.data import CELL_ROUTE
from polycorn_trainer.signing import TableSigner

log = logging.getLogger(__name__)

U64_MAX = 2**64 - 1
# How long a table is valid after it is issued. The trainer re-issues it on
# every run (hourly by default), so a healthy fleet never reaches expiry;
# three days ride out a trainer down over a weekend, and bound how old a
# table a proxy without state (a new pod) can be given.
DEFAULT_VALIDITY_S = 3 * 24 * 3600


class StoredTableError(RuntimeError):
    """The current ``failure_tables`` row was not written by a publisher:
    its stored bytes are not the canonical form of its body."""


@dataclass(frozen=True)
class Published:
    version: int
    entries: int
    etag: str
    body: bytes  # canonical
    new: bool  # false: the assembled table equalled the current one
    signature: str | None = None  # base64 Ed25519 of body; None: unsigned


class StoredModel(Protocol):
    """A cell's model as stored: :class:`~polycorn_trainer.fit.CellResult`
    or :class:`~polycorn_trainer.batch.CellModel` (whose ``params`` may be
    JSON text already)."""

    @property
    def key(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def params(self) -> dict[str, Any] | str: ...
    @property
    def predicted_failure_track_m(self) -> float | None: ...
    @property
    def failure_rate(self) -> float: ...


def _params_json(params: dict[str, Any] | str) -> str:
    return params if isinstance(params, str) else json.dumps(params, allow_nan=False)


def store_model(
    conn: psycopg.Connection,
    results: Sequence[StoredModel],
    params: dict[str, Any],
    validation: dict[str, Any],
    handovers: int,
    *,
    routed: Sequence[int] | None = None,
) -> int:
    """Inserts the run and its cell models; returns ``models.id``. The caller
    owns the transaction. ``routed``: the cells that have a positioned
    handover on a named route, as read (the others get no route, and
    looking their handovers over again costs seconds on a large fleet);
    None: any cell may."""
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
                    _params_json(r.params),
                    r.predicted_failure_track_m,
                    r.failure_rate,
                )
            )
    if routed is None:
        conn.execute(ROUTE_POINTS, {"model": model_id})
    elif routed:
        conn.execute(ROUTE_POINTS + ROUTED, {"model": model_id, "routed": list(routed)})
    return model_id


# Each cell model's route (the route its handovers' positions are on, as
# data.CELL_ROUTE chose it) and its predicted failure point on that route's
# reference line (the piece that holds the measure, interpolated).
ROUTE_POINTS = f"""
UPDATE cell_models m SET route_id = dr.route, predicted_failure_geog = (
    SELECT ST_LineInterpolatePoint(s.geog::geometry,
             CASE WHEN s.end_m > s.start_m
                  THEN (m.predicted_failure_track_m - s.start_m) / (s.end_m - s.start_m)
                  ELSE 0 END)::geography
    FROM route_segments s
    WHERE s.route_id = dr.route AND s.track = ''
      AND m.predicted_failure_track_m BETWEEN s.start_m AND s.end_m
    ORDER BY s.seq LIMIT 1)
FROM cells c {CELL_ROUTE}
WHERE m.model_id = %(model)s AND c.id = m.cell AND dr.route IS NOT NULL"""
ROUTED = " AND m.cell = ANY(%(routed)s::bigint[])"


ASSEMBLE_SQL = """
SELECT c.cell_id, c.direction::text, m.predicted_failure_track_m,
       (m.params->>'failures')::bigint, (m.params->>'handovers')::bigint, c.carrier,
       m.route_id, ST_Y(m.predicted_failure_geog::geometry),
       ST_X(m.predicted_failure_geog::geometry)
FROM (
    SELECT DISTINCT ON (cell) cell, predicted_failure_track_m, params, route_id,
           predicted_failure_geog
    FROM cell_models ORDER BY cell, model_id DESC
) m
JOIN cells c ON c.id = m.cell
WHERE m.predicted_failure_track_m IS NOT NULL
ORDER BY c.cell_id, c.direction
"""

# A route's reference line: each piece's start vertex and measure, then
# the last piece's end.
ROUTE_LINE_SQL = """
SELECT s.route_id, array_agg(ST_X(ST_StartPoint(s.geog::geometry)) ORDER BY s.seq),
       array_agg(ST_Y(ST_StartPoint(s.geog::geometry)) ORDER BY s.seq),
       array_agg(s.start_m ORDER BY s.seq),
       (array_agg(ST_X(ST_EndPoint(s.geog::geometry)) ORDER BY s.seq DESC))[1],
       (array_agg(ST_Y(ST_EndPoint(s.geog::geometry)) ORDER BY s.seq DESC))[1],
       max(s.end_m)
FROM route_segments s WHERE s.route_id = ANY(%s) AND s.track = ''
GROUP BY s.route_id ORDER BY s.route_id
"""


def route_lines(conn: psycopg.Connection, ids: list[str]) -> list[dict[str, Any]]:
    """The reference lines of routes ``ids`` in the table's form: vertices
    ``[lon, lat]`` with their measures (the 500 m pieces' ends, so a
    proxy's interpolation between vertices matches LinkDB's)."""
    out: list[dict[str, Any]] = []
    if not ids:
        return out
    for rid, xs, ys, ms, x1, y1, m1 in conn.execute(ROUTE_LINE_SQL, (ids,)):
        coords = [[float(x), float(y)] for x, y in zip(xs, ys, strict=True)]
        coords.append([float(x1), float(y1)])
        measures = [float(m) for m in ms] + [float(m1)]
        out.append({"id": rid, "coords": coords, "measures": measures})
    return out


def assemble(conn: psycopg.Connection) -> tuple[list[dict[str, Any]], int]:
    """The table's entries from the latest model of every cell, and how many
    entries were left out because their cell ID cannot be a data-plane ID."""
    entries: list[dict[str, Any]] = []
    skipped = 0
    seen: dict[tuple[int, str], str] = {}
    rows = conn.execute(ASSEMBLE_SQL)
    for cell_id, direction, pos, failures, handovers, carrier, route, lat, lon in rows:
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
        e: dict[str, Any] = {
            "cell": int(cell_id),
            "direction": direction,
            "position_m": float(pos),
            "failures": int(failures),
            "handovers": int(handovers),
        }
        if route is not None:
            e["route"] = str(route)
            if lat is not None and lon is not None:
                e["lat"], e["lon"] = float(lat), float(lon)
        entries.append(e)
    return entries, skipped


@dataclass(frozen=True)
class Current:
    version: int
    body: dict[str, Any]
    etag: str
    data: bytes | None  # body_bytes; None: stored before migration 0009
    signature: str | None


def current_table(conn: psycopg.Connection) -> Current | None:
    row = conn.execute(
        "SELECT version, body, etag, body_bytes, signature FROM failure_tables "
        "ORDER BY version DESC LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    data = bytes(row[3]) if row[3] is not None else None
    return Current(int(row[0]), row[1], str(row[2]), data, row[4])


def check_stored(cur: Current) -> None:
    """Raises :class:`StoredTableError` unless the row's stored bytes are
    the canonical form of its stored body (what every publisher writes)."""
    if cur.data is not None and cur.data != canonical(cur.body):
        raise StoredTableError(
            f"failure_tables v{cur.version}: body_bytes ({len(cur.data)} bytes, "
            f"sha256 {etag_of(cur.data)[:16]}) are not the canonical form of its body; "
            "not signing or building on it (a row not written by a publisher?)"
        )


def serialise(
    version: int,
    entries: list[dict[str, Any]],
    routes: list[dict[str, Any]],
    *,
    model_id: int | None,
    issued_unix_s: int,
    validity_s: int,
) -> bytes:
    """The table's canonical bytes, from what this run assembled."""
    body: dict[str, Any] = {
        "format": FORMAT,
        "version": version,
        "source": f"polycorn-trainer {__version__}"
        + (f", model {model_id}" if model_id is not None else ""),
        "issued_unix_s": issued_unix_s,
        "expires_unix_s": issued_unix_s + validity_s,
        "entries": entries,
    }
    if routes:
        body["routes"] = routes
    return canonical(body)


def publish_table(
    conn: psycopg.Connection,
    model_id: int | None,
    signer: TableSigner | None = None,
    *,
    validity_s: int = DEFAULT_VALIDITY_S,
    now_unix_s: int | None = None,
) -> Published | None:
    """Assembles and stores the next table, or re-issues the current one
    (module docstring), signed with ``signer``. ``None`` when no cell has a
    failure location and no table was ever published."""
    issued = int(time.time()) if now_unix_s is None else now_unix_s
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (PUBLISH_LOCK,))
        entries, skipped = assemble(conn)
        routes = route_lines(conn, sorted({e["route"] for e in entries if "route" in e}))
        if skipped:
            log.warning("%d cells left out of the table (cell ID not a data-plane ID)", skipped)
        cur = current_table(conn)
        if cur is not None:
            check_stored(cur)
        unchanged = (
            cur is not None
            and cur.body.get("entries") == entries
            and cur.body.get("routes", []) == routes
        )
        if cur is not None and unchanged and signer is None and cur.signature is not None:
            # No key to sign a re-issue with: re-send the signed table as stored.
            data = cur.data if cur.data is not None else canonical(cur.body)
            return Published(cur.version, len(entries), cur.etag, data, False, cur.signature)
        if cur is None and not entries:
            return None
        version = cur.version if cur is not None and unchanged else (cur.version if cur else 0) + 1
        data = serialise(
            version,
            entries,
            routes,
            model_id=model_id,
            issued_unix_s=issued,
            validity_s=validity_s,
        )
        etag = etag_of(data)
        signature = signer.sign(data) if signer is not None else None
        if unchanged:
            conn.execute(
                "UPDATE failure_tables SET body = %s, body_bytes = %s, etag = %s, signature = %s "
                "WHERE version = %s",
                (data.decode(), data, etag, signature, version),
            )
        else:
            conn.execute(
                "INSERT INTO failure_tables "
                "(version, model_id, etag, entries, body, note, body_bytes, signature) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (version, model_id, etag, len(entries), data.decode(), "trainer", data, signature),
            )
    log.info(
        "failure-location table v%d %s: %d entries, valid until %d, %s",
        version,
        "re-issued" if unchanged else "published",
        len(entries),
        issued + validity_s,
        f"signed with {signer.origin}" if signer is not None else "unsigned",
    )
    return Published(version, len(entries), etag, data, new=not unchanged, signature=signature)
