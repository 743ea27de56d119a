"""make bench-api: p50/p99 of the LinkDB API's hot queries with 1M handovers loaded,
each at a fixed open-loop 200 requests/s -> bench/out/api.json
(``python -m polycorn_benchrun.api``, after ``scripts/setup.sh bench``, as make bench-api
runs it).

1. PostgreSQL + PostGIS (``scripts/infra.sh up pg``, through the harness); a fresh
   database ``linkdb_bench_api``, migrated, seeded by linkdb-api/loadtest/seed.sql
   (1,008,000 handovers on 3 lines, 5,400 cells; a few minutes).
2. Two throw-away API keys (read, admin), only their hashes given to the API.
3. The API under uvicorn (uvloop + httptools) on loopback, ``--workers`` workers, no
   access log.
4. A failure-location table published through ``POST /v1/failure-tables``.
5. Vegeta (``scripts/setup.sh bench`` builds it) drives each query alone: a warm-up,
   then the measured window at the rate, open loop (requests leave on schedule
   whether or not earlier ones have answered); targets from
   linkdb-api/loadtest/targets.py (fixed seed). ``vegeta report -type=json`` per
   query, folded by loadtest/report.py.

Vegeta, the API and PostgreSQL share the machine's cores: the numbers include that
contention, and whatever else runs (the load average before each query is recorded
in api.json). api.json also says which commit it came from and whether the tree was clean
(polycorn_harness.provenance).

Env (defaults of the options): BENCH_API_RATE (200), BENCH_API_SECONDS (30),
BENCH_API_WARMUP (5), BENCH_API_WORKERS (2), BENCH_API_PORT (28080),
BENCH_API_QUERIES (all four), BENCH_API_REUSE=1 (keep an already seeded database),
BENCH_OUT (bench/out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from polycorn_harness import ROOT, VENV, infra, provenance
from polycorn_harness.process import setup_var, stop_process
from polycorn_harness.topology import run
from polycorn_harness.wait import wait_until
from polycorn_schema.startup import pg_connect

DB = "linkdb_bench_api"
QUERIES = "handovers_bbox_page cell_stats failure_table failure_table_304"
LOADTEST = ROOT / "linkdb-api"


def log(msg: str) -> None:
    print(f"bench-api: {msg}", file=sys.stderr, flush=True)


def args() -> argparse.Namespace:
    e = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=int(e("BENCH_API_RATE", "200")))
    p.add_argument("--seconds", type=int, default=int(e("BENCH_API_SECONDS", "30")))
    p.add_argument("--warmup", type=int, default=int(e("BENCH_API_WARMUP", "5")))
    p.add_argument("--workers", type=int, default=int(e("BENCH_API_WORKERS", "2")))
    p.add_argument("--port", type=int, default=int(e("BENCH_API_PORT", "28080")))
    p.add_argument("--queries", default=e("BENCH_API_QUERIES", QUERIES))
    p.add_argument("--reuse", action="store_true", default=e("BENCH_API_REUSE") == "1")
    p.add_argument("--out", type=Path, default=Path(e("BENCH_OUT", str(ROOT / "bench" / "out"))))
    return p.parse_args()


def scalar(url: str, sql: str) -> object:
    with pg_connect(url) as c:
        row = c.execute(sql).fetchone()
        return row[0] if row else None


def seeded(admin_url: str, bench_url: str) -> bool:
    if scalar(admin_url, f"select 1 from pg_database where datname = '{DB}'") != 1:
        return False
    return scalar(bench_url, "select count(*) >= 1000000 from handovers") is True


def prepare_db(admin_url: str, bench_url: str, reuse: bool) -> None:
    linkdb = [str(VENV / "polycorn-linkdb"), "--url", bench_url, "upgrade"]
    if reuse and seeded(admin_url, bench_url):
        log(f"reusing the seeded database {DB}")
        run(linkdb, timeout=600)
        with pg_connect(bench_url, autocommit=True) as c:
            c.execute("truncate failure_tables")
        return
    log(f"creating and seeding {DB} (1M handovers; a few minutes)")
    with pg_connect(admin_url, autocommit=True) as c:
        c.execute(f"drop database if exists {DB} with (force)")
        c.execute(f"create database {DB}")
    with pg_connect(bench_url, autocommit=True) as c:
        c.execute("create extension if not exists postgis")
    run(linkdb, timeout=600)
    t = time.monotonic()
    # psql: the seed is a psql script (\set ON_ERROR_STOP on).
    run(["psql", bench_url, "-q", "-f", str(LOADTEST / "loadtest" / "seed.sql")], timeout=3600)
    log(f"seeded in {time.monotonic() - t:.0f} s")


def loadtest(module: str, *a: str) -> None:
    """A module of linkdb-api/loadtest (run from its folder, as a package)."""
    subprocess.run([str(VENV / "python"), "-m", f"loadtest.{module}", *a], cwd=LOADTEST, check=True)


def hash_key(key: str, name: str, scope: str) -> str:
    return run(
        [str(VENV / "polycorn-linkdb-api"), "hash-key", f"--key={key}", name, scope]
    ).stdout.strip()


def ready(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/readyz", timeout=2) as r:  # noqa: S310 (loopback)
            return bool(r.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


def etag(api: str, key: str) -> str:
    url = f"{api}/v1/failure-table"
    req = urllib.request.Request(url, headers={"X-API-Key": key})  # noqa: S310 (loopback)
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 (loopback)
        return str(r.headers["ETag"])


def main() -> int:
    a = args()
    prov = provenance.start(a.out / "api.json")
    vegeta = Path(os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn")) / "go" / "bin" / "vegeta"
    env = infra.up(services=["pg"])
    base = env["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0]
    admin_url, bench_url = f"{base}/postgres", f"{base}/{DB}"
    prepare_db(admin_url, bench_url, a.reuse)
    rows = scalar(bench_url, "select count(*) from handovers")
    cells = scalar(bench_url, "select count(*) from cells")

    read_key, admin_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = f"{hash_key(read_key, 'bench', 'read')},{hash_key(admin_key, 'bench-admin', 'admin')}"
    api = f"http://127.0.0.1:{a.port}"
    log(f"starting the API: {a.workers} uvicorn workers on 127.0.0.1:{a.port}")
    server = subprocess.Popen(
        [
            str(VENV / "polycorn-linkdb-api"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(a.port),
            "--workers",
            str(a.workers),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env={**env, "POLYCORN_DATABASE_URL": bench_url, "POLYCORN_API_KEYS": keys},
        cwd=ROOT,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="bench-api.") as w:
            work = Path(w)
            wait_until("the API ready", lambda: ready(api), 60, every_s=0.2)
            loadtest("publish_table", "--db", bench_url, "--url", api, f"--key={admin_key}")
            with pg_connect(bench_url) as c:
                ids = [str(r[0]) for r in c.execute("select id from cells order by id")]
            (work / "cells.txt").write_text("\n".join(ids) + "\n")
            loadtest(
                "targets",
                "--url",
                api,
                f"--key={read_key}",
                "--cells",
                str(work / "cells.txt"),
                "--etag",
                etag(api, read_key),
                "--out",
                str(work),
            )
            setup = {
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
                "handovers": rows,
                "cells": cells,
                "api": f"{a.workers} uvicorn workers (uvloop, httptools), asyncio psycopg "
                "pool of 8 per worker",
                "load": f"vegeta {setup_var('VEGETA_VERSION')}, open loop at {a.rate} req/s "
                f"for {a.seconds} s after a {a.warmup} s warm-up, keep-alive; vegeta, API and "
                "PostgreSQL on the same cores",
            }
            (work / "setup.json").write_text(json.dumps(setup))
            for q in a.queries.split():
                log(f"{q}: warm-up {a.warmup}s, then {a.seconds}s at {a.rate} req/s")
                attack = [
                    str(vegeta),
                    "attack",
                    "-format=json",
                    f"-targets={work / q}.jsonl",
                    f"-rate={a.rate}/s",
                    "-timeout=10s",
                ]
                subprocess.run(
                    [*attack, f"-duration={a.warmup}s"], stdout=subprocess.DEVNULL, check=True
                )
                loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                (work / f"{q}.loadavg").write_text(loadavg + "\n")
                with (work / f"{q}.bin").open("wb") as f:
                    subprocess.run([*attack, f"-duration={a.seconds}s"], stdout=f, check=True)
                with (work / f"{q}.report.json").open("wb") as f:
                    subprocess.run(
                        [str(vegeta), "report", "-type=json", str(work / f"{q}.bin")],
                        stdout=f,
                        check=True,
                    )
            loadtest(
                "report",
                "--dir",
                str(work),
                "--setup",
                str(work / "setup.json"),
                "--out",
                str(work / "api.json"),
            )
            a.out.mkdir(parents=True, exist_ok=True)
            doc = prov.stamp(json.loads((work / "api.json").read_text()))
            (a.out / "api.json").write_text(json.dumps(doc, indent=2) + "\n")
            log(f"wrote {a.out / 'api.json'}")
    finally:
        stop_process(server.pid, grace_s=10)
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
