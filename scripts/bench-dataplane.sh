#!/usr/bin/env bash
# Placeholder: the data-plane benchmark (throughput and latency of the
# relay-agent/proxy pair over the namespace testbed, side by side with
# kernel MPTCP) is not written yet. `make bench-dataplane` runs this after
# setup and build; replace it with the real benchmark.
set -euo pipefail
echo "bench-dataplane not implemented yet (scripts/bench-dataplane.sh is a placeholder)" >&2
exit 1
