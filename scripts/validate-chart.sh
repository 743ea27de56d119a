#!/usr/bin/env bash
# Offline validation of the Helm chart charts/polycorn (make validate-platform):
# for every scenario charts/polycorn/ci/*-values.yaml, helm lint --strict,
# helm template, kubeconform -strict, Envoy's bootstrap against Envoy's
# schemas, the Prometheus Operator's objects and their rules; then every
# rendered command line through the real CLIs, the train path end to end on
# loopback, the template unit tests, and a seeded error for each validator.
# A thin entry point of the harness suite testbed/harness/suites/chart (its
# docstring says more). Installs what it needs first through
# `scripts/setup.sh chart`. KEEP=DIR keeps the rendered manifests in DIR;
# extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh chart >/dev/null || { echo "validate-chart: setup.sh chart failed (run it to see why)" >&2; exit 1; }
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/chart "$@"
