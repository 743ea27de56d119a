#!/usr/bin/env bash
# A newcomer's first run, in make test: PostgreSQL, Kafka and Prometheus start
# from nothing, clients started before their servers wait through the
# start-up, then the demo's fleet part runs on the new servers. A thin entry
# point of the harness suite testbed/harness/suites/first_start (its
# docstring says what and why); -x: the steps depend on each other. Own
# ports and state, wiped at the end, also on failure.
#
# Env: FIRST_START_PG_PORT (25452), FIRST_START_KAFKA_PORT (29122),
# FIRST_START_PROM_PORT (29120), FIRST_START_TRIP_S (60),
# FIRST_START_HISTORY_TRIPS (2). Needs root (namespaces) and the release
# binaries (make build). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --all-packages --locked --quiet pytest -x -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/first_start "$@"
