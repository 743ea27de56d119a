"""Waiting for a condition, with a bound.

Synchronisation with a process (a listener bound, a path up, a counter
moved) polls the condition until it holds or the timeout passes; the
timeout is a hang guard, never a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """The condition did not hold in time; the message says what was awaited."""


def wait_until(
    what: str,
    condition: Callable[[], T | None],
    timeout_s: float,
    *,
    every_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``condition`` until it returns something truthy, and return that;
    raise :class:`WaitTimeoutError` naming ``what`` after ``timeout_s``. An exception
    from ``condition`` propagates (a broken check is not a slow one)."""
    deadline = clock() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        if clock() >= deadline:
            raise WaitTimeoutError(f"{what}: not within {timeout_s:g} s")
        sleep(every_s)
