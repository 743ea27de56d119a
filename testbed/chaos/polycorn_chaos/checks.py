"""The campaign's invariants, as pure functions of what an episode recorded.

Each check returns violations (an empty list: the invariant held). They
know nothing of processes or namespaces, so ``tests/`` feeds them seeded
faults (a corrupted download, a duplicated row, a wrong chat reply, a relay
that says ready while its proxy is dead) and sees each fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polycorn_harness.trip import Expected


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


# ------------------------------------------------------------------ transfers


@dataclass(frozen=True)
class Transfer:
    """One passenger download (curl through the relay's transparent capture)."""

    passenger: str
    file: str
    exit_code: int
    sha256: str
    size: int
    error: str = ""


def check_transfers(
    transfers: Iterable[Transfer], sums: dict[str, tuple[str, int]]
) -> tuple[Counter[str], list[Violation]]:
    """Every completed transfer intact, every failed one failed visibly.

    ``sums`` maps a file name to its (sha256, size) at the origin. A transfer
    curl calls successful (exit 0) must have exactly those bytes; one it
    calls failed is a visible failure whatever it received.
    """
    counts: Counter[str] = Counter()
    bad: list[Violation] = []
    for t in transfers:
        want_sha, want_size = sums[t.file]
        if t.exit_code == 0:
            if t.sha256 == want_sha and t.size == want_size:
                counts["completed"] += 1
            else:
                counts["corrupt"] += 1
                bad.append(
                    Violation(
                        "transfer-intact",
                        f"{t.passenger} {t.file}: curl succeeded with {t.size} bytes sha256 "
                        f"{t.sha256[:16]}…, the origin has {want_size} bytes {want_sha[:16]}…",
                    )
                )
        else:
            counts["failed-visibly"] += 1
            counts[f"curl-exit-{t.exit_code}"] += 1
    return counts, bad


# ------------------------------------------------------------------ chat


# A chat message sent and then neither answered nor failed (no reset, no
# EOF) for this long sits on a connection left hanging: the passenger's app
# waits forever. The endpoint gives up on a dead path after 10 s and resends
# elsewhere, so a live path answers well within it.
HANG_S = 25


def check_chat(
    records: Sequence[dict[str, Any]], users: int, messages: int, deadline_ms: float | None = None
) -> tuple[Counter[str], list[Violation]]:
    """polycorn-loadgen im's records: one per message, each answered right or failed with a reason.

    A reply naming another message is a misdelivered byte stream, not a
    visible failure: it is a violation. So is a message that was sent and
    then waited HANG_S or more for the run's deadline (``deadline_ms``, trip
    ms) with neither a reply nor an error: its connection was left hanging.
    """
    counts: Counter[str] = Counter()
    bad: list[Violation] = []
    seen = Counter((r.get("user"), r.get("msg")) for r in records)
    dups = [k for k, n in seen.items() if n > 1]
    if dups:
        bad.append(Violation("chat-intact", f"messages recorded twice, e.g. {dups[:3]}"))
    want = {(u, m) for u in range(users) for m in range(messages)}
    missing = sorted(want - set(seen))
    if missing:
        bad.append(
            Violation(
                "chat-intact",
                f"{len(missing)} of {len(want)} messages have no record (neither answered nor "
                f"failed), e.g. {missing[:3]}",
            )
        )
    for r in records:
        err = r.get("error")
        if r.get("ok") is True:
            if err is not None or r.get("recv_ms") is None:
                bad.append(Violation("chat-intact", f"message answered without a reply time: {r}"))
            counts["answered"] += 1
        elif not isinstance(err, str) or not err:
            bad.append(Violation("chat-intact", f"message failed without a reason: {r}"))
        elif (
            err == "deadline"
            and deadline_ms is not None
            and r.get("send_ms") is not None
            and deadline_ms - float(r["send_ms"]) >= HANG_S * 1000
        ):
            counts["hanging"] += 1
            bad.append(
                Violation(
                    "chat-intact",
                    f"user {r['user']} message {r['msg']} sent at trip {r['send_ms'] / 1000:.1f} s "
                    f"got neither a reply nor an error for {HANG_S} s and more (connection left "
                    "hanging)",
                )
            )
        elif err.startswith("reply names message"):
            counts["misdelivered"] += 1
            bad.append(Violation("chat-intact", f"user {r['user']} message {r['msg']}: {err}"))
        else:
            counts["failed-visibly"] += 1
    return counts, bad


# ------------------------------------------------------------------ telemetry


@dataclass(frozen=True)
class TripTelemetry:
    """What LinkDB must hold of a trip: the keys :mod:`polycorn_harness.trip` expects,
    each with the wall-clock ms at which the relay's replay emits it."""

    handovers: tuple[tuple[tuple[str, int], int], ...]
    fixes: tuple[tuple[int, int], ...]

    @classmethod
    def load(cls, events: Path, epoch_ms: int) -> TripTelemetry:
        e = Expected.load(events, epoch_ms)
        return cls(
            tuple(zip(e.handovers, e.handover_emit_ms, strict=True)),
            tuple(zip(e.fixes, e.fix_emit_ms, strict=True)),
        )


@dataclass
class TelemetryLedger:
    """Telemetry state across a campaign: which records were allowed to be lost
    (emitted while the spool's file system was full, and counted by the relay
    as spool errors), and which differences were already reported."""

    lost_windows: list[tuple[int, int]] = field(default_factory=list)
    spool_errors: int = 0
    reported: set[tuple[str, object]] = field(default_factory=set)


def check_telemetry(
    trip: TripTelemetry,
    got_handovers: Sequence[tuple[str, int]],
    got_fixes: Sequence[int],
    cut_ms: int,
    ledger: TelemetryLedger,
) -> tuple[dict[str, int], list[Violation]]:
    """Telemetry exactly once in LinkDB.

    Every record the relay's replay emitted before ``cut_ms`` (wall clock)
    is in LinkDB once; nothing is there twice; nothing is there that the trip
    does not have. The only records allowed to be missing were emitted while
    the spool's file system was full (``ledger.lost_windows``), and at most
    as many as the relay counted as spool errors. Differences already
    reported by an earlier episode are not reported again.
    """
    bad: list[Violation] = []
    stats: dict[str, int] = {}
    windows = ledger.lost_windows
    n_lost = 0

    def in_window(t: int) -> bool:
        return any(a <= t <= b for a, b in windows)

    for what, want, got in (
        ("handover", trip.handovers, list(got_handovers)),
        ("gps fix", trip.fixes, list(got_fixes)),
    ):
        keys = {k for k, _ in want}
        counted = Counter(got)
        dups = sorted((k for k, n in counted.items() if n > 1), key=str)
        extra = sorted((k for k in counted if k not in keys), key=str)
        due = [(k, t) for k, t in want if t <= cut_ms]
        missing = [(k, t) for k, t in due if k not in counted]
        lost = [k for k, t in missing if in_window(t)]
        unexplained = [k for k, t in missing if not in_window(t)]
        stats[f"{what}s due"] = len(due)
        stats[f"{what}s in LinkDB"] = len(got)
        stats[f"{what}s lost to a full spool"] = len(lost)
        n_lost += len(lost)
        for kind, items in (("duplicated", dups), ("extra", extra), ("missing", unexplained)):
            new = [k for k in items if (kind + what, k) not in ledger.reported]
            if new:
                bad.append(
                    Violation(
                        "telemetry-exactly-once",
                        f"{len(new)} {what}(s) {kind} in LinkDB, e.g. {new[:3]}",
                    )
                )
                ledger.reported.update((kind + what, k) for k in new)
    if n_lost > ledger.spool_errors:
        key = ("lost-budget", n_lost)
        if key not in ledger.reported:
            ledger.reported.add(key)
            bad.append(
                Violation(
                    "telemetry-exactly-once",
                    f"{n_lost} records missing from the spool-full windows, but the relay "
                    f"counted only {ledger.spool_errors} spool errors (a silent loss)",
                )
            )
    return stats, bad


# ------------------------------------------------------------------ health


def first_unready(samples: Sequence[tuple[float, bool]], since: float) -> float | None:
    """The first time at or after ``since`` a readiness probe said 'not ready'."""
    for t, ready in samples:
        if t >= since and not ready:
            return t
    return None


def check_unready_during(
    who: str,
    why: str,
    *,
    samples: Sequence[tuple[float, bool]],
    start: float,
    end: float,
    grace_s: float,
) -> list[Violation]:
    """While ``why`` held from ``start`` to ``end``, ``who``'s /readyz must say
    'not ready' within ``grace_s`` (only judged when the fault lasted that long)."""
    if end - start < grace_s:
        return []
    t = first_unready([s for s in samples if s[0] <= end], start)
    if t is None or t - start > grace_s:
        seen = "never" if t is None else f"only after {t - start:.1f} s"
        return [
            Violation(
                "health-agrees",
                f"{who} /readyz said ready while {why} ({end - start:.1f} s; not ready {seen}, "
                f"bound {grace_s:.0f} s)",
            )
        ]
    return []


# ------------------------------------------------------------------ memory

# RSS ceilings (bytes) per component, far above what a healthy run uses.
RSS_LIMIT = {
    "relay": 512 << 20,
    "proxy": 512 << 20,
    "ingest": 1536 << 20,
    "trainer": 1536 << 20,
    "emu": 512 << 20,
}


def check_rss(name: str, pid: int, samples: Sequence[int]) -> list[Violation]:
    """No unbounded growth over one process's lifetime: under its ceiling, and
    (with 8 or more samples, one per episode) the last three not all more than
    1.5x + 64 MiB the largest of the first three."""
    bad: list[Violation] = []
    limit = RSS_LIMIT.get(name)
    if limit is not None and samples and max(samples) > limit:
        bad.append(
            Violation(
                "memory-bounded",
                f"{name} (pid {pid}) RSS {max(samples) >> 20} MiB "
                f"over its {limit >> 20} MiB ceiling",
            )
        )
    if len(samples) >= 8:
        base = max(samples[:3])
        if min(samples[-3:]) > 1.5 * base + (64 << 20):
            bad.append(
                Violation(
                    "memory-bounded",
                    f"{name} (pid {pid}) RSS grew from {base >> 20} MiB to "
                    f"{min(samples[-3:]) >> 20} MiB over {len(samples)} episodes",
                )
            )
    return bad
