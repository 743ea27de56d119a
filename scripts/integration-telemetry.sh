#!/usr/bin/env bash
# End-to-end test of the fleet telemetry path on a testbed trip, with real
# Kafka and real PostgreSQL + PostGIS of its own (restarted during the trip,
# wiped at the end):
#
#   relay (replay source, durable spool) -> emulated carriers -> proxy
#   -> Kafka (idempotent producer, ack after Kafka) -> polycorn-ingest -> LinkDB
#
# Kafka, PostgreSQL and the relay restarted and every path dark for 60 s while
# the trip runs; every handover event and GPS fix in LinkDB exactly once after;
# the trainer's signed table loaded by the running proxy; the Kafka-dependent
# Rust tests (`cargo test -- --ignored`); the alert rules and dashboards
# against the running services. A thin entry point of the harness suite
# testbed/harness/suites/telemetry (docs/testing.md, item 8). Needs root.
#
# Env: TRIP_S (200, 300 under make test-deep; the fault times scale with it), E2E_INFRA_DIR,
# E2E_PG_PORT, E2E_KAFKA_PORT, E2E_PROM_PORT (its servers),
# OBSERVABILITY_UPDATE_FIXTURES=1 (refresh the committed /metrics dumps),
# KEEP_WORK=1 (keep the work directory). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --all-packages --locked --quiet pytest -p no:cacheprovider -rA --durations=10 \
    testbed/harness/suites/telemetry "$@"
