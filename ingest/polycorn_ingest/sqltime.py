"""SQL fragments converting between Unix milliseconds (bigint, how ingest and
the telemetry carry time) and ``timestamptz`` (how LinkDB stores it), exactly
(no float seconds in between), shared by every module that writes SQL."""

from __future__ import annotations


def ts(col: str) -> str:
    """SQL: Unix milliseconds (bigint) as timestamptz, exactly."""
    return f"(timestamptz 'epoch' + ({col}) * interval '1 millisecond')"


def ms(col: str) -> str:
    """SQL: timestamptz as Unix milliseconds (bigint)."""
    return f"(extract(epoch from {col}) * 1000)::bigint"
