"""make bench-api: p50/p99 of the LinkDB API's hot queries at one or more database sizes,
each at fixed open-loop rates, repeated -> bench/out/api.json
(``python -m polycorn_benchrun.api``, after ``scripts/setup.sh bench``, as make bench-api
runs it).

1. PostgreSQL + PostGIS (``scripts/infra.sh up pg``, through the harness); per size a
   database, migrated, seeded by linkdb-api/loadtest/seed.sql with ``-v trains=N``:
   N trains x 28 trips x 900 handovers (40 trains: 1,008,000 handovers in
   ``linkdb_bench_api``, a few minutes; 400: 10,080,000 in ``linkdb_bench_api_400t``,
   about 6 minutes), 5,400 cells on 3 lines. With ``--reuse`` a database that is already
   seeded to that size is kept (migrated to head, failure tables emptied): the state a
   long-lived database is in, which ``db_state`` records (row counts, when it was last
   analysed and vacuumed, index sizes).
2. Two throw-away API keys (read, admin), only their hashes given to the API.
3. The API under uvicorn (uvloop + httptools) on loopback, ``--workers`` workers, no
   access log.
4. A failure-location table published through ``POST /v1/failure-tables``.
5. Vegeta (``scripts/setup.sh bench`` builds it) drives each query alone: a warm-up,
   then the measured window at the rate, open loop (requests leave on schedule
   whether or not earlier ones have answered); targets from
   linkdb-api/loadtest/targets.py (fixed seed). Every (rate, query) is measured
   ``--repeats`` times, the repeats interleaved (all queries and rates once, then
   again), so that slow phases of the machine hit them alike. ``vegeta report
   -type=json`` per window, folded by loadtest/report.py; api.json has every window and,
   per (size, rate, query), the median and range over the repeats. Each window also
   records the CPU that the API's processes and PostgreSQL's spent in it per request
   sent (``cpu_ms_per_request``): what a rate costs in cores, where this machine's two
   cannot carry it.

Vegeta, the API and PostgreSQL share the machine's cores: the numbers include that
contention, and whatever else runs (the load average before each window is recorded
in api.json). api.json also says which commit it came from and whether the tree was clean
(polycorn_harness.provenance).

Env (defaults of the options): BENCH_API_SIZES (40: trains, comma separated),
BENCH_API_RATES (200: req/s, comma separated), BENCH_API_REPEATS (3),
BENCH_API_SECONDS (20), BENCH_API_WARMUP (5), BENCH_API_WORKERS (2), BENCH_API_PORT
(28080), BENCH_API_QUERIES (all four), BENCH_API_REUSE=1 (keep an already seeded
database), BENCH_OUT (bench/out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, VENV, infra, provenance
from polycorn_harness.process import cpu_ticks, process_tree, setup_var, stop_process
from polycorn_harness.topology import run
from polycorn_harness.wait import wait_until
from polycorn_schema.startup import pg_connect

QUERIES = "handovers_bbox_page cell_stats failure_table failure_table_304"
LOADTEST = ROOT / "linkdb-api"


def log(msg: str) -> None:
    print(f"bench-api: {msg}", file=sys.stderr, flush=True)


def args() -> argparse.Namespace:
    e = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=e("BENCH_API_SIZES", "40"), help="trains, comma separated")
    p.add_argument("--rates", default=e("BENCH_API_RATES", "200"), help="req/s, comma separated")
    p.add_argument("--repeats", type=int, default=int(e("BENCH_API_REPEATS", "3")))
    p.add_argument("--seconds", type=int, default=int(e("BENCH_API_SECONDS", "20")))
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


TRIPS, PER_TRIP = 28, 900  # seed.sql's defaults: trips per train, handovers per trip


def db_name(trains: int) -> str:
    return "linkdb_bench_api" if trains == 40 else f"linkdb_bench_api_{trains}t"


def seeded(admin_url: str, bench_url: str, db: str, trains: int) -> bool:
    if scalar(admin_url, f"select 1 from pg_database where datname = '{db}'") != 1:
        return False
    n = scalar(bench_url, "select count(*) from handovers")
    return n == trains * TRIPS * PER_TRIP


def prepare_db(admin_url: str, bench_url: str, db: str, trains: int, reuse: bool) -> bool:
    """True when seeded now, false when an already seeded database is reused."""
    linkdb = [str(VENV / "polycorn-linkdb"), "--url", bench_url, "upgrade"]
    if reuse and seeded(admin_url, bench_url, db, trains):
        log(f"reusing the seeded database {db}")
        run(linkdb, timeout=3600)
        with pg_connect(bench_url, autocommit=True) as c:
            c.execute("truncate failure_tables")
        return False
    log(f"creating and seeding {db} ({trains * TRIPS * PER_TRIP:,} handovers)")
    with pg_connect(admin_url, autocommit=True) as c:
        c.execute(f"drop database if exists {db} with (force)")
        c.execute(f"create database {db}")
    with pg_connect(bench_url, autocommit=True) as c:
        c.execute("create extension if not exists postgis")
    run(linkdb, timeout=600)
    t = time.monotonic()
    # psql: the seed is a psql script (\set ON_ERROR_STOP on).
    seed = str(LOADTEST / "loadtest" / "seed.sql")
    run(["psql", bench_url, "-q", "-v", f"trains={trains}", "-f", seed], timeout=4 * 3600)
    log(f"seeded in {time.monotonic() - t:.0f} s")
    return True


def db_state(url: str) -> dict[str, object]:
    """What a plan may depend on: sizes, statistics and maintenance of handovers."""
    with pg_connect(url) as c:
        row = c.execute(
            "select n_live_tup, n_dead_tup, n_mod_since_analyze, last_analyze, "
            "last_autoanalyze, last_vacuum, last_autovacuum, "
            "(select reltuples from pg_class where relname = 'handovers'), "
            "pg_relation_size('handovers') "
            "from pg_stat_user_tables where relname = 'handovers'"
        ).fetchone()
        idx = c.execute(
            "select indexrelname, pg_relation_size(indexrelid) from pg_stat_user_indexes "
            "where relname = 'handovers' order by 1"
        ).fetchall()
    assert row is not None
    keys = [
        "live_rows",
        "dead_rows",
        "modified_since_analyze",
        "last_analyze",
        "last_autoanalyze",
        "last_vacuum",
        "last_autovacuum",
        "planner_rows",
        "table_bytes",
    ]
    return {
        **{
            k: (str(v) if v is not None and not isinstance(v, int | float) else v)
            for k, v in zip(keys, row, strict=True)
        },
        "index_bytes": dict(idx),
    }


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


def attack(vegeta: Path, work: Path, q: str, rate: int, *, seconds: int, out: Path | None) -> None:
    cmd = [
        str(vegeta),
        "attack",
        "-format=json",
        f"-targets={work / q}.jsonl",
        f"-rate={rate}/s",
        "-timeout=10s",
        f"-duration={seconds}s",
    ]
    if out is None:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        return
    with out.open("wb") as f:
        subprocess.run(cmd, stdout=f, check=True)


def server_pids(admin_url: str) -> list[int]:
    """The PostgreSQL server's processes: its backends and background workers."""
    with pg_connect(admin_url) as c:
        return [int(r[0]) for r in c.execute("select pid from pg_stat_activity")]


def cpu_groups(api_pid: int, admin_url: str) -> dict[str, list[int]]:
    """The processes whose CPU a window counts, as they are now: the API's and
    PostgreSQL's."""
    return {"api": process_tree(api_pid), "postgres": server_pids(admin_url)}


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    """CPU ticks so far of each process, by group (a process gone counts nothing)."""
    snap: dict[str, dict[int, int]] = {}
    for g, pids in groups.items():
        snap[g] = {}
        for p in pids:
            with contextlib.suppress(OSError):
                snap[g][p] = cpu_ticks(p)
    return snap


def cpu_ms_per_request(
    before: dict[str, dict[int, int]], after: dict[str, dict[int, int]], requests: int
) -> dict[str, float]:
    """Each group's CPU between two snapshots, in ms per request answered; a process
    that started in between counts from zero, one that ended counts nothing."""
    ms_per_tick = 1000 / os.sysconf("SC_CLK_TCK")
    out = {
        g: sum(t - before.get(g, {}).get(p, 0) for p, t in ticks.items()) * ms_per_tick / requests
        for g, ticks in after.items()
    }
    return {g: round(v, 3) for g, v in out.items()} | {"total": round(sum(out.values()), 3)}


def summarise(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over the repeats of one (size, rate, query)."""
    out: dict[str, Any] = {"repeats": len(windows)}
    for k in ("p50_ms", "p99_ms", "rps"):
        v = [w[k] for w in windows]
        out[k] = statistics.median(v)
        out[f"{k}_range"] = [min(v), max(v)]
    cpu = [w["cpu_ms_per_request"] for w in windows if "cpu_ms_per_request" in w]
    if cpu:
        out["cpu_ms_per_request"] = {g: statistics.median(c[g] for c in cpu) for g in cpu[0]}
        out["cpu_ms_per_request_range"] = {
            g: [min(c[g] for c in cpu), max(c[g] for c in cpu)] for g in cpu[0]
        }
    out["offered_rps"] = windows[0]["offered_rps"]
    out["errors"] = sum(w["errors"] for w in windows)
    out["requests"] = sum(w["requests"] for w in windows)
    out["query"] = windows[0]["query"]
    out["load_average_before"] = [w["load_average_before"] for w in windows]
    return out


def measure_size(
    a: argparse.Namespace, vegeta: Path, env: dict[str, str], trains: int, work: Path
) -> dict[str, Any]:
    base = env["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0]
    db = db_name(trains)
    admin_url, bench_url = f"{base}/postgres", f"{base}/{db}"
    fresh = prepare_db(admin_url, bench_url, db, trains, a.reuse)
    rows = scalar(bench_url, "select count(*) from handovers")
    cells = scalar(bench_url, "select count(*) from cells")
    state = db_state(bench_url)

    read_key, admin_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = f"{hash_key(read_key, 'bench', 'read')},{hash_key(admin_key, 'bench-admin', 'admin')}"
    api = f"http://127.0.0.1:{a.port}"
    log(f"starting the API on {db}: {a.workers} uvicorn workers on 127.0.0.1:{a.port}")
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
    rates = [int(r) for r in a.rates.split(",")]
    queries = a.queries.split()
    try:
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
        setup = {"handovers": rows, "cells": cells}
        (work / "setup.json").write_text(json.dumps(setup))
        windows: dict[tuple[int, str], list[dict[str, Any]]] = {}
        cpu: dict[tuple[int, int, str], dict[str, float]] = {}
        for rep in range(a.repeats):
            for rate in rates:
                d = work / f"rep{rep}-rate{rate}"
                d.mkdir()
                (d / "queries.json").write_text((work / "queries.json").read_text())
                for q in queries:
                    log(f"{trains} trains, repeat {rep + 1}/{a.repeats}, {q} at {rate} req/s")
                    attack(vegeta, work, q, rate, seconds=a.warmup, out=None)
                    loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                    (d / f"{q}.loadavg").write_text(loadavg + "\n")
                    before = cpu_snapshot(cpu_groups(server.pid, admin_url))
                    attack(vegeta, work, q, rate, seconds=a.seconds, out=d / f"{q}.bin")
                    after = cpu_snapshot(cpu_groups(server.pid, admin_url))
                    with (d / f"{q}.report.json").open("wb") as f:
                        subprocess.run(
                            [str(vegeta), "report", "-type=json", str(d / f"{q}.bin")],
                            stdout=f,
                            check=True,
                        )
                    (d / f"{q}.bin").unlink()
                    answered = json.loads((d / f"{q}.report.json").read_text())["requests"]
                    cpu[(rep, rate, q)] = cpu_ms_per_request(before, after, max(1, answered))
                loadtest(
                    "report",
                    "--dir",
                    str(d),
                    "--setup",
                    str(work / "setup.json"),
                    "--out",
                    str(d / "api.json"),
                )
                for q, w in json.loads((d / "api.json").read_text()).items():
                    w["cpu_ms_per_request"] = cpu[(rep, rate, q)]
                    windows.setdefault((rate, q), []).append(w)
    finally:
        stop_process(server.pid, grace_s=10)
        server.wait(timeout=30)
    by_rate: dict[str, dict[str, Any]] = {}
    for (rate, q), ws in windows.items():
        by_rate.setdefault(str(rate), {})[q] = {**summarise(ws), "windows": ws}
    return {
        "trains": trains,
        "database": db,
        "handovers": rows,
        "cells": cells,
        "seeded_this_run": fresh,
        "db_state": state,
        "rates": by_rate,
    }


def main() -> int:
    a = args()
    prov = provenance.start(a.out / "api.json")
    vegeta = Path(os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn")) / "go" / "bin" / "vegeta"
    env = infra.up(services=["pg"])
    sizes = []
    for trains in (int(t) for t in a.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-api.") as w:
            sizes.append(measure_size(a, vegeta, env, trains, Path(w)))
    doc = {
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
        "api": f"{a.workers} uvicorn workers (uvloop, httptools), asyncio psycopg "
        "pool of 8 per worker",
        "load": f"vegeta {setup_var('VEGETA_VERSION')}, open loop, {a.seconds} s windows after a "
        f"{a.warmup} s warm-up each, {a.repeats} repeats interleaved, keep-alive; vegeta, API "
        "and PostgreSQL on the same cores",
        "sizes": sizes,
    }
    for s in sizes:
        for rate, qs in s["rates"].items():
            for q, r in qs.items():
                log(
                    f"{s['handovers']:>10,} handovers {rate:>5} req/s {q:20s} "
                    f"p50 {r['p50_ms']:8.2f} ms {r['p50_ms_range']}  p99 {r['p99_ms']:8.2f} ms "
                    f"{r['p99_ms_range']}  {r['rps']:.1f}/{r['offered_rps']:.0f} req/s  "
                    f"errors {r['errors']}  "
                    f"CPU {r.get('cpu_ms_per_request', {}).get('total')} ms/request"
                )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "api.json").write_text(json.dumps(prov.stamp(doc), indent=2) + "\n")
    log(f"wrote {a.out / 'api.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
