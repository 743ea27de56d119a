"""How far two runs of the precision profile agree download by download.

For every scheme, the downloads both runs completed (same trip and id, censored ones included
at their timeout as everywhere in hsr.json) are paired across the runs: the geometric mean of
goodput_run_b / goodput_run_a, the SD of its logarithm, and the share of downloads within 1 %
and within 10 % of each other. A benchmark whose downloads sit at the same places of the trip
in both runs should agree closely; one whose downloads move with the warm-up should not.

Usage (from bench/):

    uv run python -m polycorn_bench.diagnostics.precision_repeat RUN_A RUN_B [OUT_JSON]

(RUN_A, RUN_B: raw run directories, e.g. /tmp/polycorn-bench-hsr/run-precision).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench.flows import collect_flows
from polycorn_bench.records import read_run

SCHEMES = ("minrtt", "hrsch")


def goodputs(run_dir: Path) -> dict[tuple[str, str, int], float]:
    run = read_run(run_dir)
    ls = next(ls for ls in run.link_sets if ls.name == "hsr")
    return {
        (f.scheme, f.trip, f.rec.id): g
        for f in collect_flows(ls, run, with_oracle=False)
        if (g := f.goodput_mbps) is not None and g > 0
    }


def compare(
    a: dict[tuple[str, str, int], float], b: dict[tuple[str, str, int], float]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scheme in SCHEMES:
        keys = [k for k in a if k[0] == scheme and k in b]
        logs = np.asarray([math.log(b[k] / a[k]) for k in keys])
        out[scheme] = {
            "n": len(keys),
            "geomean_b_over_a": float(np.exp(logs.mean())) if len(logs) else None,
            "sd_log": float(logs.std(ddof=1)) if len(logs) > 1 else None,
            "within_1pct": float(np.mean(np.abs(logs) < math.log(1.01))) if len(logs) else None,
            "within_10pct": float(np.mean(np.abs(logs) < math.log(1.10))) if len(logs) else None,
        }
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    doc = {
        "run_a": argv[0],
        "run_b": argv[1],
        **compare(goodputs(Path(argv[0])), goodputs(Path(argv[1]))),
    }
    text = json.dumps(doc, indent=1)
    if len(argv) == 3:
        Path(argv[2]).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
