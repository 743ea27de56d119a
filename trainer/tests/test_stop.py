"""Stopping the trainer: SIGTERM abandons a service run at once (a query in
progress is cancelled on the server, fitting workers are stopped), and the
workers of a trainer killed with SIGKILL exit by themselves."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from slow_fit import alive, slow_fit

from polycorn_schema.testing import fresh_database
from polycorn_trainer import cli
from polycorn_trainer.fit import CellData, Params
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, fit_all

CELLS = cast(list[CellData], list(range(64)))  # enough for the worker pool


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def started(d: Path) -> list[int]:
    return [int(p.stem) for p in d.glob("*.started")]


@pytest.fixture
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_trainer_stop") as url:
        yield url


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_sigterm_cancels_the_query_of_a_service_run(
    db: str, handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = f"polycorn-stop-test-{secrets.token_hex(4)}"
    seen: dict[str, Any] = {}

    def run(url: str, _o: Options, _m: Metrics | None = None) -> dict[str, Any]:
        with psycopg.connect(url) as c:
            seen["started"] = True
            c.execute(f"SELECT pg_sleep(30) /* {tag} */")
            seen["finished"] = True
        return {}

    monkeypatch.setattr(cli, "run", run)

    def term() -> None:
        wait_for(lambda: "started" in seen, "the run")
        time.sleep(0.5)  # into the query
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term, daemon=True).start()
    a = argparse.Namespace(interval_s=3600.0, database_url=db, summary_json=None)
    assert cli._serve(a, Options(), Metrics()) == 0
    assert "finished" not in seen, "the run went on to its end after SIGTERM"

    def query_gone() -> bool:
        with psycopg.connect(db) as c:
            n = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND state = 'active'",
                (f"%{tag}%",),
            ).fetchone()
        return n is not None and n[0] == 0  # (this query's text has $1, not the tag)

    wait_for(query_gone, "the server to cancel the query", 10)


def test_an_interrupted_fit_stops_its_workers(tmp_path: Path, handlers: None) -> None:
    class Interrupted(BaseException):
        pass

    def raise_(_s: int, _f: object) -> None:
        raise Interrupted

    signal.signal(signal.SIGUSR1, raise_)
    main = threading.get_ident()

    def interrupt() -> None:
        wait_for(lambda: len(started(tmp_path)) == 2, "both workers")
        signal.pthread_kill(main, signal.SIGUSR1)

    threading.Thread(target=interrupt, daemon=True).start()
    o = Options(workers=2, params=cast(Params, str(tmp_path)))
    with pytest.raises(Interrupted):
        fit_all(CELLS, o, slow_fit)
    pids = started(tmp_path)
    assert len(pids) == 2
    assert not list(tmp_path.glob("*.done")), "fit_all waited for its workers' fits"
    assert not [p for p in pids if alive(p)]


def test_the_workers_of_a_killed_trainer_exit(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from polycorn_trainer.run import Options, fit_all\n"
        "from slow_fit import slow_fit\n"
        "fit_all(list(range(64)), Options(workers=2, params=sys.argv[1]), slow_fit)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env)
    try:
        wait_for(lambda: len(started(tmp_path)) == 2, "both workers")
    finally:
        p.kill()
        p.wait()
    pids = started(tmp_path)
    wait_for(lambda: not [q for q in pids if alive(q)], "the workers to exit", 15)
    assert not list(tmp_path.glob("*.done"))
