#!/usr/bin/env bash
# Offline validation of the observability files (part of make
# validate-platform): the alert rules (promtool check and test, labels,
# annotations, runbooks), the compose scrape config, the dashboards
# (generated and not stale, tsc --strict against @grafana/schema, structure,
# provisioned datasources), every PromQL expression against the services'
# /metrics dumps and on a real Prometheus scraping them; then each validator
# fed a seeded error. A thin entry point of the harness suite
# testbed/harness/suites/observability (its docstring says more). Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh observability >/dev/null
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/observability "$@"
