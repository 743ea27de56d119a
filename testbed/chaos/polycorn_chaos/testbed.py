"""One testbed for a whole campaign, and the faults it can suffer.

Brought up once (the episodes reuse it): a private PostgreSQL + PostGIS and
Kafka (scripts/infra.sh with this campaign's own state directory and ports,
so restarting them never touches the servers other tests share), a fresh
LinkDB and topics, the HSR topology of testbed/topology.sh under its own
prefix (emulated carriers replaying a generated trip, origin servers, the
relay/proxy pair with the proxy producing to Kafka), polycorn-ingest and a
serving polycorn-trainer. The relay's telemetry spool lives on a small
tmpfs, so that "disk full" is a real ENOSPC.

Processes are restarted exactly as they were started: relay and proxy from
their own command lines (/proc/PID/cmdline, inside their namespace), ingest
and the trainer from the argument lists kept here, PostgreSQL and Kafka by
``scripts/infra.sh up``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, metrics
from polycorn_harness.topology import BINARIES, get


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Settings:
    """Names, ports and files of one campaign's testbed (none shared with others)."""

    prefix: str = "ch"
    infra_dir: Path = Path("/tmp/polycorn-infra-chaos")
    pg_port: int = 25472
    kafka_port: int = 29142
    prom_port: int = 29150
    ingest_metrics: str = "127.0.0.1:9571"
    trainer_metrics: str = "127.0.0.1:9572"
    train_id: str = "train-chaos"
    trip_s: int = 3600
    work: Path = Path("/tmp/polycorn-chaos")
    # The tree whose scripts, release binaries (target/release) and Python
    # environment (.venv) run: this one, or a checkout of another commit.
    tree: Path = ROOT
    spool_fs_bytes: int = 8 << 20
    scheme: str = "minrtt"

    @classmethod
    def from_env(cls, **defaults: Any) -> Settings:
        """Settings from CHAOS_* variables (CHAOS_PREFIX, CHAOS_INFRA_DIR,
        CHAOS_PG_PORT, CHAOS_KAFKA_PORT, CHAOS_INGEST_METRICS,
        CHAOS_TRAINER_METRICS, CHAOS_TREE, CHAOS_WORK), else ``defaults``,
        else the fields' defaults."""
        kw: dict[str, Any] = dict(defaults)
        for f in fields(cls):
            v = os.environ.get(f"CHAOS_{f.name.upper()}")
            if v is None:
                continue
            kw[f.name] = Path(v) if f.type == "Path" else int(v) if f.type == "int" else v
        return cls(**kw)

    @property
    def bin(self) -> Path:
        return self.tree / "target" / "release"

    @property
    def venv(self) -> Path:
        return self.tree / ".venv" / "bin"

    @property
    def state(self) -> Path:
        return Path(f"/tmp/polycorn-state-{self.prefix}")

    @property
    def ns_train(self) -> str:
        return f"{self.prefix}-train"

    @property
    def ns_cloud(self) -> str:
        return f"{self.prefix}-cloud"

    @property
    def ns_pax(self) -> str:
        return f"{self.prefix}-pax"

    def infra_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            POLYCORN_INFRA_DIR=str(self.infra_dir),
            POLYCORN_PG_PORT=str(self.pg_port),
            POLYCORN_KAFKA_PORT=str(self.kafka_port),
            POLYCORN_PROM_PORT=str(self.prom_port),
        )
        return env


def run(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = ROOT
) -> str:
    """Run a command to completion; its output, or CommandFailed with its stderr."""
    r = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )
    if r.returncode != 0:
        raise CommandFailed(cmd, r.returncode, r.stderr)
    return r.stdout


class CommandFailed(subprocess.SubprocessError):
    def __init__(self, cmd: list[str], rc: int, stderr: str):
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        super().__init__(f"{' '.join(cmd[:4])} exited {rc}: {tail}")


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> sum over its label sets (the harness's reading)."""
    return metrics.sums(text)


@dataclass
class Proc:
    """A process of the testbed that faults kill and restart."""

    name: str
    argv: list[str]
    ns: str | None
    log: Path
    pid: int = 0
    popen: subprocess.Popen[bytes] | None = None
    # Set while the campaign has it down on purpose.
    down_on_purpose: bool = False
    starts: int = 0

    def start(self) -> None:
        cmd = (["ip", "netns", "exec", self.ns] if self.ns else []) + self.argv
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        self.down_on_purpose = False
        self.starts += 1

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if not self.pid:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def exit_status(self) -> str:
        if self.popen is not None and self.popen.returncode is not None:
            rc = self.popen.returncode
            return f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        return "gone (not our child: no exit status)"

    def signal(self, sig: int) -> None:
        if self.pid and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, sig: int, timeout: float = 15.0) -> bool:
        """Signal and wait; False when it had to be SIGKILLed after ``timeout``."""
        self.down_on_purpose = True
        self.signal(sig)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.alive():
            return True
        self.signal(signal.SIGKILL)
        while self.alive():
            time.sleep(0.05)
        return False

    def rss(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode() for a in raw.split(b"\0") if a]


@dataclass
class Testbed:
    __test__ = False  # not a pytest test class, whatever its name

    s: Settings
    run_id: str = ""
    epoch_ms: int = 0
    db_url: str = ""
    topic: str = ""
    dlq: str = ""
    tables: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    # Files of the origin: name -> (sha256, size).
    sums: dict[str, tuple[str, int]] = field(default_factory=dict)
    infra_down: set[str] = field(default_factory=set)

    # -------------------------------------------------------------- bring-up

    def infra(self, *args: str, timeout: float = 300) -> str:
        return run(
            ["bash", "scripts/infra.sh", *args],
            env=self.s.infra_env(),
            timeout=timeout,
            cwd=self.s.tree,
        )

    def up(self) -> None:
        s = self.s
        s.work.mkdir(parents=True, exist_ok=True)
        for b in BINARIES:
            if not (s.bin / b).is_file():
                raise RuntimeError(f"{s.bin / b} missing: make build")
        log(
            f"infra (own instance in {s.infra_dir}: PostgreSQL :{s.pg_port}, Kafka :{s.kafka_port})"
        )
        self.infra("up", "pg", "kafka")
        self.run_id = f"chaos{int(time.time())}{os.getpid()}"
        self.topic = f"polycorn.telemetry.v1.{self.run_id}"
        self.dlq = f"polycorn.telemetry.dlq.{self.run_id}"
        self.tables = f"polycorn.failure-tables.v1.{self.run_id}"
        for t, parts, extra in (
            (self.topic, "4", []),
            (self.dlq, "1", []),
            (self.tables, "1", ["--config", "cleanup.policy=compact"]),
        ):
            self.infra(
                "topics",
                "--create",
                "--topic",
                t,
                "--partitions",
                parts,
                "--replication-factor",
                "1",
                *extra,
            )
        base = f"postgresql://postgres@127.0.0.1:{s.pg_port}"
        db = f"linkdb_{self.run_id}"
        run(["psql", f"{base}/postgres", "-qc", f"CREATE DATABASE {db}"])
        self.db_url = f"{base}/{db}"
        run(["psql", self.db_url, "-qc", "CREATE EXTENSION postgis"])
        run([str(s.venv / "polycorn-linkdb"), "--url", self.db_url, "upgrade"])

        trip = s.work / "trip"
        if not (trip / "events.jsonl").is_file():
            log(f"generating a {s.trip_s} s trip")
            run(
                [
                    str(s.bin / "polycorn-tracegen"),
                    "generate",
                    "--route-seed",
                    "2",
                    "--trip-seed",
                    "5",
                    "--duration-s",
                    str(s.trip_s),
                    "--carriers",
                    "2",
                    "--out",
                    str(trip),
                ],
                timeout=600,
            )

        self._mount_spool_fs()
        env = dict(os.environ, PC_PREFIX=s.prefix, TRAIN_ID=s.train_id, BIN=str(s.bin))
        # The emulator must load the trip's traces within topology.sh's 10 s:
        # on a loaded machine a long trip may not; another try usually does.
        for attempt in range(5):
            self.epoch_ms = int(time.time() * 1000) + 3000
            log(f"topology {s.prefix} up (epoch {self.epoch_ms})")
            try:
                run(
                    [
                        "bash",
                        "testbed/topology.sh",
                        "up",
                        "--trip",
                        str(trip),
                        "--scheme",
                        s.scheme,
                        "--epoch-unix-ms",
                        str(self.epoch_ms),
                        "--forward-port",
                        str(s.kafka_port),
                        "--relay-arg",
                        "--replay-resume",
                        "--proxy-arg",
                        f"--kafka-brokers=127.0.0.1:{s.kafka_port}",
                        "--proxy-arg",
                        f"--kafka-topic={self.topic}",
                        "--proxy-arg",
                        f"--kafka-dlq-topic={self.dlq}",
                        "--proxy-arg",
                        f"--failure-table-topic={self.tables}",
                    ],
                    env=env,
                    timeout=180,
                    cwd=s.tree,
                )
                break
            except CommandFailed as e:
                if attempt == 4:
                    raise
                log(f"topology.sh up failed, again: {e}")
        logs = s.state / "logs"
        for name, ns in (("relay", s.ns_train), ("proxy", s.ns_cloud)):
            pid = int((s.state / "run" / f"{name}.pid").read_text())
            argv = _cmdline(pid)
            p = Proc(name, argv, ns, logs / f"{name}.log", pid=pid, starts=1)
            self.procs[name] = p
        emu_pid = int((s.state / "run" / "emu.pid").read_text())
        self.procs["emu"] = Proc(
            "emu", _cmdline(emu_pid), None, logs / "emu.log", pid=emu_pid, starts=1
        )

        venv = s.venv
        boot = f"127.0.0.1:{s.kafka_port}"
        self.procs["ingest"] = Proc(
            "ingest",
            [
                str(venv / "polycorn-ingest"),
                "run",
                "--bootstrap",
                boot,
                "--database-url",
                self.db_url,
                "--topic",
                self.topic,
                "--dlq-topic",
                self.dlq,
                "--group",
                f"ingest-{self.run_id}",
                "--metrics-addr",
                s.ingest_metrics,
            ],
            None,
            s.work / "ingest.log",
        )
        self.procs["trainer"] = Proc(
            "trainer",
            [
                str(venv / "polycorn-trainer"),
                "--log-level",
                "WARNING",
                "run",
                "--interval-s",
                "30",
                "--workers",
                "1",
                "--database-url",
                self.db_url,
                "--bootstrap",
                boot,
                "--topic",
                self.tables,
                "--min-failures",
                "1",
                "--min-failure-rate",
                "0",
                # One train: its failures alone make the table here.
                "--min-trains",
                "1",
                "--metrics-addr",
                s.trainer_metrics,
            ],
            None,
            s.work / "trainer.log",
        )
        self.procs["ingest"].start()
        self.procs["trainer"].start()
        self.sums = self._origin_sums()

    def _mount_spool_fs(self) -> None:
        spool = self.s.state / "spool"
        spool.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(spool):
            run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"size={self.s.spool_fs_bytes},mode=0755",
                    f"{self.s.prefix}-chaos-spool",
                    str(spool),
                ]
            )

    def _origin_sums(self) -> dict[str, tuple[str, int]]:
        files = self.s.state / "origin" / "www" / "files"
        out: dict[str, tuple[str, int]] = {}
        for line in (files / "SHA256SUMS").read_text().splitlines():
            sha, name = line.split()
            name = name.lstrip("*")
            out[name] = (sha, (files / name).stat().st_size)
        return out

    def down(self) -> None:
        """Everything this campaign started, and nothing else."""
        self.fill_spool(False)
        for name in ("trainer", "ingest"):
            p = self.procs.get(name)
            if p is not None:
                p.stop(signal.SIGTERM, timeout=10)
        for p in self.procs.values():
            if p.popen is not None and p.alive():
                p.stop(signal.SIGTERM, timeout=10)
        env = dict(os.environ, PC_PREFIX=self.s.prefix)
        with contextlib.suppress(subprocess.SubprocessError):
            run(["bash", "testbed/topology.sh", "down"], env=env, timeout=120, cwd=self.s.tree)
        spool = self.s.state / "spool"
        if os.path.ismount(spool):
            with contextlib.suppress(subprocess.SubprocessError):
                run(["umount", str(spool)])
        if self.db_url:
            with contextlib.suppress(subprocess.SubprocessError):
                self.infra("down", "pg", "kafka", timeout=120)

    # -------------------------------------------------------------- probes

    def http(self, ns: str | None, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """(status, body) of a GET, 0 when nothing answered."""
        if ns is None:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (http only)
                    return int(r.status), r.read().decode(errors="replace")
            except urllib.error.HTTPError as e:
                return int(e.code), ""
            except (OSError, ValueError):
                return 0, ""
        return get(ns, url, timeout_s=timeout)

    def endpoint(self, name: str) -> tuple[str | None, str]:
        s = self.s
        return {
            "relay": (s.ns_train, "http://127.0.0.1:9465"),
            "proxy": (s.ns_cloud, "http://127.0.0.1:9464"),
            "ingest": (None, f"http://{s.ingest_metrics}"),
            "trainer": (None, f"http://{s.trainer_metrics}"),
        }[name]

    def ready(self, name: str) -> bool:
        ns, base = self.endpoint(name)
        return self.http(ns, f"{base}/readyz")[0] == 200

    def healthy(self, name: str) -> bool:
        ns, base = self.endpoint(name)
        return self.http(ns, f"{base}/healthz")[0] == 200

    def metrics(self, name: str) -> dict[str, float] | None:
        ns, base = self.endpoint(name)
        code, body = self.http(ns, f"{base}/metrics", timeout=5.0)
        if code != 200:
            return None
        try:
            return parse_metrics(body)
        except ValueError:
            return None

    def dead_letters(self) -> int:
        """Records in the dead-letter topic (a few tries: right after a broker
        restart its metadata may not know the partition yet)."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{self.s.kafka_port}",
                "group.id": f"dlq-{self.run_id}",
            }
        )
        try:
            for attempt in range(5):
                try:
                    lo, hi = c.get_watermark_offsets(TopicPartition(self.dlq, 0), timeout=10)
                    return int(hi - lo)
                except KafkaException:
                    if attempt == 4:
                        raise
                    time.sleep(2)
        finally:
            c.close()
        raise AssertionError("unreachable")

    def linkdb_rows(self) -> tuple[list[tuple[str, int]], list[int]]:
        t = self.s.train_id
        ho = run(
            [
                "psql",
                self.db_url,
                "-Atc",
                "select carrier, (extract(epoch from start_time) * 1000)::bigint "
                f"from handovers where train_id = '{t}'",
            ],
            timeout=60,
        )
        fx = run(
            [
                "psql",
                self.db_url,
                "-Atc",
                "select (extract(epoch from time) * 1000)::bigint "
                f"from gps_fixes where train_id = '{t}'",
            ],
            timeout=60,
        )
        handovers = []
        for line in ho.split():
            c, _, start = line.partition("|")
            handovers.append((c, int(start)))
        return handovers, [int(x) for x in fx.split()]

    # -------------------------------------------------------------- faults

    def kill(self, name: str, sig: int) -> bool:
        """Stop a component; False when a SIGTERM had to become a SIGKILL."""
        if name in ("kafka", "pg"):
            self._infra_kill(name, sig)
            return True
        return self.procs[name].stop(sig)

    def restart(self, name: str) -> None:
        if name in ("kafka", "pg"):
            # infra.sh gives a start 60 s; on a loaded machine a JVM can take
            # longer. Its `up` is idempotent (a running server is only probed),
            # so a supervisor's retry is another `up`.
            for attempt in range(3):
                try:
                    self.infra("up", name)
                    break
                except CommandFailed as e:
                    if attempt == 2:
                        raise
                    log(f"  infra.sh up {name} failed, retrying: {e}")
            self.infra_down.discard(name)
            return
        p = self.procs[name]
        if p.alive():
            return
        p.start()

    def _infra_kill(self, name: str, sig: int) -> None:
        self.infra_down.add(name)
        if sig == signal.SIGTERM:
            self.infra("down", name, timeout=120)
            return
        if name == "kafka":
            pidf = self.s.infra_dir / "kafka" / "pid"
            pid = int(pidf.read_text()) if pidf.is_file() else 0
        else:
            pidf = self.s.infra_dir / "pg" / "data" / "postmaster.pid"
            pid = int(pidf.read_text().split()[0]) if pidf.is_file() else 0
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def link(self, action: str, carrier: int) -> None:
        env = dict(os.environ, PC_PREFIX=self.s.prefix)
        run(
            ["bash", "testbed/netns/link.sh", action, str(carrier)],
            env=env,
            timeout=30,
            cwd=self.s.tree,
        )

    def fill_spool(self, full: bool) -> None:
        """Fill the spool's file system to the last byte, or free it."""
        spool = self.s.state / "spool"
        filler = spool / "chaos-filler"
        if not full:
            filler.unlink(missing_ok=True)
            return
        if not os.path.ismount(spool):
            raise RuntimeError(f"{spool} is not the campaign's tmpfs")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 4096, 64):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size) > 0:
                        pass
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def relay_spool_full(self) -> Iterator[None]:
        self.fill_spool(True)
        try:
            yield
        finally:
            self.fill_spool(False)

    def rss(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for name, p in self.procs.items():
            r = p.rss() if p.alive() else None
            if r is not None:
                out[name] = (p.pid, r)
        return out

    def save_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for p in self.procs.values():
            if p.log.is_file():
                shutil.copy(p.log, dest / p.log.name)
        (dest / "procs.json").write_text(
            json.dumps(
                {
                    n: {"pid": p.pid, "alive": p.alive(), "starts": p.starts}
                    for n, p in self.procs.items()
                },
                indent=1,
            )
        )
