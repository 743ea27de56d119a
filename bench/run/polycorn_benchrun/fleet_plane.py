"""The fleet's shared plane at a thousand trains and more: Kafka, ingest and LinkDB.

    python -m polycorn_benchrun.fleet_plane [--trains 250,500,1000,2000] [--repeats 1]
        [--seconds 60] [--warmup-s 20] [--trains-per-client 10] [--tables 3]
        [--table-entries 1000] [--out bench/out/fleet-plane.json]

``make bench-fleet`` (:mod:`polycorn_benchrun.fleet`) runs a real proxy per train, so
on a small machine it stops at a hundred trains or so. What a fleet of a thousand
costs in the parts every proxy shares is measured here without the proxies: one
``polycorn-fleetsim --direct-kafka`` process produces, per train, the telemetry
records that train's radio replay makes (the relay's records, times and bytes) straight
to the telemetry topic as its proxy would (the proxy's key, headers and producer
settings, shared code: ``polycorn_telemetry::kafka``), one producer per
``--trains-per-client`` trains; as many table consumers follow the failure-table topic
as the proxies do (from its beginning, each judging what it reads with the proxies'
verify key) and note when each table version came into use. The rest is real: the
Kafka broker and PostgreSQL + PostGIS of ``scripts/infra.sh``, one ingest consumer
(the production ``Ingestor``, as ``fleet.py`` runs it), a fresh topic and database per
run.

Per run (fleet size n, repeat r; the sizes interleaved: every size once, then again):
Kafka's and PostgreSQL's CPU for ``--idle-s`` before the trains start (what else the
machine's broker and database were doing), the trains started and every one
confirmed, ``--warmup-s``, then ``--seconds`` measured: CPU (% of one core) of Kafka,
ingest, PostgreSQL (its background processes and the backends of this run's database)
and the simulator from /proc, RSS every second (PostgreSQL's as PSS, since its
processes share their buffers), ingest lag (fleet.py's: commit time minus the record's
train-clock time), Kafka records and bytes per second (the topic read back, by the
producers' timestamps), the broker's open sockets; ``--tables`` signed failure tables
published during the window through the trainer's own path (``store.serialise``, the
trainer's signing key, ``kafka.produce_table``) and, per table, the delay from its
publication to each table consumer putting it in use. After the window: every table
seen by every consumer, the simulator stopped, ingest caught up, and LinkDB checked
against the trip as fleet.py checks it (every GPS fix and handover of each train's
replayed stretch once, nothing else).

The shared plane's CPU per train is a straight line through the runs (Kafka + ingest +
PostgreSQL against n) with a 95 % bootstrap interval over the repeats; ``largest_held``
is the largest size whose every repeat passed every check with ingest lag p99 under
``LAG_HELD_MS``. Method and limits: docs/benchmarks.md, "The shared plane at fleet
scale".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from polycorn_benchrun.fleet import (
    CARRIERS,
    TRIP_SPREAD_S,
    Config,
    Fleet,
    Shared,
    bootstrap_fits,
    cpu_ticks,
    fit,
    infra_pids,
    interval,
    machine_busy,
    parse_trains,
    quantile,
    read_topic,
    rss_kib,
    scrape,
    train_id,
    where,
    with_trip,
    work_dir,
)
from polycorn_benchrun.ingest import _machine
from polycorn_harness import ROOT, provenance
from polycorn_schema.testing import fresh_database
from polycorn_trainer.kafka import produce_table
from polycorn_trainer.signing import TableSigner
from polycorn_trainer.store import DEFAULT_VALIDITY_S, serialise

#: Ingest lag p99 a size must stay under to count as held.
LAG_HELD_MS = 1000.0
#: The simulator's event loop waking this late (p99): it could not offer the load.
LOOP_LAG_SATURATED_MS = 500.0
#: How long after the window every table consumer may take to see the last table.
TABLES_SEEN_WITHIN_S = 120.0
BOOTSTRAP_RESAMPLES = 2000
#: drop-record, deaf-consumer: the simulator's (``--fault``); lose-row: fleet.py's (a GPS fix
#: deleted from LinkDB before the check); unsigned-table: the second table is published
#: without its signature, so every consumer must refuse it.
FAULTS = ("drop-record", "deaf-consumer", "lose-row", "unsigned-table")


@dataclass
class PlaneConfig(Config):
    repeats: int = 1
    trains_per_client: int = 10
    tables: int = 3
    table_entries: int = 1000
    port_base: int = 29470
    idle_s: float = 10.0
    #: Faults to seed (FAULTS); fleet.py's ``fault`` is "lose-row" when that is one.
    faults: tuple[str, ...] = ()


# --------------------------------------------------------------------------- /proc


def pss_kib(pid: int) -> int:
    """Proportional set size (shared pages divided among their users), KiB; 0 once gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sockets(pid: int) -> int:
    """Open sockets of a process."""
    n = 0
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                n += str(fd.readlink()).startswith("socket:")
    return n


def ticks(groups: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each process's CPU ticks so far, by group."""
    return {g: [cpu_ticks(p) for p in ps] for g, ps in groups.items()}


def cpu_between(
    before: dict[str, list[int]], after: dict[str, list[int]], span: float
) -> dict[str, float]:
    """Each group's CPU between two :func:`ticks`, % of one core; a process that ended
    in between counts for nothing (not for minus what it had used)."""
    tck = os.sysconf("SC_CLK_TCK")
    return {
        g: 100.0 * sum(max(0, a - b) for a, b in zip(after[g], before[g], strict=True)) / tck / span
        for g in before
    }


def cpu_pct(groups: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """CPU of each group over the next ``seconds``, % of one core."""
    before = ticks(groups)
    t0 = time.monotonic()
    time.sleep(seconds)
    span = time.monotonic() - t0
    return {g: round(v, 1) for g, v in cpu_between(before, ticks(groups), span).items()}


# --------------------------------------------------------------------------- tables


def table_entries(n: int) -> list[dict[str, Any]]:
    """``n`` entries as the trainer assembles them (a cell, a direction, the failure
    location, its counts); data-plane cell IDs of carrier 0."""
    return [
        {
            "cell": (1 << 32) | (k // 2 + 1),
            "direction": "increasing" if k % 2 == 0 else "decreasing",
            "position_m": float(250 * k + 120),
            "failures": 3 + k % 5,
            "handovers": 20 + k % 11,
        }
        for k in range(n)
    ]


def publish(
    bootstrap: str,
    topic: str,
    signer: TableSigner,
    version: int,
    entries: int,
    *,
    signed: bool = True,
) -> dict[str, Any]:
    """Table ``version`` through the trainer's publishing path: its canonical bytes,
    signed with the trainer's key, produced as the trainer produces them (returns once
    the broker acknowledged). Times in Unix ms."""
    from polycorn_schema.failure_table import etag_of  # noqa: PLC0415

    data = serialise(
        version,
        table_entries(entries),
        [],
        model_id=None,
        issued_unix_s=int(time.time()),
        validity_s=DEFAULT_VALIDITY_S,
    )
    signature = signer.sign(data) if signed else None
    t0 = time.time()
    produce_table(bootstrap, topic, data, version=version, etag=etag_of(data), signature=signature)
    return {
        "version": version,
        "bytes": len(data),
        "published_unix_ms": round(t0 * 1000),
        "acked_unix_ms": round(time.time() * 1000),
    }


def propagation(published: list[dict[str, Any]], consumers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per table, the delay from its publication to each table consumer putting it in
    use (ms): p50, p99 and max over the consumers, and those that never did."""
    per_table = []
    every: list[float] = []
    after_ack: list[float] = []
    for p in published:
        v = p["version"]
        seen_at: list[float] = []
        missing = []
        for c in consumers:
            seen = [s["unix_ms"] for s in c["seen"] if s["version"] == v]
            if seen:
                seen_at.append(float(seen[0]))
            else:
                missing.append(c["index"])
        delays = [t - p["published_unix_ms"] for t in seen_at]
        every += delays
        after_ack += [t - p["acked_unix_ms"] for t in seen_at]
        per_table.append(
            {
                **p,
                "publish_ms": p["acked_unix_ms"] - p["published_unix_ms"],
                "consumers_seen": len(delays),
                "consumers_missing": missing[:10],
                "missing": len(missing),
                **stats("delay_ms", delays),
            }
        )
    return {
        "tables": per_table,
        **stats("delay_ms", every),
        # From the broker's acknowledgement to the trainer instead: what Kafka and the
        # consumers add (negative when a consumer read the table before the trainer
        # heard back).
        **stats("delay_after_ack_ms", after_ack),
        "every_consumer_saw_every_table": bool(published)
        and all(t["missing"] == 0 for t in per_table),
    }


def stats(name: str, xs: list[float]) -> dict[str, float | None]:
    """``name``'s p50, p99 and max over ``xs`` (None without any)."""
    return {
        f"{name}_p50": round(quantile(xs, 0.5), 1) if xs else None,
        f"{name}_p99": round(quantile(xs, 0.99), 1) if xs else None,
        f"{name}_max": round(max(xs), 1) if xs else None,
    }


# --------------------------------------------------------------------------- one run


class PlaneFleet(Fleet):
    """One run of ``n`` simulated trains against the shared plane: its topics, ingest,
    the simulator in plane mode, and what ingest has committed so far."""

    cfg: PlaneConfig

    def __init__(self, sh: Shared, n: int, repeat: int) -> None:
        super().__init__(sh, n)
        self.work = sh.work / f"n{n}-r{repeat}"
        self.procs.logs = self.work / "logs"
        self.procs.logs.mkdir(parents=True, exist_ok=True)
        self.sim_metrics = f"127.0.0.1:{self.cfg.port_base}"
        self.summary_file = self.work / "fleetsim.json"
        self.summary: dict[str, Any] = {}

    def plan(self) -> dict[str, Any]:
        """The simulator's plan: per train its id and its place on the trip (37 s further
        along than the one before, as fleet.py places them)."""
        now_ms = int(time.time() * 1000)
        self.trains = [
            {
                "id": train_id(i),
                "epoch_ms": now_ms - ((i * 37) % TRIP_SPREAD_S) * 1000,
                "started_ms": now_ms,
            }
            for i in range(self.n)
        ]
        return {
            "paths": CARRIERS,
            "events": str(self.sh.trip / "events.jsonl"),
            # 10 ms apart, at most 30 s: the trains and their Kafka clients start one
            # after the other, as a fleet's proxies come up, not in one connection storm.
            "start_spread_s": min(30.0, 0.01 * self.n),
            "trains": [{"id": t["id"], "epoch_unix_ms": t["epoch_ms"]} for t in self.trains],
        }

    def start_plane(self, url: str) -> dict[str, float]:
        """Ingest, Kafka's and PostgreSQL's idle CPU, then the simulator, every train
        confirmed, and ingest's first commit; returns the idle CPU."""
        self.start_ingest(url)
        idle = {}
        if self.cfg.idle_s > 0:
            idle = cpu_pct(
                {k: infra_pids(url).get(k, []) for k in ("kafka", "postgres")},
                self.cfg.idle_s,
            )
        plan = self.work / "fleetsim-plan.json"
        plan.write_text(json.dumps(self.plan(), indent=1))
        cfg = self.cfg
        argv = [
            str(cfg.bin_dir / "polycorn-fleetsim"),
            f"--plan={plan}",
            f"--summary={self.summary_file}",
            f"--metrics-listen={self.sim_metrics}",
            f"--direct-kafka={self.sh.bootstrap}",
            f"--kafka-topic={self.topic}",
            f"--kafka-dlq-topic={self.dlq}",
            f"--failure-table-topic={self.tables}",
            f"--failure-table-verify-key={self.sh.pki / 'table-signing.pub'}",
            f"--trains-per-client={cfg.trains_per_client}",
            "--log-json",
        ]
        if cfg.sim_threads:
            argv.append(f"--threads={cfg.sim_threads}")
        argv += [f"--fault={f}" for f in cfg.faults if f in ("drop-record", "deaf-consumer")]
        self.procs.start("fleetsim", argv)
        self.wait_sim_trains(self.sim_metrics, 0.05, "confirmed by Kafka")
        print(f"n={self.n}: {self.n} simulated trains produce to Kafka", flush=True)
        self.first_commit()
        return idle

    def warm_up_plane(self) -> None:
        end = time.monotonic() + self.cfg.warmup_s
        while time.monotonic() < end:
            self.drain_lags(None)
            time.sleep(0.5)

    def measure_plane(self, signer: TableSigner) -> dict[str, Any]:
        """The window: CPU and RSS of each part, the broker's sockets, the tables
        published at even spacing within it."""
        cfg = self.cfg
        kafka = infra_pids().get("kafka", [])
        groups: dict[str, list[int]] = {
            "kafka": kafka,
            "ingest": [self.ingest.pid],
            "postgres": infra_pids(self.url).get("postgres", []),
            "fleetsim": [self.procs.pid("fleetsim")],
        }
        due = [cfg.seconds * (k + 1) / (cfg.tables + 1) for k in range(cfg.tables)]
        published: list[dict[str, Any]] = []
        mem: dict[str, list[float]] = {g: [] for g in groups}
        socks: list[int] = []
        w0 = time.time()
        before = ticks(groups)
        busy0, load0 = machine_busy(), os.getloadavg()
        while time.time() < w0 + cfg.seconds:
            for g, ps in groups.items():
                f = pss_kib if g == "postgres" else rss_kib
                mem[g].append(sum(f(p) for p in ps) / 1024)
            socks.append(sum(sockets(p) for p in kafka))
            self.drain_lags((w0, w0 + cfg.seconds))
            while due and time.time() >= w0 + due[0]:
                due.pop(0)
                published.append(
                    publish(
                        self.sh.bootstrap,
                        self.tables,
                        signer,
                        len(published) + 1,
                        cfg.table_entries,
                        signed=not (len(published) == 1 and "unsigned-table" in cfg.faults),
                    )
                )
            time.sleep(max(0.0, 1.0 - (time.time() - w0) % 1.0))
        w1 = time.time()
        after = ticks(groups)
        busy1, load1 = machine_busy(), os.getloadavg()
        sim_m = scrape(self.sim_metrics)
        span = w1 - w0
        return {
            "window": (w0, w1),
            "span": span,
            "cpu": cpu_between(before, after, span),
            "mem": mem,
            "kafka_sockets": socks,
            "published": published,
            "machine": (busy0, busy1, load0, load1),
            "dead": self.procs.dead(),
            "sim_metrics": sim_m,
        }

    def wait_tables(self, versions: int) -> None:
        """Until every table consumer has the last table in use, or the time is up."""
        end = time.monotonic() + TABLES_SEEN_WITHIN_S
        while time.monotonic() < end and versions > 0:
            m = scrape(self.sim_metrics)
            if m.get("polycorn_fleetsim_plane_table_version_min", 0) >= versions:
                return
            self.drain_lags(None)
            time.sleep(0.5)

    def finish_plane(self, window: tuple[float, float]) -> int:
        """The simulator stopped (its summary read), ingest caught up with what Kafka
        confirmed; returns when the trains stopped (Unix ms)."""
        stopped_ms = int(time.time() * 1000)
        self.procs.stop(["fleetsim"], timeout=60)
        if self.summary_file.exists():
            self.summary = json.loads(self.summary_file.read_text())
            started = {t["id"]: t["started_unix_ms"] for t in self.summary["trains"]}
            for tr in self.trains:
                tr["started_ms"] = started.get(tr["id"], tr["started_ms"])
        # What the topic holds (not what the simulator says Kafka confirmed: the checks
        # compare the two), all of it committed by ingest.
        want = topic_end(self.sh.bootstrap, self.topic)
        end = time.monotonic() + 120
        while self.committed < want and time.monotonic() < end:
            self.drain_lags(window)
            time.sleep(0.5)
        time.sleep(2.0)
        self.drain_lags(window)
        return stopped_ms


def topic_end(bootstrap: str, topic: str) -> int:
    """The records a topic holds: its partitions' end offsets summed (the producers are
    idempotent, not transactional, so no offset is a control record)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plane-end-{os.getpid()}"})
    try:
        md = c.list_topics(topic, timeout=10)
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.topics[topic].partitions
        )
    finally:
        c.close()


def run_plane(sh: Shared, n: int, repeat: int, signer: TableSigner) -> dict[str, Any]:
    fl = PlaneFleet(sh, n, repeat)
    fl.create_topics()
    try:
        with fresh_database(prefix="linkdb_plane") as url:
            idle = fl.start_plane(url)
            fl.warm_up_plane()
            measured = fl.measure_plane(signer)
            fl.wait_tables(len(measured["published"]))
            stopped_ms = fl.finish_plane(measured["window"])
            topic_stats = read_topic(sh.bootstrap, fl.topic, *measured["window"])
            tele = fl.check_linkdb(url, stopped_ms)
    finally:
        fl.tear_down()
    return summarize(n, repeat, fl.cfg, fl, measured, idle, topic_stats, tele)


def summarize(  # noqa: PLR0917
    n: int,
    repeat: int,
    cfg: PlaneConfig,
    fl: PlaneFleet,
    k: dict[str, Any],
    idle: dict[str, float],
    topic: dict[str, Any],
    tele: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    s = fl.summary
    tot: dict[str, int] = s.get("totals", {})
    cpu: dict[str, float] = k["cpu"]
    shared = cpu["kafka"] + cpu["ingest"] + cpu["postgres"]
    lags = fl.lags
    prop = propagation(k["published"], s.get("tables", []))
    confirmed = tot.get("records_confirmed", 0) - tot.get("records_dead_letters", 0)
    table_trouble = sum(c["refused"] + c["errors"] for c in s.get("tables", []))
    checks = {
        "every simulated train started and Kafka confirmed its records": bool(s)
        and s["trains_started"] == n == s["trains_connected"],
        "no Kafka delivery failed, none left unconfirmed, no dead letter": bool(s)
        and tot["records_failed"] == 0
        and tot["in_flight"] == 0
        and tot["records_dead_letters"] == 0,
        "ingest committed every record Kafka confirmed": fl.committed >= confirmed > 0,
        "the topic holds exactly the records Kafka confirmed": topic["records"] == confirmed,
        "LinkDB holds each train's GPS fixes and handovers once, none missing": bool(tele)
        and all(v["ok"] for v in tele.values()),
        "every table consumer put every published table in use": prop[
            "every_consumer_saw_every_table"
        ]
        and len(k["published"]) == cfg.tables,
        "no table refused, no table consumer error": table_trouble == 0,
        "no process died": not k["dead"],
    }
    busy0, busy1, load0, load1 = k["machine"]
    loop_p99 = float(s.get("loop_lag_ms_p99", 0.0))
    lag_p99 = quantile(lags, 0.99) * 1000
    ok = all(checks.values())
    return {
        "trains": n,
        "repeat": repeat,
        "ok": ok,
        "held": ok and lag_p99 < LAG_HELD_MS,
        "checks": checks,
        "window_s": round(k["span"], 1),
        "cpu_pct": {g: round(v, 1) for g, v in cpu.items()},
        "shared_cpu_pct": round(shared, 1),
        "shared_cpu_pct_per_train": round(shared / n, 4),
        "idle_cpu_pct": idle,
        "rss_mb_p99": {g: round(quantile(v, 0.99), 1) if v else None for g, v in k["mem"].items()},
        "ingest_lag_p50_ms": round(quantile(lags, 0.5) * 1000, 1),
        "ingest_lag_p99_ms": round(lag_p99, 1),
        "ingest_lag_max_ms": round(max(lags, default=float("nan")) * 1000, 1),
        "ingest_lag_records": len(lags),
        "kafka_records_per_s": topic["records_per_s"],
        "kafka_bytes_per_s": topic["bytes_per_s"],
        "kafka_sockets_max": max(k["kafka_sockets"], default=0),
        "kafka_clients": {
            "producers": s.get("producers"),
            "table_consumers": s.get("table_consumers"),
            "trains_per_client": s.get("trains_per_client"),
        },
        "table_propagation": prop,
        "telemetry_records": {
            "made": tot.get("records_made"),
            "confirmed": confirmed,
            "in_topic": topic["records"],
            "committed_by_ingest": fl.committed,
            "failed": tot.get("records_failed"),
            "resent": tot.get("records_resent"),
        },
        "telemetry_in_linkdb": {
            "fixes": sum(v["fixes"] for v in tele.values()),
            "handovers": sum(v["handovers"] for v in tele.values()),
            "trains_with_problems": {t: v["problems"] for t, v in tele.items() if not v["ok"]},
        },
        "load_generator": {
            "cpu_pct": round(cpu["fleetsim"], 1),
            "rss_mb_p99": round(quantile(k["mem"]["fleetsim"], 0.99), 1),
            "threads": s.get("threads"),
            "loop_lag_ms_p99": round(loop_p99, 1),
            "loop_lag_ms_max": round(float(s.get("loop_lag_ms_max", 0.0)), 1),
        },
        # The simulator could not keep its trains' pace: the load was not offered.
        "saturated": loop_p99 > LOOP_LAG_SATURATED_MS,
        "machine_busy_pct": round(100.0 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 1),
        "loadavg_1m": [round(load0[0], 2), round(load1[0], 2)],
        "dead": k["dead"],
        "obituaries": [fl.procs.obituary(d) for d in k["dead"] if d in fl.procs.p],
    }


# --------------------------------------------------------------------------- the series


def per_train_fit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """% of a core per train (the slope) of the shared plane and each of its parts, with
    bench-fleet's bootstrap interval over the repeats (none without repeats)."""
    out: dict[str, Any] = {}
    xs = [float(r["trains"]) for r in runs]
    for g in ("shared", "kafka", "ingest", "postgres"):

        def value(r: dict[str, Any], g: str = g) -> float:
            return float(r["shared_cpu_pct"] if g == "shared" else r["cpu_pct"][g])

        a, b = fit(xs, [value(r) for r in runs])
        out[g] = {
            "cpu_pct_per_train": round(b, 4),
            "ci95": interval([s for _, s in bootstrap_fits(runs, value)], 4),
            "cpu_pct_fixed": round(a, 2),
        }
    return out


def prepare(cfg: PlaneConfig, work: Path) -> Shared:
    """The trip every train replays and the table signing key pair."""
    pki = work / "pki"
    subprocess.run(
        [str(cfg.bin_dir / "polycorn-pki"), "table-key", "--out", str(pki)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    run_s = cfg.idle_s + 60 + 0.05 * max(cfg.trains) + cfg.warmup_s + cfg.seconds
    run_s += TABLES_SEEN_WITHIN_S + 120
    return with_trip(cfg, work, pki, int(TRIP_SPREAD_S + run_s))


def run_series(cfg: PlaneConfig, work: Path, commit: str | None = None) -> dict[str, Any]:
    sh = prepare(cfg, work)
    signer = TableSigner.load(sh.pki / "table-signing.key")
    runs: list[dict[str, Any]] = []
    broken: list[dict[str, Any]] = []
    for rep in range(cfg.repeats):
        for n in cfg.trains:
            t = time.monotonic()
            try:
                r = run_plane(sh, n, rep, signer)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                print(f"n={n} r={rep}: did not run: {what}", flush=True)
                broken.append({"trains": n, "repeat": rep, "ok": False, "error": what})
                continue
            r["wall_s"] = round(time.monotonic() - t, 1)
            runs.append(r)
            p = r["table_propagation"]
            print(
                f"n={n} r={rep}: ok={r['ok']} shared CPU {r['shared_cpu_pct']} % "
                f"(kafka {r['cpu_pct']['kafka']}, ingest {r['cpu_pct']['ingest']}, "
                f"postgres {r['cpu_pct']['postgres']}), lag p50/p99 {r['ingest_lag_p50_ms']}/"
                f"{r['ingest_lag_p99_ms']} ms, Kafka {r['kafka_records_per_s']} rec/s, tables "
                f"p50/p99/max {p['delay_ms_p50']}/{p['delay_ms_p99']}/{p['delay_ms_max']} ms, "
                f"load {r['loadavg_1m']}",
                flush=True,
            )
            if not r["ok"]:
                print(f"  FAILED checks: {[c for c, v in r['checks'].items() if not v]}")
                print(f"  telemetry: {r['telemetry_records']} {r['telemetry_in_linkdb']}")
                for o in r["obituaries"]:
                    print(f"  {o}")
    fitted = [r for r in runs if r["ok"] and not r["saturated"]]
    sizes = sorted({r["trains"] for r in runs} | {b["trains"] for b in broken})
    held = [
        n
        for n in sizes
        if not any(b["trains"] == n for b in broken)
        and all(r["held"] for r in runs if r["trains"] == n)
    ]
    return {
        "ok": bool(runs) and all(r["ok"] for r in runs) and not broken,
        "largest_held": max(held, default=None),
        "held_sizes": held,
        "lag_held_ms": LAG_HELD_MS,
        "per_train": per_train_fit(fitted) if fitted else None,
        "fitted_runs": len(fitted),
        "sizes": [
            {
                "trains": n,
                "runs": len(rs := [r for r in runs if r["trains"] == n]),
                "shared_cpu_pct_median": statistics.median(r["shared_cpu_pct"] for r in rs)
                if rs
                else None,
                "ingest_lag_p99_ms_max": max((r["ingest_lag_p99_ms"] for r in rs), default=None),
                "table_delay_ms_max": max(
                    (r["table_propagation"]["delay_ms_max"] or 0.0 for r in rs), default=None
                ),
                "held": n in held,
            }
            for n in sizes
        ],
        "did_not_run": broken,
        "runs": runs,
        "load": {
            "trains_per_client": cfg.trains_per_client,
            "tables": cfg.tables,
            "table_entries": cfg.table_entries,
            "window_s": cfg.seconds,
            "warmup_s": cfg.warmup_s,
            "idle_s": cfg.idle_s,
            "repeats": cfg.repeats,
            "subflows_per_train": CARRIERS,
            "faults": list(cfg.faults),
            "trains_side": "polycorn-fleetsim --direct-kafka (no proxies)",
        },
        "environment": {
            **_machine(),
            "binaries": where(cfg.bin_dir),
            "binaries_commit": cfg.bin_commit or commit,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "method": "docs/benchmarks.md#the-shared-plane-at-fleet-scale-make-bench-fleet-plane",
    }


def markdown(res: dict[str, Any]) -> str:
    ld, env = res["load"], res["environment"]
    lines = [
        "# The fleet's shared plane (`make bench-fleet-plane`)",
        "",
        provenance.describe(res),
        "",
        f"{env['cpus']} cores ({env['cpu_model']}), binaries of commit "
        f"{env['binaries_commit']}, {env['date']}; one Kafka producer and one table consumer "
        f"per {ld['trains_per_client']} trains, {ld['tables']} signed tables of "
        f"{ld['table_entries']} entries per run, {ld['window_s']:g} s measured, "
        f"{ld['repeats']} repeat(s). Largest size held (every check, ingest lag p99 under "
        f"{res['lag_held_ms']:g} ms): {res['largest_held']}.",
        "",
        "| trains | rep | Kafka / ingest / PostgreSQL CPU (% core) | shared per train | ingest "
        "lag p50 / p99 (ms) | Kafka rec/s | Kafka kB/s | table delay p50 / p99 / max (ms) "
        "| load | checks |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["runs"]:
        c, p = r["cpu_pct"], r["table_propagation"]
        lines.append(
            f"| {r['trains']} | {r['repeat']} | {c['kafka']:.0f} / {c['ingest']:.0f} / "
            f"{c['postgres']:.0f} | {r['shared_cpu_pct_per_train']:.3f} | "
            f"{r['ingest_lag_p50_ms']:.0f} / {r['ingest_lag_p99_ms']:.0f} | "
            f"{r['kafka_records_per_s']:.0f} | {r['kafka_bytes_per_s'] / 1000:.1f} | "
            f"{p['delay_ms_p50']} / {p['delay_ms_p99']} / {p['delay_ms_max']} | "
            f"{r['loadavg_1m'][1]:.1f} | {'ok' if r['ok'] else 'FAILED'}"
            f"{' (saturated)' if r['saturated'] else ''} |"
        )
    for b in res["did_not_run"]:
        lines.append(
            f"| {b['trains']} | {b['repeat']} | did not run: {b['error']} ||||||| FAILED |"
        )
    if res["per_train"]:
        f = res["per_train"]
        lines += [
            "",
            "CPU per train (slope over the runs, % of a core, 95 % bootstrap interval over the "
            "repeats): "
            + "; ".join(f"{g} {v['cpu_pct_per_train']} {v['ci95']}" for g, v in f.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trains", type=parse_trains, default=[250, 500, 1000, 2000])
    ap.add_argument("--repeats", type=int, default=1, help="every size once, then again")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument(
        "--trains-per-client",
        type=int,
        default=10,
        help="trains per Kafka producer and per table consumer (a proxy has one of each: 1)",
    )
    ap.add_argument("--tables", type=int, default=3, help="tables published per window")
    ap.add_argument("--table-entries", type=int, default=1000)
    ap.add_argument("--port-base", type=int, default=29470, help="the simulator's metrics port")
    ap.add_argument("--sim-threads", type=int, help="polycorn-fleetsim's runtime threads")
    ap.add_argument(
        "--bin", type=Path, default=Path(os.environ.get("BIN", ROOT / "target/release"))
    )
    ap.add_argument("--bin-commit", help="the commit the binaries were built from, if not HEAD")
    ap.add_argument(
        "--fault", choices=FAULTS, action="append", default=[], help="seed a fault (repeatable)"
    )
    ap.add_argument(
        "--idle-s",
        type=float,
        default=10.0,
        help="Kafka's and PostgreSQL's CPU measured this long before the trains start (0: not)",
    )
    ap.add_argument("--work", type=Path, help="keep the run's files here")
    out = Path(os.environ.get("BENCH_OUT", ROOT / "bench/out"))
    ap.add_argument("--out", type=Path, default=out / "fleet-plane.json")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.tables < 1 or a.trains_per_client < 1:
        ap.error("--repeats, --tables and --trains-per-client are at least 1")
    prov = provenance.start(a.out, a.out.with_suffix(".md"))
    # SIGTERM unwinds like an exception, so every child process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cfg = PlaneConfig(
        bin_dir=a.bin,
        trains=a.trains,
        seconds=a.seconds,
        warmup_s=a.warmup_s,
        port_base=a.port_base,
        fault="lose-row" if "lose-row" in a.fault else None,
        faults=tuple(a.fault),
        idle_s=a.idle_s,
        bin_commit=a.bin_commit,
        sim=True,
        sim_threads=a.sim_threads,
        repeats=a.repeats,
        trains_per_client=a.trains_per_client,
        tables=a.tables,
        table_entries=a.table_entries,
    )
    for b in ("polycorn-fleetsim", "polycorn-pki", "polycorn-tracegen"):
        if not (a.bin / b).is_file():
            ap.error(f"{a.bin / b} missing: cargo build --release --locked first")
    with work_dir(a.work) as work:
        res = prov.stamp(run_series(cfg, work, prov.start.commit))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
