"""Seeded fault plans: one episode's faults from its seed alone.

An episode's seed gives its whole plan (which faults, on what, when, for how
long) and its workload's choices through :class:`random.Random` seeded with
it; nothing else is random, so ``--seed S --episodes 1`` replays the plan of
the episode that had seed S. What the system does in reply is not replayed
exactly (scheduling, the emulated links' state), which is why a campaign
runs many episodes.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

# kind -> (component it hits, relative weight). Kafka's restarts are slow (a
# JVM, then the readiness probe), so they are drawn less often.
KINDS: dict[str, tuple[str, int]] = {
    "relay-kill": ("relay", 3),  # SIGKILL, restart after the fault's duration
    "relay-term": ("relay", 2),  # SIGTERM (clean shutdown), restart
    "proxy-kill": ("proxy", 3),
    "proxy-term": ("proxy", 2),
    "kafka-kill": ("kafka", 2),  # SIGKILL of the broker, then scripts/infra.sh up kafka
    "kafka-restart": ("kafka", 1),  # scripts/infra.sh down kafka (clean), later up
    "pg-kill": ("pg", 2),  # SIGKILL of the postmaster (crash recovery at restart)
    "pg-restart": ("pg", 1),  # pg_ctl stop -m fast, later start
    "ingest-kill": ("ingest", 2),
    "ingest-term": ("ingest", 1),
    "trainer-kill": ("trainer", 1),
    "trainer-term": ("trainer", 1),
    "link-down": ("link", 3),  # one carrier administratively down at both ends
    "link-drop": ("link", 2),  # one carrier silently drops everything
    "links-all-down": ("link", 2),  # every carrier down: the train is cut off
    "spool-full": ("spool", 3),  # the relay's telemetry spool's file system full
}

# When a fault starts (s after the workload started) and how long it lasts.
START_S = (2.0, 6.0)
DURATION_S = (3.0, 10.0)
# ... except where the judgement needs longer: with every carrier down the
# proxy hears nothing (no FIN or RST crosses a dead link) and learns it only
# from its dead-path timer, so the outage must outlast that timer's bound
# (campaign.SILENT_GRACE_S) for the proxy's readiness to be judged at all.
DURATION_BY_KIND = {"links-all-down": (8.0, 18.0)}


@dataclass(frozen=True)
class Fault:
    kind: str
    start_s: float
    duration_s: float
    # Which carrier, for link-down and link-drop; 0 otherwise.
    carrier: int = 0

    @property
    def component(self) -> str:
        return KINDS[self.kind][0]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def describe(self) -> str:
        what = f"{self.kind}" + (f"[{self.carrier}]" if self.kind in CARRIER_KINDS else "")
        return f"{what} at +{self.start_s:.1f}s for {self.duration_s:.1f}s"


CARRIER_KINDS = ("link-down", "link-drop")


@dataclass(frozen=True)
class Workload:
    """The passengers of one episode."""

    # Downloaders: each fetches files one after another until window_s is over.
    downloaders: int
    window_s: float
    # Files they draw from (names under the origin's /files/, see make-files.sh).
    files: tuple[str, ...]
    # Chat users (polycorn-loadgen im), messages each, mean gap between them.
    chat_users: int
    chat_messages: int
    chat_gap_ms: float


@dataclass(frozen=True)
class Plan:
    seed: int
    faults: tuple[Fault, ...]
    workload: Workload

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "faults": [asdict(f) for f in self.faults],
            "workload": asdict(self.workload),
        }


def make_plan(seed: int, carriers: int = 2, kinds: tuple[str, ...] | None = None) -> Plan:
    """The plan of the episode with this seed (``kinds`` narrows the draw)."""
    rng = random.Random(seed)
    pool = [k for k in KINDS if kinds is None or k in kinds]
    if not pool:
        raise ValueError(f"no fault kind among {kinds}")
    n = 1 if rng.random() < 0.7 else 2
    faults: list[Fault] = []
    used: set[str] = set()
    for _ in range(n):
        choices = [k for k in pool if KINDS[k][0] not in used]
        if not choices:
            break
        kind = rng.choices(choices, weights=[KINDS[k][1] for k in choices])[0]
        used.add(KINDS[kind][0])
        start = round(rng.uniform(*START_S), 1)
        duration = round(rng.uniform(*DURATION_BY_KIND.get(kind, DURATION_S)), 1)
        carrier = rng.randrange(carriers) if kind in CARRIER_KINDS else 0
        faults.append(Fault(kind, start, duration, carrier))
    faults.sort(key=lambda f: f.start_s)
    window = round(rng.uniform(10.0, 16.0), 1)
    gap = round(rng.uniform(300.0, 800.0), 0)
    workload = Workload(
        downloaders=rng.randint(1, 3),
        window_s=window,
        files=("1KiB.bin", "1MiB.bin", "10MiB.bin"),
        chat_users=rng.randint(1, 4),
        # About as long as the downloads.
        chat_messages=max(5, int(window * 1000 / gap)),
        chat_gap_ms=gap,
    )
    return Plan(seed, tuple(faults), workload)
