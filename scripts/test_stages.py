#!/usr/bin/env python3
"""Runs `make test`, `make check` and `make test-deep` as named stages.

    test_stages.py [PLAN] [--only A,B] [--skip A,B] [--list] [--times FILE]

A plan is a list of steps; a step is one stage, or several that share no
state and so run at the same time (their output prefixed with the stage's
name). Every stage's output is also kept whole in target/test-logs/STAGE.log. Steps run in order and
the first failure stops the plan; the other stages of its step are stopped
with SIGINT, so that they tear down what they started.

At the end (also after a failure or Ctrl-C) it prints every stage's wall
time and writes them to target/test-times.json, and after that, for each
stage that failed, the lines of its log that name what failed (pytest's and
cargo's failure lines, then the log's last lines): a CI that keeps only the
end of the output still says which test failed.

    {"plan", "commit", "clean_tree", "ok", "stages": [{"name", "seconds", "status",
     "started_s"}...], "total_seconds"}

Standard library only: the first stage installs everything else.
"""

# ruff: noqa: S603, S607  (runs bash and the project's own commands)
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "target"
LOGS = TARGET / "test-logs"


@dataclass(frozen=True)
class Stage:
    name: str
    #: A bash command line, run from the repository root.
    command: str


# The cargo invocations of every plan share one set of features and one
# profile, so that nothing is compiled twice (docs/testing.md, "Compile once").
CARGO_BUILD = "$CARGO build --release --workspace --all-targets --locked"
CARGO_CLIPPY = "$CARGO clippy --release --workspace --all-targets --locked -- -D warnings"
CARGO_TEST = "$CARGO test --release --workspace --locked"

# Everything the stages install, up front and in one process: stages that
# run side by side must not both run apt-get, or both create the Python
# environments.
UV_SYNC = "uv sync --all-packages --locked --quiet && uv sync --project bench --locked --quiet"
SETUP = Stage(
    "setup",
    f"bash scripts/setup.sh && bash scripts/setup.sh fuzz chart observability containers buildcache"
    f" && {UV_SYNC}",
)
#: make check needs no fuzzer, chart tools or containers.
SETUP_CHECK = Stage("setup", f"bash scripts/setup.sh && {UV_SYNC}")
STATIC = Stage(
    "static",
    "python3 scripts/check_self_contained.py && python3 scripts/check_doc_links.py"
    " && python3 scripts/check_bench_provenance.py"
    " && $CARGO fmt --all --check"
    " && python3 scripts/check_features.py"
    " && python3 scripts/check_docker_context.py",
)
CLIPPY = Stage("clippy", CARGO_CLIPPY)
BUILD = Stage("build", CARGO_BUILD)
UNIT = Stage("cargo-test", CARGO_TEST)
LINT_PY = Stage("lint-py", "make --no-print-directory lint-py")
# The Python tests mostly wait (for Kafka, PostgreSQL, timeouts), so they run
# in four parts side by side; each test makes its own databases and topics.
TEST_PY_PARTS = (
    Stage("test-py-bench", "make --no-print-directory test-py-bench"),
    Stage("test-py-ingest", "make --no-print-directory test-py-services PY_TESTS=ingest/tests"),
    Stage(
        "test-py-benchrun",
        "make --no-print-directory test-py-services PY_TESTS=bench/run/tests",
    ),
    Stage(
        "test-py-services",
        "make --no-print-directory test-py-services PY_TESTS_SKIP='ingest/tests bench/run/tests'",
    ),
)
# `-o build`: the build stage has built everything; a second cargo would
# only wait for the lock of a neighbour's cargo.
PLATFORM = Stage("validate-platform", "make --no-print-directory -o build validate-platform")
TRACEGEN = Stage("validate-tracegen", "make --no-print-directory validate-tracegen VAL_PROFILE=ci")
PAIR = Stage("integration-pair", "bash scripts/integration.sh")
# The HSR suite in two halves that run side by side: the topology tests
# (namespaces pcith*) and the two runs of bench-hsr (hbit*). The GPS test
# compares three topologies of its own with one another, and bench-hsr's ci
# profile checks that every phase works, not how fast: neither is disturbed
# by the other's load.
HSR = Stage("integration-hsr", "bash scripts/integration-hsr.sh -k 'not bench_hsr'")
HSR_BENCH = Stage("integration-hsr-bench", "bash scripts/integration-hsr.sh -k bench_hsr")
TELEMETRY = Stage("integration-telemetry", "bash scripts/integration-telemetry.sh")
CHAOS = Stage("chaos-smoke", "make --no-print-directory -o build chaos-smoke")
FIRST_START = Stage("first-start", "bash scripts/test-first-start.sh")
COMPOSE = Stage("compose", "bash scripts/test-compose.sh")
# The compose fleet's images, built ahead of the suite beside the HSR suites,
# which mostly wait on wall-clock trips; niced, so that the trips' emulator,
# relay and proxy come first. The compose stage then finds every layer cached.
COMPOSE_IMAGES = Stage("compose-images", "nice -n 19 bash scripts/test-compose.sh --build-only")
FUZZ = Stage("fuzz-smoke", "make --no-print-directory fuzz-smoke")

Step = tuple[Stage, ...]

#: How much deeper `make test-deep` goes (docs/testing.md, "make test-deep"):
#: property tests run this many times their cases, the integration suites
#: their full-length trips (polycorn_harness.DEEP).
DEPTH = 20
DEEP_FUZZ_SECONDS = 120

PLANS: dict[str, list[Step]] = {
    # What CI runs. The cheap checks come first, so that a typo fails in
    # seconds; docs/testing.md says what each stage checks.
    "test": [
        (SETUP,),
        (STATIC,),
        (CLIPPY,),
        (BUILD,),
        (UNIT,),
        # Side by side: each is mostly one process on one core (the fuzz
        # build, two), and none shares state with another: the Python tests
        # use the servers of scripts/infra.sh, the platform checks their own
        # Prometheus, the fuzz targets their own workspace.
        (FUZZ, LINT_PY, *TEST_PY_PARTS, PLATFORM),
        (TRACEGEN,),
        (PAIR,),
        (HSR, HSR_BENCH, COMPOSE_IMAGES),
        # Side by side: correctness checks on wall-clock trips, each on its
        # own namespaces (prefixes pcite, chs, hf) and its own PostgreSQL and
        # Kafka (ports 25442/29102, 25482/29152, 25452/29122).
        (TELEMETRY, CHAOS, FIRST_START),
        (COMPOSE,),
    ],
    # The inner loop before a commit: no testbed, no containers.
    "check": [
        (SETUP_CHECK,),
        (STATIC,),
        # The Python side needs nothing of the Rust build, and on a warm
        # build the Rust side is mostly cargo finding nothing to do.
        (
            Stage("rust", f"{CARGO_CLIPPY} && {CARGO_BUILD} && {CARGO_TEST}"),
            LINT_PY,
            *TEST_PY_PARTS,
        ),
    ],
    # What `make test` samples, at depth. The stages that do not sample
    # (static checks, platform validation, the compose fleet) stay in
    # `make test` only.
    "deep": [
        (SETUP,),
        (BUILD,),
        (Stage("cargo-test", f"POLYCORN_TEST_DEPTH={DEPTH} {CARGO_TEST}"),),
        (
            Stage(
                "fuzz",
                f"make --no-print-directory fuzz-smoke FUZZ_SMOKE_SECONDS={DEEP_FUZZ_SECONDS}",
            ),
        ),
        (Stage("integration-hsr", f"POLYCORN_TEST_DEPTH={DEPTH} bash scripts/integration-hsr.sh"),),
        (
            Stage(
                "integration-telemetry",
                f"POLYCORN_TEST_DEPTH={DEPTH} bash scripts/integration-telemetry.sh",
            ),
        ),
    ],
}


#: How long a stage stopped because its neighbour failed may take to tear
#: down (the suites remove namespaces and servers) before it is killed.
STOP_GRACE_S = 300


@dataclass
class Result:
    name: str
    status: str = "not run"
    started_s: float = 0.0
    seconds: float = 0.0


class Runner:
    def __init__(self) -> None:
        self.running: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()
        self.interrupted = False

    def stop_all(self, sig: int = signal.SIGINT) -> None:
        with self.lock:
            for p in self.running:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)

    def start(self, stage: Stage) -> subprocess.Popen[bytes]:
        env = {**os.environ, "CARGO": os.environ.get("CARGO", "cargo")}
        # Its own process group: a failing neighbour's SIGINT reaches the
        # whole stage (make, pytest, the processes they started) and no one else.
        p = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", stage.command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self.lock:
            self.running.append(p)
        return p

    def run_step(self, step: Step, t0: float, results: dict[str, Result]) -> bool:
        prefixed = len(step) > 1
        procs: list[tuple[Stage, subprocess.Popen[bytes], threading.Thread | None]] = []
        for stage in step:
            r = results[stage.name]
            r.started_s = time.monotonic() - t0
            r.status = "running"
            print(f"=== {stage.name}: {stage.command}", flush=True)
            p = self.start(stage)
            pump = None
            if p.stdout is not None:
                pump = threading.Thread(
                    target=_pump, args=(stage.name, p.stdout, prefixed), daemon=True
                )
                pump.start()
            procs.append((stage, p, pump))
        ok = True
        stopped_at: float | None = None
        pending = list(procs)
        while pending:
            for item in list(pending):
                stage, p, pump = item
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(item)
                if pump is not None:
                    # A process the stage left in the background may hold the
                    # pipe open; its output after the stage ended is not waited for.
                    pump.join(timeout=5)
                r = results[stage.name]
                r.seconds = time.monotonic() - t0 - r.started_s
                if rc == 0:
                    r.status = "ok"
                elif self.interrupted:
                    r.status = "interrupted"
                else:
                    r.status = "stopped" if stopped_at is not None else "failed"
                print(f"=== {stage.name}: {r.status} in {r.seconds:.0f} s", flush=True)
                if rc != 0 and ok:
                    ok = False
                    if pending:
                        names = ", ".join(st.name for st, _, _ in pending)
                        print(f"=== stopping {names} (SIGINT: they tear down)", flush=True)
                        self.stop_all()
                        stopped_at = time.monotonic()
            if stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                self.stop_all(signal.SIGKILL)
            time.sleep(0.2)
        with self.lock:
            self.running.clear()
        return ok


def _pump(name: str, stream: IO[bytes], prefixed: bool) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    prefix = f"[{name}] ".encode() if prefixed else b""
    with (LOGS / f"{name}.log").open("wb") as log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.buffer.flush()


# Lines that name a failure: pytest's short summary, cargo test's failed
# tests and panics, make's and the stage runner's own verdicts.
FAILURE_MARKS = (
    "FAILED ",
    "ERROR ",
    "panicked at",
    "test result: FAILED",
    "failures:",
    "error:",
    "Error ",
    "Traceback",
)
DIGEST_MATCHES = 20
DIGEST_TAIL = 12


def failure_digest(log: Path) -> list[str]:
    """The lines of a failed stage's log that say what failed: those with a
    failure mark (at most DIGEST_MATCHES, the last ones), then its last
    DIGEST_TAIL lines, without repeating a line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return [f"(no log at {log})"]
    tail_start = max(0, len(lines) - DIGEST_TAIL)
    marked = [i for i in range(tail_start) if any(m in lines[i] for m in FAILURE_MARKS)]
    keep = marked[-DIGEST_MATCHES:] + list(range(tail_start, len(lines)))
    return [lines[i][:300] for i in keep]


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def clean_tree() -> bool | None:
    """Whether the working tree has no change (nothing tracked or untracked)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() == ""


def select(plan: list[Step], only: set[str], skip: set[str]) -> list[Step]:
    known = {st.name for step in plan for st in step}
    unknown = (only | skip) - known
    if unknown:
        names = ", ".join(sorted(unknown))
        sys.exit(f"test_stages: no stage named {names}; known: {', '.join(sorted(known))}")
    out = []
    for step in plan:
        kept = tuple(st for st in step if (not only or st.name in only) and st.name not in skip)
        if kept:
            out.append(kept)
    return out


def report(plan_name: str, results: list[Result], total: float, ok: bool, out: Path) -> None:
    width = max(len(r.name) for r in results)
    print(f"\n{'stage':<{width}}  {'start':>7}  {'seconds':>7}  status")
    for r in results:
        start = f"{r.started_s:7.0f}" if r.status != "not run" else " " * 7
        print(f"{r.name:<{width}}  {start}  {r.seconds:7.0f}  {r.status}")
    print(f"{'total':<{width}}  {'':>7}  {total:7.0f}  {'ok' if ok else 'FAILED'}")
    doc = {
        "plan": plan_name,
        "commit": commit(),
        "clean_tree": clean_tree(),
        "ok": ok,
        "stages": [
            {
                "name": r.name,
                "seconds": round(r.seconds, 1),
                "status": r.status,
                "started_s": round(r.started_s, 1),
            }
            for r in results
        ],
        "total_seconds": round(total, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"stage times: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    for r in results:
        if r.status == "failed":
            print(f"\n=== {r.name} failed; from target/test-logs/{r.name}.log:")
            for line in failure_digest(LOGS / f"{r.name}.log"):
                print(f"  {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("plan", nargs="?", default="test", choices=sorted(PLANS))
    ap.add_argument("--only", default="", help="comma-separated stages to run (the rest skipped)")
    ap.add_argument("--skip", default="", help="comma-separated stages to skip")
    ap.add_argument("--list", action="store_true", help="print the plan's steps and exit")
    ap.add_argument("--times", type=Path, default=TARGET / "test-times.json")
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    skip = {x for x in args.skip.split(",") if x}
    plan = select(PLANS[args.plan], only, skip)
    if args.list:
        for step in plan:
            print(" + ".join(f"{st.name} ({st.command})" for st in step))
        return 0

    runner = Runner()
    results = {st.name: Result(st.name) for step in plan for st in step}

    def on_signal(signum: int, _frame: object) -> None:
        runner.interrupted = True
        runner.stop_all(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    t0 = time.monotonic()
    ok = True
    for step in plan:
        if not runner.run_step(step, t0, results) or runner.interrupted:
            ok = False
            break
    report(args.plan, list(results.values()), time.monotonic() - t0, ok, args.times)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
