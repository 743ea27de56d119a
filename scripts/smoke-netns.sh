#!/usr/bin/env bash
# End-to-end check of the namespace testbed itself (not of Polycorn): builds
# the topology and the origin, checks every property the integration tests
# rely on, tears it all down and checks nothing is left behind. A thin entry
# point of the harness suite testbed/harness/suites/netns. Uses its own
# PC_PREFIX (default "pcsmoke") so that it never tears down a topology a demo
# or test run is using. Needs root. About 15 s.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "smoke-netns: must run as root (network namespaces)" >&2; exit 1; }
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA \
    testbed/harness/suites/netns "$@"
