#!/usr/bin/env bash
# Integration tests of the HSR testbed (the topology runner on emulated links,
# its teardown after a crash and after Ctrl-C, GPS-only placement, and
# `make bench-hsr` on its smallest profile): a thin entry point for the
# pytest suite testbed/harness/suites/hsr/test_hsr_testbed.py, which the harness
# (testbed/harness, docs/testing.md "The harness") drives, and the
# harness's example suite (telemetry to a real Kafka). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/hsr "$@"
