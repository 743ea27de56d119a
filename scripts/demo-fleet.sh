#!/usr/bin/env bash
# The fleet half of the demo: one emulated trip's telemetry through the whole
# cloud side, with real services.
#
#   relay-agent (radio replay, durable spool) -> 2 emulated carriers -> proxy
#   -> Kafka -> polycorn-ingest -> LinkDB (PostgreSQL + PostGIS) -> linkdb-api
#                                          -> polycorn-trainer -> Kafka -> proxy
#
# First the fleet's history: DEMO_HISTORY_TRIPS (12) earlier trips of the same
# route go through Kafka and ingest into a fresh LinkDB
# (scripts/trainer_fleet.py load), and the trainer service learns from them
# and publishes failure-location table v1 to a compacted topic. Then the live
# trip: the proxy (hrsch) reads the table from the topic at start and
# hot-reloads every later version; a passenger downloads through the train;
# the trip's telemetry lands in LinkDB and the trainer's next run learns from
# it too. At the end the LinkDB API says what the fleet knows: the train, its
# handovers, the cells where handovers failed, the trainer's validation and
# the table the proxy used. Tables are signed as in a deployment: the
# trainer signs each with a key of `polycorn-pki table-key`, and the proxy
# takes only tables that key's public half verifies
# (--failure-table-verify-key). Run by scripts/demo.sh (make demo) after the
# side-by-side scheduler comparison; DEMO_TRIP_S sets the trip length (120),
# DEMO_HISTORY_TRIPS the history (24), DEMO_API_PORT the API's port (18080).
# A thin entry point of scripts/demo_fleet.py, which does all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
uv sync --all-packages --locked --quiet
exec .venv/bin/python scripts/demo_fleet.py "$@"
