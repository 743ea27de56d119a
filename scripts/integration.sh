#!/usr/bin/env bash
# Integration tests of the data plane with real clients and servers that
# nobody here wrote: curl, nginx, dig, iperf3. A thin entry point of the
# harness suite testbed/harness/suites/pair (docs/testing.md, "Integration
# tests"): one relay/proxy pair on the bare namespace testbed, 31 checks, torn
# down whatever happens. Needs root.
#
# Env: PC_PREFIX (pcit), PC_CARRIERS (2; 1..8), CARRIER_MBIT (100: each
# carrier's capacity for the iperf3 checks), BIN (target/release, built when
# a binary is missing). Extra arguments go to pytest (e.g. -k socks).
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/pair "$@"
