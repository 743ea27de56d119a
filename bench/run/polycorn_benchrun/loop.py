"""make bench-loop: the closed fleet loop on the testbed, trip after trip, and
its learning curve.

    PROFILE=report|ci python -m polycorn_benchrun.loop

N trips of the same route, one after the other, by several trains in turn
(report: 4 trains, 8 passes each, train k mod 4 on trip k; each its own
train id and certificate). Each trip runs four copies
of the topology side by side (the harness's
:class:`~polycorn_harness.topology.Topology` over testbed/topology.sh, prefixes
hl0..hl3, one wall-clock epoch, so all see the same link realisation), with the same
load plan as make bench-hsr (bulk downloads, then a backlogged download
for the recovery after failed handovers):

  hrsch-learned  hrsch with the table the trainer learned from the trips
                 and signed (a `polycorn-pki table-key` pair made per run:
                 the trainer's --table-signing-key, this copy's relay and
                 proxy --failure-table-verify-key, as deployed)
                 before this one (trip 1: none, LinkDB is empty). Its proxy
                 reads it from Kafka (--failure-table-topic, the compacted
                 topic, at start and hot-reloaded); its relay gets the same
                 table as a file, from LinkDB's failure_tables. It is the
                 only copy whose proxy produces telemetry: relay -> proxy ->
                 Kafka -> polycorn-ingest -> LinkDB, with a stable train id,
                 so LinkDB receives each trip exactly once, by the real path.
  minrtt         the reference of every ratio.
  hrsch-none     hrsch without a table (what the learned copy is on trip 1).
  hrsch-truth    hrsch with the oracle table: every cell where this very
                 trip fails (polycorn-tracegen failure-table --min-failures 1
                 --min-failure-rate 0), the upper bound of what a table can do.

During the whole run `polycorn-trainer follow` (the fleet's follower, every
5 s) refits the cells of new failures and publishes a new table version as
soon as an entry appears, leaves or moves; the learned copy's proxy takes it
from the topic mid-trip, and the loop records when (every second, its
table version: table-timeline.jsonl per trip). After each trip: wait for
the relay's spool to drain and for ingest to have loaded the trip's
handovers (LinkDB against the event log, both reported), then
`polycorn-trainer run --once` (the periodic refit, the authority) fits,
validates, stores the model and publishes the next table (failure_tables +
Kafka). At the end every published table version is kept (tables.jsonl:
version, when LinkDB stored it, its cells), for the delay from a failure to
the table that carries it.

Its own infrastructure (harness ``infra``: scripts/infra.sh with POLYCORN_INFRA_DIR
/tmp/polycorn-infra-loop, PostgreSQL 25452, Kafka 29112, Prometheus port
29120), wiped at the start and at the end: a fresh LinkDB and fresh topics
every run. The default instance (25432/29092) is never touched.

Seeds: route 7 (the reported route), trip seeds 2001.. (ci: 2103..;
bench-hsr measures 1001.. and builds its stand-in table from 901..;
development uses route 1).

Profiles: report, 32 trips of 263 s by 4 trains, meant to be left running:
about 2.5 h (4.5-4.7 min per trip: the trip, bringing four topologies up and
down, ingest and the trainer); ci, 2 short trips by 2 trains, about 4 min.
The analysis plots each trip and the curves pooled over trips 1..k and the
last 8 trips (docs/benchmarks.md).

Environment: PROFILE (report, default, or ci: 2 short trips), LOOP_TRIPS
(trips; report 32, ci 2), LOOP_TRAINS (trains taking turns; report 4, ci 2;
1: a line served by one train), LOOP_FOLLOW (1, default: the follower runs;
0: only the refit after each trip), BIN (binaries, default target/release),
BENCH_PREFIX (topology prefix, default hl), BENCH_WORK (raw runs, default
/tmp/polycorn-bench-loop), BENCH_OUT (default bench/out; ci: under
BENCH_WORK), PLOTS (default docs/img/loop; ci: under BENCH_WORK),
LOOP_TABLE_SOURCE (topic, default: the learned proxy reads Kafka; file:
relay and proxy get the LinkDB table as a file, for a proxy without
--failure-table-topic), LOOP_INGEST_METRICS (ingest's metrics address,
default 127.0.0.1:9482). ROUTE_SEED / TRIP_SEED_BASE make a diagnostic run
(results under BENCH_WORK/out only), as do TRACEGEN_PRESET (default
pc-gateway-300) and PC_EMU_LOSS_KEYING (the emulator's --loss-keying;
results from before 2026-11-26: pc-gateway-300-v1 and packet).
LOOP_POSITIONS=gps (diagnostic) runs the loop on GPS alone, as a
real train would: the route's line (the generator's route.geojson) is
imported into LinkDB before trip 1, every relay replays GPS fixes without
track_m (--replay-gps-only), ingest map-matches them onto the route, the
trainer learns on the matched measures and puts the route in its tables,
and the proxies place the trains by matching their fixes onto it (the
oracle table carries the route too: failure-table --route).
Ctrl-C or any failure tears every topology, ingest and the infrastructure
down. Needs root (network namespaces) and the release binaries (make build).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, VENV, infra, metrics, provenance
from polycorn_harness.process import now_ms, stop_process
from polycorn_harness.topology import (
    BINARIES,
    PROXY_METRICS,
    RELAY_METRICS,
    Topology,
    run,
    scrape,
)
from polycorn_harness.trip import Expected
from polycorn_harness.wait import WaitTimeoutError, wait_until
from polycorn_schema.startup import pg_connect

LOAD_SEED = 424242
CARRIERS = 2
ORIGIN = "10.99.0.10"
TRAIN = "train-loop"
TABLE_TOPIC = "polycorn.failure-tables.v1"
VARIANTS = ("hrsch-learned", "minrtt", "hrsch-none", "hrsch-truth")
LEARNED = 0  # the copy on the real telemetry path
N_SIZES = 3
NOMINAL_WARMUP_S = 30
BACKLOG_PATH = "/files/100MiB.bin"
BACKLOG_SIZE = 104857600
TRIP_SPACING_S = 10
INFRA = {
    "POLYCORN_INFRA_DIR": "/tmp/polycorn-infra-loop",
    "POLYCORN_PG_PORT": "25452",
    "POLYCORN_KAFKA_PORT": "29112",
    "POLYCORN_PROM_PORT": "29120",
}
#: Per profile: trips, trains, downloads per size, slot seconds, backlog seconds, seed
#: base. ci: trip seeds 2103-2104, whose first 73 s have a failed handover each (failure
#: model v2), so that trip 2 runs with a learned table. report: 32 trips (seeds
#: 2001-2032) by 4 trains taking turns, 8 passes each, about 2.5 h.
PROFILES = {
    "ci": {
        "trips": 2, "trains": 2, "per_size": 1, "slot_s": 6, "backlog_s": 20, "seed_base": 2102,
    },
    "report": {
        "trips": 32, "trains": 4, "per_size": 3, "slot_s": 12, "backlog_s": 120,
        "seed_base": 2000,
    },
}  # fmt: skip
#: The follower's metrics (polycorn_trainer_follow_*), kept at the end of the run.
FOLLOW_METRICS = "127.0.0.1:9483"
FOLLOW_POLL_S = 5
DIAGNOSTIC_VARS = (
    "ROUTE_SEED",
    "LOOP_TRAINS",
    "LOOP_FOLLOW",
    "TRIP_SEED_BASE",
    "LOOP_TABLE_SOURCE",
    "LOOP_ALLOW_NO_TRAINER",
    "LOOP_TRAINER_ARGS",
    "TRACEGEN_PRESET",
    "PC_EMU_LOSS_KEYING",
    "LOOP_POSITIONS",
)


class LoopError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%T')}] bench-loop: {msg}", file=sys.stderr, flush=True)


@dataclass
class Settings:
    profile: str
    diagnostic: bool
    bin: Path
    work: Path
    out: Path
    plots: Path
    route_seed: int
    preset: str
    table_source: str
    positions: str
    trainer_args: list[str]
    trains: int
    follow: bool
    ingest_metrics: str
    prefix: str
    trips: int
    per_size: int
    slot_s: int
    backlog_s: int
    trip_seed_base: int

    @property
    def bulk_s(self) -> int:
        return self.per_size * N_SIZES * self.slot_s

    @property
    def trip_s(self) -> int:
        # The backlog window ends 5 s before the trip does whatever the real warm-up
        # took, so the relay replays the whole event log before teardown.
        return NOMINAL_WARMUP_S + self.bulk_s + self.backlog_s + 5

    @classmethod
    def from_env(cls) -> Settings:
        e = os.environ.get
        profile = e("PROFILE", "report")
        if profile not in PROFILES:
            raise LoopError(f"PROFILE must be report or ci, got {profile!r}")
        p = PROFILES[profile]
        diagnostic = any(e(v) for v in DIAGNOSTIC_VARS)
        work = Path(e("BENCH_WORK", "/tmp/polycorn-bench-loop"))
        if profile == "ci" or diagnostic:
            out = Path(e("BENCH_OUT", str(work / "out")))
            plots = Path(e("PLOTS", str(out / f"plots-{profile}")))
        else:
            out = Path(e("BENCH_OUT", str(ROOT / "bench" / "out")))
            plots = Path(e("PLOTS", str(ROOT / "docs" / "img" / "loop")))
        s = cls(
            profile=profile,
            diagnostic=diagnostic,
            bin=Path(e("BIN", str(ROOT / "target" / "release"))),
            work=work,
            out=out,
            plots=plots,
            route_seed=_nonneg("ROUTE_SEED", e("ROUTE_SEED", "7")),
            preset=e("TRACEGEN_PRESET", "pc-gateway-300"),
            table_source=e("LOOP_TABLE_SOURCE", "topic"),
            positions=e("LOOP_POSITIONS", "track"),
            trainer_args=[],
            trains=int(p["trains"]),
            follow=e("LOOP_FOLLOW", "1") != "0",
            ingest_metrics=e("LOOP_INGEST_METRICS", "127.0.0.1:9482"),
            prefix=e("BENCH_PREFIX", "hl"),
            trips=int(p["trips"]),
            per_size=int(p["per_size"]),
            slot_s=int(p["slot_s"]),
            backlog_s=int(p["backlog_s"]),
            trip_seed_base=_nonneg("TRIP_SEED_BASE", e("TRIP_SEED_BASE", str(p["seed_base"]))),
        )
        trips = e("LOOP_TRIPS")
        if trips is not None:
            if not re.fullmatch(r"[1-9][0-9]*", trips):
                raise LoopError(f"LOOP_TRIPS must be a positive integer, got {trips!r}")
            s.trips = int(trips)
        trains = e("LOOP_TRAINS")
        if trains is not None:
            if not re.fullmatch(r"[1-9][0-9]?", trains):
                raise LoopError(f"LOOP_TRAINS must be an integer from 1 to 99, got {trains!r}")
            s.trains = int(trains)
        if e("LOOP_FOLLOW", "1") not in ("0", "1"):
            raise LoopError(f"LOOP_FOLLOW must be 0 or 1, got {e('LOOP_FOLLOW')!r}")
        s.trainer_args = shlex.split(e("LOOP_TRAINER_ARGS") or default_trainer_args(s))
        if s.table_source not in ("topic", "file"):
            raise LoopError(f"LOOP_TABLE_SOURCE must be topic or file, got {s.table_source!r}")
        if s.positions not in ("track", "gps"):
            raise LoopError(f"LOOP_POSITIONS must be track or gps, got {s.positions!r}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", s.prefix):
            raise LoopError(f"BENCH_PREFIX must be 1-8 lower-case letters/digits: {s.prefix!r}")
        return s


def default_trainer_args(s: Settings) -> str:
    """The trainer's table thresholds. Over a handful of trips few cells reach the
    default 3 failures: 2 are enough here with several trains, 1 with one (or in the
    ci profile's two short trips); the 20 % share stays. Several trains keep the fleet's
    rule that a cell enters on failures from 2 of them (docs/trainer.md); one train's
    failures must be enough when it is alone (--min-trains 1)."""
    if s.trains == 1 or s.profile == "ci":
        return "--min-failures 1 --min-trains 1"
    return "--min-failures 2 --min-trains 2"


def train_of(s: Settings, k: int) -> str:
    """The train of trip ``k`` (1-based): the trains take turns."""
    return TRAIN if s.trains == 1 else f"{TRAIN}-{(k - 1) % s.trains + 1}"


def _nonneg(name: str, v: str) -> int:
    if not v.isdigit():
        raise LoopError(f"{name} must be a non-negative integer, got {v!r}")
    return int(v)


class Loop:
    def __init__(self, s: Settings, env: dict[str, str], run_dir: Path) -> None:
        self.s, self.env, self.run = s, env, run_dir
        self.db = env["POLYCORN_DATABASE_URL"]
        self.kafka_port = int(env["POLYCORN_KAFKA_PORT"])
        self.table_key = run_dir / "table-key"
        self.verify = f"--failure-table-verify-key={self.table_key}/table-signing.pub"
        self.have_trainer = True
        self.handovers_want = 0
        self.last_trip_end_ms = 0
        self.trip_ids: list[str] = []
        #: The train of the trip in progress (its relays' and proxies' train id).
        self.train_id = train_of(s, 1)

    def topology(self, i: int, trip: Path) -> Topology:
        return Topology(f"{self.s.prefix}{i}", trip, self.s.bin, {"TRAIN_ID": self.train_id})

    def all_down(self, trip: Path) -> None:
        threads = [
            threading.Thread(target=self.topology(i, trip).down) for i in range(len(VARIANTS))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def sql(self, q: str) -> list[tuple[Any, ...]]:
        with pg_connect(self.db) as c:
            return list(c.execute(q).fetchall())

    def latest_table(self, out: Path) -> tuple[int, int] | None:
        """The newest published table into ``out``, exactly the bytes the trainer signed,
        and its signature into ``out.sig``; (version, entries), or None."""
        rows = self.sql(
            "select version, entries, encode(body_bytes, 'base64'), signature "
            "from failure_tables order by version desc limit 1"
        )
        if not rows:
            return None
        version, entries, body, sig = rows[0]
        if not body or not sig:
            raise LoopError("the latest table in LinkDB has no stored bytes or no signature")
        out.write_bytes(base64.b64decode(body))
        Path(f"{out}.sig").write_text(f"{sig}\n")
        return int(version), int(entries)

    def db_handovers(self) -> int:
        """Handovers in LinkDB: the loop's trains are its only source."""
        n = self.sql("select count(*) from handovers")[0][0]
        return int(n)

    def wait_ingest(self, want: int) -> int:
        """Until LinkDB holds ``want`` handovers of the train, or the count stops
        growing for 30 s (at most 120 s); the count."""
        seen = {"n": -1, "since": time.monotonic()}

        def done() -> bool:
            n = self.db_handovers()
            if n != seen["n"]:
                seen["n"], seen["since"] = n, time.monotonic()
            return n >= want or time.monotonic() - seen["since"] >= 30

        with contextlib.suppress(WaitTimeoutError):
            wait_until("ingest's handovers", done, 120, every_s=0.5)
        return self.db_handovers()

    def start_ingest(self) -> subprocess.Popen[bytes]:
        # Fixes come every second within a trip, and trips are at least TRIP_SPACING_S
        # apart: with a trip gap between the two, each emulated trip is one LinkDB trip
        # (the trainer validates leaving one trip out).
        logf = (self.run / "ingest.log").open("w")
        p = subprocess.Popen(
            [
                str(VENV / "polycorn-ingest"),
                "run",
                "--bootstrap",
                self.env["POLYCORN_KAFKA_BOOTSTRAP"],
                "--database-url",
                self.db,
                "--group",
                "ingest-loop",
                "--metrics-addr",
                self.s.ingest_metrics,
                "--trip-gap-s",
                "5",
            ],
            env=self.env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def answers() -> bool:
            if p.poll() is not None:
                tail = (self.run / "ingest.log").read_text()[-2000:]
                raise LoopError(f"polycorn-ingest exited:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://{self.s.ingest_metrics}/metrics", timeout=1):
                    return True
            except OSError:
                return False

        wait_until("polycorn-ingest's metrics", answers, 60, every_s=0.2)
        return p

    def start_follower(self) -> subprocess.Popen[bytes] | None:
        """``polycorn-trainer follow`` for the whole run (the fleet's near-real-time
        updates), with the refit's table thresholds; None when the run has none."""
        if not (self.s.follow and self.have_trainer):
            return None
        logf = (self.run / "follower.log").open("w")
        p = subprocess.Popen(
            [str(VENV / "polycorn-trainer"), "follow", "--database-url", self.db]
            + ["--bootstrap", self.env["POLYCORN_KAFKA_BOOTSTRAP"], "--topic", TABLE_TOPIC]
            + ["--table-signing-key", str(self.table_key / "table-signing.key")]
            + ["--poll-s", str(FOLLOW_POLL_S), "--metrics-addr", FOLLOW_METRICS]
            + self.s.trainer_args,
            env=self.env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def answers() -> bool:
            if p.poll() is not None:
                tail = (self.run / "follower.log").read_text()[-2000:]
                raise LoopError(f"polycorn-trainer follow exited:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://{FOLLOW_METRICS}/metrics", timeout=1):
                    return True
            except OSError:
                return False

        wait_until("the follower's metrics", answers, 60, every_s=0.2)
        log(f"follower up (every {FOLLOW_POLL_S} s, metrics at {FOLLOW_METRICS})")
        return p

    def keep_tables(self) -> None:
        """Every published table version into RUN/tables.jsonl: its version, when LinkDB
        stored it (unix ms), the model's update kind (``follow`` or a refit) and its
        entries' cells; and the follower's last metrics into RUN/follower.metrics."""
        rows = self.sql(
            "select t.version, (extract(epoch from t.created_at) * 1000)::bigint, t.body, "
            "m.params ->> 'update' from failure_tables t left join models m "
            "on m.id = t.model_id order by t.version"
        )
        with (self.run / "tables.jsonl").open("w") as f:
            for version, created_ms, body, update in rows:
                cells = sorted(
                    int(e["cell"]) for e in (body or {}).get("entries", []) if "cell" in e
                )
                rec = {
                    "version": int(version),
                    "created_unix_ms": int(created_ms),
                    "update": update or "refit",
                    "cells": cells,
                }
                f.write(json.dumps(rec) + "\n")
        url = f"http://{FOLLOW_METRICS}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            (self.run / "follower.metrics").write_bytes(r.read())
        log(f"kept {len(rows)} table versions in {self.run / 'tables.jsonl'}")

    def run_load(self, d: Path, i: int, epoch: int, start: int, backlog_end: int) -> None:
        """The load plan of one copy: bulk downloads, then the backlogged download."""
        s = self.s
        ns = ["ip", "netns", "exec", f"{s.prefix}{i}-pax", str(s.bin / "polycorn-loadgen")]
        common = ["--origin", f"{ORIGIN}:80", "--epoch-unix-ms", str(epoch)]
        bulk_end = start + s.bulk_s
        with (d / "loadgen.log").open("a") as logf:
            for kind, args in (
                (
                    "bulk",
                    ["--seed", str(LOAD_SEED), "--window-s", f"{start}:{bulk_end}"]
                    + ["--per-size", str(s.per_size), "--out", str(d / "bulk.jsonl")],
                ),
                (
                    "backlog",
                    ["--window-s", f"{bulk_end}:{backlog_end}", "--path", BACKLOG_PATH]
                    + ["--size", str(BACKLOG_SIZE), "--out", str(d / "backlog.jsonl")],
                ),
            ):
                rc = subprocess.run(
                    [*ns, kind, *common, *args], stdout=logf, stderr=subprocess.STDOUT, check=False
                ).returncode
                if rc != 0:
                    log(f"{d}: {kind} exited with {rc}")

    def relay_metric(self, i: int, name: str) -> float:
        text = scrape(f"{self.s.prefix}{i}-train", RELAY_METRICS, timeout_s=2)
        return (metrics.value(text, name) or 0.0) if text else 0.0

    def trip(self, k: int) -> None:
        s = self.s
        self.train_id = train_of(s, k)
        seed = s.trip_seed_base + k
        tid = f"r{s.route_seed}-t{seed}"
        tdir = self.run / "hsr" / tid
        tdir.mkdir(parents=True)
        trip = tdir / "trip"
        self.generate(k, tid, seed, trip)
        truth = tdir / "failure-table-truth.json"
        truth_n = self.oracle_table(trip, truth)

        # The learned table as the trainer left it after the previous trip.
        learned_file = tdir / "failure-table-learned.json"
        learned = self.latest_table(learned_file)
        if learned:
            log(
                f"trip {k}: learned table version {learned[0]}, {learned[1]} entries; "
                f"oracle table {truth_n} entries"
            )
        else:
            log(f"trip {k}: no learned table yet (empty LinkDB); oracle table {truth_n} entries")

        epoch = self.next_epoch()
        self.up_all(k, trip, epoch, learned_file if learned else None, truth)
        with TableTimeline(f"{s.prefix}{LEARNED}-cloud", tdir / "table-timeline.jsonl"):
            warm, backlog_end = self.load(k, tdir, epoch)
            spool = self.drain(k, epoch)
        in_use = self.collect(k, tdir, trip)
        trip_ho, got, db_trips = self.ingested(k, trip)
        trainer = self.train(k, tdir)
        rec = {
            "trip": k,
            "id": tid,
            "train": self.train_id,
            "trip_seed": seed,
            "epoch_unix_ms": epoch,
            "load_start_s": warm,
            "backlog_end_s": backlog_end,
            "learned_table": {"version": learned[0], "entries": learned[1]} if learned else None,
            "handovers": {
                "trip_events": trip_ho,
                "events_all_trips": self.handovers_want,
                "linkdb": got,
                "linkdb_trips": db_trips,
            },
            "in_use_at_end": {k_: _num(v) for k_, v in in_use.items()},
            "learned_relay_spool_left": _num(spool),
            "trainer_after": trainer,
        }
        (tdir / "loop-trip.json").write_text(json.dumps(rec, indent=2) + "\n")
        self.trip_ids.append(tid)

    def generate(self, k: int, tid: str, seed: int, trip: Path) -> None:
        """The trip into ``trip``; on GPS positions, before trip 1, its route into LinkDB."""
        s = self.s
        log(f"trip {k}/{s.trips} ({tid}): generating {s.trip_s}s")
        run(
            [str(s.bin / "polycorn-tracegen"), "generate", "--preset", s.preset]
            + ["--route-seed", str(s.route_seed), "--trip-seed", str(seed)]
            + ["--duration-s", str(s.trip_s), "--carriers", str(CARRIERS), "--out", str(trip)]
        )
        if s.positions == "gps" and k == 1:
            # The line before the first fix arrives (fixes are matched as they are
            # stored); every trip of the route has the same line.
            r = run(
                [str(VENV / "polycorn-ingest"), "import-routes", str(trip / "route.geojson")]
                + ["--database-url", self.db],
                env=self.env,
            )
            (self.run / "import-routes.json").write_text(r.stdout)
            log(f"route imported: {r.stdout.strip()[:200]}")

    def oracle_table(self, trip: Path, truth: Path) -> int:
        """The oracle table of the trip (every cell where it fails) into ``truth``; its
        entries."""
        route_args: list[str] = []
        if self.s.positions == "gps":
            route_args = ["--route", str(trip / "route.geojson")]
        run(
            [str(self.s.bin / "polycorn-tracegen"), "failure-table", "--events"]
            + [str(trip / "events.jsonl"), "--min-failures", "1", "--min-failure-rate", "0"]
            + [*route_args, "--out", str(truth)]
        )
        return len(json.loads(truth.read_text())["entries"])

    def next_epoch(self) -> int:
        """The trip's epoch: now, once TRIP_SPACING_S have passed since the previous
        trip's last fix (at its epoch + trip_s)."""
        s = self.s
        wait_until(
            "the trip spacing",
            lambda: now_ms() >= self.last_trip_end_ms + TRIP_SPACING_S * 1000,
            s.trip_s + 60,
            every_s=0.5,
        )
        epoch = now_ms()
        self.last_trip_end_ms = epoch + s.trip_s * 1000
        return epoch

    def endpoint_args(
        self, variant: str, learned: Path | None, truth: Path
    ) -> tuple[list[str], list[str], list[int], Path | None]:
        """A copy's relay and proxy arguments, forwarded ports and table file."""
        s = self.s
        # Every copy replays the radio log from the trip's start (--replay-resume,
        # a modem's history), so all carry the same telemetry; only the learned
        # copy's proxy has a sink.
        relay = ["--replay-resume"] + (["--replay-gps-only"] if s.positions == "gps" else [])
        proxy: list[str] = []
        forward: list[int] = []
        table: Path | None = None
        if variant == "hrsch-learned":
            forward = [self.kafka_port]
            proxy += [f"--kafka-brokers=127.0.0.1:{self.kafka_port}", self.verify]
            relay.append(self.verify)
            if s.table_source == "topic":
                proxy.append(f"--failure-table-topic={TABLE_TOPIC}")
                if learned:
                    relay.append(f"--failure-table={learned}")
            elif learned:
                table = learned
        elif variant == "hrsch-truth":
            table = truth
        return relay, proxy, forward, table

    def up_all(self, k: int, trip: Path, epoch: int, learned: Path | None, truth: Path) -> None:
        """Every variant's topology up, one after the other; ``learned``: the learned
        table's file, if there is one yet."""
        log(f"trip {k}: building {len(VARIANTS)} topologies (epoch {epoch})")
        for i, variant in enumerate(VARIANTS):
            relay, proxy, forward, table = self.endpoint_args(variant, learned, truth)
            topo = self.topology(i, trip)
            try:
                topo.up(
                    variant.split("-")[0],
                    epoch_unix_ms=epoch,
                    failure_table=table,
                    relay_args=relay,
                    proxy_args=proxy,
                    forward_ports=forward,
                    seed=LOAD_SEED + k,
                )
            except AssertionError as e:
                raise LoopError(
                    f"trip {k}: topology for {variant} failed (logs: {topo.state}/logs): {e}"
                ) from e

    def load(self, k: int, tdir: Path, epoch: int) -> tuple[int, int]:
        """Every copy's load plan at once, from as soon as all are up; the load's start
        and the backlog's end (trip time, seconds)."""
        s = self.s
        backlog_end = s.trip_s - 5
        warm = max(15, (now_ms() - epoch) // 1000 + 5)
        if backlog_end - warm - s.bulk_s < 10:
            raise LoopError(
                f"topologies took {warm}s to come up: no time left for the backlog phase"
            )
        log(
            f"trip {k}: load from trip time {warm}s: {s.per_size * N_SIZES} downloads in "
            f"{s.bulk_s}s, backlog until {backlog_end}s"
        )
        threads = []
        for i, variant in enumerate(VARIANTS):
            (tdir / variant).mkdir()
            threads.append(
                threading.Thread(
                    target=self.run_load, args=(tdir / variant, i, epoch, warm, backlog_end)
                )
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return warm, backlog_end

    def drain(self, k: int, epoch: int) -> float:
        """The rest of the event log, then the learned relay's spool empties (every
        record confirmed by the proxy after Kafka); the records left in it."""
        s = self.s
        end = epoch + s.trip_s * 1000 + 1000
        wait_until("the trip's end", lambda: now_ms() >= end, s.trip_s + 60, every_s=0.5)
        spool: float = -1

        def drained() -> bool:
            nonlocal spool
            spool = self.relay_metric(LEARNED, "polycorn_telemetry_spool_records")
            return spool == 0

        try:
            wait_until("the learned relay's spool empty", drained, 60, every_s=0.5)
        except WaitTimeoutError:
            log(f"trip {k}: WARNING: the learned relay's spool still holds {spool:.0f} records")
        return spool

    def collect(self, k: int, tdir: Path, trip: Path) -> dict[str, float | None]:
        """Every copy's records and logs, then the topologies down (once the learned
        copy's tables are checked); which table the learned copy had in use."""
        for i, variant in enumerate(VARIANTS):
            self.topology(i, trip).collect(tdir / variant)
        in_use = learned_tables_in_use(k, tdir / VARIANTS[LEARNED] / "logs")
        self.all_down(trip)
        for i, variant in enumerate(VARIANTS):
            emu_log = self.topology(i, trip).state / "logs" / "emu.log"
            if emu_log.exists():
                (tdir / variant / "logs" / "emu.log").write_bytes(emu_log.read_bytes())
        return in_use

    def ingested(self, k: int, trip: Path) -> tuple[int, int, Any]:
        """Until LinkDB has the trip: the trip's handovers in its event log, LinkDB's
        handovers of the train and its trips."""
        trip_ho = len(Expected.load(trip / "events.jsonl", 0).handovers)
        self.handovers_want += trip_ho
        got = self.wait_ingest(self.handovers_want)
        db_trips = self.sql("select count(*) from trips")[0][0]
        log(
            f"trip {k} ({self.train_id}): handovers in the event log {trip_ho} (all trips "
            f"{self.handovers_want}), in LinkDB {got}; LinkDB trips: {db_trips}"
        )
        if got != self.handovers_want:
            want = self.handovers_want
            log(f"trip {k}: WARNING: LinkDB has {got} handovers, the event logs {want}")
        return trip_ho, got, db_trips

    def train(self, k: int, tdir: Path) -> Any:
        """The trainer learns the next table from LinkDB; its summary (None without a
        trainer)."""
        if not self.have_trainer:
            (tdir / "trainer.json").write_text("null\n")
            return None
        s = self.s
        t0 = now_ms()
        with (tdir / "trainer.log").open("w") as logf:
            rc = subprocess.run(
                [str(VENV / "polycorn-trainer"), "run", "--once", "--database-url", self.db]
                + ["--bootstrap", self.env["POLYCORN_KAFKA_BOOTSTRAP"], "--topic", TABLE_TOPIC]
                + ["--table-signing-key", str(self.table_key / "table-signing.key")]
                + [*s.trainer_args, "--summary-json", str(tdir / "trainer.json")],
                env=self.env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if rc != 0:
            tail = (tdir / "trainer.log").read_text()[-2000:]
            raise LoopError(f"trip {k}: polycorn-trainer run failed ({rc}):\n{tail}")
        trainer = json.loads((tdir / "trainer.json").read_text())
        pub = trainer.get("table")
        brief = {
            "model_id": trainer.get("model_id"),
            "cells": trainer.get("cells"),
            "cells_fitted": trainer.get("cells_fitted"),
            "handovers": trainer.get("handovers"),
            "table": {"version": pub["version"], "entries": pub["entries"]} if pub else None,
        }
        log(f"trip {k}: trainer {json.dumps(brief)} in {(now_ms() - t0) // 1000}s")
        return trainer


class TableTimeline:
    """While in its ``with``: every second, the failure table version and entries that
    the proxy in namespace ``ns`` has in use (its /metrics), a JSON line into ``out``
    each time they change (``t_unix_ms``, ``version``, ``entries``; version null while
    it has none). The table reaches a running proxy from the topic, so this is when
    a following train's proxy would have it."""

    def __init__(self, ns: str, out: Path, every_s: float = 1.0) -> None:
        self.ns, self.out, self.every_s = ns, out, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TableTimeline:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        last: tuple[float | None, float | None] | None = None
        with self.out.open("w") as f:
            while not self.stop.is_set():
                text = scrape(self.ns, PROXY_METRICS, timeout_s=2)
                if text:
                    now = now_ms()
                    cur = (
                        metrics.value(text, "polycorn_failure_table_version"),
                        metrics.value(text, "polycorn_failure_table_entries"),
                    )
                    if cur != last:
                        version, entries = (_num(v) for v in cur)
                        row = {"t_unix_ms": now, "version": version, "entries": entries}
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        last = cur
                self.stop.wait(self.every_s)


def learned_tables_in_use(k: int, m: Path) -> dict[str, float | None]:
    """Which table the learned copy's endpoints had in use at the end, from their
    metrics snapshots in ``m``; every table the trainer published must have verified
    (none refused for its signature)."""

    def snap(which: str, name: str, **labels: str) -> float | None:
        f = m / f"{which}.metrics"
        text = f.read_text() if f.exists() else ""
        return metrics.value(text, name, **labels) if text else None

    in_use = {
        "proxy_version": snap("proxy", "polycorn_failure_table_version"),
        "proxy_entries": snap("proxy", "polycorn_failure_table_entries"),
        "relay_version": snap("relay", "polycorn_failure_table_version"),
    }
    pv, pe, rv = (_num(in_use[x]) for x in ("proxy_version", "proxy_entries", "relay_version"))
    log(f"trip {k}: learned copy's table in use: proxy version {pv} ({pe} entries), relay {rv}")
    refused = sum(
        snap(w, "polycorn_failure_table_source_rejected_total", reason="signature") or 0
        for w in ("proxy", "relay")
    )
    if refused:
        raise LoopError(f"trip {k}: the learned copy refused {refused:.0f} tables")
    return in_use


def _num(v: float | None) -> int | float | None:
    """A metric's value as JSON shows it: an integer when it is one."""
    if v is None:
        return None
    return int(v) if float(v).is_integer() else v


def check_binaries(s: Settings) -> None:
    """The release binaries are there, and the proxy reads tables from a topic if the
    run has it do so."""
    missing = [b for b in BINARIES if not (s.bin / b).exists()]
    if missing:
        raise LoopError(f"{s.bin}/{missing[0]} missing: run 'make build'")
    if s.table_source == "topic":
        helptext = run([str(s.bin / "polycorn-proxy"), "--help"]).stdout
        if "--failure-table-topic" not in helptext:
            raise LoopError(f"{s.bin}/polycorn-proxy has no --failure-table-topic")


def prepare_run_dir(s: Settings) -> Path:
    """A fresh run directory, with the run's table-signing key in it."""
    run_dir = s.work / f"run-{s.profile}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    s.out.mkdir(parents=True, exist_ok=True)
    # The failure-table signing key of this run: the trainer signs every table, the
    # learned copy's relay and proxy take only tables it verifies. (The oracle table
    # of hrsch-truth is the benchmark's stand-in, not a published table.)
    run([str(s.bin / "polycorn-pki"), "table-key", "--out", str(run_dir / "table-key")])
    return run_dir


def prepare_linkdb(env: dict[str, str]) -> None:
    """LinkDB's schema on the fresh PostgreSQL; the table topic on the fresh Kafka."""
    run([str(VENV / "polycorn-linkdb"), "--url", env["POLYCORN_DATABASE_URL"], "upgrade"])
    topics = run(["bash", "scripts/infra.sh", "topics", "--list"], env=env).stdout.split()
    if TABLE_TOPIC not in topics:
        raise LoopError(f"topic {TABLE_TOPIC} missing (services/kafka/topics.txt)")


def check_trainer(loop: Loop) -> None:
    if not (VENV / "polycorn-trainer").exists():
        if os.environ.get("LOOP_ALLOW_NO_TRAINER") != "1":
            raise LoopError("polycorn-trainer is not in the workspace")
        log("WARNING: no polycorn-trainer: nothing is learned (diagnostic run)")
        loop.have_trainer = False


def run_trips(s: Settings, loop: Loop, t_start: int) -> None:
    first, last = s.trip_seed_base + 1, s.trip_seed_base + s.trips
    log(
        f"profile {s.profile}: {s.trips} trips of {s.trip_s}s by {s.trains} train(s), route "
        f"{s.route_seed}, trip seeds {first}..{last}, table source {s.table_source}, "
        f"positions {s.positions}, follower {'on' if s.follow else 'off'}, trainer "
        f"{shlex.join(s.trainer_args)}"
    )
    for k in range(1, s.trips + 1):
        loop.trip(k)
        log(f"trip {k} done; {(now_ms() - t_start) // 1000}s so far")


def tear_down(
    loop: Loop | None,
    procs: Sequence[subprocess.Popen[bytes] | None],
    env: dict[str, str],
    run_dir: Path,
) -> None:
    """Whatever of the topologies, ingest, the follower and the infrastructure was
    started, down."""
    log("tearing down")
    if loop is not None:
        loop.all_down(run_dir)
    for p in procs:
        if p is None:
            continue
        # Each runs in its own process group: stop all of it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        stop_process(p.pid)
    infra.wipe(env)


def run_json(s: Settings, loop: Loop, started: dict[str, Any]) -> dict[str, Any]:
    first, last = s.trip_seed_base + 1, s.trip_seed_base + s.trips
    desc = (
        f"polycorn-tracegen {s.preset}, {CARRIERS} carriers, route seed {s.route_seed}, "
        f"trip seeds {first}..{last}, in order"
    )
    if s.diagnostic:
        desc = f"DIAGNOSTIC: {desc}"
    return {
        **started,
        "profile": s.profile,
        "diagnostic": s.diagnostic,
        "schemes": list(VARIANTS),
        "bulk": {
            "per_size": s.per_size,
            "sizes": {"256KB": 262144, "1MB": 1048576, "4MB": 4194304},
            "slot_s": s.slot_s,
        },
        "im": {"users": []},
        "backlog": {"seconds_nominal": s.backlog_s, "path": BACKLOG_PATH, "link_sets": ["hsr"]},
        "buffer_bytes": 3000000,
        "load_seed": LOAD_SEED,
        "trip_s": s.trip_s,
        "route_seed": s.route_seed,
        "loop": {
            "train_id": TRAIN,
            "trains": [train_of(s, k) for k in range(1, min(s.trains, s.trips) + 1)],
            "follower": {"poll_s": FOLLOW_POLL_S} if s.follow else None,
            "table_source": s.table_source,
            "trainer_args": shlex.join(s.trainer_args),
            "positions": s.positions,
        },
        "link_sets": {"hsr": {"trips": loop.trip_ids, "description": desc}},
    }


def analyse(s: Settings, run_dir: Path, t_start: int) -> None:
    """bench/polycorn_bench's analysis of the run: results and plots."""
    log(f"analysing {run_dir}")
    s.plots.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["uv", "run", "--project", "bench", "--locked", "--quiet", "python", "-m"]
        + ["polycorn_bench.loop", str(run_dir), "--out", str(s.out / "loop.json")]
        + ["--md", str(s.out / "loop.md"), "--plots", str(s.plots)],
        cwd=ROOT,
        # Checked at the start: a change during the run is recorded, not refused.
        env={**os.environ, provenance.ALLOW_DIRTY: "1"},
        check=True,
    )
    log(
        f"results: {s.out}/loop.json, {s.out}/loop.md, plot in {s.plots}; raw records in "
        f"{run_dir}; {(now_ms() - t_start) // 1000}s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    # Everything else is the environment's (the docstring); --help prints it.
    argparse.ArgumentParser(
        prog="python -m polycorn_benchrun.loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    if os.geteuid() != 0:
        log("ERROR: must run as root (network namespaces)")
        return 1
    s = Settings.from_env()
    # The commit the run starts from (a report run takes hours), refused now when its
    # results for bench/out would not be clean.
    started = provenance.start(s.out).started()
    # Ctrl-C and SIGTERM tear everything down (the finally below), also when this
    # process inherited SIGINT ignored (started in the background of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    check_binaries(s)
    run_dir = prepare_run_dir(s)

    log(f"infrastructure in {INFRA['POLYCORN_INFRA_DIR']}, fresh")
    env = infra.environment(INFRA)
    ingest: subprocess.Popen[bytes] | None = None
    follower: subprocess.Popen[bytes] | None = None
    loop: Loop | None = None
    try:
        infra.wipe(env)
        env = infra.up(INFRA, ["pg", "kafka"])
        prepare_linkdb(env)
        loop = Loop(s, env, run_dir)
        ingest = loop.start_ingest()
        check_trainer(loop)
        follower = loop.start_follower()
        t_start = now_ms()
        run_trips(s, loop, t_start)
        loop.keep_tables()
    finally:
        tear_down(loop, [follower, ingest], env, run_dir)

    assert loop is not None
    (run_dir / "run.json").write_text(json.dumps(run_json(s, loop, started), indent=2) + "\n")
    analyse(s, run_dir, t_start)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LoopError as e:
        log(f"ERROR: {e}")
        sys.exit(1)
