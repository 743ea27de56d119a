"""Did a testbed trip's telemetry land in LinkDB exactly once?

    trip_exactly_once.py EVENTS EPOCH_MS HANDOVER_ROWS FIX_ROWS

EVENTS is the trip's radio log (polycorn-tracegen's events.jsonl), EPOCH_MS
the wall-clock time of the trip's t = 0 (UNIX ms). HANDOVER_ROWS and
FIX_ROWS are what LinkDB holds for the train, as ``psql -At`` prints them:
``carrier|start_ms`` per handover and ``time_ms`` per GPS fix.

Every ``handover_end`` of carriers 0 and 1 (carrier ``carrier-<i>``, start =
epoch + t_ms - duration_ms) and every ``gps`` event (epoch + t_ms) must be
there exactly once, and nothing else; an empty trip fails too. Prints the
counts (and a few examples of what is missing or extra) and exits 1 on any
difference. Used by the telemetry suite (testbed/harness/suites/telemetry, the namespace testbed)
and scripts/test-compose.sh (the compose testbed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TypeVar

CARRIERS = 2
Row = TypeVar("Row", tuple[str, int], int)


def expected(events: Path, epoch_ms: int) -> tuple[list[tuple[str, int]], list[int]]:
    handovers: list[tuple[str, int]] = []
    fixes: list[int] = []
    for line in events.read_text().splitlines():
        if not line.strip():
            continue
        e = json.loads(line)
        if e["event"] == "handover_end" and e["carrier"] < CARRIERS:
            handovers.append((f"carrier-{e['carrier']}", epoch_ms + e["t_ms"] - e["duration_ms"]))
        elif e["event"] == "gps":
            fixes.append(epoch_ms + e["t_ms"])
    return handovers, fixes


def read_handovers(path: Path) -> list[tuple[str, int]]:
    rows = []
    for line in path.read_text().split():
        carrier, _, start = line.partition("|")
        rows.append((carrier, int(start)))
    return rows


def compare(what: str, want: list[Row], got: list[Row]) -> bool:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    dups = len(got) - len(set(got))
    print(
        f"  {what}: trip {len(want)}, LinkDB {len(got)}, missing {len(missing)}, "
        f"extra {len(extra)}, duplicates {dups}"
    )
    if missing:
        print("    missing e.g.", missing[:3])
    if extra:
        print("    extra e.g.", extra[:3])
    return not missing and not extra and dups == 0 and len(want) > 0


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    events, epoch, ho_rows, fix_rows = Path(argv[0]), int(argv[1]), Path(argv[2]), Path(argv[3])
    want_ho, want_fix = expected(events, epoch)
    got_ho = read_handovers(ho_rows)
    got_fix = [int(r) for r in fix_rows.read_text().split()]
    ok = compare("handovers", want_ho, got_ho)
    ok &= compare("gps fixes", want_fix, got_fix)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
