"""Oracle completion time of a download: the best any scheduler could do on a trip's links.

Method (also in ``README.md`` and in the report):

1. **Request.** The request (one packet) is handed to the carriers at ``start_ms``. On carrier
   ``c`` it leaves at the first uplink trace opportunity strictly after ``start_ms`` that is not
   in one of ``c``'s blackouts (a dark carrier is used from the end of its blackout) and
   reaches the cloud ``delay_c`` later (the schedule's one-way delay at that departure time).
   The oracle takes the carrier giving the earliest arrival ``t_req``. Without an uplink trace
   file the departure is ``start_ms`` (or the blackout's end). When every carrier is lit this
   is the smallest uplink one-way delay (plus at most one opportunity's wait); when all are
   dark it is the earliest return plus that carrier's delay.
2. **Payload.** From ``t_req`` on, the response uses the union of every carrier's downlink
   trace opportunities strictly after ``t_req`` and outside that carrier's blackouts. Each
   opportunity carries ``PAYLOAD_PER_OPPORTUNITY`` = 1448 bytes (1500 − 52 bytes of IP and TCP
   headers with timestamps; our framing and TLS are ignored) and arrives at
   ``max(previous arrival on c, T + delay_c(T))``, the emulator's FIFO rule (applied among the
   opportunities the download uses: earlier ones carry nothing of it).
3. ``oracle_end`` = arrival time of the ``ceil(size / 1448)``-th byte-carrying opportunity,
   earliest first over all carriers. ``oracle_ms = oracle_end − start_ms``.

It ignores loss (the oracle never retransmits), queueing behind other traffic, connection set-up
and congestion control: it is a lower bound on the completion time, so
``ratio_vs_oracle = oracle_ms / actual_ms`` is at most 1 for a download that finished.

Implementation: per carrier, the downlink opportunity times up to a horizon are expanded once
(trace repetitions included), blackout opportunities dropped, and ``T + delay(T)`` computed.
A download then takes, on each carrier, the next ``N`` opportunities after ``t_req``
(``numpy.searchsorted``), applies the FIFO rule with a cumulative maximum, and takes the
``N``-th smallest arrival of their union (``numpy.partition``). The horizon grows when a
download needs more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from polycorn_bench.links import FloatArray, Schedule, Trace

#: Bytes of payload one 1500-byte trace opportunity carries (IPv4 20 + TCP 20 + timestamps 12).
PAYLOAD_PER_OPPORTUNITY = 1448


@dataclass
class Carrier:
    """One carrier of a trip: downlink and (optional) uplink trace, and its schedule."""

    name: str
    down: Trace
    up: Trace | None
    schedule: Schedule
    _horizon: float = field(default=-1.0, init=False)
    _times: FloatArray = field(default_factory=lambda: np.zeros(0), init=False)
    _arrivals: FloatArray = field(default_factory=lambda: np.zeros(0), init=False)

    def downlink(self, until_ms: float) -> tuple[FloatArray, FloatArray]:
        """Usable downlink opportunity times up to ``until_ms`` and ``T + delay(T)`` for each
        (before the FIFO rule, which depends on which opportunities carry packets)."""
        if until_ms > self._horizon:
            # At least one trace period: a trip's traces last the trip, so one expansion
            # usually serves every download.
            horizon = max(until_ms, 2 * self._horizon, float(self.down.period_ms))
            t = self.down.times_until(horizon)
            t = t[~self.schedule.in_blackout(t)]
            self._times, self._arrivals = t, t + self.schedule.delay_at(t)
            self._horizon = horizon
        return self._times, self._arrivals

    def request_arrival(self, start_ms: float) -> float:
        """When a request handed to this carrier at ``start_ms`` reaches the cloud."""
        t = start_ms
        for _ in range(10_000):  # blackouts are finite; this only guards a malformed file
            lit = self.schedule.next_lit(t)
            if self.up is None:
                depart = lit
            else:
                # First opportunity strictly after start, or at/after a blackout's end.
                depart = self.up.first_after(lit if lit == t else math.nextafter(lit, -math.inf))
            if self.schedule.in_blackout(np.asarray([depart]))[0]:
                t = depart
                continue
            return depart + float(self.schedule.delay_at(np.asarray([depart]))[0])
        return math.inf


def load_carriers(trip_dir: Path) -> list[Carrier]:
    """Carriers ``c0, c1, ...`` of a trip directory (``c<i>.down`` required; ``c<i>.up`` and
    ``c<i>.schedule`` optional)."""
    carriers: list[Carrier] = []
    i = 0
    while (trip_dir / f"c{i}.down").exists():
        up_path = trip_dir / f"c{i}.up"
        sched_path = trip_dir / f"c{i}.schedule"
        carriers.append(
            Carrier(
                name=f"c{i}",
                down=Trace.load(trip_dir / f"c{i}.down"),
                up=Trace.load(up_path) if up_path.exists() else None,
                schedule=Schedule.load(sched_path) if sched_path.exists() else Schedule(),
            )
        )
        i += 1
    return carriers


@dataclass
class Oracle:
    """Oracle completion times for downloads over a fixed set of carriers."""

    carriers: list[Carrier]
    payload: int = PAYLOAD_PER_OPPORTUNITY

    def request_arrival(self, start_ms: float) -> float:
        return min(c.request_arrival(start_ms) for c in self.carriers)

    def end_ms(self, start_ms: float, size: int) -> float:
        """Oracle completion time (trip ms) of a ``size``-byte download requested at
        ``start_ms``; ``inf`` if the links never deliver it (no opportunities at all)."""
        if not self.carriers:
            return math.inf
        t_req = self.request_arrival(start_ms)
        if not math.isfinite(t_req):
            return math.inf
        need = max(1, math.ceil(size / self.payload))
        horizon = t_req + 10_000.0
        for _ in range(64):
            chunks = []
            for c in self.carriers:
                times, arrivals = c.downlink(horizon)
                i = int(np.searchsorted(times, t_req, side="right"))
                window = arrivals[i : i + need]
                # FIFO per carrier among the opportunities the download uses.
                chunks.append(np.maximum.accumulate(window) if len(window) else window)
            pooled = np.concatenate(chunks)
            if len(pooled) >= need:
                # Opportunities beyond the horizon cannot arrive before the horizon, so once
                # the need-th arrival is inside it, it is final.
                kth = float(np.partition(pooled, need - 1)[need - 1])
                if kth <= horizon:
                    return kth
            horizon *= 2
        return math.inf

    def time_ms(self, start_ms: float, size: int) -> float:
        """Oracle duration ``oracle_end - start_ms``."""
        return self.end_ms(start_ms, size) - start_ms
