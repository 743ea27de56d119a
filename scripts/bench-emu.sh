#!/usr/bin/env bash
# make bench-emu: the ceiling of the link emulator (polycorn-emu) on this
# machine, 4 and 1 carriers of iperf3 through it -> bench/out/emu.json and a
# table. A thin entry point of scripts/bench_emu.py (its docstring says how,
# and which EMU_* variables and options change it). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "bench-emu: must run as root (network namespaces)" >&2; exit 1; }
exec uv run --all-packages --locked --quiet python scripts/bench_emu.py "$@"
