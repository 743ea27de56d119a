"""The sink on its own: values the staging types cannot carry are refused, not wrapped."""

from __future__ import annotations

import pytest
from helpers import T0, counts

from polycorn_ingest.records import Rows
from polycorn_ingest.sink import DataRejectedError, LinkDbSink
from polycorn_schema.testing import fresh_database


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
        sink = LinkDbSink(url)
        try:
            with pytest.raises(DataRejectedError):
                sink.write(_rows(path, srtt))
            assert counts(url)["path_stats"] == 0
            sink.write(_rows(3, 1))  # the connection is still usable
            assert counts(url)["path_stats"] == 1
        finally:
            sink.close()
