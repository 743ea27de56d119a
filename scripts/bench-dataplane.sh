#!/usr/bin/env bash
# make bench-dataplane: throughput, CPU per GB, request/response latency and
# memory of the relay-agent/proxy pair on the namespace testbed, side by side
# with plain TCP and kernel MPTCP -> bench/out/dataplane.{json,md}. A thin
# entry point of scripts/bench_dataplane.py (its docstring says how, and
# which BENCH_* variables and options change it; bench/README.md what each
# number means). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "bench-dataplane: must run as root (network namespaces)" >&2; exit 1; }
exec uv run --all-packages --locked --quiet python scripts/bench_dataplane.py "$@"
