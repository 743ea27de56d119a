#!/usr/bin/env bash
# make bench-hsr: every scheme side by side on the same emulated HSR trips.
#
#   PROFILE=demo|ci|short|full|long|precision|recovery|transport|transport-unseen|transport-bulk \
#     scripts/bench-hsr.sh
#
# For each link set and trip, one copy of the topology per scheme
# (testbed/topology.sh, prefixes hb0, hb1, ...) is built; all their emulators
# share one wall-clock epoch, so every scheme sees the same capacity, delay,
# loss and handover realisation at the same moment. Then one load generator
# per topology runs the same plan (same seed), in phases (PHASES, below):
#   bulk         downloads of 256 KB, 1 MB and 4 MB at random points of a window;
#   im           instant messaging with 10, 20 and 30 users;
#   backlog      one backlogged download, requests back to back across
#                BACKLOG_S seconds, so that every handover failure in that
#                window gets a recovery measurement (and, against
#                single-path-c0/-c1, the best single carrier per trip);
#   concurrency  CONC_USERS (1, 10, 100) concurrent backlogged passengers in
#                turn, CONC_S seconds each, each passenger its own source
#                address; per window the relay's and proxy's peak RSS (VmHWM,
#                reset at the window's start) and metrics snapshots;
#   sweep        (hsr only) after each trip's main pass, the trip replayed
#                again for the SWEEP_SCHEMES (default minrtt hrsch, those in
#                SCHEMES), one topology per scheme and memory budget
#                (SWEEP_MIB, --mem-budget of relay and proxy), side by side:
#                one backlogged download of SWEEP_S seconds each.
# bench/polycorn_bench turns the records into ratios, oracle comparisons,
# tables and plots.
#
# Link sets:
#   hsr       trips from polycorn-tracegen (preset pc-gateway-300, 2 carriers)
#             on REPORT seeds: route seed 7, trip seeds 1001.. Development and
#             tuning use route seeds 1-3 / trip seeds 1..99 (the v2 failure model's
#             fit, unit tests); results are never reported on those.
#   mahimahi  the real LTE traces of testbed/traces/mahimahi (T-Mobile and
#             Verizon, driving; GPL-3.0 data, see its README) as carriers 0
#             and 1, 30 ms one-way delay, no random loss, no scheduled
#             blackouts (set MAHIMAHI_DIR to use another copy).
#   driving   two longer real driving traces of the same collection, AT&T LTE
#             (786 s) and T-Mobile UMTS (928 s), as carriers 0 and 1, 30 ms
#             one-way delay, no random loss: real outages (21 and 32 gaps of
#             1 s or more in their downlinks) on two unequal carriers. Trip k
#             starts both traces DRIVING_STEP_S x k seconds in (rotated, so
#             each trip sees another stretch of road); 1 trip in short and
#             full, 3 in long.
#
# Failure-location table (HRSCH's handover-failure-aware path rejection): the
# trainer learns it from TABLE_TRIPS (default 20) PREVIOUS trips of the same
# route (trip seeds 901..), never from a trip being measured; those trips go
# through Kafka and ingest into a fresh LinkDB first (make_table). Every
# scheme gets the table and the radio replay; only hof-reject uses it. The
# closed loop, trip after trip, is scripts/bench-loop.sh.
#
# Environment: PROFILE (default short), SCHEMES (space-separated, must
# include minrtt; default all below, precision: minrtt hrsch; a scheme
# NAME@oracle, NAME@broad, NAME@early or NAME@mean runs pipeline NAME with
# another failure table, and NAME~CC with congestion control CC on its
# subflows instead of the default, e.g. minrtt~cubic; see up_topology;
# direct-c<i> is the passengers' own TCP over carrier i without relay or
# proxy, direct-c<i>~CC with CC at passenger and origin instead of bbr),
# BENCH_PREFIX
# (topology prefix, default hb), LINK_SETS (default: the profile's),
# BENCH_WORK (raw runs, default /tmp/polycorn-bench-hsr), BENCH_OUT (default
# bench/out; the demo and ci profiles write only under BENCH_WORK), PLOTS
# (directory for PNGs), SWEEP_SCHEMES (schemes of the budget sweep),
# TRIP_PARALLEL (trips at once, default 1, precision 11), SEGMENT_TRACE (1:
# relay and proxy of the main pass write a segment trace, --trace-dir, into
# each scheme's run directory; bench/polycorn_bench/stalls.py reads it).
#
# Diagnostics (development only; any of these makes the run a diagnostic
# one: its results go under BENCH_WORK/out, never bench/out, and run.json
# says "diagnostic"): ROUTE_SEED (default 7; development uses 1),
# TRIP_SEED_BASE (measured trips are BASE+1.., default 1000),
# TABLE_SEED_BASE (previous trips for the table, BASE+1.., default 900),
# HSR_TRIPS (trips of the hsr set), BENCH_SLOT_S (seconds per download
# slot), TABLE=previous|truth|none (truth: an oracle table built from the
# measured trip's own events by `polycorn-tracegen failure-table`, every
# failed cell, for an upper bound on hof-reject; none: no table),
# PHASES (a subset of: bulk im backlog concurrency sweep; default the
# profile's), CONC_USERS, CONC_S, SWEEP_MIB, SWEEP_S, TRACEGEN_PRESET
# (default pc-gateway-300), PC_EMU_LOSS_KEYING (the emulator's
# --loss-keying, default time) and LOAD_START_S (trip time of the load's
# start in seconds, or auto: as soon as every topology is up; default 45 in
# precision, recovery and the transport profiles, 120 in short, full and
# long, auto in ci and demo). Results from before 2026-11-26 were
# measured on TRACEGEN_PRESET=pc-gateway-300-v1 PC_EMU_LOSS_KEYING=packet.
# Ctrl-C or any failure tears every topology down. A thin entry point of
# scripts/bench_hsr.py, which does all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "bench-hsr: ERROR: must run as root (network namespaces)" >&2; exit 1; }
uv sync --all-packages --locked --quiet
# The workspace's Python itself, not `uv run`: Ctrl-C or a SIGTERM sent to this
# script's process must reach the orchestrator, which tears every topology down.
exec .venv/bin/python scripts/bench_hsr.py "$@"
