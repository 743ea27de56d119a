"""A newcomer's first run, in make test (entry point: scripts/test-first-start.sh).

PostgreSQL, Kafka and Prometheus start from nothing (a fresh, private state
directory: initdb, a freshly formatted KRaft broker). A client started before
each server must wait through its start-up; then the demo's fleet part runs on
the new servers: history through Kafka and ingest into LinkDB, the trainer, a
live trip whose proxy reads the learned table from Kafka. Runs on servers left
warm by an earlier run never meet what a newcomer's first `make demo` does: a
fresh broker's group coordinator answers NOT_COORDINATOR for a while.

The servers get their own ports and state directory (``FIRST_START_PG_PORT``,
``FIRST_START_KAFKA_PORT``, ``FIRST_START_PROM_PORT``), so the developer's warm
servers are neither used nor wiped; the state is wiped at the end, also on
failure. Short: 2 history trips and a 60 s live trip (``FIRST_START_TRIP_S``,
``FIRST_START_HISTORY_TRIPS``). The steps depend on each other: run with ``-x``
(scripts/test-first-start.sh does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from polycorn_harness import ROOT, VENV, infra
from polycorn_harness.topology import run
from polycorn_harness.wait import wait_until


@dataclass
class FirstStart:
    state: Path
    env: dict[str, str]
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.state / "work"

    def start(self, name: str, cmd: list[str]) -> None:
        """A client, in the background, its output in ``work/NAME.log``."""
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            p = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = (p, log)

    def waiting(self, name: str, *signs: str) -> None:
        """The client runs and says it is waiting for its server."""
        p, log = self.procs[name]

        def says_so() -> bool:
            text = log.read_text(errors="replace")
            assert p.poll() is None, f"it exited instead of waiting:\n{text[-2000:]}"
            return any(s in text for s in signs)

        wait_until(f"{name} says it is waiting ({' or '.join(signs)})", says_so, 60)

    def waited(self, name: str, timeout_s: float = 600) -> None:
        """The client ends well; what it waited through is printed."""
        p, log = self.procs[name]
        rc = p.wait(timeout_s)
        text = log.read_text(errors="replace")
        for line in [x for x in text.splitlines() if "retrying" in x][:3]:
            print(f"    waited: {line[:160]}")
        assert rc == 0, text[-2000:]


def _busy(*ports: int) -> list[int]:
    out = subprocess.run(["ss", "-Htln"], capture_output=True, text=True, check=True).stdout
    return [p for p in ports if any(f":{p} " in line for line in out.splitlines())]


@pytest.fixture(scope="module")
def fs() -> Iterator[FirstStart]:
    state = Path(tempfile.mkdtemp(prefix="polycorn-first-start."))
    e = os.environ
    kafka = int(e.get("FIRST_START_KAFKA_PORT", "29122"))
    overrides = {
        "POLYCORN_INFRA_DIR": str(state),
        "POLYCORN_PG_PORT": e.get("FIRST_START_PG_PORT", "25452"),
        "POLYCORN_KAFKA_PORT": str(kafka),
        "POLYCORN_PROM_PORT": e.get("FIRST_START_PROM_PORT", "29120"),
    }
    ports = [int(overrides["POLYCORN_PG_PORT"]), kafka, kafka + 1, kafka + 2]
    busy = _busy(*ports, int(overrides["POLYCORN_PROM_PORT"]))
    if busy:
        shutil.rmtree(state)
        pytest.fail(f"port(s) {busy} in use; set FIRST_START_*_PORT")
    env = infra.environment(overrides)
    (state / "work").mkdir()
    f = FirstStart(state, env)
    try:
        yield f
    finally:
        for p, _ in f.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        infra.wipe(env)
        shutil.rmtree(state, ignore_errors=True)


def test_no_earlier_state(fs: FirstStart) -> None:
    assert not (fs.state / "pg").exists() and not (fs.state / "kafka").exists()


def test_polycorn_linkdb_started_before_postgresql_is_waiting_for_it(fs: FirstStart) -> None:
    admin = fs.env["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    fs.start(
        "linkdb-wait", [str(VENV / "polycorn-linkdb"), "--url", admin, "--wait-s", "120", "current"]
    )
    fs.waiting("linkdb-wait", "retrying")


def test_infra_up_pg_from_nothing_initdb(fs: FirstStart) -> None:
    infra.start(fs.env, ["pg"])


def test_polycorn_linkdb_started_before_postgresql_waited_for_it(fs: FirstStart) -> None:
    fs.waited("linkdb-wait", 180)


def test_the_history_loader_started_before_kafka_is_waiting_for_it(fs: FirstStart) -> None:
    """The history loader of the demo and the benchmarks, started while no broker runs:
    it creates its topics, produces two trips, has ingest consume them and checks the
    group's committed offsets, all on a broker that starts under it."""
    url = fs.env["POLYCORN_DATABASE_URL"]
    run([str(VENV / "polycorn-linkdb"), "--url", url, "upgrade"], env=fs.env)
    fs.start(
        "early",
        [
            sys.executable,
            "-m",
            "polycorn_benchrun.trainer_fleet",
            "load",
            "--route-seed",
            "3",
            "--trip-seeds",
            "301-302",
            "--duration-s",
            "60",
            "--tracegen",
            str(ROOT / "target/release/polycorn-tracegen"),
            "--ingest-timeout-s",
            "300",
            "--work",
            str(fs.work / "early"),
            "--out",
            str(fs.work / "early.json"),
        ],
    )
    # librdkafka logs each refused connection; the loader's own waits say "retrying".
    fs.waiting("early", "Connection refused", "retrying")


def test_infra_up_kafka_and_prometheus_from_nothing_kafka_format(fs: FirstStart) -> None:
    infra.start(fs.env, ["kafka", "prom"])


def test_the_history_loader_started_before_kafka_loaded_every_record(fs: FirstStart) -> None:
    fs.waited("early", 600)


def test_the_demos_fleet_part_on_the_new_servers(fs: FirstStart) -> None:
    env = {
        **fs.env,
        "DEMO_TRIP_S": os.environ.get("FIRST_START_TRIP_S", "60"),
        "DEMO_HISTORY_TRIPS": os.environ.get("FIRST_START_HISTORY_TRIPS", "2"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "polycorn_benchrun.demo_fleet"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
        check=False,
    )
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stdout[-3000:]
