#!/usr/bin/env bash
# make bench-fleet: one cloud node under a fleet's load -> bench/out/fleet.json
# and bench/out/fleet.md. The logic is Python (polycorn_ingest.bench_fleet; the
# method in docs/benchmarks.md, "Fleet load"); this only brings up the
# PostgreSQL and Kafka of scripts/infra.sh (idempotent; its POLYCORN_* env
# picks another instance) and passes the knobs on.
#
# Env: FLEET_TRAINS (fleet sizes, comma-separated; 10,25,50,100), FLEET_CONNS
# (passenger connections per train; 100), FLEET_SECONDS (measured seconds per
# size; 60), FLEET_ARGS (more flags of the module, e.g. --bulk-rate 16384),
# BIN (the release binaries; target/release), BENCH_OUT (bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release}
OUT=${BENCH_OUT:-bench/out}
for b in polycorn-proxy polycorn-relay polycorn-pki polycorn-tracegen; do
    [[ -x $BIN/$b ]] || { echo "bench-fleet: $BIN/$b missing (make build)" >&2; exit 1; }
done
bash scripts/infra.sh up pg kafka
eval "$(bash scripts/infra.sh env)"
# shellcheck disable=SC2086  # FLEET_ARGS is a list of flags on purpose
exec uv run --all-packages --locked --quiet python -m polycorn_ingest.bench_fleet \
    --trains "${FLEET_TRAINS:-10,25,50,100}" --conns "${FLEET_CONNS:-100}" \
    --seconds "${FLEET_SECONDS:-60}" --bin "$BIN" --out "$OUT/fleet.json" ${FLEET_ARGS:-}
