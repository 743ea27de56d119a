-- make bench-trainer, the scale run: a LinkDB with 10,000 <carrier, cell,
-- direction> keys and 1,000,000 handovers out of them (or ten times that:
-- BENCH_TRAINER_SCALE=10x), in SQL, quickly.
--
--   psql URL -v cells=10000 -v handovers=1000000 -v carriers=2 -v seed=0.42 [-v lines=1] -f bench/run/polycorn_benchrun/trainer-seed.sql
--
-- (the first four variables are required; polycorn_benchrun.trainer_fleet passes them).
--
-- Not linkdb-api/loadtest/seed.sql (bench-api's 1M handovers): that one
-- leaves handovers.cell NULL (ingest sets it; the trainer reads cells
-- through it), gives each cell a 5-25 % failure rate (15 % overall, the
-- fleet's is ~6 %) and puts every failure 150 m past every success, which a
-- classifier separates trivially. This one follows polycorn-tracegen's
-- outcome model (testbed/tracegen/README.md, "Outcome") with continuous
-- effects, so location and RSRP both carry some, not all, of the signal.
--
-- `lines` lines (default 1; 10 for the 10x fleet), each of
-- n = cells / (2 x carriers x lines) cells per carrier, boundaries every
-- 900 m (2,250 km at the defaults: Beijing-Guangzhou), carrier c's offset by
-- 300 m x c. Going up (increasing) a train leaves cell k at boundary b_k;
-- going down it leaves cell k + 1 at b_k: one key per cell and direction, the
-- same cell IDs both ways, like a real line. Each line has its own 20 trains
-- (scale-000 to -019 run line 0, -020 to -039 line 1, ...) and cells (line l's
-- cell IDs carry l in bits 20 and up). Every trip runs its whole line
-- (300 km/h, 7.5 h), trains alternate direction, a trip every 12 h per
-- train; trips = handovers / (carriers x n), taken by the lines in turn, so
-- every key gets one handover per trip of its direction on its line (100 at
-- the defaults) from as many trips. Ten lines rather than one ten times as
-- long: a train's trips of a 22,500 km line would overlap.
--
-- Per handover: trigger jitter delta ~ Exp(200 m) past the boundary in the
-- direction of travel (capped at 700 m, so a carrier's handovers of one trip
-- stay in boundary order and never share a millisecond: the natural key is
-- (train, carrier, start time)); RSRP = -100 dBm - 0.01 dB/m x delta +
-- N(0, 4 dB); logit P(failure) = -4.25 + u_key + 0.005/m x (delta - 200 m) +
-- 0.15/dB x (-100 dBm - RSRP), u_key ~ N(0, 1) fixed per key: failures later
-- along the direction of travel and at lower RSRP, ~5.5 % overall (the
-- preset's 6.22 / 5.47 %). Rows go in in time order, as ingest writes them.
-- GPS fixes at 1 Hz over every trip (5.4 M at the defaults, 54 M for 10x).
-- Cells are created first, then the handovers with their cell (FK), then the
-- cells' counts and earliest handover position, as ingest keeps them.
--
-- Loading into indexed tables costs far more than building the indexes once
-- afterwards (the GiST indexes of handovers above all), so the indexes of
-- cells and handovers that back no constraint are dropped before the load
-- and rebuilt from their own definitions after it (as bench-api's seed
-- does): whatever the migrations define, the same indexes in the end.
-- Constraints (primary keys, unique keys, foreign keys) stay and are checked
-- row by row; gps_fixes keeps its indexes (its primary key, and a BRIN index
-- that costs next to nothing to keep up).
\set ON_ERROR_STOP on
\if :{?lines}
\else
  \set lines 1
\endif
SET TIME ZONE 'UTC';
BEGIN;
SET LOCAL maintenance_work_mem = '512MB';
SELECT setseed(:seed);  -- the same data every run

CREATE TEMP TABLE seed_indexes AS
  SELECT i.tablename, i.indexname, i.indexdef FROM pg_indexes i
  WHERE i.schemaname = current_schema() AND i.tablename IN ('cells', 'handovers')
    AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname);
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT indexname FROM seed_indexes LOOP
    EXECUTE format('DROP INDEX %I', r.indexname);
  END LOOP;
END $$;

CREATE TEMP TABLE p AS
SELECT :cells / (2 * :carriers * :lines) AS n,     -- cells per carrier and line
       :carriers AS carriers,
       :lines AS lines,
       :handovers / (:cells / (2 * :lines)) AS trips, -- whole-line trips, all lines
       900.0 AS spacing_m,
       83.333 AS speed_mps,
       20 AS trains;                                 -- per line
CREATE TEMP TABLE carrier AS
SELECT c AS id, (ARRAY['cmcc', 'unicom', 'telecom', 'carrier-3'])[c + 1] AS name
FROM generate_series(0, (SELECT carriers FROM p) - 1) c;

INSERT INTO trains (id, source, first_seen, last_seen)
SELECT 'scale-' || lpad(t::text, 3, '0'), 'telemetry', '2026-06-01T00:00:00Z', '2026-06-01T00:00:00Z'
FROM generate_series(0, (SELECT trains * lines FROM p) - 1) t;

-- Trip j of line l (i = j x lines + l): the (j / 20)-th trip of the line's
-- train j mod 20, every 12 h, alternating direction.
INSERT INTO trips (train_id, started_at, ended_at, fixes, direction)
SELECT 'scale-' || lpad((l * p.trains + j % p.trains)::text, 3, '0'),
       '2026-06-01T00:00:00Z'::timestamptz + interval '12 hours' * (j / p.trains)
         + interval '7 minutes' * (j % p.trains),
       '2026-06-01T00:00:00Z'::timestamptz + interval '12 hours' * (j / p.trains)
         + interval '7 minutes' * (j % p.trains)
         + make_interval(secs => (p.n * p.spacing_m + 2000) / p.speed_mps),
       ((p.n * p.spacing_m + 2000) / p.speed_mps)::int,
       (CASE WHEN (j / p.trains + j % p.trains) % 2 = 0 THEN 'increasing' ELSE 'decreasing' END)::track_direction
FROM p, generate_series(0, (SELECT trips FROM p) - 1) i,
     LATERAL (SELECT i / p.lines AS j, i % p.lines AS l) t;

-- Keys: increasing leaves cell k at b_k, decreasing leaves cell k + 1 at b_k.
-- Boundary b of line l is lb = l x n + b.
CREATE TEMP TABLE k AS
SELECT c.name AS carrier, c.id AS path, d.dir, lb % p.n AS boundary, lb / p.n AS line,
       ((c.id + 1)::bigint << 32) | ((lb / p.n)::bigint << 20)
         | (lb % p.n + CASE WHEN d.dir = 'increasing' THEN 0 ELSE 1 END) AS cell_id,
       ((c.id + 1)::bigint << 32) | ((lb / p.n)::bigint << 20)
         | (lb % p.n + CASE WHEN d.dir = 'increasing' THEN 1 ELSE 0 END) AS target_id,
       1000.0 + lb % p.n * p.spacing_m + c.id * 300.0 AS boundary_m,
       -- u_key ~ N(0, 1), Box-Muller
       sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS u
FROM p, carrier c,
     (VALUES ('increasing'::track_direction), ('decreasing'::track_direction)) d(dir),
     generate_series(0, (SELECT n * lines FROM p) - 1) lb
ORDER BY c.id, d.dir, lb;

INSERT INTO cells (carrier, cell_id, direction, handovers, failures, first_seen, last_seen)
SELECT carrier, cell_id, dir, 0, 0, '2026-06-01T00:00:00Z', '2026-06-01T00:00:00Z' FROM k;

-- Line 0: Beijing West -> Guangzhou South, straight; line l the same 0.5 deg
-- further east (the geometry is only for the map; track_m is what the
-- trainer fits on).
INSERT INTO handovers (source, train_id, trip_id, cell, carrier, path, source_cell_id, target_cell_id,
                       start_time, geog, track_m, direction, rsrp_dbm, outcome, duration_ms)
SELECT 'telemetry', h.train_id, h.trip_id, c.id, h.carrier, h.path, h.cell_id, h.target_id,
       h.start_time,
       ST_SetSRID(ST_MakePoint(116.32 + (113.27 - 116.32) * h.pos / h.line_m + (random() - 0.5) * 0.0004
                                 + 0.5 * (split_part(h.train_id, '-', 2)::int / (SELECT trains FROM p)),
                               39.89 + (22.99 - 39.89) * h.pos / h.line_m + (random() - 0.5) * 0.0004),
                  4326)::geography,
       h.pos, h.dir, h.rsrp,
       (CASE WHEN h.fail THEN 'failure' ELSE 'success' END)::handover_outcome,
       CASE WHEN h.fail THEN 1000 + (random() * 9000)::int ELSE 30 + (random() * 70)::int END
FROM (
  SELECT d.*, start_at + make_interval(secs => (CASE WHEN inc THEN pos ELSE line_m - pos END) / speed_mps)
           AS start_time,
         r_fail < 1 / (1 + exp(-(-4.25 + u + 0.005 * (delta - 200) + 0.15 * (-100 - rsrp)))) AS fail
  FROM (
    SELECT r.*, boundary_m + (CASE WHEN inc THEN 1 ELSE -1 END) * delta AS pos,
           -100 - 0.01 * delta + sqrt(-2 * ln(1 - r_n1)) * cos(2 * pi() * r_n2) * 4 AS rsrp
    FROM (
      -- The random draws, one per row each (a volatile target list is
      -- evaluated once per row; outer levels only combine them).
      SELECT tr.train_id, tr.id AS trip_id, tr.started_at AS start_at, tr.direction = 'increasing' AS inc,
             k.carrier, k.path, k.cell_id, k.target_id, k.dir, k.boundary_m, k.u,
             p.n * p.spacing_m + 2000 AS line_m, p.speed_mps,
             least(-200 * ln(1 - random()), 700) AS delta,
             random() AS r_n1, random() AS r_n2, random() AS r_fail
      FROM p, (SELECT t.*, split_part(t.train_id, '-', 2)::int / (SELECT trains FROM p) AS line
               FROM trips t) tr
      -- The line as a filter, not a join key: the join (and the order in which
      -- the rows draw their numbers) stays the one-line seed's.
      JOIN k ON k.dir = tr.direction AND k.line IS NOT DISTINCT FROM tr.line
    ) r
  ) d
) h
JOIN cells c ON c.carrier = h.carrier AND c.cell_id = h.cell_id AND c.direction = h.dir
ORDER BY h.start_time;

-- GPS fixes at 1 Hz over every trip: the trainer takes the train's speed at a
-- handover from its last fix before it. In month partitions, as ingest
-- creates them (polycorn_schema.linkdb.partitions).
DO $$
DECLARE m date;
BEGIN
  FOR m IN SELECT generate_series(date_trunc('month', min(started_at)), date_trunc('month', max(ended_at)),
                                  interval '1 month')::date FROM trips LOOP
    EXECUTE format('CREATE TABLE IF NOT EXISTS gps_fixes_y%sm%s PARTITION OF gps_fixes FOR VALUES FROM (%L) TO (%L)',
                   to_char(m, 'YYYY'), to_char(m, 'MM'), m::timestamptz, (m + interval '1 month')::timestamptz);
  END LOOP;
END $$;
INSERT INTO gps_fixes (train_id, time, geog, speed_mps, heading_deg, accuracy_m, track_m)
SELECT f.train_id, f.time,
       ST_SetSRID(ST_MakePoint(116.32 + (113.27 - 116.32) * f.pos / f.line_m + (random() - 0.5) * 0.0004
                                 + 0.5 * (split_part(f.train_id, '-', 2)::int / (SELECT trains FROM p)),
                               39.89 + (22.99 - 39.89) * f.pos / f.line_m + (random() - 0.5) * 0.0004),
                  4326)::geography,
       f.speed_mps, CASE WHEN f.inc THEN 189.0 ELSE 9.0 END, 5 + random() * 10, f.pos
FROM (
  SELECT tr.train_id, tr.started_at + make_interval(secs => s) AS time, tr.direction = 'increasing' AS inc,
         l.line_m, p.speed_mps,
         CASE WHEN tr.direction = 'increasing' THEN s * p.speed_mps ELSE l.line_m - s * p.speed_mps END AS pos
  FROM p CROSS JOIN (SELECT p.n * p.spacing_m + 2000 AS line_m FROM p) l
  CROSS JOIN trips tr CROSS JOIN LATERAL generate_series(0, tr.fixes) s
) f
ORDER BY f.time;

-- Counts and the earliest handover along the direction of travel, as ingest keeps them.
UPDATE cells c SET handovers = g.n, failures = g.f, first_seen = g.first, last_seen = g.last,
                   earliest_ho_track_m = e.track_m, earliest_ho_geog = e.geog
FROM (SELECT cell, count(*) AS n, count(*) FILTER (WHERE outcome = 'failure') AS f,
             min(start_time) AS first, max(start_time) AS last
      FROM handovers GROUP BY cell) g,
     (SELECT DISTINCT ON (cell) cell, track_m, geog FROM handovers
      ORDER BY cell, CASE WHEN direction = 'increasing' THEN track_m ELSE -track_m END) e
WHERE g.cell = c.id AND e.cell = c.id;
UPDATE trains t SET first_seen = s.first, last_seen = s.last
FROM (SELECT train_id, min(started_at) AS first, max(ended_at) AS last FROM trips GROUP BY train_id) s
WHERE s.train_id = t.id;

DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT indexdef FROM seed_indexes LOOP
    EXECUTE r.indexdef;
  END LOOP;
END $$;
COMMIT;
VACUUM ANALYZE;
