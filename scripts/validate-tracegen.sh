#!/usr/bin/env bash
# make validate-tracegen: the HSR trace generator (testbed/tracegen) against
# the published numbers of hsr-facts §15.8, as a pass/fail check. A thin entry
# point: the build and staleness checks, fleets, items, tolerances, the JSON,
# the text report and the docs' generated tables are scripts/validate_tracegen.py;
# item 12's namespace plumbing is testbed/tracegen/tools/tcp_run.sh. Method,
# tolerances and expected failures: docs/hsr-model.md.
#
# Exit status 1 when a gating check fails, the build fails, a binary is older
# than its sources, a source changes during the run, or an iperf3 run fails.
#
# Env: VAL_PROFILE (full; ci = the subset `make test` runs, ~2 min, output in
# VAL_DIR/ci/out), VAL_TCP (1; 0 skips item 12, no root needed, output not in
# bench/out), VAL_TCP_TRIPS / VAL_TCP_SECONDS (item 12's trips and iperf3
# seconds; defaults 4 x 600 s full, 1 x 60 s ci; other values keep the output
# out of bench/out), VAL_DIR (/tmp/polycorn-tracegen-validation, the work
# directory), VAL_SEED_FAULT (a check key whose tolerance is made impossible:
# shows the gate failing). Extra arguments go to `validate_tracegen.py run`.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(run --profile "${VAL_PROFILE:-full}" --work "${VAL_DIR:-/tmp/polycorn-tracegen-validation}")
[[ ${VAL_TCP:-1} == 0 ]] && args+=(--no-tcp)
[[ -n ${VAL_TCP_TRIPS:-} ]] && args+=(--tcp-trips "$VAL_TCP_TRIPS")
[[ -n ${VAL_TCP_SECONDS:-} ]] && args+=(--tcp-seconds "$VAL_TCP_SECONDS")
[[ -n ${VAL_SEED_FAULT:-} ]] && args+=(--seed-fault "$VAL_SEED_FAULT")
exec uv run --all-packages --locked --quiet python scripts/validate_tracegen.py "${args[@]}" "$@"
