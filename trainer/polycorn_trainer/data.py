"""Reading the training data from LinkDB: the handovers of every cell of a
shard, one row per cell with its handovers as arrays (the database does the
grouping, so memory stays at a few arrays per cell).

Sharding: a cell belongs to shard ``hash(carrier:cell_id:direction) mod N``
with PostgreSQL's ``hashtextextended`` (seed 0), which does not depend on
row order or surrogate ids, so N workers (a Kubernetes indexed Job) split a
fleet with no coordination and every cell lands in exactly one shard.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
import psycopg

from polycorn_trainer.fit import CellData

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
    out = Loaded([], 0)
    sql = CELLS_SQL.format(shard=SHARD_EXPR)
    with conn.cursor(name="polycorn_trainer_cells") as cur:
        cur.itersize = 2000
        cur.execute(sql, _shard_params(shard))
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
