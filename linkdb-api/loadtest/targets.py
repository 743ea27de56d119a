"""Vegeta target files for ``make bench-api``: one per hot query, prepared in
advance from a fixed seed, so every run offers the same requests.

    python -m loadtest.targets --url http://127.0.0.1:28080 --key KEY \\
        --cells cells.txt --etag '"abc…"' --out DIR [--count 20000] [--seed 1]

writes ``DIR/<query>.jsonl`` (vegeta ``-format=json`` targets; vegeta cycles
through them) and ``DIR/queries.json`` (what each query is). Queries:

``handovers_bbox_page``
    ``GET /v1/handovers?bbox=…&limit=100``: the first page of a map
    viewport, a square of 0.1-0.3 degrees (about 10-30 km) centred on a
    random point of one of seed.sql's three lines.
``cell_stats``
    ``GET /v1/cells/{id}/stats`` of a random cell (``--cells``: one LinkDB cell
    ID a line, from the database).
``failure_table``
    ``GET /v1/failure-table``: the whole current table.
``failure_table_304``
    the proxies' poll: the same with ``If-None-Match`` = the current ETag.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

# The lines seed.sql lays out: (lon0, lat0) -> (lon1, lat1).
LINES = [
    (116.40, 39.90, 117.20, 34.70),
    (113.62, 34.75, 114.30, 30.59),
    (118.80, 32.06, 114.00, 30.00),
]
LOOPBACK = ("http://127.", "http://localhost:", "http://[::1]:")


def bbox(rng: random.Random) -> str:
    lon0, lat0, lon1, lat1 = rng.choice(LINES)
    f = rng.random()
    lon, lat = lon0 + (lon1 - lon0) * f, lat0 + (lat1 - lat0) * f
    half = rng.uniform(0.05, 0.15)
    return f"{lon - half:.5f},{lat - half:.5f},{lon + half:.5f},{lat + half:.5f}"


def target(url: str, key: str, **headers: str) -> dict[str, Any]:
    h = {"Authorization": [f"Bearer {key}"]} | {k: [v] for k, v in headers.items()}
    return {"method": "GET", "url": url, "header": h}


def build(
    base: str, key: str, *, cells: list[int], etag: str, count: int, seed: int
) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    rng = random.Random(seed)  # noqa: S311 (a workload, not a secret)
    return {
        "handovers_bbox_page": (
            "GET /v1/handovers?bbox=<0.1-0.3 deg square centred on a random point of a line>"
            "&limit=100",
            [target(f"{base}/v1/handovers?bbox={bbox(rng)}&limit=100", key) for _ in range(count)],
        ),
        "cell_stats": (
            f"GET /v1/cells/<random of {len(cells)} cells>/stats",
            [target(f"{base}/v1/cells/{rng.choice(cells)}/stats", key) for _ in range(count)],
        ),
        "failure_table": (
            "GET /v1/failure-table (the whole body)",
            [target(f"{base}/v1/failure-table", key)],
        ),
        "failure_table_304": (
            "GET /v1/failure-table with If-None-Match: <current ETag> (304)",
            [target(f"{base}/v1/failure-table", key, **{"If-None-Match": etag})],
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="loopback base URL of the API")
    p.add_argument("--key", required=True, help="a read-scope API key")
    p.add_argument("--cells", type=Path, required=True, help="LinkDB cell IDs, one a line")
    p.add_argument("--etag", required=True, help="the current table's ETag, quotes included")
    p.add_argument("--count", type=int, default=20000, help="targets per query")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if not a.url.startswith(LOOPBACK):
        p.error("the benchmark only sends to loopback")
    cells = [int(x) for x in a.cells.read_text().split()]
    if not cells:
        p.error(f"no cell IDs in {a.cells}")
    a.out.mkdir(parents=True, exist_ok=True)
    desc = {}
    queries = build(a.url.rstrip("/"), a.key, cells=cells, etag=a.etag, count=a.count, seed=a.seed)
    for name, (what, targets) in queries.items():
        (a.out / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in targets))
        desc[name] = what
    (a.out / "queries.json").write_text(json.dumps(desc, indent=2) + "\n")


if __name__ == "__main__":
    main()
