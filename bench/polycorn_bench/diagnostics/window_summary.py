"""The receive window's diagnostic: geometric mean download time per trip, size and
scheme, before -> after the change of the window's start and growth.

Reads ``before-r7-t*.txt`` and ``after-r7-t*.txt`` (outputs of ``print_railway_replay``)
in DIR and prints one line per trip and size.

Usage (from bench/): uv run python -m polycorn_bench.diagnostics.window_summary \\
    out/diagnostics/railway-replay/window > out/diagnostics/railway-replay/window/summary.txt
"""

from __future__ import annotations

import collections
import math
import re
import sys
from pathlib import Path

LINE = re.compile(r"\s*(\d+)\s+(\d+)\s+[\d.]+s \| (.*)")


def times(path: Path) -> dict[tuple[str, int], list[float]]:
    out: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        if m:
            for part in m.group(3).split(" | "):
                name, value = part.rsplit(" ", 1)
                out[(name, int(m.group(2)))].append(float(value))
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    here = Path(sys.argv[1])
    for size in (262144, 1048576, 4194304):
        print(f"size {size} (s, geometric mean of 10 downloads, before -> after)")
        for t in range(1001, 1006):
            b, a = (times(here / f"{w}-r7-t{t}.txt") for w in ("before", "after"))
            cells = []
            for name, sz in b:
                if sz == size:
                    gb, ga = geomean(b[(name, sz)]), geomean(a[(name, sz)])
                    cells.append(f"{name}: {gb:.2f} -> {ga:.2f}")
            print(f"  r7-t{t}: " + " | ".join(cells))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
