"""``make bench-fleet``: many trains against one cloud node, CPU and memory per train.

    python -m polycorn_benchrun.fleet [--trains 10,25,50,100] [--conns 100] [--seconds 60]
        [--bulk-share 0.2] [--bulk-rate 8192] [--chat-gap-s 5] [--out bench/out/fleet.json]
        [--sim [--sim-threads N]] [--repeats R]

The cloud node under test is what the Helm chart runs for a fleet: one
``polycorn-proxy`` per train (charts/polycorn/templates/proxy.yaml, a
StatefulSet of one pod per entry of ``trains``) with the chart's flags, the
Kafka broker and one ingest consumer writing LinkDB (the real Kafka and
PostGIS of ``scripts/infra.sh``, env ``POLYCORN_KAFKA_BOOTSTRAP``,
``POLYCORN_DATABASE_URL``). The trains are the load: per train one real
``polycorn-relay`` (its own certificate from ``polycorn-pki dev``, two TLS
subflows over loopback to its proxy, the radio replay of a polycorn-tracegen
trip as its telemetry source, each train at its own place of the trip, a
SOCKS5 listener) and ``--conns`` passenger connections from
``polycorn_benchrun.fleet_traffic``: a share of rate-limited downloads (back to
back, each on a fresh connection) and the rest chat connections, every byte
checked.

For each fleet size n of ``--trains`` (fresh processes, topic and database
each): start, ramp the passengers up, warm up, then measure ``--seconds``:
CPU of every process from /proc/<pid>/stat over the window (% of one core),
RSS from /proc/<pid>/status every second, the proxies' and relays' metrics
(parsed with prometheus_client) at both ends; afterwards the relays' spools
must drain, ingest must commit every record the proxies produced, the
telemetry topic is read back (records and bytes per second), and LinkDB
must hold every GPS fix and handover of each train's replayed stretch once.
Ingest lag is ``polycorn_benchrun.ingest``'s: commit time minus the record's
time (the train's clock when the relay made it), so it spans relay, proxy,
Kafka and ingest. A run with a failed check (a broken transfer, a refused
connection, a record missing) has ``"ok": false`` and the exit status is 1.

With ``--repeats R`` every size runs R times, the sizes interleaved (ascending, then
descending, ...). The per-train cost and what a node holds come from a straight-line fit
over the runs of the sizes the machine carried, with a 95 % bootstrap interval from the
repeats (docs/benchmarks.md, "Fleet load").

``--sim`` keeps the cloud node and replaces the trains' side (relays and passengers)
by one ``polycorn-fleetsim`` process for the whole fleet, so that hundreds of trains fit
on this machine: :mod:`polycorn_benchrun.fleet_sim`. ``--conns 0`` leaves the passengers
out.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import multiprocessing as mp
import os
import queue
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from polycorn_benchrun.ingest import _machine
from polycorn_harness import ROOT, provenance
from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.records import Rows
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.startup import kafka_create_topics, pg_connect
from polycorn_schema.testing import fresh_database

CLK_TCK = os.sysconf("SC_CLK_TCK")
CARRIERS = 2
TRIP_SPREAD_S = 300
# Simulated trains (--sim): proxy i listens on port_base + i and serves its metrics on
# port_base + SIM_MAX_TRAINS + i; the simulator's metrics are on port_base + 2 SIM_MAX_TRAINS.
SIM_MAX_TRAINS = 2000
# The chart's proxy flags (charts/polycorn/templates/proxy.yaml with the
# default values.yaml): the flow-control values are the binaries' defaults too.
CHART_PROXY_ARGS = (
    "--scheduler=hrsch+",
    "--transport=tls",
    "--subflow-cc=bbr",
    "--connect-timeout-s=10",
    "--conn-window=8388608",
    "--conn-window-initial=1048576",
    "--conn-send-buffer=8388608",
    "--mem-budget=268435456",
    "--log-json",
)
# Counters of trouble on the cloud side: any increase fails the run.
PROXY_TROUBLE = (
    "polycorn_conns_refused_total",
    "polycorn_proxy_handshakes_refused_total",
    "polycorn_proxy_telemetry_refused_total",
    "polycorn_proxy_telemetry_produce_errors_total",
    "polycorn_proxy_telemetry_dlq_total",
)
# Counters that must not move within the measurement window (at the end the
# passengers cut their downloads in flight, which resets those connections).
PROXY_WINDOW_TROUBLE = ("polycorn_conn_reset_total",)
RELAY_TROUBLE = (
    "polycorn_conns_refused_total",
    "polycorn_telemetry_spool_errors_total",
    "polycorn_capture_refused_total",
    "polycorn_capture_dial_failed_total",
)
# The relay's spool resends a record unconfirmed this long after it sent it; a
# confirmation otherwise takes a round trip and Kafka's commit. A record in flight
# longer than this has lost its confirmation at least once.
RESEND_AFTER_S = 5.0


@dataclass
class Config:
    bin_dir: Path
    trains: list[int]
    conns: int = 100
    bulk_share: float = 0.2
    bulk_rate: int = 8192
    bulk_size: int = 65_536
    chat_gap_s: float = 5.0
    seconds: float = 60.0
    warmup_s: float = 10.0
    ramp_s: float = 10.0
    port_base: int = 21000
    passengers_per_train: int = 10
    fault: str | None = None
    bin_commit: str | None = None
    #: The trains' side is one polycorn-fleetsim process (polycorn_benchrun.fleet_sim).
    sim: bool = False
    sim_threads: int | None = None
    #: Every size is run this many times, the sizes interleaved (all once, then again).
    repeats: int = 1


# --------------------------------------------------------------------------- /proc


def cpu_ticks(pid: int) -> int:
    """utime + stime of the process (all its threads), in clock ticks; 0 once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(f[11]) + int(f[12])


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(ppid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def infra_pids(url: str | None = None) -> dict[str, list[int]]:
    """Kafka's and PostgreSQL's processes of scripts/infra.sh's instance (for their CPU).

    With ``url``, PostgreSQL's backends serving another database are left out: the instance
    is shared (other benchmarks and tests use databases of their own on it), and their work
    is not this node's cost. The server's own processes (checkpointer, WAL writer,
    autovacuum launcher) stay in; Kafka's broker cannot be split that way."""
    state = Path(os.environ.get("POLYCORN_INFRA_DIR", "/tmp/polycorn-infra"))
    out: dict[str, list[int]] = {}
    with contextlib.suppress(OSError, ValueError):
        out["kafka"] = [int((state / "kafka/pid").read_text().split()[0])]
    with contextlib.suppress(OSError, ValueError):
        pm = int((state / "pg/data/postmaster.pid").read_text().split()[0])
        others = other_databases_backends(url) if url else set()
        out["postgres"] = [pm, *(p for p in children(pm) if p not in others)]
    return out


def other_databases_backends(url: str) -> set[int]:
    """The pids of PostgreSQL backends connected to a database other than ``url``'s."""
    with pg_connect(url) as c:
        rows = c.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname IS NOT NULL AND datname <> current_database()"
        ).fetchall()
    return {int(r[0]) for r in rows}


def where(path: Path) -> str:
    """``path`` as a result file records it: relative to the repository when it
    is inside (a result names no workstation's directories), else as given."""
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# --------------------------------------------------------------------------- metrics


def scrape(addr: str, timeout: float = 3.0) -> dict[str, float]:
    """A /metrics page as sample name → sum over its label sets; {} when unreachable."""
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def wait_listening(addr: str, timeout: float = 30.0) -> None:
    """Until something accepts TCP connections at ``addr`` (a passenger's first
    connection must not find the origin still starting)."""
    host, port = addr.rsplit(":", 1)
    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError(f"nothing listens on {addr} after {timeout:g} s") from None
            time.sleep(0.1)


def paths_up(addr: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return sum(
        1
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "polycorn_path_up" and s.value == 1
    )


# --------------------------------------------------------------------------- processes


class Procs:
    """The benchmark's child processes, each in its own session, logs in ``logs``."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.p: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.p[name] = p
        return p

    def pid(self, name: str) -> int:
        return self.p[name].pid

    def dead(self) -> list[str]:
        return [n for n, p in self.p.items() if p.poll() is not None]

    def obituary(self, name: str, lines: int = 5) -> str:
        """How a process ended: its exit status and the last lines of its log (a run's
        work directory is gone when the benchmark returns, so the result keeps them)."""
        log = self.logs / f"{name}.log"
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        return f"{name} exited with status {self.p[name].returncode}: " + " | ".join(tail)

    def stop(self, names: list[str] | None = None, timeout: float = 10.0) -> None:
        names = list(self.p) if names is None else names
        for n in names:
            if self.p[n].poll() is None:
                self.p[n].terminate()
        end = time.monotonic() + timeout
        for n in names:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p[n].wait(max(0.1, end - time.monotonic()))
            if self.p[n].poll() is None:
                self.p[n].kill()
                self.p[n].wait()
            del self.p[n]


# --------------------------------------------------------------------------- ingest


def _ingest_worker(  # noqa: PLR0917
    url: str, bootstrap: str, topic: str, group: str, out: Any, stop: Any
) -> None:
    """One ingest consumer (the production Ingestor and its defaults); every commit's
    record count and lags (commit time minus record time) go to ``out``."""
    cfg = IngestConfig(bootstrap, group=group, topic=topic, dlq_topic=topic + ".dlq")

    def hook(rows: Rows, commit_s: float) -> None:
        out.put((commit_s, [commit_s - t / 1000 for t in rows.times]))

    ing = Ingestor(cfg, LinkDbSink(url), Metrics(), on_commit=hook)

    def watch() -> None:
        stop.wait()
        ing.stop()

    threading.Thread(target=watch, daemon=True).start()
    ing.run()


# --------------------------------------------------------------------------- the trip


def trip_events(trip: Path) -> tuple[list[int], list[tuple[str, int, int]]]:
    """The trip's GPS fix times and handovers (carrier, start, end), trip ms."""
    fixes: list[int] = []
    hos: list[tuple[str, int, int]] = []
    for line in (trip / "events.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        e = json.loads(line)
        if e["event"] == "gps":
            fixes.append(int(e["t_ms"]))
        elif e["event"] == "handover_end" and e["carrier"] < CARRIERS:
            t = int(e["t_ms"])
            hos.append((f"carrier-{e['carrier']}", t - int(e["duration_ms"]), t))
    return fixes, hos


def spool_keeps_up(m: dict[str, float]) -> bool:
    """A relay's spool (or the simulator's, over its trains) from its metrics: every
    record held is in flight (none waits for the sender) and none in flight has waited
    past its first resend for the proxy's confirmation."""
    held = m.get("polycorn_telemetry_spool_records")
    in_flight = m.get("polycorn_telemetry_spool_in_flight")
    oldest = m.get("polycorn_telemetry_spool_oldest_in_flight_seconds")
    if held is None or in_flight is None or oldest is None:
        return False
    return held == in_flight and oldest < RESEND_AFTER_S


def check_train_telemetry(  # noqa: PLR0917
    fixes: list[int],
    hos: list[tuple[str, int, int]],
    epoch_ms: int,
    got_fixes: list[int],
    got_hos: list[tuple[str, int]],
    started_ms: int,
    stopped_ms: int,
) -> dict[str, Any]:
    """LinkDB's rows of one train against the trip it replayed from ``started_ms`` to
    ``stopped_ms`` (Unix ms): the fixes a contiguous run of the trip's, from its start
    to its stop (2 s of slack at each end), each once; every handover that ended in
    that run once; nothing that is not in the trip."""
    want = [epoch_ms + t for t in fixes]
    problems: list[str] = []
    dups = len(got_fixes) - len(set(got_fixes))
    gf = sorted(set(got_fixes))
    extra_f = [
        t
        for t in gf
        if bisect.bisect_left(want, t) >= len(want) or want[bisect.bisect_left(want, t)] != t
    ]
    missing_f = 0
    if gf and not extra_f:
        i0, i1 = bisect.bisect_left(want, gf[0]), bisect.bisect_left(want, gf[-1])
        missing_f = (i1 - i0 + 1) - len(gf)
        if gf[0] > started_ms + 2000 + 1000:
            problems.append(f"first fix {gf[0] - started_ms} ms after the relay started")
        if gf[-1] < stopped_ms - 2000 - 1000:
            problems.append(f"last fix {stopped_ms - gf[-1]} ms before the relay stopped")
    if not gf:
        problems.append("no GPS fix in LinkDB")
    want_h = {(c, epoch_ms + s): epoch_ms + e for c, s, e in hos}
    gh = set(got_hos)
    dups_h = len(got_hos) - len(gh)
    extra_h = [h for h in gh if h not in want_h]
    inner = (gf[0] + 2000, gf[-1] - 2000) if gf else (0, -1)
    missing_h = [h for h, end in want_h.items() if inner[0] <= end <= inner[1] and h not in gh]
    if dups or dups_h:
        problems.append(f"duplicates: {dups} fixes, {dups_h} handovers")
    if extra_f or extra_h:
        problems.append(f"not in the trip: {len(extra_f)} fixes, {len(extra_h)} handovers")
    if missing_f or missing_h:
        problems.append(f"missing: {missing_f} fixes, {len(missing_h)} handovers")
    return {
        "fixes": len(got_fixes),
        "handovers": len(got_hos),
        "ok": not problems,
        "problems": problems,
    }


# --------------------------------------------------------------------------- one fleet


@dataclass
class Shared:
    cfg: Config
    work: Path
    pki: Path
    trip: Path
    bootstrap: str
    fixes: list[int] = field(default_factory=list)
    hos: list[tuple[str, int, int]] = field(default_factory=list)


def train_id(i: int) -> str:
    return f"train-fl{i:04d}"


class Fleet:
    """One fleet of ``n`` trains: its topics, processes and ingest consumer, and the
    telemetry commits ingest has reported so far."""

    def __init__(self, sh: Shared, n: int) -> None:
        self.sh, self.n, self.cfg = sh, n, sh.cfg
        self.tag = f"{secrets.token_hex(3)}n{n}"
        self.work = sh.work / f"n{n}"
        self.procs = Procs(self.work / "logs")
        self.topic, self.dlq, self.tables = (
            f"fleet.telemetry.{self.tag}",
            f"fleet.telemetry.{self.tag}.dlq",
            f"fleet.tables.{self.tag}",
        )
        self.ctx = mp.get_context("spawn")
        self.ingest: Any = None
        self.stop_ingest = self.ctx.Event()
        self.lagq: Any = None
        #: LinkDB's URL for this size (set by start).
        self.url: str | None = None
        self.origin = f"127.0.0.2:{self.cfg.port_base + 999}"
        self.trains: list[dict[str, Any]] = []
        #: Records ingest has committed, and the lags of those committed in the window.
        self.committed = 0
        self.lags: list[float] = []
        #: Ports of proxy i: b + i (subflows), b + stride + i (metrics).
        self.stride = 200

    def wait_sim_trains(self, metrics: str, per_train_s: float, what: str) -> None:
        """Until the simulator at ``metrics`` counts all ``n`` trains as up
        (``polycorn_fleetsim_trains_connected_once``: ``what`` happened for
        each), within 60 s plus ``per_train_s`` a train; else an error that
        names the dead processes and the logs."""
        deadline = time.monotonic() + 60 + per_train_s * self.n
        while True:
            up = int(scrape(metrics).get("polycorn_fleetsim_trains_connected_once", 0))
            if up >= self.n:
                return
            if time.monotonic() > deadline or self.procs.dead():
                raise RuntimeError(
                    f"{up} of {self.n} simulated trains {what} (dead: {self.procs.dead()}); "
                    f"logs in {self.work}"
                )
            time.sleep(0.5)

    def create_topics(self) -> None:
        kafka_create_topics(
            self.sh.bootstrap,
            [
                NewTopic(self.topic, 8, 1),
                NewTopic(self.dlq, 1, 1),
                NewTopic(self.tables, 1, 1, config={"cleanup.policy": "compact"}),
            ],
        )
        self.admin = AdminClient({"bootstrap.servers": self.sh.bootstrap})

    # ---- the start: ingest, origin, proxies, relays

    def start(self, url: str) -> None:
        """Ingest on the database at ``url``, the origin and every train, connected, and
        ingest's first commit."""
        self.start_ingest(url)
        self.procs.start(
            "origin",
            [sys.executable, "-m", "polycorn_benchrun.fleet_traffic", "origin"]
            + ["--listen", self.origin]
            + (["--fault", self.cfg.fault] if self.cfg.fault in ("corrupt", "short") else []),
        )
        wait_listening(self.origin)
        self.start_proxies()
        self.start_relays()
        self.wait_connected()
        self.first_commit()

    def start_ingest(self, url: str) -> None:
        """One ingest consumer (a process of its own) on the database at ``url``."""
        self.url = url
        self.lagq = self.ctx.Queue()
        self.ingest = self.ctx.Process(
            target=_ingest_worker,
            args=(
                url,
                self.sh.bootstrap,
                self.topic,
                f"fleet-{self.tag}",
                self.lagq,
                self.stop_ingest,
            ),
            daemon=True,
        )
        self.ingest.start()

    def first_commit(self) -> None:
        """Until ingest has joined its group and writes (the trains' telemetry flows)."""
        try:
            first = self.lagq.get(timeout=120)
        except queue.Empty:
            raise RuntimeError("ingest committed nothing within 120 s") from None
        self.committed = len(first[1])

    def start_proxies(self) -> None:
        """One proxy per train with the chart's flags; the trains' addresses and places."""
        cfg, sh, b = self.cfg, self.sh, self.cfg.port_base
        now_ms = int(time.time() * 1000)
        for i in range(self.n):
            t = train_id(i)
            pp, pm, sp, rm = b + i, b + self.stride + i, b + 400 + i, b + 600 + i
            self.procs.start(
                f"proxy-{i}",
                [
                    str(cfg.bin_dir / "polycorn-proxy"),
                    f"--train-id={t}",
                    f"--listen=127.0.0.1:{pp}",
                    f"--metrics-listen=127.0.0.1:{pm}",
                    f"--ca={sh.pki / 'ca.crt'}",
                    f"--cert={sh.pki / 'proxy.crt'}",
                    f"--key={sh.pki / 'proxy.key'}",
                    *CHART_PROXY_ARGS,
                    "--allow=127.0.0.2/32",
                    # The origin listens on the proxies' host: open that address only.
                    "--allow-own-address=127.0.0.2",
                    f"--kafka-brokers={sh.bootstrap}",
                    f"--kafka-topic={self.topic}",
                    f"--kafka-dlq-topic={self.dlq}",
                    f"--failure-table-topic={self.tables}",
                ],
            )
            # Each train at its own place of the trip: trip time 0 was offset s ago.
            offset_s = (i * 37) % TRIP_SPREAD_S
            epoch = now_ms - offset_s * 1000
            self.trains.append(
                {
                    "id": t,
                    "proxy": f"127.0.0.1:{pp}",
                    "proxy_metrics": f"127.0.0.1:{pm}",
                    "relay_metrics": f"127.0.0.1:{rm}",
                    "socks": f"127.0.0.1:{sp}",
                    "epoch_ms": epoch,
                    "sources": [
                        f"127.{64 + i // 256}.{i % 256}.{k + 1}"
                        for k in range(cfg.passengers_per_train)
                    ],
                }
            )

    def start_relays(self) -> None:
        cfg, sh, b = self.cfg, self.sh, self.cfg.port_base
        for i, tr in enumerate(self.trains):
            self.procs.start(
                f"relay-{i}",
                [
                    str(cfg.bin_dir / "polycorn-relay"),
                    f"--train-id={tr['id']}",
                    *[f"--path=carrier-{c}=@127.0.0.1:{b + i}" for c in range(CARRIERS)],
                    f"--ca={sh.pki / 'ca.crt'}",
                    f"--cert={sh.pki / (tr['id'] + '.crt')}",
                    f"--key={sh.pki / (tr['id'] + '.key')}",
                    "--proxy-name=proxy.polycorn",
                    f"--listen-socks={tr['socks']}",
                    f"--metrics-listen={tr['relay_metrics']}",
                    f"--replay-events={sh.trip / 'events.jsonl'}",
                    f"--replay-epoch-unix-ms={tr['epoch_ms']}",
                    f"--telemetry-spool={self.work / 'spool' / tr['id']}",
                    "--log-json",
                ],
            )
            tr["started_ms"] = int(time.time() * 1000)

    def wait_connected(self) -> None:
        """Until every relay has both subflows up."""
        deadline = time.monotonic() + 60 + self.n
        for tr in self.trains:
            while paths_up(tr["relay_metrics"]) < CARRIERS:
                if time.monotonic() > deadline or self.procs.dead():
                    raise RuntimeError(
                        f"{tr['id']}: subflows not up (dead: {self.procs.dead()}); "
                        f"logs in {self.work}"
                    )
                time.sleep(0.2)
        print(f"n={self.n}: {self.n} relays connected to {self.n} proxies", flush=True)

    def start_passengers(self) -> subprocess.Popen[bytes]:
        cfg = self.cfg
        bulk = round(cfg.conns * cfg.bulk_share)
        plan = {
            "origin": self.origin,
            "trains": [{"socks": t["socks"], "sources": t["sources"]} for t in self.trains],
            "conns": cfg.conns,
            "bulk": bulk,
            "bulk_rate": cfg.bulk_rate,
            "bulk_size": cfg.bulk_size,
            "chat_gap_s": cfg.chat_gap_s,
            "ramp_s": cfg.ramp_s,
            "seconds": cfg.ramp_s + cfg.warmup_s + cfg.seconds + 5,
            "seed": self.n,
        }
        (self.work / "plan.json").write_text(json.dumps(plan))
        return self.procs.start(
            "passengers",
            [
                sys.executable,
                "-m",
                "polycorn_benchrun.fleet_traffic",
                "passengers",
                "--plan",
                str(self.work / "plan.json"),
                "--out",
                str(self.work / "passengers.json"),
            ],
        )

    def drain_lags(self, window: tuple[float, float] | None) -> None:
        """Ingest's commits so far counted; the lags of those within ``window`` kept."""
        while True:
            try:
                commit_s, ls = self.lagq.get_nowait()
            except queue.Empty:
                return
            self.committed += len(ls)
            if window and window[0] <= commit_s <= window[1]:
                self.lags.extend(ls)

    def warm_up(self, pax_t0: float) -> None:
        """The passengers' ramp and the warm-up after it."""
        while time.monotonic() < pax_t0 + self.cfg.ramp_s + self.cfg.warmup_s:
            self.drain_lags(None)
            time.sleep(0.5)

    # ---- the measurement window

    #: The trains' processes whose RSS is sampled.
    RSS_GROUP = "relay"

    def train_groups(self, pax: subprocess.Popen[bytes]) -> dict[str, list[int]]:
        """The trains' side's processes, by group, for their CPU."""
        return {
            "relay": [self.procs.pid(f"relay-{i}") for i in range(self.n)],
            "passengers": [pax.pid],
        }

    def measure(self, pax: subprocess.Popen[bytes]) -> dict[str, Any]:
        """CPU and RSS of every process and the proxies' metrics over the window, as
        :func:`summarize` takes them."""
        n, procs = self.n, self.procs
        groups: dict[str, list[int]] = {
            "proxy": [procs.pid(f"proxy-{i}") for i in range(n)],
            **self.train_groups(pax),
            "ingest": [self.ingest.pid],
            "origin": [procs.pid("origin")],
            **infra_pids(self.url),
        }
        # The scrapes first: on a loaded machine they take a while, and the
        # CPU is divided by the wall time between the two readings of it.
        m_before = [scrape(t["proxy_metrics"]) for t in self.trains]
        w0 = time.time()
        before = {g: [cpu_ticks(p) for p in ps] for g, ps in groups.items()}
        busy0 = machine_busy()
        load0 = os.getloadavg()
        rss: dict[str, list[list[int]]] = {
            g: [[] for _ in groups[g]] for g in ("proxy", self.RSS_GROUP)
        }
        while time.time() < w0 + self.cfg.seconds:
            for g in rss:
                for k, p in enumerate(groups[g]):
                    rss[g][k].append(rss_kib(p))
            self.drain_lags((w0, w0 + self.cfg.seconds))
            time.sleep(max(0.0, 1.0 - (time.time() - w0) % 1.0))
        w1 = time.time()
        after = {g: [cpu_ticks(p) for p in ps] for g, ps in groups.items()}
        busy1 = machine_busy()
        load1 = os.getloadavg()
        # The passengers end on their own a few seconds after the window.
        dead_during = [d for d in procs.dead() if not (d == "passengers" and pax.returncode == 0)]
        m_after = [scrape(t["proxy_metrics"]) for t in self.trains]
        span = w1 - w0
        cpu = {
            g: 100.0
            * sum(a - bb for a, bb in zip(after[g], before[g], strict=True))
            / CLK_TCK
            / span
            for g in groups
        }
        per_proxy_cpu = [
            100.0 * (a - bb) / CLK_TCK / span
            for a, bb in zip(after["proxy"], before["proxy"], strict=True)
        ]
        return {
            "span": span,
            "cpu": cpu,
            "per_proxy_cpu": per_proxy_cpu,
            "rss": rss,
            "m_before": m_before,
            "m_after": m_after,
            "window": (w0, w1),
            "machine": (busy0, busy1, load0, load1),
            "dead": dead_during,
            "obituaries": [procs.obituary(d) for d in dead_during],
        }

    # ---- the end: passengers, spools, relays, ingest

    def finish(
        self, pax: subprocess.Popen[bytes], window: tuple[float, float]
    ) -> tuple[dict[str, Any], int]:
        """The passengers' end, the relays' spools drained and the relays stopped, and
        ingest caught up with what the proxies produced: what :func:`summarize` takes of
        it, and when the relays stopped (Unix ms)."""
        self.wait_passengers(pax)
        drained = self.wait_spools_drained(window)
        relay_final = [scrape(a) for a in self.relay_metrics()]
        stopped_ms = int(time.time() * 1000)
        self.stop_relays()
        report = self.passenger_report()
        time.sleep(1.0)
        proxy_final = [scrape(t["proxy_metrics"]) for t in self.trains]
        produced = sum(m.get("polycorn_proxy_telemetry_produced_total", 0) for m in proxy_final)
        end = time.monotonic() + 120
        while self.committed < produced and time.monotonic() < end:
            self.drain_lags(window)
            time.sleep(0.5)
        time.sleep(2.0)
        self.drain_lags(window)
        ended = {
            "report": report,
            "drained": drained,
            "relay_final": relay_final,
            "proxy_final": proxy_final,
            "produced": produced,
        }
        return ended, stopped_ms

    def wait_passengers(self, pax: subprocess.Popen[bytes]) -> None:
        cfg = self.cfg
        pax.wait(timeout=cfg.seconds + cfg.ramp_s + cfg.warmup_s + 120)

    def passenger_report(self) -> dict[str, Any]:
        """The passengers' report (``fleet_traffic``'s form)."""
        report: dict[str, Any] = json.loads((self.work / "passengers.json").read_text())
        return report

    def relay_metrics(self) -> list[str]:
        """Where the trains' side serves its metrics."""
        return [t["relay_metrics"] for t in self.trains]

    def stop_relays(self) -> None:
        self.procs.stop([f"relay-{i}" for i in range(self.n)])

    def wait_spools_drained(self, window: tuple[float, float]) -> bool:
        """Until, at one look, every relay's spool keeps up (:func:`spool_keeps_up`), at
        most 60 s; whether it did. The trains replay their trip until they stop, so a
        spool is seldom empty: every relay's at the same instant least of all."""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            self.drain_lags(window)
            if all(spool_keeps_up(scrape(a)) for a in self.relay_metrics()):
                return True
            time.sleep(1.0)
        return False

    # ---- LinkDB against the trip

    def check_linkdb(self, url: str, stopped_ms: int) -> dict[str, Any]:
        """Each train's fixes and handovers in LinkDB against the stretch of the trip it
        replayed (:func:`check_train_telemetry`)."""
        tele: dict[str, Any] = {}
        with pg_connect(url) as c:
            if self.cfg.fault == "lose-row":
                c.execute(
                    "DELETE FROM gps_fixes WHERE ctid IN (SELECT ctid FROM gps_fixes "
                    "WHERE train_id = %s ORDER BY time LIMIT 1 OFFSET 5)",
                    (train_id(0),),
                )
                c.commit()
            for tr in self.trains:
                f = [
                    int(r[0])
                    for r in c.execute(
                        "SELECT (extract(epoch FROM time) * 1000)::bigint FROM gps_fixes "
                        "WHERE train_id = %s",
                        (tr["id"],),
                    ).fetchall()
                ]
                h = [
                    (str(r[0]), int(r[1]))
                    for r in c.execute(
                        "SELECT carrier, (extract(epoch FROM start_time) * 1000)::bigint "
                        "FROM handovers WHERE train_id = %s",
                        (tr["id"],),
                    ).fetchall()
                ]
                tele[tr["id"]] = check_train_telemetry(
                    self.sh.fixes, self.sh.hos, tr["epoch_ms"], f, h, tr["started_ms"], stopped_ms
                )
        return tele

    def sim_result(self, measured: dict[str, Any]) -> dict[str, Any] | None:
        """What only simulated trains add to the result: their checks and the load
        generator's cost (``SimFleet``); None for real relays."""
        return None

    def tear_down(self) -> None:
        """Ingest, every process and the fleet's topics, whatever of them was started."""
        self.stop_ingest.set()
        self.procs.stop()
        if self.ingest is not None:
            self.ingest.join(30)
            if self.ingest.is_alive():
                self.ingest.kill()
        for fut in self.admin.delete_topics([self.topic, self.dlq, self.tables]).values():
            with contextlib.suppress(Exception):
                fut.result(30)


def run_fleet(sh: Shared, n: int) -> dict[str, Any]:
    if sh.cfg.sim:
        # The simulated trains' side builds on this module's Fleet.
        from polycorn_benchrun.fleet_sim import SimFleet  # noqa: PLC0415

        fl: Fleet = SimFleet(sh, n)
    else:
        fl = Fleet(sh, n)
    fl.create_topics()
    try:
        with fresh_database(prefix="linkdb_fleet") as url:
            fl.start(url)
            pax = fl.start_passengers()
            fl.warm_up(time.monotonic())
            measured = fl.measure(pax)
            ended, stopped_ms = fl.finish(pax, measured["window"])
            # ---- the topic read back
            topic_stats = read_topic(sh.bootstrap, fl.topic, *measured["window"])
            tele = fl.check_linkdb(url, stopped_ms)
    finally:
        fl.tear_down()
    return summarize(
        n,
        sh.cfg,
        **measured,
        **ended,
        lags=fl.lags,
        committed=fl.committed,
        tele=tele,
        topic_stats=topic_stats,
        sim=fl.sim_result(measured),
    )


def read_topic(bootstrap: str, topic: str, w0: float, w1: float) -> dict[str, Any]:
    """Every record of the telemetry topic: counts, bytes, and the rates in [w0, w1]
    by the records' timestamps (set by the proxies' producers)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fleet-read-{secrets.token_hex(3)}",
            "enable.auto.commit": False,
        }
    )
    md = c.list_topics(topic, timeout=10)
    parts = list(md.topics[topic].partitions)
    highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    pos = dict.fromkeys(parts, 0)
    records = nbytes = in_w = bytes_w = 0
    per_train: dict[str, int] = {}
    end = time.monotonic() + 120
    while any(pos[p] < highs[p] for p in parts) and time.monotonic() < end:
        for m in c.consume(num_messages=10_000, timeout=1.0):
            if m.error() is not None:
                continue
            size = len(m.value() or b"") + len(m.key() or b"")
            pos[m.partition() or 0] = (m.offset() or 0) + 1
            records += 1
            nbytes += size
            k = (m.key() or b"").decode()
            per_train[k] = per_train.get(k, 0) + 1
            ts = m.timestamp()[1] / 1000
            if w0 <= ts < w1:
                in_w += 1
                bytes_w += size
    c.close()
    return {
        "records": records,
        "bytes": nbytes,
        "records_per_s": round(in_w / (w1 - w0), 1),
        "bytes_per_s": round(bytes_w / (w1 - w0)),
        "per_train": per_train,
    }


def summarize(n: int, cfg: Config, **k: Any) -> dict[str, Any]:
    span: float = k["span"]
    cpu: dict[str, float] = k["cpu"]
    rss: dict[str, list[list[int]]] = k["rss"]
    report: dict[str, Any] = k["report"]
    tele: dict[str, dict[str, Any]] = k["tele"]
    per_proxy_p99 = [quantile([x / 1024 for x in s if x], 0.99) for s in rss["proxy"]]
    per_proxy_p50 = [quantile([x / 1024 for x in s if x], 0.50) for s in rss["proxy"]]
    per_relay_p99 = [quantile([x / 1024 for x in s if x], 0.99) for s in rss.get("relay", [])]
    # Growth: the last 10 s against the first 10 s of the window, per proxy.
    growth = [
        (statistics.mean(s[-10:]) - statistics.mean(s[:10])) / 1024
        for s in rss["proxy"]
        if len(s) >= 20
    ]
    delta: dict[str, float] = {}
    for before, after in zip(k["m_before"], k["m_after"], strict=True):
        for name in (
            *PROXY_WINDOW_TROUBLE,
            "polycorn_proxy_telemetry_produced_total",
            "polycorn_path_sent_bytes_total",
            "polycorn_path_received_bytes_total",
        ):
            delta[name] = delta.get(name, 0.0) + after.get(name, 0.0) - before.get(name, 0.0)
    trouble = {
        f"proxy:{name}": sum(m.get(name, 0.0) for m in k["proxy_final"]) for name in PROXY_TROUBLE
    }
    trouble |= {
        f"relay:{name}": sum(m.get(name, 0.0) for m in k["relay_final"]) for name in RELAY_TROUBLE
    }
    trouble |= {f"proxy:{name} (window)": delta[name] for name in PROXY_WINDOW_TROUBLE}
    trouble["proxy:polycorn_mem_budget_grants_denied_total"] = sum(
        m.get("polycorn_mem_budget_grants_denied_total", 0.0) for m in k["proxy_final"]
    )
    budget_peak = max(
        (m.get("polycorn_mem_budget_peak_bytes", 0.0) for m in k["proxy_final"]), default=0.0
    )
    trains = report["trains"]
    xfer = {
        key: sum(int(t[key]) for t in trains)
        for key in (
            "bulk_done",
            "bulk_bytes",
            "bulk_failed",
            "bulk_cut_at_end",
            "chat_ok",
            "chat_failed",
            "corrupt",
        )
    }
    errors = [e for t in trains for e in t["errors"]][:10]
    acked = sum(m.get("polycorn_telemetry_spool_acked_total", 0.0) for m in k["relay_final"])
    produced = k["produced"]
    topic = k["topic_stats"]
    bps = report["bulk_bytes_per_s"]
    lo, hi = int(cfg.ramp_s + cfg.warmup_s), int(cfg.ramp_s + cfg.warmup_s + span)
    pax_bps = statistics.mean(bps[lo:hi]) if len(bps) > lo else 0.0
    busy0, busy1, load0, load1 = k["machine"]
    lags: list[float] = k["lags"]
    bulk_conns = round(cfg.conns * cfg.bulk_share)
    chat_conns = cfg.conns - bulk_conns
    checks = {
        "every transfer complete and byte-exact": xfer["bulk_failed"] == 0
        and xfer["chat_failed"] == 0
        and xfer["corrupt"] == 0
        and all(
            (t["bulk_done"] > 0 or not bulk_conns) and (t["chat_ok"] > 0 or not chat_conns)
            for t in trains
        ),
        "no refusal, reset or Kafka error on the proxies, none on the relays": not any(
            v > 0 for name, v in trouble.items() if "grants_denied" not in name
        ),
        "every relay's telemetry confirmed after Kafka (none waiting to be sent or "
        "unconfirmed past the resend timeout)": bool(k["drained"]),
        "ingest committed every record the proxies produced": k["committed"] >= produced > 0,
        "the topic holds what the proxies produced and the relays saw confirmed": topic["records"]
        == produced
        and acked <= produced,
        "LinkDB holds each train's GPS fixes and handovers once, none missing": all(
            v["ok"] for v in tele.values()
        ),
        "no process died": not k["dead"],
    }
    bad_tele = {t: v["problems"] for t, v in tele.items() if not v["ok"]}
    offered = round(cfg.conns * cfg.bulk_share) * cfg.bulk_rate
    delivered = pax_bps / n
    loop_lag = report.get("loop_lag_ms", [])
    loop_lag_p99 = quantile(loop_lag, 0.99) if loop_lag else 0.0
    # The simulated trains' own checks and numbers (SimFleet.sim_result).
    extra: dict[str, Any] = dict(k.get("sim") or {"mode": "relays"})
    checks |= extra.pop("checks", {})
    if not loop_lag and "load_generator" in extra:
        # No passengers: the simulator's own event loop says whether it kept up.
        loop_lag_p99 = extra["load_generator"]["loop_lag_ms_p99"]
    return {
        "trains": n,
        **extra,
        "ok": all(checks.values()),
        "checks": checks,
        "window_s": round(span, 1),
        "proxy_rss_mb_p50": round(quantile(per_proxy_p50, 0.5), 1),
        "proxy_rss_mb_p99": round(quantile(per_proxy_p99, 0.99), 1),
        "proxy_rss_mb_max": round(max(per_proxy_p99, default=0.0), 1),
        "proxy_rss_growth_mb_max": round(max(growth, default=0.0), 2),
        "relay_rss_mb_p99": round(quantile(per_relay_p99, 0.99), 1) if per_relay_p99 else None,
        "cpu_per_train_pct": round(cpu["proxy"] / n, 2),
        "proxy_cpu_pct_p99": round(quantile(per_proxy_cpu := k["per_proxy_cpu"], 0.99), 2),
        "proxy_cpu_pct_max": round(max(per_proxy_cpu, default=0.0), 2),
        "cpu_pct": {g: round(v, 1) for g, v in cpu.items()},
        "cloud_cpu_pct": round(
            sum(cpu.get(g, 0.0) for g in ("proxy", "ingest", "kafka", "postgres")), 1
        ),
        "proxy_rss_mb_sum": round(sum(per_proxy_p50), 1),
        "ingest_lag_p50_ms": round(quantile(lags, 0.5) * 1000, 1),
        "ingest_lag_p99_ms": round(quantile(lags, 0.99) * 1000, 1),
        "ingest_lag_max_ms": round(max(lags, default=float("nan")) * 1000, 1),
        "ingest_lag_records": len(lags),
        "kafka_records_per_s": topic["records_per_s"],
        "kafka_bytes_per_s": topic["bytes_per_s"],
        "telemetry_records": {
            "produced": int(produced),
            "in_topic": topic["records"],
            "committed_by_ingest": k["committed"],
            "relays_acked": int(acked),
        },
        "passenger_goodput_mbit_s_per_train": round(pax_bps * 8 / 1e6 / n, 3),
        "offered_mbit_s_per_train": round(offered * 8 / 1e6, 3),
        # The machine could not carry the offered load (the downloads fell behind their
        # pace): the run's CPU per train is not what the load costs, and the fit leaves
        # it out.
        "saturated": delivered < SATURATED * offered or loop_lag_p99 > LOOP_LAG_SATURATED_MS,
        "passenger_loop_lag_ms_p99": round(loop_lag_p99, 1),
        "passenger_loop_lag_ms_max": round(max(loop_lag, default=0.0), 1),
        "subflow_bytes_per_s_per_train": round(
            (delta["polycorn_path_sent_bytes_total"] + delta["polycorn_path_received_bytes_total"])
            / span
            / n
        ),
        "transfers": xfer,
        "transfer_errors": errors,
        "chat_rtt_ms_p50": round(quantile(report["chat_rtt_ms"], 0.5), 1),
        "chat_rtt_ms_p99": round(quantile(report["chat_rtt_ms"], 0.99), 1),
        "telemetry_in_linkdb": {
            "fixes": sum(v["fixes"] for v in tele.values()),
            "handovers": sum(v["handovers"] for v in tele.values()),
            "trains_with_problems": bad_tele,
        },
        "trouble_counters": dict(trouble),
        "mem_budget_peak_mb": round(budget_peak / 2**20, 1),
        "machine_busy_pct": round(100.0 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 1),
        "loadavg_1m": [round(load0[0], 2), round(load1[0], 2)],
        "dead": k["dead"],
        "obituaries": k["obituaries"],
    }


# --------------------------------------------------------------------------- the series


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b·x: (a, b); one size only: the line through 0."""
    if len(set(xs)) < 2:
        return 0.0, statistics.fmean(ys) / statistics.fmean(xs)
    b, a = statistics.linear_regression(xs, ys)
    return a, b


#: Bootstrap resamples of the fit, and their seed (the interval is reproducible).
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 20261130


def bootstrap_fits(
    runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], float]
) -> list[tuple[float, float]]:
    """The line's (a, b) over resamples of the runs, each size's runs drawn with replacement
    within that size (so every resample keeps every size): the spread of the repeats at each
    size becomes the fit's interval. Empty when no size was repeated (nothing to resample)."""
    by_size: dict[int, list[float]] = {}
    for r in runs:
        by_size.setdefault(r["trains"], []).append(key(r))
    if all(len(v) < 2 for v in by_size.values()):
        return []
    rng = random.Random(BOOTSTRAP_SEED)  # noqa: S311 (a resample, not a secret)
    out = []
    for _ in range(BOOTSTRAP):
        xs: list[float] = []
        ys: list[float] = []
        for n, v in by_size.items():
            xs += [float(n)] * len(v)
            ys += rng.choices(v, k=len(v))
        out.append(fit(xs, ys))
    return out


def interval(values: list[float], digits: int) -> list[float] | None:
    """The 95 % percentile interval of bootstrap values; None without any."""
    if not values:
        return None
    q = statistics.quantiles(values, n=40, method="inclusive")
    return [round(q[0], digits), round(q[-1], digits)]


def chart_proxy_resources() -> dict[str, Any]:
    import yaml  # noqa: PLC0415 (only for the sizing)

    v = yaml.safe_load((ROOT / "charts/polycorn/values.yaml").read_text())
    res: dict[str, Any] = v["proxy"]["resources"]
    return res


def cpu_cores(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def mem_mib(q: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[: -len(u)]) * f
    return float(q) / 2**20


NODES = ((4, 16), (8, 32), (16, 64))
# Downloads delivered below this share of their pace: the machine was saturated.
SATURATED = 0.85
# ... or the passengers' event loop woke up this late (p99): the load generator starved.
LOOP_LAG_SATURATED_MS = 500.0
HEADROOM = 0.7


def sizing(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-train slopes over the fleet sizes and the trains a node holds: by what the
    trains use (CPU to HEADROOM of the cores, memory at the proxies' p99 RSS), and by
    what the chart's proxy requests reserve (what Kubernetes schedules by)."""
    carried = carried_sizes(runs)
    fitted = [r for r in runs if r["trains"] in carried] or runs
    ns = [float(r["trains"]) for r in fitted]
    a_cpu, b_cpu = fit(ns, [r["cpu_pct"]["proxy"] for r in fitted])
    a_cloud, b_cloud = fit(ns, [r["cloud_cpu_pct"] for r in fitted])
    a_mem, b_mem = fit(ns, [r["proxy_rss_mb_sum"] for r in fitted])
    boot_cpu = bootstrap_fits(fitted, lambda r: r["cpu_pct"]["proxy"])
    boot_cloud = bootstrap_fits(fitted, lambda r: r["cloud_cpu_pct"])
    boot_mem = bootstrap_fits(fitted, lambda r: r["proxy_rss_mb_sum"])
    big = max(runs, key=lambda r: r["trains"])
    rss_p99 = max(r["proxy_rss_mb_p99"] for r in runs)
    res = chart_proxy_resources()
    req_cpu, req_mem = cpu_cores(res["requests"]["cpu"]), mem_mib(res["requests"]["memory"])
    lim_mem = mem_mib(res["limits"]["memory"])
    nodes = []

    def by_cpu_of(cores: int, a: float, b: float) -> float | None:
        return (cores * 100 * HEADROOM - max(0.0, a)) / b if b > 0 else None

    for cores, gib in NODES:
        by_cpu = by_cpu_of(cores, a_cloud, b_cloud)
        by_mem = gib * 1024 * HEADROOM / rss_p99
        boot = [x for a, b in boot_cloud if (x := by_cpu_of(cores, a, b)) is not None]
        nodes.append(
            {
                "cores": cores,
                "gib": gib,
                "trains_by_cpu": int(by_cpu) if by_cpu is not None else None,
                "trains_by_cpu_ci95": interval(boot, 0),
                "trains_by_memory": int(by_mem),
                "trains": int(min(x for x in (by_cpu, by_mem) if x is not None)),
                "trains_by_chart_requests": int(min(cores / req_cpu, gib * 1024 / req_mem)),
                "trains_by_chart_memory_limit": int(gib * 1024 / lim_mem),
            }
        )
    return {
        "proxy_cpu_pct_fixed": round(a_cpu, 2),
        "proxy_cpu_pct_per_train": round(b_cpu, 3),
        "proxy_cpu_pct_per_train_ci95": interval([b for _, b in boot_cpu], 3),
        "cloud_cpu_pct_fixed": round(a_cloud, 2),
        "cloud_cpu_pct_per_train": round(b_cloud, 3),
        "cloud_cpu_pct_per_train_ci95": interval([b for _, b in boot_cloud], 3),
        "proxy_rss_mb_fixed": round(a_mem, 1),
        "proxy_rss_mb_per_train": round(b_mem, 2),
        "proxy_rss_mb_per_train_ci95": interval([b for _, b in boot_mem], 2),
        "interval": (
            f"95 % bootstrap percentile interval, {BOOTSTRAP} resamples of each size's "
            "repeats (none when no size was repeated)"
        ),
        "proxy_rss_mb_p99_max": rss_p99,
        "trains_per_core": round(100 * HEADROOM / b_cloud, 1) if b_cloud > 0 else None,
        "trains_per_gib": round(1024 * HEADROOM / rss_p99, 1),
        "headroom": HEADROOM,
        "chart_proxy_resources": res,
        "fitted_sizes": sorted({r["trains"] for r in fitted}),
        "fitted_runs": len(fitted),
        "measured_at": {"trains": big["trains"], "cpu_per_train_pct": big["cpu_per_train_pct"]},
        "nodes": nodes,
    }


def prepare(cfg: Config, work: Path, n_max: int, trip_s: int) -> Shared:
    pki = work / "pki"
    subprocess.run(
        [str(cfg.bin_dir / "polycorn-pki"), "dev", "--out", str(pki), "--train"]
        + [train_id(i) for i in range(n_max)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return with_trip(cfg, work, pki, trip_s)


def with_trip(cfg: Config, work: Path, pki: Path, trip_s: int) -> Shared:
    """The trip every train replays (``trip_s`` long, generated into ``work``) and the
    series' shared state around it."""
    trip = work / "trip"
    subprocess.run(
        [
            str(cfg.bin_dir / "polycorn-tracegen"),
            "generate",
            "--route-seed",
            "3",
            "--trip-seed",
            "11",
            "--duration-s",
            str(trip_s),
            "--carriers",
            str(CARRIERS),
            "--out",
            str(trip),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    sh = Shared(cfg, work, pki, trip, os.environ["POLYCORN_KAFKA_BOOTSTRAP"])
    sh.fixes, sh.hos = trip_events(trip)
    return sh


#: A series' headline numbers: those of its largest size the machine carried.
HEADLINE = (
    "trains",
    "proxy_rss_mb_p99",
    "cpu_per_train_pct",
    "ingest_lag_p99_ms",
    "kafka_records_per_s",
    "kafka_bytes_per_s",
)


def run_series(cfg: Config, work: Path, commit: str | None = None) -> dict[str, Any]:
    run_s = cfg.ramp_s + cfg.warmup_s + cfg.seconds + 200
    sh = prepare(cfg, work, max(cfg.trains), int(TRIP_SPREAD_S + run_s))
    runs: list[dict[str, Any]] = []
    broken: list[dict[str, Any]] = []
    for rep, n in schedule(cfg.trains, cfg.repeats):
        t = time.monotonic()
        try:
            r = run_fleet(sh, n)
        except (RuntimeError, OSError, queue.Empty, subprocess.SubprocessError) as e:
            # A size the machine could not even bring up: recorded, and the series goes on.
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            print(f"n={n}: did not run: {what}", flush=True)
            broken.append(
                {"trains": n, "repeat": rep, "ok": False, "saturated": True, "error": what}
            )
            continue
        r["repeat"] = rep
        r["wall_s"] = round(time.monotonic() - t, 1)
        runs.append(r)
        print(
            f"n={n}: ok={r['ok']} proxy CPU {r['cpu_per_train_pct']} %/train, RSS p99 "
            f"{r['proxy_rss_mb_p99']} MB, lag p99 {r['ingest_lag_p99_ms']} ms, Kafka "
            f"{r['kafka_records_per_s']} rec/s, machine {r['machine_busy_pct']} % busy",
            flush=True,
        )
        if not r["ok"]:
            print(f"n={n}: FAILED checks: {[c for c, v in r['checks'].items() if not v]}")
            print(f"  errors: {r['transfer_errors']} telemetry: {r['telemetry_in_linkdb']}")
            for o in r["obituaries"]:
                print(f"  {o}")
    carried = carried_sizes(runs) - {b["trains"] for b in broken}
    return {
        **headline(runs, carried),
        "repeats": cfg.repeats,
        "saturated_sizes": sorted({r["trains"] for r in runs} - carried),
        "conns_per_train": cfg.conns,
        # The numbers quoted (the headline, the fit) come from the sizes the machine
        # carried in every repeat; each of those runs must have passed every check.
        # Saturated sizes' failures are listed, not hidden.
        "ok": all(r["ok"] for r in runs if r["trains"] in carried) and bool(carried),
        "saturated_failed": sorted(
            {r["trains"] for r in runs if r["trains"] not in carried and not r["ok"]}
        ),
        "did_not_run": broken,
        "sizing": sizing(runs) if runs else None,
        "runs": runs,
        "load": {
            "bulk_share": cfg.bulk_share,
            "bulk_conns_per_train": round(cfg.conns * cfg.bulk_share),
            "bulk_rate_bytes_per_s": cfg.bulk_rate,
            "bulk_size_bytes": cfg.bulk_size,
            "chat_mean_gap_s": cfg.chat_gap_s,
            "passengers_per_train": cfg.passengers_per_train,
            "subflows_per_train": CARRIERS,
            "window_s": cfg.seconds,
            "warmup_s": cfg.ramp_s + cfg.warmup_s,
            "fault": cfg.fault,
            "trains_side": (
                "polycorn-fleetsim (simulated)" if cfg.sim else "polycorn-relay per train"
            ),
        },
        "environment": {
            **_machine(),
            "binaries": where(cfg.bin_dir),
            "binaries_commit": cfg.bin_commit or commit,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "method": "docs/benchmarks.md#fleet-load-make-bench-fleet",
    }


def schedule(sizes: list[int], repeats: int) -> list[tuple[int, int]]:
    """(repeat, size) in the order they run: every size once per repeat, ascending in even
    repeats and descending in odd ones, so that a drift of the machine's load over the
    series favours no size."""
    out = []
    for rep in range(repeats):
        out += [(rep, n) for n in (sizes if rep % 2 == 0 else sizes[::-1])]
    return out


def carried_sizes(runs: list[dict[str, Any]]) -> set[int]:
    """The sizes the machine carried: not saturated in any of their runs."""
    sizes = {r["trains"] for r in runs}
    return {n for n in sizes if not any(r["saturated"] for r in runs if r["trains"] == n)}


def headline(runs: list[dict[str, Any]], carried: set[int]) -> dict[str, Any]:
    """The headline numbers: the median over the runs of the largest size carried (or, when
    none was, of the largest that ran: nothing to quote, the reasons are in the runs)."""
    if not runs:
        return dict.fromkeys(HEADLINE)
    n = max(carried or {r["trains"] for r in runs})
    of = [r for r in runs if r["trains"] == n]
    out: dict[str, Any] = {"trains": n, "headline_runs": len(of)}
    for k in HEADLINE[1:]:
        out[k] = round(statistics.median(r[k] for r in of), 3)
    return out


def markdown(res: dict[str, Any]) -> str:
    ld = res["load"]
    not_run = [b["trains"] for b in res["did_not_run"]]
    lines = [
        "# Fleet load (`make bench-fleet`)",
        "",
        provenance.describe(res),
        "",
        f"{res['environment']['cpus']} cores ({res['environment']['cpu_model']}), "
        f"binaries of commit {res['environment']['binaries_commit']}, "
        f"{res['environment']['date']}; "
        + (
            f"{res['conns_per_train']} passenger connections per train "
            f"({ld['bulk_conns_per_train']} downloads at {ld['bulk_rate_bytes_per_s'] // 1024} "
            f"KiB/s each, the rest chat every {ld['chat_mean_gap_s']:g} s on average), "
            if res["conns_per_train"]
            else "no passenger traffic (telemetry and the control plane only), "
        )
        + f"{ld['subflows_per_train']} TLS subflows per train, the trains' side "
        f"{ld.get('trains_side', 'polycorn-relay per train')}, {ld['window_s']:g} s measured. "
        f"Every size the machine carried {'passed' if res['ok'] else 'FAILED'} its checks"
        f" (saturated sizes: {res['saturated_sizes'] + not_run};"
        f" failed among them: {res['saturated_failed'] + not_run}).",
        "",
        "| trains (repeat) | proxy CPU/train (% core) | proxy RSS p50 / p99 (MB) "
        "| cloud CPU (% core) "
        "| ingest lag p50 / p99 (ms) | Kafka rec/s | Kafka kB/s | chat RTT p99 (ms) "
        "| machine busy | checks |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["runs"]:
        lines.append(
            f"| {r['trains']} ({r.get('repeat', 0) + 1}) | {r['cpu_per_train_pct']:.2f} | "
            f"{r['proxy_rss_mb_p50']:.1f} / "
            f"{r['proxy_rss_mb_p99']:.1f} | {r['cloud_cpu_pct']:.0f} | "
            f"{r['ingest_lag_p50_ms']:.0f} / {r['ingest_lag_p99_ms']:.0f} | "
            f"{r['kafka_records_per_s']:.0f} | "
            f"{r['kafka_bytes_per_s'] / 1000:.1f} | {r['chat_rtt_ms_p99']:.1f} | "
            f"{r['machine_busy_pct']:.0f} % | {'ok' if r['ok'] else 'FAILED'}"
            f"{' (saturated)' if r['saturated'] else ''} |"
        )
    for b in res.get("did_not_run", []):
        lines.append(f"| {b['trains']} | did not run: {b['error']} |||||||| FAILED |")
    sims = [(r["trains"], r["load_generator"]) for r in res["runs"] if "load_generator" in r]
    if sims:
        lines += [
            "",
            "The load generator (one polycorn-fleetsim for every train; not the cloud's cost): "
            + "; ".join(
                f"{n} trains {g['cpu_pct']:.0f} % of a core and {g['rss_mb_p99']:.0f} MB "
                f"({g['cpu_pct_per_train']:.2f} % and {g['rss_mb_per_train']:.2f} MB per train)"
                for n, g in sims
            )
            + ".",
        ]
    s = res["sizing"]
    if s is None:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"Fit over the sizes carried ({s['fitted_sizes']}, {s.get('fitted_runs', '?')} runs): "
        f"proxies {s['proxy_cpu_pct_per_train']} % of a core "
        f"{s.get('proxy_cpu_pct_per_train_ci95')} and "
        f"{s['proxy_rss_mb_per_train']} MB {s.get('proxy_rss_mb_per_train_ci95')} per train; "
        f"the cloud node (proxies, Kafka, ingest, PostgreSQL) {s['cloud_cpu_pct_per_train']} % "
        f"{s.get('cloud_cpu_pct_per_train_ci95')} per train plus {s['cloud_cpu_pct_fixed']} % "
        f"(brackets: {s.get('interval', 'no interval')}).",
        "",
        "| node | trains (CPU to 70 %) [95 % interval] | trains (memory to 70 %) | holds "
        "| by the chart's requests |",
        "|---|---:|---:|---:|---:|",
    ]
    for nd in s["nodes"]:
        lines.append(
            f"| {nd['cores']} cores, {nd['gib']} GiB | {nd['trains_by_cpu']} "
            f"{nd.get('trains_by_cpu_ci95') or ''} | "
            f"{nd['trains_by_memory']} | {nd['trains']} | {nd['trains_by_chart_requests']} |"
        )
    return "\n".join(lines) + "\n"


def parse_trains(s: str) -> list[int]:
    return sorted({int(x) for x in s.replace(" ", "").split(",") if x})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trains", type=parse_trains, default=[10, 25, 50, 100])
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--ramp-s", type=float, default=10.0)
    ap.add_argument("--bulk-share", type=float, default=0.2)
    ap.add_argument("--bulk-rate", type=int, default=8192, help="bytes/s per download")
    ap.add_argument("--bulk-size", type=int, default=65_536)
    ap.add_argument("--chat-gap-s", type=float, default=5.0)
    ap.add_argument("--port-base", type=int, default=21000)
    ap.add_argument(
        "--bin", type=Path, default=Path(os.environ.get("BIN", ROOT / "target/release"))
    )
    ap.add_argument("--bin-commit", help="the commit the binaries were built from, if not HEAD")
    ap.add_argument("--fault", choices=["corrupt", "short", "lose-row"])
    ap.add_argument(
        "--sim",
        action="store_true",
        help="simulated trains: one polycorn-fleetsim process for the whole fleet instead of a "
        "relay per train (polycorn_benchrun.fleet_sim); --conns 0 for telemetry only",
    )
    ap.add_argument("--sim-threads", type=int, help="polycorn-fleetsim's runtime threads")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every size this many times, interleaved; the fit's interval comes from them",
    )
    ap.add_argument("--work", type=Path, help="keep the run's files here")
    out = Path(os.environ.get("BENCH_OUT", ROOT / "bench/out"))
    ap.add_argument("--out", type=Path, default=out / "fleet.json")
    a = ap.parse_args(argv)
    prov = provenance.start(a.out, a.out.with_suffix(".md"))
    # SIGTERM unwinds like an exception, so every child process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    limit = SIM_MAX_TRAINS if a.sim else 200
    if max(a.trains) > limit:
        ap.error(f"at most {limit} trains (the port plan)")
    cfg = Config(
        bin_dir=a.bin,
        trains=a.trains,
        conns=a.conns,
        bulk_share=a.bulk_share,
        bulk_rate=a.bulk_rate,
        bulk_size=a.bulk_size,
        chat_gap_s=a.chat_gap_s,
        seconds=a.seconds,
        warmup_s=a.warmup_s,
        ramp_s=a.ramp_s,
        port_base=a.port_base,
        fault=a.fault,
        bin_commit=a.bin_commit,
        sim=a.sim,
        sim_threads=a.sim_threads,
        repeats=a.repeats,
    )
    trains_side = "polycorn-fleetsim" if a.sim else "polycorn-relay"
    for b in ("polycorn-proxy", trains_side, "polycorn-pki", "polycorn-tracegen"):
        if not (a.bin / b).is_file():
            ap.error(f"{a.bin / b} missing: cargo build --release --locked first")
    with work_dir(a.work) as work:
        res = prov.stamp(run_series(cfg, work, prov.start.commit))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0 if res["ok"] else 1


@contextlib.contextmanager
def work_dir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    d = Path(tempfile.mkdtemp(prefix="polycorn-fleet."))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
