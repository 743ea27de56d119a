"""The sink on its own: values the staging types cannot carry are refused, not wrapped."""

from __future__ import annotations

import datetime as dt

import pytest
from helpers import T0, counts

from polycorn_ingest.records import MAX_TIME_MS, MIN_TIME_MS, Rows
from polycorn_ingest.sink import DataRejectedError, LinkDbSink, _months
from polycorn_schema.testing import fresh_database, service_url


def _rows(path: int, srtt: int) -> Rows:
    rows = Rows()
    rows.paths.append(("t-range", path, T0, "op", True, srtt, 1, 1, 1, 0, 0, 0))
    rows.see("t-range", T0)
    rows.times.append(T0)
    return rows


@pytest.mark.parametrize(
    ("path", "srtt"),
    [(70_000, 1), (-40_000, 1), (1, 2**64)],  # smallint range; beyond bigint
)
def test_out_of_range_values_are_a_data_rejection_and_store_nothing(path: int, srtt: int) -> None:
    # Binary COPY must not wrap 70000 into a smallint (psycopg's int2 dumper
    # would): the batch is refused, so the consumer can bisect it to the DLQ.
    with fresh_database() as url:
        sink = LinkDbSink(service_url(url, "ingest"))
        try:
            with pytest.raises(DataRejectedError):
                sink.write(_rows(path, srtt))
            assert counts(url)["path_stats"] == 0
            sink.write(_rows(3, 1))  # the connection is still usable
            assert counts(url)["path_stats"] == 1
        finally:
            sink.close()


def test_record_times_far_from_now_make_no_partitions() -> None:
    """A train may send any time from 1990 to 2200; only months near the present get a
    partition (the rest stay in DEFAULT), so no batch, and no run of batches, can make
    LinkDB create a partition per month it names."""
    now = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    now_ms = int(now.timestamp() * 1000)
    day = 86_400_000
    assert _months({"gps_fixes": [now_ms, now_ms]}, now) == {
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    }
    hostile = {
        "gps_fixes": [MIN_TIME_MS, MAX_TIME_MS - 1],
        "signal_samples": [MIN_TIME_MS + 40 * day, MIN_TIME_MS + 400 * day],
        "path_stats": [MAX_TIME_MS - 400 * day, MAX_TIME_MS - 1],
    }
    assert _months(hostile, now) == set()
    # Every month a train could name, batch after batch: the window's months at most.
    every = set()
    for t in range(MIN_TIME_MS, MAX_TIME_MS, 20 * day):
        every |= _months({"gps_fixes": [t, t + 100 * day]}, now)
    assert every
    assert min(every) >= dt.datetime(2025, 10, 1, tzinfo=dt.UTC)
    assert max(every) <= dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
