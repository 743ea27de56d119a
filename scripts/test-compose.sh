#!/usr/bin/env bash
# The docker-compose fleet-in-a-box (docker-compose.yml), run for real on this
# machine: podman serves the Docker API, Debian's docker-compose drives it,
# and every image is built here from a local debootstrap base. A thin entry
# point of the harness suite testbed/harness/suites/compose (its docstring
# lists the checks; polycorn_harness.compose builds, starts and removes the
# fleet, and leaves nothing of the run behind). Needs root.
#
#   scripts/test-compose.sh [--keep-up] [--purge-cache] [PYTEST_ARGS...]
#   scripts/test-compose.sh --down
#   scripts/test-compose.sh --build-only
#
# The local bases and build caches are machine caches and stay for the next
# run; --purge-cache removes them too (the next run is cold). --keep-up leaves
# the fleet running when every test passed; --down cleans up after it.
# --build-only builds the images and stops: a run of the suite after it finds
# every layer cached (make test builds them early, beside steps that wait).
# Env: TEST_COMPOSE_API_PORT (28180), TEST_COMPOSE_PROM_PORT (28190),
# POLYCORN_COMPOSE_STATE (/run/polycorn-compose-test).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "test-compose: must run as root (podman, network namespaces)" >&2; exit 1; }
args=()
for a in "$@"; do
    case $a in
        --keep-up) export TEST_COMPOSE_KEEP_UP=1 ;;
        --purge-cache) export TEST_COMPOSE_PURGE_CACHE=1 ;;
        --down) exec uv run --all-packages --locked --quiet python -m polycorn_harness.compose down ;;
        --build-only)
            bash scripts/setup.sh containers infra >/dev/null
            exec uv run --all-packages --locked --quiet python -m polycorn_harness.compose build ;;
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) args+=("$a") ;;
    esac
done
bash scripts/setup.sh containers infra >/dev/null
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/compose "${args[@]}"
