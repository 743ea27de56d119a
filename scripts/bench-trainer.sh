#!/usr/bin/env bash
# make bench-trainer: the trainer's validation on generated fleets, side by
# side with the paper, and one refit of 10,000 cells / 1M handovers timed and
# its memory measured -> bench/out/trainer.json (+ trainer.md). A thin entry
# point of `scripts/trainer_fleet.py bench` (arguments go to it):
#
# 1. Fleets (BENCH_TRAINER_PARTS contains "fleet"): for each route seed of
#    BENCH_TRAINER_ROUTES (the first is the reported one: 7; 11 and 12 are
#    held out, never looked at while developing; the development route 1 is
#    never reported), BENCH_TRAINER_TRIPS trips (trip seeds 2001.., 2101..,
#    2201.. for the 1st, 2nd, 3rd route) of BENCH_TRAINER_TRIP_S seconds by
#    polycorn-tracegen (pc-gateway-300, 2 carriers), each published with
#    `polycorn-ingest produce-testbed` (its own epoch, a day apart; 4 trains
#    taking turns) to a fresh topic and consumed by `polycorn-ingest run` into
#    a fresh database linkdb_bench_trainer_r<seed>; LinkDB's counts are
#    checked against the event files; then `polycorn-trainer validate`.
# 2. Scale (BENCH_TRAINER_PARTS contains "scale"): a fresh database
#    linkdb_bench_trainer_scale seeded by scripts/trainer-seed.sql
#    (BENCH_TRAINER_CELLS keys, BENCH_TRAINER_HANDOVERS handovers, 1 Hz GPS
#    fixes; fixed seed; timed separately), then one `polycorn-trainer run
#    --once --no-publish` under `trainer_fleet.py measure` (wall time, peak
#    PSS/RSS of the process tree sampled every 0.2 s, and the largest
#    process's exact peak RSS from getrusage).
# 3. `trainer_fleet.py report` folds it all into trainer.json/.md.
#
# Databases it created are dropped at the end unless BENCH_TRAINER_KEEP=1
# (then the work directory stays too).
#
# Env: BENCH_TRAINER_ROUTES ("7 11 12"), BENCH_TRAINER_TRIPS (24),
# BENCH_TRAINER_TRIP_S (1800), BENCH_TRAINER_CELLS (10000),
# BENCH_TRAINER_HANDOVERS (1000000), BENCH_TRAINER_SEED (0.42, setseed),
# BENCH_TRAINER_WORKERS (0: the trainer's default, one per CPU),
# BENCH_TRAINER_PARTS ("fleet scale"), BENCH_TRAINER_KEEP (0),
# BENCH_TRAINER_WORK (a new /tmp/bench-trainer.XXXXXX), BENCH_OUT (bench/out).
# Any non-default route list, fleet or scale size, or a single part makes
# the run a diagnostic one: its results go to $WORK/out, never bench/out.
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --all-packages --locked --quiet python scripts/trainer_fleet.py bench "$@"
