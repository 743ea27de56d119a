"""Open-loop load generator for the LinkDB API's hot queries (``make bench-api``).

Each query is driven alone at a fixed arrival rate: request i is *due* at
``t0 + i / rate`` and is sent then whether or not earlier ones have
answered, and its latency is measured from when it was due, so queueing
anywhere (client, server, database) counts, as it would for real clients.
A warm-up at the same rate precedes each measured window.

    python -m loadtest.loadgen --url http://127.0.0.1:18080 --key KEY \\
        --rate 200 --seconds 30 --out bench/out/api.json

Queries: ``handovers_bbox_page`` (GET /v1/handovers, a random 10-30 km
viewport along a random line, first page of 100), ``cell_stats`` (GET
/v1/cells/{id}/stats of a random cell), ``failure_table`` (GET
/v1/failure-table, the whole body) and ``failure_table_304`` (the proxies'
poll with If-None-Match).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# The lines seed.sql lays out: (lon0, lat0) -> (lon1, lat1).
LINES = [
    (116.40, 39.90, 117.20, 34.70),
    (113.62, 34.75, 114.30, 30.59),
    (118.80, 32.06, 114.00, 30.00),
]


@dataclass
class Result:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    bytes: int = 0
    first_due: float = 0.0
    last_done: float = 0.0


Request = tuple[str, dict[str, str], dict[str, str]]  # path, params, headers


def bbox_request(rng: random.Random) -> Request:
    lon0, lat0, lon1, lat1 = rng.choice(LINES)
    f = rng.random()
    lon, lat = lon0 + (lon1 - lon0) * f, lat0 + (lat1 - lat0) * f
    half = rng.uniform(0.05, 0.15)  # degrees: a 10-30 km viewport
    bbox = f"{lon - half:.5f},{lat - half:.5f},{lon + half:.5f},{lat + half:.5f}"
    return "/v1/handovers", {"bbox": bbox, "limit": "100"}, {}


async def run_query(
    client: httpx.AsyncClient,
    make: Callable[[random.Random], Request],
    rate: float,
    seconds: float,
    seed: int,
) -> Result:
    rng = random.Random(seed)  # noqa: S311 (workload, not secrets)
    res = Result()
    n = int(rate * seconds)
    tasks: list[asyncio.Task[None]] = []

    async def one(due: float, req: Request) -> None:
        path, params, headers = req
        try:
            r = await client.get(path, params=params, headers=headers)
            done = time.perf_counter()
            if r.status_code not in (200, 304):
                res.errors += 1
                if len(res.error_samples) < 5:
                    res.error_samples.append(f"{r.status_code} {r.text[:200]}")
            else:
                res.bytes += len(r.content)
            res.latencies_s.append(done - due)
        except httpx.HTTPError as e:
            done = time.perf_counter()
            res.errors += 1
            if len(res.error_samples) < 5:
                res.error_samples.append(repr(e))
        res.last_done = max(res.last_done, done)

    t0 = time.perf_counter() + 0.05
    res.first_due = t0
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, make(rng))))
    await asyncio.gather(*tasks)
    return res


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(
        base_url=a.url,
        headers={"Authorization": f"Bearer {a.key}"},
        limits=limits,
        timeout=30.0,
    ) as client:
        # Cell IDs, through the API itself.
        cells: list[int] = []
        params: dict[str, str] = {"limit": "1000"}
        while True:
            page = (await client.get("/v1/cells", params=params)).raise_for_status().json()
            cells += [f["id"] for f in page["features"]]
            if not page["next_cursor"]:
                break
            params["cursor"] = page["next_cursor"]
        table = await client.get("/v1/failure-table")
        table.raise_for_status()
        etag = table.headers["etag"]

        queries: dict[str, tuple[Callable[[random.Random], Request], str]] = {
            "handovers_bbox_page": (
                bbox_request,
                "GET /v1/handovers?bbox=<random 0.1-0.3 deg square on a line>&limit=100",
            ),
            "cell_stats": (
                lambda rng: (f"/v1/cells/{rng.choice(cells)}/stats", {}, {}),
                f"GET /v1/cells/<random of {len(cells)}>/stats",
            ),
            "failure_table": (
                lambda rng: ("/v1/failure-table", {}, {}),
                f"GET /v1/failure-table ({len(table.content)} bytes)",
            ),
            "failure_table_304": (
                lambda rng: ("/v1/failure-table", {}, {"If-None-Match": etag}),
                "GET /v1/failure-table with If-None-Match (304)",
            ),
        }
        out: dict[str, Any] = {}
        for i, (name, (make, desc)) in enumerate(queries.items()):
            if a.only and name not in a.only:
                continue
            await run_query(client, make, a.rate, a.warmup, a.seed + 1000 + i)
            res = await run_query(client, make, a.rate, a.seconds, a.seed + i)
            lat_ms = [x * 1000 for x in res.latencies_s]
            wall = res.last_done - res.first_due
            ok = len(lat_ms) - res.errors
            out[name] = {
                "p50_ms": round(pct(lat_ms, 0.50), 2),
                "p99_ms": round(pct(lat_ms, 0.99), 2),
                "rps": round(ok / wall, 1) if wall > 0 else 0.0,
                "target_rps": a.rate,
                "seconds": a.seconds,
                "requests": len(lat_ms),
                "errors": res.errors,
                "error_samples": res.error_samples,
                "mean_ms": round(statistics.fmean(lat_ms), 2),
                "p90_ms": round(pct(lat_ms, 0.90), 2),
                "max_ms": round(max(lat_ms), 2),
                "mean_response_bytes": round(res.bytes / max(ok, 1)),
                "params": f"{desc}; {a.setup}",
            }
            print(
                f"{name:22s} p50 {out[name]['p50_ms']:8.2f} ms  p99 {out[name]['p99_ms']:8.2f} ms"
                f"  {out[name]['rps']:6.1f} req/s  errors {res.errors}",
                flush=True,
            )
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="loopback base URL of the API")
    p.add_argument("--key", required=True, help="a read-scope API key")
    p.add_argument("--rate", type=float, default=200.0, help="arrivals per second")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window per query")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up per query, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", nargs="*", help="run only these queries")
    p.add_argument("--setup", default="", help="free text recorded with every query")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if not a.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        p.error("the load generator only sends to loopback")
    out = asyncio.run(main_async(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
