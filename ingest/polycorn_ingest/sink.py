"""The idempotent LinkDB sink: one batch of rows in, one database transaction.

Call order inside :meth:`LinkDbSink.write` (all in one transaction):

1. month partitions for the batch's times (their own short transaction
   first, cached per process; ``polycorn_schema.linkdb.partitions``);
2. per-train advisory locks (sorted), so that two consumers never derive the
   same train at once (it happens briefly during a group rebalance);
3. binary COPY of the rows into temporary staging tables, then ``INSERT …
   SELECT … ORDER BY <key>, ctid ON CONFLICT DO NOTHING`` into LinkDB on the
   natural keys (a fix is (train, time), a sample or path stat (train, path,
   time), a handover (train, carrier, start time)): replays and duplicates
   insert nothing, and the first copy of a key in a batch wins;
4. trains upserted (first/last seen only ever widen);
5. trips (:mod:`polycorn_ingest.trips`) merged with the *newly inserted*
   fixes only, so a replay changes nothing;
6. new handovers derived (trip, direction, existing cell; rule below) and
   inserted once; existing handovers near the new fixes get their trip and
   direction re-derived and, if changed, updated once; a change of
   direction moves a handover from one cell to another;
7. cells ⟨carrier, cell ID, direction⟩ updated from those transitions,
   under per-cell advisory locks: counts added incrementally, or recomputed
   from the handovers when a cell lost one; the earliest handover position
   along the direction is the smallest ``track_m`` (increasing) or the
   largest (decreasing), with its point;
8. commit. Only then does the caller commit Kafka offsets.

Direction of a handover at time t (deterministic in the fixes, whatever
order they arrive in; re-derived when a fix arrives inside its bracket):

- b = the last fix with ``track_m`` in [t − 120 s, t], a = the first fix with
  ``track_m`` in (t, t + 120 s]. increasing if a − b ≥ 1 m, decreasing if
  ≤ −1 m.
- Else (no track reference, or stopped): the bearing from the last fix at
  or before t to the first fix after t (both within 120 s, ≥ 5 m apart):
  increasing when it points east of north-south, i.e. in [0°, 180°);
  else the nearer fix's ``heading_deg`` the same way if it moves ≥ 1 m/s.
  (Without a linear reference, "increasing" is "eastbound"; a line that runs
  due north-south should carry ``track_m``.)
- Else unknown: the handover keeps no direction and no cell until a fix
  arrives that decides it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import errors as pgerr

from polycorn_ingest import mapmatch
from polycorn_ingest.records import MAX_TIME_MS, MIN_TIME_MS, Rows
from polycorn_ingest.sqltime import ms, ts
from polycorn_ingest.trips import Trip, merge
from polycorn_schema.linkdb.cli import sqlalchemy_url, upgrade
from polycorn_schema.linkdb.partitions import ensure_month_partitions, month_start, next_month

log = logging.getLogger(__name__)

# How far a fix may be from a handover to decide its direction.
DIRECTION_WINDOW_MS = 120_000

# Text columns are COLLATE "C" like LinkDB's key columns (migration 0004), so
# that sorting a batch by its natural key is bytewise and matches the indexes.
_C = 'text COLLATE "C"'
STAGING = {
    "stg_fix": f"train_id {_C}, t_ms bigint, lat float8, lon float8, speed float8, "
    f"heading float8, accuracy float8, track_m float8, route_id {_C}, track text, "
    "match_dist float8, off_route bool",
    "stg_sample": f"train_id {_C}, path bigint, t_ms bigint, carrier {_C}, cell_id bigint, "
    "rsrp float8, registration text, measured_ms bigint, rsrq float8, sinr float8, rat text",
    "stg_path": f"train_id {_C}, path bigint, t_ms bigint, carrier {_C}, up bool, srtt bigint, "
    "rate bigint, sent bigint, acked bigint, reinj bigint, redund bigint, rto bigint",
    "stg_ho": f"train_id {_C}, carrier {_C}, path bigint, src bigint, tgt bigint, start_ms bigint, "
    "lat float8, lon float8, track_m float8, rsrp float8, outcome text, duration bigint, "
    f"route_id {_C}",
    "tmp_ho_change": f"id bigint, carrier {_C}, src bigint, old_dir track_direction, "
    "new_dir track_direction, trip bigint",
}


# The plain series are inserted sorted by their natural key (consecutive rows
# then land on the same B-tree leaf pages); ctid (the COPY order) breaks ties,
# so that the first copy of a key in a batch is the one that wins.


# Each staging table's column types, for binary COPY (psycopg's C dumpers
# write the decoded tuples directly; no text formatting or parsing). Integer
# staging columns are all bigint: psycopg's binary int2/int4 dumpers silently
# wrap out-of-range values, while int8's raises OverflowError, and the
# INSERT's assignment cast to smallint/integer refuses (DataError) what does
# not fit, as text COPY did.
STAGING_TYPES = {
    name: [col.split()[1] for col in cols.split(", ")] for name, cols in STAGING.items()
}


INSERT_FIXES = f"""
WITH ins AS (
  INSERT INTO gps_fixes (train_id, time, geog, speed_mps, heading_deg, accuracy_m, track_m,
                         route_id, track, match_dist_m, off_route)
  SELECT train_id, {ts("t_ms")}, ST_SetSRID(ST_MakePoint(lon, lat), 4326)::geography,
         speed, heading, accuracy, track_m, route_id, track, match_dist, off_route
  FROM stg_fix ORDER BY train_id, t_ms, ctid ON CONFLICT DO NOTHING
  RETURNING train_id, time, track_m IS NOT NULL AS has_track)
SELECT train_id, {ms("time")}, has_track FROM ins"""

INSERT_SAMPLES = f"""
INSERT INTO signal_samples (train_id, path, time, carrier, cell_id, rsrp_dbm, registration,
                            measured_at, rsrq_db, sinr_db, rat)
SELECT train_id, path, {ts("t_ms")}, carrier, cell_id, rsrp, registration, {ts("measured_ms")},
       rsrq, sinr, rat
FROM stg_sample ORDER BY train_id, path, t_ms, ctid ON CONFLICT DO NOTHING"""

INSERT_PATHS = f"""
INSERT INTO path_stats (train_id, path, time, carrier, up, srtt_us, rate_bps, bytes_sent,
                        bytes_acked, reinjected_bytes, redundant_bytes, rto_count)
SELECT train_id, path, {ts("t_ms")}, carrier, up, srtt, rate, sent, acked, reinj, redund, rto
FROM stg_path ORDER BY train_id, path, t_ms, ctid ON CONFLICT DO NOTHING"""

UPSERT_TRAINS = f"""
INSERT INTO trains AS t (id, source, first_seen, last_seen)
SELECT id, %(source)s::row_source, {ts("lo")}, {ts("hi")}
FROM unnest(%(ids)s::text[], %(lo)s::bigint[], %(hi)s::bigint[]) AS s(id, lo, hi)
ON CONFLICT (id) DO UPDATE
SET first_seen = LEAST(t.first_seen, EXCLUDED.first_seen),
    last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen)
WHERE t.first_seen > EXCLUDED.first_seen OR t.last_seen < EXCLUDED.last_seen"""

# The trips that overlap [lo - gap, hi + gap]: the last one starting at or
# before lo - gap (if it reaches that far) and every one starting after it.
EXISTING_TRIPS = f"""
SELECT a.train_id, t.id, {ms("t.started_at")}, {ms("t.ended_at")}, t.fixes
FROM unnest(%(ids)s::text[], %(lo)s::bigint[], %(hi)s::bigint[]) AS a(train_id, lo, hi)
CROSS JOIN LATERAL (
  (SELECT id, started_at, ended_at, fixes FROM trips
   WHERE train_id = a.train_id AND started_at <= {ts("a.lo - %(gap)s")}
   ORDER BY started_at DESC LIMIT 1)
  UNION ALL
  (SELECT id, started_at, ended_at, fixes FROM trips
   WHERE train_id = a.train_id AND started_at > {ts("a.lo - %(gap)s")}
     AND started_at <= {ts("a.hi + %(gap)s")})
) AS t
WHERE t.ended_at >= {ts("a.lo - %(gap)s")}"""

UPDATE_TRIPS = f"""
UPDATE trips AS t SET started_at = {ts("u.s")}, ended_at = {ts("u.e")}, fixes = u.n
FROM unnest(%(id)s::bigint[], %(s)s::bigint[], %(e)s::bigint[], %(n)s::int[]) AS u(id, s, e, n)
WHERE t.id = u.id
RETURNING t.id"""

INSERT_TRIPS = f"""
INSERT INTO trips AS t (train_id, started_at, ended_at, fixes)
SELECT train_id, {ts("s")}, {ts("e")}, n
FROM unnest(%(train)s::text[], %(s)s::bigint[], %(e)s::bigint[], %(n)s::int[])
  AS u(train_id, s, e, n)
ON CONFLICT (train_id, started_at) DO UPDATE
SET ended_at = GREATEST(t.ended_at, EXCLUDED.ended_at), fixes = EXCLUDED.fixes
RETURNING t.id"""

# A trip's direction: the sign of its net movement along the track (first to
# last fix with track_m), when that is at least 5 m.
TRIP_DIRECTION = """
UPDATE trips AS t SET direction = d.dir
FROM (
  SELECT t.id, CASE WHEN l.track_m - f.track_m >= 5 THEN 'increasing'
                    WHEN l.track_m - f.track_m <= -5 THEN 'decreasing' END::track_direction AS dir
  FROM trips t
  LEFT JOIN LATERAL (SELECT track_m FROM gps_fixes g WHERE g.train_id = t.train_id
    AND g.time BETWEEN t.started_at AND t.ended_at AND g.track_m IS NOT NULL
    ORDER BY g.time LIMIT 1) f ON true
  LEFT JOIN LATERAL (SELECT track_m FROM gps_fixes g WHERE g.train_id = t.train_id
    AND g.time BETWEEN t.started_at AND t.ended_at AND g.track_m IS NOT NULL
    ORDER BY g.time DESC LIMIT 1) l ON true
  WHERE t.id = ANY(%(ids)s::bigint[])
) AS d
WHERE t.id = d.id AND t.direction IS DISTINCT FROM d.dir"""

# Handovers in the given regions (besides the new ones, which the caller adds).
CANDIDATES = f"""
SELECT coalesce(array_agg(DISTINCT h.id), '{{}}')
FROM unnest(%(rt)s::text[], %(rlo)s::bigint[], %(rhi)s::bigint[]) AS r(train_id, lo, hi)
JOIN handovers h ON h.train_id = r.train_id
 AND h.start_time BETWEEN {ts("r.lo")} AND {ts("r.hi")}"""

# Regions of handovers whose direction bracket a train's new fixes may have
# changed: from the old fix before the new ones to the old fix after them
# (within the direction window), for any fix and for fixes with track_m.
DIRECTION_REGIONS = f"""
SELECT a.train_id,
  LEAST(
    coalesce((SELECT {ms("max(f.time)")} FROM gps_fixes f WHERE f.train_id = a.train_id
              AND f.time < {ts("a.lo")} AND f.time >= {ts("a.lo - %(w)s")}), a.lo - %(w)s),
    CASE WHEN a.tlo IS NOT NULL THEN coalesce(
      (SELECT {ms("max(f.time)")} FROM gps_fixes f WHERE f.train_id = a.train_id
       AND f.track_m IS NOT NULL AND f.time < {ts("a.tlo")} AND f.time >= {ts("a.tlo - %(w)s")}),
      a.tlo - %(w)s) END),
  GREATEST(
    coalesce((SELECT {ms("min(f.time)")} FROM gps_fixes f WHERE f.train_id = a.train_id
              AND f.time > {ts("a.hi")} AND f.time <= {ts("a.hi + %(w)s")}), a.hi + %(w)s),
    CASE WHEN a.thi IS NOT NULL THEN coalesce(
      (SELECT {ms("min(f.time)")} FROM gps_fixes f WHERE f.train_id = a.train_id
       AND f.track_m IS NOT NULL AND f.time > {ts("a.thi")} AND f.time <= {ts("a.thi + %(w)s")}),
      a.thi + %(w)s) END)
FROM unnest(%(ids)s::text[], %(lo)s::bigint[], %(hi)s::bigint[], %(tlo)s::bigint[],
            %(thi)s::bigint[]) AS a(train_id, lo, hi, tlo, thi)"""

W = "%(w)s * interval '1 millisecond'"
# A handover h's direction (module doc) and trip (the contained trip, else
# the nearest within one gap, earlier on a tie), as select-list expressions
# over ``FROM <h> {DERIVE_JOINS}``. h needs train_id and start_time.
DERIVE_COLS = """
    CASE
      WHEN a.track_m - b.track_m >= 1 THEN 'increasing'
      WHEN a.track_m - b.track_m <= -1 THEN 'decreasing'
      WHEN ST_Distance(bg.geog, ag.geog) >= 5 THEN
        CASE WHEN degrees(ST_Azimuth(bg.geog, ag.geog)) < 180 THEN 'increasing'
             ELSE 'decreasing' END
      WHEN nf.speed_mps >= 1 AND nf.heading_deg IS NOT NULL THEN
        CASE WHEN mod(mod(nf.heading_deg::numeric, 360) + 360, 360) < 180 THEN 'increasing'
             ELSE 'decreasing' END
    END::track_direction AS dir,
    (SELECT n.id FROM (
      (SELECT id, started_at, ended_at FROM trips
       WHERE train_id = h.train_id AND started_at <= h.start_time
       ORDER BY started_at DESC LIMIT 1)
      UNION ALL
      (SELECT id, started_at, ended_at FROM trips
       WHERE train_id = h.train_id AND started_at > h.start_time
       ORDER BY started_at LIMIT 1)) AS n
     WHERE n.started_at - %(gap)s * interval '1 millisecond' <= h.start_time
       AND h.start_time <= n.ended_at + %(gap)s * interval '1 millisecond'
     ORDER BY GREATEST(n.started_at - h.start_time, h.start_time - n.ended_at), n.started_at
     LIMIT 1) AS trip"""
DERIVE_JOINS = f"""
  LEFT JOIN LATERAL (SELECT track_m FROM gps_fixes f WHERE f.train_id = h.train_id
    AND f.time <= h.start_time AND f.time >= h.start_time - {W} AND f.track_m IS NOT NULL
    ORDER BY f.time DESC LIMIT 1) b ON true
  LEFT JOIN LATERAL (SELECT track_m FROM gps_fixes f WHERE f.train_id = h.train_id
    AND f.time > h.start_time AND f.time <= h.start_time + {W} AND f.track_m IS NOT NULL
    ORDER BY f.time LIMIT 1) a ON true
  LEFT JOIN LATERAL (SELECT time, geog, speed_mps, heading_deg FROM gps_fixes f
    WHERE f.train_id = h.train_id AND f.time <= h.start_time AND f.time >= h.start_time - {W}
    ORDER BY f.time DESC LIMIT 1) bg ON true
  LEFT JOIN LATERAL (SELECT time, geog, speed_mps, heading_deg FROM gps_fixes f
    WHERE f.train_id = h.train_id AND f.time > h.start_time AND f.time <= h.start_time + {W}
    ORDER BY f.time LIMIT 1) ag ON true
  LEFT JOIN LATERAL (SELECT * FROM (VALUES (bg.time, bg.speed_mps, bg.heading_deg),
                                           (ag.time, ag.speed_mps, ag.heading_deg))
    AS v(time, speed_mps, heading_deg) WHERE v.time IS NOT NULL
    ORDER BY abs(extract(epoch from v.time - h.start_time)), v.time LIMIT 1) nf ON true"""

# New handovers go in once, already derived (after the batch's fixes and
# trips): the batch's staged handovers that are not in LinkDB yet (the
# first copy of a key in the batch), with their trip, direction and existing
# cell. The per-train advisory lock makes the NOT EXISTS exact; ON CONFLICT
# DO NOTHING still guards the key. Those with a trip or direction go to
# tmp_ho_change (old_dir NULL) for the cell update; returns (id, trip,
# direction, cell) per inserted handover.
INSERT_HANDOVERS = f"""
WITH nw AS (
  SELECT DISTINCT ON (s.train_id, s.carrier, s.start_ms) s.*, {ts("s.start_ms")} AS start_time
  FROM stg_ho s
  WHERE NOT EXISTS (SELECT 1 FROM handovers x WHERE x.train_id = s.train_id
                    AND x.carrier = s.carrier AND x.start_time = {ts("s.start_ms")})
  ORDER BY s.train_id, s.carrier, s.start_ms, s.ctid),
d AS (SELECT h.*, {DERIVE_COLS} FROM nw h {DERIVE_JOINS}),
ins AS (
  INSERT INTO handovers (train_id, trip_id, cell, source, carrier, path, source_cell_id,
                         target_cell_id, start_time, geog, track_m, route_id, direction,
                         rsrp_dbm, outcome, duration_ms)
  SELECT d.train_id, d.trip, c.id, %(source)s::row_source, d.carrier, d.path, d.src, d.tgt,
         d.start_time, ST_SetSRID(ST_MakePoint(d.lon, d.lat), 4326)::geography, d.track_m,
         d.route_id,
         d.dir, d.rsrp, d.outcome::handover_outcome, d.duration
  FROM d LEFT JOIN cells c ON c.carrier = d.carrier AND c.cell_id = d.src
                          AND c.direction = d.dir
  ORDER BY d.train_id, d.carrier, d.start_time
  ON CONFLICT (train_id, carrier, start_time) DO NOTHING
  RETURNING id, carrier, source_cell_id, direction, trip_id, cell),
ch AS (
  INSERT INTO tmp_ho_change
  SELECT id, carrier, source_cell_id, NULL, direction, trip_id FROM ins
  WHERE direction IS NOT NULL OR trip_id IS NOT NULL)
SELECT id, trip_id, direction::text, cell FROM ins"""

# One pass over existing candidate handovers, re-deriving trip and direction.
# Rows whose trip or direction changes go to tmp_ho_change; the caller then
# updates cells and writes each changed handover once.
DERIVE = f"""
WITH c AS (
  SELECT h.id, h.carrier, h.source_cell_id, h.direction AS old_dir, h.trip_id AS old_trip,
    {DERIVE_COLS}
  FROM handovers h {DERIVE_JOINS}
  WHERE h.id = ANY(%(ids)s::bigint[])
)
INSERT INTO tmp_ho_change
SELECT id, carrier, source_cell_id, old_dir, dir, trip FROM c
WHERE dir IS DISTINCT FROM old_dir OR trip IS DISTINCT FROM old_trip
RETURNING id, trip, new_dir::text, old_dir IS DISTINCT FROM new_dir"""

# Write each changed handover once: trip, direction and (existing) cell.
APPLY = """
UPDATE handovers AS h SET trip_id = u.trip, direction = u.dir::track_direction,
  cell = (SELECT c.id FROM cells c WHERE c.carrier = h.carrier
          AND c.cell_id = h.source_cell_id AND c.direction = u.dir::track_direction)
FROM unnest(%(id)s::bigint[], %(trip)s::bigint[], %(dir)s::text[]) AS u(id, trip, dir)
WHERE h.id = u.id"""

CHANGED_KEYS = """
SELECT DISTINCT carrier, src, d::text FROM tmp_ho_change,
  LATERAL (VALUES (old_dir), (new_dir)) AS v(d)
WHERE d IS NOT NULL AND old_dir IS DISTINCT FROM new_dir"""

# Cells that lost a handover: recompute from the handovers.
RECOMPUTE_CELLS = """
WITH k AS (SELECT DISTINCT carrier, src AS cell_id, old_dir AS dir FROM tmp_ho_change
           WHERE old_dir IS NOT NULL AND old_dir IS DISTINCT FROM new_dir),
z AS (
  UPDATE cells c SET handovers = 0, failures = 0, earliest_ho_track_m = NULL,
                     earliest_ho_geog = NULL
  FROM k WHERE c.carrier = k.carrier AND c.cell_id = k.cell_id AND c.direction = k.dir
   AND NOT EXISTS (SELECT 1 FROM handovers h WHERE h.carrier = k.carrier
                   AND h.source_cell_id = k.cell_id AND h.direction = k.dir)
  RETURNING c.id)
INSERT INTO cells AS c (carrier, cell_id, direction, handovers, failures, earliest_ho_track_m,
                        earliest_ho_geog, first_seen, last_seen)
SELECT k.carrier, k.cell_id, k.dir, g.n, g.f, e.track_m, e.geog, g.first, g.last
FROM k
CROSS JOIN LATERAL (SELECT count(*) AS n, count(*) FILTER (WHERE outcome = 'failure') AS f,
                           min(start_time) AS first, max(start_time) AS last
  FROM handovers h WHERE h.carrier = k.carrier AND h.source_cell_id = k.cell_id
   AND h.direction = k.dir) AS g
LEFT JOIN LATERAL (SELECT track_m, geog FROM handovers h WHERE h.carrier = k.carrier
   AND h.source_cell_id = k.cell_id AND h.direction = k.dir AND h.track_m IS NOT NULL
  ORDER BY CASE WHEN k.dir = 'increasing' THEN h.track_m ELSE -h.track_m END, h.start_time, h.id
  LIMIT 1) AS e ON true
WHERE g.n > 0
ON CONFLICT (carrier, cell_id, direction) DO UPDATE
SET handovers = EXCLUDED.handovers, failures = EXCLUDED.failures,
    earliest_ho_track_m = EXCLUDED.earliest_ho_track_m,
    earliest_ho_geog = EXCLUDED.earliest_ho_geog,
    first_seen = EXCLUDED.first_seen, last_seen = EXCLUDED.last_seen"""

# Cells that only gained handovers: add the counts, widen the times, and
# replace the earliest position when a new one is strictly earlier.
ADD_TO_CELLS = """
WITH full_keys AS (SELECT DISTINCT carrier, src, old_dir AS dir FROM tmp_ho_change
                   WHERE old_dir IS NOT NULL AND old_dir IS DISTINCT FROM new_dir),
added AS (
  SELECT h.carrier, h.source_cell_id AS cell_id, h.direction AS dir, h.outcome, h.start_time,
         h.track_m, h.geog, h.id
  FROM tmp_ho_change x JOIN handovers h ON h.id = x.id
  WHERE x.new_dir IS NOT NULL AND x.old_dir IS DISTINCT FROM x.new_dir
    AND NOT EXISTS (SELECT 1 FROM full_keys f
                    WHERE f.carrier = x.carrier AND f.src = x.src AND f.dir = x.new_dir)),
g AS (SELECT carrier, cell_id, dir, count(*) AS n, count(*) FILTER (WHERE outcome = 'failure') AS f,
             min(start_time) AS first, max(start_time) AS last
      FROM added GROUP BY carrier, cell_id, dir),
e AS (SELECT DISTINCT ON (carrier, cell_id, dir) carrier, cell_id, dir, track_m, geog
      FROM added WHERE track_m IS NOT NULL
      ORDER BY carrier, cell_id, dir,
               CASE WHEN dir = 'increasing' THEN track_m ELSE -track_m END, start_time, id)
INSERT INTO cells AS c (carrier, cell_id, direction, handovers, failures, earliest_ho_track_m,
                        earliest_ho_geog, first_seen, last_seen)
SELECT g.carrier, g.cell_id, g.dir, g.n, g.f, e.track_m, e.geog, g.first, g.last
FROM g LEFT JOIN e USING (carrier, cell_id, dir)
ON CONFLICT (carrier, cell_id, direction) DO UPDATE
SET handovers = c.handovers + EXCLUDED.handovers,
    failures = c.failures + EXCLUDED.failures,
    earliest_ho_track_m = CASE WHEN EXCLUDED.earliest_ho_track_m IS NOT NULL AND (
        c.earliest_ho_track_m IS NULL
        OR (c.direction = 'increasing' AND EXCLUDED.earliest_ho_track_m < c.earliest_ho_track_m)
        OR (c.direction = 'decreasing' AND EXCLUDED.earliest_ho_track_m > c.earliest_ho_track_m))
      THEN EXCLUDED.earliest_ho_track_m ELSE c.earliest_ho_track_m END,
    earliest_ho_geog = CASE WHEN EXCLUDED.earliest_ho_track_m IS NOT NULL AND (
        c.earliest_ho_track_m IS NULL
        OR (c.direction = 'increasing' AND EXCLUDED.earliest_ho_track_m < c.earliest_ho_track_m)
        OR (c.direction = 'decreasing' AND EXCLUDED.earliest_ho_track_m > c.earliest_ho_track_m))
      THEN EXCLUDED.earliest_ho_geog ELSE c.earliest_ho_geog END,
    first_seen = LEAST(c.first_seen, EXCLUDED.first_seen),
    last_seen = GREATEST(c.last_seen, EXCLUDED.last_seen)"""

# Handovers of cells created after APPLY ran (a cell's first handover).
LINK_CELLS = """
UPDATE handovers AS h SET cell = c.id FROM cells c
WHERE h.id = ANY(%(ids)s::bigint[]) AND h.cell IS NULL AND c.carrier = h.carrier
  AND c.cell_id = h.source_cell_id AND c.direction = h.direction"""


# Re-matching (polycorn-ingest rematch): a train's unmatched fixes in time
# order, and the writes of their matches and of their handovers' positions.
UNMATCHED_TRAINS = f"""
SELECT DISTINCT train_id FROM gps_fixes
WHERE track_m IS NULL AND off_route IS NULL
  AND (%(train)s::text IS NULL OR train_id = %(train)s)
  AND time >= {ts("%(lo)s")} AND time < {ts("%(hi)s")}
ORDER BY train_id"""

UNMATCHED_FIXES = f"""
SELECT train_id, {ms("time")}, ST_Y(geog::geometry), ST_X(geog::geometry), speed_mps,
       heading_deg, accuracy_m, track_m
FROM gps_fixes
WHERE train_id = %(train)s AND track_m IS NULL AND off_route IS NULL
  AND time >= {ts("%(lo)s")} AND time < {ts("%(hi)s")}
ORDER BY time LIMIT %(n)s"""

WRITE_MATCHES = f"""
UPDATE gps_fixes g SET track_m = m.track_m, route_id = m.route_id, track = m.track,
                       match_dist_m = m.dist, off_route = m.off
FROM unnest(%(t)s::bigint[], %(m)s::float8[], %(r)s::text[], %(k)s::text[], %(d)s::float8[],
            %(o)s::bool[]) AS m(t_ms, track_m, route_id, track, dist, off)
WHERE g.train_id = %(train)s AND g.time = {ts("m.t_ms")}"""

UNPLACED_HANDOVERS = f"""
SELECT id, {ms("start_time")}, ST_Y(geog::geometry), ST_X(geog::geometry)
FROM handovers
WHERE train_id = %(train)s AND track_m IS NULL
  AND start_time >= {ts("%(lo)s")} AND start_time <= {ts("%(hi)s")}"""

WRITE_HANDOVER_POSITIONS = """
UPDATE handovers h SET track_m = p.track_m, route_id = p.route_id
FROM unnest(%(id)s::bigint[], %(m)s::float8[], %(r)s::text[]) AS p(id, track_m, route_id)
WHERE h.id = p.id"""

# The earliest position of cells whose handovers gained a track_m.
EARLIEST_FOR_KEYS = """
UPDATE cells c SET earliest_ho_track_m = e.track_m, earliest_ho_geog = e.geog
FROM unnest(%(carrier)s::text[], %(cell)s::bigint[], %(dir)s::track_direction[])
     AS k(carrier, cell_id, dir)
CROSS JOIN LATERAL (SELECT track_m, geog FROM handovers h WHERE h.carrier = k.carrier
   AND h.source_cell_id = k.cell_id AND h.direction = k.dir AND h.track_m IS NOT NULL
  ORDER BY CASE WHEN k.dir = 'increasing' THEN h.track_m ELSE -h.track_m END, h.start_time, h.id
  LIMIT 1) AS e
WHERE c.carrier = k.carrier AND c.cell_id = k.cell_id AND c.direction = k.dir"""


@dataclass
class RematchResult:
    trains: int = 0
    fixes: int = 0
    off_route: int = 0
    handovers: int = 0
    rederived: int = 0


class TransientDbError(Exception):
    """The database is unreachable or the transaction hit a transient
    conflict; retrying the same batch later is safe (everything is idempotent)."""


class DataRejectedError(Exception):
    """The database refused the batch for a data reason (a row it cannot store)."""


def lock_key(namespace: str, key: str) -> int:
    """A stable signed 64-bit advisory-lock key."""
    h = hashlib.blake2b(f"{namespace}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big", signed=True)


@dataclass
class WriteResult:
    """Rows inserted (not counting duplicates) per table, and derivation counts."""

    inserted: dict[str, int] = field(default_factory=dict)
    trips_changed: int = 0
    handovers_rederived: int = 0
    cells_changed: int = 0


#: Month partitions are made only for months near the present. A record time far in the
#: past or the future (a train whose clock went wrong, or a hostile one: record times are
#: accepted from 1990 to 2200) is kept in the DEFAULT partition instead, so that no train
#: can make LinkDB create a partition for every month it names.
PARTITION_PAST = dt.timedelta(days=400)
PARTITION_FUTURE = dt.timedelta(days=62)


def _months(seen: dict[str, list[int]], now: dt.datetime) -> set[dt.datetime]:
    """The month partitions a batch's rows go into: the months of each table's earliest and
    latest row and a few between, those within the window around ``now`` only."""
    first, last = month_start(now - PARTITION_PAST), month_start(now + PARTITION_FUTURE)
    out: set[dt.datetime] = set()
    for lo, hi in seen.values():
        m = month_start(dt.datetime.fromtimestamp(lo / 1000, dt.UTC))
        end = month_start(dt.datetime.fromtimestamp(hi / 1000, dt.UTC))
        out.add(end)
        # Rows between far-apart ends go to the DEFAULT partition instead of
        # creating a partition for every month in between.
        for _ in range(4):
            if m >= end:
                break
            out.add(m)
            m = next_month(m)
    return {m for m in out if first <= m <= last}


class LinkDbSink:
    """Writes :class:`Rows` batches into LinkDB; one connection, reconnected on demand."""

    def __init__(self, url: str, *, trip_gap_s: float = 600.0, source: str = "telemetry") -> None:
        self.url = url
        self.gap_ms = int(trip_gap_s * 1000)
        self.source = source
        self._conn: psycopg.Connection[Any] | None = None
        self._engine: sa.Engine | None = None
        self._months: set[dt.datetime] = set()

    def migrate(self) -> None:
        upgrade(self.url)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.url, connect_timeout=5, application_name="polycorn-ingest")
            with conn.cursor() as cur:
                for name, cols in STAGING.items():
                    cur.execute(
                        f"CREATE TEMP TABLE IF NOT EXISTS {name} ({cols}) ON COMMIT DELETE ROWS"
                    )
            conn.commit()
            self._conn = conn
        return self._conn

    def _ensure_partitions(self, seen: dict[str, list[int]]) -> None:
        need = _months(seen, dt.datetime.now(dt.UTC)) - self._months
        if not need:
            return
        if self._engine is None:
            self._engine = sa.create_engine(
                sqlalchemy_url(self.url),
                poolclass=sa.NullPool,
                connect_args={"connect_timeout": 5},
            )
        with self._engine.begin() as conn:
            created = ensure_month_partitions(conn, need)
        if created:
            log.info("created partitions %s", ", ".join(created))
        self._months |= need

    def write(self, rows: Rows) -> WriteResult:
        """Store one batch in one transaction. Raises :class:`TransientDbError`
        (retry later) or :class:`DataRejectedError` (isolate the bad row)."""
        try:
            self._ensure_partitions(rows.seen)
            conn = self._connection()
            try:
                with conn.transaction():
                    return self._write(conn, rows)
            finally:
                # Nothing stays open between batches.
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
        except (pgerr.DataError, pgerr.IntegrityError) as e:
            if isinstance(e, pgerr.TransactionRollback):
                raise TransientDbError(str(e)) from e
            raise DataRejectedError(f"{type(e).__name__}: {e}".strip()) from e
        except (
            psycopg.OperationalError,
            psycopg.InterfaceError,
            pgerr.TransactionRollback,
            sa.exc.OperationalError,
            sa.exc.InterfaceError,
        ) as e:
            self.close()
            raise TransientDbError(f"{type(e).__name__}: {e}".strip()) from e

    def _write(self, conn: psycopg.Connection[Any], rows: Rows) -> WriteResult:
        res = WriteResult()
        src = {"source": self.source}
        with conn.cursor() as cur:
            trains = sorted(rows.seen)
            cur.execute(
                "SELECT count(pg_advisory_xact_lock(k)) FROM "
                "(SELECT k FROM unnest(%s::bigint[]) AS k ORDER BY k) AS s",
                (sorted(lock_key("train", t) for t in trains),),
            )
            cur.execute(
                UPSERT_TRAINS,
                {
                    **src,
                    "ids": trains,
                    "lo": [rows.seen[t][0] for t in trains],
                    "hi": [rows.seen[t][1] for t in trains],
                },
            )
            fixes, handovers = self._match(cur, rows)
            self._copy(cur, "stg_fix", fixes)
            self._copy(cur, "stg_sample", rows.samples)
            self._copy(cur, "stg_path", rows.paths)
            self._copy(cur, "stg_ho", handovers)
            new_fixes: list[tuple[str, int, bool]] = []
            if rows.fixes:
                cur.execute(INSERT_FIXES)
                new_fixes = cur.fetchall()
            res.inserted["gps_fixes"] = len(new_fixes)
            if rows.samples:
                cur.execute(INSERT_SAMPLES)
                res.inserted["signal_samples"] = cur.rowcount
            if rows.paths:
                cur.execute(INSERT_PATHS)
                res.inserted["path_stats"] = cur.rowcount
            if not new_fixes and not rows.handovers:
                return res  # a replay: nothing to derive
            trip_regions = self._trips(cur, new_fixes, res)
            dir_regions = self._direction_regions(cur, new_fixes)
            # Existing handovers whose trip or direction the new fixes may change.
            old_ids: list[int] = []
            regions = trip_regions + dir_regions
            if regions:
                cur.execute(CANDIDATES, _regions(regions))
                row = cur.fetchone()
                old_ids = sorted(row[0]) if row else []
            # New handovers: one insert each, derived (not insert + update).
            joined = False  # a handover joined or left a cell
            link: list[int] = []  # ... and may still point at no cell
            if rows.handovers:
                cur.execute(INSERT_HANDOVERS, {**src, "gap": self.gap_ms, "w": DIRECTION_WINDOW_MS})
                new_ho = cur.fetchall()
                res.inserted["handovers"] = len(new_ho)
                res.handovers_rederived = sum(1 for h in new_ho if h[1] is not None or h[2])
                joined = any(h[2] is not None for h in new_ho)
                link = [h[0] for h in new_ho if h[2] is not None and h[3] is None]
            else:
                res.inserted["handovers"] = 0
            if old_ids:
                n, moved = self._rederive(cur, old_ids)
                res.handovers_rederived += n
                joined = joined or bool(moved)
                link.extend(moved)
            if joined:
                res.cells_changed = self._cells(cur, link)
        return res

    def _rederive(self, cur: psycopg.Cursor[Any], ids: list[int]) -> tuple[int, list[int]]:
        """Re-derive the trip and direction of existing handovers ``ids`` and
        write each change once; returns how many changed and those whose
        direction (so cell) changed."""
        cur.execute(DERIVE, {"ids": ids, "gap": self.gap_ms, "w": DIRECTION_WINDOW_MS})
        changed = cur.fetchall()
        if changed:
            cur.execute(
                APPLY,
                {
                    "id": [c[0] for c in changed],
                    "trip": [c[1] for c in changed],
                    "dir": [c[2] for c in changed],
                },
            )
        return len(changed), [c[0] for c in changed if c[3]]

    def rematch(
        self,
        *,
        train: str | None = None,
        since_ms: int = MIN_TIME_MS,
        until_ms: int = MAX_TIME_MS + 1,
        chunk: int = 20_000,
    ) -> RematchResult:
        """Match fixes stored before their route was imported (``track_m``
        null and never matched), train by train in time order, ``chunk``
        fixes per transaction; then place those trains' handovers without
        ``track_m`` and re-derive their trips' and handovers' directions and
        their cells, as a batch of new fixes would. Idempotent: matched
        fixes are not matched again."""
        res = RematchResult()
        conn = self._connection()
        with conn.cursor() as cur:
            cur.execute(UNMATCHED_TRAINS, {"train": train, "lo": since_ms, "hi": until_ms})
            trains = [r[0] for r in cur.fetchall()]
        conn.commit()
        for t in trains:
            res.trains += 1
            while True:
                with conn.transaction(), conn.cursor() as cur:
                    n = self._rematch_chunk(
                        cur, train=t, lo=since_ms, hi=until_ms, chunk=chunk, res=res
                    )
                if n < chunk:
                    break
        return res

    def _rematch_chunk(
        self,
        cur: psycopg.Cursor[Any],
        *,
        train: str,
        lo: int,
        hi: int,
        chunk: int,
        res: RematchResult,
    ) -> int:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("train", train),))
        cur.execute(UNMATCHED_FIXES, {"train": train, "lo": lo, "hi": hi, "n": chunk})
        rows = cur.fetchall()
        if not rows:
            return 0
        fixes = [mapmatch.fix_from_row(r) for r in rows]
        prior = mapmatch.priors(cur, {train: fixes[0].t_ms}).get(train)
        matches = mapmatch.match_fixes(cur, fixes, prior)
        cur.execute(
            WRITE_MATCHES,
            {
                "train": train,
                "t": [f.t_ms for f in fixes],
                "m": [m.measure_m for m in matches],
                "r": [m.route_id for m in matches],
                "k": [m.track for m in matches],
                "d": [m.dist_m for m in matches],
                "o": [m.off_route for m in matches],
            },
        )
        res.fixes += len(fixes)
        res.off_route += sum(1 for m in matches if m.off_route)
        t_lo, t_hi = fixes[0].t_ms, fixes[-1].t_ms
        w = mapmatch.HANDOVER_WINDOW_MS
        cur.execute(UNPLACED_HANDOVERS, {"train": train, "lo": t_lo - w, "hi": t_hi + w})
        hos = cur.fetchall()
        if hos:
            on_route = [
                (f.t_ms, m.route_id, m.track)
                for f, m in zip(fixes, matches, strict=True)
                if m.route_id is not None
            ]
            placed = mapmatch.handover_positions(
                cur,
                [mapmatch.HandoverAt(train, int(h[1]), h[2], h[3]) for h in hos],
                {train: on_route},
            )
            cur.execute(
                WRITE_HANDOVER_POSITIONS,
                {
                    "id": [h[0] for h in hos],
                    "m": [p[1] for p in placed],
                    "r": [p[0] for p in placed],
                },
            )
            res.handovers += sum(1 for p in placed if p[1] is not None)
        # Directions: the trips and handovers these fixes bracket.
        cur.execute(
            "SELECT id FROM trips WHERE train_id = %s AND ended_at >= "
            f"{ts('%s')} AND started_at <= {ts('%s')}",
            (train, t_lo, t_hi),
        )
        trips = [r[0] for r in cur.fetchall()]
        if trips:
            cur.execute(TRIP_DIRECTION, {"ids": trips})
        region = [(train, t_lo - DIRECTION_WINDOW_MS, t_hi + DIRECTION_WINDOW_MS)]
        cur.execute(CANDIDATES, _regions(region))
        row = cur.fetchone()
        ids = sorted(row[0]) if row else []
        if ids:
            n, moved = self._rederive(cur, ids)
            res.rederived += n
            if moved:
                self._cells(cur, moved)
            cur.execute(
                "SELECT DISTINCT carrier, source_cell_id, direction FROM handovers "
                "WHERE id = ANY(%s) AND direction IS NOT NULL AND track_m IS NOT NULL",
                (ids,),
            )
            keys = cur.fetchall()
            if keys:
                cur.execute(
                    EARLIEST_FOR_KEYS,
                    {
                        "carrier": [k[0] for k in keys],
                        "cell": [k[1] for k in keys],
                        "dir": [k[2] for k in keys],
                    },
                )
        return len(rows)

    @staticmethod
    def _match(
        cur: psycopg.Cursor[Any], rows: Rows
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The batch's fixes and handovers with their map matching (module
        :mod:`polycorn_ingest.mapmatch`): fixes without ``track_m`` are
        matched when LinkDB has routes, handovers without ``track_m`` take
        the route of the train's nearest matched fix (within 10 s) and their
        own position's measure on it. Fixes that carry ``track_m`` (the
        testbed's replay, a train that knows its kilometre post) are kept
        as they are."""
        fixes: list[tuple[Any, ...]] = [(*f, None, None, None, None) for f in rows.fixes]
        handovers: list[tuple[Any, ...]] = [(*h, None) for h in rows.handovers]
        todo = [k for k, f in enumerate(rows.fixes) if f[7] is None]
        todo_ho = [k for k, h in enumerate(rows.handovers) if h[8] is None]
        if not todo and not todo_ho:
            return fixes, handovers
        cur.execute("SELECT EXISTS (SELECT 1 FROM routes)")
        row = cur.fetchone()
        if not row or not row[0]:
            return fixes, handovers
        by_train: dict[str, list[int]] = defaultdict(list)
        for k in todo:
            by_train[rows.fixes[k][0]].append(k)
        trains = sorted(by_train)
        for ks in by_train.values():
            ks.sort(key=lambda k: rows.fixes[k][1])
        priors = mapmatch.priors(cur, {t: rows.fixes[by_train[t][0]][1] for t in trains})
        matched: dict[str, list[tuple[int, str, str | None]]] = defaultdict(list)
        seqs = {t: [mapmatch.fix_from_row(rows.fixes[k]) for k in by_train[t]] for t in trains}
        # One candidate search for the whole batch, then each train's path.
        flat = mapmatch.candidates(cur, [f for t in trains for f in seqs[t]])
        start = 0
        for train in trains:
            ks, seq = by_train[train], seqs[train]
            cands = flat[start : start + len(seq)]
            start += len(seq)
            matches = mapmatch.match_fixes(cur, seq, priors.get(train), cands)
            for k, m in zip(ks, matches, strict=True):
                f = rows.fixes[k]
                fixes[k] = (*f[:7], m.measure_m, m.route_id, m.track, m.dist_m, m.off_route)
                if m.route_id is not None:
                    matched[train].append((f[1], m.route_id, m.track))
        if todo_ho:
            at = [
                mapmatch.HandoverAt(h[0], int(h[5]), float(h[6]), float(h[7]))
                for h in (rows.handovers[k] for k in todo_ho)
            ]
            near = mapmatch.handover_positions(cur, at, matched)
            for k, (route_id, measure) in zip(todo_ho, near, strict=True):
                h = rows.handovers[k]
                handovers[k] = (*h[:8], measure, *h[9:], route_id)
        return fixes, handovers

    @staticmethod
    def _copy(cur: psycopg.Cursor[Any], table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        try:
            with cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(STAGING_TYPES[table])
                for r in rows:
                    cp.write_row(r)
        except (OverflowError, TypeError, ValueError) as e:
            # A value the binary dumpers cannot encode (validation should
            # have caught it): the same treatment as a database refusal.
            raise DataRejectedError(f"{table}: {type(e).__name__}: {e}") from e

    def _trips(
        self, cur: psycopg.Cursor[Any], new_fixes: list[tuple[str, int, bool]], res: WriteResult
    ) -> list[tuple[str, int, int]]:
        by_train: dict[str, list[int]] = defaultdict(list)
        for train, t, _ in new_fixes:
            by_train[train].append(t)
        if not by_train:
            return []
        ids = sorted(by_train)
        cur.execute(
            EXISTING_TRIPS,
            {
                "ids": ids,
                "lo": [min(by_train[t]) for t in ids],
                "hi": [max(by_train[t]) for t in ids],
                "gap": self.gap_ms,
            },
        )
        existing: dict[str, list[Trip]] = defaultdict(list)
        for train, tid, s, e, n in cur.fetchall():
            existing[train].append(Trip(tid, s, e, n))
        deletes: list[int] = []
        updates: list[Trip] = []
        inserts: list[tuple[str, Trip]] = []
        regions: list[tuple[str, int, int]] = []
        for train in ids:
            olds = sorted(existing[train], key=lambda t: t.started_ms)
            ch = merge(olds, by_train[train], self.gap_ms)
            deletes.extend(ch.deletes)
            for trip in ch.upserts:
                if trip.id is None:
                    inserts.append((train, trip))
                else:
                    updates.append(trip)
            regions.extend((train, lo, hi) for lo, hi in ch.regions)
        changed: list[int] = []
        if deletes:
            cur.execute("DELETE FROM trips WHERE id = ANY(%s::bigint[])", (deletes,))
        if updates:
            cur.execute(
                UPDATE_TRIPS,
                {
                    "id": [t.id for t in updates],
                    "s": [t.started_ms for t in updates],
                    "e": [t.ended_ms for t in updates],
                    "n": [t.fixes for t in updates],
                },
            )
            changed.extend(r[0] for r in cur.fetchall())
        if inserts:
            cur.execute(
                INSERT_TRIPS,
                {
                    "train": [tr for tr, _ in inserts],
                    "s": [t.started_ms for _, t in inserts],
                    "e": [t.ended_ms for _, t in inserts],
                    "n": [t.fixes for _, t in inserts],
                },
            )
            changed.extend(r[0] for r in cur.fetchall())
        if changed:
            cur.execute(TRIP_DIRECTION, {"ids": changed})
        res.trips_changed = len(changed) + len(deletes)
        return regions

    def _direction_regions(
        self, cur: psycopg.Cursor[Any], new_fixes: list[tuple[str, int, bool]]
    ) -> list[tuple[str, int, int]]:
        lo: dict[str, int] = {}
        hi: dict[str, int] = {}
        tlo: dict[str, int] = {}
        thi: dict[str, int] = {}
        for train, t, has_track in new_fixes:
            lo[train] = min(lo.get(train, t), t)
            hi[train] = max(hi.get(train, t), t)
            if has_track:
                tlo[train] = min(tlo.get(train, t), t)
                thi[train] = max(thi.get(train, t), t)
        span = lo
        if not span:
            return []
        ids = sorted(span)
        cur.execute(
            DIRECTION_REGIONS,
            {
                "ids": ids,
                "lo": [lo[t] for t in ids],
                "hi": [hi[t] for t in ids],
                "tlo": [tlo.get(t) for t in ids],
                "thi": [thi.get(t) for t in ids],
                "w": DIRECTION_WINDOW_MS,
            },
        )
        return [(r[0], r[1], r[2]) for r in cur.fetchall()]

    @staticmethod
    def _cells(cur: psycopg.Cursor[Any], link: list[int]) -> int:
        cur.execute(CHANGED_KEYS)
        keys = sorted(lock_key("cell", f"{c}\x00{s}\x00{d}") for c, s, d in cur.fetchall())
        cur.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM "
            "(SELECT k FROM unnest(%s::bigint[]) AS k ORDER BY k) AS s",
            (keys,),
        )
        cur.execute(RECOMPUTE_CELLS)
        n = max(cur.rowcount, 0)
        cur.execute(ADD_TO_CELLS)
        n += max(cur.rowcount, 0)
        if link:
            cur.execute(LINK_CELLS, {"ids": link})
        return n


def _regions(regions: Iterable[tuple[str, int, int]]) -> dict[str, list[Any]]:
    rs = list(regions)
    return {"rt": [r[0] for r in rs], "rlo": [r[1] for r in rs], "rhi": [r[2] for r in rs]}
