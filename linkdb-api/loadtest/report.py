"""Fold ``vegeta report -type=json`` outputs into the queries of ``bench/out/api.json``
(``polycorn_benchrun.api`` adds the commit and whether the tree was clean, and writes it
there).

    python -m loadtest.report --dir DIR --setup SETUP.json --out api.json

``DIR`` holds, per query, ``<query>.report.json`` (vegeta's JSON report of
the measured window) and ``<query>.loadavg`` (/proc/loadavg just before
it), plus ``queries.json`` from ``loadtest.targets``. The result is
``{query: {"p50_ms", "p99_ms", "rps", …}}``: ``rps`` is the achieved rate of
successful (2xx/3xx) responses, ``offered_rps`` the rate vegeta sent at.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

NS_PER_MS = 1e6


def fold(report: dict[str, Any], what: str, loadavg: str, setup: dict[str, Any]) -> dict[str, Any]:
    lat = report["latencies"]
    codes: dict[str, int] = report.get("status_codes", {})
    ok = sum(n for c, n in codes.items() if 200 <= int(c) < 400)
    return {
        "p50_ms": round(lat["50th"] / NS_PER_MS, 2),
        "p99_ms": round(lat["99th"] / NS_PER_MS, 2),
        "rps": round(report["throughput"], 1),
        "offered_rps": round(report["rate"], 1),
        "requests": report["requests"],
        "errors": report["requests"] - ok,
        "status_codes": codes,
        "error_samples": report.get("errors", [])[:5],
        "mean_ms": round(lat["mean"] / NS_PER_MS, 2),
        "p90_ms": round(lat["90th"] / NS_PER_MS, 2),
        "max_ms": round(lat["max"] / NS_PER_MS, 2),
        "mean_response_bytes": round(report["bytes_in"]["mean"]),
        "seconds": round(report["duration"] / 1e9, 1),
        "query": what,
        "load_average_before": loadavg,
        "setup": setup,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--setup", type=Path, required=True, help="a JSON object: machine, method")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    queries: dict[str, str] = json.loads((a.dir / "queries.json").read_text())
    setup = json.loads(a.setup.read_text())
    out: dict[str, Any] = {}
    for name, what in queries.items():
        rep = a.dir / f"{name}.report.json"
        if not rep.exists():
            continue
        la = a.dir / f"{name}.loadavg"
        loadavg = " ".join(la.read_text().split()[:3]) if la.exists() else "?"
        out[name] = fold(json.loads(rep.read_text()), what, loadavg, setup)
        q = out[name]
        print(
            f"{name:20s} p50 {q['p50_ms']:8.2f} ms  p99 {q['p99_ms']:8.2f} ms  "
            f"{q['rps']:6.1f}/{q['offered_rps']:.0f} req/s  errors {q['errors']}  "
            f"load {loadavg}"
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
