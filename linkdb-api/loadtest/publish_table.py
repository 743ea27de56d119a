"""Publish a failure-location table built from the bench database's cells
through the API (POST /v1/failure-tables), as the trainer would: one entry
per ⟨cell, direction⟩ with enough handovers, at the mean failure location."""

from __future__ import annotations

import argparse
import sys

import httpx

from polycorn_schema.startup import pg_connect

SQL = """
SELECT h.source_cell_id, h.direction::text, avg(h.track_m) FILTER (WHERE h.outcome = 'failure'),
       count(*) FILTER (WHERE h.outcome = 'failure'), count(*)
FROM handovers h
GROUP BY h.carrier, h.source_cell_id, h.direction
HAVING count(*) FILTER (WHERE h.outcome = 'failure') >= 5
ORDER BY 1, 2
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True, help="an admin-scope API key")
    a = p.parse_args()
    with pg_connect(a.db) as c:
        rows = c.execute(SQL).fetchall()
    entries = [
        {"cell": cell, "direction": d, "position_m": round(pos, 1), "failures": f, "handovers": n}
        for cell, d, pos, f, n in rows
    ]
    table = {"format": "polycorn-failure-table/1", "source": "bench-api", "entries": entries}
    r = httpx.post(
        f"{a.url}/v1/failure-tables",
        json=table,
        headers={"X-API-Key": a.key},
        params={"note": "make bench-api"},
        timeout=60,
    )
    print(r.status_code, r.text[:300])
    return 0 if r.status_code == 201 else 1


if __name__ == "__main__":
    sys.exit(main())
