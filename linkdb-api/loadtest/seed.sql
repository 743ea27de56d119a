-- make bench-api: a realistic LinkDB with 1,000,000+ handovers, quickly, in SQL.
--
-- Three lines of 600 km (kilometre posts 0..600000 m) between real Chinese
-- cities; three carriers; cells every 2 km per carrier and direction
-- (3 lines x 3 carriers x 2 directions x 300 = 5,400 cells). 40 trains run
-- 28 trips each (1,120 trips, every 4 h, alternating direction, 300 km/h);
-- each trip hands over once per cell boundary per carrier: 900 handovers a
-- trip, 1,008,000 in all. Failure probability is a property of the cell
-- (5-25%); failures happen later along the track than successes (late
-- handovers), RSRP is lower at failures. Rows go in in time order, as ingest
-- writes them: the table is clustered by time, not by place.
--
-- psql variables scale it down (the API's plan tests seed a smaller copy):
-- `trains` (40) and `trips` (28 per train), e.g. psql -v trains=8 -v trips=12.
\set ON_ERROR_STOP on
\if :{?trains}
\else
\set trains 40
\endif
\if :{?trips}
\else
\set trips 28
\endif
BEGIN;
SELECT setseed(0.42);  -- the same data every run
CREATE TEMP TABLE line (id int, lon0 float8, lat0 float8, lon1 float8, lat1 float8);
INSERT INTO line VALUES
  (0, 116.40, 39.90, 117.20, 34.70),   -- Beijing -> Xuzhou
  (1, 113.62, 34.75, 114.30, 30.59),   -- Zhengzhou -> Wuhan
  (2, 118.80, 32.06, 114.00, 30.00);   -- Nanjing -> west
CREATE TEMP TABLE carrier (id int, name text);
INSERT INTO carrier VALUES (0, 'cmcc'), (1, 'unicom'), (2, 'telecom');

INSERT INTO trains (id, source, first_seen, last_seen)
SELECT 'train-' || lpad(t::text, 3, '0'), 'telemetry', '2026-10-01T00:00:00Z',
       '2026-10-01T00:00:00Z'::timestamptz + interval '4 hours' * :trips
FROM generate_series(0, :trains - 1) t;

-- trip n of train t: line (t % 3), direction alternating.
INSERT INTO trips (train_id, started_at, ended_at, fixes, direction)
SELECT 'train-' || lpad(t::text, 3, '0'),
       '2026-10-01T00:00:00Z'::timestamptz + interval '4 hours' * n + interval '1 minute' * t,
       '2026-10-01T00:00:00Z'::timestamptz + interval '4 hours' * n + interval '1 minute' * t
         + interval '7300 seconds',
       7200, (CASE WHEN n % 2 = 0 THEN 'increasing' ELSE 'decreasing' END)::track_direction
FROM generate_series(0, :trains - 1) t, generate_series(0, :trips - 1) n;

-- Loading into indexed tables costs far more than building the indexes once
-- afterwards (the GiST indexes above all), so the handovers' indexes that
-- back no constraint are dropped here and rebuilt from their own
-- definitions after the load: whatever the migrations define, the same.
SET LOCAL maintenance_work_mem = '512MB';
CREATE TEMP TABLE seed_indexes AS
  SELECT i.indexname, i.indexdef FROM pg_indexes i
  WHERE i.schemaname = current_schema() AND i.tablename = 'handovers'
    AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname);
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT indexname FROM seed_indexes LOOP
    EXECUTE format('DROP INDEX %I', r.indexname);
  END LOOP;
END $$;

-- Handovers: one per cell boundary (k = 0..299) per carrier per trip. The
-- cell ID encodes line, carrier, direction and k; the boundary sits at
-- k * 2000 + 1000 m plus a per-carrier offset; failures are later.
INSERT INTO handovers (source, train_id, trip_id, carrier, path, source_cell_id, target_cell_id,
                       start_time, geog, track_m, direction, rsrp_dbm, outcome, duration_ms)
SELECT 'telemetry', tr.train_id, tr.id, c.name, c.id,
       cell_id, cell_id + 1,
       tr.started_at + make_interval(secs => (CASE WHEN inc THEN pos ELSE 600000 - pos END) / 83.3),
       ST_SetSRID(ST_MakePoint(l.lon0 + (l.lon1 - l.lon0) * pos / 600000 + (random() - 0.5) * 0.0004,
                               l.lat0 + (l.lat1 - l.lat0) * pos / 600000 + (random() - 0.5) * 0.0004),
                  4326)::geography,
       pos, tr.direction,
       CASE WHEN fail THEN -112 + random() * 10 ELSE -100 + random() * 20 END,
       (CASE WHEN fail THEN 'failure' ELSE 'success' END)::handover_outcome,
       CASE WHEN fail THEN 1000 + (random() * 9000)::int ELSE 30 + (random() * 70)::int END
FROM (
  SELECT t.*, t.direction = 'increasing' AS inc,
         split_part(t.train_id, '-', 2)::int % 3 AS line_id
  FROM trips t
) tr
JOIN line l ON l.id = tr.line_id
CROSS JOIN carrier c
CROSS JOIN generate_series(0, 299) k
CROSS JOIN LATERAL (
  SELECT (l.id * 10 + c.id) * 100000 + (CASE WHEN tr.inc THEN 0 ELSE 50000 END) + k + 1 AS cell_id,
         -- the cell's failure probability: 5..25 %, fixed per cell
         0.05 + 0.20 * ((hashint4(k * 7 + c.id * 13 + l.id * 31) & 1023) / 1023.0) AS p_fail
) cid
CROSS JOIN LATERAL (SELECT random() < cid.p_fail AS fail) f
CROSS JOIN LATERAL (
  SELECT k * 2000 + 1000 + c.id * 300
         + (CASE WHEN f.fail THEN 150 ELSE 0 END) * (CASE WHEN tr.inc THEN 1 ELSE -1 END)
         + (random() - 0.5) * 200 AS pos
) p
-- In time order, as ingest writes them: the table's pages follow time, so a
-- viewport's rows are spread over the table as they would be in production.
ORDER BY 8;

DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT indexdef FROM seed_indexes LOOP
    EXECUTE r.indexdef;
  END LOOP;
END $$;

-- Cells, derived from their handovers as ingest does.
INSERT INTO cells (carrier, cell_id, direction, handovers, failures, earliest_ho_track_m,
                   earliest_ho_geog, first_seen, last_seen)
SELECT DISTINCT ON (h.carrier, h.source_cell_id, h.direction)
       h.carrier, h.source_cell_id, h.direction,
       count(*) OVER w, count(*) FILTER (WHERE h.outcome = 'failure') OVER w,
       h.track_m, h.geog, min(h.start_time) OVER w, max(h.start_time) OVER w
FROM handovers h
WINDOW w AS (PARTITION BY h.carrier, h.source_cell_id, h.direction)
ORDER BY h.carrier, h.source_cell_id, h.direction,
         CASE WHEN h.direction = 'increasing' THEN h.track_m ELSE -h.track_m END;
COMMIT;
VACUUM ANALYZE;
