"""Link files of a trip: Mahimahi traces and polycorn-emu schedules.

Both are read with the semantics of ``testbed/emu`` (``trace.rs``, ``schedule.rs``, ``lib.rs``):

* A trace is one integer millisecond timestamp per line, one 1500-byte delivery opportunity
  each; equal lines are several opportunities in the same millisecond. The trace repeats
  forever with period equal to its last timestamp (opportunity ``k`` is at
  ``ms[k mod n] + (k div n) * period``). An opportunity at time ``T`` serves only packets that
  arrived strictly before ``T``.
* A schedule holds the one-way delay (``delay-mode step|linear``, ``delay t d`` points; before
  the first point the first value applies, none at all means zero delay), loss lines (ignored
  here: the oracle is loss-free) and blackouts ``[start, end)`` during which no opportunity is
  used (one exactly at ``start`` is inside, one exactly at ``end`` is usable). A packet that
  leaves the bottleneck at ``t`` arrives at ``max(previous arrival, t + delay(t))`` (FIFO per
  carrier). The schedule applies to both directions of its carrier.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class LinkFileError(ValueError):
    """A trace or schedule file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Trace:
    """One period of a Mahimahi trace (sorted integer ms timestamps, last one = period)."""

    ms: IntArray
    _ms_f: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # searchsorted with a float key on an int array converts the whole array every call.
        object.__setattr__(self, "_ms_f", self.ms.astype(np.float64))

    @property
    def period_ms(self) -> int:
        return int(self.ms[-1])

    @classmethod
    def parse(cls, text: str, name: str = "<trace>") -> Trace:
        # Fast path for well-formed files (a 600 s trip has ~10^6 lines per file); anything
        # unexpected goes through the line-by-line pass, which names the bad line.
        n_lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ms = np.fromstring(text, dtype=np.int64, sep="\n")
        except (ValueError, DeprecationWarning):
            ms = np.zeros(0, dtype=np.int64)
        if (
            0 < len(ms) == n_lines
            and ms.min() >= 0
            and ms[-1] > 0
            and bool(np.all(np.diff(ms) >= 0))
        ):
            return cls(ms)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls._parse_slow(lines, name)

    @classmethod
    def _parse_slow(cls, lines: list[str], name: str) -> Trace:
        values: list[int] = []
        for i, raw in enumerate(lines, start=1):
            t = raw.strip()
            if not t:
                raise LinkFileError(f"{name}:{i}: empty line")
            if not t.isdigit():
                raise LinkFileError(f"{name}:{i}: not a millisecond timestamp: {t!r}")
            v = int(t)
            if values and v < values[-1]:
                raise LinkFileError(f"{name}:{i}: timestamp {v} is smaller than the previous one")
            values.append(v)
        if not values:
            raise LinkFileError(f"{name}: trace is empty")
        if values[-1] == 0:
            raise LinkFileError(f"{name}: trace must last a non-zero time (last timestamp is 0)")
        return cls(np.asarray(values, dtype=np.int64))

    @classmethod
    def load(cls, path: Path) -> Trace:
        return cls.parse(path.read_text(encoding="utf-8"), str(path))

    def times_until(self, until_ms: float) -> FloatArray:
        """Every opportunity time in ``[0, until_ms]``, repetitions included, sorted."""
        reps = max(1, math.ceil(until_ms / self.period_ms) + 1)
        base = self.ms.astype(np.float64)
        t = np.concatenate([base + r * self.period_ms for r in range(reps)])
        return t[: int(np.searchsorted(t, until_ms, side="right"))]

    def rotated(self, start_ms: int) -> Trace:
        """The trace as its player meets it from ``start_ms`` on: with ``o`` the first
        timestamp at or after ``start_ms`` (mod the period) and ``p`` the period, each line
        ``t`` becomes ``(t - o) mod p``, 0 written as ``p``. Every opportunity and the period
        are kept (the line at ``o`` becomes the new last line); a trip cut from a long trace
        this way starts at another stretch of road. A start at a whole number of periods
        returns the trace unchanged."""
        p = self.period_ms
        want = start_ms % p
        if want == 0:
            return self
        idx = int(np.searchsorted(self.ms, want, side="left"))
        o = int(self.ms[idx]) if idx < len(self.ms) else p
        t = (self.ms - o) % p
        t[t == 0] = p
        return Trace(np.sort(t))

    def text(self) -> str:
        """The trace in Mahimahi's format, one timestamp per line."""
        return "".join(f"{int(v)}\n" for v in self.ms)

    def first_after(self, t: float) -> float:
        """Time of the first opportunity strictly after ``t`` (the one that can serve a packet
        that arrives at ``t``)."""
        n = len(self.ms)
        period = self.period_ms
        r = math.floor(t / period)
        within = t - r * period
        idx = int(np.searchsorted(self._ms_f, within, side="right"))
        k = r * n + idx
        return float((k // n) * period + int(self.ms[k % n]))


@dataclass(frozen=True)
class Schedule:
    """Delay and blackouts of one carrier (loss is parsed for validation only)."""

    delay_t: FloatArray = field(default_factory=lambda: np.zeros(0))
    delay_ms: FloatArray = field(default_factory=lambda: np.zeros(0))
    linear: bool = False
    blackout_start: FloatArray = field(default_factory=lambda: np.zeros(0))
    blackout_end: FloatArray = field(default_factory=lambda: np.zeros(0))
    blackout_kind: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, name: str = "<schedule>") -> Schedule:
        lines = _ScheduleLines(name)
        for i, raw in enumerate(text.splitlines(), start=1):
            fields = raw.split("#", 1)[0].split()
            if fields:
                lines.directive(fields[0], fields[1:], i)
        return cls(
            delay_t=np.asarray(lines.dt, dtype=np.float64),
            delay_ms=np.asarray(lines.dv, dtype=np.float64),
            linear=lines.linear,
            blackout_start=np.asarray(lines.bs, dtype=np.float64),
            blackout_end=np.asarray(lines.be, dtype=np.float64),
            blackout_kind=tuple(lines.bk),
        )

    @classmethod
    def load(cls, path: Path) -> Schedule:
        return cls.parse(path.read_text(encoding="utf-8"), str(path))

    def delay_at(self, t: FloatArray) -> FloatArray:
        """One-way delay (ms) for packets leaving the bottleneck at times ``t``."""
        if len(self.delay_t) == 0:
            return np.zeros_like(t)
        if self.linear:
            return np.interp(t, self.delay_t, self.delay_ms)
        i = np.searchsorted(self.delay_t, t, side="right") - 1
        return self.delay_ms[np.maximum(i, 0)]

    def in_blackout(self, t: FloatArray) -> npt.NDArray[np.bool_]:
        """Whether each time lies in a blackout ``[start, end)``."""
        if len(self.blackout_start) == 0:
            return np.zeros(t.shape, dtype=bool)
        i = np.searchsorted(self.blackout_start, t, side="right") - 1
        ok = i >= 0
        ends = self.blackout_end[np.maximum(i, 0)]
        return ok & (t < ends)

    def next_lit(self, t: float) -> float:
        """``t`` if the carrier is not blacked out at ``t``, else the end of its blackout."""
        if len(self.blackout_start) == 0:
            return t
        i = int(np.searchsorted(self.blackout_start, t, side="right")) - 1
        if i >= 0 and t < self.blackout_end[i]:
            return float(self.blackout_end[i])
        return t


@dataclass
class _ScheduleLines:
    """A schedule file's directives as :meth:`Schedule.parse` reads them, each checked."""

    name: str
    dt: list[float] = field(default_factory=list)
    dv: list[float] = field(default_factory=list)
    bs: list[float] = field(default_factory=list)
    be: list[float] = field(default_factory=list)
    bk: list[str] = field(default_factory=list)
    linear: bool = False
    mode_seen: bool = False
    loss_t: list[float] = field(default_factory=list)

    def directive(self, kind: str, args: list[str], i: int) -> None:
        """Line ``i``: ``kind`` and its arguments."""
        if kind == "delay-mode":
            self.delay_mode(args, i)
        elif kind == "delay":
            self.delay(args, i)
        elif kind == "loss":
            self.loss(args, i)
        elif kind == "blackout":
            self.blackout(args, i)
        else:
            raise LinkFileError(f"{self.name}:{i}: unknown directive {kind!r}")

    def num(self, s: str, line: int) -> float:
        try:
            v = float(s)
        except ValueError:
            raise LinkFileError(f"{self.name}:{line}: not a number: {s!r}") from None
        if not math.isfinite(v) or v < 0:
            raise LinkFileError(f"{self.name}:{line}: must be finite and non-negative: {s!r}")
        return v

    def delay_mode(self, args: list[str], i: int) -> None:
        if self.mode_seen or len(args) != 1 or args[0] not in ("step", "linear"):
            raise LinkFileError(f"{self.name}:{i}: expected one 'delay-mode step|linear'")
        self.mode_seen = True
        self.linear = args[0] == "linear"

    def delay(self, args: list[str], i: int) -> None:
        if len(args) != 2:
            raise LinkFileError(f"{self.name}:{i}: expected 'delay <t_ms> <one_way_ms>'")
        t, d = self.num(args[0], i), self.num(args[1], i)
        if self.dt and t <= self.dt[-1]:
            raise LinkFileError(f"{self.name}:{i}: delay points must have increasing times")
        self.dt.append(t)
        self.dv.append(d)

    def loss(self, args: list[str], i: int) -> None:
        if len(args) != 5:
            raise LinkFileError(f"{self.name}:{i}: expected 'loss <t_ms> <4 probabilities>'")
        t = self.num(args[0], i)
        if self.loss_t and t <= self.loss_t[-1]:
            raise LinkFileError(f"{self.name}:{i}: loss points must have increasing times")
        self.loss_t.append(t)

    def blackout(self, args: list[str], i: int) -> None:
        if len(args) != 3 or args[2] not in ("hold", "flush"):
            raise LinkFileError(f"{self.name}:{i}: expected 'blackout <start> <end> hold|flush'")
        s, e = self.num(args[0], i), self.num(args[1], i)
        if s >= e:
            raise LinkFileError(f"{self.name}:{i}: blackout end must be after its start")
        if self.be and s < self.be[-1]:
            raise LinkFileError(f"{self.name}:{i}: blackouts must be sorted, non-overlapping")
        self.bs.append(s)
        self.be.append(e)
        self.bk.append(args[2])


def main(argv: list[str] | None = None) -> int:
    """``python -m polycorn_bench.links rotate IN START_MS OUT``: write IN started START_MS
    in (:meth:`Trace.rotated`; polycorn_benchrun.hsr cuts the ``driving`` trips this way)."""
    import argparse

    ap = argparse.ArgumentParser(prog="polycorn_bench.links", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rotate", help="start a Mahimahi trace START_MS in")
    r.add_argument("src", type=Path)
    r.add_argument("start_ms", type=int)
    r.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.start_ms < 0:
        ap.error("START_MS must be >= 0")
    try:
        trace = Trace.load(a.src)
    except (OSError, LinkFileError) as e:
        print(f"polycorn_bench.links: {e}", file=sys.stderr)
        return 1
    a.out.write_text(trace.rotated(a.start_ms).text(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
