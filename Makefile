# Entry points for developers and CI. `make` alone lists the targets.
# Everything that needs a machine-level tool gets it from `make setup`
# (scripts/setup.sh: Debian 12, root), which is quick when all is installed.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# rustup installs into ~/.cargo/bin, which a non-login shell (CI) may lack.
export PATH := $(or $(CARGO_HOME),$(HOME)/.cargo)/bin:$(PATH)

# The machine's compiler cache (sccache, `setup.sh buildcache`), shared by
# every clone: a fresh clone compiles only this repository's crates. Decided
# once, when the first make starts, and inherited by every make, script and
# cargo under it, so one run compiles either all with the cache or all
# without (a fresh machine's first make test installs it and compiles
# without). A RUSTC_WRAPPER of the caller's own wins; an empty one is none.
POLYCORN_CACHE_DIR := $(or $(POLYCORN_CACHE),/var/cache/polycorn)
export RUSTC_WRAPPER ?= $(wildcard $(POLYCORN_CACHE_DIR)/bin/sccache)
export SCCACHE_DIR ?= $(POLYCORN_CACHE_DIR)/sccache
export SCCACHE_CACHE_SIZE ?= 16G

SH_SCRIPTS := $(sort $(wildcard scripts/*.sh scripts/setup.d/*.sh testbed/*.sh testbed/*/*.sh testbed/*/*/*.sh services/*/*.sh)) .ci/run

# Integration tests need the namespace testbed (root) and the release
# binaries of this tree (make build; never stale ones).
define run_integration
	bash scripts/integration.sh
	bash scripts/integration-hsr.sh
	bash scripts/integration-telemetry.sh
endef

.PHONY: help setup build test check test-deep fuzz fuzz-smoke chaos chaos-smoke integration test-first-start lint-refs demo validate-platform lint-platform dashboards test-compose bench-dataplane bench-api bench-hsr bench-loop bench-ingest bench-matching bench-trainer bench-fleet bench-fleet-plane validate-tracegen bench-cc bench-emu bench-proxy-memory lint lint-rust lint-sh lint-py test-py test-py-bench test-py-services smoke-netns clean-testbed

help: ## list the targets
	@echo "Polycorn targets:"
	@awk -F':.*## ' '/^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: ## install/check system packages and the Rust toolchain (root, Debian 12)
	bash scripts/setup.sh

build: setup ## release build of the whole workspace
	$(CARGO) build --release --workspace --locked

# The stages of `make test`, `make check` and `make test-deep` are data in
# scripts/test_stages.py, which times each one, prints the table at the end
# and writes it to target/test-times.json (docs/testing.md). Run part of one
# with STAGES (only these) or SKIP: `make test STAGES=clippy,cargo-test`.
STAGES ?=
SKIP ?=
RUN_STAGES = python3 scripts/test_stages.py $(1) --only "$(STAGES)" --skip "$(SKIP)"

test: ## what CI runs (45 min on 2 cores): setup, static checks, one release build, unit and property tests, fuzz smoke, Python lint and tests, platform validation, the trace generator, integration suites, fault-campaign episodes, a first start, the compose fleet; per-stage times -> target/test-times.json
	$(call RUN_STAGES,test)

check: ## the inner loop before a commit (minutes on a warm build): fmt, feature check, clippy, unit tests, Python lint and tests
	$(call RUN_STAGES,check)

test-deep: ## what make test samples, at depth: property tests and virtual-time scenarios with many more cases, every fuzz target for minutes, the integration suites' full-length trips
	$(call RUN_STAGES,deep)

# Coverage-guided fuzzing (fuzz/, honggfuzz on the stable toolchain; its own
# lockfile, outside the workspace; docs/testing.md#fuzzing). The smoke run
# replays the committed corpus, its mutations and random inputs in a plain
# cargo test, then runs every target under honggfuzz for FUZZ_SMOKE_SECONDS.
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_SECONDS ?= 300
fuzz-smoke: ## fuzz targets on their corpus + random inputs (cargo test), then FUZZ_SMOKE_SECONDS (10) each under honggfuzz; fails on a crash
	bash scripts/setup.sh fuzz >/dev/null
	cd fuzz && $(CARGO) fmt --check && $(CARGO) test --release --locked
	python3 scripts/fuzz.py --seconds $(FUZZ_SMOKE_SECONDS) --json fuzz/hfuzz_workspace/smoke.json

fuzz: ## every fuzz target FUZZ_SECONDS (300) under honggfuzz -> bench/out/fuzz.json (execs, seconds, crashes, edges per target)
	bash scripts/setup.sh fuzz
	python3 scripts/fuzz.py --seconds $(FUZZ_SECONDS) --json bench/out/fuzz.json

# The randomized fault campaign (testbed/chaos; docs/testing.md#fault-campaign):
# one testbed (prefix ch) with its own PostgreSQL and Kafka (ports 25472 and
# 29142, state in /tmp/polycorn-infra-chaos), episode i drawn from seed
# CHAOS_SEED + i. A failing episode prints `make chaos CHAOS_SEED=<its seed>
# CHAOS_EPISODES=1`. chaos-smoke: the few fixed-seed episodes `make test` runs
# (prefix chs, ports 25482 and 29152: it can run beside a campaign).
CHAOS_EPISODES ?= 100
CHAOS_SEED ?= 1
chaos: build ## fault campaign: CHAOS_EPISODES (100) seeded episodes (kill/restart relay, proxy, Kafka, PostgreSQL, ingest, trainer; link flaps; spool disk full) under passenger downloads and chat, invariants judged -> bench/out/chaos.json; fails on a violation
	$(UVW) python -m polycorn_chaos --episodes $(CHAOS_EPISODES) --seed $(CHAOS_SEED) --out bench/out/chaos.json

chaos-smoke: build ## 3 fixed-seed fault-campaign episodes under pytest (in make test, ~3 min)
	$(UVW) pytest -q --durations=5 testbed/chaos/episodes

integration: build ## only the integration tests (integration.sh, integration-hsr.sh, integration-telemetry.sh)
	$(run_integration)

# PostgreSQL, Kafka and Prometheus started from nothing (own state directory
# and ports; the warm servers of scripts/infra.sh stay as they are), then the
# demo's fleet part on them: what a newcomer's first `make demo` meets.
test-first-start: build ## first start from wiped infra state: infra.sh up from nothing, then the demo's fleet part (~3 min)
	bash scripts/test-first-start.sh

# The workspace's Python itself (after a uv sync), not `uv run`, for the demo and
# bench-hsr: Ctrl-C or a SIGTERM must reach the orchestrator, which tears every
# topology down.
PYW := .venv/bin/python
demo: build ## end-to-end demo on the namespace testbed
	uv sync --all-packages --locked --quiet
	$(PYW) -m polycorn_benchrun.demo

bench-dataplane: build ## data-plane benchmark
	$(UVW) python -m polycorn_benchrun.dataplane

# testbed/tracegen/tools/validate_tracegen.py judges every §15.8 item against its tolerance
# and fails on a gating miss, a stale binary or a failed iperf3 run (root; ~12 min).
# VAL_PROFILE=ci is the subset `make test` runs (~2 min, output under /tmp); more knobs
# (VAL_*, read from the environment) in the script.
validate-tracegen: build ## HSR trace generator vs the published numbers (hsr-facts §15.8) with tolerances, pass/fail -> bench/out/tracegen-validation.{txt,json}, docs/hsr-model.md tables
	$(UVW) python testbed/tracegen/tools/validate_tracegen.py run

bench-cc: build ## the QUIC subflows' controller and its variants on generated trips in virtual time (seconds per trip, no root) -> bench/out/cc.json
	$(UV) python -m polycorn_bench.cc

bench-emu: build ## the link emulator's ceiling: 4 x 100 Mbit/s iperf3 through polycorn-emu -> bench/out/emu.json
	$(UVW) python -m polycorn_benchrun.emu

bench-proxy-memory: build ## the proxy at its connection cap: 300 slow readers against a 64 MiB budget in a 128 MiB pod (the chart's scaled by 4): refusals, budget peak, RSS (namespaces pcit-*) -> bench/out/proxy-memory.json
	start=$$(python3 testbed/harness/polycorn_harness/provenance.py start bench/out/proxy-memory.json) && \
	POLYCORN_BENCH_START="$$start" PROXY_MEMORY_JSON=$(CURDIR)/bench/out/proxy-memory.json \
		bash scripts/integration.sh -k "every_carriers_subflow_up or connection_cap"

bench-api: ## LinkDB API hot queries: BENCH_API_SIZES trains (40: 1M handovers), BENCH_API_RATES req/s (200) open loop, BENCH_API_REPEATS (3) -> bench/out/api.json
	bash scripts/setup.sh bench >/dev/null
	$(UVW) python -m polycorn_benchrun.api

PROFILE ?= short
bench-hsr: build ## every scheme side by side on emulated HSR trips (PROFILE=short|full|long; precision: hrsch vs minrtt only -> hsr-precision.json; recovery: failed-handover recovery alone -> hsr-recovery.json; costs: what a caught failure saves and a needless hold costs, on a development route -> hsr-costs.json; concurrency: 1, 10, 100 passengers at once -> hsr-concurrency.json; sweep: the memory budget on a development route -> hsr-sweep.json; transport, transport-unseen: TLS/TCP against QUIC subflows and direct TCP in a backlogged download; transport-bulk: their bulk downloads against the oracle, with kernel MPTCP and direct CUBIC -> hsr-transport*.json) -> bench/out/hsr.json
	uv sync --project bench --locked --quiet
	uv sync --all-packages --locked --quiet
	PROFILE=$(PROFILE) $(PYW) -m polycorn_benchrun.hsr

# Its profiles are report (the default here, whatever PROFILE says in this
# file) and ci (2 short trips, a smoke check): `make bench-loop PROFILE=ci`.
bench-loop: build ## the closed fleet loop: trips in turn, each with the table learned from the ones before (PROFILE=report|ci) -> bench/out/loop.json
	uv sync --project bench --locked --quiet
	PROFILE=$(if $(filter file default,$(origin PROFILE)),report,$(PROFILE)) $(UVW) python -m polycorn_benchrun.loop

# Against the real Kafka and PostGIS of scripts/infra.sh: a fresh database and
# topic; parameters and method in docs/ingest.md. INGEST_BENCH_ARGS="--replicas
# 1,2" compares 1 and 2 ingest replicas side by side (--repeats 3) instead.
INGEST_BENCH_ARGS ?=
bench-ingest: setup ## ingest throughput (events/s) and end-to-end lag, Kafka -> LinkDB -> bench/out/ingest.json; INGEST_BENCH_ARGS="--replicas 1,2": 1 vs 2 replicas as ratios -> bench/out/ingest-replicas.json
	bash scripts/infra.sh up pg kafka
	eval "$$(bash scripts/infra.sh env)" && uv run --all-packages --locked --quiet python -m polycorn_benchrun.ingest $(INGEST_BENCH_ARGS)

bench-matching: setup ## map matching cost per fix: batched vs per-train candidate search side by side -> bench/out/matching.json
	bash scripts/infra.sh up pg
	eval "$$(bash scripts/infra.sh env)" && uv run --all-packages --locked --quiet python -m polycorn_benchrun.matching --out bench/out/matching.json $(MATCHING_BENCH_ARGS)

# Against the same infra: generated fleets through Kafka and ingest into fresh
# databases, the trainer's validation on them, and the refit of 10,000 cells /
# 1M handovers timed (BENCH_TRAINER_SCALE=10x: 100,000 / 10M, the refit only);
# BENCH_TRAINER_REPEATS refits, BENCH_TRAINER_DB a scale database to reuse (or
# seed and keep); more knobs and the method in polycorn_benchrun.trainer_fleet
# and docs/benchmarks.md.
BENCH_TRAINER_SCALE ?= 1x
BENCH_TRAINER_REPEATS ?= 1
BENCH_TRAINER_DB ?=
bench-trainer: setup ## trainer: validation on generated fleets vs the paper, refit time and peak memory at 10k cells / 1M handovers -> bench/out/trainer.json; BENCH_TRAINER_SCALE=10x (100k / 10M -> trainer-10x.json), BENCH_TRAINER_REPEATS (1: refits, median [min, max]), BENCH_TRAINER_DB (a seeded database to reuse, or to seed and keep)
	bash scripts/infra.sh up pg kafka
	$(UVW) python -m polycorn_benchrun.trainer_fleet bench --scale $(BENCH_TRAINER_SCALE) \
		--repeats $(BENCH_TRAINER_REPEATS) $(if $(BENCH_TRAINER_DB),--db $(BENCH_TRAINER_DB))

# One cloud node under a fleet's load: a proxy per train as the
# chart runs them, real relays with passenger traffic, Kafka and ingest on the
# infra of scripts/infra.sh; per fleet size of FLEET_TRAINS, FLEET_SECONDS
# measured; FLEET_ARGS: more flags (python -m polycorn_benchrun.fleet --help), e.g.
# --sim for one polycorn-fleetsim process in place of a relay per train.
# Method: docs/benchmarks.md, "Fleet load".
FLEET_TRAINS ?= 10,25,50,100
FLEET_CONNS ?= 100
FLEET_SECONDS ?= 60
FLEET_REPEATS ?= 1
FLEET_ARGS ?=
bench-fleet: build ## fleet load: FLEET_TRAINS (10,25,50,100) trains x FLEET_CONNS (100) passenger connections, FLEET_SECONDS (60) each, FLEET_REPEATS (1) times interleaved -> bench/out/fleet.json (CPU and RSS per train, Kafka, ingest lag, trains per node with an interval)
	bash scripts/infra.sh up pg kafka
	eval "$$(bash scripts/infra.sh env)" && $(UVW) python -m polycorn_benchrun.fleet \
		--trains $(FLEET_TRAINS) --conns $(FLEET_CONNS) --seconds $(FLEET_SECONDS) \
		--repeats $(FLEET_REPEATS) $(FLEET_ARGS)

# The fleet's shared plane (Kafka, one ingest, PostgreSQL, the failure-table
# topic) at a thousand trains and more, without a proxy per train: one
# polycorn-fleetsim in its plane mode produces every train's records as its
# proxy would; per fleet size of PLANE_TRAINS, PLANE_REPEATS interleaved
# repeats of PLANE_SECONDS measured; PLANE_ARGS: more flags
# (python -m polycorn_benchrun.fleet_plane --help), e.g. --trains-per-client.
# Method: docs/benchmarks.md, "The shared plane at fleet scale".
PLANE_TRAINS ?= 250,500,1000,2000
PLANE_REPEATS ?= 2
PLANE_SECONDS ?= 60
PLANE_ARGS ?=
bench-fleet-plane: build ## the shared plane at fleet scale: PLANE_TRAINS (250..2000) simulated trains straight to Kafka, PLANE_REPEATS (2) x PLANE_SECONDS (60) -> bench/out/fleet-plane.json (Kafka, ingest, PostgreSQL CPU per train, ingest lag, table propagation)
	bash scripts/infra.sh up pg kafka
	eval "$$(bash scripts/infra.sh env)" && $(UVW) python -m polycorn_benchrun.fleet_plane \
		--trains $(PLANE_TRAINS) --repeats $(PLANE_REPEATS) --seconds $(PLANE_SECONDS) $(PLANE_ARGS)

# The platform: what cannot run here (Kubernetes, Envoy, Grafana)
# is checked with the strongest offline validator; docs/operations.md.
# It depends on build so that the chart's train-path check (the real relay
# and proxy behind the rendered SNI routes) runs instead of being skipped.
# The chart's suite runs in the workspace's environment: it parses every
# rendered command line with the services' own CLIs. KEEP=DIR keeps the
# rendered manifests in DIR.
validate-platform: build ## Helm chart (lint, template, strict schemas, Envoy protos, template tests), alert rules (promtool), dashboards (tsc) -> fails on any finding
	bash scripts/setup.sh chart >/dev/null
	$(UVW) pytest -p no:cacheprovider -rA --durations=10 tools/validate/validate_chart.py
	bash scripts/setup.sh observability >/dev/null
	$(UVW) pytest -p no:cacheprovider -rA --durations=10 testbed/harness/suites/observability
	$(MAKE) --no-print-directory lint-platform

# The validators' own code: tools/validate (a uv project of its own, in the
# venv that `setup.sh chart` keeps in the machine cache) and its Go programs.
VALIDATE_VENV = $${POLYCORN_CACHE:-/var/cache/polycorn}/validate-venv
GO_CACHE_ENV = GOPATH=$${POLYCORN_CACHE:-/var/cache/polycorn}/go GOMODCACHE=$${POLYCORN_CACHE:-/var/cache/polycorn}/go/pkg/mod GOCACHE=$${POLYCORN_CACHE:-/var/cache/polycorn}/go/build GOTOOLCHAIN=local GOFLAGS=-mod=readonly
GO ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
lint-platform: ## ruff + mypy --strict on tools/validate, gofmt + go vet on its Go validators
	bash scripts/setup.sh chart >/dev/null
	$(VALIDATE_VENV)/bin/ruff check tools/validate
	$(VALIDATE_VENV)/bin/ruff format --check tools/validate
	cd tools/validate && $(VALIDATE_VENV)/bin/mypy .
	for d in tools/validate/envoy tools/validate/monitoring; do \
		(cd $$d && out=$$($(dir $(GO))gofmt -l .) && test -z "$$out" || { echo "gofmt: $$out"; exit 1; }; \
		 $(GO_CACHE_ENV) $(GO) vet .) || exit 1; \
	done

dashboards: ## regenerate dashboards/*.json from dashboards/gen_dashboards.py
	python3 dashboards/gen_dashboards.py

# Builds every image from a local debootstrap base and runs docker-compose.yml
# for real through podman's Docker API; cleans up after itself.
# Last in make test: it leaves podman's storage and base images in the
# machine cache, nothing in the namespaces the other tests use.
test-compose: setup ## the docker-compose fleet-in-a-box, end to end on podman (root)
	bash scripts/test-compose.sh

lint: lint-rust lint-sh lint-py lint-refs ## all linters

lint-refs: ## nothing in the repository references files outside it, and every Markdown link leads somewhere (scripts/check_self_contained.py, check_doc_links.py)
	python3 scripts/check_self_contained.py
	python3 scripts/check_doc_links.py

# Python: the uv projects, each with its lockfile: bench/ (benchmark analysis)
# and the cloud services' workspace at the root (schema/, ingest/,
# linkdb-api/, trainer/, the fault campaign testbed/chaos/, the harness and the
# benchmark orchestrators bench/run/; uv.lock).
UV := uv run --project bench --locked --quiet
UVW := uv run --all-packages --locked --quiet
PY_WS := schema ingest linkdb-api trainer testbed/chaos testbed/harness bench/run
PY_SCRIPTS := $(wildcard scripts/*.py dashboards/*.py) $(addprefix testbed/tracegen/tools/,validate_tracegen.py fit_handover_loss.py)
lint-py: setup ## ruff (check + format) and mypy --strict on the Python code
	$(UV) ruff check --extend-exclude bench/run bench
	$(UV) ruff format --check --extend-exclude bench/run bench
	$(UV) mypy --config-file bench/pyproject.toml
	$(UVW) ruff check $(wildcard $(PY_WS)) $(PY_SCRIPTS)
	$(UVW) ruff format --check $(wildcard $(PY_WS)) $(PY_SCRIPTS)
	$(UVW) mypy $(wildcard $(PY_WS)) $(PY_SCRIPTS)

# The services' tests run against real PostgreSQL + PostGIS and Kafka, started
# (or reused) by scripts/infra.sh on loopback. PY_TESTS (default: every
# package's tests) less PY_TESTS_SKIP: make check runs parts side by side.
PY_TESTS ?= $(wildcard $(addsuffix /tests,$(PY_WS)))
PY_TESTS_SKIP ?=
test-py: test-py-bench test-py-services ## pytest of the Python code: bench analysis, and the services against real PostGIS and Kafka

test-py-bench: setup ## pytest of the benchmark analysis (bench/)
	$(UV) pytest -q --durations=5 bench/tests

test-py-services: setup ## pytest of the services' workspace against real PostGIS and Kafka (PY_TESTS, PY_TESTS_SKIP)
	bash scripts/infra.sh up pg kafka
	eval "$$(bash scripts/infra.sh env)" && $(UVW) pytest -q --durations=10 $(filter-out $(PY_TESTS_SKIP),$(PY_TESTS))

# clippy in the release profile: its build scripts and proc-macros are then
# the ones the release build uses, compiled once for both.
lint-rust: setup ## cargo fmt --check, the feature check, the image build's workspace members and clippy -D warnings
	$(CARGO) fmt --all --check
	python3 scripts/check_features.py
	python3 scripts/check_docker_context.py
	$(CARGO) clippy --release --workspace --all-targets --locked -- -D warnings

lint-sh: setup ## shellcheck every shell script
	shellcheck -x $(SH_SCRIPTS)

smoke-netns: setup ## self-test of the namespace testbed (not part of test)
	$(UVW) pytest -p no:cacheprovider -rA testbed/harness/suites/netns

clean-testbed: ## tear down the namespace testbed (PC_PREFIX, default pc)
	bash testbed/netns/down.sh
