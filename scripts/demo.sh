#!/usr/bin/env bash
# Placeholder: the end-to-end demo (passengers -> relay-agent -> carriers ->
# proxy -> origin on the namespace testbed) is not written yet. `make demo`
# runs this after setup and build; replace it with the real demo.
set -euo pipefail
echo "demo not implemented yet (scripts/demo.sh is a placeholder)" >&2
exit 1
