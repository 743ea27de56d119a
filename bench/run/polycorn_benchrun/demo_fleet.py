"""The fleet half of the demo: one emulated trip's telemetry through the whole cloud
side, with real services.

    relay-agent (radio replay, durable spool) -> 2 emulated carriers -> proxy
    -> Kafka -> polycorn-ingest -> LinkDB (PostgreSQL + PostGIS) -> linkdb-api
                                           -> polycorn-trainer -> Kafka -> proxy

First the fleet's history: DEMO_HISTORY_TRIPS (24) earlier trips of the same route go
through Kafka and ingest into a fresh LinkDB (``polycorn_benchrun.trainer_fleet load``),
and the trainer service learns from them and publishes failure-location table v1 to a
compacted topic. Then the live trip: the proxy (hrsch) reads the table from the topic
at start and hot-reloads every later version; a passenger downloads through the train;
the trip's telemetry lands in LinkDB and the trainer's next run learns from it too. At
the end the LinkDB API says what the fleet knows: the train, its handovers, the cells
where handovers failed, the trainer's validation and the table the proxy used. Tables
are signed as in a deployment: the trainer signs each with a key of ``polycorn-pki
table-key``, and the proxy takes only tables that key's public half verifies
(``--failure-table-verify-key``).

    python -m polycorn_benchrun.demo_fleet

Run by :mod:`polycorn_benchrun.demo` (make demo) after the side-by-side scheduler
comparison; DEMO_TRIP_S sets the trip length (120), DEMO_HISTORY_TRIPS the history,
DEMO_API_PORT the API's port (18080), BIN the binaries (target/release). Needs root
(namespaces); PostgreSQL, Kafka and Prometheus are scripts/infra.sh's (started if need
be; its POLYCORN_* environment picks another instance).

The demo is also a check (the first-start suite runs it on servers started from
nothing): what did not happen fails it (exit 1), with the log to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import httpx

from polycorn_harness import ROOT, VENV, infra, metrics
from polycorn_harness.process import now_ms
from polycorn_harness.topology import PROXY_METRICS, RELAY_METRICS, Topology, run, scrape
from polycorn_harness.trip import Expected
from polycorn_harness.wait import WaitTimeoutError, wait_until
from polycorn_schema.startup import pg_connect
from polycorn_schema.testing import service_url

PREFIX = "hf"
TRAIN = "train-demo"
DB = "linkdb_demo"
ORIGIN = "10.99.0.10"


class DemoError(RuntimeError):
    """Something the demo shows did not happen; ``log`` is the file to read."""

    def __init__(self, msg: str, log: Path | None = None) -> None:
        super().__init__(msg)
        self.log = log


class Demo:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.bin = Path(os.environ.get("BIN", str(ROOT / "target" / "release")))
        self.trip_s = int(os.environ.get("DEMO_TRIP_S", "120"))
        self.history = int(os.environ.get("DEMO_HISTORY_TRIPS", "24"))
        self.api_port = int(os.environ.get("DEMO_API_PORT", "18080"))
        self.services: list[subprocess.Popen[bytes]] = []
        self.topics: list[str] = []
        self.targets: Path | None = None
        self.env: dict[str, str] = {}
        self.topology = Topology(PREFIX, work / "trip", self.bin, {"TRAIN_ID": TRAIN})

    # ---- plumbing

    def topic(self, *args: str) -> None:
        run(["bash", "scripts/infra.sh", "topics", *args], env=self.env)

    def service(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Path:
        """A service in its own process group (stopped whole at the end); its log."""
        log = self.work / f"{name}.log"
        with log.open("w") as f:
            self.services.append(
                subprocess.Popen(
                    cmd,
                    env=env or self.env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return log

    def cleanup(self) -> None:
        for p in self.services:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.services:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=15)
        if self.targets is not None:
            self.targets.unlink(missing_ok=True)
        for t in self.topics:
            with contextlib.suppress(AssertionError):
                self.topic("--delete", "--topic", t)
        with contextlib.suppress(AssertionError):
            self.topology.down()

    def prom(self, query: str) -> list[tuple[dict[str, str], str]]:
        """A Prometheus instant query: (labels without the target's, value) per series."""
        url = self.env["POLYCORN_PROMETHEUS_URL"]
        q = urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:  # noqa: S310
                result = json.load(r)["data"]["result"]
        except OSError:
            return []
        drop = {"__name__", "instance", "job", "service"}
        return [
            ({k: v for k, v in s["metric"].items() if k not in drop}, s["value"][1]) for s in result
        ]

    # ---- the demo

    def start(self) -> None:
        self.env = infra.up(services=["pg", "kafka", "prom"])
        base = self.env["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0]
        self.db = f"{base}/{DB}"
        # A fresh LinkDB for the demo (the shared server keeps other databases).
        with pg_connect(f"{base}/postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {DB}")
        r = subprocess.run(
            [str(VENV / "polycorn-linkdb"), "--url", self.db, "upgrade"],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            (self.work / "migrate.log").write_text(r.stderr)
            raise DemoError(f"migrating {self.db} failed", self.work / "migrate.log")
        # The demo's own topics (deleted at the end): this LinkDB gets exactly the
        # demo's records, not what other runs left on the shared broker.
        pid = os.getpid()
        self.topic_name = f"polycorn.telemetry.demo-{pid}"
        self.dlq = f"{self.topic_name}.dlq"
        self.tables = f"polycorn.failure-tables.demo-{pid}"
        for t, parts, extra in (
            (self.topic_name, "2", []),
            (self.dlq, "1", []),
            (self.tables, "1", ["--config", "cleanup.policy=compact"]),
        ):
            self.topic(
                "--create", "--topic", t, "--partitions", parts, "--replication-factor", "1", *extra
            )
            self.topics.append(t)
        print(
            f"LinkDB: {self.db} (migrated); Kafka: {self.env['POLYCORN_KAFKA_BOOTSTRAP']}, topics "
            f"{self.topic_name}, {self.tables}"
        )
        self.ingest_log = self.service(
            "ingest",
            [str(VENV / "polycorn-ingest"), "run", "--database-url", service_url(self.db, "ingest")]
            + ["--group", f"demo-{pid}", "--topic", self.topic_name, "--dlq-topic", self.dlq]
            + ["--metrics-addr", "127.0.0.1:19464"],
        )
        r = run([str(VENV / "polycorn-linkdb-api"), "hash-key", "demo", "read"])
        entry = r.stdout.strip()
        # The key itself is on stderr, after the last ": " (only its hash goes to the API).
        self.key = [ln.rsplit(": ", 1)[1] for ln in r.stderr.splitlines() if ": " in ln][-1]
        self.service(
            "api",
            [str(VENV / "polycorn-linkdb-api"), "serve", "--port", str(self.api_port)]
            + ["--no-access-log"],
            {
                **self.env,
                "POLYCORN_DATABASE_URL": service_url(self.db, "api"),
                "POLYCORN_API_KEYS": entry,
            },
        )
        # Prometheus (scripts/infra.sh) scrapes ingest, the API and the trainer.
        self.targets = Path(self.env["POLYCORN_PROM_TARGETS_DIR"]) / f"demo-fleet-{pid}.json"
        self.targets.write_text(
            json.dumps(
                [
                    {"targets": ["127.0.0.1:19464"], "labels": {"service": "ingest"}},
                    {"targets": ["127.0.0.1:19466"], "labels": {"service": "trainer"}},
                    {
                        "targets": [f"127.0.0.1:{self.api_port}"],
                        "labels": {"service": "linkdb-api"},
                    },
                ]
            )
        )
        # The failure-table signing key: the trainer signs, the proxy verifies.
        self.table_key = self.work / "table-key"
        run([str(self.bin / "polycorn-pki"), "table-key", "--out", str(self.table_key)])

    def load_history(self) -> None:
        print(
            f"\n== the fleet's history: {self.history} earlier trips of this route, through "
            "Kafka and ingest into LinkDB"
        )
        log = self.work / "history.log"
        with log.open("w") as f:
            r = subprocess.run(
                [str(VENV / "python"), "-m", "polycorn_benchrun.trainer_fleet", "load"]
                + ["--route-seed", "1"]
                + ["--trip-seeds", f"101-{100 + self.history}", "--duration-s", str(self.trip_s)]
                + ["--tracegen", str(self.bin / "polycorn-tracegen"), "--database-url", self.db]
                + ["--work", str(self.work / "history"), "--out", str(self.work / "history.json")],
                cwd=ROOT,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if r.returncode != 0:
            raise DemoError("loading the fleet's history into LinkDB failed", log)
        for line in log.read_text().splitlines():
            if "handovers" in line or "cells" in line:
                print(f"  {line}")

    def start_trainer(self) -> int | None:
        """The trainer as a service: a run every 30 s, each publishing a new table
        version when the cells' failure locations changed. Demo thresholds: a cell needs
        2 failures and a 10 % failure share (defaults 3 and 15 %), since a few minutes
        of route give each cell only a couple of failures. The version of its first
        table, which the live trip's proxy must find on the topic at its start."""
        self.summary = self.work / "trainer.json"
        log = self.service(
            "trainer",
            [str(VENV / "polycorn-trainer"), "run", "--interval-s", "30"]
            + ["--database-url", service_url(self.db, "trainer"), "--topic", self.tables]
            + ["--min-failures", "2", "--min-failure-rate", "0.1"]
            + ["--table-signing-key", str(self.table_key / "table-signing.key")]
            + ["--metrics-addr", "127.0.0.1:19466", "--summary-json", str(self.summary)],
        )
        try:
            wait_until("the trainer's first run", self.summary.exists, 60, every_s=0.5)
        except WaitTimeoutError as e:
            raise DemoError("the trainer's first run did not finish", log) from e
        t = json.loads(self.summary.read_text())
        table = t.get("table") or {}
        v = t["validation"]
        print(
            f"trainer: model {t['model_id']} from {t['handovers']} handovers in {t['cells']} "
            f"cells ({t['cells_fitted']} SVMs) in {t['refit_s']} s; table "
            f"v{table.get('version', '-')} with {table.get('entries', 0)} failure locations, on "
            f"Kafka topic {self.tables}\n  leave-one-trip-out: failures correct/late/early "
            f"{v['failure_correct']}/{v['failure_late']}/{v['failure_early']}, successes correct "
            f"{v['success_correct']}"
        )
        version = table.get("version")
        return int(version) if version is not None else None

    def live_trip(self, first_table: int | None) -> None:
        run(
            [str(self.bin / "polycorn-tracegen"), "generate", "--route-seed", "1"]
            + ["--trip-seed", "7", "--duration-s", str(self.trip_s), "--carriers", "2"]
            + ["--out", str(self.work / "trip")]
        )
        epoch = now_ms() + 2000
        boot = self.env["POLYCORN_KAFKA_BOOTSTRAP"]
        self.topology.up(
            "hrsch",
            epoch_unix_ms=epoch,
            forward_ports=[int(boot.rsplit(":", 1)[1])],
            relay_args=["--replay-resume"],
            proxy_args=[
                f"--kafka-brokers={boot}",
                f"--kafka-topic={self.topic_name}",
                f"--kafka-dlq-topic={self.dlq}",
                f"--failure-table-topic={self.tables}",
                f"--failure-table-verify-key={self.table_key}/table-signing.pub",
            ],
        )
        print(
            f"\n== the live trip\ntrain {TRAIN} on a {self.trip_s} s trip at 300 km/h (hrsch, the "
            "learned table from Kafka, signed by the trainer); a passenger downloads 4 MB files "
            "meanwhile"
        )
        downloads = nbytes = 0
        while now_ms() < epoch + self.trip_s * 1000:
            r = subprocess.run(
                ["ip", "netns", "exec", f"{PREFIX}-pax", "curl", "-fsS", "--max-time", "30"]
                + [
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{size_download}",
                    f"http://{ORIGIN}/files/bench-4MB.bin",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if r.returncode == 0:
                downloads, nbytes = downloads + 1, nbytes + int(r.stdout or 0)
        print(f"trip over: {downloads} downloads, {nbytes // 1000000} MB through the train")

        # Telemetry confirmed by Kafka leaves the spool; then ingest catches up.
        left: list[float | None] = [None]

        def drained() -> bool:
            text = scrape(f"{PREFIX}-train", RELAY_METRICS, timeout_s=2)
            left[0] = metrics.value(text, "polycorn_telemetry_spool_records") if text else None
            return left[0] == 0

        try:
            wait_until("the relay's spool empty", drained, 60, every_s=0.5)
        except WaitTimeoutError as e:
            raise DemoError(
                f"the relay's telemetry spool still holds {left[0]} records 60 s after the trip "
                "(Kafka never confirmed them)"
            ) from e
        want = len(Expected.load(self.work / "trip" / "events.jsonl", 0).handovers)
        n = [0]

        def ingested() -> bool:
            with pg_connect(self.db) as c:
                row = c.execute(
                    "select count(*) from handovers where train_id = %s", (TRAIN,)
                ).fetchone()
            n[0] = int(row[0]) if row else 0
            return n[0] >= want

        try:
            wait_until("LinkDB has the trip's handovers", ingested, 60, every_s=1)
        except WaitTimeoutError as e:
            raise DemoError(
                f"LinkDB has {n[0]} of the live trip's {want} handovers 60 s after the spool "
                "drained",
                self.ingest_log,
            ) from e

        # What the proxy did with the table during the trip; a metric the proxy does
        # not export reads 0.
        text = scrape(f"{PREFIX}-cloud", PROXY_METRICS, timeout_s=2) or ""

        def pm(name: str, **labels: str) -> int:
            v = metrics.value(text, name, **labels) if text else None
            return int(v or 0)

        version = pm("polycorn_failure_table_version")
        loads = pm("polycorn_failure_table_source_loads_total", source="kafka")
        held = pm(
            "polycorn_sched_schedulerlet_events_total",
            schedulerlet="hof-reject",
            event="rejections",
        )
        print(
            f"proxy: failure-location table v{version} in use ({loads} loaded from Kafka); "
            f"hof-reject kept a carrier out {held} times"
        )
        proxy_log = self.topology.state / "logs" / "proxy.log"
        if first_table is not None and loads < 1:
            raise DemoError(
                "the trainer published a table but the proxy loaded none from Kafka", proxy_log
            )
        refused = pm("polycorn_failure_table_source_rejected_total", reason="signature")
        if refused:
            raise DemoError(
                f"the proxy refused {refused} of the trainer's tables for their signature",
                proxy_log,
            )

        # The trainer's next scheduled run learns from the live trip too.
        done = self.summary.stat().st_mtime
        with contextlib.suppress(WaitTimeoutError):
            wait_until(
                "the trainer's next run", lambda: self.summary.stat().st_mtime > done, 90, every_s=1
            )
        t = json.loads(self.summary.read_text())
        table = t.get("table") or {}
        print(
            f"trainer, next scheduled run: model {t['model_id']} from {t['handovers']} handovers; "
            f"table v{table.get('version', '-')} ({table.get('entries', 0)} entries"
            f"{', new' if table.get('new') else ', unchanged'})"
        )

    def api(self) -> None:
        print(f"\n== what LinkDB learned (through the API, http://127.0.0.1:{self.api_port}/docs)")
        c = httpx.Client(
            base_url=f"http://127.0.0.1:{self.api_port}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        t = c.get(f"/v1/trains/{TRAIN}").raise_for_status().json()
        lon, lat = t["geometry"]["coordinates"][:2]
        print(
            f"train {TRAIN}: last seen {t['properties']['last_seen']}, at {lat:.4f} N {lon:.4f} E"
        )
        hos: list[dict[str, Any]] = []
        url: str | None = "/v1/handovers"
        params: dict[str, Any] | None = {"train_id": TRAIN, "limit": 100}
        while url:
            page = c.get(url, params=params).raise_for_status().json()
            hos += page["features"]
            url, params = page.get("next"), None
        want = len(Expected.load(self.work / "trip" / "events.jsonl", 0).handovers)
        fails = [f for f in hos if f["properties"]["outcome"] == "failure"]
        print(f"handovers: {len(hos)} in LinkDB for the {want} of the trip; {len(fails)} failed")
        if len(hos) != want:
            raise DemoError(f"the API serves {len(hos)} handovers of the trip, not {want}")
        for f in fails[:6]:
            p = f["properties"]
            print(
                f"  failed  {p['carrier']}  {p['source_cell']} -> {p['target_cell']}  "
                f"at track {p['track_m']:.0f} m ({p['direction']}), RSRP {p['rsrp_dbm']:.1f} dBm, "
                f"blackout {p['duration_ms']} ms"
            )
        r = c.get("/v1/failure-table")
        if r.status_code == 404:
            print("failure-location table: none published yet (no cell has enough failures)")
        else:
            tab = r.raise_for_status().json()
            if "x-polycorn-signature" not in r.headers:
                raise DemoError("the API serves the trainer's table without its signature")
            etag = r.headers["etag"]
            again = c.get("/v1/failure-table", headers={"If-None-Match": etag}).status_code
            print(
                f"failure-location table v{tab['version']} ({len(tab['entries'])} cells, ETag "
                f'{etag[:14]}..."), {tab["source"]}, signed by the trainer (X-Polycorn-Signature); '
                f"a poll with If-None-Match gets {again}"
            )
        cells = c.get("/v1/cells", params={"limit": 500}).raise_for_status().json()["features"]
        worst = sorted(cells, key=lambda f: -f["properties"]["failure_rate"])[:5]
        print(f"cells: {len(cells)} ⟨carrier, cell, direction⟩; highest failure rates:")
        for f in worst:
            p = f["properties"]
            print(
                f"  {p['carrier']} {p['name']} {p['direction']}: {p['failures']}/"
                f"{p['handovers']} failed, earliest handover at track "
                f"{p['earliest_ho_track_m']:.0f} m"
            )

    def prometheus(self) -> None:
        print(f"\n== the same, as Prometheus scraped it ({self.env['POLYCORN_PROMETHEUS_URL']})")
        # Prometheus scrapes every 2 s and rereads its file targets every 2 s: wait for
        # the three targets and for a scrape after the API requests above.
        seen = {"up": "0", "api": "no"}

        def scraped() -> bool:
            up = self.prom('count(up{service=~"ingest|trainer|linkdb-api"} == 1)')
            api = self.prom(
                'count(polycorn_api_request_duration_seconds_count{service="linkdb-api",'
                'route="/v1/cells"})'
            )
            seen["up"] = up[0][1] if up else "0"
            seen["api"] = api[0][1] if api else "no"
            return seen["up"] == "3" and seen["api"] == "1"

        try:
            wait_until("Prometheus scrapes the services", scraped, 30, every_s=0.5)
        except WaitTimeoutError as e:
            raise DemoError(
                f"after 30 s Prometheus scrapes {seen['up']} of ingest, trainer and linkdb-api, "
                f"and has {seen['api']} sample of the API's /v1/cells requests"
            ) from e
        for title, q, prefix in (
            (
                "rows ingest wrote, by table:",
                'sum by (table) (polycorn_ingest_rows_written_total{service="ingest"})',
                "  ",
            ),
            (
                "trainer: runs, last validation:",
                'sum by (result) (polycorn_trainer_runs_total{service="trainer"})',
                "  runs ",
            ),
            (None, 'polycorn_trainer_validation_ratio{service="trainer"}', "  "),
            (
                "API requests, by route:",
                "sum by (route) "
                '(polycorn_api_request_duration_seconds_count{service="linkdb-api"})',
                "  ",
            ),
        ):
            if title:
                print(title)
            for labels, value in self.prom(q):
                print(f"{prefix}{json.dumps(labels, separators=(',', ':'))} {value}")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="polycorn-demo-fleet.", dir="/tmp"))
    demo = Demo(work)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    try:
        demo.start()
        demo.load_history()
        first = demo.start_trainer()
        demo.live_trip(first)
        demo.api()
        demo.prometheus()
    except DemoError as e:
        print(f"demo-fleet: ERROR: {e}", file=sys.stderr)
        if e.log is not None and e.log.exists():
            print("\n".join(e.log.read_text().splitlines()[-30:]), file=sys.stderr)
        return 1
    finally:
        demo.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
