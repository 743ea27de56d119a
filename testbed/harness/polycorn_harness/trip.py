"""Did a testbed trip's telemetry land in LinkDB exactly once?

A trip's radio log is polycorn-tracegen's ``events.jsonl``; ``epoch_ms`` is the
wall-clock time of the trip's t = 0 (UNIX ms). Every ``handover_end`` of the
carriers the testbed runs (0 and 1: ``carrier-<i>``, start = epoch + t_ms -
duration_ms) and every ``gps`` event (epoch + t_ms) must be in LinkDB exactly
once, and nothing else; an empty trip fails too. The telemetry suite (namespace
testbed), the compose suite and the fault campaign (testbed/chaos) judge with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

#: The carriers a testbed trip runs (topology.sh and docker-compose.yml use two).
CARRIERS = 2
Key = TypeVar("Key", tuple[str, int], int)


@dataclass(frozen=True)
class Expected:
    """What LinkDB must hold of a trip, in the log's order: the keys (handover
    ``(carrier, start_ms)``, fix ``time_ms``) and, for each, the wall-clock ms at
    which the relay's replay emits it."""

    handovers: tuple[tuple[str, int], ...]
    fixes: tuple[int, ...]
    handover_emit_ms: tuple[int, ...]
    fix_emit_ms: tuple[int, ...]

    @classmethod
    def load(cls, events: Path, epoch_ms: int) -> Expected:
        ho: list[tuple[str, int]] = []
        fix: list[int] = []
        ho_emit: list[int] = []
        fix_emit: list[int] = []
        for line in events.read_text().splitlines():
            if not line.strip():
                continue
            e = json.loads(line)
            if e["event"] == "handover_end" and e["carrier"] < CARRIERS:
                ho.append((f"carrier-{e['carrier']}", epoch_ms + e["t_ms"] - e["duration_ms"]))
                ho_emit.append(epoch_ms + e["t_ms"])
            elif e["event"] == "gps":
                fix.append(epoch_ms + e["t_ms"])
                fix_emit.append(epoch_ms + e["t_ms"])
        return cls(tuple(ho), tuple(fix), tuple(ho_emit), tuple(fix_emit))


def compare(what: str, want: Sequence[Key], got: Sequence[Key]) -> tuple[bool, str]:
    """Is ``got`` exactly ``want``, once each (and ``want`` not empty)? With a line that
    gives the counts and a few examples of what is missing or extra."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    dups = len(got) - len(set(got))
    report = (
        f"{what}: trip {len(want)}, LinkDB {len(got)}, missing {len(missing)}, "
        f"extra {len(extra)}, duplicates {dups}"
    )
    if missing:
        report += f"; missing e.g. {missing[:3]}"
    if extra:
        report += f"; extra e.g. {extra[:3]}"
    return (not missing and not extra and dups == 0 and len(want) > 0), report


def exactly_once(
    want: Expected, handovers: Sequence[tuple[str, int]], fixes: Sequence[int]
) -> tuple[bool, str]:
    """LinkDB's rows for the train (``(carrier, start_ms)`` per handover, ``time_ms`` per
    GPS fix) against the trip: whether they match, and the report of both."""
    ok_ho, r_ho = compare("handovers", list(want.handovers), list(handovers))
    ok_fix, r_fix = compare("gps fixes", list(want.fixes), list(fixes))
    return ok_ho and ok_fix, f"{r_ho}\n{r_fix}"
