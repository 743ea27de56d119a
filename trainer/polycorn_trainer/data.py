"""Reading the training data from LinkDB: the handovers of every cell of a
shard.

A trainer run reads them with :class:`Reader`: the shard's cells in
*passes* of a few thousand cells, each pass one ``COPY ... TO STDOUT
(FORMAT BINARY)`` whose rows (one per handover, every field fixed-width and
never NULL) NumPy reads straight from the received bytes, sorted and cut
into cells with NumPy too (:class:`~polycorn_trainer.batch.Columns`). Each
pass is fitted while the next one is read, and memory holds a few passes,
not the fleet. :func:`load_cells` is the reference: one query that groups
the handovers into arrays per cell in the database, and rows of Python
objects; ``tests/test_fast_path.py`` checks that both read the same.

Sharding: a cell belongs to shard ``hash(carrier:cell_id:direction) mod N``
with PostgreSQL's ``hashtextextended`` (seed 0), which does not depend on
row order or surrogate ids, so N workers (a Kubernetes indexed Job) split a
fleet with no coordination and every cell lands in exactly one shard.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from polycorn_trainer.batch import Columns
from polycorn_trainer.fit import B, CellData, Priors, priors_from_counts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N`` with 0 ≤ I < N."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m:
            raise ValueError(f"shard must be I/N (for example 0/4), got {text!r}")
        i, n = int(m[1]), int(m[2])
        if n < 1 or n > 1_000_000 or i >= n:
            raise ValueError(f"shard {text!r}: need 0 <= I < N, N between 1 and 1000000")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


SHARD_EXPR = (
    "mod(hashtextextended(c.carrier || ':' || c.cell_id::text || ':' || c.direction::text, 0)"
    " & 9223372036854775807, %(shard_n)s) = %(shard_i)s"
)

# One scan of the shard's handovers: the positioned ones as arrays, the
# others counted. Positioned means a track_m on the cell's route: a cell
# whose handovers were map-matched onto more than one route (a junction)
# is fitted on the route most of them are on (measures on different routes
# do not compare); ties go to a named route. Speed at a handover: the
# train's last fix within 10 s before its start (looked up for positioned
# handovers only). The reporting train as a 64-bit hash of its ID: two
# trains whose IDs collide would count as one, which only ever makes the
# table's several-trains rule (fit.qualifies) harder to meet, never easier.
CELL_ROUTE = """LEFT JOIN LATERAL (
    SELECT h2.route_id AS route FROM handovers h2
    WHERE h2.cell = c.id AND h2.track_m IS NOT NULL
    GROUP BY h2.route_id ORDER BY count(*) DESC, h2.route_id NULLS LAST LIMIT 1
) dr ON true"""
ON_ROUTE = "h.track_m IS NOT NULL AND h.route_id IS NOT DISTINCT FROM dr.route"
T = f"FILTER (WHERE {ON_ROUTE})"
CELLS_SQL = f"""
SELECT c.id, c.carrier, c.cell_id, c.direction::text,
       count(*) FILTER (WHERE NOT ({ON_ROUTE})),
       array_agg(h.track_m ORDER BY h.start_time, h.id) {T},
       array_agg(coalesce(h.rsrp_dbm, 'NaN'::float8) ORDER BY h.start_time, h.id) {T},
       array_agg(h.outcome = 'failure' ORDER BY h.start_time, h.id) {T},
       array_agg(coalesce(h.trip_id, -h.id) ORDER BY h.start_time, h.id) {T},
       array_agg(hashtextextended(h.train_id, 0) ORDER BY h.start_time, h.id) {T},
       array_agg(coalesce(s.speed_mps, 'NaN'::float8) ORDER BY h.start_time, h.id) {T}
FROM cells c
{CELL_ROUTE}
JOIN handovers h ON h.cell = c.id
LEFT JOIN LATERAL (
    SELECT g.speed_mps FROM gps_fixes g
    WHERE h.track_m IS NOT NULL AND g.train_id = h.train_id
      AND g.time <= h.start_time AND g.time > h.start_time - interval '10 seconds'
    ORDER BY g.time DESC LIMIT 1
) s ON true
WHERE {{shard}}
GROUP BY c.id, c.carrier, c.cell_id, c.direction
ORDER BY c.id
"""


def _shard_params(shard: Shard) -> dict[str, int]:
    return {"shard_n": shard.count, "shard_i": shard.index}


@dataclass
class Loaded:
    """A shard's training data."""

    cells: list[CellData]  # every cell with at least one positioned handover
    untracked: int  # handovers of the shard's cells without a position on the cell's route


def load_cells(conn: psycopg.Connection, shard: Shard) -> Loaded:
    """The shard's cells, in one query."""
    return _load(conn, CELLS_SQL.format(shard=SHARD_EXPR), _shard_params(shard))


def load_cell_ids(conn: psycopg.Connection, ids: list[int]) -> Loaded:
    """The cells with LinkDB IDs ``ids`` (the follower's few), read as
    :func:`load_cells` reads a shard's."""
    return _load(conn, CELLS_SQL.format(shard="c.id = ANY(%(ids)s::bigint[])"), {"ids": ids})


def _load(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> Loaded:
    out = Loaded([], 0)
    with conn.cursor(name="polycorn_trainer_cells") as cur:
        cur.itersize = 2000
        cur.execute(sql, params)
        for row in cur:
            key, carrier, cell_id, direction, untracked, track, rsrp, failed, trip, train, speed = (
                row
            )
            out.untracked += int(untracked)
            if track is None:  # no positioned handover
                continue
            out.cells.append(
                CellData(
                    key=int(key),
                    carrier=str(carrier),
                    cell_id=int(cell_id),
                    direction=str(direction),
                    track_m=np.asarray(track, dtype=np.float64),
                    rsrp_dbm=np.asarray(rsrp, dtype=np.float64),
                    failed=np.asarray(failed, dtype=np.bool_),
                    trip=np.asarray(trip, dtype=np.int64),
                    train=np.asarray(train, dtype=np.int64),
                    speed_mps=np.asarray(speed, dtype=np.float64),
                )
            )
    return out


# The prior rule's evidence (fit.priors_of) over the whole fleet, whatever
# the shard: each cell's failures and handovers per trip, counting what
# CELLS_SQL gives a cell (positioned handovers on the cell's route; a
# handover without a trip a trip of its own).
PRIOR_COUNTS_SQL = f"""COPY (
SELECT h.cell, coalesce(h.trip_id, -h.id), count(*), count(*) FILTER (WHERE h.outcome = 'failure')
FROM cells c
{CELL_ROUTE}
JOIN handovers h ON h.cell = c.id
WHERE {ON_ROUTE}
GROUP BY 1, 2
) TO STDOUT (FORMAT BINARY)"""
_PRIOR_FIELDS: Fields = (("cell", ">i8"), ("trip", ">i8"), ("n", ">i8"), ("f", ">i8"))


def fleet_priors(conn: psycopg.Connection) -> Priors:
    """The ``prior`` rule's priors (:func:`polycorn_trainer.fit.priors_of`)
    with the whole fleet as the training set: every shard of a run gets the
    same ones, read in the run's snapshot. One row per cell and trip, kept
    as four numbers (24 bytes)."""
    cols: dict[str, list[npt.NDArray[Any]]] = {"cell": [], "trip": [], "n": [], "f": []}
    with conn.cursor().copy(PRIOR_COUNTS_SQL) as cp:
        for rows in stream_binary_copy(cp, _PRIOR_FIELDS):
            for name, kind in (
                ("cell", np.int64),
                ("trip", np.int64),
                ("n", np.int32),
                ("f", np.int32),
            ):
                cols[name].append(rows[name].astype(kind))
    cell, trip, n, f = (
        np.concatenate(cols[k]) if cols[k] else np.zeros(0) for k in ("cell", "trip", "n", "f")
    )
    return priors_from_counts(cell, trip, f, n)


# ------------------------------------------------------------------ the fast path

SHARD_CELLS_SQL = f"""
SELECT c.id, c.carrier, c.cell_id, c.direction = 'increasing', c.handovers
FROM cells c WHERE {SHARD_EXPR} ORDER BY c.id
"""

# The routes positioned handovers are on, in the column's order: a route's
# rank in this list is how a pass names it (one scan, not one per pass).
ROUTES_SQL = """
SELECT DISTINCT route_id FROM handovers
WHERE route_id IS NOT NULL AND track_m IS NOT NULL AND cell IS NOT NULL
ORDER BY route_id
"""
# A handover's route when it has none: after every route, as NULLS LAST.
NO_ROUTE = 2**63 - 1

# One pass: the handovers of the cells %(ids)s, one row each, every field
# fixed-width and never NULL (ROW), in the order of the table (the heap's, in
# time order as ingest writes it: the GPS lookups then walk each train's
# fixes forwards, not back and forth). The same choices as CELLS_SQL: the
# speed of the train's last fix within 10 s before the start (for positioned
# handovers), the train as a hash; the route as its rank in ROUTES_SQL's
# list (1-based; NO_ROUTE for none), from which on_route picks the route
# most of a cell's positioned handovers are on as CELL_ROUTE does; the start
# time and id, by which NumPy puts each cell's handovers in the reference's
# order.
READ_SQL = """COPY (
SELECT h.cell, h.track_m IS NOT NULL, coalesce(r.rank, 9223372036854775807),
       h.start_time, h.id, coalesce(h.track_m, 'NaN'::float8),
       coalesce(h.rsrp_dbm, 'NaN'::float8), h.outcome = 'failure', coalesce(h.trip_id, -h.id),
       hashtextextended(h.train_id, 0), coalesce(s.speed_mps, 'NaN'::float8)
FROM handovers h
LEFT JOIN unnest(%(routes)s::text[]) WITH ORDINALITY AS r(route_id, rank)
  ON r.route_id = h.route_id
LEFT JOIN LATERAL (
    SELECT g.speed_mps FROM gps_fixes g
    WHERE h.track_m IS NOT NULL AND g.train_id = h.train_id
      AND g.time <= h.start_time AND g.time > h.start_time - interval '10 seconds'
    ORDER BY g.time DESC LIMIT 1
) s ON true
WHERE h.cell = ANY(%(ids)s::bigint[])
) TO STDOUT (FORMAT BINARY)"""

# READ_SQL's rows in PostgreSQL's binary COPY format: the field count, then
# each field's length and its big-endian value.
_FIELDS = (
    ("cell", ">i8"),
    ("tracked", "?"),
    ("route", ">i8"),
    ("start", ">i8"),
    ("id", ">i8"),
    ("track_m", ">f8"),
    ("rsrp_dbm", ">f8"),
    ("failed", "?"),
    ("trip", ">i8"),
    ("train", ">i8"),
    ("speed_mps", ">f8"),
)
Fields = tuple[tuple[str, str], ...]


def row_dtype(fields: Fields) -> np.dtype[np.void]:
    """A binary COPY row of ``fields`` (none NULL) as a NumPy record."""
    return np.dtype(
        [("fields", ">i2")] + [f for name, t in fields for f in ((f"len_{name}", ">i4"), (name, t))]
    )


ROW = row_dtype(_FIELDS)
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_TRAILER = b"\xff\xff"


def _header_size(data: bytes | bytearray) -> int:
    if not data.startswith(_SIGNATURE) or len(data) < 19:
        raise ValueError("not a binary COPY stream")
    return 19 + int.from_bytes(data[15:19], "big")


def _checked(rows: npt.NDArray[np.void], fields: Fields) -> npt.NDArray[np.void]:
    if len(rows) and not (rows["fields"] == len(fields)).all():
        raise ValueError(f"binary COPY: rows without {len(fields)} fields")
    for name, t in fields:
        if len(rows) and not (rows[f"len_{name}"] == np.dtype(t).itemsize).all():
            raise ValueError(f"binary COPY: {name} NULL or not {t}")
    return rows


def parse_binary_copy(data: bytes | bytearray, fields: Fields = _FIELDS) -> npt.NDArray[np.void]:
    """The rows of a ``COPY (...) TO STDOUT (FORMAT BINARY)`` stream of
    ``fields`` (READ_SQL's by default) as a structured array (a view of
    ``data``). Raises ``ValueError`` unless every row has the fields at
    their widths (a NULL would have length -1)."""
    row = row_dtype(fields)
    start = _header_size(data)
    if not data.endswith(_TRAILER):
        raise ValueError("not a binary COPY stream")
    size, rest = divmod(len(data) - start - len(_TRAILER), row.itemsize)
    if rest:
        raise ValueError(f"binary COPY: {rest} bytes past the last whole row")
    return _checked(np.frombuffer(data, dtype=row, count=size, offset=start), fields)


def stream_binary_copy(
    blocks: Iterable[bytes | bytearray | memoryview], fields: Fields
) -> Iterator[npt.NDArray[np.void]]:
    """:func:`parse_binary_copy` of a stream that arrives in ``blocks``:
    the whole rows of each block as they come (copies), so that memory holds
    a block, not the stream. Raises ``ValueError`` as it does, and at the
    end unless the stream ended with its trailer after a whole row."""
    row = row_dtype(fields)
    buf = bytearray()
    started = False
    for block in blocks:
        buf += block
        if not started:
            if len(buf) < 19:
                continue
            del buf[: _header_size(buf)]
            started = True
        whole = (len(buf) // row.itemsize) * row.itemsize
        if whole:
            rows = np.frombuffer(bytes(buf[:whole]), dtype=row)
            del buf[:whole]
            yield _checked(rows, fields)
    if not started or bytes(buf) != _TRAILER:
        raise ValueError("binary COPY: the stream ends without its trailer after a whole row")


@dataclass(frozen=True)
class ShardCells:
    """The cells of a shard, ascending ``cells.id``, and ingest's count of
    their handovers (to size the passes only)."""

    key: npt.NDArray[np.int64]
    carrier: npt.NDArray[np.int32]
    carriers: tuple[str, ...]
    cell_id: npt.NDArray[np.int64]
    increasing: npt.NDArray[np.bool_]
    size: npt.NDArray[np.int64]

    def passes(self, handovers: int, cells: int) -> list[tuple[int, int]]:
        """Consecutive ranges of cells with about ``handovers`` handovers
        each (by ingest's counts), at most ``cells`` cells."""
        out: list[tuple[int, int]] = []
        ends = np.cumsum(np.maximum(self.size, 1))
        lo, n = 0, len(self.key)
        while lo < n:
            before = int(ends[lo - 1]) if lo else 0
            hi = int(np.searchsorted(ends, before + handovers, side="right"))
            hi = min(max(hi, lo + 1), lo + cells, n)
            out.append((lo, hi))
            lo = hi
        return out


def shard_cells(conn: psycopg.Connection, shard: Shard) -> ShardCells:
    rows = conn.execute(SHARD_CELLS_SQL, _shard_params(shard)).fetchall()
    carriers = tuple(sorted({str(r[1]) for r in rows}))
    index = {k: i for i, k in enumerate(carriers)}
    n = len(rows)
    return ShardCells(
        key=np.fromiter((r[0] for r in rows), np.int64, n),
        carrier=np.fromiter((index[str(r[1])] for r in rows), np.int32, n),
        carriers=carriers,
        cell_id=np.fromiter((r[2] for r in rows), np.int64, n),
        increasing=np.fromiter((bool(r[3]) for r in rows), np.bool_, n),
        size=np.fromiter((r[4] for r in rows), np.int64, n),
    )


def dominant_routes(
    cell: npt.NDArray[np.int64], tracked: B, route: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each cell's route (rank) as CELL_ROUTE picks it: the one most of its
    positioned handovers are on, ties to the lowest rank (NO_ROUTE, none,
    last). The cells with a positioned handover, ascending, and theirs."""
    c, r = cell[tracked], route[tracked]
    order = np.lexsort((r, c))
    c, r = c[order], r[order]
    first = np.flatnonzero(np.concatenate([[True], (c[1:] != c[:-1]) | (r[1:] != r[:-1])]))
    pair_cell, pair_route = c[first], r[first]
    count = np.diff(np.append(first, len(c)))
    # Per cell, the pair with the most handovers, then the lowest rank.
    best = np.lexsort((pair_route, -count, pair_cell))
    top = best[np.concatenate([[True], pair_cell[best][1:] != pair_cell[best][:-1]])]
    return pair_cell[top], pair_route[top]


@dataclass
class Pass:
    """A pass's cells with at least one positioned handover (``batch``), the
    handovers that are not positioned on their cell's route (``untracked``,
    as :func:`load_cells` counts them) and the cells whose route is a named
    one (``routed``: the others' models get no route)."""

    batch: Columns
    untracked: int
    routed: npt.NDArray[np.int64]


def read_pass(
    conn: psycopg.Connection, cells: ShardCells, lo: int, hi: int, routes: list[str]
) -> Pass:
    """Cells ``lo`` to ``hi`` of ``cells`` (``routes``: ROUTES_SQL's list)."""
    buf = bytearray()
    with conn.cursor().copy(READ_SQL, {"ids": cells.key[lo:hi].tolist(), "routes": routes}) as cp:
        for data in cp:
            buf += data
    rows = parse_binary_copy(buf)
    cell = rows["cell"].astype(np.int64)
    route = rows["route"].astype(np.int64)
    tracked = rows["tracked"]
    with_route, route_of = dominant_routes(cell, tracked, route)
    on = tracked.copy()  # positioned, and on the cell's route:
    if len(with_route):
        at = np.minimum(np.searchsorted(with_route, cell), len(with_route) - 1)
        on &= (with_route[at] == cell) & (route_of[at] == route)
    untracked = len(rows) - int(np.count_nonzero(on))
    if untracked:
        rows, cell = rows[on], cell[on]
    # Each cell's handovers by start time, then id: the reference's order.
    order = np.lexsort((rows["id"], rows["start"], cell))
    cell = cell[order]
    keys, counts = np.unique(cell, return_counts=True)
    at = lo + np.searchsorted(cells.key[lo:hi], keys)
    del cell
    batch = Columns(
        key=keys,
        carrier=cells.carrier[at],
        carriers=cells.carriers,
        cell_id=cells.cell_id[at],
        increasing=cells.increasing[at],
        bounds=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        track_m=rows["track_m"][order].astype(np.float64),
        rsrp_dbm=rows["rsrp_dbm"][order].astype(np.float64),
        failed=rows["failed"][order].astype(np.bool_),
        trip=rows["trip"][order].astype(np.int64),
        train=rows["train"][order].astype(np.int64),
        speed_mps=rows["speed_mps"][order].astype(np.float64),
    )
    return Pass(batch, untracked, with_route[route_of != NO_ROUTE])


@dataclass
class Reader:
    """A shard's handovers in passes (:func:`read_pass`), in one read-only
    snapshot; counts what it read and the time it took."""

    conn: psycopg.Connection
    shard: Shard
    # A pass reads its handovers from all over the table (a cell's span the
    # fleet's history): the larger the pass, the fewer times the table is
    # read; the smaller, the less memory and the sooner fitting starts.
    pass_handovers: int = 500_000
    pass_cells: int = 10_000
    seconds: float = 0.0
    cells: int = 0  # read: with at least one positioned handover
    handovers: int = 0  # positioned
    untracked: int = 0
    routed: list[int] = field(default_factory=list)  # cells whose route is a named one

    def __post_init__(self) -> None:
        t0 = time.monotonic()
        # Every pass sees the same snapshot, as the one query of the
        # reference does; the plans are cheap (JIT compilation costs more).
        self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self.conn.execute("SET LOCAL jit = off")
        self.shard_cells = shard_cells(self.conn, self.shard)
        self.routes = [str(r) for (r,) in self.conn.execute(ROUTES_SQL)]
        self.seconds += time.monotonic() - t0

    def __iter__(self) -> Iterator[Columns]:
        for lo, hi in self.shard_cells.passes(self.pass_handovers, self.pass_cells):
            t0 = time.monotonic()
            p = read_pass(self.conn, self.shard_cells, lo, hi, self.routes)
            self.seconds += time.monotonic() - t0
            self.cells += len(p.batch)
            self.handovers += p.batch.handovers
            self.untracked += p.untracked
            self.routed.extend(p.routed.tolist())
            if len(p.batch):
                yield p.batch
