"""Cutting trips out of a long Mahimahi trace: a rotated trace keeps every opportunity and
the period, and starts where it was asked to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polycorn_bench.links import Trace, main


def opportunities_mod_period(t: Trace, shift: int) -> list[int]:
    return sorted(int(v) % t.period_ms for v in (t.ms + shift))


def test_a_rotated_trace_is_the_same_link_seen_from_later() -> None:
    t = Trace(np.array([1, 2, 2, 5, 10]))
    r = t.rotated(3)  # the first timestamp at or after 3 is 5
    assert r.ms.tolist() == [5, 6, 7, 7, 10]
    assert r.period_ms == t.period_ms
    # Shifted back by the cut, the rotated trace offers the same opportunities.
    assert opportunities_mod_period(r, 5) == opportunities_mod_period(t, 0)


def test_rotating_by_zero_or_a_whole_period_changes_nothing() -> None:
    t = Trace(np.array([0, 3, 3, 7, 12]))
    assert t.rotated(0).ms.tolist() == t.ms.tolist()
    assert t.rotated(12).ms.tolist() == t.ms.tolist()


def test_a_start_past_the_last_line_wraps_to_the_period() -> None:
    t = Trace(np.array([2, 4, 9]))
    r = t.rotated(10)  # 10 mod 9 = 1: first timestamp at or after 1 is 2
    assert r.ms.tolist() == [2, 7, 9]
    assert len(r.ms) == len(t.ms)


def test_the_cli_writes_a_trace_the_emulator_reads_and_refuses_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "in.down"
    src.write_text("1\n2\n2\n5\n10\n", encoding="utf-8")
    out = tmp_path / "out.down"
    assert main(["rotate", str(src), "3", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == "5\n6\n7\n7\n10\n"
    bad = tmp_path / "bad.down"
    bad.write_text("3\n1\n", encoding="utf-8")
    assert main(["rotate", str(bad), "0", str(out)]) == 1
    with pytest.raises(SystemExit):
        main(["rotate", str(src), "-1", str(out)])
