"""Oracle and link-file semantics on hand-computable traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polycorn_bench.links import LinkFileError, Schedule, Trace
from polycorn_bench.oracle import PAYLOAD_PER_OPPORTUNITY, Carrier, Oracle

P = PAYLOAD_PER_OPPORTUNITY


def const_trace(per_ms: int = 1, period: int = 1000) -> Trace:
    return Trace(np.repeat(np.arange(1, period + 1, dtype=np.int64), per_ms))


def carrier(
    sched: str = "delay 0 10\n", per_ms: int = 1, period: int = 1000, up: bool = True
) -> Carrier:
    t = const_trace(per_ms, period)
    return Carrier("c0", t, t if up else None, Schedule.parse(sched))


def test_constant_rate_single_carrier_matches_analytic() -> None:
    o = Oracle([carrier()])
    # Request at 100: first uplink opportunity strictly after 100 is 101, +10 ms -> 111.
    assert o.request_arrival(100.0) == 111.0
    # 50 opportunities strictly after 111: 112..161, the last arrives at 171.
    assert o.end_ms(100.0, 50 * P) == 171.0
    assert o.time_ms(100.0, 50 * P) == 71.0
    # One byte more needs one more opportunity.
    assert o.end_ms(100.0, 50 * P + 1) == 172.0
    # Generic: rate 1448 B/ms, so time = 2*delay + 1 + ceil(size/1448).
    for size in (262_144, 1_048_576, 4_194_304):
        assert o.time_ms(100.0, size) == 10 + 1 + 10 + math.ceil(size / P)


def test_several_opportunities_per_ms_and_no_uplink_trace() -> None:
    o = Oracle([carrier(per_ms=3, up=False)])
    assert o.request_arrival(100.0) == 110.0
    # 60 opportunities after 110: 20 ms (111..130), arrival 140.
    assert o.end_ms(100.0, 60 * P) == 140.0


def test_two_carriers_pool_their_opportunities() -> None:
    fast = carrier("delay 0 10\n")
    slow = Carrier("c1", const_trace(), const_trace(), Schedule.parse("delay 0 30\n"))
    o = Oracle([fast, slow])
    assert o.request_arrival(100.0) == 111.0
    # After 111: c0 arrives at T+10 (T>=112 -> 122..), c1 at T+30 (T>=112 -> 142..).
    # Arrivals <= 151: c0 122..151 = 30, c1 142..151 = 10 -> 40 at 151.
    assert o.end_ms(100.0, 40 * P) == 151.0
    # 30: c0 122..146 (25) + c1 142..146 (5).
    assert o.end_ms(100.0, 30 * P) == 146.0


def test_blackout_delays_the_oracle() -> None:
    plain = Oracle([carrier()])
    dark = Oracle([carrier("delay 0 10\nblackout 150 200 hold\n")])
    assert plain.end_ms(100.0, 50 * P) == 171.0
    # Opportunities 112..149 (38) then 200..211 (12): the last leaves at 211, arrives 221.
    assert dark.end_ms(100.0, 50 * P) == 221.0
    # Request sent during a blackout waits for its end (an opportunity at the end is usable).
    early = Oracle([carrier("delay 0 10\nblackout 90 130 flush\n")])
    assert early.request_arrival(100.0) == 140.0
    assert early.end_ms(100.0, 10 * P) == 160.0


def test_all_dark_uses_first_carrier_back_plus_its_delay() -> None:
    a = carrier("delay 0 10\nblackout 0 500 hold\n")
    b = Carrier(
        "c1", const_trace(), const_trace(), Schedule.parse("delay 0 40\nblackout 0 300 hold\n")
    )
    o = Oracle([a, b])
    # a: back at 500, +10 = 510; b: back at 300, +40 = 340.
    assert o.request_arrival(100.0) == 340.0


def test_trace_wraps_around_with_its_period() -> None:
    t = Trace.parse("0\n0\n2\n5\n")
    assert t.first_after(4.0) == 5.0
    assert t.first_after(5.0) == 7.0
    assert t.first_after(4.5) == 5.0
    assert list(t.times_until(10)) == [0, 0, 2, 5, 5, 5, 7, 10, 10, 10]
    # A 100 ms trace used at 250 ms: repetition 2.
    o = Oracle([carrier(period=100)])
    assert o.time_ms(250.0, 10 * P) == 10 + 1 + 10 + 10


def test_linear_and_step_delay() -> None:
    s = Schedule.parse("delay-mode linear\ndelay 100 10\ndelay 200 30\n")
    assert list(s.delay_at(np.asarray([0.0, 100.0, 150.0, 250.0]))) == [10.0, 10.0, 20.0, 30.0]
    s = Schedule.parse("# step\ndelay 100 10  # comment\ndelay 200 30\nloss 0 0.1 0.2 0 0.5\n")
    assert list(s.delay_at(np.asarray([0.0, 150.0, 200.0]))) == [10.0, 10.0, 30.0]
    assert list(Schedule.parse("").delay_at(np.asarray([5.0]))) == [0.0]


def test_falling_delay_keeps_fifo_order() -> None:
    # Delay drops from 50 to 0 at 120: packets leaving at 120.. would overtake; FIFO holds them.
    o = Oracle([carrier("delay 0 50\ndelay 120 0\n", up=False)])
    # t_req = 150; opportunities after it arrive at T (delay 0): earlier, unused ones carry
    # nothing of this download and hold nothing back.
    assert o.end_ms(100.0, 5 * P) == 155.0
    # A download whose window spans the drop: requested at 60 (t_req 110), its packets leaving
    # at 111..119 arrive at 161..169, those leaving at 120.. would arrive at T but wait behind
    # them: 20 packets -> 9 at <=169, the rest at 170.. (T=130 -> 170, ...).
    assert o.end_ms(60.0, 9 * P) == 169.0
    assert o.end_ms(60.0, 10 * P) == 169.0  # T=120 arrives "at 120", held to 169
    assert o.end_ms(60.0, 60 * P) == 170.0


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("", "empty"),
        ("1\nx\n", ":2: not a millisecond"),
        ("5\n3\n", ":2: timestamp 3"),
        ("0\n", "non-zero"),
        ("1\n\n2\n", ":2: empty line"),
    ],
)
def test_trace_errors(text: str, msg: str) -> None:
    with pytest.raises(LinkFileError, match=msg):
        Trace.parse(text, "t")


def test_schedule_errors() -> None:
    with pytest.raises(LinkFileError, match=":1: blackout end"):
        Schedule.parse("blackout 5 5 hold\n", "s")
    with pytest.raises(LinkFileError, match="unknown directive"):
        Schedule.parse("rate 5\n", "s")
    with pytest.raises(LinkFileError, match="non-overlapping"):
        Schedule.parse("blackout 0 10 hold\nblackout 5 20 flush\n", "s")


def brute_force_end(
    traces: list[list[int]], scheds: list[Schedule], start: float, size: int
) -> float:
    """Straightforward loop version of the oracle (same trace for both directions)."""

    def opp_times(ms: list[int], until: float) -> list[float]:
        out: list[float] = []
        r = 0
        while True:
            for m in ms:
                t = float(r * ms[-1] + m)
                if t > until:
                    return out
                out.append(t)
            r += 1

    def dark(s: Schedule, t: float) -> bool:
        return any(a <= t < b for a, b in zip(s.blackout_start, s.blackout_end, strict=True))

    def delay(s: Schedule, t: float) -> float:
        return float(s.delay_at(np.asarray([t]))[0])

    t_req = math.inf
    for ms, s in zip(traces, scheds, strict=True):
        for t in opp_times(ms, start + 2_000):
            if t > start and not dark(s, t):
                t_req = min(t_req, t + delay(s, t))
                break
    arrivals: list[float] = []
    for ms, s in zip(traces, scheds, strict=True):
        prev = -math.inf
        for t in opp_times(ms, t_req + 10_000):
            if t > t_req and not dark(s, t):
                prev = max(prev, t + delay(s, t))
                arrivals.append(prev)
    arrivals.sort()
    assert len(arrivals) >= math.ceil(size / P), "brute-force horizon too short"
    return arrivals[math.ceil(size / P) - 1]


@pytest.mark.parametrize("seed", range(8))
def test_oracle_matches_brute_force_on_random_links(seed: int) -> None:
    rng = np.random.default_rng(seed)
    traces, scheds, carriers = [], [], []
    for i in range(2):
        period = int(rng.integers(20, 200))
        ms = sorted(int(x) for x in rng.integers(0, period, size=int(rng.integers(5, 60))))
        ms.append(period)
        lines = [f"delay-mode {'linear' if rng.random() < 0.5 else 'step'}"]
        t = 0.0
        for _ in range(int(rng.integers(1, 6))):
            lines.append(f"delay {t} {rng.uniform(0, 80):.1f}")
            t += float(rng.uniform(10, 300))
        b = float(rng.uniform(0, 200))
        for _ in range(int(rng.integers(0, 4))):
            e = b + float(rng.uniform(1, 150))
            lines.append(f"blackout {b:.1f} {e:.1f} {'hold' if rng.random() < 0.5 else 'flush'}")
            b = e + float(rng.uniform(0, 200))
        s = Schedule.parse("\n".join(lines))
        tr = Trace.parse("\n".join(map(str, ms)) + "\n")
        traces.append(ms)
        scheds.append(s)
        carriers.append(Carrier(f"c{i}", tr, tr, s))
    o = Oracle(carriers)
    for start in (0.0, 37.5, 150.0, 480.0):
        for size in (1, P, 20 * P + 1, 200 * P):
            assert o.end_ms(start, size) == brute_force_end(traces, scheds, start, size)


@pytest.mark.parametrize("text", ["3\n5\n9", "  3\n5 \n9\r\n", "7\n7\n7\n"])
def test_trace_fast_and_slow_paths_agree(text: str) -> None:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    assert list(Trace.parse(text).ms) == list(Trace._parse_slow(lines, "t").ms)


@pytest.mark.parametrize(("text", "msg"), [("1.5\n2\n", ":1: not"), ("1 2\n3\n", ":1: not")])
def test_trace_rejects_non_integers(text: str, msg: str) -> None:
    with pytest.raises(LinkFileError, match=msg):
        Trace.parse(text, "t")
