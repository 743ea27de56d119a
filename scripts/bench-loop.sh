#!/usr/bin/env bash
# make bench-loop: the closed fleet loop on the testbed, trip after trip, and
# its learning curve.
#
#   PROFILE=report|ci scripts/bench-loop.sh
#
# N trips of the same route, one after the other. Each trip runs four copies
# of the topology side by side (testbed/topology.sh, prefixes hl0..hl3, one
# wall-clock epoch, so all see the same link realisation), with the same
# load plan as make bench-hsr (bulk downloads, then a backlogged download
# for the recovery after failed handovers):
#
#   hrsch-learned  hrsch with the table the trainer learned from the trips
#                  and signed (a `polycorn-pki table-key` pair made per run:
#                  the trainer's --table-signing-key, this copy's relay and
#                  proxy --failure-table-verify-key, as deployed)
#                  before this one (trip 1: none, LinkDB is empty). Its proxy
#                  reads it from Kafka (--failure-table-topic, the compacted
#                  topic, at start and hot-reloaded); its relay gets the same
#                  table as a file, from LinkDB's failure_tables. It is the
#                  only copy whose proxy produces telemetry: relay -> proxy ->
#                  Kafka -> polycorn-ingest -> LinkDB, with a stable train id,
#                  so LinkDB receives each trip exactly once, by the real path.
#   minrtt         the reference of every ratio.
#   hrsch-none     hrsch without a table (what the learned copy is on trip 1).
#   hrsch-truth    hrsch with the oracle table: every cell where this very
#                  trip fails (polycorn-tracegen failure-table --min-failures 1
#                  --min-failure-rate 0), the upper bound of what a table can do.
#
# After each trip: wait for the relay's spool to drain and for ingest to
# have loaded the trip's handovers (LinkDB against the event log, both
# reported), then `polycorn-trainer run --once` fits, validates, stores the
# model and publishes the next table (failure_tables + Kafka).
#
# Its own infrastructure (scripts/infra.sh with POLYCORN_INFRA_DIR
# /tmp/polycorn-infra-loop, PostgreSQL 25452, Kafka 29112, Prometheus port
# 29120), wiped at the start and at the end: a fresh LinkDB and fresh topics
# every run. The default instance (25432/29092) is never touched.
#
# Seeds: route 7 (the reported route), trip seeds 2001.. (ci: 2103..;
# bench-hsr measures 1001.. and builds its stand-in table from 901..;
# development uses route 1).
#
# Profiles: report, 32 trips of 263 s, meant to be left running: about 2.5 h
# (the 6-trip run of 2026-11-24 took 28 min, 4.5-4.7 min per trip: the trip,
# bringing four topologies up and down, ingest and the trainer); ci, 2 short
# trips, about 4 min. The analysis plots each trip and the curves pooled over
# trips 1..k and the last 8 trips (docs/benchmarks.md).
#
# Environment: PROFILE (report, default, or ci: 2 short trips), LOOP_TRIPS
# (trips; report 32, ci 2), BIN (binaries, default target/release),
# BENCH_PREFIX (topology prefix, default hl), BENCH_WORK (raw runs, default
# /tmp/polycorn-bench-loop), BENCH_OUT (default bench/out; ci: under
# BENCH_WORK), PLOTS (default docs/img/loop; ci: under BENCH_WORK),
# LOOP_TABLE_SOURCE (topic, default: the learned proxy reads Kafka; file:
# relay and proxy get the LinkDB table as a file, for a proxy without
# --failure-table-topic), LOOP_INGEST_METRICS (ingest's metrics address,
# default 127.0.0.1:9482). ROUTE_SEED / TRIP_SEED_BASE make a diagnostic run
# (results under BENCH_WORK/out only), as do TRACEGEN_PRESET (default
# pc-gateway-300) and PC_EMU_LOSS_KEYING (the emulator's --loss-keying;
# results from before 2026-11-26: pc-gateway-300-v1 and packet).
# LOOP_POSITIONS=gps (diagnostic) runs the loop on GPS alone, as a
# real train would: the route's line (the generator's route.geojson) is
# imported into LinkDB before trip 1, every relay replays GPS fixes without
# track_m (--replay-gps-only), ingest map-matches them onto the route, the
# trainer learns on the matched measures and puts the route in its tables,
# and the proxies place the trains by matching their fixes onto it (the
# oracle table carries the route too: failure-table --route).
# Ctrl-C or any failure tears every topology, ingest and the infrastructure
# down. A thin entry point of scripts/bench_loop.py, which does all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "bench-loop: ERROR: must run as root (network namespaces)" >&2; exit 1; }
uv sync --all-packages --locked --quiet
exec uv run --all-packages --locked --quiet python scripts/bench_loop.py "$@"
