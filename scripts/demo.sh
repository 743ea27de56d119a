#!/usr/bin/env bash
# The demo: one emulated high-speed-rail trip through the whole data plane.
#
# polycorn-tracegen generates a short trip (two carriers at 300 km/h, with
# handovers, failures and blackouts, hsr-facts §15); for every scheme a copy
# of the topology is built (passengers -> relay-agent -> polycorn-emu
# replaying the trip -> proxy -> nginx/IM origin), all replaying the trip in
# step; the same downloads and instant messages run through each; the
# comparison table is printed; everything is torn down (also on Ctrl-C).
#
# It is `make bench-hsr PROFILE=demo`: results go under
# /tmp/polycorn-bench-hsr/out (never over the committed bench/out).
# By default it runs the default pipeline hrsch+ and HRSCH (the paper's
# scheduler), with a failure-location table built from previous trips,
# against the main baselines; SCHEMES="minrtt
# blest" picks others (bench-hsr's list has them all). Its topologies are hd0, hd1, ...
# (a bench-hsr run uses hb0, ...), so both can run at once.
set -euo pipefail
cd "$(dirname "$0")/.."

cat <<'TXT'
== Polycorn demo: an emulated HSR trip, the default pipeline (hrsch+: HRSCH, stale filter, tail rules), HRSCH and the baselines side by side
   passengers -> relay-agent -> 2 emulated carriers (trace replay, handovers) -> proxy -> origin
   about 4 minutes: a few downloads of 256 KB, 1 MB and 4 MB, then 10/20/30 chat users
TXT
SCHEMES=${SCHEMES:-minrtt hrsch+ hrsch blest redundant single-path kernel-mptcp} \
    BENCH_PREFIX=${BENCH_PREFIX:-hd} PROFILE=demo bash scripts/bench-hsr.sh
cat <<'TXT'

== how to read it: goodput ratio to minrtt per download size (higher is better),
   "x oracle" = the best completion time the traces allowed / the scheme's (1.0 = perfect),
   IM p90 = 90th percentile message delivery time (lower is better).
   The full method and the committed results: docs/results.md.

== The fleet loop: earlier trips' telemetry teaches the trainer where handovers
   fail; the live trip's proxy loads the learned table from Kafka; the trip's
   own telemetry goes back into LinkDB. Real Kafka, PostgreSQL + PostGIS,
   ingest, trainer and LinkDB API (about 4 minutes)
TXT
bash scripts/demo-fleet.sh
