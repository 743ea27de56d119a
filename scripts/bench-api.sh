#!/usr/bin/env bash
# make bench-api: p50/p99 of the LinkDB API's hot queries with 1M handovers
# loaded, each at a fixed open-loop 200 requests/s -> bench/out/api.json.
# A thin entry point of scripts/bench_api.py (its docstring says how, and
# which BENCH_API_* variables and options change it); vegeta comes from
# `scripts/setup.sh bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench >/dev/null
exec uv run --all-packages --locked --quiet python scripts/bench_api.py "$@"
